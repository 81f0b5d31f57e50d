//! The `endpoint` source: static pods pushed to the agent's API, on only
//! with `--manifest-endpoint` (and, like all of that API, only for client
//! certificates of its CA).
//!
//! - `PUT /manifests`: the body (YAML or JSON, one or more Pods) replaces
//!   the pushed set, all or nothing: a bad manifest answers 400 and
//!   changes nothing; an empty body stops every pushed pod;
//! - `GET /manifests`: the pushed set, as a `PodList`.
//!
//! The set lives in memory: an agent restart forgets it (push it again).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Pod;

use super::{text, Body};
use crate::sources::manifest::{self, Origin};
use crate::sources::{Source, Update, Updates};

/// The pushed set and where it goes.
#[derive(Debug)]
pub struct Endpoint {
    node: String,
    updates: Updates,
    /// Held across a push, so the set shown is the set sent last.
    pushed: tokio::sync::Mutex<Vec<Pod>>,
}

impl Endpoint {
    pub fn new(node: String, updates: Updates) -> Self {
        Endpoint {
            node,
            updates,
            pushed: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    pub(super) async fn put(&self, body: Incoming) -> Response<Body> {
        let bytes = match Limited::new(body, manifest::MAX_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the manifests: {error} (at most {} bytes)",
                        manifest::MAX_BYTES
                    ),
                )
            }
        };
        let origin = Origin {
            node: &self.node,
            source: Source::Endpoint,
            location: "endpoint",
        };
        let pods = match manifest::read(&bytes, origin) {
            Ok(pods) => pods,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let located = pods
            .into_iter()
            .map(|p| (p, "endpoint".to_owned()))
            .collect();
        let (pods, duplicates) = manifest::first_of_each_name(located);
        if let Some(problem) = duplicates.first() {
            return text(StatusCode::BAD_REQUEST, problem.message.clone());
        }
        let names: Vec<String> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        let mut pushed = self.pushed.lock().await;
        let update = Update {
            source: Source::Endpoint,
            pods: Some(pods.clone()),
            problems: Vec::new(),
        };
        if self.updates.send(update).await.is_err() {
            return text(StatusCode::SERVICE_UNAVAILABLE, "the agent is stopping");
        }
        *pushed = pods;
        text(StatusCode::OK, format!("{}\n", names.join("\n")))
    }

    pub(super) async fn get(&self) -> Response<Body> {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {},
            "items": *self.pushed.lock().await,
        });
        let mut response = Response::new(Full::new(Bytes::from(list.to_string())).boxed());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}
