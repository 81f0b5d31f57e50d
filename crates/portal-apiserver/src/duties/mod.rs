//! The server's own background work: the `kubernetes` and `kube-dns`
//! Services, this server's address in the `kubernetes` Endpoints, the
//! built-in load-balancer provider, and compaction of a shared etcd.

pub(crate) mod compaction;
pub(crate) mod endpoint_leases;
pub(crate) mod kubernetes_service;
pub(crate) mod load_balancer;
