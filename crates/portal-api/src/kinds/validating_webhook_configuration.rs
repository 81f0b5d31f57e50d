//! ValidatingWebhookConfigurations (`admissionregistration.k8s.io/v1`):
//! HTTPS endpoints (a Service in the cluster or a URL) asked whether a
//! write may go ahead, after the server's own checks. What both webhook
//! kinds share (defaults and upstream's validation of a webhook) lives
//! here; the calls are `portal-apiserver`'s admission.

use serde_json::{json, Value};

use super::nothing;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(
    super::validating_admission_policy::GROUP,
    "ValidatingWebhookConfiguration",
);

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "validatingwebhookconfigurations",
    singular: "validatingwebhookconfiguration",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>,
    openapi_schema: openapi_schema::<
        k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
    >,
    defaults: |object| defaults(object, false),
    validate: |object, _| validate(object, false),
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// Webhooks merge by name (`patchMergeKey: name`), as upstream.
pub(crate) fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["webhooks"] => ListStrategy::MergeKey("name"),
        _ => ListStrategy::Replace,
    }
}

/// Upstream's defaults of each webhook.
pub(crate) fn defaults(object: &mut Value, mutating: bool) {
    for webhook in object["webhooks"].as_array_mut().into_iter().flatten() {
        let mut default = |field: &str, value: Value| {
            if webhook[field].is_null() {
                webhook[field] = value;
            }
        };
        default("failurePolicy", json!("Fail"));
        default("matchPolicy", json!("Equivalent"));
        default("namespaceSelector", json!({}));
        default("objectSelector", json!({}));
        default("timeoutSeconds", json!(10));
        if mutating {
            default("reinvocationPolicy", json!("Never"));
        }
        for rule in webhook["rules"].as_array_mut().into_iter().flatten() {
            if rule["scope"].is_null() {
                rule["scope"] = json!("*");
            }
        }
        if let Some(port) = webhook["clientConfig"]["service"].as_object_mut() {
            port.entry("port").or_insert(json!(443));
        }
    }
}

/// Upstream's `validateWebhook`, for both kinds.
pub(crate) fn validate(object: &Value, mutating: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut names = Vec::new();
    for (i, webhook) in object["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("webhooks[{i}]");
        let name = webhook["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        } else if !crate::name::dns1123_subdomain(name).is_empty() || name.split('.').count() < 3 {
            causes.push(Cause::invalid(
                &format!("{at}.name"),
                name,
                "should be a domain with at least three segments separated by dots",
            ));
        }
        if names.contains(&name) {
            causes.push(Cause::duplicate(&format!("{at}.name"), name));
        }
        names.push(name);
        let versions = webhook["admissionReviewVersions"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if !versions.iter().any(|v| v == "v1" || v == "v1beta1") {
            causes.push(Cause::required(
                &format!("{at}.admissionReviewVersions"),
                "must specify one of v1, v1beta1",
            ));
        }
        match webhook["sideEffects"].as_str() {
            Some("None" | "NoneOnDryRun") => {}
            Some(other) => causes.push(Cause::unsupported(
                &format!("{at}.sideEffects"),
                other,
                &["None", "NoneOnDryRun"],
            )),
            None => causes.push(Cause::required(&format!("{at}.sideEffects"), "")),
        }
        match webhook["failurePolicy"].as_str() {
            None | Some("Fail" | "Ignore") => {}
            Some(other) => causes.push(Cause::unsupported(
                &format!("{at}.failurePolicy"),
                other,
                &["Fail", "Ignore"],
            )),
        }
        if let Some(timeout) = webhook["timeoutSeconds"].as_i64() {
            if !(1..=30).contains(&timeout) {
                causes.push(Cause::invalid(
                    &format!("{at}.timeoutSeconds"),
                    timeout,
                    "the timeout value must be between 1 and 30 seconds",
                ));
            }
        }
        if mutating {
            match webhook["reinvocationPolicy"].as_str() {
                None | Some("Never" | "IfNeeded") => {}
                Some(other) => causes.push(Cause::unsupported(
                    &format!("{at}.reinvocationPolicy"),
                    other,
                    &["IfNeeded", "Never"],
                )),
            }
        }
        validate_client_config(
            &webhook["clientConfig"],
            &format!("{at}.clientConfig"),
            &mut causes,
        );
        for (j, condition) in webhook["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("{at}.matchConditions[{j}].expression");
            if let Err(problem) = super::validating_admission_policy::compiles(
                condition["expression"].as_str().unwrap_or(""),
            ) {
                causes.push(Cause::invalid(
                    &field,
                    condition["expression"].clone(),
                    &problem,
                ));
            }
        }
    }
    causes
}

/// A webhook's `clientConfig` (admission and CRD conversion webhooks):
/// a URL or a Service, as upstream's `ValidateWebhookClientConfig`.
pub(crate) fn validate_client_config(config: &Value, at: &str, causes: &mut Vec<Cause>) {
    match (config["url"].as_str(), config["service"].is_object()) {
        (Some(_), true) | (None, false) => causes.push(Cause::required(
            at,
            "exactly one of url or service is required",
        )),
        (Some(url), false) => {
            if !url.starts_with("https://") {
                causes.push(Cause::invalid(
                    &format!("{at}.url"),
                    url,
                    "'https' is the only allowed URL scheme",
                ));
            }
        }
        (None, true) => {
            let service = &config["service"];
            for field in ["name", "namespace"] {
                if service[field].as_str().unwrap_or("").is_empty() {
                    causes.push(Cause::required(&format!("{at}.service.{field}"), ""));
                }
            }
            if let Some(path) = service["path"].as_str() {
                if !path.starts_with('/') {
                    causes.push(Cause::invalid(
                        &format!("{at}.service.path"),
                        path,
                        "must start with a '/'",
                    ));
                }
            }
            if let Some(port) = service["port"].as_i64() {
                if !(1..=65535).contains(&port) {
                    causes.push(Cause::invalid(
                        &format!("{at}.service.port"),
                        port,
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
}

pub(crate) fn columns() -> Vec<Column> {
    vec![NAME, col("Webhooks", "How many webhooks it holds.", 0), AGE]
}

pub(crate) fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(arr(object, &["webhooks"]).len()),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_are_defaulted_and_checked() {
        let mut config = json!({"webhooks": [{"name": "deny.example.com", "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "hook", "namespace": "hooks"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]}]});
        defaults(&mut config, true);
        assert_eq!(config["webhooks"][0]["timeoutSeconds"], 10);
        assert_eq!(
            config["webhooks"][0]["clientConfig"]["service"]["port"],
            443
        );
        assert_eq!(config["webhooks"][0]["reinvocationPolicy"], "Never");
        assert!(validate(&config, true).is_empty());
        config["webhooks"][0]["clientConfig"] = json!({"url": "http://x"});
        config["webhooks"][0]["name"] = json!("short");
        let fields: Vec<_> = validate(&config, true)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["webhooks[0].name", "webhooks[0].clientConfig.url"]);
    }
}
