//! Feeds the change tracker from watches of Services and EndpointSlices
//! (so the proxy also runs against a real Kubernetes API server), and of
//! its own Node for its zone (topology hints), and wakes the runner. A
//! re-list drops what disappeared meanwhile. Objects are kept without
//! their `managedFields` (as kube-proxy's informers strip them): at
//! 10,000 Services and slices they were about 50 MiB the proxy never reads.

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_client::Change;
use tokio::sync::{watch, Notify};

use crate::metrics::Metrics;
use crate::model::ServiceKey;
use crate::tracker::Tracker;

#[derive(Debug)]
pub(crate) struct Feed {
    pub tracker: Arc<Mutex<Tracker>>,
    pub wake: Arc<Notify>,
    pub metrics: Arc<Metrics>,
}

impl Feed {
    fn changed(&self, tracker: &Tracker) {
        self.metrics.set_pending(tracker.pending());
        if tracker.has_changes() {
            self.metrics.queued();
            self.wake.notify_one();
        }
    }
}

/// Follows the resources until the process ends; `listed` turns true once
/// the initial lists of Services and slices are in.
pub(crate) async fn run(
    client: Client,
    feed: Feed,
    listed: watch::Sender<bool>,
    node: Option<String>,
) {
    let zone = async {
        let Some(node) = node else {
            return;
        };
        let nodes = watcher(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node}")),
        )
        .default_backoff();
        let (unused, _) = watch::channel(false);
        follow(nodes, &feed, &unused, |tracker, event| match event {
            Change::Put(n) | Change::Listed(n) => {
                tracker.set_zone(
                    n.labels()
                        .get(portal_client::labels::TOPOLOGY_ZONE)
                        .cloned(),
                );
            }
            Change::Gone(_) => tracker.set_zone(None),
            Change::Relisted(_) => {}
        })
        .await;
    };
    let services = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    let slices = watcher(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    let (services_listed, slices_listed) = (watch::channel(false), watch::channel(false));
    let both = {
        let (mut a, mut b) = (services_listed.1.clone(), slices_listed.1.clone());
        async move {
            let _ = a.wait_for(|d| *d).await;
            let _ = b.wait_for(|d| *d).await;
            let _ = listed.send(true);
        }
    };
    tokio::join!(
        both,
        zone,
        follow(
            services,
            &feed,
            &services_listed.0,
            |tracker, event| match event {
                Change::Put(mut s) | Change::Listed(mut s) => {
                    s.metadata.managed_fields = None;
                    let key = key_of(&s);
                    tracker.set_service(key, Some(s));
                }
                Change::Gone(s) => tracker.set_service(key_of(&s), None),
                Change::Relisted(seen) => tracker.forget_services_except(&seen),
            }
        ),
        follow(
            slices,
            &feed,
            &slices_listed.0,
            |tracker, event| match event {
                Change::Put(mut s) | Change::Listed(mut s) => {
                    s.metadata.managed_fields = None;
                    let (namespace, name) = (s.namespace().unwrap_or_default(), s.name_any());
                    tracker.set_slice(&namespace, &name, Some(s));
                }
                Change::Gone(s) =>
                    tracker.set_slice(&s.namespace().unwrap_or_default(), &s.name_any(), None),
                Change::Relisted(seen) => tracker.forget_slices_except(&seen),
            }
        ),
    );
}

fn key_of(service: &Service) -> ServiceKey {
    ServiceKey::new(
        &service.namespace().unwrap_or_default(),
        &service.name_any(),
    )
}

async fn follow<K: kube::Resource + Send + 'static>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    feed: &Feed,
    listed: &watch::Sender<bool>,
    apply: impl Fn(&mut Tracker, Change<K>),
) {
    let mut changes = std::pin::pin!(portal_client::changes(events, "proxy"));
    while let Some(change) = changes.next().await {
        let done = matches!(change, Change::Relisted(_));
        {
            let mut tracker = feed.tracker.lock();
            let (services, endpoints) = tracker.pending();
            apply(&mut tracker, change);
            let (services_now, endpoints_now) = tracker.pending();
            feed.metrics
                .service_changes
                .inc_by(services_now.saturating_sub(services));
            feed.metrics
                .endpoint_changes
                .inc_by(endpoints_now.saturating_sub(endpoints));
            feed.changed(&tracker);
        }
        if done {
            let _ = listed.send(true);
        }
    }
}
