//! Inclusive ranges of addresses and ports, kept sorted and merged (nft
//! refuses overlapping intervals in a set), and ipBlocks as such ranges.
//!
//! Addresses of both families live in one space, IPv6's: an IPv4 address
//! is its IPv4-mapped IPv6 address (`::ffff:10.0.0.1`), and IPv6 ranges
//! never cover that part (an IPv6 `::/0` block is every IPv6 address, not
//! IPv4's too). [`split`] gives each family's ranges back for its table.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use portal_api::kinds::network_policy::{cidr_bounds, parse_cidr};

/// Where IPv4 addresses sit in the one address space (`::ffff:0:0/96`).
const V4_BASE: u128 = 0xffff_0000_0000;
const V4_LAST: u128 = V4_BASE + u32::MAX as u128;

/// An address in the one space.
pub fn address(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => V4_BASE + u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of a value of the one space.
pub fn ip_of(value: u128) -> IpAddr {
    match u32::try_from(value.wrapping_sub(V4_BASE)) {
        Ok(v4) if (V4_BASE..=V4_LAST).contains(&value) => IpAddr::V4(Ipv4Addr::from(v4)),
        _ => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// The IPv4 part and the IPv6 part of `ranges`.
pub fn split(ranges: &Ranges<u128>) -> (Ranges<u128>, Ranges<u128>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for &(low, high) in ranges {
        let (a, b) = (low.max(V4_BASE), high.min(V4_LAST));
        if a <= b {
            v4.push((a, b));
        }
        v6.extend(subtract((low, high), &vec![(V4_BASE, V4_LAST)]));
    }
    (v4, v6)
}

/// Inclusive ranges, sorted and merged (no two overlap or touch).
pub type Ranges<T> = Vec<(T, T)>;

/// The one thing `merge` needs of a number: its successor.
pub trait Step {
    fn next_or_max(self) -> Self;
}

impl Step for u128 {
    fn next_or_max(self) -> Self {
        self.saturating_add(1)
    }
}

impl Step for u32 {
    fn next_or_max(self) -> Self {
        self.saturating_add(1)
    }
}

impl Step for u16 {
    fn next_or_max(self) -> Self {
        self.saturating_add(1)
    }
}

/// Sorts and merges ranges so none overlap or touch.
pub fn merge<T: Copy + Ord + Step>(mut ranges: Ranges<T>) -> Ranges<T> {
    ranges.sort();
    let mut merged: Ranges<T> = Vec::with_capacity(ranges.len());
    for (low, high) in ranges {
        match merged.last_mut() {
            Some(last) if low <= last.1.next_or_max() => last.1 = last.1.max(high),
            _ => merged.push((low, high)),
        }
    }
    merged
}

/// `range` without the `holes` (sorted, merged).
fn subtract(range: (u128, u128), holes: &Ranges<u128>) -> Ranges<u128> {
    let mut left = vec![range];
    for &(low, high) in holes {
        left = left
            .into_iter()
            .flat_map(|(a, b)| {
                let mut parts = Vec::new();
                if high < a || low > b {
                    parts.push((a, b));
                } else {
                    if low > a {
                        parts.push((a, low - 1));
                    }
                    if high < b {
                        parts.push((high + 1, b));
                    }
                }
                parts
            })
            .collect();
    }
    left
}

/// A block of either family in the one space (an IPv6 block without the
/// IPv4 part).
fn block_ranges(block: (IpAddr, u8)) -> Ranges<u128> {
    let (low, high) = cidr_bounds(block);
    if block.0.is_ipv4() {
        vec![(V4_BASE + low, V4_BASE + high)]
    } else {
        subtract((low, high), &vec![(V4_BASE, V4_LAST)])
    }
}

/// An ipBlock (either family) less its exceptions; empty for bad text.
pub fn ip_block(cidr: &str, except: &[String]) -> Ranges<u128> {
    let Some(block) = parse_cidr(cidr) else {
        return Vec::new();
    };
    let holes: Ranges<u128> = merge(
        except
            .iter()
            .filter_map(|e| parse_cidr(e))
            .flat_map(block_ranges)
            .collect(),
    );
    block_ranges(block)
        .into_iter()
        .flat_map(|range| subtract(range, &holes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_and_subtracted() {
        assert_eq!(
            merge(vec![(5u16, 9), (1, 3), (4, 4), (20, 30), (25, 26)]),
            vec![(1, 9), (20, 30)]
        );
        assert_eq!(
            merge(vec![(u32::MAX, u32::MAX), (0, u32::MAX)]),
            vec![(0, u32::MAX)]
        );
        let block = ip_block(
            "10.0.0.0/24",
            &["10.0.0.0/26".into(), "10.0.0.128/25".into()],
        );
        assert_eq!(block, vec![(V4_BASE + 0x0a00_0040, V4_BASE + 0x0a00_007f)]);
        let six = ip_block("2001:db8::/32", &["2001:db8:1::/48".into()]);
        assert_eq!(six.len(), 2);
        assert_eq!(ip_of(six[0].0).to_string(), "2001:db8::");
        assert_eq!(
            ip_of(six[1].1).to_string(),
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        // Every IPv6 address is not every IPv4 address too.
        let (v4, v6) = split(&ip_block("::/0", &[]));
        assert!(v4.is_empty() && v6.len() == 2, "{v4:?} {v6:?}");
        let (v4, v6) = split(&ip_block("0.0.0.0/0", &[]));
        assert_eq!((v4, v6), (vec![(V4_BASE, V4_LAST)], vec![]));
        assert_eq!(
            ip_of(address("10.1.2.3".parse().unwrap())).to_string(),
            "10.1.2.3"
        );
    }
}
