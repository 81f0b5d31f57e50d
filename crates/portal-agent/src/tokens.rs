//! Service-account tokens for projected volumes, as the kubelet's token
//! manager: a token is asked of the API (TokenRequest, bound to the pod)
//! once, kept, and asked again when 80 % of its life is gone or it is a
//! day old, so the file in the volume is always valid and a pod-bound
//! token dies with its pod.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount, ServiceAccountTokenProjection};
use kube::api::PostParams;
use kube::{Api, Client};
use parking_lot::Mutex;

/// Kubernetes' default life of a projected token.
const DEFAULT_SECONDS: i64 = 3600;
/// The oldest a kept token may be.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Which token: the pod (by uid), its account, audience and life.
type Key = (String, String, String, i64);

struct Kept {
    token: String,
    /// When to ask again.
    refresh: jiff::Timestamp,
}

/// The tokens kept for this node's pods.
#[derive(Default)]
pub struct Tokens {
    kept: Mutex<HashMap<Key, Kept>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("kept", &self.kept.lock().len())
            .finish()
    }
}

/// When a token issued `issued` and expiring `expires` is asked again.
fn refresh_at(issued: jiff::Timestamp, expires: jiff::Timestamp) -> jiff::Timestamp {
    let life = expires.duration_since(issued);
    let at = issued
        .checked_add(
            life.checked_mul(4)
                .and_then(|d| d.checked_div(5))
                .unwrap_or(life),
        )
        .unwrap_or(expires);
    let oldest = issued
        .checked_add(jiff::SignedDuration::try_from(MAX_AGE).unwrap_or_default())
        .unwrap_or(at);
    at.min(oldest)
}

impl Tokens {
    /// The token `projection` asks for `pod`.
    pub async fn get(
        &self,
        client: Option<&Client>,
        pod: &Pod,
        projection: &ServiceAccountTokenProjection,
    ) -> Result<String, String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let audience = projection.audience.clone().unwrap_or_default();
        let seconds = projection.expiration_seconds.unwrap_or(DEFAULT_SECONDS);
        let key = (uid.clone(), account.clone(), audience.clone(), seconds);
        let now = jiff::Timestamp::now();
        if let Some(kept) = self.kept.lock().get(&key) {
            if now < kept.refresh {
                return Ok(kept.token.clone());
            }
        }
        let client = client.ok_or("no API server to ask for a service account token")?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience]
                },
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name),
                    uid: Some(uid),
                }),
            },
            ..TokenRequest::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                format!("requesting a token for service account {namespace}/{account}: {e}")
            })?;
        let status = answer
            .status
            .ok_or("the token request was answered without a token")?;
        let expires = status.expiration_timestamp.0;
        let expires = jiff::Timestamp::from_second(expires.as_second()).unwrap_or(now);
        self.kept.lock().insert(
            key,
            Kept {
                token: status.token.clone(),
                refresh: refresh_at(now, expires),
            },
        );
        Ok(status.token)
    }

    /// Forgets the tokens of pods no longer on the node.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.kept.lock().retain(|(uid, ..), _| live(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_refreshed_at_four_fifths_of_their_life_or_after_a_day() {
        let issued = jiff::Timestamp::from_second(1_000_000).unwrap();
        let hour = issued
            .checked_add(jiff::SignedDuration::from_secs(3600))
            .unwrap();
        assert_eq!(
            refresh_at(issued, hour).as_second() - issued.as_second(),
            2880
        );
        let year = issued
            .checked_add(jiff::SignedDuration::from_secs(365 * 24 * 3600))
            .unwrap();
        assert_eq!(
            refresh_at(issued, year).as_second() - issued.as_second(),
            24 * 3600
        );
    }
}
