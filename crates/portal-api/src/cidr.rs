//! Address and port ranges the API server allocates from: service CIDRs
//! (`10.96.0.0/12`, `fd00:10:96::/108`, one of each family for dual-stack),
//! pod CIDRs (`10.244.0.0/16,fd00:10:244::/56`), a port range
//! (`30000-32767`), pools of CIDRs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use k8s_openapi::api::core::v1::NodeSpec;

/// An IPv4 network, `address/prefix`, with the address masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Cidr {
    network: u32,
    prefix: u8,
}

impl Ipv4Cidr {
    /// How many addresses the network holds.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        u32::from(ip) & mask == self.network
    }

    /// The address at `offset` from the network address.
    pub fn nth(&self, offset: u64) -> Option<Ipv4Addr> {
        (offset < self.size()).then(|| Ipv4Addr::from(self.network.wrapping_add(offset as u32)))
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The `index`-th subnet of length `prefix` inside this network (the
    /// node ranges of a cluster CIDR: `10.244.0.0/16` → `10.244.3.0/24`).
    pub fn subnet(&self, prefix: u8, index: u64) -> Option<Ipv4Cidr> {
        if prefix < self.prefix || prefix > 32 {
            return None;
        }
        let count = 1u64 << (prefix - self.prefix);
        let step = 1u64 << (32 - u32::from(prefix));
        (index < count).then(|| Ipv4Cidr {
            network: self.network.wrapping_add((index * step) as u32),
            prefix,
        })
    }

    /// How many subnets of length `prefix` fit (0 when `prefix` is shorter).
    pub fn subnet_count(&self, prefix: u8) -> u64 {
        if prefix < self.prefix || prefix > 32 {
            0
        } else {
            1u64 << (prefix - self.prefix)
        }
    }

    /// The offset of `ip` in the network.
    pub fn offset(&self, ip: Ipv4Addr) -> Option<u64> {
        self.contains(ip)
            .then(|| u64::from(u32::from(ip) - self.network))
    }
}

impl FromStr for Ipv4Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (address, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (address/prefix)"))?;
        let address: Ipv4Addr = address
            .parse()
            .map_err(|_| format!("{s:?}: {address:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("{s:?}: bad prefix length"))?;
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        Ok(Ipv4Cidr {
            network: u32::from(address) & mask,
            prefix,
        })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.network), self.prefix)
    }
}

/// An IPv6 network, `address/prefix`, with the address masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv6Cidr {
    network: u128,
    prefix: u8,
}

impl Ipv6Cidr {
    fn mask(&self) -> u128 {
        if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        }
    }

    /// How many addresses the network holds (saturating at `u64::MAX`).
    pub fn size(&self) -> u64 {
        let bits = 128 - u32::from(self.prefix);
        if bits >= 64 {
            u64::MAX
        } else {
            1u64 << bits
        }
    }

    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        u128::from(ip) & self.mask() == self.network
    }

    pub fn nth(&self, offset: u64) -> Option<Ipv6Addr> {
        (offset < self.size())
            .then(|| Ipv6Addr::from(self.network.wrapping_add(u128::from(offset))))
    }

    /// The `index`-th subnet of length `prefix` inside this network
    /// (`fd00:10:244::/56` → `fd00:10:244:3::/64`).
    pub fn subnet(&self, prefix: u8, index: u64) -> Option<Ipv6Cidr> {
        if index >= self.subnet_count(prefix) {
            return None;
        }
        let step = 1u128 << (128 - u32::from(prefix));
        Some(Ipv6Cidr {
            network: self.network.wrapping_add(u128::from(index) * step),
            prefix,
        })
    }

    /// How many subnets of length `prefix` fit (0 when `prefix` is
    /// shorter; saturating at `u64::MAX`).
    pub fn subnet_count(&self, prefix: u8) -> u64 {
        match prefix.checked_sub(self.prefix) {
            Some(bits) if prefix <= 128 => 1u64.checked_shl(u32::from(bits)).unwrap_or(u64::MAX),
            _ => 0,
        }
    }

    pub fn offset(&self, ip: Ipv6Addr) -> Option<u64> {
        self.contains(ip)
            .then(|| u64::try_from(u128::from(ip) - self.network).ok())
            .flatten()
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl FromStr for Ipv6Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (address, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (address/prefix)"))?;
        let address: Ipv6Addr = address
            .parse()
            .map_err(|_| format!("{s:?}: {address:?} is not an IPv6 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 128)
            .ok_or_else(|| format!("{s:?}: bad prefix length"))?;
        let cidr = Ipv6Cidr { network: 0, prefix };
        Ok(Ipv6Cidr {
            network: u128::from(address) & cidr.mask(),
            prefix,
        })
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv6Addr::from(self.network), self.prefix)
    }
}

/// An address family, as Services name it (`spec.ipFamilies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    pub fn of(ip: IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::Ipv4
        } else {
            IpFamily::Ipv6
        }
    }

    /// `IPv4` / `IPv6`.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "IPv4",
            IpFamily::Ipv6 => "IPv6",
        }
    }

    pub fn from_name(name: &str) -> Option<IpFamily> {
        match name {
            "IPv4" => Some(IpFamily::Ipv4),
            "IPv6" => Some(IpFamily::Ipv6),
            _ => None,
        }
    }

    pub fn other(self) -> IpFamily {
        match self {
            IpFamily::Ipv4 => IpFamily::Ipv6,
            IpFamily::Ipv6 => IpFamily::Ipv4,
        }
    }
}

/// A network of either family (IPv4 ones order first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpCidr {
    V4(Ipv4Cidr),
    V6(Ipv6Cidr),
}

impl IpCidr {
    pub fn family(&self) -> IpFamily {
        match self {
            IpCidr::V4(_) => IpFamily::Ipv4,
            IpCidr::V6(_) => IpFamily::Ipv6,
        }
    }

    pub fn size(&self) -> u64 {
        match self {
            IpCidr::V4(c) => c.size(),
            IpCidr::V6(c) => c.size(),
        }
    }

    pub fn prefix(&self) -> u8 {
        match self {
            IpCidr::V4(c) => c.prefix(),
            IpCidr::V6(c) => c.prefix(),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self, ip) {
            (IpCidr::V4(c), IpAddr::V4(ip)) => c.contains(ip),
            (IpCidr::V6(c), IpAddr::V6(ip)) => c.contains(ip),
            _ => false,
        }
    }

    pub fn nth(&self, offset: u64) -> Option<IpAddr> {
        match self {
            IpCidr::V4(c) => c.nth(offset).map(IpAddr::V4),
            IpCidr::V6(c) => c.nth(offset).map(IpAddr::V6),
        }
    }

    /// The `index`-th subnet of length `prefix` inside this network.
    pub fn subnet(&self, prefix: u8, index: u64) -> Option<IpCidr> {
        match self {
            IpCidr::V4(c) => c.subnet(prefix, index).map(IpCidr::V4),
            IpCidr::V6(c) => c.subnet(prefix, index).map(IpCidr::V6),
        }
    }

    pub fn subnet_count(&self, prefix: u8) -> u64 {
        match self {
            IpCidr::V4(c) => c.subnet_count(prefix),
            IpCidr::V6(c) => c.subnet_count(prefix),
        }
    }

    /// Whether the two networks share an address.
    pub fn overlaps(&self, other: &IpCidr) -> bool {
        match (self.nth(0), other.nth(0)) {
            (Some(a), Some(b)) => self.contains(b) || other.contains(a),
            _ => false,
        }
    }

    pub fn offset(&self, ip: IpAddr) -> Option<u64> {
        match (self, ip) {
            (IpCidr::V4(c), IpAddr::V4(ip)) => c.offset(ip),
            (IpCidr::V6(c), IpAddr::V6(ip)) => c.offset(ip),
            _ => None,
        }
    }
}

impl FromStr for IpCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains(':') {
            s.parse().map(IpCidr::V6)
        } else {
            s.parse().map(IpCidr::V4)
        }
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpCidr::V4(c) => c.fmt(f),
            IpCidr::V6(c) => c.fmt(f),
        }
    }
}

/// `--service-cluster-ip-range`: one CIDR, or two of different families
/// (dual-stack; the first is the primary family). Each holds at most 2^20
/// addresses (an IPv4 /12, an IPv6 /108), as Kubernetes allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCidrs(Vec<IpCidr>);

impl ServiceCidrs {
    pub fn primary(&self) -> IpCidr {
        self.0[0]
    }

    /// The configured ranges, primary first.
    pub fn all(&self) -> &[IpCidr] {
        &self.0
    }

    pub fn family(&self, family: IpFamily) -> Option<IpCidr> {
        self.0.iter().copied().find(|c| c.family() == family)
    }

    pub fn dual_stack(&self) -> bool {
        self.0.len() == 2
    }
}

impl From<Ipv4Cidr> for ServiceCidrs {
    fn from(cidr: Ipv4Cidr) -> Self {
        ServiceCidrs(vec![IpCidr::V4(cidr)])
    }
}

impl FromStr for ServiceCidrs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let cidrs = s
            .split(',')
            .map(|part| part.trim().parse::<IpCidr>())
            .collect::<Result<Vec<_>, _>>()?;
        match cidrs.as_slice() {
            [] => return Err("no service CIDR".into()),
            [a, b] if a.family() == b.family() => {
                return Err(format!(
                    "{s:?}: a dual-stack range needs one CIDR of each family"
                ))
            }
            [_, _, _, ..] => return Err(format!("{s:?}: at most two CIDRs (one per family)")),
            _ => {}
        }
        for cidr in &cidrs {
            let bits = match cidr.family() {
                IpFamily::Ipv4 => 32,
                IpFamily::Ipv6 => 128,
            } - u32::from(cidr.prefix());
            if bits > 20 {
                return Err(format!(
                    "{cidr} is too large: at most 2^20 addresses (an IPv4 /12, an IPv6 /108)"
                ));
            }
        }
        Ok(ServiceCidrs(cidrs))
    }
}

impl fmt::Display for ServiceCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// `--cluster-cidr` (and a node's `--pod-cidr`): an IPv4 CIDR, and for a
/// dual-stack pod network an IPv6 one beside it, in either order: the first
/// is the primary family (`10.244.0.0/16,fd00:10:244::/56`, or IPv6 first
/// for an IPv6-first cluster). Pods always have an IPv4 address: their
/// IPv6 one is derived from it (ADR 0034), so an IPv6-only pod network is
/// not one Portal makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCidrs {
    pub v4: Ipv4Cidr,
    pub v6: Option<Ipv6Cidr>,
    /// The IPv6 range was listed first: pods' first address is IPv6.
    pub ipv6_primary: bool,
}

impl PodCidrs {
    /// The ranges as a Node's `spec.podCIDRs` lists them (primary first).
    pub fn to_strings(self) -> Vec<String> {
        self.ranges().iter().map(ToString::to_string).collect()
    }

    /// The ranges, primary first.
    pub fn ranges(self) -> Vec<IpCidr> {
        let v4 = IpCidr::V4(self.v4);
        match self.v6.map(IpCidr::V6) {
            Some(v6) if self.ipv6_primary => vec![v6, v4],
            Some(v6) => vec![v4, v6],
            None => vec![v4],
        }
    }

    /// Without the IPv6 range (a node that cannot route IPv6).
    pub fn ipv4_only(self) -> Self {
        PodCidrs {
            v4: self.v4,
            v6: None,
            ipv6_primary: false,
        }
    }

    /// A Node's `spec.podCIDRs` (or `podCIDR` alone) read back.
    pub fn from_strings<S: AsRef<str>>(ranges: &[S]) -> Result<Self, String> {
        let joined: Vec<&str> = ranges.iter().map(AsRef::as_ref).collect();
        joined.join(",").parse()
    }

    /// The ranges a Node's spec gives it, if Portal can use them (an IPv4
    /// range, optionally an IPv6 one, in either order).
    pub fn of_node(spec: &NodeSpec) -> Option<Self> {
        let listed = listed_pod_cidrs(spec);
        if listed.is_empty() {
            return None;
        }
        Self::from_strings(&listed).ok()
    }
}

/// The pod ranges a Node's spec lists, as text: `podCIDRs`, else `podCIDR`.
fn listed_pod_cidrs(spec: &NodeSpec) -> Vec<&str> {
    match &spec.pod_cidrs {
        Some(ranges) if !ranges.is_empty() => ranges.iter().map(String::as_str).collect(),
        _ => spec.pod_cidr.as_deref().into_iter().collect(),
    }
}

/// A Node's pod ranges of any family (those that are no CIDR left out).
pub fn node_pod_cidrs(spec: Option<&NodeSpec>) -> Vec<IpCidr> {
    spec.map(listed_pod_cidrs)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| r.parse().ok())
        .collect()
}

impl From<Ipv4Cidr> for PodCidrs {
    fn from(v4: Ipv4Cidr) -> Self {
        PodCidrs {
            v4,
            v6: None,
            ipv6_primary: false,
        }
    }
}

impl FromStr for PodCidrs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        match parts.as_slice() {
            [v4] => Ok(PodCidrs::from(v4.parse::<Ipv4Cidr>()?)),
            [first, second] => match (first.parse::<IpCidr>()?, second.parse::<IpCidr>()?) {
                (IpCidr::V4(v4), IpCidr::V6(v6)) => Ok(PodCidrs {
                    v4,
                    v6: Some(v6),
                    ipv6_primary: false,
                }),
                (IpCidr::V6(v6), IpCidr::V4(v4)) => Ok(PodCidrs {
                    v4,
                    v6: Some(v6),
                    ipv6_primary: true,
                }),
                _ => Err(format!(
                    "{s:?}: a dual-stack pod network is one IPv4 and one IPv6 range"
                )),
            },
            _ => Err(format!(
                "{s:?}: one IPv4 CIDR, or an IPv4 and an IPv6 one (the first is the primary family)"
            )),
        }
    }
}

impl fmt::Display for PodCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_strings().join(","))
    }
}

/// An inclusive port range, `30000-32767`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: i64) -> bool {
        (i64::from(self.first)..=i64::from(self.last)).contains(&port)
    }

    pub fn size(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |p: &str| p.trim().parse::<u16>().ok().filter(|p| *p > 0);
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (parse(a), parse(b)),
            None => (parse(s), parse(s)),
        };
        match (first, last) {
            (Some(first), Some(last)) if first <= last => Ok(PortRange { first, last }),
            _ => Err(format!("{s:?} is not a port range (e.g. 30000-32767)")),
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cidrs_and_ipv6_node_ranges() {
        let both: PodCidrs = "10.244.0.0/16, fd00:10:244::/56".parse().unwrap();
        assert_eq!(both.to_string(), "10.244.0.0/16,fd00:10:244::/56");
        let v6 = both.v6.unwrap();
        assert_eq!(v6.subnet_count(64), 256);
        assert_eq!(v6.subnet(64, 3).unwrap().to_string(), "fd00:10:244:3::/64");
        assert_eq!(v6.subnet(64, 256), None);
        assert_eq!(v6.subnet_count(48), 0);
        assert_eq!(
            PodCidrs::from_strings(&["10.244.1.0/24", "fd00:10:244:1::/64"])
                .unwrap()
                .v6,
            Some("fd00:10:244:1::/64".parse().unwrap())
        );
        assert_eq!("10.244.0.0/16".parse::<PodCidrs>().unwrap().v6, None);
        // IPv6 first: the same ranges, IPv6 primary, listed back in order.
        let v6_first = "fd00::/56,10.244.0.0/16".parse::<PodCidrs>().unwrap();
        assert!(v6_first.ipv6_primary);
        assert_eq!(v6_first.to_string(), "fd00::/56,10.244.0.0/16");
        assert_eq!(v6_first.ipv4_only().to_string(), "10.244.0.0/16");
        assert!("fd00::/56".parse::<PodCidrs>().is_err());
        assert!("10.0.0.0/8,10.1.0.0/16".parse::<PodCidrs>().is_err());
    }

    #[test]
    fn cidrs() {
        let range: Ipv4Cidr = "10.96.0.0/12".parse().unwrap();
        assert_eq!(range.size(), 1 << 20);
        assert!(range.contains("10.111.255.255".parse().unwrap()));
        assert!(!range.contains("10.112.0.0".parse().unwrap()));
        assert_eq!(range.nth(1), Some("10.96.0.1".parse().unwrap()));
        assert_eq!(range.offset("10.96.1.0".parse().unwrap()), Some(256));
        assert_eq!(
            "10.96.0.7/12".parse::<Ipv4Cidr>().unwrap().to_string(),
            "10.96.0.0/12"
        );
        assert!("10.96.0.0".parse::<Ipv4Cidr>().is_err());
        assert!("10.96.0.0/33".parse::<Ipv4Cidr>().is_err());
        let pods: Ipv4Cidr = "10.244.0.0/16".parse().unwrap();
        assert_eq!(pods.subnet_count(24), 256);
        assert_eq!(pods.subnet(24, 3).unwrap().to_string(), "10.244.3.0/24");
        assert_eq!(pods.subnet(24, 256), None);
        assert_eq!(pods.subnet(8, 0), None);
    }

    #[test]
    fn service_cidrs_of_either_family() {
        let dual: ServiceCidrs = "fd00:10:96::/108, 10.96.0.0/12".parse().unwrap();
        assert!(dual.dual_stack());
        assert_eq!(dual.primary().family(), IpFamily::Ipv6);
        let v6 = dual.family(IpFamily::Ipv6).unwrap();
        assert_eq!(v6.size(), 1 << 20);
        assert_eq!(v6.nth(10), Some("fd00:10:96::a".parse().unwrap()));
        assert_eq!(v6.offset("fd00:10:96::1:0".parse().unwrap()), Some(65536));
        assert!(!v6.contains("10.96.0.1".parse().unwrap()));
        assert_eq!(dual.to_string(), "fd00:10:96::/108,10.96.0.0/12");
        assert!("10.96.0.0/12,10.0.0.0/16".parse::<ServiceCidrs>().is_err());
        assert!("fd00::/64"
            .parse::<ServiceCidrs>()
            .unwrap_err()
            .contains("too large"));
        assert!("10.0.0.0/8".parse::<ServiceCidrs>().is_err());
        assert!("fd00::1/108".parse::<IpCidr>().unwrap().to_string() == "fd00::/108");
    }

    #[test]
    fn port_ranges() {
        let range: PortRange = "30000-32767".parse().unwrap();
        assert_eq!(range.size(), 2768);
        assert!(range.contains(30000) && range.contains(32767) && !range.contains(80));
        assert!("32767-30000".parse::<PortRange>().is_err());
        assert!("0-10".parse::<PortRange>().is_err());
    }
}
