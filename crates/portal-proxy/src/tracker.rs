//! The change tracker: the latest Services and EndpointSlices as the watches
//! deliver them, and which Services changed since the last sync (merged per
//! Service, like kube-proxy's `ServiceChangeTracker`), with the oldest
//! trigger time of each pending endpoint change for
//! `network_programming_duration_seconds`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::model::{self, ServiceKey, ServicePort};

use portal_client::labels::TRIGGER_TIME as TRIGGER_TIME_ANNOTATION;

/// The Services that changed since the last sync, with their ports now.
#[derive(Debug, Default)]
pub struct Changes {
    /// Every changed Service (all of them for a full sync); an empty list
    /// means the Service is gone or has nothing to proxy.
    pub services: BTreeMap<ServiceKey, Vec<ServicePort>>,
    /// Trigger times of the endpoint changes in this batch.
    pub triggers: Vec<jiff::Timestamp>,
}

#[derive(Debug)]
pub struct Tracker {
    /// Trigger times before this are not this process's to measure (an
    /// initial list carries every slice's last change, however old).
    started: jiff::Timestamp,
    services: HashMap<ServiceKey, Service>,
    /// Slices by (namespace, name), with the Service each belongs to.
    slices: HashMap<(String, String), (ServiceKey, EndpointSlice)>,
    slices_of: HashMap<ServiceKey, BTreeSet<(String, String)>>,
    changed: BTreeSet<ServiceKey>,
    triggers: Vec<jiff::Timestamp>,
    service_changes: u64,
    endpoint_changes: u64,
    /// This proxy's node: its endpoints are the local ones.
    node: Option<String>,
    /// Its node's zone (`topology.kubernetes.io/zone`), for topology hints.
    zone: Option<String>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self {
            started: jiff::Timestamp::now(),
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            changed: BTreeSet::new(),
            triggers: Vec::new(),
            service_changes: 0,
            endpoint_changes: 0,
            node: None,
            zone: None,
        }
    }
}

impl Tracker {
    /// A tracker for the proxy of node `node`.
    pub fn for_node(node: Option<String>) -> Self {
        Tracker {
            node,
            ..Tracker::default()
        }
    }
}

impl Tracker {
    /// Trigger times of a failed sync: measured when a later one succeeds.
    pub fn requeue_triggers(&mut self, triggers: Vec<jiff::Timestamp>) {
        self.triggers.extend(triggers);
    }

    pub fn set_service(&mut self, key: ServiceKey, service: Option<Service>) {
        match service {
            Some(service) => {
                if self.services.get(&key) == Some(&service) {
                    return;
                }
                self.services.insert(key.clone(), service);
            }
            None => {
                if self.services.remove(&key).is_none() {
                    return;
                }
            }
        }
        self.service_changes += 1;
        self.changed.insert(key);
    }

    pub fn set_slice(&mut self, namespace: &str, name: &str, slice: Option<EndpointSlice>) {
        let slot = (namespace.to_owned(), name.to_owned());
        let new_owner = slice.as_ref().and_then(model::slice_service);
        let old = self.slices.remove(&slot);
        if let Some((old_owner, old_slice)) = old {
            if Some(&old_slice) == slice.as_ref() && new_owner.as_ref() == Some(&old_owner) {
                self.slices.insert(slot, (old_owner, old_slice));
                return;
            }
            if let Some(names) = self.slices_of.get_mut(&old_owner) {
                names.remove(&slot);
                if names.is_empty() {
                    self.slices_of.remove(&old_owner);
                }
            }
            self.changed.insert(old_owner);
        } else if new_owner.is_none() {
            // Neither before nor now a slice of a Service: nothing to do.
            return;
        }
        self.endpoint_changes += 1;
        if let (Some(owner), Some(slice)) = (new_owner, slice) {
            let trigger = slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .filter(|t| *t >= self.started);
            self.triggers.extend(trigger);
            self.slices_of
                .entry(owner.clone())
                .or_default()
                .insert(slot.clone());
            self.changed.insert(owner.clone());
            self.slices.insert(slot, (owner, slice));
        }
    }

    /// After a re-list: drops the Services not in it.
    pub fn forget_services_except(&mut self, seen: &HashSet<(String, String)>) {
        let gone: Vec<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !seen.contains(&(k.namespace.clone(), k.name.clone())))
            .cloned()
            .collect();
        for key in gone {
            self.set_service(key, None);
        }
    }

    /// After a re-list: drops the slices not in it.
    pub fn forget_slices_except(&mut self, seen: &HashSet<(String, String)>) {
        let gone: Vec<(String, String)> = self
            .slices
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for (namespace, name) in gone {
            self.set_slice(&namespace, &name, None);
        }
    }

    /// This node's zone now: every Service is looked at again when it
    /// changes (their topology-hinted endpoints may change).
    pub fn set_zone(&mut self, zone: Option<String>) {
        if self.zone == zone {
            return;
        }
        self.zone = zone;
        self.service_changes += 1;
        self.changed.extend(self.services.keys().cloned());
    }

    /// (service, endpoint) changes waiting for a sync.
    pub fn pending(&self) -> (u64, u64) {
        (self.service_changes, self.endpoint_changes)
    }

    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty()
    }

    /// The changed Services' ports now (every Service when `full`), and
    /// resets the pending changes.
    pub fn take(&mut self, full: bool) -> Changes {
        let keys: Vec<ServiceKey> = if full {
            let mut all: BTreeSet<ServiceKey> = self.services.keys().cloned().collect();
            all.append(&mut self.changed);
            all.into_iter().collect()
        } else {
            std::mem::take(&mut self.changed).into_iter().collect()
        };
        self.changed.clear();
        self.service_changes = 0;
        self.endpoint_changes = 0;
        let services = keys
            .into_iter()
            .map(|key| {
                let ports = self.ports(&key);
                (key, ports)
            })
            .collect();
        Changes {
            services,
            triggers: std::mem::take(&mut self.triggers),
        }
    }

    fn ports(&self, key: &ServiceKey) -> Vec<ServicePort> {
        let Some(service) = self.services.get(key) else {
            return Vec::new();
        };
        let slices = self
            .slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|slot| self.slices.get(slot).map(|(_, slice)| slice));
        model::join(
            key,
            service,
            slices,
            &model::Topology {
                node: self.node.as_deref(),
                zone: self.zone.as_deref(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80}]},
        }))
        .unwrap_or_default()
    }

    fn slice(service: &str, ip: &str) -> Option<EndpointSlice> {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{service}-1"), "namespace": "default",
                         "labels": {model::SERVICE_NAME_LABEL: service},
                         "annotations": {TRIGGER_TIME_ANNOTATION: "2026-11-22T06:00:00.5Z"}},
            "addressType": "IPv4",
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip]}],
        }))
        .ok()
    }

    #[test]
    fn changes_are_merged_per_service_and_taken_once() {
        let mut tracker = Tracker::default();
        let web = ServiceKey::new("default", "web");
        tracker.set_service(web.clone(), Some(service("web")));
        tracker.set_slice("default", "web-1", slice("web", "10.244.0.5"));
        tracker.set_slice("default", "web-1", slice("web", "10.244.0.6"));
        assert_eq!(tracker.pending(), (1, 2));
        let changes = tracker.take(false);
        assert_eq!(changes.services.len(), 1);
        assert_eq!(changes.services[&web][0].endpoints.len(), 1);
        // Trigger times from before the tracker started are not measured.
        assert!(changes.triggers.is_empty());
        assert!(!tracker.has_changes());
        // The same object again is no change.
        tracker.set_service(web.clone(), Some(service("web")));
        tracker.set_slice("default", "web-1", slice("web", "10.244.0.6"));
        assert!(tracker.take(false).services.is_empty());
        // A full sync takes every Service; a deleted one comes with no ports.
        tracker.set_service(ServiceKey::new("default", "db"), Some(service("db")));
        tracker.set_service(web.clone(), None);
        let full = tracker.take(true);
        assert_eq!(full.services.len(), 2);
        assert!(full.services[&web].is_empty());
    }
}
