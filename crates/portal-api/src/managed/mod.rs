//! `metadata.managedFields` and server-side apply, as Kubernetes'
//! structured-merge-diff does them.
//!
//! Every write records who owns which fields. An ordinary write (create,
//! update, patch: operation `Update`) takes the fields it added or changed,
//! from whoever had them. An apply (operation `Apply`) declares the fields
//! its manager wants to own: they are merged into the object, the fields it
//! owned before and no longer names are removed unless someone else owns
//! them too, and changing a value another manager owns is a conflict (409)
//! unless the apply is forced, which moves ownership to the applier.

pub mod fieldpath;
mod schema;

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use crate::meta;
use crate::schema::Resource;
use crate::status::{Cause, Details, Status};
use fieldpath::{Element, Path, Set};
pub use schema::{list_type, ListType};

/// Update entries kept before the oldest are merged (Kubernetes' limit).
const MAX_UPDATE_ENTRIES: usize = 10;
/// Longest `fieldManager` (Kubernetes' limit).
pub const MAX_MANAGER_LENGTH: usize = 128;

/// Who writes, through which version and subresource, at what time.
#[derive(Clone, Copy, Debug)]
pub struct Writer<'a> {
    pub manager: &'a str,
    /// `v1`, `discovery.k8s.io/v1`, … (what the entry records).
    pub api_version: &'a str,
    /// `Some("status")` for a write to the status subresource.
    pub subresource: Option<&'a str>,
    /// Whether the kind has a status subresource (then writes to the object
    /// itself own nothing under `.status`).
    pub has_status: bool,
    /// RFC 3339, seconds.
    pub now: &'a str,
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    manager: String,
    operation: Operation,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    set: Set,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Apply,
    Update,
}

impl Entry {
    fn is(&self, writer: &Writer<'_>, operation: Operation) -> bool {
        self.manager == writer.manager
            && self.operation == operation
            && self.subresource.as_deref() == writer.subresource
    }

    /// How a conflict names this manager: `"kubectl-client-side-apply"
    /// using v1` (Kubernetes' `printManager`).
    fn describe(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            out.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == Operation::Update {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }

    fn to_json(&self) -> Value {
        let mut entry = Map::new();
        entry.insert("manager".into(), json!(self.manager));
        let operation = match self.operation {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        };
        entry.insert("operation".into(), json!(operation));
        entry.insert("apiVersion".into(), json!(self.api_version));
        if let Some(time) = &self.time {
            entry.insert("time".into(), json!(time));
        }
        entry.insert("fieldsType".into(), json!("FieldsV1"));
        entry.insert("fieldsV1".into(), fieldpath::to_fields_v1(&self.set));
        if let Some(sub) = &self.subresource {
            entry.insert("subresource".into(), json!(sub));
        }
        Value::Object(entry)
    }

    fn from_json(value: &Value) -> Result<Entry, String> {
        let text = |field: &str| value.get(field).and_then(Value::as_str).map(str::to_owned);
        let operation = match text("operation").as_deref() {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            other => return Err(format!("operation: Unsupported value: {other:?}")),
        };
        if let Some(kind) = text("fieldsType").filter(|t| t != "FieldsV1") {
            return Err(format!("fieldsType: Unsupported value: {kind:?}"));
        }
        let set = match value.get("fieldsV1") {
            None | Some(Value::Null) => Set::new(),
            Some(fields) => fieldpath::from_fields_v1(fields)
                .ok_or_else(|| "fieldsV1: Invalid value: not a field set".to_owned())?,
        };
        Ok(Entry {
            manager: text("manager").unwrap_or_default(),
            operation,
            api_version: text("apiVersion").unwrap_or_default(),
            time: text("time"),
            subresource: text("subresource").filter(|s| !s.is_empty()),
            set,
        })
    }
}

fn decode(object: &Value) -> Result<Vec<Entry>, String> {
    match meta::metadata(object).get("managedFields") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Entry::from_json(e).map_err(|why| format!("metadata.managedFields[{i}].{why}"))
            })
            .collect(),
        Some(_) => Err("metadata.managedFields: Invalid value: must be a list".into()),
    }
}

/// Stores the entries in Kubernetes' order (applies first, then by time,
/// manager, apiVersion, subresource), so the same entries always read the
/// same and a write that changes nothing else is recognised as a no-op.
fn store(object: &mut Value, entries: &[Entry]) {
    let mut entries: Vec<&Entry> = entries.iter().collect();
    entries.sort_by(|a, b| {
        let order = |e: &Entry| {
            (
                e.operation == Operation::Update,
                e.time.clone(),
                e.manager.clone(),
                e.api_version.clone(),
                e.subresource.clone(),
            )
        };
        order(a).cmp(&order(b))
    });
    let metadata = meta::metadata_mut(object);
    if entries.is_empty() {
        metadata.remove("managedFields");
    } else {
        let list = entries.iter().map(|e| e.to_json()).collect();
        metadata.insert("managedFields".into(), Value::Array(list));
    }
}

/// The part of an object a writer's fields live in: `.status` for the
/// status subresource, everything else for the object itself.
fn in_part(path: &[Element], writer: &Writer<'_>) -> bool {
    let under_status = matches!(path.first(), Some(Element::Field(f)) if f == "status");
    match writer.subresource {
        Some("status") => under_status,
        // A Namespace's `finalize` subresource: its finalizers alone.
        Some("finalize") => matches!(
            path,
            [Element::Field(spec), Element::Field(finalizers), ..]
                if spec == "spec" && finalizers == "finalizers"
        ),
        // The scale subresource: the replica count, as the object holds it.
        Some("scale") => !(writer.has_status && under_status),
        Some(_) => false,
        None => !(writer.has_status && under_status),
    }
}

fn members_in_part<'a>(
    resource: &Resource,
    object: &'a Value,
    writer: &Writer<'_>,
) -> fieldpath::Members<'a> {
    let mut members = fieldpath::members(resource, object);
    members.retain(|path, _| in_part(path, writer));
    members
}

/// Where a write starts from: the stored entries, unless the request set
/// others. Kubernetes' rules: leaving `managedFields` out (or empty, or as
/// it was) keeps them; `[{}]` clears them; anything else replaces them.
/// `Ok(None)`: cleared (the write is then not recorded either).
fn base_entries(old: &Value, new: &Value) -> Result<Option<Vec<Entry>>, String> {
    let old_entries = decode(old).unwrap_or_default();
    let given = meta::metadata(new).get("managedFields");
    match given {
        None | Some(Value::Null) => Ok(Some(old_entries)),
        Some(Value::Array(list)) if list.is_empty() => Ok(Some(old_entries)),
        Some(given) if Some(given) == meta::metadata(old).get("managedFields") => {
            Ok(Some(old_entries))
        }
        Some(Value::Array(list)) if list.iter().all(|e| e == &json!({})) => Ok(None),
        Some(_) => decode(new).map(Some),
    }
}

/// Records an ordinary write (create: `old` is `{}`) on `new`: its manager
/// takes what it added or changed, what it removed is nobody's. A bad
/// `managedFields` in the request is the error.
pub fn track_update(
    resource: &Resource,
    old: &Value,
    new: &mut Value,
    writer: &Writer<'_>,
) -> Result<(), String> {
    let Some(mut entries) = base_entries(old, new)? else {
        store(new, &[]);
        return Ok(());
    };
    let before = members_in_part(resource, old, writer);
    let after = members_in_part(resource, new, writer);
    let mut taken = Set::new();
    for (path, value) in &after {
        match before.get(path) {
            Some(old_value) if old_value == value => {}
            _ => drop(taken.insert(path.clone())),
        }
    }
    let removed: Set = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .cloned()
        .collect();
    for entry in &mut entries {
        entry.set.retain(|p| !removed.contains(p));
        if !entry.is(writer, Operation::Update) {
            entry.set.retain(|p| !taken.contains(p));
        }
    }
    if !taken.is_empty() {
        let own = match entries.iter().position(|e| e.is(writer, Operation::Update)) {
            Some(i) => &mut entries[i],
            None => {
                entries.push(Entry {
                    manager: writer.manager.to_owned(),
                    operation: Operation::Update,
                    api_version: String::new(),
                    time: None,
                    subresource: writer.subresource.map(str::to_owned),
                    set: Set::new(),
                });
                entries.last_mut().expect("just pushed")
            }
        };
        own.set.extend(taken);
        own.api_version = writer.api_version.to_owned();
        own.time = Some(writer.now.to_owned());
    }
    finish(new, entries);
    Ok(())
}

/// Drops empty entries, merges the oldest updates beyond the limit, stores.
fn finish(object: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    let updates = entries
        .iter()
        .filter(|e| e.operation == Operation::Update)
        .count();
    if updates > MAX_UPDATE_ENTRIES {
        // Oldest first (times are RFC 3339 in UTC: they sort as text).
        let mut order: Vec<usize> = (0..entries.len())
            .filter(|i| entries[*i].operation == Operation::Update)
            .collect();
        order.sort_by(|a, b| entries[*a].time.cmp(&entries[*b].time));
        let merge: Vec<usize> = order[..=updates - MAX_UPDATE_ENTRIES].to_vec();
        let mut ancient = Entry {
            manager: "ancient-changes".into(),
            operation: Operation::Update,
            api_version: entries[merge[0]].api_version.clone(),
            time: entries[*merge.last().expect("not empty")].time.clone(),
            subresource: None,
            set: Set::new(),
        };
        for i in &merge {
            ancient.set.extend(entries[*i].set.iter().cloned());
        }
        let mut index = 0;
        entries.retain(|_| {
            index += 1;
            !merge.contains(&(index - 1))
        });
        entries.push(ancient);
    }
    store(object, &entries);
}

/// A field an apply would change that another manager owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// `"kubectl-client-side-apply" using v1`.
    pub manager: String,
    /// `.spec.replicas`.
    pub field: String,
}

/// Why an apply was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// Changes to fields other managers own (409).
    Conflicts(Vec<Conflict>),
    /// The configuration is not an object of this kind (400).
    Invalid(String),
}

/// Kubernetes' message for conflicts: `Apply failed with 1 conflict:
/// conflict with "m" using v1: .spec.replicas`.
/// The 409 a conflicting apply answers: one `FieldManagerConflict` cause
/// per field, Kubernetes' message.
pub fn conflict_status(conflicts: &[Conflict]) -> Status {
    let mut status = Status::new(409, "Conflict", conflict_message(conflicts));
    status.details = Some(Box::new(Details {
        causes: conflicts
            .iter()
            .map(|c| Cause {
                reason: "FieldManagerConflict".into(),
                message: format!("conflict with {}", c.manager),
                field: c.field.clone(),
            })
            .collect(),
        ..Details::default()
    }));
    status
}

pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            only.manager, only.field
        );
    }
    let mut managers: Vec<&str> = conflicts.iter().map(|c| c.manager.as_str()).collect();
    managers.sort_unstable();
    managers.dedup();
    let mut lines = Vec::new();
    for manager in managers {
        lines.push(format!("conflicts with {manager}:"));
        for conflict in conflicts.iter().filter(|c| c.manager == manager) {
            lines.push(format!("- {}", conflict.field));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Server-side apply of `config` (the applier's whole intent) to `live`
/// (`{}` when the object does not exist yet): the new object, with its
/// `managedFields`.
pub fn apply(
    resource: &Resource,
    live: &Value,
    config: &Value,
    writer: &Writer<'_>,
    force: bool,
) -> Result<Value, ApplyError> {
    if !config.is_object() {
        return Err(ApplyError::Invalid(
            "the configuration must be an object".into(),
        ));
    }
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into(),
        ));
    }
    missing_keys(resource, &mut Vec::new(), config).map_err(ApplyError::Invalid)?;
    // What the applier may own: its part of the object.
    let mut intent = config.clone();
    if let Some(object) = intent.as_object_mut() {
        match writer.subresource {
            Some(_) => object.retain(|k, _| {
                k == "status" || k == "metadata" || k == "apiVersion" || k == "kind"
            }),
            None if writer.has_status => drop(object.remove("status")),
            None => {}
        }
    }
    let intended: Set = members_in_part(resource, &intent, writer)
        .into_keys()
        .collect();
    let mut entries = decode(live).unwrap_or_default();
    // The applier's own entry as it was (its fields; kept if nothing changes).
    let own_before = entries
        .iter()
        .find(|e| e.is(writer, Operation::Apply))
        .cloned();
    let mut merged = merge(resource, &mut Vec::new(), Some(live), &intent);

    // Conflicts: values the apply changes that others own.
    let before = members_in_part(resource, live, writer);
    let after = members_in_part(resource, &merged, writer);
    let changed: Set = intended
        .iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .cloned()
        .collect();
    let conflicting: Vec<(String, &Path)> = entries
        .iter()
        .filter(|e| !e.is(writer, Operation::Apply))
        .flat_map(|e| e.set.intersection(&changed).map(move |p| (e.describe(), p)))
        .collect();
    // Moving from client-side apply: `kubectl` may take over what its
    // last-applied configuration still says (Kubernetes' lastAppliedManager).
    let force = force
        || (!conflicting.is_empty() && {
            let allowed = client_side_applied(resource, live, writer);
            conflicting.iter().all(|(_, path)| allowed.contains(*path))
        });
    if !force && !conflicting.is_empty() {
        let conflicts = conflicting
            .into_iter()
            .map(|(manager, path)| Conflict {
                manager,
                field: fieldpath::Display(path).to_string(),
            })
            .collect();
        return Err(ApplyError::Conflicts(conflicts));
    }
    if force {
        for entry in entries
            .iter_mut()
            .filter(|e| !e.is(writer, Operation::Apply))
        {
            entry.set.retain(|p| !changed.contains(p));
        }
    }

    // Fields the applier owned and no longer names go, unless another
    // manager owns them or something below them.
    let previous = own_before
        .as_ref()
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let others: Set = entries
        .iter()
        .filter(|e| !e.is(writer, Operation::Apply))
        .flat_map(|e| e.set.iter().cloned())
        .collect();
    // (An empty object the applier had, now filled in, stays: the new
    // configuration owns what is below it.)
    let owned_at_or_below = |set: &Set, p: &Path| {
        set.range(p.clone()..)
            .next()
            .is_some_and(|o| fieldpath::is_under(o, p))
    };
    let mut dropped: Vec<&Path> = previous
        .iter()
        .filter(|p| !owned_at_or_below(&intended, p) && !owned_at_or_below(&others, p))
        .collect();
    // Deepest first, so a list item is found before its list changes.
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in dropped {
        remove(resource, &mut merged, path);
    }

    entries.retain(|e| !e.is(writer, Operation::Apply));
    let api_version = config
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(writer.api_version);
    let own = Entry {
        manager: writer.manager.to_owned(),
        operation: Operation::Apply,
        api_version: api_version.to_owned(),
        time: Some(writer.now.to_owned()),
        subresource: writer.subresource.map(str::to_owned),
        set: intended,
    };
    // An apply that changes nothing keeps its entry's time.
    let without_entries = |object: &Value| {
        let mut object = object.clone();
        meta::metadata_mut(&mut object).remove("managedFields");
        object
    };
    let same_object = without_entries(&merged) == without_entries(live);
    let unchanged =
        own_before.filter(|e| same_object && e.set == own.set && e.api_version == own.api_version);
    entries.push(unchanged.unwrap_or(own));
    finish(&mut merged, entries);
    keep_last_applied(&mut merged, live, config, writer);
    Ok(merged)
}

/// For the `kubectl` manager: the fields kubectl's client-side apply last
/// set (its annotation) that still hold those values.
fn client_side_applied(resource: &Resource, live: &Value, writer: &Writer<'_>) -> Set {
    let remembered = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str::<Value>(text).ok());
    let Some(remembered) = remembered.filter(|_| writer.manager == "kubectl") else {
        return Set::new();
    };
    let live_members = fieldpath::members(resource, live);
    fieldpath::members(resource, &remembered)
        .into_iter()
        .filter(|(path, value)| live_members.get(path) == Some(value))
        .map(|(path, _)| path)
        .collect()
}

/// kubectl's client-side apply remembers its last configuration in an
/// annotation. Once an object moves to `kubectl apply --server-side`,
/// Kubernetes keeps that annotation up to date for the `kubectl` manager,
/// so going back to client-side apply sees the latest configuration.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn keep_last_applied(merged: &mut Value, live: &Value, config: &Value, writer: &Writer<'_>) {
    let had = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
        .is_some();
    if writer.manager != "kubectl" || writer.subresource.is_some() || !had {
        return;
    }
    let mut remembered = config.clone();
    if let Some(annotations) = remembered
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta::metadata_mut(&mut remembered).remove("annotations");
        }
    }
    let Ok(text) = serde_json::to_string(&remembered) else {
        return;
    };
    let metadata = meta::metadata_mut(merged);
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(annotations) = annotations.as_object_mut() {
        annotations.insert(LAST_APPLIED.into(), Value::String(text));
    }
}

/// Refuses a keyed list item that lacks one of its keys (with no default),
/// as Kubernetes does: it could never be told apart from the others.
fn missing_keys(resource: &Resource, path: &mut Vec<String>, value: &Value) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            for (name, child) in map {
                path.push(name.clone());
                missing_keys(resource, path, child)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            let names: Vec<&str> = path.iter().map(String::as_str).collect();
            let keyed = match schema::list_type(resource, &names) {
                ListType::Map(keys) => Some(keys),
                _ => None,
            };
            for (i, item) in items.iter().enumerate() {
                if let Some(keys) = keyed {
                    if let Some(key) = keys.iter().find(|k| {
                        item.get(**k).is_none_or(Value::is_null) && schema::key_default(k).is_none()
                    }) {
                        return Err(format!(
                            ".{}: element {i}: associative list with keys has an element that omits key field {key:?} (and doesn't have default value)",
                            path.join(".")
                        ));
                    }
                }
                missing_keys(resource, path, item)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `config` merged into `live`: fields set, keyed items merged by key, set
/// items added, everything else replaced.
fn merge(
    resource: &Resource,
    path: &mut Vec<String>,
    live: Option<&Value>,
    config: &Value,
) -> Value {
    match (live, config) {
        (Some(Value::Object(live)), Value::Object(config)) => {
            let mut out = live.clone();
            for (name, value) in config {
                if name == "managedFields" && path.len() == 1 && path[0] == "metadata" {
                    continue;
                }
                if value.is_null() {
                    out.remove(name);
                    continue;
                }
                path.push(name.clone());
                let merged = merge(resource, path, live.get(name), value);
                path.pop();
                out.insert(name.clone(), merged);
            }
            Value::Object(out)
        }
        (Some(Value::Array(live)), Value::Array(config)) => {
            let names: Vec<&str> = path.iter().map(String::as_str).collect();
            match schema::list_type(resource, &names) {
                ListType::Atomic => Value::Array(config.clone()),
                ListType::Set => {
                    let mut out = live.clone();
                    let mut seen: HashSet<String> = live.iter().map(Value::to_string).collect();
                    for item in config {
                        if seen.insert(item.to_string()) {
                            out.push(item.clone());
                        }
                    }
                    Value::Array(out)
                }
                ListType::Map(keys) => {
                    let mut out = live.clone();
                    // Items by key, so a long list merges in linear time.
                    let mut positions: HashMap<String, usize> = HashMap::new();
                    for (i, item) in out.iter().enumerate() {
                        if let Some(key) = fieldpath::item_key(item, keys) {
                            positions.entry(key).or_insert(i);
                        }
                    }
                    for item in config {
                        let key = fieldpath::item_key(item, keys).unwrap_or_default();
                        match positions.get(&key) {
                            Some(&i) => out[i] = merge(resource, path, Some(&out[i]), item),
                            None => {
                                positions.insert(key, out.len());
                                out.push(item.clone());
                            }
                        }
                    }
                    Value::Array(out)
                }
            }
        }
        (_, Value::Object(config)) => {
            // Nothing there yet: the configuration, without nulls.
            let mut out = config.clone();
            out.retain(|_, v| !v.is_null());
            Value::Object(out)
        }
        _ => config.clone(),
    }
}

/// Removes what `path` names from `object` (nothing if it is not there).
fn remove(resource: &Resource, object: &mut Value, path: &[Element]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    let mut names: Vec<&str> = Vec::new();
    for element in parents {
        let next = match element {
            Element::Field(name) => {
                names.push(name);
                node.get_mut(name.as_str())
            }
            Element::Key(key) => find_keyed(resource, &names, node, key),
            Element::Value(json) => {
                let wanted: Option<Value> = serde_json::from_str(json).ok();
                node.as_array_mut()
                    .and_then(|items| items.iter_mut().find(|i| Some(&**i) == wanted.as_ref()))
            }
            Element::Index(i) => node.get_mut(*i),
        };
        match next {
            Some(next) => node = next,
            None => return,
        }
    }
    match last {
        Element::Field(name) => drop(node.as_object_mut().map(|o| o.remove(name))),
        Element::Key(key) => {
            let ListType::Map(keys) = schema::list_type(resource, &names) else {
                return;
            };
            if let Some(items) = node.as_array_mut() {
                items.retain(|i| fieldpath::item_key(i, keys).as_deref() != Some(key));
            }
        }
        Element::Value(json) => {
            let wanted: Option<Value> = serde_json::from_str(json).ok();
            if let Some(items) = node.as_array_mut() {
                items.retain(|i| Some(i) != wanted.as_ref());
            }
        }
        Element::Index(i) => {
            if let Some(items) = node.as_array_mut().filter(|items| *i < items.len()) {
                items.remove(*i);
            }
        }
    }
}

fn find_keyed<'a>(
    resource: &Resource,
    names: &[&str],
    node: &'a mut Value,
    key: &str,
) -> Option<&'a mut Value> {
    let ListType::Map(keys) = schema::list_type(resource, names) else {
        return None;
    };
    node.as_array_mut()?
        .iter_mut()
        .find(|i| fieldpath::item_key(i, keys).as_deref() == Some(key))
}

#[cfg(test)]
mod tests;
