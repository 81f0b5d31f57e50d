//! A request for a remote APIService's group version, once authorized
//! here, goes to its extension server: the path and query unchanged, the
//! caller's credentials and identity headers left behind, the user said
//! in `X-Remote-*` headers over this server's front-proxy client
//! certificate; the answer streams back (watches too), upgrades are
//! spliced.

use http::{Request, Response};
use portal_api::Status;
use serde_json::Value;

use crate::handlers::proxy::{forward, Upstream};
use crate::security::user::User;
use crate::server::http::{Body, RequestBody};
use crate::ApiState;

/// Serves one request for `api_service`'s group version as `user`.
pub(crate) async fn serve(
    state: &ApiState,
    api_service: &Value,
    user: &User,
    request: Request<RequestBody>,
) -> Result<Response<Body>, Status> {
    // As kube-aggregator: until it passes its checks, nothing is sent.
    if !super::available(api_service) {
        return Err(Status::service_unavailable("service unavailable"));
    }
    let (sender, address) = super::connect(state, api_service)
        .await
        .map_err(|e| Status::service_unavailable(format!("error trying to reach service: {e}")))?;
    let uri = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let service = &api_service["spec"]["service"];
    let host = format!(
        "{}.{}.svc:{}",
        service["name"].as_str().unwrap_or(""),
        service["namespace"].as_str().unwrap_or(""),
        service["port"].as_u64().unwrap_or(443)
    );
    let upstream = Upstream {
        uri,
        host,
        dropped: super::identity_header,
        added: super::identity_headers(&user.name, &user.groups, &user.extra),
    };
    let unreachable = |e: &dyn std::fmt::Display| {
        Status::service_unavailable(format!("error trying to reach service {address}: {e}"))
    };
    forward(sender, request, upstream, &unreachable).await
}
