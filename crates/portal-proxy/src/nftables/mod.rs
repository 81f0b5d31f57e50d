//! Kernel mode (SPEC P2): Portal's own nftables table, kept equal to the
//! Services and endpoints. A partial sync sends only the changed Services'
//! chains, map elements and sets, in one transaction; a full sync (at
//! start, after a failure) rewrites every chain and map in one transaction
//! over whatever the table holds, so packets never see a half-built table,
//! and deletes leftovers. The table stays when the proxy exits: traffic
//! keeps flowing, and the next start's full sync changes nothing that was
//! still right. Affinity sets are never flushed, so pinned clients stay
//! pinned across restarts.

mod conntrack;
mod exec;
pub(crate) mod rules;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tracer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;
use std::net::{Ipv4Addr, SocketAddrV4};

pub use exec::{Error, Existing, FakeNft, Nft, NftCommand};
use rules::{External, ServiceRules, HAIRPIN, TABLE};

use crate::model::{Protocol, ServiceKey, ServicePort};
use crate::tracker::Changes;

/// What one Service has in the kernel now.
#[derive(Debug, Default)]
struct Applied {
    ports: Vec<ServicePort>,
    rules: ServiceRules,
}

/// Keeps Portal's table equal to the Services it is given.
#[derive(Debug)]
pub struct Nftables<N> {
    nft: N,
    external: External,
    applied: HashMap<ServiceKey, Applied>,
    /// Services using each hairpin address.
    hairpin: HashMap<Ipv4Addr, usize>,
    /// Deletes stale UDP conntrack entries (none in tests).
    conntrack: Option<conntrack::Conntrack>,
}

impl Nftables<NftCommand> {
    /// The real kernel.
    pub fn kernel() -> Self {
        Self::new(
            NftCommand,
            External::Masquerade,
            Some(conntrack::Conntrack::default()),
        )
    }

    /// Rules for the userspace proxy: every Service port's "endpoint" is
    /// the proxy's listener; no masquerading (the proxy terminates).
    pub fn redirecting() -> Self {
        Self::new(NftCommand, External::Keep, None)
    }
}

impl<N: Nft> Nftables<N> {
    fn new(nft: N, external: External, conntrack: Option<conntrack::Conntrack>) -> Self {
        Self {
            nft,
            external,
            applied: HashMap::new(),
            hairpin: HashMap::new(),
            conntrack,
        }
    }

    #[cfg(test)]
    pub(crate) fn fake(nft: N) -> Self {
        Self::new(nft, External::Masquerade, None)
    }

    #[cfg(test)]
    pub(crate) fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    /// Applies `changes`: every Service when `full` (the table is rebuilt
    /// in one transaction), else only those in `changes`.
    pub fn sync(&mut self, changes: &Changes, full: bool) -> Result<(), Error> {
        let result = if full {
            self.full(changes)
        } else {
            self.partial(changes)
        };
        if result.is_err() {
            // The kernel may hold anything now: the next sync is a full one
            // and must not trust what we think is applied.
            self.applied.clear();
            self.hairpin.clear();
        }
        result
    }

    fn full(&mut self, changes: &Changes) -> Result<(), Error> {
        let started = std::time::Instant::now();
        let existing = self.nft.existing()?;
        let listed = started.elapsed();
        let mut script = String::new();
        rules::render_base(&mut script);
        let mut applied = HashMap::new();
        let mut hairpin: BTreeMap<Ipv4Addr, usize> = BTreeMap::new();
        let (mut chains, mut sets) = (BTreeSet::new(), BTreeSet::new());
        for (key, ports) in &changes.services {
            let rules = rules::service_rules(ports, self.external);
            for (set, timeout) in &rules.sets {
                // Not flushed: affinity survives a resync.
                let _ = writeln!(script, "add set {TABLE} {set} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ; }}");
                sets.insert(set.clone());
            }
            for chain in rules.chains.keys() {
                let _ = writeln!(
                    script,
                    "add chain {TABLE} {chain}\nflush chain {TABLE} {chain}"
                );
                chains.insert(chain.clone());
            }
            for (chain, chain_rules) in &rules.chains {
                rules::render_rules(&mut script, chain, chain_rules);
            }
            for ((map, key), verdict) in &rules.elements {
                let _ = writeln!(script, "add element {TABLE} {map} {{ {key} : {verdict} }}");
            }
            for ip in &rules.hairpin {
                *hairpin.entry(*ip).or_default() += 1;
            }
            if !ports.is_empty() {
                applied.insert(
                    key.clone(),
                    Applied {
                        ports: ports.clone(),
                        rules,
                    },
                );
            }
        }
        for ip in hairpin.keys() {
            let _ = writeln!(script, "add element {TABLE} {HAIRPIN} {{ {ip} . {ip} }}");
        }
        let base: BTreeSet<&str> = rules::BASE_CHAINS.iter().copied().collect();
        let stale_chains: Vec<&String> = existing
            .chains
            .iter()
            .filter(|c| !chains.contains(*c) && !base.contains(c.as_str()))
            .collect();
        // Flush before deleting: stale chains may jump to each other.
        for chain in &stale_chains {
            let _ = writeln!(script, "flush chain {TABLE} {chain}");
        }
        for chain in &stale_chains {
            let _ = writeln!(script, "delete chain {TABLE} {chain}");
        }
        for set in existing
            .sets
            .iter()
            .filter(|s| !sets.contains(*s) && s.as_str() != HAIRPIN)
        {
            let _ = writeln!(script, "delete set {TABLE} {set}");
        }
        let rendered = started.elapsed();
        self.nft.apply(&script)?;
        tracing::debug!(?listed, ?rendered, applied = ?started.elapsed(), bytes = script.len(), "full sync");
        let before = std::mem::replace(&mut self.applied, applied);
        self.hairpin = hairpin.into_iter().collect();
        self.forget_udp_flows(before.values().map(|a| &a.ports[..]), changes);
        Ok(())
    }

    fn partial(&mut self, changes: &Changes) -> Result<(), Error> {
        let mut tx = Transaction::default();
        let mut next = Vec::new();
        for (key, ports) in &changes.services {
            let old = self.applied.get(key);
            let new = rules::service_rules(ports, self.external);
            let empty = ServiceRules::default();
            tx.diff(old.map_or(&empty, |a| &a.rules), &new, &mut self.hairpin);
            next.push((key.clone(), ports.clone(), new));
        }
        if !tx.is_empty() {
            self.nft.apply(&tx.finish())?;
        }
        let mut before = Vec::new();
        for (key, ports, rules) in next {
            let old = if ports.is_empty() {
                self.applied.remove(&key)
            } else {
                self.applied.insert(key, Applied { ports, rules })
            };
            before.extend(old);
        }
        self.forget_udp_flows(before.iter().map(|a| &a.ports[..]), changes);
        Ok(())
    }

    /// UDP has no connection to end: entries NATed to an endpoint that left
    /// would keep sending there until they time out (P2).
    fn forget_udp_flows<'a>(
        &mut self,
        before: impl Iterator<Item = &'a [ServicePort]>,
        changes: &Changes,
    ) {
        let Some(conntrack) = &mut self.conntrack else {
            return;
        };
        let now: HashMap<(ServiceKey, String), &ServicePort> = changes
            .services
            .values()
            .flatten()
            .map(|p| ((p.service.clone(), p.port_name.clone()), p))
            .collect();
        for old in before.flatten().filter(|p| p.protocol == Protocol::Udp) {
            let current = now.get(&(old.service.clone(), old.port_name.clone()));
            let gone: Vec<SocketAddrV4> = old
                .endpoints
                .iter()
                .filter(|e| current.is_none_or(|c| !c.endpoints.contains(e)))
                .copied()
                .collect();
            for endpoint in gone {
                conntrack.forget(old, endpoint);
            }
        }
    }
}

/// A partial sync's statements, in an order the kernel accepts within one
/// transaction: new sets and chains before anything refers to them,
/// deletions after the last reference is gone.
#[derive(Debug, Default)]
struct Transaction {
    add_sets: String,
    add_chains: String,
    delete_elements: String,
    fill_chains: String,
    add_elements: String,
    delete_chains: String,
    delete_sets: String,
}

impl Transaction {
    fn diff(
        &mut self,
        old: &ServiceRules,
        new: &ServiceRules,
        hairpin: &mut HashMap<Ipv4Addr, usize>,
    ) {
        // The timeout is part of a set's name: sets are only added or deleted.
        for (set, timeout) in new.sets.iter().filter(|(s, _)| !old.sets.contains_key(*s)) {
            let _ = writeln!(self.add_sets, "add set {TABLE} {set} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ; }}");
        }
        for set in old.sets.keys().filter(|s| !new.sets.contains_key(*s)) {
            let _ = writeln!(self.delete_sets, "delete set {TABLE} {set}");
        }
        for ((map, key), verdict) in &old.elements {
            if new.elements.get(&(*map, key.clone())) != Some(verdict) {
                let _ = writeln!(
                    self.delete_elements,
                    "delete element {TABLE} {map} {{ {key} }}"
                );
            }
        }
        for ((map, key), verdict) in &new.elements {
            if old.elements.get(&(*map, key.clone())) != Some(verdict) {
                let _ = writeln!(
                    self.add_elements,
                    "add element {TABLE} {map} {{ {key} : {verdict} }}"
                );
            }
        }
        for (chain, rules) in &new.chains {
            match old.chains.get(chain) {
                Some(old_rules) if old_rules == rules => continue,
                Some(_) => {}
                None => {
                    let _ = writeln!(self.add_chains, "add chain {TABLE} {chain}");
                }
            }
            let _ = writeln!(self.fill_chains, "flush chain {TABLE} {chain}");
            rules::render_rules(&mut self.fill_chains, chain, rules);
        }
        for chain in old.chains.keys().filter(|c| !new.chains.contains_key(*c)) {
            let _ = writeln!(self.fill_chains, "flush chain {TABLE} {chain}");
            let _ = writeln!(self.delete_chains, "delete chain {TABLE} {chain}");
        }
        for ip in new.hairpin.difference(&old.hairpin) {
            let count = hairpin.entry(*ip).or_default();
            *count += 1;
            if *count == 1 {
                let _ = writeln!(
                    self.add_elements,
                    "add element {TABLE} {HAIRPIN} {{ {ip} . {ip} }}"
                );
            }
        }
        for ip in old.hairpin.difference(&new.hairpin) {
            if let Some(count) = hairpin.get_mut(ip) {
                *count -= 1;
                if *count == 0 {
                    hairpin.remove(ip);
                    let _ = writeln!(
                        self.delete_elements,
                        "delete element {TABLE} {HAIRPIN} {{ {ip} . {ip} }}"
                    );
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        [
            &self.add_sets,
            &self.add_chains,
            &self.delete_elements,
            &self.fill_chains,
            &self.add_elements,
            &self.delete_chains,
            &self.delete_sets,
        ]
        .iter()
        .all(|s| s.is_empty())
    }

    fn finish(self) -> String {
        [
            self.add_sets,
            self.add_chains,
            self.delete_elements,
            self.fill_chains,
            self.add_elements,
            self.delete_chains,
            self.delete_sets,
        ]
        .concat()
    }
}
