//! The API server's command line, shared by `portal server` (everything on
//! one machine) and `portal apiserver` (the API server alone, one of
//! several on an etcd cluster), and the leader election flags of the
//! controllers.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use portal_apiserver::{Datastore, PortRange, ServiceCidrs};

use crate::Error;

/// The API server's own flags.
#[derive(clap::Args, Debug)]
pub(crate) struct ApiArgs {
    /// Keeps the store, credentials and the admin kubeconfig.
    #[arg(long)]
    pub(crate) data_dir: PathBuf,
    /// Where the API listens; port 0 picks a free port (see DIR/kubeconfig).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub(crate) api_bind: SocketAddr,
    /// Revisions of history kept so watches can resume after a disconnect
    /// (embedded store; etcd's history is compacted every 5 minutes).
    #[arg(long, default_value_t = 100_000)]
    history_revisions: u64,
    /// API connections served at once; more are closed at once. Default:
    /// nine tenths of the open-file limit (the rest for the store, files
    /// and outgoing connections).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a client may take to finish the TLS handshake.
    #[arg(long, default_value_t = 10)]
    tls_handshake_timeout: u64,
    /// Cluster IPs of Services come from this range; an IPv4 and an IPv6
    /// CIDR, comma-separated, for dual-stack Services (the first is the
    /// primary family). At most 2^20 addresses each (/12, /108).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: ServiceCidrs,
    /// Node ports of NodePort and LoadBalancer Services come from this range.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: PortRange,
    #[command(flatten)]
    datastore: DatastoreArgs,
    /// Encrypts the objects of the resources it names before they are
    /// stored: a Kubernetes `EncryptionConfiguration` file (providers
    /// `aescbc`, `secretbox`, `identity`).
    #[arg(long)]
    encryption_provider_config: Option<PathBuf>,
    /// Static bearer tokens: a CSV file of `token,user,uid[,"group1,group2"]`
    /// lines, as Kubernetes' `--token-auth-file`.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Serve requests without credentials as `system:anonymous` (allowed
    /// only what RBAC grants: `/healthz`, `/version`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    anonymous_auth: bool,
    /// Serve the web console at https://ADDRESS/console/ (its files are
    /// public; what it shows, the signed-in user's token decides).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    console: bool,
    /// The `iss` of service-account tokens.
    #[arg(long, default_value = portal_apiserver::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// Who tokens are for unless a request names others (default: the issuer).
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// Records requests as its audit `Policy` (`audit.k8s.io/v1`) says.
    #[arg(long, requires = "audit_log_path")]
    audit_policy_file: Option<PathBuf>,
    /// Where the audit log goes (`-`: standard output).
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// Megabytes before the audit log is rotated (0: never).
    #[arg(long, default_value_t = 0)]
    audit_log_maxsize: u64,
    /// Rotated audit logs kept (0: all).
    #[arg(long, default_value_t = 0)]
    audit_log_maxbackup: usize,
    /// Days a rotated audit log is kept (0: no limit).
    #[arg(long, default_value_t = 0)]
    audit_log_maxage: u64,
}

/// Where objects are kept.
#[derive(clap::Args, Debug)]
struct DatastoreArgs {
    /// An etcd cluster to keep objects in, shared by every API server of the
    /// cluster: `etcd://HOST:PORT[,HOST:PORT…]` (or `http://`, `https://`).
    /// Default: the embedded store in DIR/store.
    #[arg(long)]
    datastore_endpoint: Option<String>,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// The cluster token: opens the cluster's identity (CA, admin
    /// credential) kept in etcd. The first server makes one
    /// (DIR/server-token); the others are started with it.
    #[arg(
        long,
        env = "PORTAL_CLUSTER_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file holding the cluster token.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// How to reach an etcd that serves https (and may ask for a client
/// certificate).
#[derive(clap::Args, Debug)]
pub(crate) struct EtcdTlsArgs {
    /// The CA that signed etcd's serving certificates (https:// endpoints).
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// A client certificate for etcd (`--client-cert-auth` on etcd).
    #[arg(long, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Usage(format!("{what} {}: {e}", path.display())))
}

impl EtcdTlsArgs {
    fn given(&self) -> bool {
        self.etcd_cafile.is_some() || self.etcd_certfile.is_some()
    }

    /// How to reach etcd at `endpoint` (a `--datastore-endpoint` value).
    pub(crate) fn options(&self, endpoint: &str) -> Result<portal_store::EtcdOptions, Error> {
        let mut options = portal_store::EtcdOptions::from_endpoint(endpoint)
            .map_err(|e| Error::Usage(format!("{endpoint:?}: {e}")))?;
        if let Some(ca) = &self.etcd_cafile {
            let identity = match (&self.etcd_certfile, &self.etcd_keyfile) {
                (Some(cert), Some(key)) => {
                    Some((read(cert, "--etcd-certfile")?, read(key, "--etcd-keyfile")?))
                }
                _ => None,
            };
            options.tls = Some(portal_store::EtcdTls {
                ca_pem: read(ca, "--etcd-cafile")?,
                identity,
            });
        } else if options.is_secure() {
            return Err(Error::Usage(
                "https:// etcd endpoints need --etcd-cafile".into(),
            ));
        }
        Ok(options)
    }
}

impl DatastoreArgs {
    fn datastore(&self) -> Result<Datastore, Error> {
        let Some(endpoint) = &self.datastore_endpoint else {
            if self.etcd_tls.given() {
                return Err(Error::Usage(
                    "--etcd-cafile/--etcd-certfile need --datastore-endpoint".into(),
                ));
            }
            return Ok(Datastore::Embedded);
        };
        Ok(Datastore::Etcd(self.etcd_tls.options(endpoint)?))
    }

    fn token(&self) -> Result<Option<String>, Error> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(Some(token.trim().to_owned())),
            (None, Some(path)) => {
                let text = String::from_utf8(read(path, "--token-file")?)
                    .map_err(|_| Error::Usage("--token-file is not text".into()))?;
                Ok(Some(text.trim().to_owned()))
            }
            (None, None) => Ok(None),
        }
    }
}

impl ApiArgs {
    /// Whether objects live in a store other API servers share.
    pub(crate) fn shared(&self) -> bool {
        self.datastore.datastore_endpoint.is_some()
    }

    /// The family of the service range's first (primary) CIDR.
    pub(crate) fn primary_family(&self) -> portal_apiserver::IpFamily {
        self.service_cluster_ip_range.primary().family()
    }

    pub(crate) fn config(
        &self,
        advertise_address: Option<IpAddr>,
    ) -> Result<portal_apiserver::Config, Error> {
        let defaults = portal_apiserver::ConnectionLimits::default();
        // As kube-apiserver: the kubernetes Service's endpoints are this
        // address, so it must be of the Service's (the primary) family.
        let primary = self.primary_family();
        if let Some(ip) = advertise_address {
            if portal_apiserver::IpFamily::of(ip) != primary {
                return Err(Error::Usage(format!(
                    "--service-cluster-ip-range {}: the primary range's family must be the advertised address's ({ip}); for an IPv6-first cluster give the node an IPv6 address (--node-ip IPv4,IPv6)",
                    self.service_cluster_ip_range
                )));
            }
        }
        Ok(portal_apiserver::Config {
            data_dir: self.data_dir.clone(),
            bind: self.api_bind,
            history_revisions: self.history_revisions,
            service_cidrs: self.service_cluster_ip_range.clone(),
            node_ports: self.service_node_port_range,
            advertise_address,
            other_addresses: Vec::new(),
            connections: portal_apiserver::ConnectionLimits {
                max: self.max_connections.unwrap_or(defaults.max).max(1),
                handshake: Duration::from_secs(self.tls_handshake_timeout.max(1)),
                ..defaults
            },
            datastore: self.datastore.datastore()?,
            token: self.datastore.token()?,
            encryption: match &self.encryption_provider_config {
                Some(path) => Some(
                    portal_apiserver::encryption::Encryption::load(path).map_err(Error::Usage)?,
                ),
                None => None,
            },
            authentication: portal_apiserver::Authentication {
                static_tokens: match &self.token_auth_file {
                    Some(path) => portal_apiserver::read_token_file(path).map_err(Error::Usage)?,
                    None => Default::default(),
                },
                anonymous: self.anonymous_auth,
                issuer: self.service_account_issuer.clone(),
                audiences: self.api_audiences.clone(),
            },
            audit: match (&self.audit_policy_file, &self.audit_log_path) {
                (Some(policy), Some(path)) => Some(portal_apiserver::audit::AuditConfig {
                    policy: portal_apiserver::audit::policy::Policy::load(policy)
                        .map_err(Error::Usage)?,
                    path: path.clone(),
                    rotation: portal_apiserver::audit::Rotation {
                        max_megabytes: self.audit_log_maxsize,
                        max_backups: self.audit_log_maxbackup,
                        max_age_days: self.audit_log_maxage,
                    },
                }),
                _ => None,
            },
            console: self.console,
        })
    }
}

/// `portal apiserver`: the API server alone.
#[derive(clap::Args, Debug)]
pub(crate) struct ApiserverArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The address clients and pods reach this server at: published in the
    /// `kubernetes` Service's endpoints with the other servers'.
    #[arg(long)]
    advertise_address: Option<IpAddr>,
}

pub(crate) async fn apiserver(args: ApiserverArgs) -> Result<(), Error> {
    let mut api =
        portal_apiserver::ApiServer::start(args.api.config(args.advertise_address)?).await?;
    let outcome = tokio::select! {
        () = api.wait() => Ok(()),
        result = crate::wait_for_signal("the cluster goes on with the other servers") => result,
    };
    api.shutdown(crate::DRAIN).await;
    outcome
}

/// Leader election of the controllers (kube-controller-manager's flags).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LeaderElectArgs {
    /// Run the controllers only while holding the `kube-system/portal-controllers`
    /// Lease, so that several `portal controllers` can run for failover.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long others wait for a silent leader.
    #[arg(long, default_value = "15s", value_parser = crate::parse_period)]
    leader_elect_lease_duration: Duration,
    /// A leader that cannot renew for this long stops.
    #[arg(long, default_value = "10s", value_parser = crate::parse_period)]
    leader_elect_renew_deadline: Duration,
    /// How often to renew, or to try to become leader.
    #[arg(long, default_value = "2s", value_parser = crate::parse_period)]
    leader_elect_retry_period: Duration,
}

impl LeaderElectArgs {
    /// The election, if asked for.
    pub(crate) fn election(&self) -> Result<Option<portal_client::leader::Election>, Error> {
        if !self.leader_elect {
            return Ok(None);
        }
        if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration
            || self.leader_elect_retry_period >= self.leader_elect_renew_deadline
        {
            return Err(Error::Usage(
                "leader election needs retry period < renew deadline < lease duration".into(),
            ));
        }
        let mut election =
            portal_client::leader::Election::new("kube-system", "portal-controllers");
        election.lease_duration = self.leader_elect_lease_duration;
        election.renew_deadline = self.leader_elect_renew_deadline;
        election.retry_period = self.leader_elect_retry_period;
        Ok(Some(election))
    }
}
