//! The Portal API server: the Kubernetes REST API over HTTPS for every
//! kind in [`portal_api::registry`], laid out by layer, each depending only
//! on those after it:
//! - `handlers`: routing and the REST handlers (reads and watches from the
//!   watch cache, discovery, OpenAPI, subresources, streams and proxies);
//! - `security`: authentication, authorization, certificates, nodes
//!   joining, the shared cluster identity;
//! - `duties`: the server's own background work;
//! - `registry`: the write path every writer takes (strategy, validation,
//!   `managedFields`, allocation, graceful deletion, GC, namespaces) and
//!   the watch cache;
//! - `server`: HTTP plumbing and metrics.
//!
//! This file wires them: the store, the cache, the listener and its drain.

mod admission;
pub mod audit;
mod duties;
mod handlers;
mod loopback;
mod registry;
mod security;
pub use security::encryption;
mod server;

use duties::{compaction, endpoint_leases, kubernetes_service};
use handlers::routes;
use loopback::Loopback;
use registry::write::namespace;
use registry::{allocator, cache};
use security::identity;
pub use security::tokens::DEFAULT_ISSUER;
pub use security::user::read_token_file;
pub use security::{issuing, join, pki};
use server::http::from_connection;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use allocator::repair::Mend;
use hyper_util::rt::{TokioExecutor, TokioIo};
use portal_api::{Resource, Status, Target};
use portal_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Store};
use tokio::net::TcpListener;

pub use portal_api::cidr::{IpFamily, Ipv4Cidr, PortRange, ServiceCidrs};
pub use server::metrics::Metrics;

/// Events kept per resource in the watch cache's ring.
const RING_CAPACITY: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] portal_store::Error),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot install signal handler: {0}")]
    Signal(String),
    #[error("cluster identity: {0}")]
    Identity(#[from] identity::Error),
    #[error("{0}")]
    Client(#[from] portal_client::Error),
    /// One of the server's own writes (its `kubernetes` Service) failed.
    #[error("{0}")]
    Write(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How to run the API server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Keeps the store, the credentials and the kubeconfig.
    pub data_dir: PathBuf,
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// Revisions of history the store keeps for watches to resume from.
    pub history_revisions: u64,
    /// Where cluster IPs come from (`--service-cluster-ip-range`).
    pub service_cidrs: ServiceCidrs,
    /// Where node ports come from (`--service-node-port-range`).
    pub node_ports: PortRange,
    /// The address pods reach this server at (the `kubernetes` Endpoints);
    /// none, or a loopback one, leaves the Service without endpoints.
    pub advertise_address: Option<std::net::IpAddr>,
    /// Other addresses clients reach this server at (a dual-stack node's
    /// other family): named in its serving certificate too.
    pub other_addresses: Vec<std::net::IpAddr>,
    /// Bounds on client connections.
    pub connections: ConnectionLimits,
    /// Where objects are kept.
    pub datastore: Datastore,
    /// The cluster token, which opens the cluster identity kept in a shared
    /// datastore (none: the first server makes one, `DIR/server-token`).
    pub token: Option<String>,
    /// Which resources are encrypted at rest, and how
    /// (`--encryption-provider-config`).
    pub encryption: Option<security::encryption::Encryption>,
    /// Who may sign in and how.
    pub authentication: Authentication,
    /// The audit log (`--audit-policy-file`, `--audit-log-path`).
    pub audit: Option<audit::AuditConfig>,
    /// Serve the web console at `/console/` (`--console`).
    pub console: bool,
}

/// How users sign in beyond the admin token and certificates.
#[derive(Clone, Debug)]
pub struct Authentication {
    /// `--token-auth-file`: static bearer tokens.
    pub static_tokens: std::collections::HashMap<String, security::user::TokenUser>,
    /// `--anonymous-auth`: requests without credentials are served as
    /// `system:anonymous` (allowed only what RBAC grants it).
    pub anonymous: bool,
    /// `--service-account-issuer`.
    pub issuer: String,
    /// `--api-audiences` (none: the issuer).
    pub audiences: Vec<String>,
}

impl Default for Authentication {
    fn default() -> Self {
        Authentication {
            static_tokens: Default::default(),
            anonymous: true,
            issuer: security::tokens::DEFAULT_ISSUER.to_owned(),
            audiences: Vec::new(),
        }
    }
}

/// Where the API server keeps objects.
#[derive(Clone, Debug, Default)]
pub enum Datastore {
    /// The embedded store in `DIR/store`: one API server.
    #[default]
    Embedded,
    /// An etcd cluster that several API servers share.
    Etcd(portal_store::EtcdOptions),
}

/// What one client connection may hold: slow or idle clients must not
/// exhaust the server.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections served at once; past it new ones are closed at once.
    /// Default: nine tenths of the open-file limit (the rest for the store,
    /// files and outgoing connections), so a flood is refused before the
    /// files run out.
    pub max: usize,
    /// Time to finish the TLS handshake.
    pub handshake: std::time::Duration,
    /// Time to send a request's headers (kube-apiserver allows about 32 s).
    pub headers: std::time::Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        let (files, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or((10_000, 10_000));
        ConnectionLimits {
            max: usize::try_from(files / 10 * 9)
                .unwrap_or(usize::MAX)
                .max(1_000),
            handshake: std::time::Duration::from_secs(10),
            headers: std::time::Duration::from_secs(32),
        }
    }
}

/// How often the allocation repair pass runs.
const REPAIR_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// Work done once per cluster: mending allocations and signing approved
/// certificate requests (load-balancer addresses are the controllers'
/// work, through the API).
#[derive(Clone)]
struct ClusterDuties {
    state: Arc<ApiState>,
}

impl ClusterDuties {
    async fn run(self) {
        tokio::join!(
            allocator::repair::run(
                self.state.store.clone(),
                self.state.allocators.clone(),
                REPAIR_PERIOD,
                Mend::Yes,
            ),
            duties::certificate_signer::run(self.state.clone()),
            duties::legacy_tokens::run(self.state.clone()),
            duties::definitions::run(self.state.clone()),
            duties::service_cidrs::run(self.state.clone()),
            handlers::aggregation::local::run(self.state.clone()),
        );
    }
}

/// What every handler shares.
pub(crate) struct ApiState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cache: Arc<cache::WatchCache>,
    pub(crate) allocators: Arc<allocator::Allocators>,
    pub(crate) metrics: Arc<Metrics>,
    /// Who requests are made as.
    pub(crate) authn: security::user::Authenticator,
    /// What users other than superusers and nodes may do.
    pub(crate) rbac: security::rbac::Rbac,
    /// The audit log, when asked for.
    pub(crate) auditor: Option<Arc<audit::Auditor>>,
    /// What writes are admitted by beyond their kind's strategy.
    pub(crate) admission: Arc<dyn registry::write::Admission>,
    pub(crate) address: SocketAddr,
    /// TLS to node agents (`connect`), with this server's client certificate.
    pub(crate) agents: Arc<rustls::ClientConfig>,
    /// Nodes joining with the node token.
    pub(crate) joining: Arc<join::Joining>,
    /// Turns `true` when the server starts draining: watches end cleanly.
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
    /// The kinds CustomResourceDefinitions define, as served.
    pub(crate) defined: registry::defined::Defined,
    /// Extension API servers behind APIServices.
    pub(crate) aggregator: handlers::aggregation::Aggregator,
    /// Whether the web console is served.
    pub(crate) console: bool,
    /// This state itself, for work that outlives a request's borrow (a
    /// watch converting objects by webhook).
    pub(crate) this: std::sync::Weak<ApiState>,
}

/// The resource and namespace a request addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope<'a> {
    pub(crate) resource: &'static Resource,
    pub(crate) namespace: Option<&'a str>,
}

impl Scope<'_> {
    pub(crate) fn cluster(resource: &'static Resource) -> Scope<'static> {
        Scope {
            resource,
            namespace: None,
        }
    }

    pub(crate) fn target(&self) -> Target<'static> {
        Target {
            group: self.resource.group,
            resource: self.resource.plural,
            kind: self.resource.kind_name,
        }
    }
}

/// A store failure as the client sees it: never a panic, never a hang.
pub(crate) fn store_error(error: portal_store::Error) -> Status {
    match error {
        portal_store::Error::Closed => Status::service_unavailable("the store is shutting down"),
        other => Status::internal(other.to_string()),
    }
}

/// A running API server.
pub struct ApiServer {
    /// The address it listens on.
    pub address: SocketAddr,
    /// The admin kubeconfig, written once the server answers.
    pub kubeconfig: PathBuf,
    /// The API server's `/metrics`; other components may add theirs.
    pub metrics: Arc<Metrics>,
    serving: tokio::task::JoinHandle<()>,
    /// `https://HOST:PORT`, as in the kubeconfig.
    server: String,
    joining: Arc<join::Joining>,
    /// Starts the drain.
    stop: tokio::sync::watch::Sender<bool>,
    /// The server's own loops (repair, compaction, load balancers, …).
    tasks: portal_client::Supervisor,
    /// The cluster duties' election, given up at a clean stop.
    duties_election: Option<(kube::Client, portal_client::leader::Election)>,
    /// For loopback clients: held weakly, they fail once the server stops.
    state: std::sync::Weak<ApiState>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("address", &self.address)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Opens the store, fills the watch cache, makes or loads credentials,
    /// starts listening and writes `DATA_DIR/kubeconfig`.
    pub async fn start(config: Config) -> Result<Self, Error> {
        let kubeconfig = config.data_dir.join("kubeconfig");
        let console = config.console;
        // A kubeconfig left by an earlier run must not signal readiness.
        let _ = std::fs::remove_file(&kubeconfig);
        let metrics = Arc::new(Metrics::new());
        let observed = metrics.clone();
        let shared = matches!(config.datastore, Datastore::Etcd(_));
        let store: Arc<dyn Store> = match &config.datastore {
            Datastore::Embedded => {
                let options = EmbeddedOptions {
                    history_revisions: config.history_revisions,
                    commit_observer: Some(Arc::new(move |n, took| {
                        observed.observe_commit(n, took)
                    })),
                    ..EmbeddedOptions::default()
                };
                Arc::new(EmbeddedStore::open(
                    &config.data_dir.join("store"),
                    options,
                )?)
            }
            Datastore::Etcd(options) => Arc::new(EtcdStore::connect(options).await?),
        };
        let store: Arc<dyn Store> = match config.encryption.clone() {
            Some(encryption) => {
                Arc::new(security::encryption::EncryptedStore::new(store, encryption))
            }
            None => store,
        };
        if shared {
            // Before any credential is made or loaded: a server joining a
            // cluster takes the cluster's.
            std::fs::create_dir_all(&config.data_dir).map_err(|source| pki::Error::Io {
                path: config.data_dir.clone(),
                source,
            })?;
            identity::share(store.as_ref(), &config.data_dir, config.token.as_deref()).await?;
        }
        namespace::bootstrap(store.as_ref()).await?;
        let allocators = Arc::new(allocator::Allocators::new(
            &config.service_cidrs,
            config.node_ports,
        ));
        // Learn what is allocated (and mend what is not) before serving. On
        // a shared store only the elected server mends (`cluster_duties`).
        let mend = if shared { Mend::No } else { Mend::Yes };
        allocator::repair::pass(store.as_ref(), &allocators, mend).await?;

        let cache = cache::WatchCache::new(RING_CAPACITY);
        // The cache follows the store on a thread of its own: under a flood
        // of requests it gets a core's fair share, not one task's among
        // hundreds, so reads that wait for it do not starve.
        let follower = cache.clone();
        let follower_store = store.clone();
        std::thread::Builder::new()
            .name("watch-cache".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(follower.run(follower_store)),
                    Err(error) => tracing::error!(%error, "watch cache runtime"),
                }
            })
            .map_err(Error::Thread)?;
        let current = store.current_revision().await?;
        if cache.wait_for(current).await.is_err() {
            tracing::warn!("watch cache slow to fill; serving anyway");
        }

        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|source| Error::Bind {
                addr: config.bind,
                source,
            })?;
        let address = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.bind,
            source,
        })?;
        let advertise = config.advertise_address.or(Some(address.ip()));
        // The kubernetes Service is of the primary family: an endpoint of
        // the other (the listening address, when none is advertised)
        // leaves it unreachable. (An advertised address was checked.)
        if let Some(ip) = advertise.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) {
            let primary = config.service_cidrs.primary().family();
            if IpFamily::of(ip) != primary {
                tracing::warn!(%ip, family = primary.name(), "the kubernetes Service's endpoint is not of the service range's primary family: pods cannot reach the API server through it (advertise an address of that family)");
            }
        }
        let tasks = portal_client::Supervisor::new();
        let service_ips = allocators
            .first_addresses()
            .into_iter()
            .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok());
        let extra: Vec<std::net::IpAddr> = config
            .advertise_address
            .into_iter()
            .chain(config.other_addresses.iter().copied())
            .chain(service_ips)
            .collect();
        let (names, ips) = pki::serving_names(address, &extra);
        let credentials = pki::load_or_create(&config.data_dir, &names, &ips)?;
        let agents = pki::agent_client(&config.data_dir)?;
        let front_proxy = pki::front_proxy(&config.data_dir)?;
        let joining = Arc::new(join::Joining {
            secret: join::load_or_create_token(&config.data_dir, &credentials.ca_pem)?,
            ca_pem: credentials.ca_pem.clone(),
            kubelet_client_ca_pem: agents.ca_pem.clone(),
            issuer: credentials.issuer.clone(),
            authority: credentials.authority.clone(),
            pins: config.data_dir.join("pki").join("nodes"),
            pinning: tokio::sync::Mutex::new(()),
        });
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let jwks_host = match advertise {
            Some(ip) if ip.is_ipv6() => format!("[{ip}]"),
            Some(ip) => ip.to_string(),
            None => address.ip().to_string(),
        };
        let signer = security::tokens::Signer::load_or_create(
            &config.data_dir,
            &config.authentication.issuer,
            &config.authentication.audiences,
            format!("https://{jwks_host}:{}/openid/v1/jwks", address.port()),
        )?;
        let authn = security::user::Authenticator {
            admin_token: credentials.token.clone(),
            static_tokens: config
                .authentication
                .static_tokens
                .iter()
                .map(|(token, user)| (token.clone(), user.clone().into()))
                .collect(),
            signer,
            anonymous: config.authentication.anonymous,
        };
        let auditor = match &config.audit {
            Some(audit) => Some(Arc::new(audit::Auditor::open(audit).map_err(|source| {
                pki::Error::Io {
                    path: audit.path.clone(),
                    source,
                }
            })?)),
            None => None,
        };
        let state = Arc::new_cyclic(|this| ApiState {
            this: this.clone(),
            rbac: security::rbac::Rbac::new(cache.clone()),
            auditor,
            admission: Arc::new(admission::Admitter::default()),
            store,
            cache,
            allocators,
            metrics: metrics.clone(),
            authn,
            address,
            agents: agents.tls,
            joining: joining.clone(),
            stopping: stopping.clone(),
            defined: Default::default(),
            aggregator: handlers::aggregation::Aggregator::new(front_proxy),
            console,
        });
        // Kinds users define are served from their definitions on.
        registry::defined::sync(&state);
        tokio::spawn(registry::defined::follow(Arc::downgrade(&state)));
        // The roles and bindings every cluster has, before anyone asks.
        security::rbac::bootstrap::reconcile(&state)
            .await
            .map_err(|status| {
                Error::Write(format!("the RBAC bootstrap policy: {}", status.message))
            })?;
        // The server's own objects, through the registry like any write.
        kubernetes_service::ensure(&state, address.port())
            .await
            .map_err(|status| {
                Error::Write(format!("the kubernetes Service: {}", status.message))
            })?;
        // Pods reach this server at its advertised address (not a loopback
        // one): it joins the `kubernetes` Endpoints while it runs.
        if let Some(ip) = advertise.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) {
            if shared {
                let state = state.clone();
                tasks.restarting("kubernetes endpoints", move || {
                    endpoint_leases::run(
                        state.clone(),
                        ip,
                        address.port(),
                        endpoint_leases::RENEW,
                        endpoint_leases::TTL,
                    )
                });
            } else {
                endpoint_leases::publish_alone(&state, ip, address.port())
                    .await
                    .map_err(|status| {
                        Error::Write(format!("the kubernetes Endpoints: {}", status.message))
                    })?;
            }
        }
        if let Err(error) = kubernetes_service::ensure_dns(&state).await {
            // Not fatal: the address may be taken by a user's Service.
            tracing::warn!(error = %error.message, "cannot create the kube-dns Service");
        }
        if let Err(error) = duties::service_cidrs::ensure_default(&state).await {
            tracing::warn!(error = %error.message, "cannot create the default ServiceCIDR");
        }
        // Every server allocates from every ServiceCIDR: each follows them.
        let ranges = state.clone();
        tasks.restarting("service cidrs", move || {
            allocator::ranges::follow(ranges.clone())
        });
        // Every server proxies to extension API servers: each checks them.
        let checked = state.clone();
        tasks.restarting("api aggregation", move || {
            handlers::aggregation::availability::run(checked.clone())
        });
        let duties = ClusterDuties {
            state: state.clone(),
        };
        if shared {
            // etcd's history is compacted by the cluster's servers together
            // (the embedded store compacts itself).
            let compacted = state.store.clone();
            tasks.restarting("compaction", move || {
                compaction::run(compacted.clone(), compaction::PERIOD)
            });
            let (repaired, allocated) = (state.store.clone(), state.allocators.clone());
            tasks.restarting("allocation repair", move || {
                allocator::repair::run(repaired.clone(), allocated.clone(), REPAIR_PERIOD, Mend::No)
            });
        } else {
            let duties = duties.clone();
            tasks.restarting("cluster duties", move || duties.clone().run());
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(credentials.tls.clone());
        let weak_state = Arc::downgrade(&state);
        let serving = tokio::spawn(serve(
            listener,
            acceptor,
            state,
            config.connections,
            stopping,
        ));

        let host = if address.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else {
            address.ip().to_string()
        };
        let host = if address.is_ipv6() && !address.ip().is_unspecified() {
            format!("[{host}]")
        } else {
            host
        };
        let server = format!("https://{host}:{}", address.port());
        pki::write_private(
            &kubeconfig,
            pki::kubeconfig(&server, &credentials.ca_pem, &credentials.token).as_bytes(),
        )?;
        tracing::info!(%address, kubeconfig = %kubeconfig.display(), "API server ready");
        if console {
            tracing::info!(url = %format!("{server}/console/"), "web console");
        }
        let mut duties_election = None;
        if shared {
            // Work one server of the cluster does, the elected one.
            let client = Loopback::client(
                weak_state.clone(),
                "portal-apiserver",
                security::user::User::loopback(),
            );
            let election = portal_client::leader::Election::new("kube-system", "portal-apiserver");
            duties_election = Some((client.clone(), election.clone()));
            tasks.restarting("cluster duties election", move || {
                let duties = duties.clone();
                portal_client::leader::lead(client.clone(), election.clone(), move || {
                    duties.clone().run()
                })
            });
        }
        Ok(ApiServer {
            address,
            kubeconfig,
            metrics,
            serving,
            server,
            joining,
            stop,
            tasks,
            duties_election,
            state: weak_state,
        })
    }

    /// The cluster CA, as PEM: what clients verify this server with.
    pub fn ca_pem(&self) -> &str {
        &self.joining.ca_pem
    }

    /// A client of this server for components in its own process: requests
    /// are answered in memory, as the admin, and record `user_agent` (up to
    /// its first `/`) as the field manager of their writes.
    pub fn loopback_client(&self, user_agent: &str) -> kube::Client {
        Loopback::client(
            self.state.clone(),
            user_agent,
            security::user::User::loopback(),
        )
    }

    /// As [`ApiServer::loopback_client`], but as the user `user` (in no
    /// group but `system:authenticated`): a component with a
    /// least-privilege identity that RBAC grants what it needs.
    pub fn loopback_client_as(&self, user_agent: &str, user: &str) -> kube::Client {
        Loopback::client(
            self.state.clone(),
            user_agent,
            security::user::User::new(user, &[]),
        )
    }

    /// Writes `path`, a kubeconfig with a fresh node certificate for
    /// `node` (this machine's own agent and proxy act as a node, like
    /// every other node's).
    pub fn write_node_kubeconfig(&self, node: &str, path: &std::path::Path) -> Result<(), Error> {
        let config = join::own_node_kubeconfig(&self.joining, &self.server, node)?;
        Ok(pki::write_private(path, config.as_bytes())?)
    }

    /// Serves until the server stops (it does not on its own: only a
    /// panic of its accept loop ends this).
    pub async fn wait(&mut self) {
        if let Err(error) = (&mut self.serving).await {
            tracing::error!(%error, "API server stopped");
        }
    }

    /// Drains and stops, within about `deadline`: no new connections;
    /// requests in flight are answered and their connections closed; watches
    /// end with a clean end of stream (clients resume elsewhere); the
    /// server's loops stop and an elected server gives up its Lease.
    pub async fn shutdown(mut self, deadline: std::time::Duration) {
        let started = std::time::Instant::now();
        let _ = self.stop.send(true);
        if tokio::time::timeout(deadline, &mut self.serving)
            .await
            .is_err()
        {
            tracing::warn!("requests still running at the drain deadline; closing them");
            self.serving.abort();
        }
        self.tasks
            .shutdown(deadline.saturating_sub(started.elapsed()))
            .await;
        if let Some((client, election)) = self.duties_election {
            let release = portal_client::leader::release(client, &election);
            match tokio::time::timeout(std::time::Duration::from_secs(2), release).await {
                Ok(Ok(())) => {}
                _ => tracing::warn!(
                    "could not give up the cluster duties' Lease; others wait for it to run out"
                ),
            }
        }
        tracing::info!(took = ?started.elapsed(), "API server stopped");
    }
}

/// Returns once the server drains (or its `ApiServer` is gone).
pub(crate) async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Accepts and serves connections until `stopping` turns true, then stops
/// accepting and returns once every connection has finished (each closes
/// after the request it is serving).
async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<ApiState>,
    limits: ConnectionLimits,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max));
    let mut last_refusal_logged: Option<std::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stopping) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Full: this one is closed at once, and said so (once a minute).
            state.metrics.refused_connection();
            if last_refusal_logged.is_none_or(|t| t.elapsed().as_secs() >= 60) {
                tracing::warn!(max = limits.max, %peer, "too many connections: refusing new ones");
                last_refusal_logged = Some(std::time::Instant::now());
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let state = state.clone();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // A verified client certificate names the connection's user.
            let user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| security::user::user_of_certificate(cert, &state.joining))
                .map(Arc::new);
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                let user = user.clone();
                async move {
                    let mut request = from_connection(request);
                    // The client's address, for the audit log.
                    request.extensions_mut().insert(peer);
                    Ok::<_, std::convert::Infallible>(
                        routes::handle(state, request, user.as_deref()).await,
                    )
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.headers);
            // Upgrades (exec, attach, port-forward) are spliced to the agent.
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = stopped(&mut stopping) => {
                    // Finish the request in flight, then close.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Every connection gives its permit back when it has finished.
    let max = u32::try_from(limits.max).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(max).await;
}
