//! `serviceaccounts/{name}/token`: the TokenRequest API (`kubectl create
//! token`, and how a node gets its pods' tokens). Issues a JWT for the
//! account, for the audiences asked (this server's by default), for an
//! hour unless asked otherwise (ten minutes at least), optionally bound to
//! a pod, secret or node so that it dies with it.

use http::{Response, StatusCode};
use portal_api::kinds::{node, pod, secret, service_account};
use portal_api::{Cause, Status, Target};
use serde_json::{json, Value};

use crate::registry::lookup::current;
use crate::security::tokens::{Claims, Private, Ref};
use crate::security::user::requester;
use crate::server::http::{json_response, Body};
use crate::ApiState;

/// A token's default life.
const DEFAULT_SECONDS: i64 = 3600;
/// The life the token volume asks for: such pod-bound tokens are valid
/// for a year, and say when to refresh (`warnafter`), as Kubernetes'
/// `--service-account-extend-token-expiration` does.
const EXTENDABLE_SECONDS: i64 = 3607;
const EXTENDED_SECONDS: i64 = 365 * 24 * 3600;

const TOKEN_REQUEST: Target<'static> = Target {
    group: "authentication.k8s.io",
    resource: "tokenrequests",
    kind: "TokenRequest",
};

pub(crate) async fn create(
    state: &ApiState,
    namespace: &str,
    name: &str,
    body: &[u8],
    content_type: &str,
) -> Result<Response<Body>, Status> {
    let mut request =
        super::review::decode_request(body, content_type, "authentication.k8s.io", "TokenRequest")?;
    let spec = &request["spec"];
    let seconds = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_SECONDS);
    let mut causes = Vec::new();
    if seconds < 600 {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            seconds,
            "may not specify a duration less than 10 minutes",
        ));
    } else if seconds > 1 << 32 {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            seconds,
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(list) if !list.is_empty() => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => state.authn.signer.audiences.clone(),
    };
    if !causes.is_empty() {
        return Err(Status::invalid(TOKEN_REQUEST, name, causes));
    }
    let account = current(state, &service_account::RESOURCE, Some(namespace), name)
        .await?
        .ok_or_else(|| {
            Status::not_found(
                crate::Scope {
                    resource: &service_account::RESOURCE,
                    namespace: Some(namespace),
                }
                .target(),
                name,
            )
        })?;
    let mut private = Private {
        namespace: namespace.to_owned(),
        serviceaccount: Ref {
            name: name.to_owned(),
            uid: uid(&account),
        },
        ..Private::default()
    };
    let bound = &spec["boundObjectRef"];
    let bound_kind = bound["kind"].as_str().unwrap_or("");
    let bound_name = bound["name"].as_str().unwrap_or("");
    let bound_uid = bound["uid"].as_str().unwrap_or("");
    match bound_kind {
        "" => {}
        "Pod" | "Secret" | "Node" => {
            let (resource, ns) = match bound_kind {
                "Pod" => (&pod::RESOURCE, Some(namespace)),
                "Secret" => (&secret::RESOURCE, Some(namespace)),
                _ => (&node::RESOURCE, None),
            };
            let object = current(state, resource, ns, bound_name)
                .await?
                .ok_or_else(|| {
                    Status::not_found(
                        crate::Scope {
                            resource,
                            namespace: ns,
                        }
                        .target(),
                        bound_name,
                    )
                })?;
            let object_uid = uid(&object);
            if !bound_uid.is_empty() && bound_uid != object_uid {
                let mut status = Status::conflict(TOKEN_REQUEST, name);
                status.message = format!("the UID in the bound object reference ({bound_uid}) does not match the UID in record. The object might have been deleted and then recreated");
                return Err(status);
            }
            let reference = Ref {
                name: bound_name.to_owned(),
                uid: object_uid,
            };
            match bound_kind {
                "Pod" => {
                    let runs_as = object["spec"]["serviceAccountName"]
                        .as_str()
                        .unwrap_or("default");
                    if runs_as != name {
                        return Err(Status::bad_request(format!(
                            "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                        )));
                    }
                    if let Some(node_name) = object["spec"]["nodeName"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                    {
                        let node_uid = current(state, &node::RESOURCE, None, node_name)
                            .await?
                            .map(|n| uid(&n))
                            .unwrap_or_default();
                        private.node = Some(Ref {
                            name: node_name.to_owned(),
                            uid: node_uid,
                        });
                    }
                    private.pod = Some(reference);
                }
                "Secret" => private.secret = Some(reference),
                _ => private.node = Some(reference),
            }
        }
        other => {
            return Err(Status::bad_request(format!(
                "cannot bind token to object of type {other}"
            )))
        }
    }
    // NodeRestriction: a node asks only for tokens bound to its own pods.
    if let Some(user) = requester() {
        if let Some(node) = user.node() {
            let on_node =
                private.pod.is_some() && private.node.as_ref().is_some_and(|n| n.name == node);
            if !on_node {
                return Err(Status::forbidden(format!(
                    "serviceaccounts {name:?} is forbidden: node {node:?} can only request tokens bound to pods scheduled on it"
                )));
            }
        }
    }
    let now = jiff::Timestamp::now().as_second();
    let life = if seconds == EXTENDABLE_SECONDS && private.pod.is_some() {
        private.warnafter = Some(now + seconds);
        EXTENDED_SECONDS
    } else {
        seconds
    };
    let claims = Claims {
        iss: state.authn.signer.issuer.clone(),
        sub: service_account::user_name(namespace, name),
        aud: audiences.clone(),
        exp: now + life,
        iat: now,
        nbf: now,
        jti: uuid::Uuid::new_v4().to_string(),
        kubernetes: private,
    };
    let token = state.authn.signer.sign(&claims).map_err(Status::internal)?;
    let expires = jiff::Timestamp::from_second(now + seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(namespace);
    request["metadata"]["creationTimestamp"] = Value::Null;
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({"token": token, "expirationTimestamp": expires});
    Ok(json_response(
        StatusCode::CREATED,
        serde_json::to_vec(&request).unwrap_or_default(),
    ))
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"].as_str().unwrap_or("").to_owned()
}
