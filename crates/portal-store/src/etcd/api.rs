//! etcd's v3 API: messages and gRPC clients generated from the `.proto`
//! files in `crates/portal-store/proto/` by `tools/etcd-proto-gen` (pure
//! Rust, no `protoc`) and committed, so that building Portal needs only a
//! Rust toolchain. Do not edit the generated files; regenerate them.

#![allow(
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    missing_debug_implementations,
    rustdoc::all
)]

/// The KV, Watch, Lease, Cluster, Maintenance and Auth services.
pub mod etcdserverpb {
    include!("api/etcdserverpb.rs");
}

/// Keys, values and events.
pub mod mvccpb {
    include!("api/mvccpb.rs");
}

/// Users and roles (referenced by the Auth service's messages).
pub mod authpb {
    include!("api/authpb.rs");
}
