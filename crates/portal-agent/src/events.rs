//! The agent's Events: about its pods (a static pod's name its mirror pod,
//! so `kubectl describe` of the mirror shows them) and about its Node.
//! Until the Node is registered they only go to the log: with no API
//! server, or none answering yet, waiting on one would hold pods up.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::ResourceExt;
use portal_controllers::events::Recorder;

use crate::mirror::Mirrors;
use crate::status::StatusManager;

/// Where the agent's Events go.
#[derive(Debug)]
pub(crate) struct Events {
    recorder: Option<Recorder>,
    node: String,
    /// The Node's UID once registered (kept with the mirror pods).
    mirrors: Arc<Mirrors>,
    /// Which mirror pod stands for a static pod.
    status: Arc<StatusManager>,
}

impl Events {
    pub(crate) fn new(
        recorder: Option<Recorder>,
        node: String,
        mirrors: Arc<Mirrors>,
        status: Arc<StatusManager>,
    ) -> Events {
        Events {
            recorder,
            node,
            mirrors,
            status,
        }
    }

    fn recorder(&self) -> Option<&Recorder> {
        self.mirrors.node_uid.get()?;
        self.recorder.as_ref()
    }

    /// Records an Event about this node (its Node object).
    pub(crate) async fn node_event(&self, kind: &str, reason: &str, message: &str) {
        let Some(recorder) = self.recorder() else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: self.mirrors.node_uid.get().cloned(),
            ..ObjectReference::default()
        };
        recorder.record(&reference, kind, reason, message).await;
    }

    /// Records an Event about the pod (and one of its containers).
    pub(crate) async fn pod_event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: self
                .status
                .mirror_of(pod.metadata.uid.as_deref().unwrap_or_default())
                .or_else(|| pod.metadata.uid.clone()),
            field_path: container.map(|c| format!("spec.containers{{{c}}}")),
            ..ObjectReference::default()
        };
        match self.recorder() {
            Some(recorder) => recorder.record(&reference, kind, reason, message).await,
            None => {
                let pod = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                tracing::info!(%pod, kind, reason, message, "event");
            }
        }
    }
}
