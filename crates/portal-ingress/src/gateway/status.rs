//! Status for the Gateway API's objects: what [`compile`](super::compile)
//! wants shown is compared with what each object shows (a condition keeps
//! its `lastTransitionTime` while its status stays), and only objects
//! that differ are written, by a task of their own.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::compile::{Desired, Kind};
use super::objects::{Gateway, GatewayClass, HttpRoute};

/// The status to write when `desired` differs from `current` (the
/// object's status now), with transition times kept or set to `now`.
pub(crate) fn to_write(desired: &Value, current: &Value, now: &str) -> Option<Value> {
    let mut filled = desired.clone();
    fill(&mut filled, current, now);
    let shown: Map<String, Value> = filled
        .as_object()?
        .keys()
        .map(|k| (k.clone(), current.get(k).cloned().unwrap_or(Value::Null)))
        .collect();
    (Value::Object(shown) != filled).then_some(filled)
}

fn fill(desired: &mut Value, current: &Value, now: &str) {
    match desired {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key == "conditions" {
                    fill_conditions(value, &current[key.as_str()], now);
                } else {
                    fill(value, &current[key.as_str()], now);
                }
            }
        }
        Value::Array(items) => {
            let empty = Vec::new();
            let old = current.as_array().unwrap_or(&empty);
            for (at, item) in items.iter_mut().enumerate() {
                let counterpart = ["name", "parentRef"]
                    .iter()
                    .find_map(|k| {
                        let id = item.get(*k)?;
                        old.iter().find(|o| o.get(*k) == Some(id))
                    })
                    .or_else(|| {
                        (item.get("name").is_none() && item.get("parentRef").is_none())
                            .then(|| old.get(at))
                            .flatten()
                    })
                    .cloned()
                    .unwrap_or(Value::Null);
                fill(item, &counterpart, now);
            }
        }
        _ => {}
    }
}

fn fill_conditions(desired: &mut Value, current: &Value, now: &str) {
    let empty = Vec::new();
    let old = current.as_array().unwrap_or(&empty);
    for condition in desired.as_array_mut().into_iter().flatten() {
        let before = old.iter().find(|c| c["type"] == condition["type"]);
        let time = match before {
            Some(c) if c["status"] == condition["status"] => c["lastTransitionTime"].clone(),
            _ => json!(now),
        };
        condition["lastTransitionTime"] = time;
    }
}

/// Writes the statuses handed over (a later hand-over replaces one not
/// yet written); a failed write is tried again, with a growing pause,
/// unless a newer hand-over arrives first.
pub(crate) async fn write(mut pending: watch::Receiver<Vec<Desired>>, client: Client) {
    let mut failed: Vec<Desired> = Vec::new();
    let mut pause = Duration::from_millis(500);
    loop {
        let batch = if failed.is_empty() {
            if pending.changed().await.is_err() {
                return;
            }
            pause = Duration::from_millis(500);
            pending.borrow_and_update().clone()
        } else {
            tokio::select! {
                changed = pending.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    pause = Duration::from_millis(500);
                    pending.borrow_and_update().clone()
                }
                _ = tokio::time::sleep(pause) => {
                    pause = (pause * 2).min(Duration::from_secs(30));
                    std::mem::take(&mut failed)
                }
            }
        };
        failed.clear();
        for desired in batch {
            if let Err(error) = write_one(&client, &desired).await {
                tracing::warn!(kind = ?desired.kind, namespace = %desired.namespace, name = %desired.name, %error, "cannot write a Gateway API status; trying again");
                failed.push(desired);
            }
        }
    }
}

async fn write_one(client: &Client, desired: &Desired) -> Result<(), kube::Error> {
    let patch = json!({"status": desired.status});
    let params = PatchParams::default();
    match desired.kind {
        Kind::GatewayClass => Api::<GatewayClass>::all(client.clone())
            .patch_status(&desired.name, &params, &Patch::Merge(&patch))
            .await
            .map(drop),
        Kind::Gateway => Api::<Gateway>::namespaced(client.clone(), &desired.namespace)
            .patch_status(&desired.name, &params, &Patch::Merge(&patch))
            .await
            .map(drop),
        Kind::HttpRoute => Api::<HttpRoute>::namespaced(client.clone(), &desired.namespace)
            .patch_status(&desired.name, &params, &Patch::Merge(&patch))
            .await
            .map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_stay_while_a_condition_holds() {
        let desired =
            json!({"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]});
        let current = json!({"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "lastTransitionTime": "then"}]});
        assert_eq!(to_write(&desired, &current, "now"), None);
        let flipped =
            json!({"conditions": [{"type": "Accepted", "status": "False", "reason": "Accepted"}]});
        let written = to_write(&flipped, &current, "now").unwrap();
        assert_eq!(written["conditions"][0]["lastTransitionTime"], "now");
        let listeners = json!({"listeners": [{"name": "http", "conditions": [{"type": "Accepted", "status": "True"}]}]});
        let shown = json!({"listeners": [{"name": "http", "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "then"}]}], "other": 1});
        assert_eq!(to_write(&listeners, &shown, "now"), None);
    }
}
