//! `/openapi/v2` as kubectl 1.20 reads it: gnostic's `openapi_v2.Document`
//! in protobuf (field numbers from gnostic's `OpenAPIv2.proto`), with
//! every kind's patch operation (its group-version-kind, `dryRun`: what
//! 1.20 checks before `--dry-run=server`).

use portal_api::resources;

use serde_json::Value;

use super::{documents, path_of};

/// Every schema of the v3 documents, as v2 definitions.
fn definitions() -> Vec<proto::NamedSchema> {
    let mut all = std::collections::BTreeMap::new();
    for (document, _) in documents().values() {
        if let Some(schemas) = document["components"]["schemas"].as_object() {
            for (name, schema) in schemas {
                all.entry(name.clone()).or_insert_with(|| convert(schema));
            }
        }
    }
    all.into_iter()
        .map(|(name, schema)| proto::NamedSchema {
            name,
            value: Some(schema),
        })
        .collect()
}

fn reference(text: &str) -> String {
    text.replace("#/components/schemas/", "#/definitions/")
}

/// A v3 JSON schema (as `schemars` writes it) in v2's form.
fn convert(value: &Value) -> proto::Schema {
    let mut out = proto::Schema::default();
    let Some(map) = value.as_object() else {
        return out;
    };
    let text = |field: &str| map.get(field).and_then(Value::as_str).map(str::to_owned);
    if let Some(r) = text("$ref") {
        out.r#ref = reference(&r);
    }
    // `allOf: [{$ref}]` beside a description is v3's way to describe a
    // reference; v2 names the reference.
    if let Some(Value::Array(all)) = map.get("allOf") {
        if let [only] = all.as_slice() {
            if let Some(r) = only.get("$ref").and_then(Value::as_str) {
                out.r#ref = reference(r);
            }
        }
    }
    out.description = text("description").unwrap_or_default();
    out.format = text("format").unwrap_or_default();
    if let Some(kind) = text("type") {
        out.r#type = Some(proto::TypeItem { value: vec![kind] });
    }
    if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        // Kubernetes' own v2 form of int-or-string.
        out.r#type = Some(proto::TypeItem {
            value: vec!["string".into()],
        });
        out.format = "int-or-string".into();
    }
    if let Some(items) = map.get("items") {
        out.items = Some(proto::ItemsItem {
            schema: vec![convert(items)],
        });
    }
    if let Some(Value::Object(properties)) = map.get("properties") {
        out.properties = Some(proto::Properties {
            additional_properties: properties
                .iter()
                .map(|(name, schema)| proto::NamedSchema {
                    name: name.clone(),
                    value: Some(convert(schema)),
                })
                .collect(),
        });
    }
    match map.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            out.additional_properties = Some(Box::new(proto::AdditionalPropertiesItem {
                schema: None,
                boolean: Some(*b),
            }));
        }
        Some(schema @ Value::Object(_)) => {
            out.additional_properties = Some(Box::new(proto::AdditionalPropertiesItem {
                schema: Some(convert(schema)),
                boolean: None,
            }));
        }
        _ => {}
    }
    if let Some(Value::Array(required)) = map.get("required") {
        out.required = required
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
    }
    for extension in [
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy",
    ] {
        if let Some(value) = text(extension) {
            out.vendor_extension.push(proto::NamedAny {
                name: extension.into(),
                value: Some(proto::Any {
                    yaml: format!("{value}\n"),
                }),
            });
        }
    }
    if let Some(Value::Array(gvks)) = map.get("x-kubernetes-group-version-kind") {
        let yaml: String = gvks
            .iter()
            .map(|g| {
                format!(
                    "- group: {:?}\n  kind: {}\n  version: {}\n",
                    g["group"].as_str().unwrap_or(""),
                    g["kind"].as_str().unwrap_or(""),
                    g["version"].as_str().unwrap_or("")
                )
            })
            .collect();
        out.vendor_extension.push(proto::NamedAny {
            name: "x-kubernetes-group-version-kind".into(),
            value: Some(proto::Any { yaml }),
        });
    }
    out
}

/// The parts of gnostic's `openapi_v2.Document` Portal fills in (field
/// numbers from gnostic's `OpenAPIv2.proto`): `swagger`, `info`, and one
/// path per kind whose `patch` operation names its group-version-kind and
/// takes `dryRun` and `fieldValidation`: how kubectl 1.20 decides that a
/// kind supports `--dry-run=server` (`SupportsDryRun`).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        pub definitions: Option<Definitions>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Definitions {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NamedSchema {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Schema>,
    }

    /// The parts of a JSON schema kubectl's validation reads.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Schema {
        #[prost(string, tag = "1")]
        pub r#ref: String,
        #[prost(string, tag = "2")]
        pub format: String,
        #[prost(string, tag = "4")]
        pub description: String,
        #[prost(string, repeated, tag = "19")]
        pub required: Vec<String>,
        #[prost(message, optional, boxed, tag = "21")]
        pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
        #[prost(message, optional, tag = "22")]
        pub r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "23")]
        pub items: Option<ItemsItem>,
        #[prost(message, optional, tag = "25")]
        pub properties: Option<Properties>,
        #[prost(message, repeated, tag = "31")]
        pub vendor_extension: Vec<NamedAny>,
    }

    /// A one-of: a schema (tag 1) or a boolean (tag 2).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct AdditionalPropertiesItem {
        #[prost(message, optional, tag = "1")]
        pub schema: Option<Schema>,
        #[prost(bool, optional, tag = "2")]
        pub boolean: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        pub value: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ItemsItem {
        #[prost(message, repeated, tag = "1")]
        pub schema: Vec<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Properties {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
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

fn query_parameter(name: &str) -> proto::ParametersItem {
    proto::ParametersItem {
        parameter: Some(proto::Parameter {
            non_body_parameter: Some(proto::NonBodyParameter {
                query_parameter_sub_schema: Some(proto::QueryParameter {
                    r#in: "query".into(),
                    name: name.into(),
                    r#type: "string".into(),
                    unique_items: true,
                }),
            }),
        }),
    }
}

/// `/openapi/v2` in protobuf: every kind's patch operation and the
/// schemas of the v3 documents (kubectl 1.20 validates against them).
pub(crate) fn document() -> Vec<u8> {
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
            proto::NamedPathItem {
                name: format!(
                    "/{}/{scope}{}/{{name}}",
                    path_of(r.group, r.version),
                    r.plural
                ),
                value: Some(proto::PathItem {
                    patch: Some(proto::Operation {
                        operation_id: format!("patch{}", r.kind_name),
                        parameters: vec![
                            query_parameter("dryRun"),
                            query_parameter("fieldValidation"),
                        ],
                        vendor_extension: vec![proto::NamedAny {
                            name: "x-kubernetes-group-version-kind".into(),
                            value: Some(proto::Any { yaml: gvk }),
                        }],
                    }),
                }),
            }
        })
        .collect();
    proto::Document {
        swagger: "2.0".into(),
        info: Some(proto::Info {
            title: "Kubernetes".into(),
            version: "v1.33.0".into(),
        }),
        paths: Some(proto::Paths { path }),
        definitions: Some(proto::Definitions {
            additional_properties: definitions(),
        }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_document_offers_dry_run_for_every_kind() {
        use prost::Message;
        let doc = proto::Document::decode(document().as_slice()).unwrap();
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
        // The definitions kubectl 1.20 validates with.
        let definitions = doc.definitions.unwrap().additional_properties;
        let pod = definitions
            .iter()
            .find(|d| d.name == "io.k8s.api.core.v1.Pod")
            .and_then(|d| d.value.as_ref())
            .unwrap();
        assert_eq!(
            pod.vendor_extension[0].name,
            "x-kubernetes-group-version-kind"
        );
        let spec = pod
            .properties
            .as_ref()
            .unwrap()
            .additional_properties
            .iter()
            .find(|p| p.name == "spec")
            .unwrap();
        assert_eq!(
            spec.value.as_ref().unwrap().r#ref,
            "#/definitions/io.k8s.api.core.v1.PodSpec"
        );
    }
}
