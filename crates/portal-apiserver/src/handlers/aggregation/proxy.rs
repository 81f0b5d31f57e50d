//! A request for a remote APIService's group version, once authorized
//! here, goes to its extension server: the path and query unchanged, the
//! caller's credentials and identity headers left behind, the user said
//! in `X-Remote-*` headers over this server's front-proxy client
//! certificate; the answer streams back (watches too), upgrades are
//! spliced.

use http::{Request, Response};
use portal_api::Status;
use serde_json::Value;

use crate::handlers::proxy::{prepare, relay, Prepared, Upstream};
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
    let unreachable = |e: &dyn std::fmt::Display| {
        Status::service_unavailable(format!("error trying to reach service: {e}"))
    };
    let destination = super::destination(state, api_service)
        .await
        .map_err(|e| unreachable(&e))?;
    let uri = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let upstream = Upstream {
        uri,
        host: super::service_host(api_service),
        dropped: super::identity_header,
        added: super::identity_headers(&user.name, &user.groups, &user.extra),
    };
    let Prepared { outgoing, upgrade } = prepare(request, upstream)?;
    let pool = &state.aggregator.connections;
    // A kept connection first; one the server closed meanwhile gives the
    // request back, which then goes on a new one.
    let (mut sender, response) = match pool.take(&destination) {
        Some(mut kept) => match kept.try_send_request(outgoing).await {
            Ok(response) => (kept, response),
            Err(mut failed) => match failed.take_message() {
                Some(outgoing) => send_fresh(state, api_service, &destination, outgoing)
                    .await
                    .map_err(|e| unreachable(&e))?,
                None => return Err(unreachable(failed.error())),
            },
        },
        None => send_fresh(state, api_service, &destination, outgoing)
            .await
            .map_err(|e| unreachable(&e))?,
    };
    // Kept once the answer has been read (an upgraded one is spliced, and
    // its connection is no longer HTTP).
    if upgrade.is_none() {
        let pool = pool.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                pool.give(destination, sender);
            }
        });
    }
    relay(response, upgrade)
}

/// Sends `outgoing` on a new connection to `destination`.
async fn send_fresh(
    state: &ApiState,
    api_service: &Value,
    destination: &super::Destination,
    outgoing: Request<RequestBody>,
) -> Result<(Sender, Response<hyper::body::Incoming>), String> {
    let mut sender: Sender = super::dial(state, api_service, destination).await?;
    let response = sender
        .send_request(outgoing)
        .await
        .map_err(|e| e.to_string())?;
    Ok((sender, response))
}

type Sender = hyper::client::conn::http1::SendRequest<RequestBody>;
