//! Inclusive ranges of addresses and ports, kept sorted and merged (nft
//! refuses overlapping intervals in a set), and ipBlocks as such ranges.

use portal_api::kinds::network_policy::{cidr_bounds, parse_cidr};

/// Inclusive ranges, sorted and merged (no two overlap or touch).
pub type Ranges<T> = Vec<(T, T)>;

/// The one thing `merge` needs of a number: its successor.
pub trait Step {
    fn next_or_max(self) -> Self;
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
fn subtract(range: (u32, u32), holes: &Ranges<u32>) -> Ranges<u32> {
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

/// An IPv4 ipBlock less its exceptions; empty for another family or bad text.
pub fn ip_block(cidr: &str, except: &[String]) -> Ranges<u32> {
    let Some(block) = parse_cidr(cidr).filter(|(ip, _)| ip.is_ipv4()) else {
        return Vec::new();
    };
    let (low, high) = cidr_bounds(block);
    let holes: Ranges<u32> = merge(
        except
            .iter()
            .filter_map(|e| parse_cidr(e).filter(|(ip, _)| ip.is_ipv4()))
            .map(cidr_bounds)
            .map(|(l, h)| (l as u32, h as u32))
            .collect(),
    );
    subtract((low as u32, high as u32), &holes)
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
        assert_eq!(block, vec![(0x0a00_0040, 0x0a00_007f)]);
        assert!(ip_block("2001:db8::/32", &[]).is_empty());
    }
}
