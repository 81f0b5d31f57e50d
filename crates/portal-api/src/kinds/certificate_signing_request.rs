//! CertificateSigningRequests (`certificates.k8s.io/v1`, cluster-scoped,
//! `csr`): how a user gets a client certificate of the cluster CA. Someone
//! submits a PKCS#10 request for a signer (`kubernetes.io/kube-apiserver-client`);
//! the server records who asked (`spec.username`, `groups`, …); an admin
//! approves or denies it through the `approval` subresource (`kubectl
//! certificate approve`); the signer puts the certificate in
//! `status.certificate`. The spec never changes once made.

use serde_json::{json, Value};

use super::{nothing, replace_lists, Subresource};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("certificates.k8s.io", "CertificateSigningRequest");

/// The signer of client certificates for the API server.
pub const API_SERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// The signer of nodes' client certificates.
pub const API_SERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// Upstream's key usages.
const USAGES: [&str; 23] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "certificatesigningrequests",
    singular: "certificatesigningrequest",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["csr"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>,
    openapi_schema: openapi_schema::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    // Who asked and what was asked never change.
    kept_on_update: &["spec"],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &["spec.signerName"],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[Subresource {
        name: "approval",
        kind: "CertificateSigningRequest",
        verbs: &["get", "patch", "update"],
        group_version: None,
    }],
};

/// Upstream's `ValidateCertificateRequest` (the PEM itself is checked by
/// the server, which parses it).
fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    let request = spec["request"].as_str().unwrap_or("");
    if request.is_empty() {
        causes.push(Cause::required("spec.request", ""));
    }
    match spec["signerName"].as_str().unwrap_or("") {
        "" => causes.push(Cause::required("spec.signerName", "")),
        signer => {
            let (domain, path) = signer.split_once('/').unwrap_or((signer, ""));
            if path.is_empty() || !crate::name::dns1123_subdomain(domain).is_empty() {
                causes.push(Cause::invalid(
                    "spec.signerName",
                    signer,
                    "must be a fully qualified domain and path of the form 'example.com/signer-name'",
                ));
            }
        }
    }
    let usages = arr(object, &["spec", "usages"]);
    if usages.is_empty() {
        causes.push(Cause::required("spec.usages", ""));
    }
    for (i, usage) in usages.iter().enumerate() {
        let usage = usage.as_str().unwrap_or("");
        if !USAGES.contains(&usage) {
            let supported: Vec<String> = USAGES.iter().map(|u| format!("{u:?}")).collect();
            causes.push(unsupported(
                &format!("spec.usages[{i}]"),
                usage,
                &supported.join(", "),
            ));
        }
    }
    if let Some(seconds) = spec["expirationSeconds"].as_i64() {
        if seconds < 600 {
            causes.push(Cause::invalid(
                "spec.expirationSeconds",
                seconds,
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
    }
    let conditions = arr(object, &["status", "conditions"]);
    let has = |kind: &str| conditions.iter().any(|c| c["type"] == kind);
    if has("Approved") && has("Denied") {
        causes.push(Cause::invalid(
            "status.conditions",
            json!(conditions),
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    causes
}

/// Whether `status.conditions` say Approved (and not Denied or Failed).
pub fn approved(object: &Value) -> bool {
    let conditions = arr(object, &["status", "conditions"]);
    let holds = |kind: &str| {
        conditions
            .iter()
            .any(|c| c["type"] == kind && c["status"] != "False")
    };
    holds("Approved") && !holds("Denied") && !holds("Failed")
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        AGE,
        col("SignerName", "The signer it is for.", 0),
        col("Requestor", "Who asked.", 0),
        col(
            "RequestedDuration",
            "How long the certificate is to last.",
            0,
        ),
        col("Condition", "Approved, Denied, Issued, Failed.", 0),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let mut condition: Vec<&str> = arr(object, &["status", "conditions"])
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    if s(object, &["status", "certificate"]).is_some_and(|c| !c.is_empty()) {
        condition.push("Issued");
    }
    let condition = if condition.is_empty() {
        "Pending".to_owned()
    } else {
        condition.join(",")
    };
    let duration = object["spec"]["expirationSeconds"]
        .as_i64()
        .map_or(NONE.to_owned(), human_duration);
    vec![
        name(object),
        age(object, now),
        json!(s(object, &["spec", "signerName"]).unwrap_or("")),
        json!(s(object, &["spec", "username"]).unwrap_or("")),
        json!(duration),
        json!(condition),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_and_approval_read_as_upstream() {
        let csr = json!({"spec": {"request": "x", "signerName": API_SERVER_CLIENT, "usages": ["client auth"]}});
        assert!(validate(&csr, None).is_empty());
        let bad = json!({"spec": {"request": "x", "signerName": "nope", "usages": ["flying"], "expirationSeconds": 60}});
        let fields: Vec<String> = validate(&bad, None).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.signerName",
                "spec.usages[0]",
                "spec.expirationSeconds"
            ]
        );
        let mut done = csr.clone();
        done["status"] = json!({"conditions": [{"type": "Approved", "status": "True"}]});
        assert!(approved(&done) && !approved(&csr));
    }
}
