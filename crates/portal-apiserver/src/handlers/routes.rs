//! From an HTTP request to a handler: authentication, the non-resource
//! endpoints, then resource paths by verb. Every request is counted.

use std::sync::Arc;
use std::time::Instant;

use http::{header, Method, Request, Response, StatusCode};
use portal_api::patch::PatchType;
use portal_api::{kinds, path, Resource, Status};

use crate::audit::{self, policy::Level};
use crate::handlers::aggregation;
use crate::handlers::binding;
use crate::handlers::connect;
use crate::handlers::console;
use crate::handlers::discovery;
use crate::handlers::eviction;
use crate::handlers::metrics;
use crate::handlers::openapi;
use crate::handlers::proxy;
use crate::handlers::read;
use crate::handlers::review;
use crate::handlers::scale;
use crate::handlers::token;
use crate::handlers::watch;
use crate::registry::write;
use crate::registry::write::Part;
use crate::security::auth;
use crate::security::join;
use crate::security::node;
use crate::security::user::{self, User};
use crate::server::http::{
    json_response, read_body, status_response, text_response, Body, Output, Query, RequestBody,
};
use crate::{ApiState, Scope};

/// Paths anyone may ask: they reveal nothing and let probes work.
const PUBLIC: [&str; 3] = ["/healthz", "/livez", "/readyz"];

pub(crate) async fn handle(
    state: Arc<ApiState>,
    request: Request<RequestBody>,
    peer: Option<&User>,
) -> Response<Body> {
    use tracing::Instrument;
    let started = Instant::now();
    let mut labels = ("", String::new());
    let mut record: Option<audit::Record> = None;
    // Verb and resource are recorded once the path is understood.
    let span = tracing::debug_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        verb = tracing::field::Empty,
        resource = tracing::field::Empty,
        namespace = tracing::field::Empty,
        name = tracing::field::Empty,
        code = tracing::field::Empty,
    );
    let response = match route(&state, request, peer, &mut labels, &mut record)
        .instrument(span.clone())
        .await
    {
        Ok(response) => response,
        Err(status) => {
            if let Some(record) = record.as_mut() {
                record.responded(status.code, Some(&status));
            }
            status_response(&status)
        }
    };
    let response = match record {
        Some(record) => audit::complete(record, response).await,
        None => response,
    };
    let (verb, resource) = labels;
    span.record("verb", verb);
    span.record("resource", resource.as_str());
    span.record("code", response.status().as_u16());
    state.metrics.observe_request(
        verb,
        &resource,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

fn json_value(value: &serde_json::Value) -> Response<Body> {
    json_response(
        StatusCode::OK,
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

fn kube_verb(method: &Method, named: bool, watching: bool) -> &'static str {
    match (method.as_str(), named) {
        ("GET", _) if watching => "WATCH",
        ("GET", true) => "GET",
        ("GET", false) => "LIST",
        ("POST", _) => "POST",
        ("PUT", _) => "PUT",
        ("PATCH", _) => "PATCH",
        ("DELETE", true) => "DELETE",
        ("DELETE", false) => "DELETECOLLECTION",
        _ => "OTHER",
    }
}

/// Kubernetes' authorization verb for a metrics verb.
fn authorization_verb(verb: &str) -> &'static str {
    match verb {
        "GET" => "get",
        "LIST" => "list",
        "WATCH" => "watch",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        "DELETECOLLECTION" => "deletecollection",
        _ => "",
    }
}

async fn route(
    state: &ApiState,
    request: Request<RequestBody>,
    peer: Option<&User>,
    labels: &mut (&'static str, String),
    record: &mut Option<audit::Record>,
) -> Result<Response<Body>, Status> {
    let uri_path = request.uri().path().to_owned();
    if PUBLIC.contains(&uri_path.as_str()) {
        labels.0 = "GET";
        // The listener opens only once the watch cache has caught up; the
        // other components in the process (the proxy) count for /healthz.
        let unhealthy = state.metrics.unhealthy();
        if uri_path == "/healthz" && !unhealthy.is_empty() {
            return Ok(text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("unhealthy: {}", unhealthy.join(", ")),
            ));
        }
        return Ok(text_response(StatusCode::OK, "ok"));
    }
    // The console's files are public: the page signs in with a token.
    if state.console && console::claims(&uri_path) {
        labels.0 = "GET";
        return Ok(console::serve(
            request.method(),
            &uri_path,
            request.headers(),
        ));
    }
    // Joining nodes: the CA is public, the credential exchange has its
    // own secret.
    match (request.method(), uri_path.as_str()) {
        (&Method::GET, portal_api::join::CACERTS_PATH) => {
            labels.0 = "GET";
            return Ok(join::cacerts(&state.joining));
        }
        (&Method::POST, portal_api::join::CREDENTIAL_PATH) => {
            labels.0 = "POST";
            return join::node_credential(state, request).await;
        }
        _ => {}
    }
    let mut user = user::authenticate(state, request.headers(), peer)?;
    let mut impersonator = None;
    if let Some(asked) = user::impersonation(request.headers())? {
        let acting = auth::authorize_impersonation(state, &user, &asked)?;
        impersonator = Some(std::mem::replace(&mut user, acting));
    }
    let mut request = request;
    if let Some(auditor) = &state.auditor {
        *record = audit::Record::begin(auditor, &request, &user, impersonator.as_ref());
        // The object sent is recorded from the body, read here once.
        let writes = matches!(
            *request.method(),
            Method::POST | Method::PUT | Method::PATCH
        );
        if let Some(record) = record
            .as_mut()
            .filter(|r| r.level >= Level::Request && writes)
        {
            let content_type = content_type(&request);
            let (parts, body) = request.into_parts();
            let bytes = read_body(body).await?;
            record.request_object(&bytes, &content_type);
            request = Request::from_parts(parts, crate::server::http::request_body(bytes));
        }
    }
    user::REQUESTER
        .scope(user.clone(), serve(state, request, user, uri_path, labels))
        .await
}

/// Serves an authenticated request as `user`.
async fn serve(
    state: &ApiState,
    request: Request<RequestBody>,
    user: User,
    uri_path: String,
    labels: &mut (&'static str, String),
) -> Result<Response<Body>, Status> {
    let method = request.method().clone();
    if method == Method::GET {
        labels.0 = "GET";
        let parts: Vec<&str> = uri_path.trim_matches('/').split('/').collect();
        // Discovery, OpenAPI, metrics and the issuer's documents are
        // paths, authorized as such (`nonResourceURLs`).
        let non_resource = matches!(
            parts.as_slice(),
            ["metrics" | "version" | "api" | "apis"]
                | ["api" | "apis", _]
                | ["apis", _, _]
                | ["openapi", ..]
                | [".well-known", "openid-configuration"]
                | ["openid", "v1", "jwks"]
        );
        if non_resource {
            auth::authorize_path(state, &user, "get", &uri_path)?;
        }
        match parts.as_slice() {
            [".well-known", "openid-configuration"] => {
                return Ok(json_value(&state.authn.signer.discovery()))
            }
            ["openid", "v1", "jwks"] => return Ok(json_value(&state.authn.signer.jwks())),
            ["metrics"] => return Ok(text_response(StatusCode::OK, state.metrics.encode())),
            ["version"] => return Ok(json_value(&discovery::version())),
            ["api"] | ["apis"] => {
                // Kinds defined a moment ago are listed.
                crate::registry::defined::sync(state);
                let core = parts.as_slice() == ["api"];
                let accept = request
                    .headers()
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let mut response = match discovery::aggregated_version(accept) {
                    Some(version) => {
                        let mut document = discovery::aggregated(core, version);
                        if !core {
                            aggregation::discovery::extend_aggregated(state, &mut document);
                        }
                        let mut response = json_value(&document);
                        if let Ok(media) =
                            http::HeaderValue::from_str(&discovery::aggregated_media_type(version))
                        {
                            response.headers_mut().insert(header::CONTENT_TYPE, media);
                        }
                        response
                    }
                    None if core => {
                        json_value(&discovery::core_versions(&state.address.to_string()))
                    }
                    None => {
                        let mut list = discovery::group_list();
                        aggregation::discovery::extend_group_list(state, &mut list);
                        json_value(&list)
                    }
                };
                // The answer depends on what was asked for.
                response
                    .headers_mut()
                    .insert(header::VARY, http::HeaderValue::from_static("Accept"));
                return Ok(response);
            }
            ["apis", group] => {
                return discovery::group(group)
                    .or_else(|| aggregation::discovery::group(state, group))
                    .map(|v| json_value(&v))
                    .ok_or_else(Status::no_route)
            }
            ["openapi", "v3"] => return Ok(json_value(&openapi::index())),
            ["openapi", "v2"] => {
                let mut response = json_response(StatusCode::OK, openapi::v2_document());
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    http::HeaderValue::from_static(openapi::V2_PROTOBUF),
                );
                return Ok(response);
            }
            ["openapi", "v3", rest @ ..] => {
                return openapi::document(&rest.join("/"))
                    .map(|document| json_value(&document))
                    .ok_or_else(Status::no_route)
            }
            ["api", version] => {
                return discovery::resource_list("", version)
                    .map(|v| json_value(&v))
                    .ok_or_else(Status::no_route)
            }
            ["apis", group, version] => {
                if let Some(list) = discovery::resource_list(group, version) {
                    return Ok(json_value(&list));
                }
                // An extension server's group version: it answers.
                let Some(api_service) = aggregation::remote_api_service(state, group, version)
                else {
                    return Err(Status::no_route());
                };
                labels.0 = "PROXY";
                labels.1 = format!("{group}/{version}");
                return aggregation::proxy::serve(state, &api_service, &user, request).await;
            }
            _ => {}
        }
    }
    if let Some(target) = proxy::parse(&uri_path) {
        let resource = match target.1 {
            "pods" => &kinds::pod::RESOURCE,
            _ => &kinds::service::RESOURCE,
        };
        let asked = auth::Attributes {
            verb: proxy_verb(&method),
            resource,
            subresource: Some("proxy"),
            namespace: Some(&target.0),
            name: Some(&target.2),
        };
        // No node rule is conditional on a proxy: allowed is allowed.
        let _allowed = auth::authorize(state, &user, &asked)?;
        labels.0 = "PROXY";
        labels.1 = format!("{}/proxy", target.1);
        return proxy::serve(state, target, request).await;
    }
    if let Some(review) = review::parse(&uri_path) {
        labels.0 = "POST";
        labels.1 = review.1.to_owned();
        let content_type = content_type(&request);
        return review::serve(
            state,
            &user,
            &method,
            review,
            &content_type,
            request.into_body(),
        )
        .await;
    }
    let api_path = path::parse(&uri_path).ok_or_else(Status::no_route)?;
    let find =
        || portal_api::registry::find(&api_path.group, &api_path.version, &api_path.resource);
    let found = find();
    if found.is_none() {
        if let Some(api_service) =
            aggregation::remote_api_service(state, &api_path.group, &api_path.version)
        {
            return proxy_to_extension(state, &api_service, &user, &api_path, request, labels)
                .await;
        }
        // The resource metrics this server builds itself (unless an
        // APIService above, metrics-server's, took the group over).
        if api_path.group == metrics::GROUP
            && api_path.version == metrics::VERSION
            && api_path.subresource.is_none()
        {
            labels.0 = if api_path.name.is_some() {
                "GET"
            } else {
                "LIST"
            };
            labels.1 = format!("{}/{}", metrics::GROUP, api_path.resource);
            let target = metrics::Target {
                resource: &api_path.resource,
                namespace: api_path.namespace.as_deref(),
                name: api_path.name.as_deref(),
                watch: api_path.watch_prefix,
            };
            return metrics::serve(state, &user, target, request).await;
        }
    }
    let span = tracing::Span::current();
    if let Some(namespace) = &api_path.namespace {
        span.record("namespace", namespace.as_str());
    }
    if let Some(name) = &api_path.name {
        span.record("name", name.as_str());
    }
    // A kind defined a moment ago may not be served yet.
    let resource: &'static Resource = match found {
        Some(resource) => resource,
        None => {
            crate::registry::defined::sync(state);
            find().ok_or_else(Status::no_route)?
        }
    };
    if !resource.namespaced && api_path.namespace.is_some() {
        return Err(Status::no_route());
    }
    let user_agent = request
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let query = Query::parse(request.uri().query()).with_user_agent(user_agent);
    let watching = api_path.watch_prefix || query.flag("watch");
    labels.0 = kube_verb(&method, api_path.name.is_some(), watching);
    labels.1 = resource.plural.to_owned();
    let scope = Scope {
        resource,
        namespace: api_path.namespace.as_deref(),
    };
    let asked = auth::Attributes {
        verb: authorization_verb(labels.0),
        resource,
        subresource: api_path.subresource.as_deref(),
        namespace: api_path.namespace.as_deref(),
        name: api_path.name.as_deref(),
    };
    // Exec, attach and port-forward are `create` even over a websocket's
    // GET (as Kubernetes requires since 1.30); logs are `get`.
    let connecting = connect::Connect::parse(asked.subresource.unwrap_or_default())
        .filter(|c| *c != connect::Connect::Log && resource.kind() == kinds::pod::KIND);
    let asked = match connecting {
        Some(_) => auth::Attributes {
            verb: "create",
            ..asked
        },
        None => asked,
    };
    let allowed = auth::authorize(state, &user, &asked)?;
    if allowed == auth::Allowed::IfPodOnNode {
        node::check_stored_pod(state, &user, &asked).await?;
    }
    if allowed == auth::Allowed::IfReferencedOnNode {
        node::check_referenced(state, &user, &asked)?;
    }
    if let (Some(connect), Some(name), Some(namespace)) = (
        api_path
            .subresource
            .as_deref()
            .filter(|_| resource.kind() == kinds::pod::KIND)
            .and_then(connect::Connect::parse),
        api_path.name.as_deref(),
        api_path.namespace.as_deref(),
    ) {
        labels.0 = if connect == connect::Connect::Log {
            "GET"
        } else {
            "CONNECT"
        };
        labels.1 = format!(
            "pods/{}",
            api_path.subresource.as_deref().unwrap_or_default()
        );
        return connect::serve(state, namespace, name, connect, request).await;
    }
    let part = match api_path.subresource.as_deref() {
        None => Target::Part(Part::Main),
        Some("status") if resource.has_status => Target::Part(Part::Status),
        Some("finalize") if resource.kind() == kinds::namespace::KIND => {
            Target::Part(Part::Finalize)
        }
        Some("approval") if resource.kind() == kinds::certificate_signing_request::KIND => {
            Target::Part(Part::Approval)
        }
        Some("scale") if scale::supports(&scope) => Target::Scale,
        Some("binding") if resource.kind() == kinds::pod::KIND => Target::Binding,
        Some("eviction") if resource.kind() == kinds::pod::KIND => Target::Eviction,
        Some("token") if resource.kind() == kinds::service_account::KIND => Target::Token,
        Some(_) => return Err(Status::no_route()),
    };
    let output = match Output::negotiate(request.headers(), &query)? {
        // Clients that prefer protobuf accept JSON too (client-go asks
        // `application/vnd.kubernetes.protobuf, application/json`).
        Output::Protobuf if !portal_api::protobuf::supports(resource) => Output::Json,
        output => output,
    };
    let name = api_path.name.as_deref();
    // A write to a namespaced resource names its namespace.
    let needs_namespace = resource.namespaced && scope.namespace.is_none();
    let content_type = content_type(&request);

    match (&method, name, part) {
        (&Method::GET, Some(name), Target::Scale) => scale::get(state, &scope, name, &query).await,
        (&Method::PUT, Some(name), Target::Scale) => {
            let body = read_body(request.into_body()).await?;
            scale::update(state, &scope, name, &body, &query).await
        }
        (&Method::PATCH, Some(name), Target::Scale) => {
            let patch_type = patch_type(&content_type)?;
            let body = read_body(request.into_body()).await?;
            scale::patch(state, &scope, name, patch_type, &body, &query).await
        }
        (_, _, Target::Scale) => Err(not_allowed(&method, &uri_path)),
        (&Method::POST, Some(name), Target::Binding) => {
            let body = read_body(request.into_body()).await?;
            binding::bind(state, &scope, name, &body, &query).await
        }
        (_, _, Target::Binding) => Err(not_allowed(&method, &uri_path)),
        (&Method::POST, Some(name), Target::Eviction) => {
            let body = read_body(request.into_body()).await?;
            eviction::evict(state, &scope, name, &body, &content_type, &query).await
        }
        (_, _, Target::Eviction) => Err(not_allowed(&method, &uri_path)),
        (&Method::POST, Some(name), Target::Token) => {
            let body = read_body(request.into_body()).await?;
            let namespace = scope.namespace.unwrap_or_default();
            token::create(state, namespace, name, &body, &content_type).await
        }
        (_, _, Target::Token) => Err(not_allowed(&method, &uri_path)),
        (&Method::GET, Some(name), _) => read::get(state, &scope, name, &query, output).await,
        (&Method::GET, None, _) if watching => watch::watch(state, &scope, &query, output).await,
        (&Method::GET, None, _) => read::list(state, &scope, &query, output).await,
        (&Method::POST, None, Target::Part(Part::Main)) if !needs_namespace => {
            let body = read_body(request.into_body()).await?;
            let body = write::decode_body(resource, &body, &content_type, &query)?;
            if allowed == auth::Allowed::IfOwnObject {
                node::admit_create(&user, &asked, body.object())?;
            }
            write::create(state, &scope, body, &query).await
        }
        (&Method::PUT, Some(name), Target::Part(part)) if !needs_namespace => {
            let body = read_body(request.into_body()).await?;
            if allowed == auth::Allowed::IfTaintsKept {
                node::check_taints_kept(state, &user, &asked, &body).await?;
            }
            let body = write::decode_body(resource, &body, &content_type, &query)?;
            write::update(state, &scope, name, part, body, &query).await
        }
        (&Method::PATCH, Some(name), Target::Part(part)) if !needs_namespace => {
            let patch_type = PatchType::from_content_type(&content_type)
                .ok_or_else(|| Status::unsupported_media_type(&content_type))?;
            // Kinds users define have no merge strategies (upstream, too).
            if patch_type == PatchType::Strategic
                && resource.custom.is_some_and(|c| !c.strategic_merge())
            {
                let mut refused = Status::unsupported_media_type(&content_type);
                refused.message = "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into();
                return Err(refused);
            }
            let body = read_body(request.into_body()).await?;
            if allowed == auth::Allowed::IfTaintsKept {
                node::check_taints_kept(state, &user, &asked, &body).await?;
            }
            if patch_type == PatchType::Apply {
                return write::apply(state, &scope, name, part, &body, &query).await;
            }
            if query.get("force").is_some() {
                return Err(crate::server::http::invalid_option(
                    "force: Forbidden: may not be specified for non-apply patch".into(),
                ));
            }
            write::patch(state, &scope, name, part, patch_type, &body, &query).await
        }
        (&Method::DELETE, Some(name), Target::Part(Part::Main)) if !needs_namespace => {
            let body = read_body(request.into_body()).await?;
            write::delete(state, &scope, name, &body, &content_type, &query).await
        }
        (&Method::DELETE, None, Target::Part(Part::Main)) if !needs_namespace => {
            super::list_options::check_list(&query)?;
            let body = read_body(request.into_body()).await?;
            write::delete_collection(state, &scope, &body, &content_type, &query).await
        }
        _ => Err(not_allowed(&method, &uri_path)),
    }
}

/// A resource request for an extension server's group version: authorized
/// here as any resource request, then proxied.
async fn proxy_to_extension(
    state: &ApiState,
    api_service: &serde_json::Value,
    user: &User,
    api_path: &path::ApiPath,
    request: Request<RequestBody>,
    labels: &mut (&'static str, String),
) -> Result<Response<Body>, Status> {
    let query = Query::parse(request.uri().query());
    let watching = api_path.watch_prefix || query.flag("watch");
    let verb = kube_verb(request.method(), api_path.name.is_some(), watching);
    let asked = crate::security::rbac::Request::Resource {
        verb: authorization_verb(verb),
        group: &api_path.group,
        resource: &api_path.resource,
        subresource: api_path.subresource.as_deref(),
        name: api_path.name.as_deref(),
    };
    let namespace = api_path.namespace.as_deref();
    if !auth::allowed(state, user, namespace, &asked) {
        return Err(auth::forbidden_request(user, namespace, &asked));
    }
    labels.0 = verb;
    // (The group version, not the caller's resource name: metrics labels
    // stay as few as the APIServices.)
    labels.1 = format!("{}/{}", api_path.group, api_path.version);
    aggregation::proxy::serve(state, api_service, user, request).await
}

/// The request's `Content-Type` ("" when none).
fn content_type<B>(request: &Request<B>) -> String {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The verb of a proxy request (`get` for `GET`, …).
fn proxy_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    }
}

/// What a resource path's subresource addresses.
#[derive(Clone, Copy, Debug)]
enum Target {
    Part(Part),
    Scale,
    Binding,
    Eviction,
    Token,
}

fn not_allowed(method: &Method, path: &str) -> Status {
    Status::method_not_allowed(format!(
        "the server does not allow this method on the requested resource ({method} {path})"
    ))
}

/// The patch format of a PATCH of a scale (server-side apply is not
/// served there).
fn patch_type(content_type: &str) -> Result<PatchType, Status> {
    match PatchType::from_content_type(content_type) {
        Some(PatchType::Apply) | None => Err(Status::unsupported_media_type(content_type)),
        Some(patch_type) => Ok(patch_type),
    }
}
