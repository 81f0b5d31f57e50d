//! Installs the Gateway API's standard channel (`crds/gateway-api.yaml`)
//! when the cluster has none of its definitions, and makes Portal's
//! GatewayClass. Definitions that exist (a user's newer bundle) are left
//! as they are.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{json, Value};

use super::objects::GatewayClass;
use super::{CLASS, CONTROLLER};

const DEFINITIONS: &str = include_str!("../../crds/gateway-api.yaml");

/// How long the definitions have to become established.
const ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);

/// Creates the missing definitions (as `admin`, a client allowed to) and
/// waits until each is served; says whether all of them are.
pub(crate) async fn definitions(admin: Client) -> bool {
    let list: Value = match serde_yaml_ng::from_str(DEFINITIONS) {
        Ok(list) => list,
        Err(error) => {
            tracing::error!(%error, "the Gateway API definitions do not parse");
            return false;
        }
    };
    let api: Api<CustomResourceDefinition> = Api::all(admin);
    let mut names = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let crd: CustomResourceDefinition = match serde_json::from_value(item.clone()) {
            Ok(crd) => crd,
            Err(error) => {
                tracing::error!(%error, "a Gateway API definition does not decode");
                return false;
            }
        };
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut attempt = 0u32;
        loop {
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 409 => break,
                Err(error) if attempt < 10 => {
                    tracing::debug!(%name, %error, "cannot create a Gateway API definition yet");
                    tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
                    attempt += 1;
                }
                Err(error) => {
                    tracing::warn!(%name, %error, "cannot create a Gateway API definition");
                    return false;
                }
            }
        }
        names.push(name);
    }
    let deadline = tokio::time::Instant::now() + ESTABLISHED_WITHIN;
    for name in names {
        loop {
            let established = api.get(&name).await.ok().is_some_and(|crd| {
                crd.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                tracing::warn!(%name, "a Gateway API definition is not established; Gateways are not served");
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    true
}

/// Makes the `portal` GatewayClass unless it exists.
pub(crate) async fn class(client: Client) {
    let class = json!({"metadata": {"name": CLASS}, "spec": {"controllerName": CONTROLLER}});
    crate::create_unless_present(
        Api::<GatewayClass>::all(client),
        class,
        "the portal GatewayClass",
    )
    .await;
}
