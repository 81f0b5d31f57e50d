//! Kubernetes' strict rules for IP addresses and CIDRs written in objects
//! that are new since 1.33 (`IsValidIP`, `IsValidCIDR`: IPAddress names,
//! ServiceCIDR ranges): parseable, no leading zeros, no IPv4-mapped IPv6,
//! no bits past the prefix, and in canonical form, so one address has one
//! spelling (and an IPAddress one name).

use std::net::IpAddr;

use crate::cidr::IpCidr;

/// What `IsValidIP` says of text that is no address at all.
pub const IP_HINT: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";
const CIDR_HINT: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

/// What is wrong with `value` as an IP address, as `IsValidIP` says it.
pub fn ip_problem(value: &str) -> Option<String> {
    let Ok(ip) = value.parse::<IpAddr>() else {
        return Some(if leading_zeros(value).is_some() {
            "must not have leading 0s".to_owned()
        } else {
            IP_HINT.to_owned()
        });
    };
    if is_ipv4_mapped(ip) {
        return Some("must not be an IPv4-mapped IPv6 address".to_owned());
    }
    let canonical = ip.to_string();
    (canonical != value).then(|| format!("must be in canonical form ({canonical:?})"))
}

/// What is wrong with `value` as a CIDR, as `IsValidCIDR` says it.
pub fn cidr_problem(value: &str) -> Option<String> {
    let Some((address, prefix)) = value.split_once('/') else {
        return Some(CIDR_HINT.to_owned());
    };
    let zero_led_prefix = prefix.len() > 1 && prefix.starts_with('0');
    let ip = match address.parse::<IpAddr>() {
        Ok(ip) if !zero_led_prefix => ip,
        parsed => {
            let sloppy = parsed.is_ok() || leading_zeros(address).is_some();
            let prefix_ok = prefix.bytes().all(|b| b.is_ascii_digit()) && !prefix.is_empty();
            return Some(if sloppy && prefix_ok {
                "must not have leading 0s in IP or prefix length".to_owned()
            } else {
                CIDR_HINT.to_owned()
            });
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.parse::<u8>().map_or(true, |p| p > max)
    {
        return Some(CIDR_HINT.to_owned());
    }
    if is_ipv4_mapped(ip) {
        return Some("must not have an IPv4-mapped IPv6 address".to_owned());
    }
    let Ok(cidr) = value.parse::<IpCidr>() else {
        return Some(CIDR_HINT.to_owned());
    };
    if cidr.nth(0) != Some(ip) {
        return Some("must not have bits set beyond the prefix length".to_owned());
    }
    let canonical = cidr.to_string();
    (canonical != value).then(|| format!("must be in canonical form ({canonical:?})"))
}

fn is_ipv4_mapped(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

/// The address with its octets' leading zeros dropped, if that makes it a
/// valid IPv4 address (Go's sloppy parser reads `010.0.0.1` as 10.0.0.1).
fn leading_zeros(value: &str) -> Option<IpAddr> {
    let octets: Vec<&str> = value.split('.').collect();
    if octets.len() != 4
        || octets
            .iter()
            .any(|o| o.is_empty() || !o.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let trimmed: Vec<&str> = octets
        .iter()
        .map(|o| match o.trim_start_matches('0') {
            "" => "0",
            t => t,
        })
        .collect();
    trimmed.join(".").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        for good in ["10.96.0.1", "2001:db8::1", "0.0.0.0", "::1", "224.0.0.1"] {
            assert_eq!(ip_problem(good), None, "{good}");
        }
        assert_eq!(
            ip_problem("10.01.2.3").as_deref(),
            Some("must not have leading 0s")
        );
        assert_eq!(ip_problem("bad").as_deref(), Some(IP_HINT));
        assert_eq!(ip_problem("fe80::1%eth0").as_deref(), Some(IP_HINT));
        assert_eq!(
            ip_problem("::ffff:10.0.0.1").as_deref(),
            Some("must not be an IPv4-mapped IPv6 address")
        );
        assert_eq!(
            ip_problem("2001:db8:0:0::1").as_deref(),
            Some("must be in canonical form (\"2001:db8::1\")")
        );
        assert_eq!(
            ip_problem("2001:DB8::1").as_deref(),
            Some("must be in canonical form (\"2001:db8::1\")")
        );
    }

    #[test]
    fn cidrs() {
        for good in [
            "10.96.0.0/12",
            "fd00:10:96::/108",
            "0.0.0.0/0",
            "10.0.0.1/32",
        ] {
            assert_eq!(cidr_problem(good), None, "{good}");
        }
        assert_eq!(cidr_problem("10.96.0.0").as_deref(), Some(CIDR_HINT));
        assert_eq!(cidr_problem("10.96.0.0/33").as_deref(), Some(CIDR_HINT));
        assert_eq!(cidr_problem("10.96.0.0/x").as_deref(), Some(CIDR_HINT));
        assert_eq!(
            cidr_problem("10.096.0.0/12").as_deref(),
            Some("must not have leading 0s in IP or prefix length")
        );
        assert_eq!(
            cidr_problem("10.96.0.0/012").as_deref(),
            Some("must not have leading 0s in IP or prefix length")
        );
        assert_eq!(
            cidr_problem("10.96.0.1/12").as_deref(),
            Some("must not have bits set beyond the prefix length")
        );
        assert_eq!(
            cidr_problem("::ffff:10.0.0.0/104").as_deref(),
            Some("must not have an IPv4-mapped IPv6 address")
        );
        assert_eq!(
            cidr_problem("fd00:10:96:0::/108").as_deref(),
            Some("must be in canonical form (\"fd00:10:96::/108\")")
        );
    }
}
