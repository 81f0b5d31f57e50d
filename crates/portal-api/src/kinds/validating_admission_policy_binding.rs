//! ValidatingAdmissionPolicyBindings (`admissionregistration.k8s.io/v1`):
//! where a ValidatingAdmissionPolicy applies (`matchResources`), with which
//! parameters (`paramRef`) and what a failure does (`validationActions`:
//! Deny, Warn, Audit).

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(
    super::validating_admission_policy::GROUP,
    "ValidatingAdmissionPolicyBinding",
);

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "validatingadmissionpolicybindings",
    singular: "validatingadmissionpolicybinding",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>,
    openapi_schema: openapi_schema::<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    >,
    defaults,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn defaults(object: &mut Value) {
    let resources = &mut object["spec"]["matchResources"];
    if resources.is_object() {
        super::validating_admission_policy::defaults_of_match(resources);
    }
}

const ACTIONS: &[&str] = &["Audit", "Deny", "Warn"];

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &object["spec"];
    if spec["policyName"].as_str().unwrap_or("").is_empty() {
        causes.push(Cause::required("spec.policyName", ""));
    }
    let actions = spec["validationActions"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if actions.is_empty() {
        causes.push(Cause::required("spec.validationActions", ""));
    }
    let mut seen = Vec::new();
    for (i, action) in actions.iter().enumerate() {
        let field = format!("spec.validationActions[{i}]");
        let action = action.as_str().unwrap_or("");
        if !ACTIONS.contains(&action) {
            causes.push(Cause::unsupported(&field, action, ACTIONS));
        }
        if seen.contains(&action) {
            causes.push(Cause::duplicate(&field, action));
        }
        seen.push(action);
    }
    if seen.contains(&"Deny") && seen.contains(&"Warn") {
        causes.push(Cause::invalid(
            "spec.validationActions",
            json!(actions),
            "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
        ));
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("PolicyName", "The policy it binds.", 0),
        col("ParamRef", "Its parameters.", 0),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let param = &object["spec"]["paramRef"];
    let param = match param["name"].as_str() {
        Some(name) => match param["namespace"].as_str() {
            Some(namespace) => format!("{namespace}/{name}"),
            None => format!("*/{name}"),
        },
        None if param.is_object() => "*/*".to_owned(),
        None => NONE.to_owned(),
    };
    vec![
        name(object),
        json!(s(object, &["spec", "policyName"]).unwrap_or("")),
        json!(param),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_checked() {
        let binding = json!({"spec": {"policyName": "p", "validationActions": ["Deny"]}});
        assert!(validate(&binding, None).is_empty());
        let both = json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Warn"]}});
        assert_eq!(validate(&both, None).len(), 1);
        let unknown = json!({"spec": {"policyName": "p", "validationActions": ["Shout"]}});
        assert_eq!(
            validate(&unknown, None)[0].field,
            "spec.validationActions[0]"
        );
    }
}
