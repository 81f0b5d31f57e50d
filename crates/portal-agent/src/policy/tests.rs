//! The plan for NetworkPolicies' cases, and the table it renders.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

use super::model::{Allow, Cluster, DnsEndpoint, Isolated, Protocol};
use super::nft::render;

fn pod(namespace: &str, name: &str, node: &str, ip: &str, labels: serde_json::Value) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "ports": [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        }))
        .unwrap(),
    )
}

fn namespace(name: &str, labels: serde_json::Value) -> Arc<Namespace> {
    let mut labels = labels;
    labels["kubernetes.io/metadata.name"] = json!(name);
    Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap())
}

fn policy(namespace: &str, name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
    Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": namespace}, "spec": spec}),
        )
        .unwrap(),
    )
}

/// An address in the plan's one address space.
fn ip(text: &str) -> u128 {
    super::ranges::address(text.parse().unwrap())
}

struct World {
    pods: Vec<Arc<Pod>>,
    namespaces: Vec<Arc<Namespace>>,
    dns: Vec<DnsEndpoint>,
}

fn world() -> World {
    World {
        pods: vec![
            pod("a", "db", "n1", "10.244.0.2", json!({"app": "db"})),
            pod("a", "web", "n1", "10.244.0.3", json!({"app": "web"})),
            pod("b", "client", "n2", "10.244.1.2", json!({"app": "client"})),
            pod("c", "other", "n2", "10.244.1.3", json!({"app": "client"})),
        ],
        namespaces: vec![
            namespace("a", json!({})),
            namespace("b", json!({"team": "b"})),
            namespace("c", json!({})),
            namespace("kube-system", json!({})),
        ],
        dns: vec![DnsEndpoint {
            ip: "192.168.99.1".parse().unwrap(),
            ports: vec![
                ("dns".into(), Protocol::Udp, 53),
                ("dns-tcp".into(), Protocol::Tcp, 53),
            ],
        }],
    }
}

fn plan(world: &World, policies: &[Arc<NetworkPolicy>], node: &str) -> Vec<Isolated> {
    Cluster {
        policies,
        pods: &world.pods,
        namespaces: &world.namespaces,
        dns: &world.dns,
    }
    .plan(node)
}

#[test]
fn no_policy_isolates_nothing() {
    let w = world();
    assert!(plan(&w, &[], "n1").is_empty());
    let text = render(&[], false);
    assert!(text.contains("ct state established,related accept"));
    assert!(!text.contains("vmap"), "{text}");
    // A node whose pods have no IPv6: no IPv6 table at all.
    assert!(!text.contains("ip6"), "{text}");
    assert!(render(&[], true).contains("table ip6 portal_policy {"));
}

#[test]
fn default_deny_isolates_every_pod_of_its_namespace_on_this_node() {
    let w = world();
    let deny = policy(
        "a",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let isolated = plan(&w, &[deny], "n1");
    assert_eq!(isolated.len(), 2);
    assert!(isolated
        .iter()
        .all(|p| p.ingress == Some(vec![]) && p.egress.is_none()));
    // Another node's pods are that node's to isolate.
    assert!(plan(&w, &[policy("b", "deny", json!({}))], "n1").is_empty());
    let text = render(&isolated, true);
    assert!(
        text.contains(
            "ip daddr vmap { 10.244.0.2 : jump in_10_244_0_2, 10.244.0.3 : jump in_10_244_0_3 }"
        ),
        "{text}"
    );
    assert!(text.contains("\tchain in_10_244_0_2 {\n\t\tip saddr 10.244.0.2 accept\n\t\tdrop comment \"a/db: ingress not allowed\"\n"), "{text}");
}

#[test]
fn namespace_and_pod_selectors_pick_peers() {
    let w = world();
    let from_b = policy(
        "a",
        "from-b",
        json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]
        }),
    );
    let isolated = plan(&w, &[from_b], "n1");
    assert_eq!(isolated.len(), 1);
    assert_eq!(isolated[0].pod, "a/db");
    let allows = isolated[0].ingress.as_ref().unwrap();
    assert_eq!(
        allows[0].peers,
        Some(vec![(ip("10.244.1.2"), ip("10.244.1.2"))])
    );
    assert_eq!(allows[0].ports, None);

    // Both selectors in one peer: pods of those namespaces with those labels.
    let both = policy(
        "a",
        "both",
        json!({
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}]}]
        }),
    );
    let isolated = plan(&w, &[both], "n1");
    assert_eq!(
        isolated[0].ingress.as_ref().unwrap()[0].peers,
        Some(vec![(ip("10.244.1.2"), ip("10.244.1.3"))])
    );

    // A pod selector alone: the policy's own namespace.
    let own = policy(
        "a",
        "own",
        json!({"ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    );
    let isolated = plan(&w, &[own], "n1");
    assert_eq!(
        isolated[0].ingress.as_ref().unwrap()[0].peers,
        Some(vec![(ip("10.244.0.3"), ip("10.244.0.3"))])
    );

    // Peers that pick no pod allow nothing.
    let none = policy(
        "a",
        "none",
        json!({"ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "gone"}}}]}]}),
    );
    assert!(plan(&w, &[none], "n1")
        .iter()
        .all(|p| p.ingress == Some(vec![])));
}

#[test]
fn ip_blocks_leave_out_their_exceptions() {
    let w = world();
    let blocks = policy(
        "a",
        "blocks",
        json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}},
                                  {"ipBlock": {"cidr": "2001:db8::/32"}}]}]
        }),
    );
    let isolated = plan(&w, &[blocks], "n1");
    let peers = isolated[0].ingress.as_ref().unwrap()[0]
        .peers
        .clone()
        .unwrap();
    assert_eq!(
        peers,
        vec![
            (ip("192.168.0.0"), ip("192.168.0.255")),
            (ip("192.168.2.0"), ip("192.168.255.255")),
            (
                ip("2001:db8::"),
                ip("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")
            )
        ]
    );
    let text = render(&isolated, true);
    assert!(text.contains("ip saddr { 192.168.0.0-192.168.0.255, 192.168.2.0-192.168.255.255 } accept comment \"a/blocks\""), "{text}");
    // The pods have no IPv6 address: the IPv6 table holds no pod's chain.
    let six = &text[text.find("table ip6 portal_policy {").unwrap()..];
    assert!(!six.contains("chain in_"), "{six}");
}

#[test]
fn dual_stack_pods_are_isolated_in_both_tables() {
    let dual = |namespace: &str,
                name: &str,
                node: &str,
                v4: &str,
                v6: &str,
                labels: serde_json::Value|
     -> Arc<Pod> {
        let pod = pod(namespace, name, node, v4, labels);
        let mut pod = (*pod).clone();
        pod.status.as_mut().unwrap().pod_ips = Some(vec![
            k8s_openapi::api::core::v1::PodIP { ip: v4.into() },
            k8s_openapi::api::core::v1::PodIP { ip: v6.into() },
        ]);
        Arc::new(pod)
    };
    let w = World {
        pods: vec![
            dual(
                "a",
                "db",
                "n1",
                "10.244.0.2",
                "fd00:10:244::2",
                json!({"app": "db"}),
            ),
            dual(
                "b",
                "client",
                "n2",
                "10.244.1.2",
                "fd00:10:244:1::2",
                json!({"app": "client"}),
            ),
        ],
        ..world()
    };
    let from_b = policy(
        "a",
        "from-b",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}, {"ipBlock": {"cidr": "10.9.0.0/16"}}]}]}),
    );
    let isolated = plan(&w, &[from_b], "n1");
    assert_eq!(isolated[0].ip6, Some("fd00:10:244::2".parse().unwrap()));
    let text = render(&isolated, true);
    let (four, six) = text.split_at(text.find("table ip6 portal_policy").unwrap());
    assert!(
        four.contains("ip daddr vmap { 10.244.0.2 : jump in_10_244_0_2 }"),
        "{four}"
    );
    assert!(
        four.contains("ip saddr { 10.9.0.0-10.9.255.255, 10.244.1.2 } accept"),
        "{four}"
    );
    assert!(
        six.contains("ip6 daddr vmap { fd00:10:244::2 : jump in_10_244_0_2 }"),
        "{six}"
    );
    assert!(six.contains("ip6 saddr fd00:10:244::2 accept"), "{six}");
    assert!(
        six.contains("ip6 saddr { fd00:10:244:1::2 } accept"),
        "{six}"
    );
    assert!(
        six.contains("drop comment \"a/db: ingress not allowed\""),
        "{six}"
    );
    assert!(
        !six.contains("10.9.0.0"),
        "an IPv4 block admits no IPv6 peer: {six}"
    );
}

#[test]
fn ports_numbered_ranged_named_and_by_protocol() {
    let w = world();
    let ports = policy(
        "a",
        "ports",
        json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"ports": [{"port": "http", "protocol": "TCP"}, {"port": 80, "protocol": "TCP"},
                                   {"port": 9000, "endPort": 9100, "protocol": "TCP"}, {"protocol": "UDP"},
                                   {"port": "missing", "protocol": "TCP"}]}]
        }),
    );
    let isolated = plan(&w, &[ports], "n1");
    let allow = &isolated[0].ingress.as_ref().unwrap()[0];
    assert_eq!(allow.peers, None);
    let by = allow.ports.as_ref().unwrap();
    assert_eq!(
        by[&Protocol::Tcp],
        Some(vec![(80, 80), (8080, 8080), (9000, 9100)])
    );
    assert_eq!(by[&Protocol::Udp], None);
    let text = render(&isolated, true);
    assert!(
        text.contains("meta l4proto tcp th dport { 80, 8080, 9000-9100 } accept"),
        "{text}"
    );
    assert!(text.contains("meta l4proto udp accept"), "{text}");

    // Only named ports that resolve to nothing: the rule allows nothing.
    let unresolved = policy(
        "a",
        "x",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"ports": [{"port": "missing", "protocol": "TCP"}]}]}),
    );
    assert_eq!(plan(&w, &[unresolved], "n1")[0].ingress, Some(vec![]));
}

#[test]
fn egress_named_ports_resolve_on_each_destination() {
    let w = world();
    let egress = policy(
        "b",
        "dns-only",
        json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "dns", "protocol": "UDP"}, {"port": 53, "protocol": "UDP"}]}]
        }),
    );
    let isolated = plan(&w, &[egress], "n2");
    assert_eq!(isolated.len(), 1, "only b's pod: {isolated:?}");
    let allows = isolated[0].egress.as_ref().unwrap();
    assert_eq!(isolated[0].ingress, None);
    // 53 to every pod; 5353 (named "dns" on each pod) to the pods, in one
    // rule; the cluster DNS (kube-system) on its "dns" port only.
    let port = |a: &Allow| a.ports.as_ref().unwrap()[&Protocol::Udp].clone();
    assert_eq!(allows.len(), 3, "{allows:?}");
    assert_eq!(port(&allows[0]), Some(vec![(53, 53)]));
    assert_eq!(
        allows[1].peers,
        Some(vec![
            (ip("10.244.0.2"), ip("10.244.0.3")),
            (ip("10.244.1.2"), ip("10.244.1.3"))
        ])
    );
    assert_eq!(port(&allows[1]), Some(vec![(5353, 5353)]));
    let dns = ip("192.168.99.1");
    assert_eq!(allows[2].peers, Some(vec![(dns, dns)]));
    assert_eq!(allows[2].ports.as_ref().unwrap().len(), 1);
    assert_eq!(port(&allows[2]), Some(vec![(53, 53)]));
    let text = render(&isolated, true);
    assert!(
        text.contains("ip saddr vmap { 10.244.1.2 : jump out_10_244_1_2 }"),
        "{text}"
    );
    assert!(text.contains("\t\tip daddr 10.244.1.2 return\n"), "{text}");
}

#[test]
fn policies_add_up() {
    let w = world();
    let one = policy(
        "a",
        "one",
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{"ports": [{"port": 1, "protocol": "TCP"}]}]}),
    );
    let two = policy(
        "a",
        "two",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 2, "protocol": "TCP"}]}]}),
    );
    let isolated = plan(&w, &[one, two], "n1");
    let db = isolated.iter().find(|p| p.pod == "a/db").unwrap();
    assert_eq!(db.ingress.as_ref().unwrap().len(), 2);
    let web = isolated.iter().find(|p| p.pod == "a/web").unwrap();
    assert_eq!(web.ingress.as_ref().unwrap().len(), 1);
}

#[test]
fn finished_and_host_network_pods_take_no_part() {
    let mut w = world();
    let mut done = (*w.pods[1]).clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    w.pods[1] = Arc::new(done);
    let deny = policy("a", "deny", json!({}));
    let isolated = plan(&w, &[deny], "n1");
    assert_eq!(
        isolated.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(),
        ["a/db"]
    );
}

#[test]
fn the_cluster_dns_is_picked_as_kubernetes_dns_pods_are() {
    let w = world();
    // The policy Kubernetes users write to allow DNS and nothing else.
    let dns_only = policy(
        "b",
        "dns",
        json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"port": "dns", "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]
        }),
    );
    let isolated = plan(&w, &[dns_only], "n2");
    let allows = isolated[0].egress.as_ref().unwrap();
    let dns = ip("192.168.99.1");
    assert!(
        allows.iter().all(|a| a.peers == Some(vec![(dns, dns)])),
        "{allows:?}"
    );
    let text = render(&isolated, true);
    assert!(
        text.contains("ip daddr { 192.168.99.1 } meta l4proto tcp th dport { 53 } return"),
        "{text}"
    );
    assert!(
        text.contains("ip daddr { 192.168.99.1 } meta l4proto udp th dport { 53 } return"),
        "{text}"
    );
}

#[test]
fn the_dns_stand_in_opens_only_dns_ports_and_only_for_egress() {
    let w = world();
    // "Anything in the cluster", no ports: the DNS node only on its DNS ports.
    let in_cluster = policy(
        "b",
        "in-cluster",
        json!({
            "podSelector": {}, "policyTypes": ["Egress", "Ingress"],
            "egress": [{"to": [{"namespaceSelector": {}}]}],
            "ingress": [{"from": [{"namespaceSelector": {}}]}]
        }),
    );
    let isolated = plan(&w, &[in_cluster], "n2");
    let egress = isolated[0].egress.as_ref().unwrap();
    let dns = ip("192.168.99.1");
    let to_dns: Vec<&Allow> = egress
        .iter()
        .filter(|a| a.peers == Some(vec![(dns, dns)]))
        .collect();
    assert_eq!(to_dns.len(), 1, "{egress:?}");
    let ports = to_dns[0].ports.as_ref().unwrap();
    assert_eq!(ports[&Protocol::Udp], Some(vec![(53, 53)]));
    assert_eq!(ports[&Protocol::Tcp], Some(vec![(53, 53)]));
    let holds = |ranges: &Vec<(u128, u128)>| {
        ranges
            .iter()
            .any(|&(low, high)| (low..=high).contains(&dns))
    };
    assert!(!holds(egress[0].peers.as_ref().unwrap()));
    // Ingress from "all pods" never admits the DNS node.
    let ingress = isolated[0].ingress.as_ref().unwrap();
    assert!(ingress.iter().all(|a| !holds(a.peers.as_ref().unwrap())));
    // A rule for other ports leaves the DNS out.
    let web_only = policy(
        "b",
        "web",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": 80, "protocol": "TCP"}]}]}),
    );
    let isolated = plan(&w, &[web_only], "n2");
    assert!(isolated[0]
        .egress
        .as_ref()
        .unwrap()
        .iter()
        .all(|a| a.peers != Some(vec![(dns, dns)])));
}
