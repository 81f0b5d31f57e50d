//! The generic store path in process: a real `ApiServer` on a temporary
//! directory, driven by `kube::Client` as any controller drives it. Watch
//! cache freshness and resume, compare-and-swap conflicts, allocation on
//! update, delete-collection.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use portal_apiserver::{ApiServer, Config, ConnectionLimits, PortRange, ServiceCidrs};

struct Server {
    _dir: tempfile::TempDir,
    client: Client,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        data_dir: dir.path().to_owned(),
        bind: "127.0.0.1:0".parse().expect("address"),
        history_revisions: 1000,
        service_cidrs: "10.96.0.0/24".parse::<ServiceCidrs>().expect("cidr"),
        node_ports: "30000-30010".parse::<PortRange>().expect("range"),
        advertise_address: None,
        other_addresses: Vec::new(),
        connections: ConnectionLimits::default(),
        datastore: Default::default(),
        token: None,
        encryption: None,
        authentication: Default::default(),
        audit: None,
        console: false,
    };
    let mut api = ApiServer::start(config)
        .await
        .expect("the API server starts");
    let kubeconfig = Kubeconfig::read_from(&api.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    tokio::spawn(async move { api.wait().await });
    Server {
        _dir: dir,
        client: Client::try_from(config).expect("client"),
    }
}

fn service(name: &str, port: i32, kind: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_string(), "t".to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(kind.into()),
            ports: Some(vec![ServicePort {
                port,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_visible_to_the_next_read_and_watch_resumes_where_the_list_ended() {
    let server = server().await;
    let services: Api<Service> = Api::namespaced(server.client.clone(), "default");
    let created = services
        .create(&PostParams::default(), &service("a", 80, "ClusterIP"))
        .await
        .expect("create");
    // A read right after the write sees it (no stale cache).
    let listed = services.list(&ListParams::default()).await.expect("list");
    assert!(listed
        .items
        .iter()
        .any(|s| s.metadata.name.as_deref() == Some("a")));
    let from = listed.metadata.resource_version.expect("list revision");
    services
        .create(&PostParams::default(), &service("b", 81, "ClusterIP"))
        .await
        .expect("create b");
    services
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    // A watch from the list's revision sees exactly what came after it.
    let mut stream = services
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .expect("watch")
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("events in time")
            .expect("a good event")
            .expect("the stream goes on");
        match event {
            WatchEvent::Added(s) => {
                seen.push(format!("added {}", s.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Deleted(s) => {
                seen.push(format!("deleted {}", s.metadata.name.unwrap_or_default()))
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["added b", "deleted a"]);
    assert_ne!(created.metadata.uid, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_update_is_a_conflict() {
    let server = server().await;
    let services: Api<Service> = Api::namespaced(server.client.clone(), "default");
    let first = services
        .create(&PostParams::default(), &service("cas", 80, "ClusterIP"))
        .await
        .expect("create");
    let mut newer = first.clone();
    newer.metadata.labels = Some([("v".to_string(), "2".to_string())].into());
    services
        .replace("cas", &PostParams::default(), &newer)
        .await
        .expect("the first update wins");
    let mut stale = first;
    stale.metadata.labels = Some([("v".to_string(), "3".to_string())].into());
    match services
        .replace("cas", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_type_allocates_and_releases_node_ports() {
    let server = server().await;
    let services: Api<Service> = Api::namespaced(server.client.clone(), "default");
    let created = services
        .create(&PostParams::default(), &service("np", 80, "ClusterIP"))
        .await
        .expect("create");
    let node_port = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p[0].node_port)
    };
    assert_eq!(node_port(&created), None);
    let mut to_node_port = created.clone();
    to_node_port.spec.as_mut().expect("spec").type_ = Some("NodePort".into());
    let updated = services
        .replace("np", &PostParams::default(), &to_node_port)
        .await
        .expect("update to NodePort");
    let port = node_port(&updated).expect("a node port allocated on update");
    assert!((30000..=30010).contains(&port));
    assert_eq!(
        updated.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
        created.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
        "the cluster IP stays"
    );
    // Back to ClusterIP: the port is free again for another Service.
    let mut back = updated.clone();
    let spec = back.spec.as_mut().expect("spec");
    spec.type_ = Some("ClusterIP".into());
    spec.ports.as_mut().expect("ports")[0].node_port = None;
    services
        .replace("np", &PostParams::default(), &back)
        .await
        .expect("update back");
    let mut wants_it = service("np2", 80, "NodePort");
    wants_it
        .spec
        .as_mut()
        .expect("spec")
        .ports
        .as_mut()
        .expect("ports")[0]
        .node_port = Some(port);
    services
        .create(&PostParams::default(), &wants_it)
        .await
        .expect("the released port can be taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_collection_removes_what_the_selector_matches() {
    let server = server().await;
    let namespaces: Api<Namespace> = Api::all(server.client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("dc".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let services: Api<Service> = Api::namespaced(server.client.clone(), "dc");
    for (i, name) in ["x", "y", "z"].iter().enumerate() {
        let mut s = service(name, 80 + i as i32, "ClusterIP");
        if *name == "z" {
            s.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        }
        services
            .create(&PostParams::default(), &s)
            .await
            .expect("create");
    }
    services
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=t"),
        )
        .await
        .expect("delete collection");
    let left: Vec<String> = services
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(left, ["z"]);
}
