//! `pods/{name}/binding`: how a scheduler assigns a pod to a node. Sets
//! `spec.nodeName` once; a pod already bound answers 409.

use http::Response;
use portal_api::Status;
use serde_json::{json, Value};

use crate::registry::write::{guaranteed_update, Part, Proposal, WriteOptions};
use crate::server::http::{created_success, Body, Query};
use crate::{ApiState, Scope};

pub(crate) async fn bind(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let binding: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("invalid Binding: {e}")))?;
    let node = binding["target"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let Some(node) = node else {
        let cause = portal_api::Cause::required("target.name", "");
        return Err(Status::invalid(
            portal_api::Target {
                group: "",
                resource: "bindings",
                kind: "Binding",
            },
            name,
            vec![cause],
        ));
    };
    let propose = |pod: &Value| {
        if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            let mut status = Status::conflict(scope.target(), name);
            status.message = format!("Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{current}\"");
            return Err(status);
        }
        let mut object = pod.clone();
        object["spec"]["nodeName"] = json!(node);
        Ok(Proposal {
            object,
            expected: None,
            warnings: Vec::new(),
            managed: None,
        })
    };
    let options = WriteOptions::from_query(query)?;
    guaranteed_update(state, scope, name, Part::Main, &options, propose).await?;
    // As upstream's binding: the pod is scheduled now (replacing an
    // `Unschedulable` condition the scheduler wrote before).
    let scheduled = |pod: &Value| {
        let mut object = pod.clone();
        let mut conditions: Vec<Value> = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(json!({"type": "PodScheduled", "status": "True",
            "lastProbeTime": null, "lastTransitionTime": crate::registry::strategy::now()}));
        object["status"]["conditions"] = json!(conditions);
        Ok(Proposal {
            object,
            expected: None,
            warnings: Vec::new(),
            managed: None,
        })
    };
    // The pod is bound whatever happens to this second write (a racing
    // delete): the binding is what the scheduler asked.
    if let Err(status) =
        guaranteed_update(state, scope, name, Part::Status, &options, scheduled).await
    {
        tracing::debug!(pod = %name, error = %status.message, "PodScheduled not recorded");
    }
    Ok(created_success())
}
