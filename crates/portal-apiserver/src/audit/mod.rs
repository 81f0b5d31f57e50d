//! The audit log (`--audit-policy-file`, `--audit-log-path`): a record of
//! who did what, as kube-apiserver keeps it — one `audit.k8s.io/v1` Event
//! per request and stage (`RequestReceived`, `ResponseStarted` for
//! watches, `ResponseComplete`), at the level the policy gives the request
//! (`Metadata`: who, what, when and the answer's code; `Request`: and the
//! object sent; `RequestResponse`: and the object answered).
//!
//! Whatever the policy says, Secrets, tokens asked for and tokens reviewed
//! are never recorded above `Metadata`: their bodies are credentials.

mod log;
pub mod policy;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request};
use portal_api::{path, Status};
use serde_json::{json, Value};

pub use log::Rotation;
use policy::{Asked, Level, Policy, ResourceAsked};

use crate::security::user::User;

/// What to audit and where to write it.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub policy: Policy,
    /// `-` is standard output.
    pub path: std::path::PathBuf,
    pub rotation: Rotation,
}

/// The server's auditor.
pub(crate) struct Auditor {
    policy: Policy,
    sink: log::Sink,
}

/// One request's audit record, written at each stage.
pub(crate) struct Record {
    auditor: Arc<Auditor>,
    pub(crate) level: Level,
    omitted: Vec<String>,
    event: Value,
    pub(crate) watch: bool,
}

impl Auditor {
    pub(crate) fn open(config: &AuditConfig) -> std::io::Result<Auditor> {
        Ok(Auditor {
            policy: config.policy.clone(),
            sink: log::Sink::open(&config.path, config.rotation)?,
        })
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// The request's verb and what it addresses, as the policy sees them.
fn describe(method: &Method, uri: &http::Uri) -> (String, Option<(ResourceOwned, String)>) {
    let watching = uri.query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
    });
    let Some(parsed) = path::parse(uri.path()) else {
        return (method.as_str().to_lowercase(), None);
    };
    let named = parsed.name.is_some();
    let verb = match method.as_str() {
        "GET" if parsed.watch_prefix || watching => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if named => "delete",
        "DELETE" => "deletecollection",
        other => return (other.to_lowercase(), None),
    };
    let version = if parsed.group.is_empty() {
        parsed.version.clone()
    } else {
        format!("{}/{}", parsed.group, parsed.version)
    };
    let resource = ResourceOwned {
        group: parsed.group,
        resource: parsed.resource,
        subresource: parsed.subresource,
        namespace: parsed.namespace.unwrap_or_default(),
        name: parsed.name.unwrap_or_default(),
    };
    (verb.to_owned(), Some((resource, version)))
}

struct ResourceOwned {
    group: String,
    resource: String,
    subresource: Option<String>,
    namespace: String,
    name: String,
}

/// Bodies that are credentials: never recorded.
fn carries_credentials(r: &ResourceOwned) -> bool {
    (r.group.is_empty() && r.resource == "secrets")
        || (r.resource == "serviceaccounts" && r.subresource.as_deref() == Some("token"))
        || r.resource == "tokenreviews"
}

impl Record {
    /// Begins the record of a request made as `user` (`impersonator`: who
    /// really asked, when it is impersonation); `None` when the policy
    /// says `None`. Writes `RequestReceived`.
    pub(crate) fn begin<B>(
        auditor: &Arc<Auditor>,
        request: &Request<B>,
        user: &User,
        impersonator: Option<&User>,
    ) -> Option<Record> {
        let (verb, described) = describe(request.method(), request.uri());
        let path = request.uri().path();
        let asked = Asked {
            user: &user.name,
            groups: &user.groups,
            verb: &verb,
            resource: described.as_ref().map(|(r, _)| ResourceAsked {
                group: &r.group,
                resource: &r.resource,
                subresource: r.subresource.as_deref(),
                namespace: &r.namespace,
                name: &r.name,
            }),
            path,
        };
        let (mut level, omitted) = auditor.policy.level(&asked);
        if level == Level::None {
            return None;
        }
        if described
            .as_ref()
            .is_some_and(|(r, _)| carries_credentials(r))
        {
            level = level.min(Level::Metadata);
        }
        let source = request
            .extensions()
            .get::<SocketAddr>()
            .map(|a| vec![a.ip().to_string()])
            .unwrap_or_default();
        let user_agent = request
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let request_uri = request
            .uri()
            .path_and_query()
            .map_or(path.to_owned(), |p| p.as_str().to_owned());
        let (event_user, impersonated) = match impersonator {
            Some(real) => (real.info(), Some(user.info())),
            None => (user.info(), None),
        };
        let mut event = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": level.name(),
            "auditID": uuid::Uuid::new_v4().to_string(),
            "requestURI": request_uri,
            "verb": verb,
            "user": event_user,
            "sourceIPs": source,
            "userAgent": user_agent,
            "requestReceivedTimestamp": now(),
        });
        if let Some(impersonated) = impersonated {
            event["impersonatedUser"] = impersonated;
        }
        if let Some((r, api_version)) = &described {
            let mut reference = json!({"resource": r.resource, "apiVersion": api_version});
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            if !group.is_empty() {
                reference["apiGroup"] = json!(group);
                reference["apiVersion"] = json!(version);
            }
            for (field, value) in [("namespace", &r.namespace), ("name", &r.name)] {
                if !value.is_empty() {
                    reference[field] = json!(value);
                }
            }
            if let Some(sub) = &r.subresource {
                reference["subresource"] = json!(sub);
            }
            event["objectRef"] = reference;
        }
        let record = Record {
            auditor: auditor.clone(),
            level,
            omitted,
            event,
            watch: verb == "watch",
        };
        record.write("RequestReceived");
        Some(record)
    }

    /// Records the object sent (at `Request` and above), as JSON whatever
    /// it was sent as.
    pub(crate) fn request_object(&mut self, body: &[u8], content_type: &str) {
        if self.level < Level::Request || body.is_empty() {
            return;
        }
        let decoded = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
            self.resource()
                .and_then(|resource| portal_api::protobuf::decode(resource, body).ok())
        } else if content_type.starts_with("application/yaml") {
            serde_yaml_ng::from_slice::<Value>(body).ok()
        } else {
            serde_json::from_slice::<Value>(body).ok()
        };
        if let Some(mut object) = decoded {
            self.strip(&mut object);
            self.event["requestObject"] = object;
        }
    }

    /// The served resource the request addresses (by its objectRef).
    fn resource(&self) -> Option<&'static portal_api::Resource> {
        let reference = self.event.get("objectRef")?;
        let text = |f: &str| reference[f].as_str().unwrap_or("");
        portal_api::registry::find(text("apiGroup"), text("apiVersion"), text("resource"))
    }

    /// Records the object answered (at `RequestResponse`).
    pub(crate) fn response_object(&mut self, body: &[u8], content_type: &str) {
        if self.level < Level::RequestResponse || body.is_empty() {
            return;
        }
        let decoded = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
            self.resource()
                .and_then(|resource| portal_api::protobuf::decode(resource, body).ok())
        } else {
            serde_json::from_slice::<Value>(body).ok()
        };
        if let Some(mut object) = decoded {
            self.strip(&mut object);
            self.event["responseObject"] = object;
        }
    }

    fn strip(&self, object: &mut Value) {
        if self.auditor.policy.omit_managed_fields() {
            if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.remove("managedFields");
            }
        }
    }

    /// The answer's code (and, for a failure, its status).
    pub(crate) fn responded(&mut self, code: u16, failure: Option<&Status>) {
        let mut status = json!({"metadata": {}, "code": code});
        if let Some(failure) = failure {
            status["status"] = json!("Failure");
            status["message"] = json!(failure.message);
            status["reason"] = json!(failure.reason);
        }
        self.event["responseStatus"] = status;
    }

    /// Writes the event at `stage` unless the policy leaves it out.
    pub(crate) fn write(&self, stage: &str) {
        if self.omitted.iter().any(|s| s == stage) {
            return;
        }
        let mut event = self.event.clone();
        event["stage"] = json!(stage);
        event["stageTimestamp"] = json!(now());
        if stage == "RequestReceived" {
            if let Some(object) = event.as_object_mut() {
                object.remove("responseStatus");
            }
        }
        match serde_json::to_vec(&event) {
            Ok(line) => self.auditor.sink.write(&line),
            Err(error) => tracing::warn!(%error, "unserializable audit event"),
        }
    }
}

/// Writes the record's last stages for `response` and gives the response
/// back: at once for a plain request (with the body recorded at
/// `RequestResponse`), `ResponseStarted` now and `ResponseComplete` when
/// the stream ends for a watch.
pub(crate) async fn complete(
    mut record: Record,
    response: http::Response<crate::server::http::Body>,
) -> http::Response<crate::server::http::Body> {
    use http_body_util::BodyExt;
    if record.event.get("responseStatus").is_none() {
        record.responded(response.status().as_u16(), None);
    }
    if record.watch && response.status().is_success() {
        record.write("ResponseStarted");
        let (parts, body) = response.into_parts();
        let body = CompletedOnEnd {
            inner: body,
            record: Some(record),
        };
        return http::Response::from_parts(parts, body.boxed());
    }
    if record.level < Level::RequestResponse {
        record.write("ResponseComplete");
        return response;
    }
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    record.response_object(&bytes, &content_type);
    record.write("ResponseComplete");
    http::Response::from_parts(parts, crate::server::http::full(bytes))
}

/// A watch's body: `ResponseComplete` is written when it ends (or the
/// client goes).
struct CompletedOnEnd {
    inner: crate::server::http::Body,
    record: Option<Record>,
}

impl hyper::body::Body for CompletedOnEnd {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CompletedOnEnd {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            record.write("ResponseComplete");
        }
    }
}
