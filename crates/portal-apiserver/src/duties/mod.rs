//! The server's own background work: the `kubernetes` and `kube-dns`
//! Services, this server's address in the `kubernetes` Endpoints, and
//! compaction of a shared etcd.

pub(crate) mod compaction;
pub(crate) mod endpoint_leases;
pub(crate) mod kubernetes_service;
