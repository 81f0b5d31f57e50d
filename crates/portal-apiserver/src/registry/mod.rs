//! The registry between the handlers and the store, as Kubernetes' generic
//! `registry.Store`: every write (create, update, patch, apply, delete) is
//! decoded, defaulted and validated by the kind's strategy, recorded in
//! `managedFields`, given its Service addresses (`allocator`) and made one
//! compare-and-swap transaction; graceful deletion, finalizers and garbage
//! collection (`deletion`, `gc`), the namespace lifecycle (`namespace`),
//! and the watch cache every read is served from (`cache`, `lookup`);
//! CRD versions converted by their webhooks (`conversion`, over
//! `webhook_client`, which admission webhooks share).

pub(crate) mod allocator;
pub(crate) mod cache;
pub(crate) mod conversion;
pub(crate) mod defined;
pub(crate) mod deletion;
pub(crate) mod lookup;
pub(crate) mod strategy;
pub(crate) mod webhook_client;
pub(crate) mod write;
