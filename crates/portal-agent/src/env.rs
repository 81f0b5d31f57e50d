//! What a container runs with: its environment (the image's, then the
//! Service variables of the pod's namespace, then `envFrom`, then `env` with
//! `fieldRef`s, ConfigMap and Secret keys and `$(VAR)` references) and its argv (`command`/`args` over the image's
//! Entrypoint/Cmd), as the kubelet computes them. Pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;

use crate::objects::Objects;

/// The `PATH` containerd and Docker give a container whose image sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Facts about the pod that `fieldRef`s read and the kubelet knows.
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    pub pod_ip: String,
    /// All of the pod's addresses (`status.podIPs`: comma-separated).
    pub pod_ips: Vec<String>,
    pub host_ip: String,
}

/// Why a container's configuration cannot be made
/// (`CreateContainerConfigError`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// An environment in order, later values replacing earlier ones of the same name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    order: Vec<String>,
    values: BTreeMap<String, String>,
}

impl Environment {
    pub fn set(&mut self, name: &str, value: String) {
        if self.values.insert(name.to_owned(), value).is_none() {
            self.order.push(name.to_owned());
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// `NAME=value` strings, as execve takes them.
    pub fn to_strings(&self) -> Vec<String> {
        self.order
            .iter()
            .map(|name| format!("{name}={}", self.values[name]))
            .collect()
    }
}

/// The container's environment: the image's `Env`, the Service variables
/// (`services`: the pod's namespace's when `enableServiceLinks` is not
/// false, and always the `kubernetes` Service), then the container's `env`.
pub fn environment(
    pod: &Pod,
    container: &Container,
    image_env: &[String],
    services: &[Value],
    facts: &PodFacts,
    objects: &Objects,
) -> Result<Environment, ConfigError> {
    let mut env = Environment::default();
    for entry in image_env {
        if let Some((name, value)) = entry.split_once('=') {
            env.set(name, value.to_owned());
        }
    }
    if env.get("PATH").is_none() {
        env.set("PATH", DEFAULT_PATH.to_owned());
    }
    // Variables from Services are not visible to `$(VAR)` in the image's
    // values, but are to the container's `env`, as in the kubelet.
    let mut visible = Environment::default();
    for (name, value) in portal_api::service::environment(services) {
        env.set(&name, value.clone());
        visible.set(&name, value);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let entries = if let Some(r) = &from.config_map_ref {
            match objects.config_map(&r.name) {
                Some(entries) => entries,
                None if r.optional == Some(true) => continue,
                None => return Err(ConfigError(format!("configmap {:?} not found", r.name))),
            }
        } else if let Some(r) = &from.secret_ref {
            match objects.secret(&r.name) {
                Some(entries) => entries,
                None if r.optional == Some(true) => continue,
                None => return Err(ConfigError(format!("secret {:?} not found", r.name))),
            }
        } else {
            continue;
        };
        for (key, value) in entries {
            // A name the kernel's environment cannot hold is left out, as
            // the kubelet does.
            let name = format!("{prefix}{key}");
            if name.is_empty() || name.contains('=') {
                continue;
            }
            let value = String::from_utf8_lossy(&value).into_owned();
            env.set(&name, value.clone());
            visible.set(&name, value);
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (_, Some(source)) => {
                if let Some(field) = &source.field_ref {
                    field_value(pod, &field.field_path, facts)?
                } else if let Some(field) = &source.resource_field_ref {
                    resource_value(container, &field.resource)?
                } else if let Some(r) = &source.config_map_key_ref {
                    let found = objects.config_map(&r.name);
                    match keyed(found, &r.key, r.optional) {
                        Keyed::Value(value) => value,
                        Keyed::Skip => continue,
                        Keyed::NoObject => {
                            return Err(ConfigError(format!("configmap {:?} not found", r.name)))
                        }
                        Keyed::NoKey => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in ConfigMap {namespace}/{}",
                                r.key, r.name
                            )))
                        }
                    }
                } else if let Some(r) = &source.secret_key_ref {
                    match keyed(objects.secret(&r.name), &r.key, r.optional) {
                        Keyed::Value(value) => value,
                        Keyed::Skip => continue,
                        Keyed::NoObject => {
                            return Err(ConfigError(format!("secret {:?} not found", r.name)))
                        }
                        Keyed::NoKey => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in Secret {namespace}/{}",
                                r.key, r.name
                            )))
                        }
                    }
                } else {
                    String::new()
                }
            }
            (Some(value), None) => expand(value, &visible),
            (None, None) => String::new(),
        };
        env.set(&var.name, value.clone());
        visible.set(&var.name, value);
    }
    Ok(env)
}

/// A key of a ConfigMap or Secret, as a variable sees it.
enum Keyed {
    Value(String),
    /// Optional and missing: no variable.
    Skip,
    NoObject,
    NoKey,
}

fn keyed(
    entries: Option<std::collections::BTreeMap<String, Vec<u8>>>,
    key: &str,
    optional: Option<bool>,
) -> Keyed {
    let optional = optional == Some(true);
    match entries.map(|e| e.get(key).cloned()) {
        Some(Some(value)) => Keyed::Value(String::from_utf8_lossy(&value).into_owned()),
        _ if optional => Keyed::Skip,
        None => Keyed::NoObject,
        Some(None) => Keyed::NoKey,
    }
}

/// The value of a `fieldRef` (the paths the downward API allows).
fn field_value(pod: &Pod, path: &str, facts: &PodFacts) -> Result<String, ConfigError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => facts.pod_ip.clone(),
        "status.podIPs" if facts.pod_ips.is_empty() => facts.pod_ip.clone(),
        "status.podIPs" => facts.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        _ => keyed("metadata.labels", meta.labels.as_ref())
            .or_else(|| keyed("metadata.annotations", meta.annotations.as_ref()))
            .ok_or_else(|| ConfigError(format!("unsupported fieldRef path {path:?}")))?,
    };
    Ok(value)
}

/// A `resourceFieldRef` of the container itself (limits, requests).
fn resource_value(container: &Container, resource: &str) -> Result<String, ConfigError> {
    let resources = container.resources.as_ref();
    let (map, name) = match resource.split_once('.') {
        Some(("limits", name)) => (resources.and_then(|r| r.limits.as_ref()), name),
        Some(("requests", name)) => (resources.and_then(|r| r.requests.as_ref()), name),
        _ => {
            return Err(ConfigError(format!(
                "unsupported resourceFieldRef {resource:?}"
            )))
        }
    };
    Ok(map
        .and_then(|m| m.get(name))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "0".into()))
}

/// Expands `$(NAME)` from `env`; `$$` is a literal `$`; an unknown
/// reference stays as written (Kubernetes' `expansion` package).
pub fn expand(input: &str, env: &Environment) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The argv: `command` replaces the image's Entrypoint (and drops its Cmd),
/// `args` replace its Cmd; both expanded with the container's environment.
pub fn argv(
    container: &Container,
    entrypoint: &[String],
    cmd: &[String],
    env: &Environment,
) -> Result<Vec<String>, ConfigError> {
    let expand_all = |list: &[String]| list.iter().map(|a| expand(a, env)).collect::<Vec<_>>();
    let argv: Vec<String> = match (&container.command, &container.args) {
        (Some(command), args) if !command.is_empty() => {
            let mut argv = expand_all(command);
            argv.extend(expand_all(args.as_deref().unwrap_or_default()));
            argv
        }
        (_, Some(args)) if !args.is_empty() => {
            let mut argv = entrypoint.to_vec();
            argv.extend(expand_all(args));
            argv
        }
        _ => entrypoint.iter().chain(cmd).cloned().collect(),
    };
    if argv.is_empty() {
        return Err(ConfigError(
            "no command specified: the image has no Entrypoint or Cmd and the container no command"
                .into(),
        ));
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]}
        }))
        .unwrap()
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: Some("v1".into()),
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    #[test]
    fn image_then_services_then_container_env() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![
                var("PATH", "/bin"),
                field("POD", "metadata.name"),
                field("NS", "metadata.namespace"),
                field("NODE", "spec.nodeName"),
                field("IP", "status.podIP"),
                field("APP", "metadata.labels['app']"),
                var(
                    "URL",
                    "http://$(REDIS_SERVICE_HOST):$(REDIS_SERVICE_PORT)/$(POD)$(NOPE)$$x",
                ),
            ]),
            ..Container::default()
        };
        let services = [
            json!({"metadata": {"name": "redis"}, "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 6379, "protocol": "TCP"}]}}),
        ];
        let facts = PodFacts {
            pod_ip: "10.244.0.5".into(),
            pod_ips: vec!["10.244.0.5".into(), "fd00:10:244::5".into()],
            host_ip: "192.168.1.2".into(),
        };
        let image_env = ["PATH=/usr/bin".to_owned(), "HOME=/root".to_owned()];
        let env = environment(
            &pod(),
            &container,
            &image_env,
            &services,
            &facts,
            &Objects::default(),
        )
        .unwrap();
        let strings = env.to_strings();
        assert_eq!(
            strings[0], "PATH=/bin",
            "the container's value replaces the image's in place"
        );
        assert_eq!(env.get("HOME"), Some("/root"));
        assert_eq!(env.get("POD"), Some("web-1"));
        assert_eq!(env.get("NS"), Some("shop"));
        assert_eq!(env.get("NODE"), Some("node-a"));
        assert_eq!(env.get("IP"), Some("10.244.0.5"));
        assert_eq!(env.get("APP"), Some("web"));
        assert_eq!(env.get("REDIS_SERVICE_HOST"), Some("10.96.0.11"));
        assert_eq!(env.get("REDIS_PORT_6379_TCP_ADDR"), Some("10.96.0.11"));
        assert_eq!(
            env.get("URL"),
            Some("http://10.96.0.11:6379/web-1$(NOPE)$x")
        );
    }

    #[test]
    fn an_image_without_path_gets_the_default() {
        let env = environment(
            &pod(),
            &Container::default(),
            &[],
            &[],
            &PodFacts::default(),
            &Objects::default(),
        )
        .unwrap();
        assert_eq!(env.get("PATH"), Some(DEFAULT_PATH));
    }

    fn objects() -> Objects {
        let mut objects = Objects::default();
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "cfg"}, "data": {"MODE": "fast", "LEVEL": "3"}
        }))
        .unwrap();
        objects.config_maps.insert("cfg".into(), Some(cm));
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "creds"}, "data": {"password": "czNjcmV0"}
        }))
        .unwrap();
        objects.secrets.insert("creds".into(), Some(secret));
        objects.secrets.insert("gone".into(), None);
        objects
    }

    fn env_of(container: serde_json::Value) -> Result<Environment, ConfigError> {
        let container: Container = serde_json::from_value(container).unwrap();
        environment(
            &pod(),
            &container,
            &[],
            &[],
            &PodFacts::default(),
            &objects(),
        )
    }

    #[test]
    fn config_maps_and_secrets_feed_the_environment() {
        let env = env_of(json!({"name": "c",
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "APP_"}, {"secretRef": {"name": "creds"}},
                        {"secretRef": {"name": "gone", "optional": true}}],
            "env": [{"name": "APP_MODE", "value": "slow"},
                    {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LEVEL"}}},
                    {"name": "URL", "value": "db?pw=$(PW)&l=$(APP_LEVEL)"},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}}]}))
        .unwrap();
        assert_eq!(env.get("APP_MODE"), Some("slow"), "env wins over envFrom");
        assert_eq!(env.get("APP_LEVEL"), Some("3"));
        assert_eq!(env.get("password"), Some("s3cret"));
        assert_eq!(env.get("PW"), Some("s3cret"));
        assert_eq!(env.get("LVL"), Some("3"));
        assert_eq!(env.get("URL"), Some("db?pw=s3cret&l=3"));
        assert_eq!(env.get("OPT"), None);
    }

    #[test]
    fn missing_objects_and_keys_are_config_errors() {
        let missing_key = env_of(json!({"name": "c",
            "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}]}));
        assert_eq!(
            missing_key.unwrap_err().0,
            "couldn't find key k in Secret shop/creds"
        );
        let missing = env_of(json!({"name": "c",
            "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "other", "key": "k"}}}]}));
        assert_eq!(missing.unwrap_err().0, "configmap \"other\" not found");
        let from = env_of(json!({"name": "c", "envFrom": [{"secretRef": {"name": "gone"}}]}));
        assert_eq!(from.unwrap_err().0, "secret \"gone\" not found");
    }

    #[test]
    fn argv_follows_the_kubernetes_rules() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let entrypoint = strings(&["/entry"]);
        let cmd = strings(&["serve", "--port=80"]);
        let mut env = Environment::default();
        env.set("PORT", "8080".into());
        let mut c = Container::default();
        assert_eq!(
            argv(&c, &entrypoint, &cmd, &env).unwrap(),
            strings(&["/entry", "serve", "--port=80"])
        );
        c.args = Some(strings(&["run", "--port=$(PORT)"]));
        assert_eq!(
            argv(&c, &entrypoint, &cmd, &env).unwrap(),
            strings(&["/entry", "run", "--port=8080"])
        );
        c.command = Some(strings(&["/bin/sh", "-c"]));
        assert_eq!(
            argv(&c, &entrypoint, &cmd, &env).unwrap(),
            strings(&["/bin/sh", "-c", "run", "--port=8080"])
        );
        c.args = None;
        assert_eq!(
            argv(&c, &entrypoint, &cmd, &env).unwrap(),
            strings(&["/bin/sh", "-c"])
        );
        assert!(argv(&Container::default(), &[], &[], &env).is_err());
    }
}
