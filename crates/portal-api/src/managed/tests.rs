use super::*;
use serde_json::json;

fn writer(manager: &str) -> Writer<'_> {
    Writer {
        manager,
        api_version: "v1",
        subresource: None,
        has_status: true,
        now: "2026-11-23T10:00:00Z",
    }
}

fn managers(object: &Value) -> Vec<(String, String)> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap().to_owned(),
                        e["operation"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fields_of(object: &Value, manager: &str) -> Value {
    object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == manager)
        .map(|e| e["fieldsV1"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn create_and_update_record_their_managers() {
    let mut created = json!({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"replicas": 1}, "status": {"replicas": 0}});
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &json!({}),
        &mut created,
        &writer("kubectl-create"),
    )
    .unwrap();
    assert_eq!(
        fields_of(&created, "kubectl-create"),
        json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {"f:replicas": {}}})
    );
    let mut labelled = created.clone();
    labelled["metadata"]["labels"]["b"] = json!("2");
    labelled["metadata"]["labels"]["a"] = json!("changed");
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &created,
        &mut labelled,
        &writer("kubectl-label"),
    )
    .unwrap();
    assert_eq!(
        managers(&labelled),
        vec![
            ("kubectl-create".into(), "Update".into()),
            ("kubectl-label".into(), "Update".into())
        ]
    );
    // The changed label moved to the writer; the new one is its.
    assert_eq!(
        fields_of(&labelled, "kubectl-label"),
        json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}})
    );
    assert_eq!(
        fields_of(&labelled, "kubectl-create"),
        json!({"f:metadata": {"f:labels": {}}, "f:spec": {"f:replicas": {}}})
    );
    // A write that removes everything someone owned removes its entry.
    let mut relabelled = labelled.clone();
    relabelled["metadata"]["labels"] = json!({"a": "changed", "b": "2", "c": "3"});
    relabelled["spec"]["replicas"] = json!(2);
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &labelled,
        &mut relabelled,
        &writer("kubectl-label"),
    )
    .unwrap();
    assert_eq!(
        fields_of(&relabelled, "kubectl-create")["f:spec"],
        Value::Null
    );
}

#[test]
fn managed_fields_in_a_request_replace_or_clear() {
    let mut created = json!({"metadata": {"name": "s"}, "spec": {"replicas": 1}});
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &json!({}),
        &mut created,
        &writer("a"),
    )
    .unwrap();
    let mut cleared = created.clone();
    cleared["metadata"]["managedFields"] = json!([{}]);
    cleared["spec"]["replicas"] = json!(2);
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &created,
        &mut cleared,
        &writer("b"),
    )
    .unwrap();
    assert!(cleared["metadata"].get("managedFields").is_none());
    let mut bad = created.clone();
    bad["metadata"]["managedFields"] = json!([{"manager": "x", "operation": "Delete"}]);
    assert!(track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &created,
        &mut bad,
        &writer("b")
    )
    .is_err());
}

#[test]
fn apply_merges_owns_and_conflicts() {
    let config = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": {"app": "web"}},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}});
    let created = apply(
        &crate::kinds::service::RESOURCE,
        &json!({}),
        &config,
        &writer("kubectl"),
        false,
    )
    .unwrap();
    assert_eq!(managers(&created), vec![("kubectl".into(), "Apply".into())]);
    assert_eq!(
        fields_of(&created, "kubectl")["f:spec"]["f:ports"],
        json!({"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}}})
    );

    // Someone else changes a label the applier owns, and adds a port.
    let mut edited = created.clone();
    edited["metadata"]["labels"]["app"] = json!("other");
    edited["spec"]["ports"] = json!([{"port": 80}, {"port": 81, "protocol": "TCP"}]);
    track_update(
        &crate::kinds::service::RESOURCE,
        &created,
        &mut edited,
        &writer("kubectl-edit"),
    )
    .unwrap();

    // Applying the old value again conflicts with the editor.
    let Err(ApplyError::Conflicts(conflicts)) = apply(
        &crate::kinds::service::RESOURCE,
        &edited,
        &config,
        &writer("kubectl"),
        false,
    ) else {
        panic!("expected a conflict")
    };
    assert_eq!(
        conflicts,
        vec![Conflict {
            manager: "\"kubectl-edit\" using v1".into(),
            field: ".metadata.labels.app".into()
        }]
    );
    assert_eq!(
        conflict_message(&conflicts),
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1: .metadata.labels.app"
    );

    // Forced: the value is the applier's again, the editor keeps its port.
    let forced = apply(
        &crate::kinds::service::RESOURCE,
        &edited,
        &config,
        &writer("kubectl"),
        true,
    )
    .unwrap();
    assert_eq!(forced["metadata"]["labels"]["app"], "web");
    assert_eq!(forced["spec"]["ports"].as_array().unwrap().len(), 2);
    assert_eq!(
        fields_of(&forced, "kubectl-edit"),
        json!({"f:spec": {"f:ports": {"k:{\"port\":81,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}, "f:protocol": {}}}}})
    );

    // Dropping a field from the configuration removes it (nobody else owns it).
    let mut smaller = config.clone();
    smaller["metadata"]["labels"] = json!({});
    smaller["spec"].as_object_mut().unwrap().remove("selector");
    let pruned = apply(
        &crate::kinds::service::RESOURCE,
        &forced,
        &smaller,
        &writer("kubectl"),
        false,
    )
    .unwrap();
    assert_eq!(pruned["metadata"]["labels"], json!({}));
    assert!(pruned["spec"].get("selector").is_none());
    assert_eq!(pruned["spec"]["ports"].as_array().unwrap().len(), 2);
}

#[test]
fn two_appliers_share_equal_values() {
    let config = json!({"metadata": {"name": "r"}, "spec": {"replicas": 3}});
    let first = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &json!({}),
        &config,
        &writer("a"),
        false,
    )
    .unwrap();
    let both = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &first,
        &config,
        &writer("b"),
        false,
    )
    .unwrap();
    assert_eq!(fields_of(&both, "a"), fields_of(&both, "b"));
    // `a` drops replicas: `b` still owns it, so it stays.
    let dropped = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &both,
        &json!({"metadata": {"name": "r"}}),
        &writer("a"),
        false,
    )
    .unwrap();
    assert_eq!(dropped["spec"]["replicas"], 3);
    // `b` changes it: nobody else owns it any more, no conflict.
    let changed = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &dropped,
        &json!({"metadata": {"name": "r"}, "spec": {"replicas": 5}}),
        &writer("b"),
        false,
    )
    .unwrap();
    assert_eq!(changed["spec"]["replicas"], 5);
}

#[test]
fn status_is_its_own_part() {
    let live = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Pending"}});
    let mut w = writer("agent");
    w.subresource = Some("status");
    let applied = apply(
        &crate::kinds::pod::RESOURCE,
        &live,
        &json!({"metadata": {"name": "p"}, "spec": {"x": 1}, "status": {"phase": "Running"}}),
        &w,
        false,
    )
    .unwrap();
    assert_eq!(applied["status"]["phase"], "Running");
    assert!(applied["spec"].get("x").is_none());
    assert_eq!(
        fields_of(&applied, "agent"),
        json!({"f:status": {"f:phase": {}}})
    );
    assert_eq!(
        applied["metadata"]["managedFields"][0]["subresource"],
        "status"
    );
}

#[test]
fn old_update_entries_are_merged() {
    let mut object = json!({"metadata": {"name": "s", "labels": {}}});
    for i in 0..12 {
        let mut next = object.clone();
        next["metadata"]["labels"][format!("l{i}")] = json!("x");
        let manager = format!("m{i}");
        let mut w = writer(&manager);
        let now = format!("2026-11-23T10:00:{i:02}Z");
        w.now = &now;
        track_update(&crate::kinds::service::RESOURCE, &object, &mut next, &w).unwrap();
        object = next;
    }
    let names: Vec<String> = managers(&object).into_iter().map(|(m, _)| m).collect();
    assert_eq!(names.len(), 10);
    assert!(names.contains(&"ancient-changes".to_owned()));
    assert!(!names.contains(&"m0".to_owned()) && names.contains(&"m11".to_owned()));
}

#[test]
fn the_kubectl_manager_keeps_the_last_applied_configuration() {
    let live = json!({"metadata": {"name": "s", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"old\":1}"}}});
    let config = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"type": "NodePort"}});
    let applied = apply(
        &crate::kinds::service::RESOURCE,
        &live,
        &config,
        &writer("kubectl"),
        false,
    )
    .unwrap();
    let remembered: Value = serde_json::from_str(
        applied["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(remembered, config);
    // Other managers, and objects without the annotation, are left alone.
    let other = apply(
        &crate::kinds::service::RESOURCE,
        &live,
        &config,
        &writer("flux"),
        false,
    )
    .unwrap();
    assert_eq!(
        other["metadata"]["annotations"],
        live["metadata"]["annotations"]
    );
    let fresh = apply(
        &crate::kinds::service::RESOURCE,
        &json!({}),
        &config,
        &writer("kubectl"),
        false,
    )
    .unwrap();
    assert!(fresh["metadata"].get("annotations").is_none());
}

#[test]
#[ignore = "timing, run by hand: cargo test --release -p portal-api managed::tests::cost -- --ignored --nocapture"]
fn cost_of_recording_a_create() {
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bench-1", "namespace": "default", "labels": {"app": "bench", "tier": "x"}},
        "spec": {"type": "ClusterIP", "selector": {"app": "bench"}, "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                 "sessionAffinity": "None", "internalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]},
        "status": {"loadBalancer": {}}});
    let start = std::time::Instant::now();
    let rounds = 100_000;
    for _ in 0..rounds {
        let mut object = service.clone();
        track_update(
            &crate::kinds::service::RESOURCE,
            &json!({}),
            &mut object,
            &writer("kubectl-create"),
        )
        .unwrap();
        std::hint::black_box(&object);
    }
    let create = start.elapsed() / rounds;
    let mut stored = service.clone();
    track_update(
        &crate::kinds::service::RESOURCE,
        &json!({}),
        &mut stored,
        &writer("kubectl-create"),
    )
    .unwrap();
    let start = std::time::Instant::now();
    for i in 0..rounds {
        let mut object = stored.clone();
        object["metadata"]["labels"]["tier"] = json!(i);
        track_update(
            &crate::kinds::service::RESOURCE,
            &stored,
            &mut object,
            &writer("kubectl-label"),
        )
        .unwrap();
        std::hint::black_box(&object);
    }
    let update = start.elapsed() / rounds;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(service.clone());
    }
    let clone = start.elapsed() / rounds;
    eprintln!("per create {create:?}, per update {update:?}, clone alone {clone:?}");
}

#[test]
fn review_findings_stay_fixed() {
    // An empty object the applier had, filled in by the next apply, stays.
    let first = json!({"metadata": {"name": "r"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]}}}});
    let live = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &json!({}),
        &first,
        &writer("a"),
        false,
    )
    .unwrap();
    let mut second = first.clone();
    second["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"cpu": "1"}});
    let filled = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &live,
        &second,
        &writer("a"),
        false,
    )
    .unwrap();
    assert_eq!(
        filled["spec"]["template"]["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "1"}})
    );

    // A keyed item without its key is refused, not appended again and again.
    let keyless = json!({"metadata": {"name": "r"}, "spec": {"template": {"spec": {"imagePullSecrets": [{}]}}}});
    let Err(ApplyError::Invalid(why)) = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &json!({}),
        &keyless,
        &writer("a"),
        false,
    ) else {
        panic!("expected a refusal")
    };
    assert!(why.contains("omits key field \"name\""), "{why}");
    // managedFields in a configuration are refused.
    let with_entries = json!({"metadata": {"name": "r", "managedFields": [{}]}});
    assert!(matches!(
        apply(
            &crate::kinds::replication_controller::RESOURCE,
            &json!({}),
            &with_entries,
            &writer("a"),
            false
        ),
        Err(ApplyError::Invalid(_))
    ));

    // Re-applying the same configuration changes nothing, whatever order the
    // entries were in (they are kept sorted).
    let mut updated = filled.clone();
    updated["metadata"]["labels"] = json!({"x": "1"});
    track_update(
        &crate::kinds::replication_controller::RESOURCE,
        &filled,
        &mut updated,
        &writer("kubectl-label"),
    )
    .unwrap();
    let again = apply(
        &crate::kinds::replication_controller::RESOURCE,
        &updated,
        &second,
        &writer("a"),
        false,
    )
    .unwrap();
    assert_eq!(again, updated);

    // A long keyed list merges by key (it was a scan per item).
    let ports: Vec<Value> = (0..5_000)
        .map(|p| json!({"containerPort": p, "protocol": "TCP"}))
        .collect();
    let big = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "ports": ports}]}});
    let applied = apply(
        &crate::kinds::pod::RESOURCE,
        &json!({}),
        &big,
        &writer("a"),
        false,
    )
    .unwrap();
    let reapplied = apply(
        &crate::kinds::pod::RESOURCE,
        &applied,
        &big,
        &writer("a"),
        false,
    )
    .unwrap();
    assert_eq!(
        reapplied["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .len(),
        5_000
    );
}
