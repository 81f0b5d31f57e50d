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

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::{coordination, core, discovery};
use portal_api::{resources, Kind, Resource};
use schemars::generate::SchemaSettings;
use schemars::SchemaGenerator;
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

/// The schema of a kind (its definitions go into `generator`).
fn kind_schema(kind: Kind, generator: &mut SchemaGenerator) -> schemars::Schema {
    match kind {
        Kind::Namespace => generator.subschema_for::<core::v1::Namespace>(),
        Kind::Pod => generator.subschema_for::<core::v1::Pod>(),
        Kind::Service => generator.subschema_for::<core::v1::Service>(),
        Kind::Endpoints => generator.subschema_for::<core::v1::Endpoints>(),
        Kind::ReplicationController => generator.subschema_for::<core::v1::ReplicationController>(),
        Kind::Node => generator.subschema_for::<core::v1::Node>(),
        Kind::Event => generator.subschema_for::<core::v1::Event>(),
        Kind::EndpointSlice => generator.subschema_for::<discovery::v1::EndpointSlice>(),
        Kind::Lease => generator.subschema_for::<coordination::v1::Lease>(),
    }
}

/// Every schema the kinds of one group-version use, the kinds marked with
/// their group-version-kind.
fn schemas(group: &str, version: &str) -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let served: Vec<&Resource> = resources()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    for resource in &served {
        kind_schema(resource.kind, &mut generator);
    }
    let mut definitions = generator.take_definitions(true);
    for resource in &served {
        if let Some(Value::Object(schema)) = definitions.get_mut(&resource.openapi_name()) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "kind": resource.kind_name, "version": version}]),
            );
        }
    }
    definitions
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

/// Every group-version's document and its hash, made once (they depend
/// only on the kinds served).
fn documents() -> &'static BTreeMap<String, (Value, String)> {
    static DOCUMENTS: OnceLock<BTreeMap<String, (Value, String)>> = OnceLock::new();
    DOCUMENTS.get_or_init(|| {
        group_versions()
            .into_iter()
            .map(|(group, version)| {
                let document = build_document(group, version);
                let hash = hash(&document);
                (path_of(group, version), (document, hash))
            })
            .collect()
    })
}

/// The document for one group-version, `None` if it is not served.
pub(crate) fn document(path: &str) -> Option<&'static Value> {
    documents().get(path).map(|(document, _)| document)
}

/// `/openapi/v3`: where each group-version's document lives.
pub(crate) fn index() -> Value {
    let paths: Map<String, Value> = documents()
        .iter()
        .map(|(path, (_, hash))| {
            let url = format!("/openapi/v3/{path}?hash={hash}");
            (path.clone(), json!({"serverRelativeURL": url}))
        })
        .collect();
    json!({"paths": paths})
}

/// The parts of gnostic's `openapi_v2.Document` Portal fills in (field
/// numbers from gnostic's `OpenAPIv2.proto`): `swagger`, `info`, and one
/// path per kind whose `patch` operation names its group-version-kind and
/// takes `dryRun` and `fieldValidation`: how kubectl 1.20 decides that a
/// kind supports `--dry-run=server` (`SupportsDryRun`).
mod v2 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Info {
        #[prost(string, tag = "1")]
        pub title: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Paths {
        #[prost(message, repeated, tag = "2")]
        pub path: Vec<NamedPathItem>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NamedPathItem {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<PathItem>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct PathItem {
        #[prost(message, optional, tag = "8")]
        pub patch: Option<Operation>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Operation {
        #[prost(string, tag = "5")]
        pub operation_id: String,
        #[prost(message, repeated, tag = "8")]
        pub parameters: Vec<ParametersItem>,
        #[prost(message, repeated, tag = "13")]
        pub vendor_extension: Vec<NamedAny>,
    }

    /// `ParametersItem.parameter` → `Parameter.non_body_parameter` →
    /// `NonBodyParameter.query_parameter_sub_schema` (each a one-of).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ParametersItem {
        #[prost(message, optional, tag = "1")]
        pub parameter: Option<Parameter>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Parameter {
        #[prost(message, optional, tag = "2")]
        pub non_body_parameter: Option<NonBodyParameter>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NonBodyParameter {
        #[prost(message, optional, tag = "3")]
        pub query_parameter_sub_schema: Option<QueryParameter>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct QueryParameter {
        #[prost(string, tag = "2")]
        pub r#in: String,
        #[prost(string, tag = "4")]
        pub name: String,
        #[prost(string, tag = "6")]
        pub r#type: String,
        #[prost(bool, tag = "20")]
        pub unique_items: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NamedAny {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Any {
        #[prost(string, tag = "2")]
        pub yaml: String,
    }
}

/// The media type of the protobuf document, as the upstream server labels
/// it (kubectl asks with an `@` form that Go cannot parse back).
pub(crate) const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

fn query_parameter(name: &str) -> v2::ParametersItem {
    v2::ParametersItem {
        parameter: Some(v2::Parameter {
            non_body_parameter: Some(v2::NonBodyParameter {
                query_parameter_sub_schema: Some(v2::QueryParameter {
                    r#in: "query".into(),
                    name: name.into(),
                    r#type: "string".into(),
                    unique_items: true,
                }),
            }),
        }),
    }
}

/// `/openapi/v2` in protobuf: every kind's patch operation, no definitions.
pub(crate) fn v2_document() -> Vec<u8> {
    use prost::Message;
    let path = resources()
        .map(|r| {
            let scope = if r.namespaced {
                "namespaces/{namespace}/"
            } else {
                ""
            };
            let gvk = format!(
                "group: {:?}\nkind: {}\nversion: {}\n",
                r.group, r.kind_name, r.version
            );
            v2::NamedPathItem {
                name: format!(
                    "/{}/{scope}{}/{{name}}",
                    path_of(r.group, r.version),
                    r.plural
                ),
                value: Some(v2::PathItem {
                    patch: Some(v2::Operation {
                        operation_id: format!("patch{}", r.kind_name),
                        parameters: vec![
                            query_parameter("dryRun"),
                            query_parameter("fieldValidation"),
                        ],
                        vendor_extension: vec![v2::NamedAny {
                            name: "x-kubernetes-group-version-kind".into(),
                            value: Some(v2::Any { yaml: gvk }),
                        }],
                    }),
                }),
            }
        })
        .collect();
    v2::Document {
        swagger: "2.0".into(),
        info: Some(v2::Info {
            title: "Kubernetes".into(),
            version: "v1.33.0".into(),
        }),
        paths: Some(v2::Paths { path }),
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

    #[test]
    fn the_v2_document_offers_dry_run_for_every_kind() {
        use prost::Message;
        let doc = v2::Document::decode(v2_document().as_slice()).unwrap();
        let paths = doc.paths.unwrap().path;
        assert_eq!(paths.len(), resources().count());
        let service = paths
            .iter()
            .find(|p| p.name == "/api/v1/namespaces/{namespace}/services/{name}")
            .unwrap();
        let patch = service.value.as_ref().unwrap().patch.as_ref().unwrap();
        let gvk = &patch.vendor_extension[0];
        assert_eq!(gvk.name, "x-kubernetes-group-version-kind");
        assert_eq!(
            gvk.value.as_ref().unwrap().yaml,
            "group: \"\"\nkind: Service\nversion: v1\n"
        );
        let names: Vec<&str> = patch
            .parameters
            .iter()
            .filter_map(|p| {
                let query = p.parameter.as_ref()?.non_body_parameter.as_ref()?;
                Some(query.query_parameter_sub_schema.as_ref()?.name.as_str())
            })
            .collect();
        assert_eq!(names, ["dryRun", "fieldValidation"]);
    }
}
