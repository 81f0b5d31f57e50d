//! Events about what the controllers did, as `kubectl describe` shows them.
//!
//! Like Kubernetes' event correlator, a repeat of the same event on the same
//! object bumps the existing Event's `count` instead of creating another,
//! and a spam filter (a token bucket per object: a burst of 25, then one
//! every five minutes) keeps a controller retrying thousands of pods from
//! flooding the store with Events.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;

/// Events one object may get at once before the filter slows it down.
const BURST: f64 = 25.0;
/// Then one event per this long.
const REFILL: Duration = Duration::from_secs(300);
/// Objects and event series remembered; beyond this the oldest memory is
/// dropped (a repeat then starts a new Event, as in Kubernetes' LRU).
const REMEMBERED: usize = 4096;

/// (namespace, object uid or name, type, reason, message).
type SeriesKey = (String, String, String, String, String);

#[derive(Debug, Default)]
struct Memory {
    /// Per object: tokens left and when they were counted.
    buckets: HashMap<(String, String), (f64, Instant)>,
    /// Per identical event: the Event's name and count.
    series: HashMap<SeriesKey, (String, i32)>,
}

/// Records Events for one component (and, for a node agent, its node).
pub struct Recorder {
    client: Client,
    component: &'static str,
    host: Option<String>,
    memory: Mutex<Memory>,
}

/// What the recorder decided to do with one event.
#[derive(Debug, PartialEq)]
enum Decision {
    Drop,
    Create,
    /// Bump the named Event to this count.
    Bump(String, i32),
}

impl Memory {
    fn decide(&mut self, object: (String, String), series: &SeriesKey, now: Instant) -> Decision {
        if self.buckets.len() >= REMEMBERED {
            self.buckets.clear();
        }
        let (tokens, counted) = self.buckets.entry(object).or_insert((BURST, now));
        let refilled = now.duration_since(*counted).as_secs_f64() / REFILL.as_secs_f64();
        *tokens = (*tokens + refilled).min(BURST);
        *counted = now;
        if *tokens < 1.0 {
            return Decision::Drop;
        }
        *tokens -= 1.0;
        match self.series.get(series) {
            Some((name, count)) => Decision::Bump(name.clone(), count + 1),
            None => Decision::Create,
        }
    }

    fn remember(&mut self, series: SeriesKey, name: String, count: i32) {
        if self.series.len() >= REMEMBERED {
            self.series.clear();
        }
        self.series.insert(series, (name, count));
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("component", &self.component)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    pub fn new(client: Client, component: &'static str) -> Self {
        Recorder {
            client,
            component,
            host: None,
            memory: Mutex::default(),
        }
    }

    /// Events from a node's agent name the node (`source.host`), as the
    /// kubelet's do.
    pub fn on_host(mut self, host: &str) -> Self {
        self.host = Some(host.to_owned());
        self
    }

    /// Records one Event about `object`; failures are logged, never fatal.
    pub async fn record(&self, object: &ObjectReference, kind: &str, reason: &str, message: &str) {
        let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
        let identity = object
            .uid
            .clone()
            .or_else(|| object.name.clone())
            .unwrap_or_default();
        let series: SeriesKey = (
            namespace.clone(),
            identity.clone(),
            kind.into(),
            reason.into(),
            message.into(),
        );
        let decision =
            self.memory
                .lock()
                .decide((namespace.clone(), identity), &series, Instant::now());
        let api = Api::<Event>::namespaced(self.client.clone(), &namespace);
        let now = jiff::Timestamp::now();
        if let Decision::Bump(name, count) = &decision {
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(now)});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.memory.lock().remember(series, name.clone(), *count);
                    return;
                }
                // The Event expired or was deleted: start a new one.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::debug!(%error, reason, "updating an event failed");
                    return;
                }
            }
        }
        if decision == Decision::Drop {
            return;
        }
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", object.name.as_deref().unwrap_or("object"))),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(kind.into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            source: Some(EventSource {
                component: Some(self.component.into()),
                host: self.host.clone(),
            }),
            reporting_component: Some(self.component.into()),
            reporting_instance: Some(self.host.clone().unwrap_or_else(|| self.component.into())),
            action: Some(reason.into()),
            ..Event::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => self.memory.lock().remember(series, created.name_any(), 1),
            Err(error) => tracing::debug!(%error, reason, "recording an event failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(message: &str) -> SeriesKey {
        (
            "ns".into(),
            "uid-1".into(),
            "Warning".into(),
            "FailedScheduling".into(),
            message.into(),
        )
    }

    fn object() -> (String, String) {
        ("ns".into(), "uid-1".into())
    }

    #[test]
    fn a_repeat_bumps_the_count_of_the_same_event() {
        let mut memory = Memory::default();
        let now = Instant::now();
        assert_eq!(memory.decide(object(), &series("a"), now), Decision::Create);
        memory.remember(series("a"), "p.x1".into(), 1);
        assert_eq!(
            memory.decide(object(), &series("a"), now),
            Decision::Bump("p.x1".into(), 2)
        );
        assert_eq!(memory.decide(object(), &series("b"), now), Decision::Create);
    }

    #[test]
    fn an_object_gets_a_burst_then_one_event_per_refill() {
        let mut memory = Memory::default();
        let start = Instant::now();
        let allowed = (0..100)
            .filter(|_| memory.decide(object(), &series("a"), start) != Decision::Drop)
            .count();
        assert_eq!(allowed, 25);
        let later = start + REFILL;
        assert_ne!(memory.decide(object(), &series("a"), later), Decision::Drop);
        assert_eq!(memory.decide(object(), &series("a"), later), Decision::Drop);
        // Another object has its own bucket.
        let other = ("ns".to_owned(), "uid-2".to_owned());
        assert_ne!(memory.decide(other, &series("a"), later), Decision::Drop);
    }
}
