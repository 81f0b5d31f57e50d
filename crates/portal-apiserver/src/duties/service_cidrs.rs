//! The ServiceCIDRs' lifecycle, as kube-apiserver's default-ServiceCIDR
//! controller and kube-controller-manager's ServiceCIDR controller keep
//! it. `kubernetes` is made from `--service-cluster-ip-range` (again after
//! it is deleted, and upgraded to dual stack when the flags gain a second
//! range). Every ServiceCIDR carries a finalizer and a `Ready` condition;
//! one being deleted goes only when no IPAddress is in it alone (else it
//! reads `Ready False Terminating`), and not before allocators everywhere
//! have had time to stop handing out its addresses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use portal_api::cidr::IpCidr;
use portal_api::kinds::{ip_address, service_cidr};
use portal_api::Status;
use serde_json::{json, Value};

use crate::registry::allocator::ranges::{cidrs_of, listed, names};
use crate::registry::strategy::set_condition;
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

const MANAGER: &str = "service-cidr-controller";

/// How long a deleted ServiceCIDR stays after its last address went
/// (upstream's `deletionGracePeriod`).
const DELETION_GRACE: Duration = Duration::from_secs(10);

/// How often a deleted ServiceCIDR that still holds addresses is looked at.
const IN_USE_POLL: Duration = Duration::from_secs(1);

/// How soon a failed write is tried again.
const RETRY: Duration = Duration::from_secs(1);

const STILL_IN_USE: &str = "There are still IPAddresses referencing the ServiceCIDR, please remove them or create a new ServiceCIDR";

/// Creates `kubernetes` when it is missing; a single-stack one whose
/// range is still the flags' first becomes dual-stack with the flags.
/// Says whether it is left differing from the flags.
pub(crate) async fn ensure_default(state: &ApiState) -> Result<bool, Status> {
    let flags: Vec<String> = state
        .allocators
        .flag_cidrs()
        .iter()
        .map(IpCidr::to_string)
        .collect();
    let writer = Writer::new(state, &service_cidr::RESOURCE, MANAGER);
    let object = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": service_cidr::DEFAULT_NAME},
        "spec": {"cidrs": flags},
    });
    match writer.create(None, object).await {
        Ok(_) => return Ok(false),
        Err(status) if status.code == 409 => {}
        Err(status) => return Err(status),
    }
    let mut mismatch = false;
    writer
        .update(None, service_cidr::DEFAULT_NAME, Part::Main, |current| {
            let held = service_cidr::cidrs(current);
            if held == flags || current["metadata"]["deletionTimestamp"].is_string() {
                return Change::Keep;
            }
            if held.len() == 1 && flags.len() == 2 && held[0] == flags[0] {
                let mut next = current.clone();
                next["spec"]["cidrs"] = json!(flags);
                return Change::Write(next);
            }
            mismatch = true;
            Change::Keep
        })
        .await?;
    Ok(mismatch)
}

/// Keeps every ServiceCIDR's finalizer and status, whenever ServiceCIDRs
/// change; while one being deleted still holds addresses, it looks again
/// every second (not at every Service write).
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut advanced = state.cache.subscribe();
    let mut handled = None;
    let mut again: Option<Instant> = None;
    let mut warned = false;
    loop {
        let changed = state.cache.changed(&[service_cidr::KIND]);
        let due = again.is_some_and(|at| Instant::now() >= at);
        if handled != Some(changed) || due {
            handled = Some(changed);
            again = None;
            let ranges = listed(&state, &service_cidr::RESOURCE);
            let mut retry = |after: Duration| {
                let at = Instant::now() + after;
                again = Some(again.map_or(at, |a| a.min(at)));
            };
            if !default_matches(&state, &ranges) {
                match ensure_default(&state).await {
                    Ok(true) if !warned => {
                        warned = true;
                        tracing::warn!("the default ServiceCIDR does not match --service-cluster-ip-range; it is kept as it is");
                    }
                    Ok(_) => {}
                    Err(status) => {
                        tracing::warn!(error = %status.message, "cannot keep the default ServiceCIDR");
                        retry(RETRY);
                    }
                }
            }
            // This server allocates from a ServiceCIDR before it reads
            // Ready (the others follow in their own time).
            crate::registry::allocator::ranges::apply(&state, &ranges);
            let addresses = if ranges.iter().any(terminating) {
                names(&state, &ip_address::RESOURCE)
            } else {
                Vec::new()
            };
            for range in &ranges {
                match reconcile(&state, range, &ranges, &addresses).await {
                    Ok(Some(after)) => retry(after),
                    Ok(None) => {}
                    Err(status) => {
                        let name = &range["metadata"]["name"];
                        tracing::warn!(%name, error = %status.message, "cannot keep a ServiceCIDR");
                        retry(RETRY);
                    }
                }
            }
        }
        let advanced_again = advanced.changed();
        match again {
            Some(at) => {
                tokio::select! {
                    result = advanced_again => if result.is_err() { return },
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => {
                if advanced_again.await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Whether `kubernetes` exists with the flags' ranges (nothing to do).
fn default_matches(state: &ApiState, ranges: &[Value]) -> bool {
    let flags: Vec<String> = state
        .allocators
        .flag_cidrs()
        .iter()
        .map(IpCidr::to_string)
        .collect();
    ranges.iter().any(|r| {
        r["metadata"]["name"] == service_cidr::DEFAULT_NAME && service_cidr::cidrs(r) == flags
    })
}

fn terminating(range: &Value) -> bool {
    range["metadata"]["deletionTimestamp"].is_string()
}

/// One ServiceCIDR: its finalizer and status; how soon to look again.
async fn reconcile(
    state: &ApiState,
    range: &Value,
    ranges: &[Value],
    addresses: &[String],
) -> Result<Option<Duration>, Status> {
    let name = range["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let writer = Writer::new(state, &service_cidr::RESOURCE, MANAGER);
    if !terminating(range) {
        // Ready once this server's allocator has taken it in with its
        // finalizer: the write below brings this range back finalized.
        if !service_cidr::holds_finalizer(range) {
            writer
                .update(None, &name, Part::Main, |current| {
                    if service_cidr::holds_finalizer(current) || terminating(current) {
                        return Change::Keep;
                    }
                    let mut next = current.clone();
                    let metadata = &mut next["metadata"];
                    match metadata["finalizers"].as_array_mut() {
                        Some(list) => list.push(json!(service_cidr::FINALIZER)),
                        None => metadata["finalizers"] = json!([service_cidr::FINALIZER]),
                    }
                    Change::Write(next)
                })
                .await?;
            return Ok(None);
        }
        let message = if name == service_cidr::DEFAULT_NAME {
            "Kubernetes default Service CIDR is ready"
        } else {
            "Kubernetes Service CIDR is ready"
        };
        set_ready(&writer, &name, true, "", message).await?;
        return Ok(None);
    }
    if !service_cidr::holds_finalizer(range) {
        return Ok(None);
    }
    if in_use(range, ranges, addresses) {
        set_ready(&writer, &name, false, "Terminating", STILL_IN_USE).await?;
        return Ok(Some(IN_USE_POLL));
    }
    let since = range["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(DELETION_GRACE, |t| {
            let elapsed = jiff::Timestamp::now().duration_since(t);
            Duration::try_from(elapsed).unwrap_or_default()
        });
    if since < DELETION_GRACE {
        return Ok(Some(DELETION_GRACE - since));
    }
    writer
        .update(None, &name, Part::Main, |current| {
            let mut next = current.clone();
            if let Some(list) = next["metadata"]["finalizers"].as_array_mut() {
                list.retain(|f| f != service_cidr::FINALIZER);
            }
            Change::Write(next)
        })
        .await?;
    Ok(None)
}

/// Whether an IPAddress lies in `range` and in no other ServiceCIDR that
/// is not being deleted.
fn in_use(range: &Value, ranges: &[Value], addresses: &[String]) -> bool {
    let mine = cidrs_of(range);
    let others: Vec<IpCidr> = ranges
        .iter()
        .filter(|r| r["metadata"]["name"] != range["metadata"]["name"] && !terminating(r))
        .flat_map(cidrs_of)
        .collect();
    addresses
        .iter()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .any(|ip| mine.iter().any(|c| c.contains(ip)) && !others.iter().any(|c| c.contains(ip)))
}

/// Sets the `Ready` condition unless it already says so.
async fn set_ready(
    writer: &Writer<'_>,
    name: &str,
    ready: bool,
    reason: &str,
    message: &str,
) -> Result<(), Status> {
    let status = if ready { "True" } else { "False" };
    writer
        .update(None, name, Part::Status, |current| {
            let conditions = current["status"]["conditions"].as_array();
            let ready_now = conditions
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            if ready_now.is_some_and(|c| {
                c["status"] == status && c["reason"] == reason && c["message"] == message
            }) {
                return Change::Keep;
            }
            let mut next = current.clone();
            if !next["status"].is_object() {
                next["status"] = json!({});
            }
            set_condition(&mut next["status"], "Ready", ready, reason, message);
            Change::Write(next)
        })
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::strategy::now;

    fn range(name: &str, cidrs: &[&str], deleting: bool) -> Value {
        let mut object = json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}});
        if deleting {
            object["metadata"]["deletionTimestamp"] = json!(now());
        }
        object
    }

    fn address(ip: &str) -> String {
        ip.to_owned()
    }

    #[test]
    fn a_range_is_in_use_while_an_address_is_in_it_alone() {
        let going = range("more", &["10.100.0.0/24"], true);
        let addresses = [address("10.100.0.5"), address("10.96.0.1")];
        assert!(in_use(&going, std::slice::from_ref(&going), &addresses));
        let wider = range("wider", &["10.100.0.0/16"], false);
        assert!(!in_use(&going, &[going.clone(), wider], &addresses));
        let also_going = range("wider", &["10.100.0.0/16"], true);
        assert!(in_use(&going, &[going.clone(), also_going], &addresses));
        assert!(!in_use(
            &going,
            std::slice::from_ref(&going),
            &[address("10.96.0.1")]
        ));
    }
}
