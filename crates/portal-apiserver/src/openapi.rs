//! The minimal OpenAPI v3 documents kubectl needs to leave validation to
//! the server: per group-version, one path per kind with a `patch`
//! operation that names its group-version-kind and accepts
//! `fieldValidation` (KUBECTL-WIRE.md, "OpenAPI and validation").
//!
//! Older kubectl (1.20) reads only `/openapi/v2`, as a gnostic protobuf
//! `Document`, and skips client-side validation of kinds the document does
//! not define: [`v2_document`] is that document, with no definitions.

use portal_api::resources;
use serde_json::{json, Map, Value};

/// `api/v1`, `apis/discovery.k8s.io/v1`, …
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in resources() {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn path_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The document for one group-version, `None` if it is not served.
pub(crate) fn document(path: &str) -> Option<Value> {
    let (group, version) = group_versions()
        .into_iter()
        .find(|(g, v)| path_of(g, v) == path)?;
    let mut paths = Map::new();
    for r in resources().filter(|r| r.group == group && r.version == version) {
        let scope = if r.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let operation = json!({
            "operationId": format!("patch{}", r.kind_name),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind_name},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(
            format!("/{}/{scope}{}/{{name}}", path_of(group, version), r.plural),
            json!({"patch": operation}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
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

/// `/openapi/v3`: where each group-version's document lives.
pub(crate) fn index() -> Value {
    let mut paths = Map::new();
    for (group, version) in group_versions() {
        let path = path_of(group, version);
        let document = document(&path).unwrap_or_default();
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", hash(&document))}),
        );
    }
    json!({"paths": paths})
}

/// The fields of gnostic's `openapi_v2.Document` that a minimal document
/// needs (`swagger`, `info`, `paths`).
#[derive(Clone, PartialEq, prost::Message)]
struct V2Document {
    #[prost(string, tag = "1")]
    swagger: String,
    #[prost(message, optional, tag = "2")]
    info: Option<V2Info>,
    #[prost(message, optional, tag = "8")]
    paths: Option<V2Paths>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct V2Info {
    #[prost(string, tag = "1")]
    title: String,
    #[prost(string, tag = "2")]
    version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct V2Paths {}

/// The media type of the protobuf document, as the upstream server labels
/// it (kubectl asks with an `@` form that Go cannot parse back).
pub(crate) const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2` in protobuf: valid, and empty of definitions.
pub(crate) fn v2_document() -> Vec<u8> {
    use prost::Message;
    V2Document {
        swagger: "2.0".into(),
        info: Some(V2Info {
            title: "Kubernetes".into(),
            version: "v1.33.0".into(),
        }),
        paths: Some(V2Paths {}),
    }
    .encode_to_vec()
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
        assert!(document("apis/apps/v1").is_none());
    }
}
