//! A StatefulSet pod's stable identity, as upstream's
//! `stateful_set_utils.go`: the name `<set>-<ordinal>`, the hostname and
//! subdomain that give it `<name>.<service>.<namespace>.svc` in DNS, the
//! labels naming it and its index, and one claim per volume claim
//! template, `<template>-<set>-<ordinal>`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

/// The pod label with the pod's own name (a Service can select one pod).
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The pod label with the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The pod label with the name of the revision it runs.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The set a pod name belongs to and its ordinal: `web-12` → (`web`,
/// 12); `None` when the name does not end in `-<number>`.
pub fn parent_and_ordinal(name: &str) -> Option<(&str, i32)> {
    let (parent, ordinal) = name.rsplit_once('-')?;
    if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ordinal.parse().ok()?))
}

/// The claims of a set's pod, by volume name: `(template, claim name)`.
pub fn claims(set: &StatefulSet, ordinal: i32) -> Vec<(PersistentVolumeClaim, String)> {
    let set_name = set.name_any();
    let templates = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default();
    let mut claims: Vec<(PersistentVolumeClaim, String)> = templates
        .into_iter()
        .map(|template| {
            let name = format!("{}-{set_name}-{ordinal}", template.name_any());
            (template, name)
        })
        .collect();
    claims.sort_by_key(|(template, _)| template.name_any());
    claims
}

/// The claim a template makes for one pod: the template's labels with the
/// selector's on top, in the set's namespace.
pub fn claim(
    set: &StatefulSet,
    template: &PersistentVolumeClaim,
    name: &str,
) -> PersistentVolumeClaim {
    let mut claim = template.clone();
    let mut labels = claim.metadata.labels.take().unwrap_or_default();
    if let Some(selector) = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
    {
        labels.extend(selector);
    }
    claim.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: set.namespace(),
        labels: Some(labels),
        annotations: claim.metadata.annotations.take(),
        ..ObjectMeta::default()
    };
    claim.status = None;
    claim
}

/// The pod for `ordinal` from a revision's template.
pub fn new_pod(
    set: &StatefulSet,
    template: &PodTemplateSpec,
    ordinal: i32,
    revision: &str,
    owner: OwnerReference,
) -> Pod {
    let name = format!("{}-{ordinal}", set.name_any());
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), revision.into());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(name.clone());
    spec.subdomain = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    // Claim volumes replace template volumes of the same name.
    let claims = claims(set, ordinal);
    let mut volumes: Vec<Volume> = claims
        .iter()
        .map(|(template, claim_name)| Volume {
            name: template.name_any(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name.clone(),
                read_only: Some(false),
            }),
            ..Volume::default()
        })
        .collect();
    volumes.extend(
        spec.volumes
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !claims.iter().any(|(t, _)| t.name_any() == v.name)),
    );
    spec.volumes = (!volumes.is_empty()).then_some(volumes);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            finalizers: template_meta.finalizers,
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_the_name() {
        assert_eq!(parent_and_ordinal("web-0"), Some(("web", 0)));
        assert_eq!(parent_and_ordinal("my-db-12"), Some(("my-db", 12)));
        assert_eq!(parent_and_ordinal("web"), None);
        assert_eq!(parent_and_ordinal("web-"), None);
        assert_eq!(parent_and_ordinal("web-x1"), None);
        assert_eq!(parent_and_ordinal("web-99999999999"), None);
    }

    #[test]
    fn a_pod_has_its_name_hostname_labels_and_claims() {
        let set: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}},
                "template": {"metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx"}],
                        "volumes": [{"name": "www", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www", "labels": {"app": "other", "tier": "disk"}},
                    "spec": {"accessModes": ["ReadWriteOnce"]}}]}
        }))
        .unwrap();
        let template = set.spec.as_ref().unwrap().template.clone();
        let pod = new_pod(&set, &template, 2, "web-abc", OwnerReference::default());
        assert_eq!(pod.name_any(), "web-2");
        assert_eq!(pod.namespace().as_deref(), Some("shop"));
        let labels = pod.labels();
        assert_eq!(labels[POD_NAME_LABEL], "web-2");
        assert_eq!(labels[POD_INDEX_LABEL], "2");
        assert_eq!(labels[REVISION_LABEL], "web-abc");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "www-web-2"
        );
        assert_eq!(volumes[1].name, "cache");

        let (claim_template, name) = &claims(&set, 2)[0];
        let claim = claim(&set, claim_template, name);
        assert_eq!(claim.name_any(), "www-web-2");
        assert_eq!(claim.labels()["app"], "nginx");
        assert_eq!(claim.labels()["tier"], "disk");
    }
}
