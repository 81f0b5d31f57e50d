//! Kinds users define: a CustomResourceDefinition becomes one
//! [`Resource`] per served version, whose behaviour ([`Version`], a
//! [`Defined`]) reads the version's structural schema — pruning,
//! defaulting, validation with CEL rules, printer columns, list types, the
//! scale subresource — as kube-apiserver's apiextensions server does. The
//! values are leaked to `&'static` (ADR 0015): a few kilobytes per CRD
//! generation, as upstream keeps a handler per generation.

pub mod columns;
pub mod rules;
pub mod shaping;
pub mod structural;
pub mod validation;

use std::collections::HashSet;
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde_json::Value;

use crate::schema::{
    typed, Column, DecodeError, Decoded, Defined, Generation, ListStrategy, NameRule, Resource,
    ScalePaths, Subresource,
};
use crate::status::Cause;
use columns::PrinterColumn;
use structural::{ListType, Structural};

/// The behaviour of one served version of a CRD.
#[derive(Debug)]
pub struct Version {
    schema: Structural,
    rules: rules::Compiled,
    columns: Vec<PrinterColumn>,
    scale: Option<ScalePaths>,
    storage_version: &'static str,
    /// `spec.conversion.webhook` when the strategy is `Webhook`.
    webhook: Option<Value>,
}

impl Defined for Version {
    fn decode(&self, mut object: Value) -> Result<Decoded, DecodeError> {
        if !object.is_object() {
            return Err(DecodeError::Malformed(
                "the body must be a JSON object".into(),
            ));
        }
        let mut unknown_fields = Vec::new();
        // Metadata is every kind's: read through ObjectMeta.
        if let Some(metadata) = object.get_mut("metadata") {
            let decoded = typed::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(
                metadata.take(),
            )?;
            unknown_fields.extend(
                decoded
                    .unknown_fields
                    .into_iter()
                    .map(|f| format!("metadata.{f}")),
            );
            *metadata = decoded.object;
        }
        shaping::prune(&mut object, &self.schema, "", &mut unknown_fields);
        Ok(Decoded {
            object,
            unknown_fields,
        })
    }

    fn defaults(&self, object: &mut Value) {
        shaping::apply_defaults(object, &self.schema);
    }

    fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut causes = Vec::new();
        validation::validate(object, &self.schema, "", &mut causes);
        // Rules see only values of the right shape (upstream skips them
        // when the schema's own checks fail).
        if causes.is_empty() {
            self.rules.check(object, old, &mut causes);
        }
        causes
    }

    fn columns(&self) -> Vec<Column> {
        columns::definitions(&self.columns)
    }

    fn cells(&self, object: &Value, now: i64) -> Vec<Value> {
        columns::cells(&self.columns, object, now)
    }

    fn openapi_schema(&self) -> Value {
        self.schema.source.clone()
    }

    fn list_strategy(&self, path: &[&str]) -> ListStrategy {
        match self.schema.at(path).and_then(|n| n.list_type.as_ref()) {
            Some(ListType::Set) => ListStrategy::MergePrimitives,
            Some(ListType::Map([key])) => ListStrategy::MergeKey(key),
            _ => ListStrategy::Replace,
        }
    }

    fn list_map_keys(&self, path: &[&str]) -> Option<&'static [&'static str]> {
        match self.schema.at(path)?.list_type.as_ref()? {
            ListType::Map(keys) => Some(keys),
            _ => None,
        }
    }

    fn scale(&self) -> Option<&ScalePaths> {
        self.scale.as_ref()
    }

    fn conversion_webhook(&self) -> Option<&Value> {
        self.webhook.as_ref()
    }

    fn storage_version(&self) -> &'static str {
        self.storage_version
    }
}

/// `object` as `resource` serves it: a kind users define is converted
/// between its versions (`None` conversion: only `apiVersion` changes).
/// `true` if it changed.
pub fn to_version(resource: &Resource, object: &mut Value) -> bool {
    match resource.custom {
        Some(custom) => custom.to_version(resource, object),
        None => false,
    }
}

/// `object` as it is stored: a kind users define at its storage version.
pub fn to_storage(resource: &Resource, object: &mut Value) {
    if let Some(custom) = resource.custom {
        custom.to_storage(resource, object);
    }
}

/// Strings and lists of names of defined kinds live as long as the
/// process: each distinct one is kept once, however often definitions are
/// written or rebuilt.
#[derive(Default)]
struct Interned {
    strings: HashSet<&'static str>,
    lists: HashSet<&'static [&'static str]>,
}

fn interned() -> &'static Mutex<Interned> {
    static INTERNED: OnceLock<Mutex<Interned>> = OnceLock::new();
    INTERNED.get_or_init(Default::default)
}

pub(crate) fn leak(text: &str) -> &'static str {
    let mut interned = interned().lock();
    if let Some(kept) = interned.strings.get(text) {
        return kept;
    }
    let kept: &'static str = Box::leak(text.to_owned().into_boxed_str());
    interned.strings.insert(kept);
    kept
}

pub(crate) fn leak_list(list: Vec<&'static str>) -> &'static [&'static str] {
    let mut interned = interned().lock();
    if let Some(kept) = interned.lists.get(list.as_slice()) {
        return kept;
    }
    let kept: &'static [&'static str] = Box::leak(list.into_boxed_slice());
    interned.lists.insert(kept);
    kept
}

fn leak_all(values: Option<&Value>) -> &'static [&'static str] {
    leak_list(
        values
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(leak)
            .collect(),
    )
}

const SCALE: Subresource = Subresource {
    name: "scale",
    kind: "Scale",
    verbs: &["get", "patch", "update"],
    group_version: Some(("autoscaling", "v1")),
};

/// Why a definition's versions cannot be served (schemas that are not
/// structural, rules that do not compile, printer columns that do not
/// read), if they cannot; nothing is kept.
pub fn check(crd: &Value) -> Result<(), String> {
    build(crd).map(drop)
}

/// The resources a CRD serves (one per served version, storage version
/// first), or why it cannot be served. `crd` is a stored, valid
/// CustomResourceDefinition. What they hold lives as long as the process.
pub fn resources(crd: &Value) -> Result<Vec<&'static Resource>, String> {
    let built = build(crd)?;
    let mut served = Vec::new();
    for Built {
        mut resource,
        version,
    } in built
    {
        let behaviour: &'static Version = Box::leak(Box::new(version));
        resource.custom = Some(behaviour);
        let resource: &'static Resource = Box::leak(Box::new(resource));
        if resource.version == behaviour.storage_version {
            served.insert(0, resource);
        } else {
            served.push(resource);
        }
    }
    Ok(served)
}

/// A served version before it is kept: its resource (without behaviour)
/// and its behaviour.
struct Built {
    resource: Resource,
    version: Version,
}

fn build(crd: &Value) -> Result<Vec<Built>, String> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let group = leak(&text(&spec["group"]));
    let plural = leak(&text(&names["plural"]));
    let kind = leak(&text(&names["kind"]));
    let singular = match text(&names["singular"]) {
        s if s.is_empty() => leak(&kind.to_lowercase()),
        s => leak(&s),
    };
    let short_names = leak_all(names.get("shortNames"));
    let categories = leak_all(names.get("categories"));
    let namespaced = spec["scope"] != "Cluster";
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage = versions
        .iter()
        .find(|v| v["storage"] == true)
        .map(|v| leak(&text(&v["name"])))
        .ok_or("no storage version")?;
    let mut served = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        if version["served"] != true {
            continue;
        }
        let name = leak(&text(&version["name"]));
        let at = format!("spec.versions[{i}].schema.openAPIV3Schema");
        let schema_source = version["schema"]["openAPIV3Schema"].clone();
        let schema = Structural::parse(&schema_source, &at).map_err(|causes| {
            causes
                .iter()
                .map(Cause::display)
                .collect::<Vec<_>>()
                .join(", ")
        })?;
        let rules = rules::Compiled::new(&schema)?;
        let subresources = &version["subresources"];
        let scale = subresources.get("scale").map(|scale| ScalePaths {
            spec_replicas: text(&scale["specReplicasPath"]),
            status_replicas: text(&scale["statusReplicasPath"]),
            label_selector: scale
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
        let columns = columns::parse(version.get("additionalPrinterColumns"))?;
        let selectable: Vec<&'static str> = version["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["jsonPath"].as_str())
            .map(|path| leak(path.trim_start_matches('.')))
            .collect();
        let version = Version {
            schema,
            rules,
            columns,
            storage_version: storage,
            scale: scale.clone(),
            webhook: (spec["conversion"]["strategy"] == "Webhook")
                .then(|| spec["conversion"]["webhook"].clone()),
        };
        let resource = Resource {
            group,
            version: name,
            plural,
            singular,
            kind_name: kind,
            namespaced,
            short_names,
            categories,
            has_status: subresources.get("status").is_some(),
            name_rule: NameRule::Subdomain,
            decode: unused_decode,
            openapi_schema: unused_schema,
            defaults: |_| {},
            validate: |_, _| Vec::new(),
            prepare_create: |_| {},
            kept_on_update: &[],
            generation: Generation::Content,
            create_on_update: false,
            selectable_fields: leak_list(selectable),
            field_paths: &[],
            field_defaults: &[],
            own_list_strategy: |_| ListStrategy::Replace,
            list_map_keys: &[],
            columns: Vec::new,
            cells: |_, _| Vec::new(),
            subresources: if scale.is_some() { &[SCALE] } else { &[] },
            custom: None,
        };
        served.push(Built { resource, version });
    }
    Ok(served)
}

/// The function hooks of a defined kind are never called: its
/// [`Defined`] behaviour answers instead.
fn unused_decode(object: Value) -> Result<Decoded, DecodeError> {
    Ok(Decoded {
        object,
        unknown_fields: Vec::new(),
    })
}

fn unused_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    generator.subschema_for::<serde_json::Value>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn crd() -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {
                            "size": {"type": "integer", "default": 1, "maximum": 5},
                            "replicas": {"type": "integer"}},
                            "x-kubernetes-validations": [{"rule": "self.size != 4", "message": "four is unlucky"}]},
                        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}}}]}})
    }

    #[test]
    fn a_resource_per_served_version_storage_first() {
        let served = resources(&crd()).unwrap();
        assert_eq!(served.len(), 2);
        let v1 = served[0];
        assert_eq!(
            (v1.group, v1.version, v1.plural),
            ("example.com", "v1", "widgets")
        );
        assert!(v1.has_status && v1.namespaced);
        assert_eq!(v1.short_names, ["wd"]);
        assert_eq!(v1.subresources.len(), 1);
        let behaviour = v1.custom.unwrap();
        assert_eq!(behaviour.storage_version(), "v1");
        let decoded = v1
            .decode_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "a", "bogus": 1}, "spec": {"extra": true}}))
            .unwrap();
        assert_eq!(decoded.unknown_fields, ["metadata.bogus", "spec.extra"]);
        let mut object = decoded.object;
        v1.apply_defaults(&mut object);
        assert_eq!(object["spec"]["size"], 1);
        assert!(v1.validate_object(&object, None).is_empty());
        object["spec"]["size"] = json!(4);
        let causes: Vec<_> = v1
            .validate_object(&object, None)
            .iter()
            .map(Cause::display)
            .collect();
        assert_eq!(causes, ["spec: Invalid value: \"object\": four is unlucky"]);
        assert_eq!(v1.table_columns()[1].name, "Size");
        assert_eq!(v1.table_cells(&object, 0)[1], json!(4));
        // The other version keeps what its schema preserves.
        let beta = served[1];
        let decoded = beta
            .decode_value(json!({"metadata": {"name": "b"}, "anything": {"goes": 1}}))
            .unwrap();
        assert_eq!(decoded.object["anything"]["goes"], 1);
    }
}
