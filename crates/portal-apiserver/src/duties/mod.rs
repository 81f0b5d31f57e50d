//! The server's own background work: the `kubernetes` and `kube-dns`
//! Services, this server's address in the `kubernetes` Endpoints, and
//! compaction of a shared etcd, signing approved certificate requests,
//! filling legacy service-account token Secrets, and the ServiceCIDRs'
//! finalizers and status.

pub(crate) mod certificate_signer;
pub(crate) mod compaction;
pub(crate) mod definitions;
pub(crate) mod endpoint_leases;
pub(crate) mod kubernetes_service;
pub(crate) mod legacy_tokens;
pub(crate) mod service_cidrs;
