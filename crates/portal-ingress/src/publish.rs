//! The proxy published as a Service, as k3s publishes its Traefik: the
//! `LoadBalancer` Service `kube-system/portal-ingress`, selector-less, whose
//! endpoints are this proxy's own sockets (an EndpointSlice per node, kept
//! by the proxy). So the load-balancer provider gives it an address from
//! `--load-balancer-pool`, every node's kernel proxy sends that address's
//! ports 80 and 443 here, pods reach the proxy by name
//! (`portal-ingress.kube-system`), and Ingresses and Gateways show that
//! address once it is given (the node's before).
//!
//! The Service is made when missing and otherwise left as the user has it
//! (a chosen `loadBalancerIP`, `externalTrafficPolicy: Local`, another
//! type); the slice is this proxy's and kept as it says.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// Where the Service lives, and its name.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "portal-ingress";
/// The field manager of the slices, and their `managed-by` label (so
/// that no endpoint controller takes them as its own).
const MANAGER: &str = "portal-ingress";

/// What this proxy publishes: the node it runs on and its sockets.
#[derive(Clone, Debug)]
pub struct Publish {
    pub node_name: String,
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
}

impl Publish {
    /// The address the sockets share, when they can be published (not
    /// loopback, not "any": an endpoint needs a routable address).
    fn address(&self) -> Option<IpAddr> {
        let ip = self.http.or(self.https)?.ip();
        let same = [self.http, self.https]
            .into_iter()
            .flatten()
            .all(|a| a.ip() == ip);
        (same && !ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
    }

    fn ports(&self) -> Vec<(&'static str, u16, u16)> {
        [("http", 80, self.http), ("https", 443, self.https)]
            .into_iter()
            .filter_map(|(name, port, socket)| Some((name, port, socket?.port())))
            .collect()
    }

    fn service(&self) -> Value {
        let ports: Vec<Value> = self
            .ports()
            .into_iter()
            .map(|(name, port, target)| {
                json!({"name": name, "port": port, "targetPort": target, "protocol": "TCP"})
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {
                "app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "portal"}},
            "spec": {"type": "LoadBalancer", "ports": ports}})
    }

    fn slice(&self, address: IpAddr) -> Value {
        let ports: Vec<Value> = self
            .ports()
            .into_iter()
            .map(|(name, _, target)| json!({"name": name, "port": target, "protocol": "TCP"}))
            .collect();
        let family = if address.is_ipv4() { "IPv4" } else { "IPv6" };
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{NAME}-{}", self.node_name), "namespace": NAMESPACE, "labels": {
                "kubernetes.io/service-name": NAME,
                "endpointslice.kubernetes.io/managed-by": MANAGER}},
            "addressType": family,
            "endpoints": [{"addresses": [address.to_string()], "nodeName": self.node_name,
                "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": ports})
    }
}

/// Makes the Service when missing and applies this node's slice, then
/// keeps both so: every minute a Service deleted meanwhile is made again
/// and a slice that differs (or went) is applied again.
pub(crate) async fn publish(client: Client, publish: Publish) {
    let Some(address) = publish.address() else {
        tracing::info!(
            "the ingress proxy listens on no routable address: not published as a Service"
        );
        return;
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let slice = publish.slice(address);
    let name = slice["metadata"]["name"]
        .as_str()
        .unwrap_or(NAME)
        .to_owned();
    let params = PatchParams::apply(MANAGER).force();
    let mut delay = Duration::from_millis(200);
    loop {
        crate::create_unless_present(
            Api::<Service>::namespaced(client.clone(), NAMESPACE),
            publish.service(),
            "the portal-ingress Service",
        )
        .await;
        let written = match slices.get_opt(&name).await {
            Ok(Some(current)) if shows(&current, &slice) => Ok(()),
            Ok(_) => slices
                .patch(&name, &params, &Patch::Apply(&slice))
                .await
                .map(drop),
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => delay = KEEP_EVERY,
            Err(kube::Error::Api(status)) if status.code == 422 => {
                tracing::error!(message = %status.message, "the ingress proxy's endpoint is refused");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot publish the ingress proxy's endpoint yet");
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
        tokio::time::sleep(delay).await;
    }
}

/// How often the Service and slice are checked once written.
const KEEP_EVERY: Duration = Duration::from_secs(60);

/// Whether the stored slice says what this proxy publishes.
fn shows(current: &EndpointSlice, wanted: &Value) -> bool {
    let Ok(current) = serde_json::to_value(current) else {
        return false;
    };
    let labels = wanted["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten();
    labels
        .into_iter()
        .all(|(k, v)| current["metadata"]["labels"][k] == *v)
        && ["addressType", "endpoints", "ports"]
            .iter()
            .all(|field| current[*field] == wanted[*field])
}

/// The addresses Ingresses and Gateways show: the published Service's
/// load-balancer addresses once it has some, else `advertised` (the node's).
pub(crate) fn addresses(
    services: &HashMap<(String, String), Arc<Service>>,
    advertised: &[IpAddr],
) -> Vec<IpAddr> {
    let published: Vec<IpAddr> = services
        .get(&(NAMESPACE.to_owned(), NAME.to_owned()))
        .and_then(|s| s.status.as_ref()?.load_balancer.as_ref()?.ingress.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    if published.is_empty() {
        advertised.to_vec()
    } else {
        published
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(http: &str, https: Option<&str>) -> Publish {
        Publish {
            node_name: "node-1".into(),
            http: Some(http.parse().unwrap()),
            https: https.map(|a| a.parse().unwrap()),
        }
    }

    #[test]
    fn only_a_routable_address_is_published() {
        assert_eq!(node("127.0.0.1:80", None).address(), None);
        assert_eq!(node("0.0.0.0:80", None).address(), None);
        assert_eq!(node("10.0.0.5:80", Some("10.0.0.6:443")).address(), None);
        assert_eq!(
            node("10.0.0.5:80", Some("10.0.0.5:443")).address(),
            "10.0.0.5".parse().ok()
        );
    }

    #[test]
    fn the_service_and_slice_name_the_sockets_ports() {
        let publish = node("10.0.0.5:8080", Some("10.0.0.5:8443"));
        let service = publish.service();
        assert_eq!(
            service["spec"]["ports"][0],
            json!({"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"})
        );
        assert_eq!(service["spec"]["ports"][1]["port"], 443);
        let slice = publish.slice("10.0.0.5".parse().unwrap());
        assert_eq!(slice["metadata"]["name"], "portal-ingress-node-1");
        assert_eq!(slice["endpoints"][0]["addresses"], json!(["10.0.0.5"]));
        assert_eq!(
            slice["ports"],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "https", "port": 8443, "protocol": "TCP"}])
        );
    }

    #[test]
    fn a_slice_as_published_is_left_alone() {
        let publish = node("10.0.0.5:80", Some("10.0.0.5:443"));
        let wanted = publish.slice("10.0.0.5".parse().unwrap());
        let stored: EndpointSlice = serde_json::from_value(wanted.clone()).unwrap();
        assert!(shows(&stored, &wanted));
        let moved = publish.slice("10.0.0.6".parse().unwrap());
        assert!(!shows(&serde_json::from_value(moved).unwrap(), &wanted));
    }

    #[test]
    fn statuses_show_the_load_balancer_address_once_given() {
        let node_ip: IpAddr = "10.0.0.5".parse().unwrap();
        let mut services = HashMap::new();
        let key = (NAMESPACE.to_owned(), NAME.to_owned());
        services.insert(
            key.clone(),
            Arc::new(
                serde_json::from_value::<Service>(node("10.0.0.5:80", None).service()).unwrap(),
            ),
        );
        assert_eq!(addresses(&services, &[node_ip]), [node_ip]);
        let mut given = (*services[&key]).clone();
        given.status =
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}))
                .unwrap();
        services.insert(key, Arc::new(given));
        assert_eq!(
            addresses(&services, &[node_ip]),
            ["198.51.100.1".parse::<IpAddr>().unwrap()]
        );
    }
}
