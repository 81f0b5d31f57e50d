//! Service environment variables (SPEC D1): for every Service with a
//! cluster IP, `{SVC}_SERVICE_HOST`/`_PORT`/`_PORT_{NAME}` and the
//! Docker-links set, as the kubelet writes them.

use serde_json::Value;

fn variable_name(name: &str) -> String {
    name.replace('-', "_").to_ascii_uppercase()
}

/// The variables for a pod started while `services` (of its namespace)
/// exist, in the kubelet's order.
pub fn environment<'a>(services: impl IntoIterator<Item = &'a Value>) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for service in services {
        let spec = &service["spec"];
        let ip = spec["clusterIP"].as_str().unwrap_or("");
        let ports = spec["ports"].as_array().map_or(&[][..], Vec::as_slice);
        if ip.is_empty() || ip == super::HEADLESS || ports.is_empty() {
            continue;
        }
        let prefix = variable_name(service["metadata"]["name"].as_str().unwrap_or(""));
        let port_of = |p: &Value| p["port"].as_i64().unwrap_or(0);
        env.push((format!("{prefix}_SERVICE_HOST"), ip.to_owned()));
        env.push((
            format!("{prefix}_SERVICE_PORT"),
            port_of(&ports[0]).to_string(),
        ));
        for port in ports {
            if let Some(name) = port["name"].as_str().filter(|n| !n.is_empty()) {
                env.push((
                    format!("{prefix}_SERVICE_PORT_{}", variable_name(name)),
                    port_of(port).to_string(),
                ));
            }
        }
        let host = |port: i64| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        };
        for (i, port) in ports.iter().enumerate() {
            let protocol = port["protocol"].as_str().unwrap_or("TCP");
            let lower = protocol.to_ascii_lowercase();
            let number = port_of(port);
            let url = format!("{lower}://{}", host(number));
            if i == 0 {
                env.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{number}_{}", protocol.to_ascii_uppercase());
            env.push((port_prefix.clone(), url));
            env.push((format!("{port_prefix}_PROTO"), lower));
            env.push((format!("{port_prefix}_PORT"), number.to_string()));
            env.push((format!("{port_prefix}_ADDR"), ip.to_owned()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reference_example() {
        let redis = json!({"metadata": {"name": "redis-master"}, "spec": {"clusterIP": "10.0.0.11", "ports": [{"port": 6379, "protocol": "TCP"}]}});
        let env = environment([&redis]);
        let expected = [
            ("REDIS_MASTER_SERVICE_HOST", "10.0.0.11"),
            ("REDIS_MASTER_SERVICE_PORT", "6379"),
            ("REDIS_MASTER_PORT", "tcp://10.0.0.11:6379"),
            ("REDIS_MASTER_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
            ("REDIS_MASTER_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_MASTER_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_MASTER_PORT_6379_TCP_ADDR", "10.0.0.11"),
        ];
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn named_multi_port_and_skipped_services() {
        let dns = json!({"metadata": {"name": "kube-dns"}, "spec": {"clusterIP": "10.96.0.10", "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}});
        let headless = json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}});
        let external = json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName", "externalName": "x.example"}});
        let env: std::collections::BTreeMap<String, String> =
            environment([&dns, &headless, &external])
                .into_iter()
                .collect();
        assert_eq!(env["KUBE_DNS_SERVICE_PORT"], "53");
        assert_eq!(env["KUBE_DNS_SERVICE_PORT_DNS"], "53");
        assert_eq!(env["KUBE_DNS_SERVICE_PORT_DNS_TCP"], "53");
        assert_eq!(env["KUBE_DNS_PORT"], "udp://10.96.0.10:53");
        assert_eq!(env["KUBE_DNS_PORT_53_TCP_PROTO"], "tcp");
        assert!(!env
            .keys()
            .any(|k| k.starts_with("H_") || k.starts_with("E_")));
    }
}
