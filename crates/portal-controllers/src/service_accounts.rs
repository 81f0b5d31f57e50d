//! What every namespace holds for its pods' identity, as
//! kube-controller-manager's service-account and root-CA publisher
//! controllers keep it: the `default` ServiceAccount, and the
//! `kube-root-ca.crt` ConfigMap with the cluster's CA (the `ca.crt` of
//! every token volume). Either is made again when deleted, and the CA is
//! put back when changed. Namespaces being deleted are left alone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::ReconcileError as Error;

/// The field manager of its writes.
pub const MANAGER: &str = "portal-service-account-controller";
/// The account every namespace has.
const DEFAULT_ACCOUNT: &str = "default";
/// The ConfigMap with the cluster's CA.
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// What the ConfigMap says of itself, as upstream's.
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

struct Context {
    client: Client,
    ca_pem: String,
    retries: crate::Retries,
}

/// Runs until the process ends; `ca_pem` is the cluster CA clients verify
/// the API server with.
pub async fn run(client: Client, ca_pem: String) {
    let named = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let to_namespace =
        |namespace: Option<String>| namespace.map(|ns| ObjectRef::<Namespace>::new(&ns));
    let controller = Controller::new(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<ServiceAccount>::all(client.clone()),
        named(DEFAULT_ACCOUNT),
        move |account| to_namespace(account.namespace()),
    )
    .watches(
        Api::<ConfigMap>::all(client.clone()),
        named(ROOT_CA),
        move |map| to_namespace(map.namespace()),
    )
    .with_config(crate::config());
    let context = Arc::new(Context {
        client,
        ca_pem,
        retries: crate::Retries::new(Duration::from_millis(500)),
    });
    let results = controller.run(reconcile, error_policy, context.clone());
    crate::drive(results, "service accounts", &context.retries).await;
}

fn error_policy(namespace: Arc<Namespace>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, namespace = %namespace.name_any(), "service account or root CA not made; retrying");
    Action::requeue(ctx.retries.after_failure(namespace.as_ref()))
}

async fn reconcile(namespace: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    if namespace.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = namespace.name_any();
    let accounts = Api::<ServiceAccount>::namespaced(ctx.client.clone(), &name);
    if accounts.get_opt(DEFAULT_ACCOUNT).await?.is_none() {
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(DEFAULT_ACCOUNT.into()),
                ..Default::default()
            },
            ..ServiceAccount::default()
        };
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        match accounts.create(&params, &account).await {
            Ok(_) => {}
            // Made meanwhile (by admission, for a pod that came first).
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            // The namespace began terminating meanwhile.
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    let maps = Api::<ConfigMap>::namespaced(ctx.client.clone(), &name);
    let current = maps.get_opt(ROOT_CA).await?;
    let has_ca = current
        .as_ref()
        .and_then(|m| m.data.as_ref())
        .and_then(|d| d.get("ca.crt"))
        .is_some_and(|ca| *ca == ctx.ca_pem);
    if !has_ca {
        // Create or update, the verbs the root CA publisher's role grants.
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        let written = match current {
            Some(mut map) => {
                map.data
                    .get_or_insert_with(Default::default)
                    .insert("ca.crt".into(), ctx.ca_pem.clone());
                maps.replace(ROOT_CA, &params, &map).await.map(drop)
            }
            None => {
                let mut map = ConfigMap::default();
                map.metadata.name = Some(ROOT_CA.into());
                map.metadata.annotations = Some(
                    [(
                        "kubernetes.io/description".to_owned(),
                        DESCRIPTION.to_owned(),
                    )]
                    .into(),
                );
                map.data = Some([("ca.crt".to_owned(), ctx.ca_pem.clone())].into());
                maps.create(&params, &map).await.map(drop)
            }
        };
        match written {
            Ok(()) => {}
            // Changed or made meanwhile: the change brings us back.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}
