//! One watch and one cache of a kind for a whole process. Every controller
//! that reads pods used to keep its own watch and its own reflector: four
//! full copies of every pod in `portal controllers`. A [`SharedReflector`]
//! keeps one, projected to the fields its readers use, and hands every
//! subscriber the same [`Settled`] changes, each passed on only once the
//! store shows it (see [`crate::settled_objects`] for why that matters
//! during a re-list).

use std::sync::Arc;

use futures_util::{Stream, StreamExt, TryStreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::mpsc;

/// How many changes a subscriber may fall behind before the watch waits
/// for it (backpressure, never a dropped change).
const SUBSCRIBER_BUFFER: usize = 1024;

/// A change the shared store already shows.
#[derive(Debug)]
pub enum Settled<K> {
    /// Created, changed or deleted: a deleted object is no longer in the
    /// store.
    Changed(Arc<K>),
    /// A re-list ended; the store now holds exactly what exists. These are
    /// the re-listed objects, metadata only (what triggers map on); what was
    /// deleted while the watch was broken is simply absent.
    Relisted(Arc<[K]>),
}

impl<K> Clone for Settled<K> {
    fn clone(&self) -> Self {
        match self {
            Settled::Changed(object) => Settled::Changed(object.clone()),
            Settled::Relisted(objects) => Settled::Relisted(objects.clone()),
        }
    }
}

/// One watch of a kind, one store, any number of subscribers.
pub struct SharedReflector<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    api: Api<K>,
    config: watcher::Config,
    project: fn(&mut K),
    store: Store<K>,
    writer: reflector::store::Writer<K>,
    subscribers: Vec<mpsc::Sender<Settled<K>>>,
}

impl<K> std::fmt::Debug for SharedReflector<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReflector")
            .field("kind", &std::any::type_name::<K>())
            .field("subscribers", &self.subscribers.len())
            .finish_non_exhaustive()
    }
}

impl<K> SharedReflector<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Default
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// A reflector of what `config` selects through `api`; `project` trims
    /// every object before it is stored (and before subscribers see it), so
    /// the store keeps only what its readers use.
    pub fn new(api: Api<K>, config: watcher::Config, project: fn(&mut K)) -> Self {
        let (store, writer) = reflector::store();
        SharedReflector {
            api,
            config,
            project,
            store,
            writer,
            subscribers: Vec::new(),
        }
    }

    /// A read handle to the store.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every settled change from the start of the watch. Subscribe before
    /// [`run`](Self::run): a subscriber that stops reading holds up the
    /// others, so drop a stream no longer read.
    pub fn subscribe(&mut self) -> impl Stream<Item = Settled<K>> + Send + 'static {
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers.push(sender);
        tokio_stream::wrappers::ReceiverStream::new(receiver)
    }

    /// Watches until the process ends (watch errors are retried with
    /// back-off and logged).
    pub async fn run(self) {
        let SharedReflector {
            api,
            config,
            project,
            writer,
            mut subscribers,
            ..
        } = self;
        let what = std::any::type_name::<K>();
        let events = watcher(api, config)
            .default_backoff()
            .map_ok(move |event| event.modify(project))
            .reflect(writer);
        let mut settled = Box::pin(settle(events, what));
        while let Some(change) = settled.next().await {
            let mut closed = false;
            for subscriber in &subscribers {
                closed |= subscriber.send(change.clone()).await.is_err();
            }
            if closed {
                subscribers.retain(|s| !s.is_closed());
            }
        }
    }
}

/// Turns reflected watch events into settled changes: re-listed objects are
/// held (metadata only) until the re-list ends.
fn settle<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    what: &'static str,
) -> impl Stream<Item = Settled<K>> + Send
where
    K: kube::Resource + Default + Send + Sync,
{
    let mut relisted: Vec<K> = Vec::new();
    events.filter_map(move |event| {
        let change = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                Some(Settled::Changed(Arc::new(object)))
            }
            Ok(watcher::Event::Init) => {
                relisted.clear();
                None
            }
            Ok(watcher::Event::InitApply(object)) => {
                let mut held = K::default();
                *held.meta_mut() = object.meta().clone();
                relisted.push(held);
                None
            }
            Ok(watcher::Event::InitDone) => {
                Some(Settled::Relisted(std::mem::take(&mut relisted).into()))
            }
            Err(error) => {
                tracing::warn!(%error, watch = what, "watch failed; retrying");
                None
            }
        };
        std::future::ready(change)
    })
}

/// The objects of settled changes, re-listed ones one by one (for
/// `Controller::watches_shared_stream`).
pub fn objects<K: Clone + Send + Sync + 'static>(
    changes: impl Stream<Item = Settled<K>> + Send,
) -> impl Stream<Item = Arc<K>> + Send {
    changes.flat_map(|change| {
        let objects: Vec<Arc<K>> = match change {
            Settled::Changed(object) => vec![object],
            Settled::Relisted(objects) => objects.iter().cloned().map(Arc::new).collect(),
        };
        futures_util::stream::iter(objects)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.spec = Some(Default::default());
        pod
    }

    fn describe(change: &Settled<Pod>) -> String {
        match change {
            Settled::Changed(pod) => format!("changed {}", pod.name_any()),
            Settled::Relisted(pods) => {
                let names: Vec<String> = pods.iter().map(ResourceExt::name_any).collect();
                format!("relisted {}", names.join(","))
            }
        }
    }

    #[tokio::test]
    async fn relisted_objects_are_held_until_the_relist_ends_with_metadata_only() {
        let events = futures_util::stream::iter(vec![
            Ok(watcher::Event::Apply(pod("a"))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("b"))),
            Ok(watcher::Event::InitApply(pod("c"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Delete(pod("b"))),
        ]);
        let changes: Vec<Settled<Pod>> = settle(events, "test").collect().await;
        let described: Vec<String> = changes.iter().map(describe).collect();
        assert_eq!(
            described,
            ["changed a", "relisted b,c", "changed b"],
            "a re-list is one change, after its last object"
        );
        let Settled::Relisted(held) = &changes[1] else {
            unreachable!()
        };
        assert!(held.iter().all(|p| p.spec.is_none()), "metadata only");
        let all: Vec<String> = objects(futures_util::stream::iter(changes))
            .map(|p| p.name_any())
            .collect()
            .await;
        assert_eq!(all, ["a", "b", "c", "b"]);
    }
}
