//! Idle HTTP/1 client connections kept per destination for the next
//! request (webhooks, extension API servers), as Go's HTTP transport keeps
//! them alive: dialling TLS for every call would cost more than the call.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

/// Idle connections kept per destination.
const IDLE_PER_DESTINATION: usize = 8;
/// How long an idle connection is kept (Go's transport: 90 s); a peer
/// that vanished without closing it is not waited on for ever.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A kept connection, and since when it has been idle.
type Idle<B> = (Instant, SendRequest<B>);

/// Connections by destination `K`, each sending bodies of type `B`.
pub(crate) struct Pool<K, B> {
    idle: parking_lot::Mutex<HashMap<K, Vec<Idle<B>>>>,
}

impl<K, B> Default for Pool<K, B> {
    fn default() -> Self {
        Pool {
            idle: Default::default(),
        }
    }
}

impl<K: Eq + Hash, B> Pool<K, B> {
    /// An idle connection to `key` that is still open.
    pub(crate) fn take(&self, key: &K) -> Option<SendRequest<B>> {
        let mut idle = self.idle.lock();
        let kept = idle.get_mut(key)?;
        while let Some((since, sender)) = kept.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps a connection that is ready for another request.
    pub(crate) fn give(&self, key: K, sender: SendRequest<B>) {
        let mut idle = self.idle.lock();
        // Destinations come and go: forget those whose connections all
        // closed or idled too long.
        idle.retain(|_, kept| {
            kept.retain(|(since, s)| !s.is_closed() && since.elapsed() < IDLE_TIMEOUT);
            !kept.is_empty()
        });
        let kept = idle.entry(key).or_default();
        if kept.len() < IDLE_PER_DESTINATION {
            kept.push((Instant::now(), sender));
        }
    }
}

impl<K, B> std::fmt::Debug for Pool<K, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}
