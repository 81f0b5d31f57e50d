//! Unit tests of the status computation.

use super::*;
use crate::runtime::ContainerMeta;
use crate::shim::Started;
use serde_json::json;

fn pod(policy: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"restartPolicy": policy, "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}
    }))
    .unwrap()
}

fn instance(name: &str, attempt: u32, state: State) -> ContainerStatus {
    ContainerStatus {
        id: format!("{name}{attempt}"),
        meta: ContainerMeta {
            pod_uid: "u".into(),
            pod_namespace: "default".into(),
            pod_name: "p".into(),
            name: name.into(),
            attempt,
            image: "busybox".into(),
            image_id: "busybox@sha256:00".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            log_path: "/l".into(),
            stop_signal: None,
            termination_message: None,
        },
        state,
    }
}

fn running() -> State {
    State::Running(Started {
        pid: 1,
        started_at: "2026-01-01T00:00:01Z".into(),
    })
}

fn exited(code: i32) -> State {
    State::Exited {
        started: None,
        exit: Exit {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: String::new(),
            finished_at: "2026-01-01T00:00:02Z".into(),
        },
    }
}

fn observe<'a>(
    pod: &'a Pod,
    containers: &'a [ContainerStatus],
    waiting: &'a HashMap<String, Waiting>,
) -> PodStatus {
    compute(&Observed {
        pod,
        containers,
        waiting,
        verdicts: &HashMap::new(),
        sandbox_ready: true,
        pod_ips: vec!["10.244.0.5".into()],
        host_ips: vec!["192.168.1.2".into()],
        start_time: jiff::Timestamp::UNIX_EPOCH,
        ended: None,
    })
}

fn condition(status: &PodStatus, type_: &str) -> String {
    status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap()
        .status
        .clone()
}

#[test]
fn running_and_ready_when_every_container_runs() {
    let pod = pod("Always");
    let none = HashMap::new();
    let status = observe(
        &pod,
        &[instance("a", 0, running()), instance("b", 0, running())],
        &none,
    );
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&status, "Ready"), "True");
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.0.5"));
    let one = observe(&pod, &[instance("a", 0, running())], &none);
    assert_eq!(condition(&one, "Ready"), "False");
    assert_eq!(
        one.phase.as_deref(),
        Some("Pending"),
        "a container still to start"
    );
    assert_eq!(
        one.container_statuses.unwrap()[1]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("ContainerCreating")
    );
}

#[test]
fn completed_failed_and_restarting() {
    let never = pod("Never");
    let none = HashMap::new();
    let done = observe(
        &never,
        &[instance("a", 0, exited(0)), instance("b", 0, exited(0))],
        &none,
    );
    assert_eq!(done.phase.as_deref(), Some("Succeeded"));
    let about_to_restart = observe(
        &pod("Always"),
        &[instance("a", 0, exited(1)), instance("b", 0, exited(0))],
        &none,
    );
    assert_eq!(about_to_restart.phase.as_deref(), Some("Running"));
    let retried = observe(
        &pod("OnFailure"),
        &[instance("a", 0, exited(1)), instance("b", 0, exited(0))],
        &none,
    );
    assert_eq!(retried.phase.as_deref(), Some("Running"));
    let failed = observe(
        &never,
        &[instance("a", 0, exited(0)), instance("b", 0, exited(1))],
        &none,
    );
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    let always = pod("Always");
    let waiting = HashMap::from([(
        "b".to_owned(),
        Waiting {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 10s".into(),
        },
    )]);
    let status = observe(
        &always,
        &[instance("a", 0, running()), instance("b", 0, exited(1))],
        &waiting,
    );
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let b = &status.container_statuses.unwrap()[1];
    assert_eq!(
        b.restart_count, 0,
        "no restart yet: the ended instance waits to be replaced"
    );
    assert_eq!(
        b.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("CrashLoopBackOff")
    );
    assert_eq!(
        b.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
    let restarted = observe(
        &always,
        &[
            instance("a", 0, running()),
            instance("b", 0, exited(1)),
            instance("b", 1, running()),
        ],
        &none,
    );
    let b = &restarted.container_statuses.unwrap()[1];
    assert_eq!(b.restart_count, 1);
    assert!(b.state.as_ref().unwrap().running.is_some());
    assert_eq!(
        b.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
}
