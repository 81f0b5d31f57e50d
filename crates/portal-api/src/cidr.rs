//! Address and port ranges the API server allocates from: a service CIDR
//! (`10.96.0.0/12`), a port range (`30000-32767`), pools of CIDRs.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

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
    fn port_ranges() {
        let range: PortRange = "30000-32767".parse().unwrap();
        assert_eq!(range.size(), 2768);
        assert!(range.contains(30000) && range.contains(32767) && !range.contains(80));
        assert!("32767-30000".parse::<PortRange>().is_err());
        assert!("0-10".parse::<PortRange>().is_err());
    }
}
