//! Who may do what: who a request is made as (`user`: certificates,
//! tokens, service-account tokens from `tokens`, impersonation), whether
//! they may (`auth`: the node rules in `node`, then `rbac`), the cluster's
//! certificates and credentials (`pki`), nodes joining with the node token
//! (`join`), the cluster identity shared by several servers on one store
//! (`identity`) and encryption at rest (`encryption`).

pub(crate) mod attributes;
pub(crate) mod auth;
pub mod encryption;
pub(crate) mod identity;
pub mod issuing;
pub mod join;
pub(crate) mod node;
pub mod pki;
pub(crate) mod rbac;
pub(crate) mod tokens;
pub(crate) mod user;
