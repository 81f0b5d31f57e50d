//! PodDisruptionBudgets (`policy/v1`): how many of an application's pods
//! must stay up (`minAvailable`) or may be down (`maxUnavailable`) through
//! voluntary disruptions; the eviction subresource honours them.

use serde_json::{json, Value};

use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("policy", "PodDisruptionBudget");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "poddisruptionbudgets",
    singular: "poddisruptionbudget",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["pdb"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
    openapi_schema: openapi_schema::<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
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

fn defaults(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) {
        // An empty selector selects every pod in policy/v1.
        default(spec, "selector", json!({}));
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

/// An int ≥ 0 or a percentage 0–100 %.
fn int_or_percent(value: &Value, field: &str) -> Option<Cause> {
    if let Some(n) = value.as_i64() {
        return (n < 0).then(|| Cause::invalid(field, n, "must be greater than or equal to 0"));
    }
    let text = value.as_str().unwrap_or("");
    match text.strip_suffix('%').map(str::parse::<i64>) {
        Some(Ok(percent)) if (0..=100).contains(&percent) => None,
        Some(Ok(_)) => Some(Cause::invalid(field, text, "must not be greater than 100%")),
        _ => Some(Cause::invalid(
            field,
            text,
            "a valid percent string must be a numeric string followed by an ending '%' \
             (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
        )),
    }
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    let min = &spec["minAvailable"];
    let max = &spec["maxUnavailable"];
    if !min.is_null() && !max.is_null() {
        causes.push(Cause::invalid_rendered(
            "spec",
            "",
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (value, field) in [(min, "spec.minAvailable"), (max, "spec.maxUnavailable")] {
        if !value.is_null() {
            causes.extend(int_or_percent(value, field));
        }
    }
    if let Err(message) =
        crate::selector::LabelSelector::from_api(&spec["selector"], "spec.selector")
    {
        let (field, detail) = message
            .split_once(": ")
            .unwrap_or(("spec.selector", &message));
        causes.push(Cause::invalid_rendered(field, "", detail));
    }
    if let Some(policy) = spec["unhealthyPodEvictionPolicy"].as_str() {
        if !matches!(policy, "IfHealthyBudget" | "AlwaysAllow") {
            causes.push(unsupported(
                "spec.unhealthyPodEvictionPolicy",
                policy,
                "\"AlwaysAllow\", \"IfHealthyBudget\"",
            ));
        }
    }
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    vec![
        NAME,
        col(
            "Min Available",
            "The minimum number of pods that must be available simultaneously. This can be \
             either an integer or a string specifying a percentage, e.g. \"28%\".",
            0,
        ),
        col(
            "Max Unavailable",
            "The maximum number of pods that may be unavailable. This can be either an \
             integer or a string specifying a percentage, e.g. \"33%\".",
            0,
        ),
        Column {
            kind: "integer",
            ..col(
                "Allowed Disruptions",
                "Calculated number of pods that may be disrupted at this time.",
                0,
            )
        },
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let shown = |value: &Value| match value {
        Value::Null => "N/A".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    vec![
        name(object),
        json!(shown(&object["spec"]["minAvailable"])),
        json!(shown(&object["spec"]["maxUnavailable"])),
        json!(int(object, &["status", "disruptionsAllowed"])),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bound_valid_and_shown() {
        let pdb = |spec: Value| json!({"metadata": {"name": "web"}, "spec": spec});
        let good = pdb(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}));
        assert!(validate(&good, None).is_empty());
        let both = pdb(json!({"minAvailable": 2, "maxUnavailable": "10%"}));
        assert!(validate(&both, None)[0]
            .display()
            .contains("cannot be both set"));
        let over = pdb(json!({"maxUnavailable": "150%"}));
        assert!(validate(&over, None)[0]
            .display()
            .contains("must not be greater than 100%"));
        let row = cells(&good, 0);
        assert_eq!((row[1].clone(), row[2].clone()), (json!("2"), json!("N/A")));
    }
}
