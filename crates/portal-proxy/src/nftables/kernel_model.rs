//! A model of the kernel's side of Portal's table for unit tests: applies
//! the statements the backend emits with the kernel's rules — a reference
//! must exist when it is made, an existing element cannot be added again,
//! a missing one cannot be deleted, a referenced chain or set cannot be
//! deleted — all or nothing per transaction. So a partial sync that would
//! fail in the kernel fails here too, and its result can be compared with
//! a full sync's.

use std::collections::{BTreeMap, BTreeSet};

use super::exec::{Error, Existing, Nft};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Table {
    pub chains: BTreeMap<String, Vec<String>>,
    /// Maps and sets: name → key → value ("" for sets).
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
}

impl Table {
    /// Applies one statement.
    fn apply(&mut self, line: &str) -> Result<(), String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (verb, kind) = (
            words.first().copied().unwrap_or(""),
            words.get(1).copied().unwrap_or(""),
        );
        let name = words.get(4).map(|s| s.to_string()).unwrap_or_default();
        let rest = words.get(5..).map(|w| w.join(" ")).unwrap_or_default();
        match (verb, kind) {
            ("add", "table") => Ok(()),
            ("add", "chain") => {
                self.chains.entry(name).or_default();
                Ok(())
            }
            ("add", "map" | "set") => {
                self.maps.entry(name).or_default();
                Ok(())
            }
            ("flush", "chain") => self
                .chains
                .get_mut(&name)
                .map(Vec::clear)
                .ok_or(format!("no chain {name}")),
            ("flush", "map" | "set") => self
                .maps
                .get_mut(&name)
                .map(BTreeMap::clear)
                .ok_or(format!("no map {name}")),
            ("add", "rule") => {
                for target in references(&rest) {
                    if !self.chains.contains_key(&target) && !self.maps.contains_key(&target) {
                        return Err(format!("rule in {name} refers to missing {target}"));
                    }
                }
                self.chains
                    .get_mut(&name)
                    .ok_or(format!("no chain {name}"))?
                    .push(rest);
                Ok(())
            }
            ("add", "element") => {
                let (key, value) = element(&rest);
                for target in references(&value) {
                    if !self.chains.contains_key(&target) {
                        return Err(format!("element of {name} refers to missing {target}"));
                    }
                }
                let map = self.maps.get_mut(&name).ok_or(format!("no map {name}"))?;
                if map.contains_key(&key) {
                    return Err(format!("element {key} of {name}: File exists"));
                }
                map.insert(key, value);
                Ok(())
            }
            ("delete", "element") => {
                let (key, _) = element(&rest);
                let map = self.maps.get_mut(&name).ok_or(format!("no map {name}"))?;
                map.remove(&key).map(drop).ok_or(format!(
                    "element {key} of {name}: No such file or directory"
                ))
            }
            ("delete", "chain") => {
                if self
                    .chains
                    .get(&name)
                    .ok_or(format!("no chain {name}"))?
                    .iter()
                    .any(|_| true)
                {
                    return Err(format!("chain {name} not empty: Device or resource busy"));
                }
                if self.referenced(&name) {
                    return Err(format!("chain {name} in use: Device or resource busy"));
                }
                self.chains.remove(&name);
                Ok(())
            }
            ("delete", "set") => {
                self.maps.get(&name).ok_or(format!("no set {name}"))?;
                if self.referenced(&name) {
                    return Err(format!("set {name} in use: Device or resource busy"));
                }
                self.maps.remove(&name);
                Ok(())
            }
            _ => Err(format!("the model does not know {line:?}")),
        }
    }

    fn referenced(&self, name: &str) -> bool {
        self.chains
            .values()
            .flatten()
            .any(|rule| references(rule).contains(&name.to_owned()))
            || self
                .maps
                .values()
                .flat_map(|m| m.values())
                .any(|v| references(v).contains(&name.to_owned()))
    }
}

/// Chains (goto/jump) and sets (@name) a rule or verdict refers to.
fn references(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if matches!(*word, "goto" | "jump") {
            if let Some(target) = words.get(i + 1) {
                out.push(target.trim_end_matches(['}', ',']).to_owned());
            }
        }
        if let Some(set) = word.strip_prefix('@') {
            out.push(set.to_owned());
        }
    }
    out
}

/// `{ key : value }` or `{ key }`.
fn element(text: &str) -> (String, String) {
    let inner = text
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim();
    match inner.split_once(" : ") {
        Some((key, value)) => (key.trim().to_owned(), value.trim().to_owned()),
        None => (inner.to_owned(), String::new()),
    }
}

/// A fake `nft` that keeps a [`Table`].
#[derive(Debug, Default)]
pub(crate) struct ModelNft {
    pub table: Table,
    pub transactions: usize,
}

impl Nft for ModelNft {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        let mut next = self.table.clone();
        for line in script.lines().filter(|l| !l.trim().is_empty()) {
            next.apply(line).map_err(Error::Rejected)?;
        }
        self.table = next;
        self.transactions += 1;
        Ok(())
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        Ok(Existing {
            chains: self.table.chains.keys().cloned().collect(),
            sets: self
                .table
                .maps
                .keys()
                .filter(|m| m.starts_with("aff-") || m.as_str() == "hairpin")
                .cloned()
                .collect(),
        })
    }
}

impl Table {
    /// Chains and maps as sets of lines, for comparisons that do not depend
    /// on the order elements were added in.
    pub(crate) fn summary(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (chain, rules) in &self.chains {
            out.insert(format!("chain {chain}: {}", rules.join(" ; ")));
        }
        for (map, elements) in &self.maps {
            out.insert(format!("map {map}"));
            for (key, value) in elements {
                out.insert(format!("element {map} {key} : {value}"));
            }
        }
        out
    }
}
