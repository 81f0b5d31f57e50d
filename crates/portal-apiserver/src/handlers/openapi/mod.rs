//! The OpenAPI v3 documents: per group-version, one path per kind with a
//! `patch` operation that names its group-version-kind and accepts
//! `fieldValidation` and `dryRun` (what kubectl looks for before leaving
//! validation to the server), and the kinds' real schemas, with Kubernetes'
//! descriptions (from `k8s-openapi`), each kind marked with
//! `x-kubernetes-group-version-kind` so `kubectl explain` finds it.
//!
//! Older kubectl (1.20) reads only `/openapi/v2`, as a gnostic protobuf
//! `Document`: it skips client-side validation of kinds the document does
//! not define, and allows `--dry-run=server` for kinds whose patch
//! operation takes `dryRun`. [`v2_document`] is that document: the patch
//! operations, no definitions.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use portal_api::patch::ListStrategy;
use portal_api::{resources, Resource};
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

mod v2;
pub(crate) use v2::{document as v2_document, V2_PROTOBUF};

/// The group-versions of `served`, in order: `api/v1`,
/// `apis/discovery.k8s.io/v1`, …
fn group_versions<'a>(
    served: impl Iterator<Item = &'a Resource>,
) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in served {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The group-versions of kinds users define, served now.
fn defined_group_versions() -> Vec<(&'static str, &'static str)> {
    group_versions(resources().filter(|r| r.custom.is_some_and(|c| c.user_defined())))
}

fn path_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every schema the kinds of one group-version use, the kinds marked with
/// their group-version-kind.
fn schemas(group: &str, version: &str) -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let served: Vec<&Resource> = resources()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    let mut defined = Vec::new();
    for resource in &served {
        match resource.custom.filter(|c| c.user_defined()) {
            Some(custom) => defined.push((
                resource.openapi_name(),
                custom_schema(resource, custom.openapi_schema(), &mut generator),
            )),
            None => drop((resource.openapi_schema)(&mut generator)),
        }
    }
    let mut definitions = generator.take_definitions(true);
    definitions.extend(defined);
    for resource in &served {
        if let Some(Value::Object(schema)) = definitions.get_mut(&resource.openapi_name()) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "kind": resource.kind_name, "version": version}]),
            );
        }
        let mut marks = Vec::new();
        patch_strategies(
            resource,
            &definitions,
            &resource.openapi_name(),
            &mut Vec::new(),
            &mut marks,
        );
        for (definition, property, strategy) in marks {
            let property = definitions
                .get_mut(&definition)
                .and_then(|d| d.pointer_mut(&format!("/properties/{property}")))
                .and_then(Value::as_object_mut);
            if let Some(property) = property {
                match strategy {
                    ListStrategy::MergeKey(key) => {
                        property.insert("x-kubernetes-patch-merge-key".into(), json!(key));
                        property.insert("x-kubernetes-patch-strategy".into(), json!("merge"));
                    }
                    ListStrategy::MergePrimitives => {
                        property.insert("x-kubernetes-patch-strategy".into(), json!("merge"));
                    }
                    ListStrategy::Replace => {}
                }
            }
        }
    }
    definitions
}

/// A custom resource's schema as its definition states it, with the
/// fields every object has (as kube-apiserver publishes CRD schemas).
fn custom_schema(
    resource: &Resource,
    mut schema: Value,
    generator: &mut schemars::SchemaGenerator,
) -> Value {
    let metadata = generator
        .subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>()
        .to_value();
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    if !schema["properties"].is_object() {
        schema["properties"] = json!({});
    }
    let properties = &mut schema["properties"];
    properties["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values."});
    properties["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase."});
    properties["metadata"] =
        json!({"allOf": [metadata], "description": "Standard object's metadata."});
    if schema.get("description").is_none() {
        schema["description"] = json!(format!(
            "{} is a kind defined by a CustomResourceDefinition.",
            resource.kind_name
        ));
    }
    schema
}

/// The name of the definition a property refers to (itself, or its
/// items' for a list; `allOf` is v3's reference with a description).
fn referenced(schema: &Value) -> Option<&str> {
    let schema = schema.get("items").unwrap_or(schema);
    schema
        .get("$ref")
        .or_else(|| schema.pointer("/allOf/0/$ref"))
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
}

/// Where the kind's strategic-merge table (the one PATCH uses) says a list
/// merges, as `(definition, property, strategy)`: kubectl computes its
/// client-side apply patches from these `x-kubernetes-patch-*` marks, as
/// Kubernetes' own schemas carry them.
fn patch_strategies(
    resource: &Resource,
    definitions: &Map<String, Value>,
    name: &str,
    path: &mut Vec<String>,
    marks: &mut Vec<(String, String, ListStrategy)>,
) {
    // The served kinds nest about ten deep; the bound guards the walk.
    if path.len() > 16 {
        return;
    }
    let Some(Value::Object(properties)) = definitions.get(name).and_then(|d| d.get("properties"))
    else {
        return;
    };
    for (property, schema) in properties {
        path.push(property.clone());
        if schema.get("type").and_then(Value::as_str) == Some("array") {
            let names: Vec<&str> = path.iter().map(String::as_str).collect();
            let strategy = resource.list_strategy(&names);
            if strategy != ListStrategy::Replace {
                marks.push((name.to_owned(), property.clone(), strategy));
            }
        }
        if let Some(target) = referenced(schema) {
            patch_strategies(resource, definitions, target, path, marks);
        }
        path.pop();
    }
}

fn build_document(group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    for r in resources().filter(|r| r.group == group && r.version == version) {
        let scope = if r.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let reference = json!({"$ref": format!("#/components/schemas/{}", r.openapi_name())});
        let operation = json!({
            "operationId": format!("patch{}", r.kind_name),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind_name},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}},
        });
        paths.insert(
            format!("/{}/{scope}{}/{{name}}", path_of(group, version), r.plural),
            json!({"patch": operation}),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas(group, version)},
    })
}

/// FNV-1a of the document: changes whenever the document does, so
/// kubectl's cache (keyed by this hash) never serves a stale copy.
fn hash(document: &Value) -> String {
    let bytes = serde_json::to_vec(document).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016X}")
}

/// Every built-in group-version's document and its hash, made once (they
/// depend only on the kinds built in).
fn documents() -> &'static BTreeMap<String, (Value, String)> {
    static DOCUMENTS: OnceLock<BTreeMap<String, (Value, String)>> = OnceLock::new();
    DOCUMENTS.get_or_init(|| {
        group_versions(portal_api::registry::BUILT_IN.iter().copied())
            .into_iter()
            .map(|(group, version)| {
                let document = build_document(group, version);
                let hash = hash(&document);
                (path_of(group, version), (document, hash))
            })
            .collect()
    })
}

/// The document for one group-version, `None` if it is not served. Those
/// of kinds users define are made when asked (they change with their
/// definitions).
pub(crate) fn document(path: &str) -> Option<Cow<'static, Value>> {
    if let Some((document, _)) = documents().get(path) {
        return Some(Cow::Borrowed(document));
    }
    defined_group_versions()
        .into_iter()
        .find(|(group, version)| path_of(group, version) == path)
        .map(|(group, version)| Cow::Owned(build_document(group, version)))
}

/// `/openapi/v3`: where each group-version's document lives.
pub(crate) fn index() -> Value {
    let mut paths: Map<String, Value> = documents()
        .iter()
        .map(|(path, (_, hash))| {
            let url = format!("/openapi/v3/{path}?hash={hash}");
            (path.clone(), json!({"serverRelativeURL": url}))
        })
        .collect();
    for (group, version) in defined_group_versions() {
        let path = path_of(group, version);
        let hash = hash(&build_document(group, version));
        let url = format!("/openapi/v3/{path}?hash={hash}");
        paths.insert(path, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_patch_with_field_validation() {
        let doc = document("api/v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/services/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Service");
        assert_eq!(patch["parameters"][0]["name"], "fieldValidation");
        assert!(doc["paths"]["/api/v1/nodes/{name}"].is_object());
        assert!(
            index()["paths"]["apis/discovery.k8s.io/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .contains("?hash=")
        );
        assert!(document("apis/apps/v1").is_some());
        assert!(
            document("apis/node.k8s.io/v1").is_none(),
            "a group not served"
        );
        // The real schemas, the kinds marked for `kubectl explain`.
        let schemas = &doc["components"]["schemas"];
        let service = &schemas["io.k8s.api.core.v1.Service"];
        assert_eq!(
            service["x-kubernetes-group-version-kind"][0]["kind"],
            "Service"
        );
        assert_eq!(
            // With a description beside it, as Kubernetes writes it.
            service["properties"]["spec"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.ServiceSpec"
        );
        assert!(schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"].is_object());
        assert!(schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"].is_object());
        let lease = document("apis/coordination.k8s.io/v1").unwrap();
        assert!(
            lease["components"]["schemas"]["io.k8s.api.coordination.v1.Lease"]
                ["x-kubernetes-group-version-kind"]
                .is_array()
        );
    }
}
