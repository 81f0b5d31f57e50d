//! Portal's I/O-free core of the Kubernetes API: which resources exist, how
//! paths, bodies and selectors are parsed, how objects are validated, and the
//! `Status` errors that report what is wrong. Everything here is a pure
//! function, unit-tested and fuzzed without a network.
//!
//! Its modules depend one way (`scripts/check-module-cycles` fails on a
//! cycle), each layer only on those before it:
//! 1. machinery: `status`, `name`, `quantity`, `cidr`, `path`, `selector`,
//!    `join`, `meta`;
//! 2. `schema`: what a kind is, as a value ([`Resource`], [`Kind`]);
//! 3. what works on any kind through its `Resource`: `defaults` helpers,
//!    `patch`, `managed` (server-side apply), `table`;
//! 4. `kinds`: the built-in kinds, one module each (with the helpers only
//!    kinds use: `service`, `pod_spec`);
//! 5. `registry`: the kinds served, found at run time;
//! 6. codecs: `decode` and `protobuf`, from bodies to objects of a kind.

pub mod cidr;
pub mod cron;
pub mod custom;
pub mod decode;
pub mod defaults;
pub mod expressions;
pub mod ip_text;
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
pub mod registry;
pub mod schema;
pub mod selector;
pub mod service;
pub mod status;
pub mod table;

pub use k8s_openapi;
pub use registry::resources;
pub use schema::{Kind, Resource};
pub use status::{Cause, Status, Target};
