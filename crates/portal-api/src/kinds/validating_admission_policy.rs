//! ValidatingAdmissionPolicies (`admissionregistration.k8s.io/v1`): CEL
//! checks of writes, applied where a ValidatingAdmissionPolicyBinding
//! binds them (`portal-apiserver`'s admission). This module checks that a
//! policy's expressions compile and its match constraints are whole, as
//! upstream's validation does.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The group of admission configuration.
pub const GROUP: &str = "admissionregistration.k8s.io";

/// The kind this module defines.
pub const KIND: Kind = Kind::new(GROUP, "ValidatingAdmissionPolicy");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "validatingadmissionpolicies",
    singular: "validatingadmissionpolicy",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>,
    openapi_schema: openapi_schema::<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
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

/// Upstream's defaults: `failurePolicy: Fail`, match everything by
/// `Equivalent` resources in any namespace.
fn defaults(object: &mut Value) {
    let spec = &mut object["spec"];
    if spec["failurePolicy"].is_null() {
        spec["failurePolicy"] = json!("Fail");
    }
    let constraints = &mut spec["matchConstraints"];
    if constraints.is_object() {
        defaults_of_match(constraints);
    }
}

/// The defaults of a `matchResources` (a policy's constraints or a
/// binding's).
pub(crate) fn defaults_of_match(resources: &mut Value) {
    if resources["matchPolicy"].is_null() {
        resources["matchPolicy"] = json!("Equivalent");
    }
    for selector in ["namespaceSelector", "objectSelector"] {
        if resources[selector].is_null() {
            resources[selector] = json!({});
        }
    }
    for list in ["resourceRules", "excludeResourceRules"] {
        for rule in resources[list].as_array_mut().into_iter().flatten() {
            if rule["scope"].is_null() {
                rule["scope"] = json!("*");
            }
        }
    }
}

/// Whether a CEL expression compiles; why not.
pub fn compiles(expression: &str) -> Result<(), String> {
    crate::expressions::Expression::compile(expression)
        .map(drop)
        .map_err(|e| format!("compilation failed: {e}"))
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &object["spec"];
    let validations = spec["validations"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let audits = spec["auditAnnotations"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if validations.is_empty() && audits.is_empty() {
        causes.push(Cause::required(
            "spec.validations",
            "validations or auditAnnotations must contain at least one item",
        ));
    }
    if !spec["matchConstraints"]["resourceRules"].is_array() {
        causes.push(Cause::required("spec.matchConstraints.resourceRules", ""));
    }
    for (i, validation) in validations.iter().enumerate() {
        let field = format!("spec.validations[{i}].expression");
        match validation["expression"].as_str() {
            None | Some("") => causes.push(Cause::required(&field, "")),
            Some(expression) => {
                if let Err(problem) = compiles(expression) {
                    causes.push(Cause::invalid(&field, expression, &problem));
                }
            }
        }
        if let Some(expression) = validation["messageExpression"].as_str() {
            if let Err(problem) = compiles(expression) {
                causes.push(Cause::invalid(
                    &format!("spec.validations[{i}].messageExpression"),
                    expression,
                    &problem,
                ));
            }
        }
    }
    for (list, what) in [
        ("matchConditions", "expression"),
        ("variables", "expression"),
    ] {
        for (i, item) in spec[list].as_array().into_iter().flatten().enumerate() {
            let field = format!("spec.{list}[{i}].{what}");
            match item[what].as_str() {
                None | Some("") => causes.push(Cause::required(&field, "")),
                Some(expression) => {
                    if let Err(problem) = compiles(expression) {
                        causes.push(Cause::invalid(&field, expression, &problem));
                    }
                }
            }
        }
    }
    match spec["failurePolicy"].as_str() {
        None | Some("Fail" | "Ignore") => {}
        Some(other) => causes.push(Cause::unsupported(
            "spec.failurePolicy",
            other,
            &["Fail", "Ignore"],
        )),
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Validations", "How many validations it has.", 0),
        col("ParamKind", "The kind of its parameters.", 0),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let param_kind = &object["spec"]["paramKind"];
    let param_kind = match param_kind["kind"].as_str() {
        Some(kind) => format!("{}/{kind}", param_kind["apiVersion"].as_str().unwrap_or("")),
        None => NONE.to_owned(),
    };
    vec![
        name(object),
        json!(arr(object, &["spec", "validations"]).len()),
        json!(param_kind),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_must_compile() {
        let mut policy = json!({"spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["deployments"]}]},
            "validations": [{"expression": "object.spec.replicas <= 5"}]}});
        defaults(&mut policy);
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            policy["spec"]["matchConstraints"]["resourceRules"][0]["scope"],
            "*"
        );
        assert!(validate(&policy, None).is_empty());
        policy["spec"]["validations"][0]["expression"] = json!("object.spec.replicas <=");
        let causes = validate(&policy, None);
        assert_eq!(causes[0].field, "spec.validations[0].expression");
    }
}
