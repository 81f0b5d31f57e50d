//! Choosing an endpoint: round robin, or the endpoint a client is pinned
//! to under ClientIP affinity (until its timeout passes unused).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::model::ServicePort;

/// At most this many pinned clients per Service port (bounded memory); the
/// oldest half goes when it is full.
const MAX_PINS: usize = 65_536;

#[derive(Debug)]
pub(crate) struct Balancer {
    endpoints: RwLock<Vec<SocketAddr>>,
    next: AtomicUsize,
    affinity: RwLock<Option<Duration>>,
    pins: Mutex<HashMap<IpAddr, (SocketAddr, Instant)>>,
}

impl Balancer {
    pub(crate) fn new(port: &ServicePort) -> Self {
        let balancer = Self {
            endpoints: RwLock::new(Vec::new()),
            next: AtomicUsize::new(rand::random::<u16>().into()),
            affinity: RwLock::new(None),
            pins: Mutex::new(HashMap::new()),
        };
        balancer.update(port);
        balancer
    }

    pub(crate) fn update(&self, port: &ServicePort) {
        *self.endpoints.write() = port.endpoints.clone();
        *self.affinity.write() = port.affinity.map(|s| Duration::from_secs(s.into()));
        let endpoints = &port.endpoints;
        self.pins
            .lock()
            .retain(|_, (endpoint, _)| endpoints.contains(endpoint));
    }

    /// Up to `attempts` distinct endpoints to try in order: the pinned one
    /// first, then round robin.
    pub(crate) fn candidates(&self, client: IpAddr, attempts: usize) -> Vec<SocketAddr> {
        let endpoints = self.endpoints.read();
        if endpoints.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(attempts.min(endpoints.len()));
        if let Some(timeout) = *self.affinity.read() {
            let pins = self.pins.lock();
            if let Some((endpoint, used)) = pins.get(&client) {
                if used.elapsed() < timeout && endpoints.contains(endpoint) {
                    out.push(*endpoint);
                }
            }
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..endpoints.len() {
            if out.len() >= attempts {
                break;
            }
            let endpoint = endpoints[(start + i) % endpoints.len()];
            if !out.contains(&endpoint) {
                out.push(endpoint);
            }
        }
        out
    }

    /// `client` reached `endpoint`: pin it there under affinity.
    pub(crate) fn used(&self, client: IpAddr, endpoint: SocketAddr) {
        if self.affinity.read().is_none() {
            return;
        }
        let mut pins = self.pins.lock();
        if pins.len() >= MAX_PINS && !pins.contains_key(&client) {
            let mut ages: Vec<Instant> = pins.values().map(|(_, t)| *t).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            pins.retain(|_, (_, t)| *t > cut);
        }
        pins.insert(client, (endpoint, Instant::now()));
    }
}
