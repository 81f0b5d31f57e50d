//! The files the agent writes into every pod: `/etc/resolv.conf` by
//! `dnsPolicy`/`dnsConfig`, `/etc/hosts` with the pod's own name and
//! `hostAliases`, and the hostname, as the kubelet makes them. Pure
//! functions; the runtime mounts the results.

use k8s_openapi::api::core::v1::Pod;

/// What the node knows about cluster DNS.
#[derive(Clone, Debug)]
pub struct DnsSettings {
    /// The kube-dns Service address(es); empty = no cluster DNS.
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The node's own `/etc/resolv.conf`, for `dnsPolicy: Default`.
    pub host_resolv_conf: String,
}

/// Upper bounds as in the kubelet (`validation.MaxDNSSearchPaths` etc.).
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH: usize = 32;

/// The pod's hostname: `spec.hostname`, else its name cut to 63 characters
/// (without a trailing `-` or `.`).
pub fn hostname(pod: &Pod) -> String {
    if let Some(name) = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
    {
        return name;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_owned()
}

/// The pod's fully qualified name when it has a `subdomain`:
/// `hostname.subdomain.ns.svc.zone`.
fn fqdn(pod: &Pod, zone: &str) -> Option<String> {
    let subdomain = pod
        .spec
        .as_ref()?
        .subdomain
        .clone()
        .filter(|s| !s.is_empty())?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!(
        "{}.{subdomain}.{namespace}.svc.{zone}",
        hostname(pod)
    ))
}

/// `/etc/hosts`, or `None` for host-network pods (they see the node's).
/// One line names the pod per address (both families on a dual-stack
/// node, as the kubelet writes them).
pub fn hosts(pod: &Pod, pod_ips: &[String], zone: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    let name = hostname(pod);
    let full = fqdn(pod, zone);
    for pod_ip in pod_ips {
        match &full {
            Some(full) => out.push_str(&format!("{pod_ip}\t{full}\t{name}\n")),
            None => out.push_str(&format!("{pod_ip}\t{name}\n")),
        }
    }
    if let Some(aliases) = spec.host_aliases.as_ref().filter(|a| !a.is_empty()) {
        out.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default();
            if !names.is_empty() {
                out.push_str(&format!("{}\t{}\n", alias.ip, names.join("\t")));
            }
        }
    }
    Some(out)
}

/// Why a pod's DNS settings cannot be made.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DnsError(pub String);

/// `/etc/resolv.conf` for `dnsPolicy` (ClusterFirst by default,
/// ClusterFirstWithHostNet, Default, None) merged with `dnsConfig`.
pub fn resolv_conf(pod: &Pod, dns: &DnsSettings) -> Result<String, DnsError> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network) == Some(true);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let (host_servers, host_search, host_options) = parse(&dns.host_resolv_conf);
    let (mut servers, mut search, mut options) = match policy {
        "None" => (Vec::new(), Vec::new(), Vec::new()),
        // A host-network pod keeps the node's DNS unless it asks for the
        // cluster's, as in the kubelet.
        "ClusterFirst" if host_network => (host_servers, host_search, host_options),
        "ClusterFirst" | "ClusterFirstWithHostNet" if !dns.cluster_dns.is_empty() => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let zone = &dns.cluster_domain;
            let mut search = vec![
                format!("{namespace}.svc.{zone}"),
                format!("svc.{zone}"),
                zone.clone(),
            ];
            search.extend(host_search);
            (dns.cluster_dns.clone(), search, vec!["ndots:5".to_owned()])
        }
        // Default, or ClusterFirst on a node without cluster DNS.
        "Default" | "ClusterFirst" | "ClusterFirstWithHostNet" => {
            (host_servers, host_search, host_options)
        }
        other => return Err(DnsError(format!("unsupported dnsPolicy {other:?}"))),
    };
    if let Some(config) = spec.and_then(|s| s.dns_config.as_ref()) {
        servers.extend(config.nameservers.clone().unwrap_or_default());
        search.extend(config.searches.clone().unwrap_or_default());
        for option in config.options.iter().flatten() {
            let Some(name) = option.name.clone() else {
                continue;
            };
            options.retain(|o| o.split(':').next() != Some(name.as_str()));
            options.push(match &option.value {
                Some(value) => format!("{name}:{value}"),
                None => name,
            });
        }
    }
    if policy == "None" && servers.is_empty() {
        return Err(DnsError(
            "dnsPolicy None needs dnsConfig.nameservers".into(),
        ));
    }
    dedup(&mut search);
    servers.truncate(MAX_NAMESERVERS);
    search.truncate(MAX_SEARCH);
    let mut out = String::new();
    if !search.is_empty() {
        out.push_str(&format!("search {}\n", search.join(" ")));
    }
    for server in &servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    Ok(out)
}

fn dedup(list: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    list.retain(|item| seen.insert(item.clone()));
}

/// Nameservers, search domains and options of a resolv.conf.
fn parse(text: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut servers, mut search, mut options) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => servers.extend(words.next().map(str::to_owned)),
            Some("search") | Some("domain") => search = words.map(str::to_owned).collect(),
            Some("options") => options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    (servers, search, options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        serde_json::from_value(
            json!({"metadata": {"name": "web-1", "namespace": "shop"}, "spec": spec}),
        )
        .unwrap()
    }

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            host_resolv_conf: "nameserver 192.168.1.1\nsearch corp.example\noptions edns0\n".into(),
        }
    }

    #[test]
    fn cluster_first_points_at_kube_dns() {
        let text = resolv_conf(&pod(json!({})), &settings()).unwrap();
        assert_eq!(
            text,
            "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example\n\
             nameserver 10.96.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn default_none_and_dns_config() {
        let text = resolv_conf(&pod(json!({"dnsPolicy": "Default"})), &settings()).unwrap();
        assert_eq!(
            text,
            "search corp.example\nnameserver 192.168.1.1\noptions edns0\n"
        );
        let host = resolv_conf(&pod(json!({"hostNetwork": true})), &settings()).unwrap();
        assert_eq!(host, text, "host-network pods keep the node's DNS");
        let none = pod(json!({"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["1.2.3.4"], "searches": ["a.example"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
        assert_eq!(
            resolv_conf(&none, &settings()).unwrap(),
            "search a.example\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
        );
        let merged = pod(json!({"dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}));
        assert!(resolv_conf(&merged, &settings())
            .unwrap()
            .ends_with("options ndots:1\n"));
        assert!(resolv_conf(&pod(json!({"dnsPolicy": "None"})), &settings()).is_err());
    }

    #[test]
    fn hosts_file_names_the_pod() {
        let plain = hosts(&pod(json!({})), &["10.244.0.5".into()], "cluster.local").unwrap();
        assert!(plain.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(plain.ends_with("10.244.0.5\tweb-1\n"));
        let named = pod(json!({"hostname": "db-0", "subdomain": "db",
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}]}));
        let text = hosts(
            &named,
            &["10.244.0.6".into(), "fd00::6".into()],
            "cluster.local",
        )
        .unwrap();
        assert!(text.contains("10.244.0.6\tdb-0.db.shop.svc.cluster.local\tdb-0\nfd00::6\tdb-0.db.shop.svc.cluster.local\tdb-0\n"));
        assert!(text.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"));
        assert!(hosts(
            &pod(json!({"hostNetwork": true})),
            &["10.244.0.5".into()],
            "cluster.local"
        )
        .is_none());
        assert_eq!(hostname(&named), "db-0");
    }
}
