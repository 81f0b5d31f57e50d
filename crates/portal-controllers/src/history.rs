//! ControllerRevisions: the numbered pod templates a DaemonSet or a
//! StatefulSet has run, as upstream's `controller/history`. Each holds a
//! strategic merge patch that puts its template back (what `kubectl
//! rollout undo` applies); the newest number is the current template, and
//! an old template that comes back is re-numbered rather than copied.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use portal_api::selector::LabelSelector;
use serde_json::Value;

use crate::deployment::revision::template_hash;
use crate::ReconcileError as Error;

/// One owner's revisions, read from the shared ControllerRevision cache.
pub struct History<'a> {
    pub client: &'a Client,
    pub revisions: &'a Store<ControllerRevision>,
    pub namespace: &'a str,
    /// The owner's controller reference, put on the revisions it makes.
    pub owner: OwnerReference,
    /// The label that carries a revision's hash: `controller-revision-hash`
    /// for DaemonSets, `controller.kubernetes.io/hash` for StatefulSets.
    pub hash_label: &'static str,
}

impl std::fmt::Debug for History<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("namespace", &self.namespace)
            .field("owner", &self.owner.name)
            .finish_non_exhaustive()
    }
}

impl History<'_> {
    /// The revisions the owner controls and its selector matches, oldest
    /// (lowest number) first.
    pub fn owned(&self, selector: &LabelSelector) -> Vec<Arc<ControllerRevision>> {
        let mut owned: Vec<Arc<ControllerRevision>> = self
            .revisions
            .state()
            .into_iter()
            .filter(|r| r.namespace().as_deref() == Some(self.namespace))
            .filter(|r| {
                crate::controller_of(r.owner_references()).is_some_and(|o| o.uid == self.owner.uid)
            })
            .filter(|r| crate::selects(Some(selector), r.labels()))
            .collect();
        owned.sort_by(|a, b| {
            (a.revision, &a.metadata.creation_timestamp, a.name_any()).cmp(&(
                b.revision,
                &b.metadata.creation_timestamp,
                b.name_any(),
            ))
        });
        owned
    }

    /// The revision of `template`: an existing one (the newest copy, its
    /// duplicates deleted, re-numbered above the others if it is not the
    /// newest) or a new one numbered above them. `None` when another
    /// template already has the name this one hashes to: the owner must
    /// count the collision in its status and try again.
    pub async fn revision_of(
        &self,
        selector: &LabelSelector,
        template: &PodTemplateSpec,
        annotations: Option<&BTreeMap<String, String>>,
        collision_count: Option<i32>,
    ) -> Result<Option<ControllerRevision>, Error> {
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), self.namespace);
        let owned = self.owned(selector);
        let data = patch_of(template);
        let max = owned.iter().map(|r| r.revision).max().unwrap_or(0);
        let mut same: Vec<&Arc<ControllerRevision>> = owned
            .iter()
            .filter(|r| r.data.as_ref().map(|d| &d.0) == Some(&data))
            .collect();
        if let Some(current) = same.pop() {
            for duplicate in same {
                ignore_missing(
                    api.delete(&duplicate.name_any(), &DeleteParams::default())
                        .await,
                )?;
            }
            if current.revision < max {
                let mut renumbered = (**current).clone();
                renumbered.revision = max + 1;
                return Ok(Some(
                    api.replace(&current.name_any(), &PostParams::default(), &renumbered)
                        .await?,
                ));
            }
            return Ok(Some((**current).clone()));
        }
        let hash = template_hash(template, collision_count);
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(self.hash_label.into(), hash.clone());
        let revision = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", truncated(&self.owner.name))),
                namespace: Some(self.namespace.to_owned()),
                labels: Some(labels),
                annotations: annotations.cloned().map(|mut a| {
                    a.remove("kubectl.kubernetes.io/last-applied-configuration");
                    a
                }),
                owner_references: Some(vec![self.owner.clone()]),
                ..ObjectMeta::default()
            },
            data: Some(RawExtension(data.clone())),
            revision: max + 1,
        };
        match api.create(&PostParams::default(), &revision).await {
            Ok(created) => Ok(Some(created)),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = api.get(&revision.name_any()).await?;
                let ours = crate::controller_of(existing.owner_references())
                    .is_some_and(|o| o.uid == self.owner.uid);
                Ok(
                    (ours && existing.data.as_ref().map(|d| &d.0) == Some(&data))
                        .then_some(existing),
                )
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the oldest revisions `keep` does not hold on to (the
    /// current ones, those pods still run) beyond `limit`.
    pub async fn truncate(
        &self,
        selector: &LabelSelector,
        keep: impl Fn(&ControllerRevision) -> bool,
        limit: i32,
    ) -> Result<(), Error> {
        let old: Vec<Arc<ControllerRevision>> = self
            .owned(selector)
            .into_iter()
            .filter(|r| !keep(r))
            .collect();
        let limit = usize::try_from(limit).unwrap_or(0);
        if old.len() <= limit {
            return Ok(());
        }
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), self.namespace);
        for revision in old.iter().take(old.len() - limit) {
            ignore_missing(
                api.delete(&revision.name_any(), &DeleteParams::default())
                    .await,
            )?;
        }
        Ok(())
    }
}

/// The owner's name as the prefix of a revision name: short enough that
/// `-<hash>` still fits in 253 characters, as upstream cuts it.
fn truncated(name: &str) -> &str {
    let end = name
        .char_indices()
        .nth(223)
        .map_or(name.len(), |(index, _)| index);
    &name[..end]
}

/// The hash a revision carries in `label`, or its name when it has none.
pub fn hash_of(revision: &ControllerRevision, label: &str) -> String {
    revision
        .labels()
        .get(label)
        .cloned()
        .unwrap_or_else(|| revision.name_any())
}

/// A revision's data, as upstream's `getPatch`: a strategic merge patch
/// that replaces the owner's whole template.
pub fn patch_of(template: &PodTemplateSpec) -> Value {
    let mut template = serde_json::to_value(template).unwrap_or_default();
    if let Some(map) = template.as_object_mut() {
        map.insert("$patch".into(), "replace".into());
    }
    serde_json::json!({"spec": {"template": template}})
}

/// The template a revision puts back.
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision.data.as_ref()?.0.pointer("/spec/template")?.clone();
    template.as_object_mut()?.remove("$patch");
    serde_json::from_value(template).ok()
}

fn ignore_missing<T>(result: Result<T, kube::Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_puts_its_template_back() {
        let template: PodTemplateSpec = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
        }))
        .unwrap();
        let revision = ControllerRevision {
            data: Some(RawExtension(patch_of(&template))),
            ..ControllerRevision::default()
        };
        assert_eq!(
            revision.data.as_ref().unwrap().0["spec"]["template"]["$patch"],
            "replace"
        );
        assert_eq!(template_of(&revision), Some(template));
        assert_eq!(truncated(&"x".repeat(300)).len(), 223);
        assert_eq!(truncated("web"), "web");
    }
}
