//! Load balancers' health checks (`healthCheckNodePort`). For each Service
//! with `externalTrafficPolicy: Local`, this node answers HTTP on the
//! Service's health check node port: 200 while it has a ready endpoint of
//! the Service (and its proxy is healthy), else 503, with kube-proxy's
//! body and `X-Load-Balancing-Endpoint-Weight`. A load balancer then sends
//! traffic only to nodes that can serve it without leaving the node, which
//! is what keeps the client's address.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::metrics::Metrics;
use crate::model::{ServiceKey, ServicePort};
use crate::tracker::Changes;

/// The most of a request read (a health check is a bare GET).
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send it.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Checks answered at once per port; more wait for their turn.
const MAX_CONCURRENT: usize = 64;

/// What one health check port answers for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    service: ServiceKey,
    local_endpoints: usize,
}

struct Server {
    answer: Arc<Mutex<Answer>>,
    task: tokio::task::JoinHandle<()>,
}

/// The health check servers of this node, one per port.
pub(crate) struct HealthChecks {
    bind: Ipv4Addr,
    metrics: Arc<Metrics>,
    servers: HashMap<u16, Server>,
    port_of: HashMap<ServiceKey, u16>,
}

impl HealthChecks {
    pub(crate) fn new(bind: Ipv4Addr, metrics: Arc<Metrics>) -> Self {
        HealthChecks {
            bind,
            metrics,
            servers: HashMap::new(),
            port_of: HashMap::new(),
        }
    }

    /// Follows a sync's changes: servers start, stop or change answers.
    /// Must run inside the tokio runtime.
    pub(crate) fn update(&mut self, changes: &Changes, full: bool) {
        if full {
            let gone: Vec<ServiceKey> = self
                .port_of
                .keys()
                .filter(|key| !changes.services.contains_key(*key))
                .cloned()
                .collect();
            for key in gone {
                self.stop(&key);
            }
        }
        // Stops first: a port one Service gave up may go to another in the
        // same sync.
        let wanted: Vec<(&ServiceKey, Option<(u16, Answer)>)> = changes
            .services
            .iter()
            .map(|(key, ports)| (key, health_check(ports)))
            .collect();
        for (key, check) in &wanted {
            if check.as_ref().map(|(port, _)| *port) != self.port_of.get(*key).copied() {
                self.stop(key);
            }
        }
        for (key, check) in wanted {
            if let Some((port, answer)) = check {
                self.serve(key, port, answer);
            }
        }
    }

    fn stop(&mut self, key: &ServiceKey) {
        if let Some(port) = self.port_of.remove(key) {
            if let Some(server) = self.servers.remove(&port) {
                server.task.abort();
            }
        }
    }

    fn serve(&mut self, key: &ServiceKey, port: u16, answer: Answer) {
        if self.port_of.get(key) != Some(&port) {
            self.stop(key);
        }
        if let Some(server) = self.servers.get(&port) {
            *server.answer.lock() = answer;
            self.port_of.insert(key.clone(), port);
            return;
        }
        let addr = SocketAddr::from((self.bind, port));
        let listener = match std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
        {
            Ok(listener) => listener,
            Err(error) => {
                // Tried again at the next change or periodic full sync.
                tracing::warn!(%addr, %error, service = %key, "cannot serve the health check node port");
                return;
            }
        };
        let answer = Arc::new(Mutex::new(answer));
        let task = tokio::spawn(accept(listener, answer.clone(), self.metrics.clone()));
        self.servers.insert(port, Server { answer, task });
        self.port_of.insert(key.clone(), port);
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.task.abort();
        }
    }
}

/// A Service's health check port and what it answers: the distinct
/// local endpoint addresses over all its ports of its primary family (a
/// dual-stack pod has an address of each).
fn health_check(ports: &[ServicePort]) -> Option<(u16, Answer)> {
    let first = ports.first()?;
    let port = first.health_check_node_port?;
    let local: BTreeSet<IpAddr> = ports
        .iter()
        .filter(|p| p.family() == first.family())
        .flat_map(|p| p.local_endpoints.iter().map(|e| e.ip()))
        .collect();
    Some((
        port,
        Answer {
            service: first.service.clone(),
            local_endpoints: local.len(),
        },
    ))
}

async fn accept(
    listener: tokio::net::TcpListener,
    answer: Arc<Mutex<Answer>>,
    metrics: Arc<Metrics>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let answer = answer.lock().clone();
        let healthy = metrics.healthy();
        tokio::spawn(async move {
            let _permit = permit;
            if read_head(&mut stream).await {
                let _ = stream.write_all(&response(&answer, healthy)).await;
                let _ = stream.shutdown().await;
            }
        });
    }
}

/// Reads up to the end of the request head; whether there was one.
async fn read_head(stream: &mut tokio::net::TcpStream) -> bool {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .unwrap_or(false)
}

/// kube-proxy's answer, byte for byte in its body.
fn response(answer: &Answer, healthy: bool) -> Vec<u8> {
    let serving = answer.local_endpoints > 0 && healthy;
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        answer.service.namespace, answer.service.name, answer.local_endpoints, healthy
    );
    let status = if serving {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        answer.local_endpoints,
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_kube_proxy() {
        let answer = Answer {
            service: ServiceKey::new("default", "web"),
            local_endpoints: 2,
        };
        let text = String::from_utf8(response(&answer, true)).unwrap_or_default();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(text.contains("X-Load-Balancing-Endpoint-Weight: 2\r\n"));
        assert!(text.ends_with("{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"));
        let none = Answer {
            local_endpoints: 0,
            ..answer
        };
        assert!(String::from_utf8(response(&none, true))
            .unwrap_or_default()
            .starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    }
}
