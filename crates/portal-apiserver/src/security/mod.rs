//! Who may do what: authentication and authorization of requests (`auth`),
//! the cluster's certificates and credentials (`pki`), nodes joining with
//! the node token (`join`), and the cluster identity shared by several
//! servers on one store (`identity`).

pub(crate) mod auth;
pub mod encryption;
pub(crate) mod identity;
pub mod join;
pub mod pki;
