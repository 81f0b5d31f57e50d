//! Kernel mode (SPEC P2): Portal's own nftables table, kept equal to the
//! Services and endpoints. A partial sync sends only the changed Services'
//! chains, map elements and sets, in one transaction; a full sync (at
//! start, after a failure, when the table was tampered with, and hourly)
//! rewrites every chain and map in one transaction over whatever the table
//! holds, so packets never see a half-built table, and deletes leftovers.
//! The table stays when the proxy exits: traffic keeps flowing, and the
//! next start's full sync changes nothing that was still right. Affinity
//! sets are never flushed, so pinned clients stay pinned across restarts.

mod conntrack;
mod exec;
#[cfg(test)]
mod kernel_model;
pub(crate) mod rules;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tracer;
mod transaction;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;
use std::net::IpAddr;

pub use exec::{Error, Existing, FakeNft, Nft, NftCommand};
use rules::{External, ServiceRules, HAIRPIN};
use transaction::Transaction;

use crate::model::{Family, ServiceKey, ServicePort};
use crate::tracker::Changes;

/// A map key (`map`, `key`), e.g. an external IP and port.
type ElementKey = (&'static str, String);

/// Keeps Portal's table of one family equal to the Services it is given
/// (their ports of that family; the others are another table's).
#[derive(Debug)]
pub struct Nftables<N> {
    nft: N,
    family: Family,
    external: External,
    /// Every Service's ports as last given.
    services: HashMap<ServiceKey, Vec<ServicePort>>,
    /// What each Service has in the kernel now.
    applied: HashMap<ServiceKey, ServiceRules>,
    /// Services wanting each map key. Keys are not unique across Services
    /// (two may list the same external IP and port, as Kubernetes allows):
    /// the first by name owns it, the others get it when it is released.
    claims: HashMap<ElementKey, BTreeSet<ServiceKey>>,
    /// Services using each hairpin address.
    hairpin: HashMap<IpAddr, usize>,
    /// Deletes stale UDP conntrack entries (none in tests).
    conntrack: Option<conntrack::Conntrack>,
}

/// Removes Portal's nftables tables (both families) from this network
/// namespace (`portal proxy --cleanup`); whether there was one.
pub fn cleanup() -> Result<bool, Error> {
    let mut removed = false;
    for family in ["ip", "ip6"] {
        let listed = crate::command::run(
            "nft",
            &["list", "table", family, rules::TABLE_NAME],
            None,
            std::time::Duration::from_secs(10),
        )
        .map_err(Error::Spawn)?;
        if !listed.status.success() {
            continue;
        }
        let deleted = crate::command::run(
            "nft",
            &["delete", "table", family, rules::TABLE_NAME],
            None,
            std::time::Duration::from_secs(10),
        )
        .map_err(Error::Spawn)?;
        if !deleted.status.success() {
            return Err(Error::Rejected(
                String::from_utf8_lossy(&deleted.stderr).trim().to_owned(),
            ));
        }
        removed = true;
    }
    Ok(removed)
}

/// The kernel mode's tables: IPv4's, and IPv6's where the node has IPv6
/// (each serves the Service ports of its family, as kube-proxy runs a
/// proxier per family).
#[derive(Debug)]
pub struct Tables {
    v4: Nftables<NftCommand>,
    v6: Option<Nftables<NftCommand>>,
    /// The IPv6 table's last sync failed: the next sync is a full one.
    /// (An IPv6 failure never fails the IPv4 table's syncs.)
    v6_failed: bool,
}

/// Whether IPv6 rules can be had here: IPv6 may be disabled in this
/// namespace (or the kernel), or nftables may lack its ip6 family. Runs
/// `nft`: call it off the async threads.
pub fn ip6_usable() -> bool {
    std::path::Path::new("/proc/net/if_inet6").exists()
        && NftCommand { family: Family::V6 }.chains().is_ok()
}

impl Tables {
    pub fn kernel() -> Self {
        Tables {
            v4: Nftables::kernel(Family::V4),
            v6: ip6_usable().then(|| Nftables::kernel(Family::V6)),
            v6_failed: false,
        }
    }

    /// Applies `changes` to every table (see [`Nftables::sync`]); the
    /// result is the IPv4 table's, an IPv6 failure asks for a full sync.
    pub fn sync(&mut self, changes: &Changes, full: bool) -> Result<(), Error> {
        let v4 = self.v4.sync(changes, full);
        if let Some(v6) = &mut self.v6 {
            match v6.sync(changes, full) {
                Ok(()) => self.v6_failed = false,
                Err(error) => {
                    // A partial change set cannot repair it: ask for all.
                    tracing::warn!(%error, "IPv6 proxy rules failed; the next sync rebuilds them");
                    self.v6_failed = true;
                }
            }
        }
        v4
    }

    /// Whether the next sync must be a full one (the IPv6 table failed).
    pub fn wants_full(&self) -> bool {
        self.v6_failed
    }

    pub fn tampered(&mut self) -> bool {
        self.v4.tampered() || self.v6.as_mut().is_some_and(Nftables::tampered)
    }
}

impl Nftables<NftCommand> {
    /// The real kernel's table of `family`.
    pub fn kernel(family: Family) -> Self {
        Self::new(
            NftCommand { family },
            family,
            External::Masquerade,
            Some(conntrack::Conntrack::new(family)),
        )
    }

    /// Rules for the userspace proxy: every Service port's "endpoint" is
    /// the proxy's listener; no masquerading (the proxy terminates).
    pub fn redirecting(family: Family) -> Self {
        Self::new(NftCommand { family }, family, External::Keep, None)
    }
}

impl<N: Nft> Nftables<N> {
    fn new(
        nft: N,
        family: Family,
        external: External,
        conntrack: Option<conntrack::Conntrack>,
    ) -> Self {
        Self {
            nft,
            family,
            external,
            services: HashMap::new(),
            applied: HashMap::new(),
            claims: HashMap::new(),
            hairpin: HashMap::new(),
            conntrack,
        }
    }

    #[cfg(test)]
    pub(crate) fn fake(nft: N) -> Self {
        Self::new(nft, Family::V4, External::Masquerade, None)
    }

    #[cfg(test)]
    pub(crate) fn fake_of(nft: N, family: Family) -> Self {
        Self::new(nft, family, External::Masquerade, None)
    }

    /// The ports of `ports` this table serves.
    fn mine(&self, ports: &[ServicePort]) -> Vec<ServicePort> {
        ports
            .iter()
            .filter(|p| p.family() == self.family)
            .cloned()
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    #[cfg(test)]
    pub(crate) fn applied(&self) -> impl Iterator<Item = &ServiceRules> {
        self.applied.values()
    }

    /// Applies `changes`: every Service when `full` (the table is rebuilt
    /// in one transaction), else only those in `changes`.
    pub fn sync(&mut self, changes: &Changes, full: bool) -> Result<(), Error> {
        let result = if full {
            self.full(changes)
        } else {
            self.partial(changes)
        };
        match result {
            Ok(()) => {
                if let Some(conntrack) = &mut self.conntrack {
                    conntrack.programmed(changes, full);
                }
            }
            Err(_) => {
                // The kernel may hold anything now: the next sync is a full
                // one and must not trust what we think is applied.
                self.services.clear();
                self.applied.clear();
                self.claims.clear();
                self.hairpin.clear();
            }
        }
        result
    }

    /// Whether Portal's table is gone or lost its dispatch chain (someone
    /// flushed the ruleset): then only a full sync repairs it.
    pub fn tampered(&mut self) -> bool {
        self.nft
            .chains()
            .is_ok_and(|chains| !chains.iter().any(|c| c == "services"))
    }

    /// Records the element keys `rules` wants for `key`.
    fn claim(&mut self, key: &ServiceKey, rules: &ServiceRules, claim: bool) {
        for element in rules.elements.keys() {
            if claim {
                self.claims
                    .entry(element.clone())
                    .or_default()
                    .insert(key.clone());
            } else if let Some(owners) = self.claims.get_mut(element) {
                owners.remove(key);
                if owners.is_empty() {
                    self.claims.remove(element);
                }
            }
        }
    }

    /// `key`'s rules without the map keys another Service owns.
    fn owned(&self, key: &ServiceKey) -> ServiceRules {
        let ports = self.services.get(key).map_or(&[][..], |p| &p[..]);
        let mut rules = rules::service_rules(ports, self.external);
        rules.elements.retain(|element, _| {
            let owner = self.claims.get(element).and_then(|owners| owners.first());
            if owner != Some(key) {
                tracing::warn!(service = %key, map = element.0, key = %element.1, owner = ?owner, "another Service has this address and port; not programmed");
                return false;
            }
            true
        });
        rules
    }

    fn full(&mut self, changes: &Changes) -> Result<(), Error> {
        let started = std::time::Instant::now();
        let existing = self.nft.existing()?;
        let listed = started.elapsed();
        self.services = changes
            .services
            .iter()
            .map(|(key, ports)| (key.clone(), self.mine(ports)))
            .filter(|(_, ports)| !ports.is_empty())
            .collect();
        let table = rules::table(self.family);
        self.claims.clear();
        let keys: Vec<ServiceKey> = self.services.keys().cloned().collect();
        for key in &keys {
            let rules = rules::service_rules(&self.services[key], self.external);
            self.claim(key, &rules, true);
        }
        let mut script = String::new();
        rules::render_base(&mut script, self.family);
        let mut applied = HashMap::new();
        let mut hairpin: BTreeMap<IpAddr, usize> = BTreeMap::new();
        let (mut chains, mut sets) = (BTreeSet::new(), BTreeSet::new());
        for key in &keys {
            let rules = self.owned(key);
            for (set, timeout) in &rules.sets {
                // Not flushed: affinity survives a resync.
                let _ = writeln!(
                    script,
                    "add set {table} {set} {}",
                    rules::affinity_set_type(self.family, *timeout)
                );
                sets.insert(set.clone());
            }
            for chain in rules.chains.keys() {
                let _ = writeln!(
                    script,
                    "add chain {table} {chain}\nflush chain {table} {chain}"
                );
                chains.insert(chain.clone());
            }
            for (chain, chain_rules) in &rules.chains {
                rules::render_rules(&mut script, table, chain, chain_rules);
            }
            for ((map, element), verdict) in &rules.elements {
                let _ = writeln!(
                    script,
                    "add element {table} {map} {{ {element} : {verdict} }}"
                );
            }
            for ip in &rules.hairpin {
                *hairpin.entry(*ip).or_default() += 1;
            }
            applied.insert(key.clone(), rules);
        }
        for ip in hairpin.keys() {
            let _ = writeln!(script, "add element {table} {HAIRPIN} {{ {ip} . {ip} }}");
        }
        let base: BTreeSet<&str> = rules::BASE_CHAINS.iter().copied().collect();
        let stale_chains: Vec<&String> = existing
            .chains
            .iter()
            .filter(|c| !chains.contains(*c) && !base.contains(c.as_str()))
            .collect();
        // Flush before deleting: stale chains may jump to each other.
        for chain in &stale_chains {
            let _ = writeln!(script, "flush chain {table} {chain}");
        }
        for chain in &stale_chains {
            let _ = writeln!(script, "delete chain {table} {chain}");
        }
        for set in existing
            .sets
            .iter()
            .filter(|s| !sets.contains(*s) && s.as_str() != HAIRPIN)
        {
            let _ = writeln!(script, "delete set {table} {set}");
        }
        let rendered = started.elapsed();
        self.nft.apply(&script)?;
        tracing::debug!(?listed, ?rendered, applied = ?started.elapsed(), bytes = script.len(), "full sync");
        self.applied = applied;
        self.hairpin = hairpin.into_iter().collect();
        Ok(())
    }

    fn partial(&mut self, changes: &Changes) -> Result<(), Error> {
        // Update what every changed Service wants, and find every Service
        // whose rules may change: the changed ones, and those sharing a map
        // key with them (ownership may move).
        let mut affected = BTreeSet::new();
        for (key, ports) in &changes.services {
            let ports = &self.mine(ports);
            let old = self
                .services
                .get(key)
                .map(|p| rules::service_rules(p, self.external));
            let new = rules::service_rules(ports, self.external);
            if let Some(old) = &old {
                self.claim(key, old, false);
            }
            self.claim(key, &new, true);
            for element in old
                .iter()
                .flat_map(|r| r.elements.keys())
                .chain(new.elements.keys())
            {
                affected.extend(self.claims.get(element).into_iter().flatten().cloned());
            }
            affected.insert(key.clone());
            if ports.is_empty() {
                self.services.remove(key);
            } else {
                self.services.insert(key.clone(), ports.clone());
            }
        }
        let mut tx = Transaction::new(self.family);
        let mut next = Vec::new();
        let empty = ServiceRules::default();
        for key in affected {
            let new = self.owned(&key);
            tx.diff(
                self.applied.get(&key).unwrap_or(&empty),
                &new,
                &mut self.hairpin,
            );
            next.push((key, new));
        }
        if !tx.is_empty() {
            self.nft.apply(&tx.finish())?;
        }
        for (key, rules) in next {
            if self.services.contains_key(&key) {
                self.applied.insert(key, rules);
            } else {
                self.applied.remove(&key);
            }
        }
        Ok(())
    }
}
