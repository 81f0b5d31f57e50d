//! Watch streams that survive re-lists. After a broken watch, kube's
//! watcher lists again (`Init`, `InitApply`…, `InitDone`); whatever was
//! deleted meanwhile never gets a `Delete`. Components that keep their own
//! index follow [`changes`], where a finished re-list names everything that
//! still exists; controllers reading a reflector follow [`settled_objects`].

use std::collections::HashSet;

use futures_util::{Stream, StreamExt, TryStreamExt};
use kube::runtime::watcher;
use kube::ResourceExt;

/// What happened to the objects of one watch.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K> {
    /// Created or changed.
    Put(K),
    /// Listed by a (re-)list: it exists, though it may not have changed.
    Listed(K),
    /// Deleted.
    Gone(K),
    /// A re-list ended: these `(namespace, name)` exist, nothing else does.
    Relisted(HashSet<(String, String)>),
}

/// The changes a watch shows, re-lists included; errors are logged (the
/// watcher retries with back-off) and skipped.
pub fn changes<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: &'static str,
) -> impl Stream<Item = Change<K>> + Send
where
    K: kube::Resource + Send + 'static,
{
    let mut relisted: Option<HashSet<(String, String)>> = None;
    events.filter_map(move |event| {
        let change = match event {
            Ok(watcher::Event::Init) => {
                relisted = Some(HashSet::new());
                None
            }
            Ok(watcher::Event::InitApply(object)) => {
                if let Some(seen) = relisted.as_mut() {
                    seen.insert((object.namespace().unwrap_or_default(), object.name_any()));
                }
                Some(Change::Listed(object))
            }
            Ok(watcher::Event::InitDone) => {
                Some(Change::Relisted(relisted.take().unwrap_or_default()))
            }
            Ok(watcher::Event::Apply(object)) => Some(Change::Put(object)),
            Ok(watcher::Event::Delete(object)) => Some(Change::Gone(object)),
            Err(error) => {
                tracing::warn!(%error, watch = what, "watch failed; retrying");
                None
            }
        };
        std::future::ready(change)
    })
}

/// The objects a reflected watch changed, each passed on only once the
/// reflector shows it: during a re-list kube's reflector keeps the old state
/// until the re-list ends, so re-listed objects are held until then (a
/// reconcile triggered earlier would read the old state and never run
/// again). Use after `.reflect(writer)` instead of `.touched_objects()`.
/// Held objects keep only their metadata (what triggers map on): a re-list
/// of every object must not hold a second copy of the reflector.
pub fn settled_objects<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: kube::Resource + Default + Send + 'static,
{
    let mut relisted = Vec::new();
    events
        .map_ok(move |event| {
            let ready = match event {
                watcher::Event::Apply(object) | watcher::Event::Delete(object) => vec![object],
                watcher::Event::Init => {
                    relisted.clear();
                    Vec::new()
                }
                watcher::Event::InitApply(object) => {
                    let mut held = K::default();
                    *held.meta_mut() = object.meta().clone();
                    relisted.push(held);
                    Vec::new()
                }
                watcher::Event::InitDone => std::mem::take(&mut relisted),
            };
            futures_util::stream::iter(ready.into_iter().map(Ok))
        })
        .try_flatten()
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn service(name: &str) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some(name.into());
        service.metadata.namespace = Some("default".into());
        service
    }

    fn events() -> Vec<Result<watcher::Event<Service>, watcher::Error>> {
        vec![
            Ok(watcher::Event::Apply(service("a"))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(service("b"))),
            Ok(watcher::Event::InitApply(service("c"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Delete(service("b"))),
        ]
    }

    #[tokio::test]
    async fn a_relist_names_what_still_exists() {
        let seen: Vec<Change<Service>> = changes(futures_util::stream::iter(events()), "test")
            .collect()
            .await;
        let names: Vec<String> = seen
            .iter()
            .map(|c| match c {
                Change::Put(s) => format!("put {}", s.name_any()),
                Change::Listed(s) => format!("listed {}", s.name_any()),
                Change::Gone(s) => format!("gone {}", s.name_any()),
                Change::Relisted(set) => {
                    let mut names: Vec<&str> = set.iter().map(|(_, n)| n.as_str()).collect();
                    names.sort_unstable();
                    format!("relisted {}", names.join(","))
                }
            })
            .collect();
        assert_eq!(
            names,
            ["put a", "listed b", "listed c", "relisted b,c", "gone b"]
        );
    }

    #[tokio::test]
    async fn relisted_objects_wait_for_the_end_of_the_relist() {
        let settled: Vec<String> = settled_objects(futures_util::stream::iter(events()))
            .map(|r| r.map(|s| s.name_any()).unwrap_or_default())
            .collect()
            .await;
        assert_eq!(settled, ["a", "b", "c", "b"]);
    }
}
