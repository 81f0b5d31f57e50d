//! Where the agent's pods come from, merged into one desired set (the
//! kubelet's `config` package): the API server's pods bound to this node
//! (`api`), and static pods from manifest files (`file`), a manifest URL
//! (`http`) and manifests pushed to the agent's API (`endpoint`).
//!
//! The API source sends changes one by one; a static source always sends
//! its whole set, which replaces what it sent before. Static pods get
//! their identity from where they come from ([`manifest`]): a UID that
//! changes with their content, so an edited manifest is a new pod.

pub(crate) mod api;
pub mod file;
pub mod manifest;
pub mod url;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

pub use manifest::{Problem, CONFIG_HASH, CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE};

/// Whether an API pod is a mirror pod (the API's copy of a static pod).
pub(crate) fn is_mirror(pod: &Pod) -> bool {
    mirror_hash(pod).is_some()
}

/// The hash of the static pod a mirror pod copies.
pub(crate) fn mirror_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(CONFIG_MIRROR)
        .map(String::as_str)
}

/// What a static source read: its whole set (`None`: keep the last one,
/// as for a URL that cannot be reached), and what was wrong with the
/// manifests it skipped.
#[derive(Debug)]
pub struct Update {
    pub source: Source,
    pub pods: Option<Vec<Pod>>,
    pub problems: Vec<Problem>,
}

/// Where static sources send what they read.
pub type Updates = tokio::sync::mpsc::Sender<Update>;

/// Where a pod comes from (its `kubernetes.io/config.source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    Api,
    File,
    Url,
    Endpoint,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::File => "file",
            Source::Url => "http",
            Source::Endpoint => "endpoint",
        }
    }
}

struct Entry {
    pod: Arc<Pod>,
    source: Source,
}

/// What a static source's new set changed.
#[derive(Debug, Default)]
pub(crate) struct Replaced {
    /// UIDs of the pods that came.
    pub came: Vec<String>,
    /// The pods that went, by UID.
    pub gone: Vec<(String, Arc<Pod>)>,
    /// Pods refused: another source has a pod of that namespace/name.
    pub refused: Vec<Pod>,
}

impl Replaced {
    pub(crate) fn is_empty(&self) -> bool {
        self.came.is_empty() && self.gone.is_empty()
    }
}

/// The pods this node should run, by UID, and which sources have sent
/// their first set (the clean-up of what is left on the node waits for
/// all of them: a pod not yet read from its file is not a leftover).
#[derive(Default)]
pub(crate) struct Desired {
    pods: Mutex<HashMap<String, Entry>>,
    expected: Mutex<HashSet<Source>>,
    seen: Mutex<HashSet<Source>>,
}

impl std::fmt::Debug for Desired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Desired")
            .field("pods", &self.pods.lock().len())
            .finish_non_exhaustive()
    }
}

/// Whether two versions of a pod differ in more than their status (the
/// agent's own status writes come back through the watch and must not
/// wake its worker: the kubelet's sources filter them too).
fn differs(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
}

impl Desired {
    /// A desired set that waits for these sources before clean-up.
    pub(crate) fn expecting(sources: &[Source]) -> Self {
        let desired = Desired::default();
        desired.expected.lock().extend(sources.iter().copied());
        desired
    }

    pub(crate) fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.lock().get(uid).map(|e| e.pod.clone())
    }

    /// The pod by namespace and name.
    pub(crate) fn find(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods
            .lock()
            .values()
            .find(|e| {
                e.pod.metadata.namespace.as_deref() == Some(namespace)
                    && e.pod.metadata.name.as_deref() == Some(name)
            })
            .map(|e| e.pod.clone())
    }

    /// Records a pod of the API source; its UID when more than its status
    /// changed. Its `config.source` says `api`, whatever it carried (as
    /// the kubelet's merge does): only the agent makes static pods.
    pub(crate) fn set(&self, mut pod: Pod) -> Option<String> {
        let uid = pod.metadata.uid.clone()?;
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_SOURCE.to_owned(), Source::Api.name().to_owned());
        let mut pods = self.pods.lock();
        let changed = pods.get(&uid).is_none_or(|old| differs(&old.pod, &pod));
        let entry = Entry {
            pod: Arc::new(pod),
            source: Source::Api,
        };
        pods.insert(uid.clone(), entry);
        changed.then_some(uid)
    }

    pub(crate) fn remove(&self, uid: &str) {
        self.pods.lock().remove(uid);
    }

    /// Replaces everything `source` sent before with `pods`: what came
    /// (UIDs) and what went (the pods). A pod that stays keeps the version
    /// first seen (its `config.seen` time). A pod whose namespace/name
    /// another source's pod has is refused (the first one keeps it).
    pub(crate) fn replace(&self, source: Source, pods: Vec<Pod>) -> Replaced {
        let mut current = self.pods.lock();
        let taken: HashSet<(Option<String>, Option<String>)> = current
            .values()
            .filter(|e| e.source != source)
            .map(|e| {
                (
                    e.pod.metadata.namespace.clone(),
                    e.pod.metadata.name.clone(),
                )
            })
            .collect();
        let mut replaced = Replaced::default();
        let mut wanted: HashMap<String, Pod> = HashMap::new();
        for pod in pods {
            let name = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
            if taken.contains(&name) {
                replaced.refused.push(pod);
            } else if let Some(uid) = pod.metadata.uid.clone() {
                wanted.insert(uid, pod);
            }
        }
        current.retain(|uid, entry| {
            let keep = entry.source != source || wanted.contains_key(uid);
            if !keep {
                replaced.gone.push((uid.clone(), entry.pod.clone()));
            }
            keep
        });
        for (uid, pod) in wanted {
            // A static pod's UID is a hash of its content and origin: the
            // same UID is the same pod (only its `config.seen` is newer).
            if let std::collections::hash_map::Entry::Vacant(slot) = current.entry(uid.clone()) {
                slot.insert(Entry {
                    pod: Arc::new(pod),
                    source,
                });
                replaced.came.push(uid);
            }
        }
        drop(current);
        self.seen.lock().insert(source);
        replaced
    }

    /// The UIDs of every desired pod.
    pub(crate) fn uids(&self) -> Vec<String> {
        self.pods.lock().keys().cloned().collect()
    }

    /// The UIDs of one source's pods.
    pub(crate) fn uids_of(&self, source: Source) -> Vec<String> {
        self.pods
            .lock()
            .iter()
            .filter(|(_, e)| e.source == source)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The static pods (every source but the API).
    pub(crate) fn statics(&self) -> Vec<Arc<Pod>> {
        self.pods
            .lock()
            .values()
            .filter(|e| e.source != Source::Api)
            .map(|e| e.pod.clone())
            .collect()
    }

    /// Notes that `source` has sent its first full set; whether every
    /// expected source now has.
    pub(crate) fn source_ready(&self, source: Source) -> bool {
        let mut seen = self.seen.lock();
        seen.insert(source);
        self.expected.lock().iter().all(|s| seen.contains(s))
    }

    /// Whether every expected source has sent its first full set.
    pub(crate) fn all_ready(&self) -> bool {
        let seen = self.seen.lock();
        self.expected.lock().iter().all(|s| seen.contains(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_static_source_replaces_only_its_own_set() {
        let desired = Desired::expecting(&[Source::Api, Source::File]);
        desired.set(pod("api-1", "a"));
        let mut came = desired
            .replace(Source::File, vec![pod("f-1", "a"), pod("f-2", "a")])
            .came;
        came.sort();
        assert_eq!(came, ["f-1", "f-2"]);
        assert!(!desired.all_ready(), "the API has not listed yet");
        // The same set again changes nothing; a smaller one removes.
        assert!(desired
            .replace(Source::File, vec![pod("f-1", "a"), pod("f-2", "a")])
            .is_empty());
        let gone = desired.replace(Source::File, vec![pod("f-1", "a")]).gone;
        assert_eq!(gone[0].0, "f-2");
        // Another source's pod of a name already taken is refused.
        let mut same_name = pod("u-1", "a");
        same_name.metadata.name = Some("f-1".into());
        let replaced = desired.replace(Source::Url, vec![same_name]);
        assert!(replaced.came.is_empty() && replaced.refused.len() == 1);
        assert!(desired.get("api-1").is_some(), "other sources' pods stay");
        assert!(desired.source_ready(Source::Api));
        assert_eq!(desired.uids_of(Source::File), ["f-1"]);
    }

    #[test]
    fn a_status_only_change_does_not_wake_the_worker() {
        let desired = Desired::default();
        let mut claims_static = pod("a", "x");
        claims_static.metadata.annotations =
            Some([(CONFIG_SOURCE.to_owned(), "file".to_owned())].into());
        assert!(desired.set(claims_static).is_some());
        let stored = desired.get("a").unwrap();
        assert_eq!(
            stored.metadata.annotations.as_ref().unwrap()[CONFIG_SOURCE],
            "api",
            "only the agent makes static pods"
        );
        let mut with_status = pod("a", "x");
        with_status.status = Some(Default::default());
        assert!(desired.set(with_status).is_none());
        let mut relabelled = pod("a", "x");
        relabelled.metadata = ObjectMeta {
            labels: Some([("k".to_owned(), "v".to_owned())].into()),
            ..relabelled.metadata
        };
        assert!(desired.set(relabelled).is_some());
    }
}
