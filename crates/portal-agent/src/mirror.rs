//! Mirror pods: for each static pod the agent runs, a copy in the API
//! (annotation `kubernetes.io/config.mirror` = the static pod's hash,
//! owned by the Node) so `kubectl get pods` shows it, Services select it
//! and its status is seen (the kubelet's `mirror_client.go` and the
//! static-pod part of `syncPod`).
//!
//! The API cannot change a static pod: a mirror that is deleted, or no
//! longer matches its static pod's hash, is deleted for good (grace 0,
//! its UID as precondition) and made anew; the static pod keeps running.
//! Mirrors of static pods this node no longer runs are deleted.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::sources::{mirror_hash, Desired, CONFIG_HASH, CONFIG_MIRROR};
use crate::status::StatusManager;
use crate::wake::PodWaker;

/// Mirrors are checked at least this often.
const RESYNC: Duration = Duration::from_secs(10);

type Key = (String, String);

fn key(pod: &Pod) -> Key {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The API's mirror pods on this node, as the API source last saw them.
#[derive(Debug, Default)]
pub(crate) struct Mirrors {
    pods: Mutex<HashMap<Key, Arc<Pod>>>,
    /// The API source has listed them once.
    listed: AtomicBool,
    /// The Node's UID once it is registered (mirrors are owned by it).
    pub node_uid: OnceLock<String>,
    wake: Notify,
}

impl Mirrors {
    pub(crate) fn apply(&self, pod: Pod) {
        self.pods.lock().insert(key(&pod), Arc::new(pod));
        self.wake.notify_one();
    }

    pub(crate) fn delete(&self, pod: &Pod) {
        let mut pods = self.pods.lock();
        if pods.get(&key(pod)).map(|p| &p.metadata.uid) == Some(&pod.metadata.uid) {
            pods.remove(&key(pod));
        }
        drop(pods);
        self.wake.notify_one();
    }

    pub(crate) fn relisted(&self, pods: Vec<Pod>) {
        *self.pods.lock() = pods.into_iter().map(|p| (key(&p), Arc::new(p))).collect();
        self.listed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Asks for a check now (a static pod came or went).
    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }

    fn snapshot(&self) -> HashMap<Key, Arc<Pod>> {
        self.pods.lock().clone()
    }
}

/// What keeping the mirrors needs: the API's mirrors, the static pods,
/// where their status goes, and how to wake a static pod's worker.
#[derive(Clone)]
pub(crate) struct Mirroring {
    pub mirrors: Arc<Mirrors>,
    pub desired: Arc<Desired>,
    pub status: Arc<StatusManager>,
    pub waker: PodWaker,
    /// This node's name.
    pub node: String,
    pub client: Client,
}

/// Keeps the mirrors in line with the static pods for as long as the agent
/// runs (from when the Node is registered and the API's pods are listed).
pub(crate) async fn run(ctx: Mirroring) {
    loop {
        tokio::select! {
            () = ctx.mirrors.wake.notified() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        let Some(node_uid) = ctx.mirrors.node_uid.get().cloned() else {
            continue;
        };
        if !ctx.mirrors.listed.load(Ordering::Acquire) {
            continue;
        }
        sync(&ctx, &node_uid).await;
    }
}

async fn sync(ctx: &Mirroring, node_uid: &str) {
    let client = &ctx.client;
    let mut mirrors = ctx.mirrors.snapshot();
    for pod in ctx.desired.statics() {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        match mirrors.remove(&key(&pod)) {
            Some(mirror)
                if mirror_hash(&mirror) == Some(uid.as_str())
                    && mirror.metadata.deletion_timestamp.is_none() =>
            {
                let mirror_uid = mirror.metadata.uid.clone().unwrap_or_default();
                if ctx.status.link_mirror(&uid, &mirror_uid) {
                    // Its worker writes the status to the new mirror.
                    ctx.waker.wake(&uid);
                }
            }
            Some(stale) => {
                ctx.status.unlink_mirror(&uid);
                delete(client, &stale).await;
            }
            None => {
                ctx.status.unlink_mirror(&uid);
                create(client, &pod, &ctx.node, node_uid).await;
            }
        }
    }
    // Mirrors of static pods this node does not run (any more): only once
    // every source has been read (a pod not yet read from its file or URL
    // is no orphan), as the kubelet's housekeeping waits.
    if ctx.desired.all_ready() {
        for orphan in mirrors.values() {
            delete(client, orphan).await;
        }
    }
}

/// The mirror of a static pod: its metadata and spec, the mirror
/// annotation, owned by the Node (so it goes with the Node).
fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut annotations: BTreeMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations.get(CONFIG_HASH).cloned().unwrap_or_default();
    annotations.insert(CONFIG_MIRROR.to_owned(), hash);
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_owned(),
                uid: node_uid.to_owned(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

async fn create(client: &Client, pod: &Pod, node: &str, node_uid: &str) {
    let mirror = mirror_of(pod, node, node_uid);
    let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
    let name = mirror.metadata.name.clone().unwrap_or_default();
    let api = Api::<Pod>::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), &mirror).await {
        Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "mirror pod created"),
        Err(error) => {
            tracing::warn!(%error, pod = %format!("{namespace}/{name}"), "creating the mirror pod failed; retrying")
        }
    }
}

/// Deletes a mirror for good (grace 0, only this UID).
async fn delete(client: &Client, mirror: &Pod) {
    let (namespace, name) = key(mirror);
    let api = Api::<Pod>::namespaced(client.clone(), &namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: mirror.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "mirror pod deleted"),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
        Err(error) => {
            tracing::warn!(%error, pod = %format!("{namespace}/{name}"), "deleting the mirror pod failed; retrying")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_copies_the_static_pod_and_names_its_hash_and_node() {
        let origin = crate::sources::manifest::Origin {
            node: "n1",
            source: crate::sources::Source::File,
            location: "/m/web.yaml",
        };
        let manifest = "metadata: {name: web, labels: {app: web}}\nspec: {containers: [{name: c, image: x}]}\n";
        let pod = crate::sources::manifest::read(manifest.as_bytes(), origin)
            .unwrap()
            .remove(0);
        let mirror = mirror_of(&pod, "n1", "node-uid");
        assert!(crate::sources::is_mirror(&mirror) && !crate::sources::is_mirror(&pod));
        assert_eq!(mirror_hash(&mirror), pod.metadata.uid.as_deref());
        assert_eq!(
            mirror.metadata.uid, None,
            "the API server gives it a UID of its own"
        );
        assert_eq!(mirror.metadata.name.as_deref(), Some("web-n1"));
        assert_eq!(mirror.metadata.labels, pod.metadata.labels);
        let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert_eq!(mirror.spec, pod.spec);
    }

    #[test]
    fn a_deletion_of_an_older_mirror_does_not_forget_the_new_one() {
        let mirrors = Mirrors::default();
        let pod = |uid: &str| Pod {
            metadata: ObjectMeta {
                name: Some("web-n1".into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                annotations: Some([(CONFIG_MIRROR.to_owned(), "h".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        mirrors.apply(pod("new"));
        mirrors.delete(&pod("old"));
        assert_eq!(mirrors.snapshot().len(), 1);
        mirrors.delete(&pod("new"));
        assert!(mirrors.snapshot().is_empty());
    }
}
