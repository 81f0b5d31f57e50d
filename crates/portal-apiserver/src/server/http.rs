//! HTTP plumbing shared by the handlers: the response body type, JSON and
//! Status responses, bounded body reading, query parameters, and what the
//! handlers that pass requests on (`connect`, `proxy`) need of an upstream:
//! an HTTP/1 connection that keeps upgrades, a relayed body, a splice.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use portal_api::Status;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// A request's body, from a connection or from the loopback client.
pub(crate) type RequestBody = UnsyncBoxBody<Bytes, BodyError>;

/// Why reading a request body failed (the connection's error, or the
/// loopback client's).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct BodyError(Box<dyn std::error::Error + Send + Sync>);

impl BodyError {
    pub(crate) fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        BodyError(Box::new(error))
    }
}

/// A request read from a connection, with the body every handler takes.
pub(crate) fn from_connection(request: http::Request<Incoming>) -> http::Request<RequestBody> {
    request.map(|body| body.map_err(BodyError::new).boxed_unsync())
}

/// Request bodies larger than this are refused with 413, like Kubernetes.
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A request body already read (to be read again by the handler).
pub(crate) fn request_body(bytes: Bytes) -> RequestBody {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

pub(crate) fn json_response(code: StatusCode, json: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(full(json));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `201 Created` with a Success Status, as kube-apiserver answers a
/// `create` on a subresource that makes no object (binding, eviction).
pub(crate) fn created_success() -> Response<Body> {
    let success = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    json_response(
        StatusCode::CREATED,
        serde_json::to_vec(&success).unwrap_or_default(),
    )
}

pub(crate) fn status_response(status: &Status) -> Response<Body> {
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, status.to_body())
}

pub(crate) fn text_response(code: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(full(text));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Reads a request body, refusing more than [`MAX_BODY`] bytes.
pub(crate) async fn read_body(body: RequestBody) -> Result<Bytes, Status> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(Status::too_large(
            format!("the request body is larger than the limit of {MAX_BODY} bytes"),
        )),
        Err(error) => Err(Status::bad_request(format!(
            "reading the request body failed: {error}"
        ))),
    }
}

/// Query parameters of one request, and the client's `User-Agent` (the
/// field manager of a write that names none).
#[derive(Debug, Default)]
pub(crate) struct Query {
    params: Vec<(String, String)>,
    user_agent: String,
}

impl Query {
    pub(crate) fn parse(query: Option<&str>) -> Self {
        Query {
            params: form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
            user_agent: String::new(),
        }
    }

    /// The request's `User-Agent`, for [`Query::field_manager`].
    pub(crate) fn with_user_agent(mut self, user_agent: &str) -> Self {
        self.user_agent = user_agent.to_owned();
        self
    }

    /// Who a write records as its field manager: `fieldManager`, else the
    /// user agent up to its first `/` (`kubectl/v1.32.0 (…)` → `kubectl`),
    /// as Kubernetes does.
    pub(crate) fn field_manager(&self) -> Result<String, Status> {
        use portal_api::managed::MAX_MANAGER_LENGTH;
        if let Some(given) = self.get("fieldManager").filter(|m| !m.is_empty()) {
            if given.len() > MAX_MANAGER_LENGTH {
                return Err(invalid_option(format!(
                    "fieldManager: Too long: may not be more than {MAX_MANAGER_LENGTH} bytes"
                )));
            }
            if given.chars().any(|c| c.is_control()) {
                return Err(invalid_option(format!(
                    "fieldManager: Invalid value: {given:?}: must be printable"
                )));
            }
            return Ok(given.to_owned());
        }
        let prefix = self.user_agent.split('/').next().unwrap_or_default();
        let prefix: String = prefix
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_MANAGER_LENGTH)
            .collect();
        Ok(prefix)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean parameter as Kubernetes reads one: present and not
    /// `0`, `false` or `off` (any case) is true, even empty.
    pub(crate) fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| {
            !["0", "false", "off"]
                .iter()
                .any(|no| v.eq_ignore_ascii_case(no))
        })
    }

    /// A non-negative integer parameter; 400 when malformed.
    pub(crate) fn number(&self, name: &str) -> Result<Option<u64>, Status> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Status::bad_request(format!(
                        "invalid {name} {v:?}: must be a non-negative integer"
                    ))
                })
            })
            .transpose()
    }
}

/// A write's options refused as Kubernetes words it (422).
pub(crate) fn invalid_option(detail: String) -> Status {
    let mut status = Status::invalid(
        portal_api::Target {
            group: "meta.k8s.io",
            resource: "",
            kind: "PatchOptions",
        },
        "",
        Vec::new(),
    );
    status.message = format!("PatchOptions.meta.k8s.io \"\" is invalid: {detail}");
    status
}

/// How unknown fields in a body are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl FieldValidation {
    pub(crate) fn from_query(query: &Query) -> Result<Self, Status> {
        match query.get("fieldValidation") {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(Status::bad_request(format!(
                "fieldValidation parameter unsupported: {other}; must be one of Ignore, Warn, Strict"
            ))),
        }
    }
}

/// How objects are rendered for a read, from the `Accept` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Json,
    /// `application/json;as=Table;v=v1;g=meta.k8s.io`, as `kubectl get` asks.
    Table(portal_api::table::IncludeObject),
    /// `application/json;as=PartialObjectMetadata(List);g=meta.k8s.io;v=v1`:
    /// only each object's metadata, as metadata watchers and garbage
    /// collectors ask.
    Metadata,
    /// `application/vnd.kubernetes.protobuf` asked first: one object in
    /// protobuf (lists and watches answer JSON, which client-go reads by
    /// the answer's Content-Type).
    Protobuf,
}

/// An object as `PartialObjectMetadata`: its metadata alone.
pub(crate) fn partial_metadata(object: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"],
    })
}

impl Output {
    pub(crate) fn negotiate(headers: &http::HeaderMap, query: &Query) -> Result<Self, Status> {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // The first media range asking for a form Portal serves wins.
        let wanted = accept.split(',').find_map(|range| {
            let params: Vec<&str> = range.split(';').map(str::trim).collect();
            if !params.contains(&"g=meta.k8s.io") || !params.contains(&"v=v1") {
                return None;
            }
            params.iter().find_map(|p| match *p {
                "as=Table" => Some(true),
                "as=PartialObjectMetadata" | "as=PartialObjectMetadataList" => Some(false),
                _ => None,
            })
        });
        let protobuf_first = accept
            .split(',')
            .next()
            .map(|range| range.split(';').map(str::trim).collect::<Vec<_>>())
            .is_some_and(|params| {
                params[0] == portal_api::protobuf::MEDIA_TYPE
                    && !params.iter().any(|p| p.starts_with("as="))
            });
        match wanted {
            None if protobuf_first => return Ok(Output::Protobuf),
            None => return Ok(Output::Json),
            Some(false) => return Ok(Output::Metadata),
            Some(true) => {}
        }
        let include = portal_api::table::IncludeObject::parse(query.get("includeObject"))
            .map_err(Status::bad_request)?;
        Ok(Output::Table(include))
    }
}

/// Seconds since the epoch, for ages in tables.
pub(crate) fn now_seconds() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Each direction of a spliced connection moves this much at a time
/// (tokio's default of 8 KiB makes small TLS records).
const SPLICE_BUFFER: usize = 64 * 1024;

/// An HTTP/1 client connection over `io`, upgrades kept, driven in the
/// background.
pub(crate) async fn upstream_connection<I, B>(
    io: I,
) -> hyper::Result<hyper::client::conn::http1::SendRequest<B>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// An upstream body passed on as it arrives; an error ends it.
pub(crate) fn relay_body(body: Incoming) -> Body {
    use futures_util::StreamExt;
    let frames = http_body_util::BodyStream::new(body)
        .take_while(|frame| std::future::ready(frame.is_ok()))
        .filter_map(|frame| {
            std::future::ready(
                frame
                    .ok()
                    .and_then(|f| f.into_data().ok())
                    .map(|d| Ok(hyper::body::Frame::data(d))),
            )
        });
    BodyExt::boxed(http_body_util::StreamBody::new(frames))
}

/// Joins two upgraded connections once both upgrades complete, until both
/// directions end.
pub(crate) fn splice(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    use hyper_util::rt::TokioIo;
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) = (client.await, upstream.await) else {
            return;
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        let _ = tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            SPLICE_BUFFER,
            SPLICE_BUFFER,
        )
        .await;
    });
}

#[cfg(test)]
mod tests {
    use super::Query;

    #[test]
    fn flags_read_as_kubernetes_reads_booleans() {
        let query = Query::parse(Some("watch=True&a=&b=off&c=FALSE&d=0&e=yes"));
        assert!(query.flag("watch") && query.flag("a") && query.flag("e"));
        assert!(!query.flag("b") && !query.flag("c") && !query.flag("d"));
        assert!(!query.flag("missing"));
    }
}
