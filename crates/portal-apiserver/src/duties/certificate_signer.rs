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
use std::time::Duration;

use base64::Engine as _;
use portal_api::kinds::certificate_signing_request::{
    self as csr, API_SERVER_CLIENT, API_SERVER_CLIENT_KUBELET,
};
use portal_api::Status;
use rcgen::{
    CertificateSigningRequestParams, DnType, DnValue, ExtendedKeyUsagePurpose, KeyUsagePurpose,
};
use serde_json::{json, Value};
use x509_parser::prelude::FromDer;

use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
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
    let mut params = CertificateSigningRequestParams::from_pem(&pem)
        .map_err(|e| format!("the request is not a valid PKCS#10 request: {e}"))?;
    // The certificate builder keeps one value per name attribute: a
    // request for several groups is refused rather than issued short.
    if organizations_requested(&pem) > 1 {
        return Err("this cluster's signer issues certificates naming one organization (group) at most; grant further groups' rights through RBAC".into());
    }
    let usages: Vec<&str> = spec["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let text = |kind: DnType| {
        params
            .params
            .distinguished_name
            .iter()
            .filter(|(k, _)| **k == kind)
            .map(|(_, v)| match v {
                DnValue::PrintableString(s) => s.to_string(),
                DnValue::Utf8String(s) => s.clone(),
                _ => String::new(),
            })
            .collect::<Vec<_>>()
    };
    let common_names = text(DnType::CommonName);
    let organizations = text(DnType::OrganizationName);
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
        .min(MAX_SECONDS);
    let now = time::OffsetDateTime::now_utc();
    params.params.not_before = now - BACKDATE;
    params.params.not_after = now + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    params.params.key_usages = usages
        .iter()
        .filter_map(|u| match *u {
            "digital signature" => Some(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => Some(KeyUsagePurpose::KeyEncipherment),
            _ => None,
        })
        .collect();
    params.params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params
        .signed_by(state.joining.issuer.as_ref())
        .map(|cert| cert.pem())
        .map_err(|e| format!("signing failed: {e}"))
}

/// How many organizations (O) the request's subject names.
fn organizations_requested(pem: &str) -> usize {
    let Ok((_, parsed)) = x509_parser::pem::parse_x509_pem(pem.as_bytes()) else {
        return 0;
    };
    x509_parser::certification_request::X509CertificationRequest::from_der(&parsed.contents)
        .map(|(_, request)| {
            request
                .certification_request_info
                .subject
                .iter_organization()
                .count()
        })
        .unwrap_or(0)
}
