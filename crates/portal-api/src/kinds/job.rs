//! Jobs (`batch/v1`): pods run to completion — `completions` successes,
//! `parallelism` at a time, each index once in `Indexed` mode — within a
//! `backoffLimit` of failures and an `activeDeadlineSeconds`. As
//! Kubernetes' registry, the server generates the selector
//! (`batch.kubernetes.io/controller-uid`) and the template's labels unless
//! `manualSelector` is set; the template never changes.

use serde_json::{json, Value};

use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::selector::LabelSelector;
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("batch", "Job");

/// The label (and selector key) with the Job's uid.
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// The label with the Job's name.
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "jobs",
    singular: "job",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::batch::v1::Job>,
    openapi_schema: openapi_schema::<k8s_openapi::api::batch::v1::Job>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &["status.successful"],
    field_paths: &[("status.successful", "status.succeeded")],
    field_defaults: &[("status.successful", "0")],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if spec.get("completions").is_none() && spec.get("parallelism").is_none() {
        spec["completions"] = json!(1);
    }
    default(spec, "parallelism", json!(1));
    default(spec, "backoffLimit", json!(6));
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    let replacement = if spec.get("podFailurePolicy").is_some() {
        "Failed"
    } else {
        "TerminatingOrFailed"
    };
    default(spec, "podReplacementPolicy", json!(replacement));
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn manual_selector(object: &Value) -> bool {
    object["spec"]["manualSelector"] == true
}

/// The generated selector and template labels (unless `manualSelector`),
/// from the uid the server has just given the Job; an empty status.
fn prepare_create(object: &mut Value) {
    object["status"] = json!({});
    if manual_selector(object) {
        return;
    }
    let uid = object["metadata"]["uid"].clone();
    let name = object["metadata"]["name"].clone();
    if let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) {
        spec["selector"] = json!({"matchLabels": {CONTROLLER_UID: uid}});
        let template = &mut spec["template"];
        if !template["metadata"].is_object() {
            template["metadata"] = json!({});
        }
        let metadata = &mut template["metadata"];
        if !metadata["labels"].is_object() {
            metadata["labels"] = json!({});
        }
        for (key, value) in [
            (CONTROLLER_UID, &uid),
            (JOB_NAME, &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            metadata["labels"][key] = value.clone();
        }
    }
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "template", "metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", "template", "spec", rest @ ..] => super::pod::spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    if old.is_none() && !manual_selector(object) {
        // Generated after validation: a selector given is refused, the
        // template is checked without one.
        if !spec["selector"].is_null() {
            causes.push(Cause::invalid_rendered(
                "spec.selector",
                &spec["selector"].to_string(),
                "`selector` will be auto-generated",
            ));
        }
        causes.extend(validate_template(object));
    } else {
        causes.extend(super::replica_set::validate_selector_and_template(
            object, old, "Job",
        ));
        // The selector check above also checks the template; only the
        // restart policy differs (activeDeadlineSeconds is allowed).
        causes.retain(|c| {
            !c.field.ends_with("restartPolicy") && !c.field.ends_with("activeDeadlineSeconds")
        });
        causes.extend(restart_policy(object));
    }
    for field in ["parallelism", "completions", "backoffLimit"] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                "must be greater than or equal to 0",
            ));
        }
    }
    for field in ["activeDeadlineSeconds", "ttlSecondsAfterFinished"] {
        let least = i64::from(field == "activeDeadlineSeconds");
        if spec[field].as_i64().is_some_and(|n| n < least) {
            let detail = if least == 1 {
                "must be greater than 0"
            } else {
                "must be greater than or equal to 0"
            };
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                detail,
            ));
        }
    }
    match spec["completionMode"].as_str().unwrap_or("NonIndexed") {
        "NonIndexed" => {}
        "Indexed" => {
            if spec["completions"].is_null() {
                causes.push(Cause::required(
                    "spec.completions",
                    "when completion mode is Indexed",
                ));
            }
        }
        other => causes.push(unsupported(
            "spec.completionMode",
            other,
            "\"NonIndexed\", \"Indexed\"",
        )),
    }
    if let Some(old) = old {
        for (field, value) in [
            ("spec.template", &spec["template"], &old["spec"]["template"]),
            (
                "spec.completions",
                &spec["completions"],
                &old["spec"]["completions"],
            ),
            (
                "spec.completionMode",
                &spec["completionMode"],
                &old["spec"]["completionMode"],
            ),
        ]
        .map(|(f, new, old)| (f, (new, old)))
        {
            if value.0 != value.1 {
                causes.push(Cause::invalid_rendered(field, "", "field is immutable"));
            }
        }
    }
    causes
}

fn restart_policy(object: &Value) -> Vec<Cause> {
    let policy = object["spec"]["template"]["spec"]["restartPolicy"]
        .as_str()
        .unwrap_or("Always");
    if matches!(policy, "OnFailure" | "Never") {
        return Vec::new();
    }
    vec![unsupported(
        "spec.template.spec.restartPolicy",
        policy,
        "\"OnFailure\", \"Never\"",
    )]
}

fn validate_template(object: &Value) -> Vec<Cause> {
    let template = &object["spec"]["template"]["spec"];
    let mut causes = Vec::new();
    if template.is_null() {
        causes.push(Cause::required("spec.template.spec", ""));
        return causes;
    }
    causes.extend(crate::pod_spec::validate(template, "spec.template.spec"));
    causes.extend(restart_policy(object));
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    vec![
        NAME,
        col("Status", "Status of the job.", 0),
        col(
            "Completions",
            "The desired number of successfully finished pods the job should be run with.",
            0,
        ),
        col("Duration", "Time required to complete the job.", 0),
        AGE,
        col("Containers", "Names of each container in the template.", 1),
        col(
            "Images",
            "Images referenced by each container in the template.",
            1,
        ),
        col(
            "Selector",
            "A label query over pods that should match the pod count.",
            1,
        ),
    ]
}

/// The status word kubectl shows: the first finished or pending condition.
fn status_word(object: &Value) -> &'static str {
    let conditions = object["status"]["conditions"].as_array();
    let holds = |kind: &str| {
        conditions
            .into_iter()
            .flatten()
            .any(|c| c["type"] == kind && c["status"] == "True")
    };
    for (kind, word) in [
        ("Complete", "Complete"),
        ("Failed", "Failed"),
        ("FailureTarget", "FailureTarget"),
        ("SuccessCriteriaMet", "SuccessCriteriaMet"),
        ("Suspended", "Suspended"),
    ] {
        if holds(kind) {
            return word;
        }
    }
    if object["metadata"]["deletionTimestamp"].is_string() {
        return "Terminating";
    }
    "Running"
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let [names, images] = super::template_containers(&object["spec"]["template"]);
    let succeeded = int(object, &["status", "succeeded"]);
    let completions = match object["spec"]["completions"].as_i64() {
        Some(n) => format!("{succeeded}/{n}"),
        None => match object["spec"]["parallelism"].as_i64().unwrap_or(0) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let time = |field: &str| {
        object["status"][field]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_second())
    };
    let duration = match (time("startTime"), time("completionTime")) {
        (Some(start), Some(end)) => crate::table::human_duration(end - start),
        (Some(start), None) => crate::table::human_duration(now - start),
        _ => String::new(),
    };
    let selector = LabelSelector::from_api(&object["spec"]["selector"], "spec.selector")
        .map(|s| s.to_string())
        .unwrap_or_default();
    vec![
        name(object),
        json!(status_word(object)),
        json!(completions),
        json!(duration),
        age(object, now),
        names,
        images,
        json!(or_none(selector)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: Value) -> Value {
        let mut object = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "uid": "u-1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "pi", "image": "perl"}]}}}});
        for (key, value) in spec.as_object().unwrap() {
            object["spec"][key] = value.clone();
        }
        object
    }

    #[test]
    fn defaults_and_the_generated_selector() {
        let mut object = job(json!({}));
        defaults(&mut object);
        assert_eq!(object["spec"]["completions"], 1);
        assert_eq!(object["spec"]["parallelism"], 1);
        assert_eq!(object["spec"]["backoffLimit"], 6);
        assert_eq!(object["spec"]["completionMode"], "NonIndexed");
        assert!(
            validate(&object, None).is_empty(),
            "{:?}",
            validate(&object, None)
        );
        prepare_create(&mut object);
        assert_eq!(
            object["spec"]["selector"],
            json!({"matchLabels": {CONTROLLER_UID: "u-1"}})
        );
        assert_eq!(
            object["spec"]["template"]["metadata"]["labels"][JOB_NAME],
            "pi"
        );
        assert!(
            validate(&object, Some(&object)).is_empty(),
            "{:?}",
            validate(&object, Some(&object))
        );
        let mut parallel = job(json!({"parallelism": 3}));
        defaults(&mut parallel);
        assert!(parallel["spec"]["completions"].is_null(), "a work queue");
    }

    #[test]
    fn validation_as_kubernetes() {
        let mut always = job(json!({}));
        always["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
        assert!(validate(&always, None)[0]
            .display()
            .starts_with("spec.template.spec.restartPolicy: Unsupported value: \"Always\""));
        let given = job(json!({"selector": {"matchLabels": {"a": "b"}}}));
        assert!(validate(&given, None)[0]
            .display()
            .ends_with("`selector` will be auto-generated"));
        let indexed = job(json!({"completionMode": "Indexed"}));
        assert_eq!(
            validate(&indexed, None)[0].display(),
            "spec.completions: Required value: when completion mode is Indexed"
        );
        let mut object = job(json!({}));
        prepare_create(&mut object);
        let mut changed = object.clone();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("python");
        assert!(validate(&changed, Some(&object))
            .iter()
            .any(|c| c.display() == "spec.template: Invalid value: : field is immutable"));
    }

    #[test]
    fn table_shows_status_and_completions() {
        let mut object = job(json!({"completions": 5}));
        object["status"] = json!({"succeeded": 2, "startTime": "2026-11-27T10:00:00Z",
            "conditions": [{"type": "Complete", "status": "True"}]});
        let row = cells(
            &object,
            "2026-11-27T10:01:00Z"
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_second(),
        );
        assert_eq!(row[1], "Complete");
        assert_eq!(row[2], "2/5");
        assert_eq!(row[3], "60s");
    }
}
