//! One allocatable range (service IPs, node ports, load-balancer addresses)
//! and the in-memory bitmap used to pick free candidates. The store keys
//! are the truth (ADR 0003); the bitmap only makes picking fast.

use std::net::IpAddr;

use parking_lot::Mutex;
use portal_api::cidr::{IpCidr, IpFamily, PortRange};
use rand::Rng;

/// What a pool hands out.
#[derive(Clone, Debug)]
pub(crate) enum Range {
    /// Addresses of one CIDR; the network and broadcast addresses are never
    /// handed out, and offsets below `first_dynamic` only when asked for.
    Ip {
        cidr: IpCidr,
        first_dynamic: u64,
    },
    Ports(PortRange),
}

/// A pool hands out at most the first this many addresses of its CIDR (a
/// bitmap of 128 KiB): the flags allow no larger range, and a larger
/// ServiceCIDR (an IPv6 /64) is used up to this size.
pub(crate) const MAX_ADDRESSES: u64 = 1 << 20;

impl Range {
    fn size(&self) -> u64 {
        match self {
            Range::Ip { cidr, .. } => cidr.size().min(MAX_ADDRESSES),
            Range::Ports(ports) => ports.size(),
        }
    }

    /// The value at an offset (`10.96.0.10`, `30080`).
    pub(crate) fn value(&self, offset: u64) -> Option<String> {
        match self {
            Range::Ip { cidr, .. } => cidr.nth(offset).map(|ip| ip.to_string()),
            Range::Ports(ports) => {
                (offset < ports.size()).then(|| (u64::from(ports.first) + offset).to_string())
            }
        }
    }

    /// The offset of a value, `None` if it is outside the range.
    pub(crate) fn offset(&self, value: &str) -> Option<u64> {
        match self {
            Range::Ip { cidr, .. } => cidr
                .offset(value.parse::<IpAddr>().ok()?)
                .filter(|offset| *offset < MAX_ADDRESSES),
            Range::Ports(ports) => {
                let port = value.parse::<i64>().ok()?;
                ports
                    .contains(port)
                    .then(|| (port - i64::from(ports.first)) as u64)
            }
        }
    }

    /// Offsets that may be allocated at all (network/broadcast excluded).
    fn usable(&self, offset: u64) -> bool {
        match self {
            // IPv4's network and broadcast addresses; IPv6's subnet-router
            // anycast (offset 0), its last address is usable.
            Range::Ip { cidr, .. } => {
                let broadcast = cidr.family() == IpFamily::Ipv4 && offset == cidr.size() - 1;
                offset < MAX_ADDRESSES && (cidr.size() <= 2 || (offset != 0 && !broadcast))
            }
            Range::Ports(_) => offset < self.size(),
        }
    }

    /// Where random picking starts.
    fn first_dynamic(&self) -> u64 {
        match self {
            Range::Ip { first_dynamic, .. } => *first_dynamic,
            Range::Ports(_) => 0,
        }
    }

    /// The CIDR of an address range.
    pub(crate) fn cidr(&self) -> Option<IpCidr> {
        match self {
            Range::Ip { cidr, .. } => Some(*cidr),
            Range::Ports(_) => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Range::Ip { cidr, .. } => cidr.to_string(),
            Range::Ports(ports) => ports.to_string(),
        }
    }
}

/// Why a reservation failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    OutOfRange,
    Taken,
    Full,
}

#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) range: Range,
    /// The store key prefix of this pool's records.
    pub(crate) prefix: &'static str,
    used: Mutex<Bitmap>,
}

/// Used offsets, and where the next search starts.
#[derive(Debug)]
struct Bitmap {
    words: Vec<u64>,
    /// Next-fit: searching on from the last pick keeps new records' keys
    /// close together in the store (few pages per group commit), while each
    /// server's random starting point keeps several servers apart.
    cursor: u64,
}

impl Pool {
    pub(crate) fn new(range: Range, prefix: &'static str) -> Self {
        let words = vec![0; range.size().div_ceil(64) as usize];
        let cursor = rand::rng().random_range(0..range.size().max(1));
        Pool {
            range,
            prefix,
            used: Mutex::new(Bitmap { words, cursor }),
        }
    }

    pub(crate) fn key(&self, value: &str) -> String {
        format!("{}{value}", self.prefix)
    }

    fn test_and_set(bits: &mut [u64], offset: u64) -> bool {
        let (word, bit) = ((offset / 64) as usize, offset % 64);
        let was = bits[word] & (1 << bit) != 0;
        bits[word] |= 1 << bit;
        !was
    }

    /// Reserves a specific value.
    pub(crate) fn reserve(&self, value: &str) -> Result<u64, Refusal> {
        let offset = self
            .range
            .offset(value)
            .filter(|o| self.range.usable(*o))
            .ok_or(Refusal::OutOfRange)?;
        if Self::test_and_set(&mut self.used.lock().words, offset) {
            Ok(offset)
        } else {
            Err(Refusal::Taken)
        }
    }

    /// Reserves a free value in the dynamic part, searching on from the
    /// last one picked.
    pub(crate) fn reserve_any(&self) -> Result<(u64, String), Refusal> {
        let size = self.range.size();
        let first = self.range.first_dynamic().min(size);
        let span = size - first;
        if span == 0 {
            return Err(Refusal::Full);
        }
        let mut used = self.used.lock();
        let start = used.cursor.saturating_sub(first) % span;
        let mut step = 0;
        while step < span {
            let offset = first + (start + step) % span;
            // A whole word in use (a nearly full range): skip it at once.
            if offset % 64 == 0
                && offset + 64 <= first + span
                && used.words[(offset / 64) as usize] == u64::MAX
            {
                step += 64;
                continue;
            }
            if self.range.usable(offset) && Self::test_and_set(&mut used.words, offset) {
                used.cursor = offset + 1;
                let value = self.range.value(offset).ok_or(Refusal::Full)?;
                return Ok((offset, value));
            }
            step += 1;
        }
        Err(Refusal::Full)
    }

    pub(crate) fn release(&self, offset: u64) {
        let (word, bit) = ((offset / 64) as usize, offset % 64);
        if let Some(w) = self.used.lock().words.get_mut(word) {
            *w &= !(1 << bit);
        }
    }

    /// Marks a value used; values outside are ignored.
    #[cfg(test)]
    pub(crate) fn mark(&self, value: &str) {
        if let Some(offset) = self.range.offset(value) {
            Self::test_and_set(&mut self.used.lock().words, offset);
        }
    }

    /// Replaces the bitmap with exactly `values`.
    pub(crate) fn sync<'a>(&self, values: impl IntoIterator<Item = &'a str>) {
        let mut fresh = vec![0; self.range.size().div_ceil(64) as usize];
        for value in values {
            if let Some(offset) = self.range.offset(value) {
                Self::test_and_set(&mut fresh, offset);
            }
        }
        self.used.lock().words = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_until_full_and_releases() {
        let pool = Pool::new(
            Range::Ip {
                cidr: "10.0.0.0/29".parse().unwrap(),
                first_dynamic: 2,
            },
            "/p/",
        );
        // 8 addresses: network (0) and broadcast (7) never, 1 only on request.
        let mut got: Vec<String> = (0..5).map(|_| pool.reserve_any().unwrap().1).collect();
        got.sort();
        assert_eq!(
            got,
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        );
        assert_eq!(pool.reserve_any(), Err(Refusal::Full));
        assert_eq!(pool.reserve("10.0.0.1"), Ok(1));
        assert_eq!(pool.reserve("10.0.0.1"), Err(Refusal::Taken));
        assert_eq!(pool.reserve("10.0.0.7"), Err(Refusal::OutOfRange));
        assert_eq!(pool.reserve("10.0.1.1"), Err(Refusal::OutOfRange));
        pool.release(3);
        assert_eq!(pool.reserve_any().unwrap().1, "10.0.0.3");
    }

    #[test]
    fn finds_the_last_free_address_of_a_large_range() {
        let pool = Pool::new(
            Range::Ip {
                cidr: "10.96.0.0/16".parse().unwrap(),
                first_dynamic: 2,
            },
            "/p/",
        );
        let all: Vec<String> = (0..65_536).filter_map(|o| pool.range.value(o)).collect();
        pool.sync(all.iter().map(String::as_str));
        pool.release(40_001);
        assert_eq!(pool.reserve_any().unwrap().1, "10.96.156.65");
        assert_eq!(pool.reserve_any(), Err(Refusal::Full));
    }

    #[test]
    fn ports() {
        let ports = Pool::new(Range::Ports("30000-30001".parse().unwrap()), "/n/");
        assert!(ports.reserve_any().is_ok() && ports.reserve_any().is_ok());
        assert_eq!(ports.reserve_any(), Err(Refusal::Full));
    }
}
