//! What every request goes through: HTTP plumbing (bodies, queries,
//! content negotiation, answers) and the server's metrics. Knows nothing
//! of resources or handlers.

pub(crate) mod http;
pub(crate) mod metrics;
