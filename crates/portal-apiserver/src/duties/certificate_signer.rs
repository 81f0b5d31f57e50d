//! The signer of approved CertificateSigningRequests, as
//! kube-controller-manager's csrsigning controller: requests for
//! `kubernetes.io/kube-apiserver-client` (any user) and
//! `kubernetes.io/kube-apiserver-client-kubelet` (a node's `system:node:NAME`
//! in `system:nodes`) get a certificate of the cluster CA, which the API
//! server trusts for client authentication, valid for the duration asked
//! (a year at most). A request the signer cannot honour is marked
//! `Failed`. It runs where the CA key is: in the API server, on one server
//! of a cluster (the cluster duties).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use portal_api::kinds::certificate_signing_request::{
    self as csr, API_SERVER_CLIENT, API_SERVER_CLIENT_KUBELET,
};
use portal_api::Status;
use rcgen::CertificateSigningRequestParams;
use serde_json::{json, Value};
use x509_parser::prelude::FromDer;

use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::security::issuing::Usages;
use crate::ApiState;

const MANAGER: &str = "csr-signer";
/// The longest a certificate lasts (`--cluster-signing-duration`).
const MAX_SECONDS: i64 = 365 * 24 * 3600;
/// Clocks differ: certificates are valid from a little before now.
const BACKDATE: Duration = Duration::from_secs(300);

/// Signs what is approved, whenever a request changes.
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut changes = state.cache.subscribe();
    let mut seen = 0;
    loop {
        let changed = state.cache.changed(&[csr::KIND]);
        if changed > seen {
            seen = changed;
            sign_approved(&state).await;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn sign_approved(state: &ApiState) {
    let resource = &csr::RESOURCE;
    let (requests, _, _) =
        state
            .cache
            .list(resource, &resource.list_prefix(None), None, 0, |request| {
                csr::approved(&request.value)
                    && request.value["status"]["certificate"]
                        .as_str()
                        .unwrap_or("")
                        .is_empty()
                    && [API_SERVER_CLIENT, API_SERVER_CLIENT_KUBELET]
                        .contains(&request.value["spec"]["signerName"].as_str().unwrap_or(""))
            });
    for request in requests {
        let name = request.value["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let status = match sign(state, &request.value) {
            Ok(pem) => {
                json!({"certificate": base64::engine::general_purpose::STANDARD.encode(pem)})
            }
            Err(why) => {
                tracing::info!(%name, %why, "certificate request not signed");
                json!({"conditions": [{
                    "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": why, "lastUpdateTime": crate::registry::strategy::now(),
                    "lastTransitionTime": crate::registry::strategy::now()}]})
            }
        };
        let writer = Writer::new(state, resource, MANAGER);
        let written = writer
            .update(None, &name, Part::Status, |current| {
                if !current["status"]["certificate"]
                    .as_str()
                    .unwrap_or("")
                    .is_empty()
                {
                    return Change::Keep;
                }
                let mut object = current.clone();
                if let Some(certificate) = status.get("certificate") {
                    object["status"]["certificate"] = certificate.clone();
                } else {
                    let mut conditions = current["status"]["conditions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    conditions.extend(status["conditions"].as_array().cloned().unwrap_or_default());
                    object["status"]["conditions"] = json!(conditions);
                }
                Change::Write(object)
            })
            .await;
        if let Err(Status { message, .. }) = written {
            tracing::warn!(%name, %message, "cannot record the signed certificate");
        }
    }
}

/// The certificate for an approved request, or why there is none.
fn sign(state: &ApiState, request: &Value) -> Result<String, String> {
    let spec = &request["spec"];
    let pem = base64::engine::general_purpose::STANDARD
        .decode(spec["request"].as_str().unwrap_or(""))
        .map_err(|e| format!("the request is not base64: {e}"))?;
    let pem = String::from_utf8(pem).map_err(|_| "the request is not PEM".to_owned())?;
    // Parsing checks the request's signature: whoever asks holds the key.
    let params = CertificateSigningRequestParams::from_pem(&pem)
        .map_err(|e| format!("the request is not a valid PKCS#10 request: {e}"))?;
    let der = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| format!("the request is not PEM: {e}"))?
        .1
        .contents;
    let (common_names, organizations) = subject_names(&der)?;
    let usages: Vec<&str> = spec["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let signer = spec["signerName"].as_str().unwrap_or("");
    // Upstream's checks of what each signer may issue.
    let allowed: &[&str] = &["digital signature", "key encipherment", "client auth"];
    if !usages.contains(&"client auth") || usages.iter().any(|u| !allowed.contains(u)) {
        return Err(format!(
            "{signer} signs only client certificates: usages must be \"client auth\" with optionally \"digital signature\" and \"key encipherment\""
        ));
    }
    if !params.params.subject_alt_names.is_empty() {
        return Err("client certificates carry no subject alternative names".into());
    }
    if common_names.len() != 1 || common_names[0].is_empty() {
        return Err("the request must name exactly one user (common name)".into());
    }
    if signer == API_SERVER_CLIENT_KUBELET {
        let node_user = common_names[0].starts_with(portal_api::join::NODE_USER_PREFIX);
        if !node_user || organizations != [portal_api::join::NODES_GROUP] {
            return Err(
                "a kubelet client certificate is for system:node:NAME in system:nodes only".into(),
            );
        }
    }
    let seconds = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(MAX_SECONDS)
        .clamp(0, MAX_SECONDS);
    let now = SystemTime::now();
    let usages = Usages {
        digital_signature: usages.contains(&"digital signature"),
        key_encipherment: usages.contains(&"key encipherment"),
    };
    state.joining.authority.issue_client(
        &der,
        usages,
        now - BACKDATE,
        now + Duration::from_secs(seconds.unsigned_abs()),
    )
}

/// The common names (users) and organizations (groups) the request's
/// subject names, in order.
fn subject_names(der: &[u8]) -> Result<(Vec<String>, Vec<String>), String> {
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(der)
        .map_err(|e| format!("the request is not a valid PKCS#10 request: {e}"))?;
    let subject = &request.certification_request_info.subject;
    let text = |values: Vec<&x509_parser::x509::AttributeTypeAndValue>| {
        values
            .into_iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the request's subject is not text: {e}"))
    };
    Ok((
        text(subject.iter_common_name().collect())?,
        text(subject.iter_organization().collect())?,
    ))
}
