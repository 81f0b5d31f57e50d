//! The loopback client: how components in the server's own process (the
//! controllers, the DNS, the cluster duties' election) talk to it. Requests
//! go straight to the request handler in memory — no socket, no TLS, no
//! kubeconfig file read back — and go through everything else a request
//! goes through (authorization, admission, the registry, metrics), as the
//! `system:apiserver` user of Kubernetes' loopback client (in
//! `system:masters`).
//!
//! It holds the server weakly: once the server has stopped, requests fail
//! with a clear error instead of keeping its state alive.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use crate::handlers::routes;
use crate::security::user::User;
use crate::server::http::{status_response, Body, BodyError, RequestBody};
use crate::ApiState;

/// A `tower::Service` answering requests in memory.
#[derive(Clone)]
pub(crate) struct Loopback {
    state: Weak<ApiState>,
    /// Sent when a request has none: it names the field manager of the
    /// component's writes (Kubernetes' controllers send
    /// `kube-controller-manager/…`).
    user_agent: HeaderValue,
    /// Who the component is (a superuser unless given a least-privilege
    /// identity of its own).
    user: User,
}

impl Loopback {
    pub(crate) fn client(state: Weak<ApiState>, user_agent: &str, user: User) -> kube::Client {
        let user_agent = HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| HeaderValue::from_static("portal"));
        kube::Client::new(
            Loopback {
                state,
                user_agent,
                user,
            },
            "default",
        )
    }
}

impl tower::Service<Request<kube::client::Body>> for Loopback {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let state = self.state.upgrade();
        let user_agent = self.user_agent.clone();
        let user = self.user.clone();
        Box::pin(async move {
            let Some(state) = state else {
                let stopped = portal_api::Status::service_unavailable("the API server has stopped");
                return Ok(status_response(&stopped));
            };
            let (mut parts, body) = request.into_parts();
            parts
                .headers
                .entry(header::USER_AGENT)
                .or_insert(user_agent);
            let body: RequestBody = body.map_err(BodyError::new).boxed_unsync();
            let request = Request::from_parts(parts, body);
            Ok(routes::handle(state, request, Some(&user)).await)
        })
    }
}
