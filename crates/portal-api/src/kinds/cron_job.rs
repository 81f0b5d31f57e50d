//! CronJobs (`batch/v1`): a Job made from a template on a cron schedule
//! (in a time zone), with a concurrency policy, a starting deadline and
//! history limits. Defaults and validation as Kubernetes'.

use serde_json::{json, Value};

use crate::cron::Schedule;
use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("batch", "CronJob");

/// Job names add 11 characters (`-<minutes>`) to the CronJob's.
const MAX_NAME: usize = 52;

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "cronjobs",
    singular: "cronjob",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["cj"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::batch::v1::CronJob>,
    openapi_schema: openapi_schema::<k8s_openapi::api::batch::v1::CronJob>,
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
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "concurrencyPolicy", json!("Allow"));
    default(spec, "suspend", json!(false));
    default(spec, "successfulJobsHistoryLimit", json!(3));
    default(spec, "failedJobsHistoryLimit", json!(1));
    if let Some(job) = object
        .pointer_mut("/spec/jobTemplate/spec")
        .filter(|s| s.is_object())
    {
        default(job, "backoffLimit", json!(6));
        default(job, "completionMode", json!("NonIndexed"));
        default(job, "suspend", json!(false));
        if job.get("completions").is_none() && job.get("parallelism").is_none() {
            job["completions"] = json!(1);
        }
        default(job, "parallelism", json!(1));
        let replacement = if job.get("podFailurePolicy").is_some() {
            "Failed"
        } else {
            "TerminatingOrFailed"
        };
        default(job, "podReplacementPolicy", json!(replacement));
    }
    if let Some(pod) = object.pointer_mut("/spec/jobTemplate/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "jobTemplate", "spec", "template", "spec", rest @ ..] => {
            super::pod::spec_list_strategy(rest)
        }
        ["status", "active"] => ListStrategy::MergeKey("uid"),
        _ => ListStrategy::Replace,
    }
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    if object["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n.len() > MAX_NAME)
    {
        causes.push(Cause::invalid(
            "metadata.name",
            object["metadata"]["name"].clone(),
            "must be no more than 52 characters",
        ));
    }
    match spec["schedule"].as_str() {
        None | Some("") => causes.push(Cause::required("spec.schedule", "")),
        Some(schedule) if schedule.contains("TZ") => causes.push(Cause::invalid(
            "spec.schedule",
            schedule,
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
        )),
        Some(schedule) => {
            if let Err(error) = Schedule::parse(schedule) {
                causes.push(Cause::invalid("spec.schedule", schedule, &error));
            }
        }
    }
    if let Some(zone) = spec["timeZone"].as_str() {
        if zone.is_empty() || jiff::tz::TimeZone::get(zone).is_err() {
            causes.push(Cause::invalid(
                "spec.timeZone",
                zone,
                &format!("unknown time zone {zone}"),
            ));
        }
    }
    let policy = spec["concurrencyPolicy"].as_str().unwrap_or("Allow");
    if !matches!(policy, "Allow" | "Forbid" | "Replace") {
        causes.push(unsupported(
            "spec.concurrencyPolicy",
            policy,
            "\"Allow\", \"Forbid\", \"Replace\"",
        ));
    }
    for field in [
        "startingDeadlineSeconds",
        "successfulJobsHistoryLimit",
        "failedJobsHistoryLimit",
    ] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let template = &spec["jobTemplate"]["spec"]["template"]["spec"];
    if template.is_null() {
        causes.push(Cause::required("spec.jobTemplate.spec.template.spec", ""));
    } else {
        causes.extend(crate::pod_spec::validate(
            template,
            "spec.jobTemplate.spec.template.spec",
        ));
        let restart = template["restartPolicy"].as_str().unwrap_or("Always");
        if !matches!(restart, "OnFailure" | "Never") {
            causes.push(unsupported(
                "spec.jobTemplate.spec.template.spec.restartPolicy",
                restart,
                "\"OnFailure\", \"Never\"",
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
            "Schedule",
            "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
            0,
        ),
        col("Timezone", "The time zone name for the given schedule.", 0),
        col(
            "Suspend",
            "This flag tells the controller to suspend subsequent executions, it does not \
             apply to already started executions.  Defaults to false.",
            0,
        ),
        col("Active", "A list of pointers to currently running jobs.", 0),
        col(
            "Last Schedule",
            "Information when was the last time the job was successfully scheduled.",
            0,
        ),
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

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let [names, images] =
        super::template_containers(&object["spec"]["jobTemplate"]["spec"]["template"]);
    let last = object["status"]["lastScheduleTime"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| crate::table::human_duration(now - t.as_second()))
        .unwrap_or_else(|| "<none>".into());
    vec![
        name(object),
        json!(object["spec"]["schedule"].as_str().unwrap_or("")),
        json!(object["spec"]["timeZone"].as_str().unwrap_or("<none>")),
        json!(if object["spec"]["suspend"] == true {
            "True"
        } else {
            "False"
        }),
        json!(arr(object, &["status", "active"]).len()),
        json!(last),
        age(object, now),
        names,
        images,
        json!("<none>"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron_job(schedule: &str) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}}}})
    }

    #[test]
    fn defaults_validation_and_table() {
        let mut object = cron_job("*/1 * * * *");
        defaults(&mut object);
        assert_eq!(object["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(object["spec"]["successfulJobsHistoryLimit"], 3);
        assert_eq!(object["spec"]["jobTemplate"]["spec"]["backoffLimit"], 6);
        assert!(
            validate(&object, None).is_empty(),
            "{:?}",
            validate(&object, None)
        );
        let bad = cron_job("every minute");
        assert!(validate(&bad, None)[0]
            .display()
            .starts_with("spec.schedule: Invalid value: \"every minute\""));
        let mut zone = cron_job("0 9 * * *");
        zone["spec"]["timeZone"] = json!("Mars/Olympus");
        assert!(validate(&zone, None)[0]
            .display()
            .contains("unknown time zone Mars/Olympus"));
        let tz = cron_job("TZ=UTC 0 9 * * *");
        assert!(validate(&tz, None)[0]
            .display()
            .contains("use timeZone field instead"));
        let row = cells(&object, 0);
        assert_eq!(row[1], "*/1 * * * *");
        assert_eq!(row[2], "<none>");
        assert_eq!(row[3], "False");
        assert_eq!(row[5], "<none>");
    }
}
