//! Legacy service-account token Secrets, only when asked for, as
//! Kubernetes ≥ 1.24: a Secret of type `kubernetes.io/service-account-token`
//! annotated `kubernetes.io/service-account.name` gets a token that never
//! expires (it lives as long as the Secret), the cluster CA and the
//! namespace, as the tokens controller fills it. It runs where the signing
//! key is: in the API server, on one server of a cluster.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use portal_api::kinds::{secret, service_account};
use serde_json::{json, Value};

use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::security::tokens::{LegacyClaims, LEGACY_ISSUER};
use crate::ApiState;

const MANAGER: &str = "tokens-controller";
const ACCOUNT_NAME: &str = "kubernetes.io/service-account.name";
const ACCOUNT_UID: &str = "kubernetes.io/service-account.uid";

/// Fills such Secrets whenever Secrets or accounts change.
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut changes = state.cache.subscribe();
    let mut seen = 0;
    loop {
        let changed = state.cache.changed(&[secret::KIND, service_account::KIND]);
        if changed > seen {
            seen = changed;
            fill(&state).await;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn fill(state: &ApiState) {
    let resource = &secret::RESOURCE;
    let (wanting, _, _) = state
        .cache
        .list(resource, &resource.list_prefix(None), None, 0, |s| {
            s.value["type"] == secret::SERVICE_ACCOUNT_TOKEN
                && s.value["data"]["token"].as_str().unwrap_or("").is_empty()
        });
    for wanted in wanting {
        let metadata = &wanted.value["metadata"];
        let namespace = metadata["namespace"].as_str().unwrap_or("").to_owned();
        let name = metadata["name"].as_str().unwrap_or("").to_owned();
        let account_name = metadata["annotations"][ACCOUNT_NAME].as_str().unwrap_or("");
        let accounts = &service_account::RESOURCE;
        let Some(account) = state
            .cache
            .get(accounts, &accounts.key(Some(&namespace), account_name))
        else {
            continue; // filled once the account exists
        };
        let account_uid = account.value["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let given_uid = metadata["annotations"][ACCOUNT_UID].as_str().unwrap_or("");
        if !given_uid.is_empty() && given_uid != account_uid {
            continue; // for another account of that name
        }
        let claims = LegacyClaims {
            iss: LEGACY_ISSUER.to_owned(),
            sub: service_account::user_name(&namespace, account_name),
            namespace: namespace.clone(),
            secret: name.clone(),
            account: account_name.to_owned(),
            account_uid: account_uid.clone(),
        };
        let token = match state.authn.signer.sign_legacy(&claims) {
            Ok(token) => token,
            Err(error) => {
                tracing::warn!(%error, %name, "cannot sign a legacy token");
                continue;
            }
        };
        let ca = BASE64.encode(state.joining.ca_pem.as_bytes());
        let writer = Writer::new(state, resource, MANAGER);
        let result = writer
            .update(Some(&namespace), &name, Part::Main, |current: &Value| {
                if !current["data"]["token"].as_str().unwrap_or("").is_empty() {
                    return Change::Keep;
                }
                let mut filled = current.clone();
                filled["metadata"]["annotations"][ACCOUNT_UID] = json!(account_uid);
                filled["data"]["token"] = json!(BASE64.encode(token.as_bytes()));
                filled["data"]["ca.crt"] = json!(ca);
                filled["data"]["namespace"] = json!(BASE64.encode(namespace.as_bytes()));
                Change::Write(filled)
            })
            .await;
        if let Err(status) = result {
            tracing::warn!(%name, error = %status.message, "cannot fill a legacy token secret");
        }
    }
}
