//! The REST handlers: routing a request to the handler of its verb and
//! resource (`routes`), reads and watches served from the watch cache,
//! discovery and OpenAPI, the subresources (binding, eviction, scale,
//! token), the review APIs (who am I, may I), and
//! the streams and proxies that reach nodes and pods, and API aggregation
//! (`aggregation`: extension API servers behind APIServices, with the
//! checks that keep their availability and discovery), and the resource
//! metrics API built from the agents' usage (`metrics`), and the web
//! console's files (`console`). Writes go through the registry.

pub(crate) mod aggregation;
pub(crate) mod binding;
pub(crate) mod connect;
pub(crate) mod console;
pub(crate) mod discovery;
pub(crate) mod eviction;
pub(crate) mod list_options;
pub(crate) mod metrics;
pub(crate) mod openapi;
pub(crate) mod proxy;
pub(crate) mod read;
pub(crate) mod review;
pub(crate) mod routes;
pub(crate) mod scale;
pub(crate) mod token;
pub(crate) mod watch;
