//! Whether each APIService can serve, as kube-aggregator's availability
//! controllers say it in its `Available` condition: local ones always
//! (`Local`); a remote one once its Service exists, listens on the port,
//! has ready endpoints and answers a discovery request for its group
//! version with a 2xx (`Passed`), else why not (`ServiceNotFound`,
//! `ServicePortError`, `EndpointsNotFound`, `MissingEndpoints`,
//! `FailedDiscoveryCheck`). The discovery it fetched is what this server
//! merges into its own. Checked whenever APIServices, Services or
//! Endpoints change (at most once a second) and every ten seconds; every
//! server checks, as each proxies.
//!
//! Also `kube-system/extension-apiserver-authentication`: the CAs and
//! header names extension servers authenticate callers by (their
//! `--authentication-kubeconfig` reads it), this server's merged with
//! what other servers of the cluster put there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use portal_api::kinds::{api_service, config_map, endpoints, service};
use portal_api::Status;
use serde_json::{json, Value};

use super::Remote;
use crate::registry::strategy::set_condition;
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

const MANAGER: &str = "kube-aggregator";
/// How often every APIService is checked again, changed or not.
const PERIOD: Duration = Duration::from_secs(10);
/// The least time between two checks of everything.
const GAP: Duration = Duration::from_secs(1);
/// Time for an extension server's discovery answer.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest discovery document read.
const MAX_DISCOVERY: usize = 4 * 1024 * 1024;

/// The ConfigMap extension servers read to trust this server.
pub(crate) const TRUST_NAMESPACE: &str = "kube-system";
pub(crate) const TRUST_NAME: &str = "extension-apiserver-authentication";

/// Checks APIServices until the server stops.
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut advanced = state.cache.subscribe();
    let mut handled = None;
    let mut next_round = tokio::time::Instant::now();
    loop {
        let changed = state
            .cache
            .changed(&[api_service::KIND, service::KIND, endpoints::KIND]);
        let due = tokio::time::Instant::now() >= next_round;
        if handled != Some(changed) || due {
            handled = Some(changed);
            if due {
                if let Err(status) = publish_trust(&state).await {
                    tracing::warn!(message = %status.message, "cannot publish {TRUST_NAME}");
                }
            }
            round(&state).await;
            next_round = tokio::time::Instant::now() + PERIOD;
            tokio::time::sleep(GAP).await;
        }
        tokio::select! {
            changed = advanced.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(next_round) => {}
        }
    }
}

/// One check of every APIService.
async fn round(state: &ApiState) {
    let all = super::api_services(state);
    let remote: Vec<&Value> = all
        .iter()
        .filter(|a| a["spec"]["service"].is_object())
        .collect();
    let checks = remote.iter().map(|a| check(state, a));
    let results = futures_util::future::join_all(checks).await;
    for (api_service, (condition, resources)) in remote.iter().zip(results) {
        let name = api_service["metadata"]["name"].as_str().unwrap_or("");
        let current = condition.status == "True";
        let resources = resources.or_else(|| state.aggregator.remote(name)?.resources);
        state
            .aggregator
            .remember(name, Remote { resources, current });
        write_condition(state, api_service, &condition).await;
    }
    let names: Vec<String> = remote
        .iter()
        .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    state.aggregator.retain(&names);
    for local in all.iter().filter(|a| !a["spec"]["service"].is_object()) {
        let condition = Condition::new(true, "Local", "Local APIServices are always available");
        write_condition(state, local, &condition).await;
    }
}

/// An `Available` condition.
#[derive(Debug, PartialEq)]
pub(crate) struct Condition {
    pub(crate) status: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl Condition {
    fn new(holds: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Condition {
            status: if holds { "True" } else { "False" },
            reason,
            message: message.into(),
        }
    }
}

async fn write_condition(state: &ApiState, api_service: &Value, condition: &Condition) {
    let name = api_service["metadata"]["name"].as_str().unwrap_or("");
    if api_service["metadata"]["deletionTimestamp"].is_string() {
        return;
    }
    let same = |current: &Value| {
        current["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Available"
                    && c["status"] == condition.status
                    && c["reason"] == condition.reason
                    && c["message"] == condition.message.as_str()
            })
    };
    if same(api_service) {
        return;
    }
    let writer = Writer::new(state, &api_service::RESOURCE, MANAGER);
    let written = writer
        .update(None, name, Part::Status, |current| {
            if same(current) {
                return Change::Keep;
            }
            let mut next = current.clone();
            set_available(&mut next["status"], condition);
            Change::Write(next)
        })
        .await;
    match written {
        Ok(_) => {}
        // Deleted meanwhile.
        Err(status) if status.code == 404 => {}
        Err(status) => {
            tracing::warn!(%name, message = %status.message, "cannot write an APIService's status")
        }
    }
}

fn set_available(status: &mut Value, condition: &Condition) {
    let holds = condition.status == "True";
    set_condition(
        status,
        "Available",
        holds,
        condition.reason,
        &condition.message,
    );
}

/// Checks a remote APIService: its condition, and its discovery document
/// when it answered with one.
async fn check(state: &ApiState, api_service: &Value) -> (Condition, Option<Value>) {
    let spec = &api_service["spec"];
    let namespace = spec["service"]["namespace"].as_str().unwrap_or("");
    let name = spec["service"]["name"].as_str().unwrap_or("");
    let port = spec["service"]["port"].as_u64().unwrap_or(443);
    let found = state.cache.get(
        &service::RESOURCE,
        &service::RESOURCE.key(Some(namespace), name),
    );
    let Some(found) = found else {
        let message = format!("service/{name} in {namespace:?} is not present");
        return (Condition::new(false, "ServiceNotFound", message), None);
    };
    let svc = &found.value;
    if matches!(svc["spec"]["type"].as_str(), None | Some("ClusterIP")) {
        let port_name = svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_u64() == Some(port))
            .map(|p| p["name"].as_str().unwrap_or("").to_owned());
        let Some(port_name) = port_name else {
            let message =
                format!("service/{name} in {namespace:?} is not listening on port {port}");
            return (Condition::new(false, "ServicePortError", message), None);
        };
        let endpoints = state.cache.get(
            &endpoints::RESOURCE,
            &endpoints::RESOURCE.key(Some(namespace), name),
        );
        let Some(endpoints) = endpoints else {
            let message = format!("cannot find endpoints for service/{name} in {namespace:?}");
            return (Condition::new(false, "EndpointsNotFound", message), None);
        };
        let ready = endpoints.value["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|subset| {
                let has_port = subset["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"].as_str().unwrap_or("") == port_name);
                has_port
                    && subset["addresses"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty())
            });
        if !ready {
            let message = format!(
                "endpoints for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
            );
            return (Condition::new(false, "MissingEndpoints", message), None);
        }
    }
    match discover(state, api_service).await {
        Ok(resources) => (
            Condition::new(true, "Passed", "all checks passed"),
            resources,
        ),
        Err(message) => (Condition::new(false, "FailedDiscoveryCheck", message), None),
    }
}

/// Asks the extension server for its group version's resources (as
/// `system:kube-aggregator`): the document when it is one.
async fn discover(state: &ApiState, api_service: &Value) -> Result<Option<Value>, String> {
    let spec = &api_service["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let version = spec["version"].as_str().unwrap_or("");
    let path = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    // Messages name the Service, not the endpoint chosen at random: the
    // condition stays the same while the failure does.
    let host = super::service_host(api_service);
    let url = format!("https://{host}{path}");
    let asked = async {
        let destination = super::destination(state, api_service).await?;
        let address = destination.address;
        let failing = |e: &dyn std::fmt::Display| {
            let why = e.to_string().replace(&address.to_string(), &host);
            format!("failing or missing response from {url}: {why}")
        };
        let mut sender = super::dial::<Empty<Bytes>>(state, api_service, &destination)
            .await
            .map_err(|e| failing(&e))?;
        let mut request = http::Request::get(path.as_str())
            .header(http::header::HOST, host.as_str())
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let identity = super::identity_headers(
            "system:kube-aggregator",
            &["system:masters".to_owned()],
            &Default::default(),
        );
        request.headers_mut().extend(identity);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| failing(&e))?;
        let code = response.status();
        if !code.is_success() {
            return Err(failing(&format!(
                "bad status from {url}: {}",
                code.as_u16()
            )));
        }
        let body = Limited::new(response.into_body(), MAX_DISCOVERY)
            .collect()
            .await
            .map_err(|e| failing(&e))?
            .to_bytes();
        let document: Option<Value> = serde_json::from_slice(&body).ok();
        Ok(document.filter(|d| d["resources"].is_array()))
    };
    tokio::time::timeout(DISCOVERY_TIMEOUT, asked)
        .await
        .map_err(|_| format!("timed out waiting for {url}"))?
}

/// Writes (or merges into) the ConfigMap extension servers trust this
/// server by.
pub(crate) async fn publish_trust(state: &ApiState) -> Result<(), Status> {
    let ours = trust_data(&state.joining.ca_pem, state.aggregator.client_ca());
    let writer = Writer::new(state, &config_map::RESOURCE, MANAGER);
    let updated = writer
        .update(Some(TRUST_NAMESPACE), TRUST_NAME, Part::Main, |current| {
            let merged = merge_trust(&current["data"], &ours);
            if merged == current["data"] {
                return Change::Keep;
            }
            let mut next = current.clone();
            next["data"] = merged;
            Change::Write(next)
        })
        .await;
    match updated {
        Ok(_) => Ok(()),
        Err(status) if status.code == 404 => {
            let object = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": TRUST_NAME, "namespace": TRUST_NAMESPACE},
                "data": ours,
            });
            match writer.create(Some(TRUST_NAMESPACE), object).await {
                Err(status) if status.code != 409 => Err(status),
                _ => Ok(()),
            }
        }
        Err(status) => Err(status),
    }
}

/// What this server asks extension servers to trust: its client CA for
/// certificates, its front-proxy CA and header names for proxied calls.
fn trust_data(client_ca: &str, front_proxy_ca: &str) -> Value {
    json!({
        "client-ca-file": client_ca,
        "requestheader-client-ca-file": front_proxy_ca,
        "requestheader-allowed-names": json!([crate::security::pki::FRONT_PROXY_CLIENT]).to_string(),
        "requestheader-extra-headers-prefix": json!(["X-Remote-Extra-"]).to_string(),
        "requestheader-group-headers": json!(["X-Remote-Group"]).to_string(),
        "requestheader-username-headers": json!(["X-Remote-User"]).to_string(),
    })
}

/// Ours merged into what is there (other servers' CAs and names kept):
/// certificates and list entries once each, in order.
fn merge_trust(current: &Value, ours: &Value) -> Value {
    let mut merged = serde_json::Map::new();
    let Some(ours) = ours.as_object() else {
        return current.clone();
    };
    for (key, value) in ours {
        let theirs = current[key].as_str().unwrap_or("");
        let ours = value.as_str().unwrap_or("");
        let combined = if key.ends_with("-file") {
            let mut certificates: Vec<String> = Vec::new();
            for pem in [theirs, ours] {
                for block in pem_blocks(pem) {
                    if !certificates.contains(&block) {
                        certificates.push(block);
                    }
                }
            }
            certificates.concat()
        } else {
            let mut entries: Vec<String> = serde_json::from_str(theirs).unwrap_or_default();
            for entry in serde_json::from_str::<Vec<String>>(ours).unwrap_or_default() {
                if !entries.contains(&entry) {
                    entries.push(entry);
                }
            }
            json!(entries).to_string()
        };
        merged.insert(key.clone(), json!(combined));
    }
    // Keys another server wrote that this one does not know: kept.
    if let Some(current) = current.as_object() {
        for (key, value) in current {
            merged.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    Value::Object(merged)
}

/// The PEM blocks of a bundle, each ending in a newline.
fn pem_blocks(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let end = start + end + END.len();
        blocks.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const B: &str = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";

    #[test]
    fn trust_of_several_servers_is_merged() {
        let first = merge_trust(&Value::Null, &trust_data(A, B));
        assert_eq!(first["client-ca-file"], A);
        assert_eq!(
            first["requestheader-username-headers"],
            "[\"X-Remote-User\"]"
        );
        assert_eq!(
            first["requestheader-allowed-names"],
            "[\"front-proxy-client\"]"
        );
        // A second server with another front-proxy CA: both are trusted.
        let second = merge_trust(&first, &trust_data(A, A));
        assert_eq!(second["client-ca-file"], A);
        assert_eq!(second["requestheader-client-ca-file"], format!("{B}{A}"));
        assert_eq!(merge_trust(&second, &trust_data(A, A)), second);
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let mut status = json!({});
        set_available(
            &mut status,
            &Condition::new(false, "MissingEndpoints", "none"),
        );
        status["conditions"][0]["lastTransitionTime"] = json!("2020-01-01T00:00:00Z");
        set_available(
            &mut status,
            &Condition::new(false, "FailedDiscoveryCheck", "x"),
        );
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        assert_eq!(status["conditions"][0]["reason"], "FailedDiscoveryCheck");
        set_available(
            &mut status,
            &Condition::new(true, "Passed", "all checks passed"),
        );
        assert_ne!(
            status["conditions"][0]["lastTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        assert_eq!(status["conditions"].as_array().unwrap().len(), 1);
    }
}
