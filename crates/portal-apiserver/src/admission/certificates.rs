//! Admission of CertificateSigningRequests, as Kubernetes': the server
//! records who asked (`spec.username`, `uid`, `groups`, `extra`: never
//! what the body claims); approving or denying needs the `approve` verb on
//! the request's signer, and issuing the certificate the `sign` verb
//! (`signers` of `certificates.k8s.io`, by signer name or `domain/*`).

use portal_api::Status;
use serde_json::{json, Value};

use crate::security::auth;
use crate::security::rbac::Request;
use crate::security::user::requester;
use crate::ApiState;

/// Records the requester in a new request.
pub(crate) fn admit(object: &mut Value) {
    let Some(user) = requester() else {
        return;
    };
    let spec = &mut object["spec"];
    spec["username"] = json!(user.name);
    spec["groups"] = json!(user.groups);
    match user.uid.as_str() {
        "" => drop(spec.as_object_mut().map(|s| s.remove("uid"))),
        uid => spec["uid"] = json!(uid),
    }
    match user.extra.is_empty() {
        true => drop(spec.as_object_mut().map(|s| s.remove("extra"))),
        false => spec["extra"] = json!(user.extra),
    }
}

/// Changing the approval needs `approve`, the certificate `sign`.
pub(crate) fn validate(
    state: &ApiState,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), Status> {
    let (Some(old), Some(user)) = (old, requester()) else {
        return Ok(());
    };
    let decision = |o: &Value| {
        o["status"]["conditions"]
            .as_array()
            .map(|conditions| {
                conditions
                    .iter()
                    .filter(|c| c["type"] == "Approved" || c["type"] == "Denied")
                    .map(|c| (c["type"].clone(), c["status"].clone()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let signer = object["spec"]["signerName"].as_str().unwrap_or("");
    let domain = signer.split('/').next().unwrap_or(signer);
    let may = |verb: &str| {
        [signer.to_owned(), format!("{domain}/*")]
            .iter()
            .any(|name| {
                let request = Request::Resource {
                    verb,
                    group: "certificates.k8s.io",
                    resource: "signers",
                    subresource: None,
                    name: Some(name),
                };
                auth::allowed(state, &user, None, &request)
            })
    };
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    if decision(object) != decision(old) && !may("approve") {
        return Err(Status::forbidden(format!(
            "certificatesigningrequests.certificates.k8s.io {name:?} is forbidden: user not permitted to approve requests with signerName {signer:?}"
        )));
    }
    if object["status"]["certificate"] != old["status"]["certificate"] && !may("sign") {
        return Err(Status::forbidden(format!(
            "certificatesigningrequests.certificates.k8s.io {name:?} is forbidden: user not permitted to sign requests with signerName {signer:?}"
        )));
    }
    Ok(())
}
