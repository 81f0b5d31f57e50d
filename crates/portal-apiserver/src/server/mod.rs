//! What every request goes through: HTTP plumbing (bodies, queries,
//! content negotiation, answers, kept client connections) and the
//! server's metrics. Knows nothing
//! of resources or handlers.

pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod pool;
