//! The server's own background work: the `kubernetes` and `kube-dns`
//! Services, this server's address in the `kubernetes` Endpoints, and
//! compaction of a shared etcd, signing approved certificate requests, and
//! filling legacy service-account token Secrets.

pub(crate) mod certificate_signer;
pub(crate) mod compaction;
pub(crate) mod definitions;
pub(crate) mod endpoint_leases;
pub(crate) mod kubernetes_service;
pub(crate) mod legacy_tokens;
