//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`): kinds users
//! define. This module checks a definition as upstream's apiextensions
//! validation does (names, scope, versions with one storage version,
//! structural schemas that compile, printer columns) and fills in its
//! defaults; the API server turns each accepted one into served resources
//! (`crate::custom`) and reports `NamesAccepted` and `Established`.

use serde_json::{json, Value};

use crate::custom;
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apiextensions.k8s.io", "CustomResourceDefinition");

/// Held by a CRD being deleted until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "customresourcedefinitions",
    singular: "customresourcedefinition",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["crd", "crds"],
    categories: &["api-extensions"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >,
    openapi_schema: openapi_schema::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: super::conditions_by_type,
    list_map_keys: &[],
    columns: super::role::columns,
    cells: super::role::cells,
    custom: None,
    subresources: &[],
};

/// Upstream's defaults: the singular and list kind from the kind, `None`
/// conversion.
fn defaults(object: &mut Value) {
    let names = &mut object["spec"]["names"];
    if let Some(kind) = names["kind"].as_str().map(str::to_owned) {
        if names["singular"].as_str().unwrap_or("").is_empty() {
            names["singular"] = json!(kind.to_lowercase());
        }
        if names["listKind"].as_str().unwrap_or("").is_empty() {
            names["listKind"] = json!(format!("{kind}List"));
        }
    }
    let spec = &mut object["spec"];
    if spec["conversion"].is_null() {
        spec["conversion"] = json!({"strategy": "None"});
    }
    // (`pointer_mut`: indexing would add the fields it walks through.)
    let service = spec
        .pointer_mut("/conversion/webhook/clientConfig/service")
        .and_then(Value::as_object_mut);
    if let Some(service) = service {
        service.entry("port").or_insert(json!(443));
    }
}

/// A new definition is being deleted only once its objects are gone, and
/// records the version it stores at.
fn prepare_create(object: &mut Value) {
    let storage = storage_version(object);
    object["status"] = json!({
        "conditions": [],
        "acceptedNames": {"plural": "", "kind": ""},
        "storedVersions": storage.into_iter().collect::<Vec<_>>(),
    });
    let mut finalizers = object["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        finalizers.push(json!(CLEANUP_FINALIZER));
    }
    object["metadata"]["finalizers"] = json!(finalizers);
}

/// Upstream's `validateCustomResourceConversion`: a webhook exactly when
/// the strategy is `Webhook`, reachable, speaking a review version Portal
/// speaks.
fn validate_conversion(spec: &Value, causes: &mut Vec<Cause>) {
    let conversion = &spec["conversion"];
    let webhook = &conversion["webhook"];
    match conversion["strategy"].as_str() {
        None | Some("None") => {
            if !webhook.is_null() {
                causes.push(Cause::forbidden(
                    "spec.conversion.webhook",
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        Some("Webhook") => {
            if spec["preserveUnknownFields"] == true {
                causes.push(Cause::invalid(
                    "spec.conversion.strategy",
                    "Webhook",
                    "must be None if spec.preserveUnknownFields is true",
                ));
            }
            if !webhook.is_object() {
                causes.push(Cause::required(
                    "spec.conversion.webhook",
                    "required when strategy is set to Webhook",
                ));
                return;
            }
            if webhook["clientConfig"].is_object() {
                super::validating_webhook_configuration::validate_client_config(
                    &webhook["clientConfig"],
                    "spec.conversion.webhook.clientConfig",
                    causes,
                );
            } else {
                causes.push(Cause::required(
                    "spec.conversion.webhook.clientConfig",
                    "required when strategy is set to Webhook",
                ));
            }
            let versions = webhook["conversionReviewVersions"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            if !versions.iter().any(|v| v == "v1" || v == "v1beta1") {
                causes.push(Cause::required(
                    "spec.conversion.webhook.conversionReviewVersions",
                    "must include at least one of v1, v1beta1",
                ));
            }
        }
        Some(other) => causes.push(Cause::unsupported(
            "spec.conversion.strategy",
            other,
            &["None", "Webhook"],
        )),
    }
}

/// The version objects are stored at.
pub fn storage_version(object: &Value) -> Option<String> {
    object["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .map(str::to_owned)
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &object["spec"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let group = text(&spec["group"]);
    let names = &spec["names"];
    let plural = text(&names["plural"]);
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else {
        if !crate::name::dns1123_subdomain(&group).is_empty() {
            causes.push(Cause::invalid(
                "spec.group",
                group.as_str(),
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            ));
        }
        if !group.contains('.') {
            causes.push(Cause::invalid(
                "spec.group",
                group.as_str(),
                "should be a domain with at least one dot",
            ));
        }
    }
    // Kubernetes' own groups are not for anyone to define.
    let protected = group.ends_with(".k8s.io")
        || group.ends_with(".kubernetes.io")
        || group == "k8s.io"
        || group == "kubernetes.io";
    if protected && object["metadata"]["annotations"]["api-approved.kubernetes.io"].is_null() {
        causes.push(Cause::required(
            "metadata.annotations[api-approved.kubernetes.io]",
            "protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111",
        ));
    }
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    if name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    for (field, value) in [
        ("plural", &names["plural"]),
        ("singular", &names["singular"]),
    ] {
        let value = text(value);
        if value.is_empty() {
            causes.push(Cause::required(&format!("spec.names.{field}"), ""));
        } else if !crate::name::dns1035_label(&value).is_empty()
            && !crate::name::dns1123_label(&value).is_empty()
        {
            causes.push(Cause::invalid(
                &format!("spec.names.{field}"),
                value.as_str(),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            ));
        }
    }
    for (field, value) in [("kind", &names["kind"]), ("listKind", &names["listKind"])] {
        let value = text(value);
        if value.is_empty() {
            causes.push(Cause::required(&format!("spec.names.{field}"), ""));
        } else if !crate::name::dns1035_label(&value.to_lowercase()).is_empty() {
            causes.push(Cause::invalid(
                &format!("spec.names.{field}"),
                value.as_str(),
                "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
            ));
        }
    }
    if !names["kind"].is_null() && names["kind"] == names["listKind"] {
        causes.push(Cause::invalid(
            "spec.names.listKind",
            text(&names["listKind"]),
            "kind and listKind may not be the same",
        ));
    }
    for (i, short) in names["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let short = text(short);
        if !crate::name::dns1123_label(&short).is_empty() {
            causes.push(Cause::invalid(
                &format!("spec.names.shortNames[{i}]"),
                short.as_str(),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            ));
        }
    }
    match spec["scope"].as_str() {
        Some("Namespaced" | "Cluster") => {}
        Some(other) => causes.push(Cause::unsupported(
            "spec.scope",
            other,
            &["Cluster", "Namespaced"],
        )),
        None => causes.push(Cause::required("spec.scope", "")),
    }
    if let Some(old) = old {
        if old["spec"]["scope"] != spec["scope"] {
            causes.push(Cause::invalid(
                "spec.scope",
                spec["scope"].clone(),
                "field is immutable",
            ));
        }
    }
    validate_conversion(spec, &mut causes);
    validate_versions(spec, &mut causes);
    // Every schema must be structural and its rules compile; the printer
    // columns must read.
    if causes.is_empty() {
        if let Err(problem) = custom::check(object) {
            causes.push(Cause::invalid("spec.versions", "", &problem));
        }
    }
    if let (Some(old), Some(storage)) = (old, storage_version(object)) {
        // A version objects may be stored at cannot be dropped.
        let stored = old["status"]["storedVersions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let versions: Vec<String> = spec["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| text(&v["name"]))
            .collect();
        for version in stored.iter().filter_map(Value::as_str) {
            if version != storage && !versions.iter().any(|v| v == version) {
                causes.push(Cause::invalid(
                    "status.storedVersions",
                    json!(stored),
                    &format!("must appear in spec.versions: {version}"),
                ));
            }
        }
    }
    causes
}

fn validate_versions(spec: &Value, causes: &mut Vec<Cause>) {
    let versions = spec["versions"].as_array().map_or(&[][..], Vec::as_slice);
    if versions.is_empty() {
        causes.push(Cause::invalid(
            "spec.versions",
            json!([]),
            "must have exactly one version marked as storage version",
        ));
        return;
    }
    let storage = versions.iter().filter(|v| v["storage"] == true).count();
    if storage != 1 {
        causes.push(Cause::invalid_rendered(
            "spec.versions",
            &format!("{storage}"),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.iter().any(|v| v["served"] == true) {
        causes.push(Cause::invalid(
            "spec.versions",
            "",
            "must have at least one version marked as served",
        ));
    }
    let mut seen = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        let name = version["name"].as_str().unwrap_or("");
        let field = format!("spec.versions[{i}]");
        if name.is_empty() {
            causes.push(Cause::required(&format!("{field}.name"), ""));
        } else if !crate::name::dns1035_label(name).is_empty() {
            causes.push(Cause::invalid(
                &format!("{field}.name"),
                name,
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            ));
        }
        if seen.contains(&name) {
            causes.push(Cause::duplicate(&format!("{field}.name"), name));
        }
        seen.push(name);
        if !version["schema"]["openAPIV3Schema"].is_object() {
            causes.push(Cause::required(
                &format!("{field}.schema.openAPIV3Schema"),
                "schemas are required",
            ));
        }
        let scale = &version["subresources"]["scale"];
        if scale.is_object() {
            for path in ["specReplicasPath", "statusReplicasPath"] {
                let value = scale[path].as_str().unwrap_or("");
                if !value.starts_with('.') || value.len() < 2 {
                    causes.push(Cause::invalid(
                        &format!("{field}.subresources.scale.{path}"),
                        value,
                        "should be a json path under .spec or .status",
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({"metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    }

    fn problems(object: &Value) -> Vec<String> {
        let mut object = object.clone();
        defaults(&mut object);
        validate(&object, None).iter().map(Cause::display).collect()
    }

    #[test]
    fn defaults_and_validation() {
        let mut object = crd();
        defaults(&mut object);
        assert_eq!(object["spec"]["names"]["singular"], "widget");
        assert_eq!(object["spec"]["names"]["listKind"], "WidgetList");
        assert!(problems(&crd()).is_empty(), "{:?}", problems(&crd()));
        let mut wrong_name = crd();
        wrong_name["metadata"]["name"] = json!("widgets");
        assert_eq!(
            problems(&wrong_name),
            [
                r#"metadata.name: Invalid value: "widgets": must be spec.names.plural+"."+spec.group"#
            ]
        );
        let mut two_storage = crd();
        let version = two_storage["spec"]["versions"][0].clone();
        let mut second = version.clone();
        second["name"] = json!("v2");
        two_storage["spec"]["versions"] = json!([version, second]);
        assert!(problems(&two_storage)[0].contains("exactly one version marked as storage"));
        let mut no_schema = crd();
        no_schema["spec"]["versions"][0]["schema"] = Value::Null;
        assert_eq!(
            problems(&no_schema),
            ["spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"]
        );
        let mut not_structural = crd();
        not_structural["spec"]["versions"][0]["schema"]["openAPIV3Schema"] =
            json!({"type": "object", "properties": {"spec": {"properties": {}}}});
        assert!(
            problems(&not_structural)[0].contains("must not be empty for specified object fields")
        );
        let mut prepared = crd();
        prepare_create(&mut prepared);
        assert_eq!(prepared["status"]["storedVersions"], json!(["v1"]));
        assert_eq!(
            prepared["metadata"]["finalizers"],
            json!([CLEANUP_FINALIZER])
        );
    }
}
