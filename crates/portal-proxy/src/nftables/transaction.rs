//! A partial sync's statements, ordered so one transaction is valid.

use std::collections::HashMap;
use std::fmt::Write;
use std::net::IpAddr;

use super::rules::{self, ServiceRules, HAIRPIN};
use crate::model::Family;

/// A partial sync's statements, in an order the kernel accepts within one
/// transaction: new sets and chains before anything refers to them,
/// deletions after the last reference is gone.
#[derive(Debug)]
pub(super) struct Transaction {
    family: Family,
    add_sets: String,
    add_chains: String,
    delete_elements: String,
    fill_chains: String,
    add_elements: String,
    delete_chains: String,
    delete_sets: String,
}

impl Transaction {
    /// An empty transaction on the table of `family`.
    pub(super) fn new(family: Family) -> Self {
        Transaction {
            family,
            add_sets: String::new(),
            add_chains: String::new(),
            delete_elements: String::new(),
            fill_chains: String::new(),
            add_elements: String::new(),
            delete_chains: String::new(),
            delete_sets: String::new(),
        }
    }

    pub(super) fn diff(
        &mut self,
        old: &ServiceRules,
        new: &ServiceRules,
        hairpin: &mut HashMap<IpAddr, usize>,
    ) {
        let table = rules::table(self.family);
        // The timeout is part of a set's name: sets are only added or deleted.
        for (set, timeout) in new.sets.iter().filter(|(s, _)| !old.sets.contains_key(*s)) {
            let _ = writeln!(
                self.add_sets,
                "add set {table} {set} {}",
                rules::affinity_set_type(self.family, *timeout)
            );
        }
        for set in old.sets.keys().filter(|s| !new.sets.contains_key(*s)) {
            let _ = writeln!(self.delete_sets, "delete set {table} {set}");
        }
        for ((map, key), verdict) in &old.elements {
            if new.elements.get(&(*map, key.clone())) != Some(verdict) {
                let _ = writeln!(
                    self.delete_elements,
                    "delete element {table} {map} {{ {key} }}"
                );
            }
        }
        for ((map, key), verdict) in &new.elements {
            if old.elements.get(&(*map, key.clone())) != Some(verdict) {
                let _ = writeln!(
                    self.add_elements,
                    "add element {table} {map} {{ {key} : {verdict} }}"
                );
            }
        }
        for (chain, rules) in &new.chains {
            match old.chains.get(chain) {
                Some(old_rules) if old_rules == rules => continue,
                Some(_) => {}
                None => {
                    let _ = writeln!(self.add_chains, "add chain {table} {chain}");
                }
            }
            let _ = writeln!(self.fill_chains, "flush chain {table} {chain}");
            rules::render_rules(&mut self.fill_chains, table, chain, rules);
        }
        for chain in old.chains.keys().filter(|c| !new.chains.contains_key(*c)) {
            let _ = writeln!(self.fill_chains, "flush chain {table} {chain}");
            let _ = writeln!(self.delete_chains, "delete chain {table} {chain}");
        }
        for ip in new.hairpin.difference(&old.hairpin) {
            let count = hairpin.entry(*ip).or_default();
            *count += 1;
            if *count == 1 {
                let _ = writeln!(
                    self.add_elements,
                    "add element {table} {HAIRPIN} {{ {ip} . {ip} }}"
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
                        "delete element {table} {HAIRPIN} {{ {ip} . {ip} }}"
                    );
                }
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
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

    pub(super) fn finish(self) -> String {
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
