//! Golden transactions and packet traces for the nftables backend.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::tracer::{trace, Outcome, Packet};
use super::{FakeNft, Nftables};
use crate::model::{Protocol, ServiceKey, ServicePort};
use crate::tracker::Changes;

fn ep(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|_| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

fn web(endpoints: &[&str]) -> ServicePort {
    ServicePort {
        service: ServiceKey::new("default", "web"),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
        cluster_ip: ip("10.96.0.20"),
        port: 80,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        affinity: None,
        endpoints: endpoints.iter().map(|e| ep(e)).collect(),
        local_endpoints: Vec::new(),
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    }
}

fn changes(ports: &[ServicePort]) -> Changes {
    let mut services: BTreeMap<ServiceKey, Vec<ServicePort>> = BTreeMap::new();
    for port in ports {
        services
            .entry(port.service.clone())
            .or_default()
            .push(port.clone());
    }
    Changes {
        services,
        triggers: Vec::new(),
    }
}

fn gone(namespace: &str, name: &str) -> Changes {
    let mut services = BTreeMap::new();
    services.insert(ServiceKey::new(namespace, name), Vec::new());
    Changes {
        services,
        triggers: Vec::new(),
    }
}

fn last(proxy: &mut Nftables<FakeNft>) -> String {
    proxy.nft().transactions.last().cloned().unwrap_or_default()
}

fn packet(dst: &str, port: u16) -> Packet {
    Packet {
        src: ip("10.244.0.9"),
        dst: ip(dst),
        protocol: Protocol::Tcp,
        port,
        local: false,
        from_node: false,
        from_pod: false,
    }
}

fn traced(proxy: &Nftables<FakeNft>, packet: Packet) -> Outcome {
    trace(proxy.applied(), packet)
}

fn dnat(endpoints: &[&str], masquerade: bool) -> Outcome {
    Outcome::Dnat {
        endpoints: endpoints.iter().map(|e| ep(e)).collect(),
        masquerade,
    }
}

#[test]
fn full_sync_writes_the_whole_table_in_one_transaction() {
    let mut proxy = Nftables::fake(FakeNft::default());
    assert!(proxy
        .sync(
            &changes(&[web(&["10.244.0.5:8080", "10.244.0.6:8080"])]),
            true
        )
        .is_ok());
    let tx = last(&mut proxy);
    assert!(tx.starts_with("add table ip portal\n"));
    let service_part = &tx[tx.find("add chain ip portal svc-").unwrap_or(0)..];
    assert_eq!(
        service_part,
        "add chain ip portal svc-default/web/tcp/http\n\
         flush chain ip portal svc-default/web/tcp/http\n\
         add rule ip portal svc-default/web/tcp/http numgen random mod 2 0 meta l4proto tcp dnat to 10.244.0.5:8080\n\
         add rule ip portal svc-default/web/tcp/http meta l4proto tcp dnat to 10.244.0.6:8080\n\
         add element ip portal cluster-ips { 10.96.0.20 . tcp . 80 : goto svc-default/web/tcp/http }\n\
         add element ip portal hairpin { 10.244.0.5 . 10.244.0.5 }\n\
         add element ip portal hairpin { 10.244.0.6 . 10.244.0.6 }\n"
    );
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.0.5:8080", "10.244.0.6:8080"], false)
    );
    assert_eq!(traced(&proxy, packet("10.96.0.20", 81)), Outcome::Untouched);
}

#[test]
fn each_family_has_its_table_and_programs_only_its_ports() {
    let v4 = web(&["10.244.0.5:8080"]);
    let v6 = ServicePort {
        cluster_ip: ip("fd00:10:96::20"),
        endpoints: vec![ep("[fd00:10:244::5]:8080")],
        affinity: Some(60),
        ..web(&[])
    };
    let both = changes(&[v4.clone(), v6.clone()]);
    let mut six = Nftables::fake_of(FakeNft::default(), crate::model::Family::V6);
    assert!(six.sync(&both, true).is_ok());
    let tx = last(&mut six);
    assert!(tx.starts_with("add table ip6 portal\n"), "{tx}");
    assert!(tx.contains(
        "add map ip6 portal cluster-ips { type ipv6_addr . inet_proto . inet_service : verdict ; }"
    ));
    assert!(tx.contains("add rule ip6 portal services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @node-ports"));
    assert!(tx.contains("add set ip6 portal aff-default/web/tcp/http/fd00_10_244__5/8080/60 { type ipv6_addr ; flags dynamic,timeout ; timeout 60s ; }"), "{tx}");
    assert!(tx.contains("add rule ip6 portal svc-default/web/tcp/http ip6 saddr @aff-default/web/tcp/http/fd00_10_244__5/8080/60 update @aff-default/web/tcp/http/fd00_10_244__5/8080/60 { ip6 saddr } meta l4proto tcp dnat to [fd00:10:244::5]:8080"), "{tx}");
    assert!(tx.contains("add element ip6 portal cluster-ips { fd00:10:96::20 . tcp . 80 : goto svc-default/web/tcp/http }"));
    assert!(tx.contains("add element ip6 portal hairpin { fd00:10:244::5 . fd00:10:244::5 }"));
    assert!(
        !tx.contains("10.96.0.20") && !tx.contains("ip portal"),
        "{tx}"
    );
    // The IPv4 table has the IPv4 port only; a partial change of the
    // IPv6 endpoints leaves it untouched.
    let mut four = Nftables::fake(FakeNft::default());
    assert!(four.sync(&both, true).is_ok());
    assert!(!last(&mut four).contains("fd00:"));
    let before = four.nft().transactions.len();
    let moved = ServicePort {
        endpoints: vec![ep("[fd00:10:244::6]:8080")],
        ..v6
    };
    let change = changes(&[v4, moved]);
    assert!(four.sync(&change, false).is_ok() && six.sync(&change, false).is_ok());
    assert_eq!(
        four.nft().transactions.len(),
        before,
        "nothing changed for IPv4"
    );
    assert!(last(&mut six).contains("dnat to [fd00:10:244::6]:8080"));
}

#[test]
fn partial_sync_sends_only_the_changed_chain() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let other = ServicePort {
        service: ServiceKey::new("default", "other"),
        cluster_ip: ip("10.96.0.21"),
        ..web(&["10.244.0.7:80"])
    };
    assert!(proxy
        .sync(
            &changes(&[web(&["10.244.0.5:8080", "10.244.0.6:8080"]), other]),
            true
        )
        .is_ok());
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.6:8080"])]), false)
        .is_ok());
    assert_eq!(
        last(&mut proxy),
        "delete element ip portal hairpin { 10.244.0.5 . 10.244.0.5 }\n\
         flush chain ip portal svc-default/web/tcp/http\n\
         add rule ip portal svc-default/web/tcp/http meta l4proto tcp dnat to 10.244.0.6:8080\n"
    );
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.0.6:8080"], false)
    );
    assert_eq!(
        traced(&proxy, packet("10.96.0.21", 80)),
        dnat(&["10.244.0.7:80"], false)
    );

    // No change, no transaction.
    let count = proxy.nft().transactions.len();
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.6:8080"])]), false)
        .is_ok());
    assert_eq!(proxy.nft().transactions.len(), count);

    // Deleted: its element goes before its chain.
    assert!(proxy.sync(&gone("default", "web"), false).is_ok());
    assert_eq!(
        last(&mut proxy),
        "delete element ip portal cluster-ips { 10.96.0.20 . tcp . 80 }\n\
         delete element ip portal hairpin { 10.244.0.6 . 10.244.0.6 }\n\
         flush chain ip portal svc-default/web/tcp/http\n\
         delete chain ip portal svc-default/web/tcp/http\n"
    );
    assert_eq!(traced(&proxy, packet("10.96.0.20", 80)), Outcome::Untouched);
}

#[test]
fn no_endpoints_rejects_and_the_first_endpoint_replaces_the_reject() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let mut port = web(&[]);
    port.node_port = Some(30080);
    assert!(proxy.sync(&changes(&[port.clone()]), true).is_ok());
    assert_eq!(traced(&proxy, packet("10.96.0.20", 80)), Outcome::Reject);
    assert_eq!(
        traced(
            &proxy,
            Packet {
                local: true,
                ..packet("192.168.1.2", 30080)
            }
        ),
        Outcome::Reject
    );
    port.endpoints = vec![ep("10.244.0.5:8080")];
    assert!(proxy.sync(&changes(&[port]), false).is_ok());
    let tx = last(&mut proxy);
    assert!(
        tx.contains("delete element ip portal no-endpoint-services { 10.96.0.20 . tcp . 80 }\n")
    );
    assert!(tx.contains("delete element ip portal no-endpoint-node-ports { tcp . 30080 }\n"));
    assert!(tx.contains(
        "add element ip portal node-ports { tcp . 30080 : goto ext-default/web/tcp/http }\n"
    ));
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.0.5:8080"], false)
    );
}

#[test]
fn local_traffic_policies_use_this_nodes_endpoints_or_drop() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let mut port = web(&["10.244.1.5:8080", "10.244.2.5:8080"]);
    port.node_port = Some(30080);
    port.load_balancer_ips = vec![ip("198.51.100.1")];
    port.external_local = true;
    port.local_endpoints = vec![ep("10.244.2.5:8080")];
    assert!(proxy.sync(&changes(&[port.clone()]), true).is_ok());
    let outside = |dst: &str, port: u16| Packet {
        src: ip("203.0.113.7"),
        local: true,
        ..packet(dst, port)
    };
    // From outside: this node's endpoint only, the client's address kept.
    let local_only = dnat(&["10.244.2.5:8080"], false);
    assert_eq!(traced(&proxy, outside("192.168.1.2", 30080)), local_only);
    assert_eq!(traced(&proxy, outside("198.51.100.1", 80)), local_only);
    // From the node itself: anywhere, masqueraded; the cluster IP: anywhere.
    let anywhere = Packet {
        from_node: true,
        ..outside("192.168.1.2", 30080)
    };
    assert_eq!(
        traced(&proxy, anywhere),
        dnat(&["10.244.1.5:8080", "10.244.2.5:8080"], true)
    );
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.1.5:8080", "10.244.2.5:8080"], false)
    );
    // No endpoint here: external traffic is dropped, not rejected; this
    // node's pods still reach the others, with their own address.
    port.local_endpoints.clear();
    assert!(proxy.sync(&changes(&[port.clone()]), false).is_ok());
    assert_eq!(traced(&proxy, outside("192.168.1.2", 30080)), Outcome::Drop);
    let from_pod = Packet {
        from_pod: true,
        ..packet("198.51.100.1", 80)
    };
    assert_eq!(
        traced(&proxy, from_pod),
        dnat(&["10.244.1.5:8080", "10.244.2.5:8080"], false)
    );
    // internalTrafficPolicy: Local: the cluster IP too.
    port.internal_local = true;
    assert!(proxy.sync(&changes(&[port.clone()]), false).is_ok());
    assert_eq!(traced(&proxy, packet("10.96.0.20", 80)), Outcome::Drop);
    port.local_endpoints = vec![ep("10.244.2.5:8080")];
    assert!(proxy.sync(&changes(&[port]), false).is_ok());
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.2.5:8080"], false)
    );
}

#[test]
fn node_ports_external_and_load_balancer_addresses_are_masqueraded() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let mut port = web(&["10.244.0.5:8080"]);
    port.node_port = Some(30080);
    port.external_ips = vec![ip("192.0.2.10")];
    port.load_balancer_ips = vec![ip("198.51.100.1")];
    assert!(proxy.sync(&changes(&[port]), true).is_ok());
    let only = dnat(&["10.244.0.5:8080"], true);
    assert_eq!(
        traced(
            &proxy,
            Packet {
                local: true,
                ..packet("192.168.1.2", 30080)
            }
        ),
        only
    );
    assert_eq!(traced(&proxy, packet("192.0.2.10", 80)), only);
    assert_eq!(traced(&proxy, packet("198.51.100.1", 80)), only);
    // A node port is only a node port on the node's own addresses.
    assert_eq!(
        traced(&proxy, packet("192.168.1.2", 30080)),
        Outcome::Untouched
    );
    // The cluster IP keeps the client's address.
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.0.5:8080"], false)
    );
}

#[test]
fn a_pod_reaching_itself_is_masqueraded() {
    let mut proxy = Nftables::fake(FakeNft::default());
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.9:8080"])]), true)
        .is_ok());
    assert_eq!(
        traced(&proxy, packet("10.96.0.20", 80)),
        dnat(&["10.244.0.9:8080"], true)
    );
}

#[test]
fn affinity_uses_a_timed_set_per_endpoint() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let mut port = web(&["10.244.0.5:8080", "10.244.0.6:8080"]);
    port.affinity = Some(600);
    assert!(proxy.sync(&changes(&[port]), true).is_ok());
    let tx = last(&mut proxy);
    let set = "aff-default/web/tcp/http/10.244.0.5/8080/600";
    assert!(tx.contains(&format!(
        "add set ip portal {set} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }}\n"
    )));
    assert!(tx.contains(&format!(
        "add rule ip portal svc-default/web/tcp/http ip saddr @{set} update @{set} {{ ip saddr }} meta l4proto tcp dnat to 10.244.0.5:8080\n"
    )));
    assert!(tx.contains(&format!(
        "add rule ip portal svc-default/web/tcp/http numgen random mod 2 0 update @{set} {{ ip saddr }} meta l4proto tcp dnat to 10.244.0.5:8080\n"
    )));
    // Affinity sets are never flushed (pins survive a resync).
    assert!(!tx.contains("flush set ip portal aff-"));
}

#[test]
fn a_failed_sync_makes_the_next_one_rebuild_and_remove_leftovers() {
    let mut proxy = Nftables::fake(FakeNft::default());
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.5:8080"])]), true)
        .is_ok());
    proxy.nft().fail_next = true;
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.6:8080"])]), false)
        .is_err());
    assert_eq!(proxy.applied().count(), 0);
    proxy.nft().existing.chains = vec![
        "services".into(),
        "svc-gone/old/tcp/80".into(),
        "svc-default/web/tcp/http".into(),
    ];
    proxy.nft().existing.sets = vec![
        "hairpin".into(),
        "aff-gone/old/tcp/80/10.244.0.1/80/10800".into(),
    ];
    assert!(proxy
        .sync(&changes(&[web(&["10.244.0.6:8080"])]), true)
        .is_ok());
    let tx = last(&mut proxy);
    assert!(tx.contains("flush chain ip portal svc-gone/old/tcp/80\n"));
    assert!(tx.contains("delete chain ip portal svc-gone/old/tcp/80\n"));
    assert!(tx.contains("delete set ip portal aff-gone/old/tcp/80/10.244.0.1/80/10800\n"));
    assert!(!tx.contains("delete chain ip portal services"));
    assert!(!tx.contains("delete chain ip portal svc-default"));
    assert!(!tx.contains("delete set ip portal hairpin"));
    assert!(
        tx.find("delete chain").unwrap_or(0)
            > tx.find("flush map ip portal cluster-ips")
                .unwrap_or(usize::MAX)
    );
}

#[test]
fn udp_and_tcp_ports_of_one_service_get_their_own_chains() {
    let mut proxy = Nftables::fake(FakeNft::default());
    let tcp = ServicePort {
        port_name: "dns-tcp".into(),
        port: 53,
        ..web(&["10.244.0.5:53"])
    };
    let udp = ServicePort {
        port_name: "dns".into(),
        port: 53,
        protocol: Protocol::Udp,
        ..web(&["10.244.0.5:53"])
    };
    assert!(proxy.sync(&changes(&[tcp, udp]), true).is_ok());
    let tx = last(&mut proxy);
    assert!(tx.contains(
        "add rule ip portal svc-default/web/udp/dns meta l4proto udp dnat to 10.244.0.5:53\n"
    ));
    let udp_packet = Packet {
        protocol: Protocol::Udp,
        ..packet("10.96.0.20", 53)
    };
    assert_eq!(traced(&proxy, udp_packet), dnat(&["10.244.0.5:53"], false));
}

/// Writes the full-sync transaction for N Services of five endpoints to
/// $PORTAL_NFT_SCRIPT, for timing `nft -f` by hand (ADR 0006).
#[test]
#[ignore = "a tool, not a test"]
fn write_a_large_full_sync() {
    let services: usize = std::env::var("PORTAL_NFT_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let ports: Vec<ServicePort> = (0..services)
        .map(|s| {
            let endpoint = |i: usize| {
                let n = s * 5 + i;
                SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(
                        10,
                        245 + (n / 65536) as u8,
                        (n / 256 % 256) as u8,
                        (n % 256) as u8,
                    )),
                    8080,
                )
            };
            ServicePort {
                service: ServiceKey::new("bench", &format!("s{s}")),
                cluster_ip: IpAddr::V4(Ipv4Addr::new(
                    10,
                    96 + (s / 65536) as u8,
                    (s / 256 % 256) as u8,
                    (s % 256) as u8,
                )),
                endpoints: (0..5).map(endpoint).collect(),
                ..web(&[])
            }
        })
        .collect();
    let mut proxy = Nftables::fake(FakeNft::default());
    assert!(proxy.sync(&changes(&ports), true).is_ok());
    let path = std::env::var("PORTAL_NFT_SCRIPT").unwrap_or_else(|_| "/tmp/portal-full.nft".into());
    assert!(std::fs::write(path, last(&mut proxy)).is_ok());
}

mod against_the_kernel_model {
    use super::super::kernel_model::ModelNft;
    use super::*;

    type World = BTreeMap<ServiceKey, Vec<ServicePort>>;

    fn port(name: &str, vip: &str, endpoints: &[&str]) -> ServicePort {
        ServicePort {
            service: ServiceKey::new("default", name),
            cluster_ip: ip(vip),
            ..web(endpoints)
        }
    }

    /// Applies one step as a partial sync, then checks the table equals
    /// what a full sync of the same world builds from nothing.
    fn step(
        proxy: &mut Nftables<ModelNft>,
        world: &mut World,
        change: Vec<(&str, Vec<ServicePort>)>,
    ) {
        let mut services = BTreeMap::new();
        for (name, ports) in change {
            let key = ServiceKey::new("default", name);
            if ports.is_empty() {
                world.remove(&key);
            } else {
                world.insert(key.clone(), ports.clone());
            }
            services.insert(key, ports);
        }
        let changes = Changes {
            services,
            triggers: Vec::new(),
        };
        if let Err(error) = proxy.sync(&changes, false) {
            panic!("partial sync rejected: {error}");
        }
        let mut fresh = Nftables::fake(ModelNft::default());
        let all = Changes {
            services: world.clone(),
            triggers: Vec::new(),
        };
        assert!(fresh.sync(&all, true).is_ok());
        assert_eq!(proxy.nft().table.summary(), fresh.nft().table.summary());
    }

    #[test]
    fn partial_syncs_build_what_a_full_sync_builds() {
        let mut proxy = Nftables::fake(ModelNft::default());
        let mut world = World::new();
        let initial = Changes {
            services: BTreeMap::new(),
            triggers: Vec::new(),
        };
        assert!(proxy.sync(&initial, true).is_ok());

        let shared = |name: &str, vip: &str, endpoints: &[&str]| ServicePort {
            external_ips: vec![ip("192.0.2.10")],
            ..port(name, vip, endpoints)
        };
        step(
            &mut proxy,
            &mut world,
            vec![(
                "a",
                vec![shared(
                    "a",
                    "10.96.0.1",
                    &["10.244.0.5:80", "10.244.0.6:80"],
                )],
            )],
        );
        // Two Services on the same external IP and port: one owns it.
        step(
            &mut proxy,
            &mut world,
            vec![("b", vec![shared("b", "10.96.0.2", &["10.244.0.7:80"])])],
        );
        // The owner loses its endpoints: the other one gets the address.
        step(
            &mut proxy,
            &mut world,
            vec![("a", vec![shared("a", "10.96.0.1", &[])])],
        );
        step(
            &mut proxy,
            &mut world,
            vec![("a", vec![shared("a", "10.96.0.1", &["10.244.0.5:80"])])],
        );
        step(&mut proxy, &mut world, vec![("a", vec![])]);
        // Both without endpoints: one shared reject element.
        step(
            &mut proxy,
            &mut world,
            vec![
                ("b", vec![shared("b", "10.96.0.2", &[])]),
                ("a", vec![shared("a", "10.96.0.1", &[])]),
            ],
        );
        step(&mut proxy, &mut world, vec![("a", vec![])]);
        step(&mut proxy, &mut world, vec![("b", vec![])]);

        // Node port with affinity: port changed, renamed, then no node port.
        let mut c = ServicePort {
            node_port: Some(30080),
            affinity: Some(600),
            ..port("c", "10.96.0.3", &["10.244.0.5:80", "10.244.0.8:80"])
        };
        step(&mut proxy, &mut world, vec![("c", vec![c.clone()])]);
        c.node_port = Some(30081);
        step(&mut proxy, &mut world, vec![("c", vec![c.clone()])]);
        c.port_name = "web".into();
        step(&mut proxy, &mut world, vec![("c", vec![c.clone()])]);
        c.affinity = Some(60);
        step(&mut proxy, &mut world, vec![("c", vec![c.clone()])]);
        c.node_port = None;
        c.affinity = None;
        step(&mut proxy, &mut world, vec![("c", vec![c.clone()])]);

        // Two Services sharing an endpoint (hairpin pairs are counted).
        step(
            &mut proxy,
            &mut world,
            vec![("d", vec![port("d", "10.96.0.4", &["10.244.0.5:80"])])],
        );
        step(&mut proxy, &mut world, vec![("d", vec![])]);
        // TCP and UDP ports; the UDP one removed.
        let udp = ServicePort {
            protocol: Protocol::Udp,
            port_name: "dns".into(),
            port: 53,
            ..port("e", "10.96.0.5", &["10.244.0.9:53"])
        };
        let tcp = ServicePort {
            port_name: "dns-tcp".into(),
            port: 53,
            ..port("e", "10.96.0.5", &["10.244.0.9:53"])
        };
        step(&mut proxy, &mut world, vec![("e", vec![udp, tcp.clone()])]);
        step(&mut proxy, &mut world, vec![("e", vec![tcp])]);
        // Everything goes.
        step(&mut proxy, &mut world, vec![("c", vec![]), ("e", vec![])]);
        assert!(proxy
            .nft()
            .table
            .chains
            .keys()
            .all(|c| !c.starts_with("svc-") && !c.starts_with("ext-")));
    }

    #[test]
    fn a_restart_over_a_stale_table_removes_what_is_gone() {
        let mut before = Nftables::fake(ModelNft::default());
        let old = Changes {
            services: [(
                ServiceKey::new("default", "old"),
                vec![ServicePort {
                    affinity: Some(60),
                    node_port: Some(30080),
                    ..port("old", "10.96.0.9", &["10.244.0.5:80"])
                }],
            )]
            .into(),
            triggers: Vec::new(),
        };
        assert!(before.sync(&old, true).is_ok());
        let table = before.nft().table.clone();
        // A new process: same kernel table, a world without "old".
        let mut after = Nftables::fake(ModelNft {
            table,
            transactions: 0,
        });
        let now = changes(&[web(&["10.244.0.6:80"])]);
        assert!(after.sync(&now, true).is_ok());
        let mut fresh = Nftables::fake(ModelNft::default());
        assert!(fresh.sync(&now, true).is_ok());
        assert_eq!(after.nft().table.summary(), fresh.nft().table.summary());
    }
}
