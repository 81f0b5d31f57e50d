//! Portal's I/O-free core of the Kubernetes API: which resources exist, how
//! paths, bodies and selectors are parsed, how objects are validated, and the
//! `Status` errors that report what is wrong. Everything here is a pure
//! function, unit-tested and fuzzed without a network.

pub mod cidr;
pub mod decode;
pub mod defaults;
pub mod join;
pub mod kinds;
pub mod managed;
pub mod meta;
pub mod name;
pub mod patch;
pub mod path;
pub mod pod_spec;
pub mod protobuf;
pub mod quantity;
pub mod resource;
pub mod selector;
pub mod service;
pub mod status;
pub mod table;

pub use k8s_openapi;
pub use resource::{resources, Kind, Resource};
pub use status::{Cause, Status, Target};
