//! StatefulSets (`apps/v1`): pods with a stable identity, `<set>-0`,
//! `<set>-1`, …, each with its own claims from `volumeClaimTemplates`,
//! started and stopped in order (`OrderedReady`) or all at once
//! (`Parallel`), updated highest ordinal first down to a `partition`
//! (`RollingUpdate`) or when deleted (`OnDelete`). Defaults and validation
//! as Kubernetes' `pkg/apis/apps` (with `maxUnavailable` on, as since 1.35).

use serde_json::{json, Value};

use super::Subresource;
use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apps", "StatefulSet");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "statefulsets",
    singular: "statefulset",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["sts"],
    categories: &["all"],
    has_status: true,
    // Pod names and hostnames are `<set>-<ordinal>`: the set's name is a
    // DNS label.
    name_rule: NameRule::Label1123,
    decode: typed::<k8s_openapi::api::apps::v1::StatefulSet>,
    openapi_schema: openapi_schema::<k8s_openapi::api::apps::v1::StatefulSet>,
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
    subresources: &[Subresource {
        name: "scale",
        kind: "Scale",
        verbs: &["get", "patch", "update"],
        group_version: Some(("autoscaling", "v1")),
    }],
};

/// The fields of a spec that may change after create; everything else
/// (selector, serviceName, claim templates, pod management) is fixed.
const MUTABLE: &[&str] = &[
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "revisionHistoryLimit",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "replicas", json!(1));
    default(spec, "revisionHistoryLimit", json!(10));
    // An empty string is Go's zero value: defaulted as a missing field.
    if spec["podManagementPolicy"] == "" {
        spec["podManagementPolicy"] = Value::Null;
    }
    default(spec, "podManagementPolicy", json!("OrderedReady"));
    default(spec, "updateStrategy", json!({}));
    if let Some(strategy) = spec.get_mut("updateStrategy").filter(|s| s.is_object()) {
        // Only a missing type gets `rollingUpdate: {}`: an explicit
        // RollingUpdate without it stays without (kubectl tells the two
        // apart in `rollout status`).
        if strategy.get("type").is_none_or(|t| t.is_null() || t == "") {
            strategy["type"] = json!("RollingUpdate");
            default(strategy, "rollingUpdate", json!({}));
        }
        if strategy["type"] == "RollingUpdate" {
            if let Some(rolling) = strategy.get_mut("rollingUpdate").filter(|r| r.is_object()) {
                default(rolling, "partition", json!(0));
                default(rolling, "maxUnavailable", json!(1));
            }
        }
    }
    default(spec, "persistentVolumeClaimRetentionPolicy", json!({}));
    if let Some(policy) = spec
        .get_mut("persistentVolumeClaimRetentionPolicy")
        .filter(|p| p.is_object())
    {
        default(policy, "whenDeleted", json!("Retain"));
        default(policy, "whenScaled", json!("Retain"));
    }
    // Claim templates are defaulted as claims are.
    if let Some(claims) = spec
        .get_mut("volumeClaimTemplates")
        .and_then(Value::as_array_mut)
    {
        for claim in claims.iter_mut().filter(|c| c.is_object()) {
            default(claim, "spec", json!({}));
            if let Some(claim_spec) = claim.get_mut("spec").filter(|s| s.is_object()) {
                default(claim_spec, "volumeMode", json!("Filesystem"));
            }
            default(claim, "status", json!({}));
            if let Some(status) = claim.get_mut("status").filter(|s| s.is_object()) {
                default(status, "phase", json!("Pending"));
            }
        }
    }
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"replicas": 0, "availableReplicas": 0});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "template", "metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", "template", "spec", rest @ ..] => super::pod::spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

/// The set with its template as its pods get it: a claim volume for each
/// claim template (in place of a template volume of the same name), so
/// that mounts of claims validate.
fn with_claim_volumes(object: &Value) -> Value {
    let mut object = object.clone();
    let claims: Vec<String> = object["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    if claims.is_empty() {
        return object;
    }
    if let Some(pod) = object
        .pointer_mut("/spec/template/spec")
        .filter(|p| p.is_object())
    {
        let mut volumes: Vec<Value> = claims
            .iter()
            .map(|name| json!({"name": name, "persistentVolumeClaim": {"claimName": name}}))
            .collect();
        volumes.extend(
            pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| {
                    !v["name"]
                        .as_str()
                        .is_some_and(|n| claims.iter().any(|c| c == n))
                })
                .cloned(),
        );
        pod["volumes"] = Value::Array(volumes);
    }
    object
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let with_claims = with_claim_volumes(object);
    let old_with_claims = old.map(with_claim_volumes);
    let mut causes = super::replica_set::validate_selector_and_template(
        &with_claims,
        old_with_claims.as_ref(),
        "StatefulSet",
    );
    // A changed selector is one of the fixed fields, reported below in
    // upstream's words for all of them.
    causes.retain(|c| !(c.field == "spec.selector" && c.message.ends_with("field is immutable")));
    let spec = &object["spec"];
    for field in ["replicas", "minReadySeconds", "revisionHistoryLimit"] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                "must be greater than or equal to 0",
            ));
        }
    }
    if spec["ordinals"]["start"].as_i64().is_some_and(|n| n < 0) {
        causes.push(Cause::invalid(
            "spec.ordinals.start",
            spec["ordinals"]["start"].clone(),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(service) = spec["serviceName"].as_str().filter(|s| !s.is_empty()) {
        for message in crate::name::dns1123_label(service) {
            causes.push(Cause::invalid("spec.serviceName", service, &message));
        }
    }
    match spec["podManagementPolicy"].as_str().unwrap_or("") {
        "OrderedReady" | "Parallel" => {}
        "" => causes.push(Cause::required("spec.podManagementPolicy", "")),
        other => causes.push(Cause::invalid(
            "spec.podManagementPolicy",
            other,
            "must be 'OrderedReady' or 'Parallel'",
        )),
    }
    causes.extend(validate_update_strategy(&spec["updateStrategy"]));
    let policy = &spec["persistentVolumeClaimRetentionPolicy"];
    for field in ["whenDeleted", "whenScaled"] {
        if let Some(value) = policy[field].as_str() {
            if value != "Retain" && value != "Delete" {
                causes.push(unsupported(
                    &format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
                    value,
                    "\"Retain\", \"Delete\"",
                ));
            }
        }
    }
    if let Some(claims) = spec["volumeClaimTemplates"].as_array() {
        for (i, claim) in claims.iter().enumerate() {
            let name = claim["metadata"]["name"].as_str().unwrap_or("");
            let at = format!("spec.volumeClaimTemplates[{i}].metadata.name");
            if name.is_empty() {
                causes.push(Cause::required(&at, "name or generateName is required"));
            } else {
                for message in crate::name::dns1123_subdomain(name) {
                    causes.push(Cause::invalid(&at, name, &message));
                }
            }
        }
    }
    if let Some(old) = old {
        if fixed_fields(&old["spec"]) != fixed_fields(spec) {
            causes.push(Cause::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', \
                 'template', 'updateStrategy', 'revisionHistoryLimit', \
                 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
        let count = object["status"]["collisionCount"].as_i64();
        let before = old["status"]["collisionCount"].as_i64().unwrap_or(0);
        if count.is_some_and(|count| count < before) {
            causes.push(Cause::invalid(
                "status.collisionCount",
                object["status"]["collisionCount"].clone(),
                "cannot be decremented",
            ));
        }
    }
    causes
}

/// The spec without the fields an update may change.
fn fixed_fields(spec: &Value) -> Value {
    let mut fixed = spec.clone();
    if let Some(map) = fixed.as_object_mut() {
        for field in MUTABLE {
            map.remove(*field);
        }
    }
    fixed
}

fn validate_update_strategy(strategy: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let rolling = &strategy["rollingUpdate"];
    match strategy["type"].as_str().unwrap_or("") {
        "" => causes.push(Cause::required("spec.updateStrategy", "")),
        "OnDelete" => {
            if !rolling.is_null() {
                causes.push(Cause::invalid(
                    "spec.updateStrategy.rollingUpdate",
                    rolling.clone(),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            let at = "spec.updateStrategy.rollingUpdate";
            if rolling["partition"].as_i64().is_some_and(|n| n < 0) {
                causes.push(Cause::invalid(
                    &format!("{at}.partition"),
                    rolling["partition"].clone(),
                    "must be greater than or equal to 0",
                ));
            }
            let unavailable = &rolling["maxUnavailable"];
            if !unavailable.is_null() {
                let field = format!("{at}.maxUnavailable");
                match super::deployment::int_or_percent(unavailable, &field) {
                    Err(cause) => causes.push(cause),
                    Ok(percent) => {
                        if super::deployment::is_zero(unavailable) {
                            causes.push(Cause::invalid(&field, unavailable.clone(), "cannot be 0"));
                        } else if percent.is_some_and(|p| p > 100) {
                            causes.push(Cause::invalid(
                                &field,
                                unavailable.clone(),
                                "must not be greater than 100%",
                            ));
                        }
                    }
                }
            }
        }
        other => causes.push(Cause::invalid(
            "spec.updateStrategy.type",
            other,
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    vec![
        NAME,
        col("Ready", "Number of the pod with ready state", 0),
        AGE,
        col("Containers", "Names of each container in the template.", 1),
        col(
            "Images",
            "Images referenced by each container in the template.",
            1,
        ),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let [names, images] = super::template_containers(&object["spec"]["template"]);
    let desired = object
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    vec![
        name(object),
        json!(format!(
            "{}/{desired}",
            int(object, &["status", "readyReplicas"])
        )),
        age(object, now),
        names,
        images,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stateful_set(spec: Value) -> Value {
        let mut object = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}},
                "template": {"metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}}});
        for (key, value) in spec.as_object().unwrap() {
            object["spec"][key] = value.clone();
        }
        object
    }

    fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
        validate(object, old).iter().map(Cause::display).collect()
    }

    #[test]
    fn defaults_are_kubernetes_own() {
        let mut object = stateful_set(json!({"volumeClaimTemplates": [
            {"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}));
        // A mount of a claim is a mount of a volume the pods will have.
        object["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "www", "mountPath": "/usr/share/nginx/html"}]);
        defaults(&mut object);
        let spec = &object["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            spec["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}})
        );
        assert_eq!(
            spec["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(
            spec["volumeClaimTemplates"][0]["spec"]["volumeMode"],
            "Filesystem"
        );
        assert_eq!(
            spec["volumeClaimTemplates"][0]["status"]["phase"],
            "Pending"
        );
        assert!(
            messages(&object, None).is_empty(),
            "{:?}",
            messages(&object, None)
        );

        // An explicit RollingUpdate keeps its missing rollingUpdate.
        let mut explicit = stateful_set(json!({"updateStrategy": {"type": "RollingUpdate"}}));
        defaults(&mut explicit);
        assert_eq!(
            explicit["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate"})
        );
    }

    #[test]
    fn strategies_and_policies_are_validated() {
        let on_delete = stateful_set(json!({"podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": {"partition": 1}}}));
        assert_eq!(
            messages(&on_delete, None),
            ["spec.updateStrategy.rollingUpdate: Invalid value: {\"partition\":1}: only allowed for updateStrategy 'RollingUpdate'"]
        );
        let bad = stateful_set(json!({"podManagementPolicy": "Random",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": -1, "maxUnavailable": 0}},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Keep"}}));
        let found = messages(&bad, None);
        for expected in [
            "spec.podManagementPolicy: Invalid value: \"Random\": must be 'OrderedReady' or 'Parallel'",
            "spec.updateStrategy.rollingUpdate.partition: Invalid value: -1: must be greater than or equal to 0",
            "spec.updateStrategy.rollingUpdate.maxUnavailable: Invalid value: 0: cannot be 0",
            "spec.persistentVolumeClaimRetentionPolicy.whenDeleted: Unsupported value: \"Keep\"",
        ] {
            assert!(
                found.iter().any(|m| m.starts_with(expected)),
                "{expected} in {found:?}"
            );
        }
    }

    #[test]
    fn only_some_fields_change_after_create() {
        let mut old = stateful_set(json!({}));
        defaults(&mut old);
        let mut scaled = old.clone();
        scaled["spec"]["replicas"] = json!(5);
        scaled["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
        assert!(messages(&scaled, Some(&old)).is_empty());
        for (field, value) in [
            ("serviceName", json!("other")),
            ("podManagementPolicy", json!("Parallel")),
            (
                "selector",
                json!({"matchLabels": {"app": "nginx", "tier": "web"}}),
            ),
        ] {
            let mut changed = old.clone();
            changed["spec"][field] = value;
            if field == "selector" {
                changed["spec"]["template"]["metadata"]["labels"]["tier"] = json!("web");
            }
            assert_eq!(
                messages(&changed, Some(&old)),
                ["spec: Forbidden: updates to statefulset spec for fields other than 'replicas', \
                  'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', \
                  'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"],
                "{field}"
            );
        }
    }

    #[test]
    fn table_shows_ready_of_desired() {
        let mut object = stateful_set(json!({"replicas": 3}));
        object["status"] = json!({"readyReplicas": 2});
        let row = cells(&object, 0);
        assert_eq!(row[1], "2/3");
        assert_eq!(row.len(), columns().len());
    }
}
