//! What lifecycle hooks and probes do, as the kubelet runs them: a command
//! in the container (`exec`: success is exit code 0), an HTTP GET to the
//! pod (`httpGet`: a status from 200 to 399), a TCP connection
//! (`tcpSocket`), or a pause (`sleep`, hooks only). Ports may be given by
//! name, resolved through the container's ports.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ExecAction, HTTPGetAction, LifecycleHandler, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::Runtime;

/// An action, ready to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Exec(Vec<String>),
    HttpGet {
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
        https: bool,
    },
    TcpSocket {
        host: String,
        port: u16,
    },
    Sleep(Duration),
}

/// How an action went: `Err` says why it failed.
pub(crate) type Outcome = Result<(), String>;

/// A port given by number or by one of the container's port names.
fn port(value: &IntOrString, container: &Container) -> Result<u16, String> {
    match value {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port {n}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no port named {name:?} in container {}", container.name)),
    }
}

/// The action of a hook or probe given by its parts (one of them is set).
pub(crate) fn from_parts(
    exec: Option<&ExecAction>,
    http: Option<&HTTPGetAction>,
    tcp: Option<&TCPSocketAction>,
    sleep_seconds: Option<i64>,
    container: &Container,
    pod_ip: &str,
) -> Result<Action, String> {
    if let Some(exec) = exec {
        let argv = exec.command.clone().unwrap_or_default();
        if argv.is_empty() {
            return Err("exec with no command".into());
        }
        return Ok(Action::Exec(argv));
    }
    if let Some(http) = http {
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| pod_ip.to_owned());
        let path = http
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        return Ok(Action::HttpGet {
            host,
            port: port(&http.port, container)?,
            path,
            headers: http
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            https: http.scheme.as_deref() == Some("HTTPS"),
        });
    }
    if let Some(tcp) = tcp {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| pod_ip.to_owned());
        return Ok(Action::TcpSocket {
            host,
            port: port(&tcp.port, container)?,
        });
    }
    if let Some(seconds) = sleep_seconds {
        return Ok(Action::Sleep(Duration::from_secs(
            seconds.max(0).unsigned_abs(),
        )));
    }
    Err("no action given (exec, httpGet, tcpSocket or sleep)".into())
}

/// Runs a lifecycle hook (postStart, preStop) of `container` in its
/// instance `id`, failing after `timeout`.
pub(crate) async fn run_hook<R: Runtime>(
    runtime: &R,
    id: &str,
    hook: &LifecycleHandler,
    container: &Container,
    pod_ip: &str,
    timeout: Duration,
) -> Outcome {
    let action = from_parts(
        hook.exec.as_ref(),
        hook.http_get.as_ref(),
        hook.tcp_socket.as_ref(),
        hook.sleep.as_ref().map(|s| s.seconds),
        container,
        pod_ip,
    )?;
    run(runtime, id, &action, timeout).await
}

/// Runs `action` for the container `id`, failing after `timeout`.
pub(crate) async fn run<R: Runtime>(
    runtime: &R,
    id: &str,
    action: &Action,
    timeout: Duration,
) -> Outcome {
    match action {
        Action::Exec(argv) => match runtime.exec(id, argv, timeout).await {
            Ok(result) => match result.exit_code {
                Some(0) => Ok(()),
                Some(code) => Err(format!(
                    "command {argv:?} exited with {code}: {}",
                    String::from_utf8_lossy(&result.output).trim()
                )),
                None => Err(format!(
                    "command {argv:?} timed out after {}s",
                    timeout.as_secs()
                )),
            },
            Err(error) => Err(error.to_string()),
        },
        Action::HttpGet {
            host,
            port,
            path,
            headers,
            https,
        } => {
            let get = http_get(host, *port, path, headers, *https);
            match tokio::time::timeout(timeout, get).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    let scheme = if *https { "https" } else { "http" };
                    Err(format!(
                        "Get \"{scheme}://{host}:{port}{path}\": context deadline exceeded"
                    ))
                }
            }
        }
        Action::TcpSocket { host, port } => {
            match tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), *port)),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(format!("dial tcp {host}:{port}: {error}")),
                Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
            }
        }
        Action::Sleep(duration) => {
            tokio::time::sleep((*duration).min(timeout)).await;
            Ok(())
        }
    }
}

/// An HTTP/1.1 GET, over TLS for `https` (the certificate is not
/// checked, as the kubelet's probes do not); success for a status from 200
/// to 399.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    https: bool,
) -> Outcome {
    let scheme = if https { "https" } else { "http" };
    let authority = join_host_port(host, port);
    let url = format!("{scheme}://{authority}{path}");
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Get \"{url}\": dial tcp {authority}: {e}"))?;
    let request = Request {
        url: &url,
        authority: &authority,
        path,
        headers,
    };
    if !https {
        return request.send(tcp).await;
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let tls = insecure::connector()
        .map_err(|e| format!("Get \"{url}\": {e}"))?
        .connect(name, tcp)
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    request.send(tls).await
}

/// `host:port`, an IPv6 address in brackets (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: u16) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

struct Request<'a> {
    url: &'a str,
    authority: &'a str,
    path: &'a str,
    headers: &'a [(String, String)],
}

impl Request<'_> {
    async fn send<S>(&self, mut stream: S) -> Outcome
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let Request {
            url,
            authority,
            path,
            headers,
        } = self;
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n");
        for (name, value) in headers.iter() {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        let mut head = vec![0u8; 1024];
        let mut read = 0;
        while read < head.len() && !head[..read].contains(&b'\n') {
            match stream.read(&mut head[read..]).await {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) => return Err(format!("Get \"{url}\": {e}")),
            }
        }
        let line = String::from_utf8_lossy(&head[..read]);
        let code: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("Get \"{url}\": malformed HTTP response"))?;
        if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        }
    }
}

/// TLS for probes and hooks: any certificate is accepted (the kubelet's
/// `InsecureSkipVerify`); signatures are still checked, so the handshake
/// itself is sound.
mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct AcceptAny(Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    pub(super) fn connector() -> Result<tokio_rustls::TlsConnector, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth();
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(join_host_port("fd00::5", 8080), "[fd00::5]:8080");
        assert_eq!(join_host_port("10.0.0.5", 8080), "10.0.0.5:8080");
        assert_eq!(join_host_port("example.com", 80), "example.com:80");
    }

    #[test]
    fn actions_from_specs() {
        let container: Container = serde_json::from_value(
            json!({"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}),
        )
        .unwrap();
        let http: HTTPGetAction = serde_json::from_value(json!({"port": "http", "path": "healthz", "httpHeaders": [{"name": "X", "value": "1"}]})).unwrap();
        let action = from_parts(None, Some(&http), None, None, &container, "10.244.0.5").unwrap();
        assert_eq!(
            action,
            Action::HttpGet {
                host: "10.244.0.5".into(),
                port: 8080,
                path: "/healthz".into(),
                headers: vec![("X".into(), "1".into())],
                https: false
            }
        );
        let tcp: TCPSocketAction = serde_json::from_value(json!({"port": 5432})).unwrap();
        assert_eq!(
            from_parts(None, None, Some(&tcp), None, &container, "10.0.0.1").unwrap(),
            Action::TcpSocket {
                host: "10.0.0.1".into(),
                port: 5432
            }
        );
        let missing: TCPSocketAction = serde_json::from_value(json!({"port": "nope"})).unwrap();
        assert!(from_parts(None, None, Some(&missing), None, &container, "10.0.0.1").is_err());
        assert!(from_parts(None, None, None, None, &container, "x").is_err());
    }

    #[tokio::test]
    async fn http_get_judges_the_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buffer = [0u8; 1024];
                let _ = socket.read(&mut buffer).await;
                let _ = socket
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        assert_eq!(http_get("127.0.0.1", port, "/", &[], false).await, Ok(()));
        assert!(http_get("127.0.0.1", port, "/", &[], false)
            .await
            .unwrap_err()
            .contains("503"));
    }

    #[tokio::test]
    async fn https_get_accepts_any_certificate() {
        let cert = rcgen::generate_simple_self_signed(vec!["pod.local".into()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(socket).await.unwrap();
            let mut buffer = [0u8; 1024];
            let _ = tls.read(&mut buffer).await;
            let _ = tls.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            let _ = tls.shutdown().await;
        });
        assert_eq!(
            http_get("127.0.0.1", port, "/healthz", &[], true).await,
            Ok(())
        );
    }
}
