//! Admission webhooks: the Mutating- and ValidatingWebhookConfigurations in
//! the watch cache, called over HTTPS with an `admission.k8s.io/v1`
//! AdmissionReview for every write their rules, namespace and object
//! selectors and match conditions select. Mutating webhooks run before the
//! server's checks, in order, and may change the object by JSON patch
//! (those with `reinvocationPolicy: IfNeeded` are asked once more when a
//! later one changed it); validating webhooks run after, and may refuse.
//! A webhook that cannot be reached, times out or answers nonsense fails
//! the write under `failurePolicy: Fail` and is skipped under `Ignore`.
//!
//! A Service webhook is reached at a ready endpoint of the Service (as the
//! proxy subresource reaches it), verified as `<service>.<namespace>.svc`
//! against the webhook's `caBundle`; a URL webhook at its host. Without a
//! `caBundle` the cluster CA is trusted (upstream trusts the system roots).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use portal_api::kinds::{
    mutating_webhook_configuration as mutating, validating_webhook_configuration as validating,
};
use portal_api::patch::PatchType;
use portal_api::{Resource, Status};
use rustls_pki_types::ServerName;
use serde_json::{json, Value};

use super::policies::{matches, Request};
use crate::ApiState;

/// The largest answer read from a webhook.
const MAX_RESPONSE: usize = 10 * 1024 * 1024;

/// One webhook of a configuration, with the configuration it came from.
struct Webhook {
    configuration: String,
    spec: Value,
}

impl Webhook {
    fn name(&self) -> &str {
        self.spec["name"].as_str().unwrap_or("")
    }

    fn fail_closed(&self) -> bool {
        self.spec["failurePolicy"] != "Ignore"
    }
}

/// The webhooks of every configuration of `resource`'s kind, ordered by
/// configuration name, then as listed (as upstream orders them).
fn webhooks(state: &ApiState, resource: &Resource) -> Vec<Webhook> {
    let (configurations, _, _) =
        state
            .cache
            .list(resource, &resource.key_prefix(), None, 0, |_| true);
    let mut all = Vec::new();
    for configuration in configurations {
        let name = configuration.value["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        for spec in configuration.value["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            all.push(Webhook {
                configuration: name.clone(),
                spec: spec.clone(),
            });
        }
    }
    all
}

/// Whether `webhook` is asked about `request`.
fn selects(
    webhook: &Webhook,
    request: &Request<'_>,
    namespace: Option<&Value>,
) -> Result<bool, Status> {
    let resources = json!({
        "resourceRules": webhook.spec["rules"],
        "namespaceSelector": webhook.spec["namespaceSelector"],
        "objectSelector": webhook.spec["objectSelector"],
    });
    if !matches(&resources, request, namespace, true) {
        return Ok(false);
    }
    for condition in webhook.spec["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let expression = condition["expression"].as_str().unwrap_or("");
        match super::policies::condition_holds(expression, request, namespace) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(error) if webhook.fail_closed() => {
                return Err(Status::internal(format!(
                    "failed calling webhook {:?}: match condition {:?}: {error}",
                    webhook.name(),
                    condition["name"].as_str().unwrap_or("")
                )))
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// The mutating webhooks' say on `object`: it is changed in place; the
/// warnings to return, or the refusal.
pub(crate) async fn mutate(
    state: &ApiState,
    request: &Request<'_>,
    object: &mut Value,
) -> Result<Vec<String>, Status> {
    let hooks = webhooks(state, &mutating::RESOURCE);
    let mut warnings = Vec::new();
    if hooks.is_empty() {
        return Ok(warnings);
    }
    let namespace = super::policies::namespace_object(state, request);
    let mut called: Vec<(usize, Value)> = Vec::new();
    let mut changed_after = vec![false; hooks.len()];
    for (i, hook) in hooks.iter().enumerate() {
        let current = object.clone();
        let view = Request {
            object: &current,
            ..*request
        };
        if !selects(hook, &view, namespace.as_ref())? {
            continue;
        }
        let before = object.clone();
        call_and_patch(state, hook, &view, object, &mut warnings).await?;
        if *object != before {
            // Every webhook called before this one saw an older object.
            for (earlier, _) in &called {
                changed_after[*earlier] = true;
            }
        }
        called.push((i, object.clone()));
    }
    // Reinvocation: once, for those that asked and missed a change.
    for (i, _) in called.clone() {
        let hook = &hooks[i];
        if !changed_after[i] || hook.spec["reinvocationPolicy"] != "IfNeeded" {
            continue;
        }
        let current = object.clone();
        let view = Request {
            object: &current,
            ..*request
        };
        call_and_patch(state, hook, &view, object, &mut warnings).await?;
    }
    Ok(warnings)
}

async fn call_and_patch(
    state: &ApiState,
    hook: &Webhook,
    request: &Request<'_>,
    object: &mut Value,
    warnings: &mut Vec<String>,
) -> Result<(), Status> {
    let Some(response) = call(state, hook, request).await? else {
        return Ok(());
    };
    warnings.extend(response_warnings(&response));
    refuse_unless_allowed(hook, &response)?;
    let Some(patch) = response["patch"].as_str() else {
        return Ok(());
    };
    if response["patchType"] != "JSONPatch" {
        return failed(
            hook,
            format!("unsupported patch type {}", response["patchType"]),
        );
    }
    let patch = match base64::engine::general_purpose::STANDARD.decode(patch) {
        Ok(patch) => patch,
        Err(e) => return failed(hook, format!("the patch is not base64: {e}")),
    };
    let resource = request.scope.resource;
    let patched = match portal_api::patch::apply(resource, PatchType::Json, object, &patch) {
        Ok(patched) => patched,
        Err(e) => return failed(hook, format!("the patch does not apply: {e:?}")),
    };
    // The patched object is read again as a client's would be: wrong
    // types refused, unknown fields dropped, defaults filled in.
    match resource.decode_value(patched) {
        Ok(decoded) => {
            *object = decoded.object;
            resource.apply_defaults(object);
            Ok(())
        }
        Err(e) => failed(hook, format!("the patched object does not decode: {e}")),
    }
}

/// The validating webhooks' say on `request`: the warnings to return, or
/// the refusal. They are asked one after another.
pub(crate) async fn validate(
    state: &ApiState,
    request: &Request<'_>,
) -> Result<Vec<String>, Status> {
    let hooks = webhooks(state, &validating::RESOURCE);
    let mut warnings = Vec::new();
    if hooks.is_empty() {
        return Ok(warnings);
    }
    let namespace = super::policies::namespace_object(state, request);
    for hook in &hooks {
        if !selects(hook, request, namespace.as_ref())? {
            continue;
        }
        if let Some(response) = call(state, hook, request).await? {
            warnings.extend(response_warnings(&response));
            refuse_unless_allowed(hook, &response)?;
        }
    }
    Ok(warnings)
}

fn response_warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// A refusal in upstream's words (`admission webhook "x" denied the
/// request: …`), with the webhook's code when it is an error code.
fn refuse_unless_allowed(hook: &Webhook, response: &Value) -> Result<(), Status> {
    if response["allowed"] == true {
        return Ok(());
    }
    let result = &response["status"];
    let denied = format!("admission webhook {:?} denied the request", hook.name());
    let message = match result["message"].as_str().filter(|m| !m.is_empty()) {
        Some(message) => format!("{denied}: {message}"),
        None => format!("{denied} without explanation"),
    };
    let code = result["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    // The reasons Kubernetes names; anything else reads as BadRequest.
    const REASONS: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    let reason = result["reason"].as_str().unwrap_or("BadRequest");
    let mut status = Status::bad_request(message);
    status.code = code;
    status.reason = REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("BadRequest");
    Err(status)
}

/// A webhook that could not be asked: refused under `Fail`, skipped under
/// `Ignore`.
fn failed(hook: &Webhook, error: String) -> Result<(), Status> {
    if hook.fail_closed() {
        Err(Status::internal(format!(
            "failed calling webhook {:?}: {error}",
            hook.name()
        )))
    } else {
        tracing::info!(webhook = %hook.name(), configuration = %hook.configuration, %error, "webhook failed; ignored (failurePolicy: Ignore)");
        Ok(())
    }
}

/// Asks one webhook: its `response`, or `None` when it failed and is
/// ignored.
async fn call(
    state: &ApiState,
    hook: &Webhook,
    request: &Request<'_>,
) -> Result<Option<Value>, Status> {
    let uid = uuid::Uuid::new_v4().to_string();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": review_request(&uid, request),
    });
    let timeout = Duration::from_secs(
        hook.spec["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let answer = tokio::time::timeout(timeout, post(state, hook, &review, timeout)).await;
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => {
            return failed(hook, format!("failed to call webhook: {error}")).map(|()| None)
        }
        Err(_) => {
            return failed(
                hook,
                format!(
                    "failed to call webhook: the webhook did not answer within {}s",
                    timeout.as_secs()
                ),
            )
            .map(|()| None)
        }
    };
    let response = &answer["response"];
    if !response.is_object() {
        return failed(hook, "the answer has no response".into()).map(|()| None);
    }
    if response["uid"] != uid.as_str() {
        return failed(
            hook,
            format!("expected response.uid={uid:?}, got {}", response["uid"]),
        )
        .map(|()| None);
    }
    Ok(Some(response.clone()))
}

/// The `request` of an AdmissionReview.
fn review_request(uid: &str, request: &Request<'_>) -> Value {
    let resource = request.scope.resource;
    let user = crate::security::user::requester();
    let kind =
        json!({"group": resource.group, "version": resource.version, "kind": resource.kind_name});
    let plural =
        json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
    let options_kind = if request.old.is_some() {
        "UpdateOptions"
    } else {
        "CreateOptions"
    };
    let mut review = json!({
        "uid": uid,
        "kind": kind,
        "resource": plural,
        "requestKind": kind,
        "requestResource": plural,
        "name": request.name(),
        "operation": request.operation(),
        "userInfo": user.map(|u| json!({"username": u.name, "uid": u.uid, "groups": u.groups, "extra": u.extra}))
            .unwrap_or(json!({})),
        "object": request.object,
        "oldObject": request.old.cloned().unwrap_or(Value::Null),
        "dryRun": request.write.dry_run,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    });
    if let Some(namespace) = request.scope.namespace {
        review["namespace"] = json!(namespace);
    }
    if let Some(sub) = request.write.subresource {
        review["subResource"] = json!(sub);
    }
    review
}

/// POSTs the review to the webhook; its parsed answer.
async fn post(
    state: &ApiState,
    hook: &Webhook,
    review: &Value,
    timeout: Duration,
) -> Result<Value, String> {
    let config = &hook.spec["clientConfig"];
    let (address, server_name, path) = match config["url"].as_str() {
        Some(url) => {
            let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
            let host = uri
                .host()
                .ok_or("the URL has no host")?
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let address = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| format!("{host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host}: no address"))?;
            let path = uri
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or("/".into());
            (address, host, path)
        }
        None => {
            let service = &config["service"];
            let namespace = service["namespace"].as_str().unwrap_or("");
            let name = service["name"].as_str().unwrap_or("");
            let port = service["port"].as_u64().unwrap_or(443).to_string();
            let address =
                crate::registry::lookup::service_endpoint(state, namespace, name, Some(&port))
                    .await
                    .map_err(|status| status.message)?;
            let path = service["path"].as_str().unwrap_or("/").to_owned();
            (address, format!("{name}.{namespace}.svc"), path)
        }
    };
    let key = PoolKey {
        address,
        server_name: server_name.clone(),
        bundle: config["caBundle"].as_str().unwrap_or("").to_owned(),
    };
    let separator = if path.contains('?') { '&' } else { '?' };
    let body = Bytes::from(serde_json::to_vec(review).map_err(|e| e.to_string())?);
    let request = || {
        http::Request::post(format!("{path}{separator}timeout={}s", timeout.as_secs()))
            .header(http::header::HOST, server_name.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())
    };
    let (mut sender, response) = match take(&key) {
        Some(mut idle) => match idle.send_request(request()?).await {
            Ok(response) => (idle, response),
            // The webhook closed the idle connection: a new one.
            Err(_) => {
                let mut sender = dial(state, config, address, &server_name).await?;
                let response = sender
                    .send_request(request()?)
                    .await
                    .map_err(|e| e.to_string())?;
                (sender, response)
            }
        },
        None => {
            let mut sender = dial(state, config, address, &server_name).await?;
            let response = sender
                .send_request(request()?)
                .await
                .map_err(|e| e.to_string())?;
            (sender, response)
        }
    };
    let code = response.status();
    let body = Limited::new(response.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if sender.ready().await.is_ok() {
        give(key, sender);
    }
    if !code.is_success() {
        return Err(format!(
            "the server answered {code}: {}",
            String::from_utf8_lossy(&body[..body.len().min(512)])
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the answer is not an AdmissionReview: {e}"))
}

/// A connection to a webhook, kept for the next review (as upstream's
/// HTTP client keeps them alive): dialling TLS for every write would cost
/// more than the review.
type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Connections are shared by the same address, name and trust.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    address: std::net::SocketAddr,
    server_name: String,
    bundle: String,
}

/// Idle connections kept per webhook endpoint.
const IDLE_PER_ENDPOINT: usize = 8;

fn pool() -> &'static parking_lot::Mutex<std::collections::HashMap<PoolKey, Vec<Sender>>> {
    static POOL: std::sync::OnceLock<
        parking_lot::Mutex<std::collections::HashMap<PoolKey, Vec<Sender>>>,
    > = std::sync::OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// An idle connection that is still open.
fn take(key: &PoolKey) -> Option<Sender> {
    let mut pool = pool().lock();
    let idle = pool.get_mut(key)?;
    while let Some(sender) = idle.pop() {
        if !sender.is_closed() {
            return Some(sender);
        }
    }
    None
}

fn give(key: PoolKey, sender: Sender) {
    let mut pool = pool().lock();
    // Endpoints come and go: forget those whose connections all closed.
    pool.retain(|_, idle| {
        idle.retain(|s| !s.is_closed());
        !idle.is_empty()
    });
    let idle = pool.entry(key).or_default();
    if idle.len() < IDLE_PER_ENDPOINT {
        idle.push(sender);
    }
}

async fn dial(
    state: &ApiState,
    config: &Value,
    address: std::net::SocketAddr,
    server_name: &str,
) -> Result<Sender, String> {
    let tls = tls_config(state, config)?;
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("dial tcp {address}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    crate::server::http::upstream_connection(stream)
        .await
        .map_err(|e| e.to_string())
}

/// TLS trusting the webhook's `caBundle` (the cluster CA without one).
fn tls_config(state: &ApiState, config: &Value) -> Result<Arc<rustls::ClientConfig>, String> {
    let bundle = match config["caBundle"].as_str().filter(|b| !b.is_empty()) {
        Some(bundle) => base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| format!("caBundle: {e}"))?,
        None => state.joining.ca_pem.as_bytes().to_vec(),
    };
    let roots = crate::security::pki::roots(&bundle)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(tls))
}
