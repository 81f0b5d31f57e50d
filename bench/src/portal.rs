//! A `portal server` process and a minimal HTTPS client for it: one HTTP/1.1
//! connection per simulated client, as separate processes would have.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{pem::PemObject, CertificateDer, ServerName};

pub(crate) struct Portal {
    child: Child,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) token: String,
    tls: Arc<rustls::ClientConfig>,
}

impl Drop for Portal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Portal {
    /// Starts `portal server` with `extra` arguments.
    pub(crate) fn start(binary: &Path, dir: &Path, extra: &[&str]) -> Result<Self, String> {
        let child = Command::new(binary)
            .args(["server", "--data-dir"])
            .arg(dir)
            .args(["--api-bind", "127.0.0.1:0"])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("PORTAL_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let kubeconfig = dir.join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.exists() {
            if Instant::now() > deadline {
                return Err("portal did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(&kubeconfig).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        let cluster = &config["clusters"][0]["cluster"];
        let server = cluster["server"].as_str().ok_or("no server")?;
        let (host, port) = server
            .trim_start_matches("https://")
            .rsplit_once(':')
            .ok_or("bad server")?;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(
                cluster["certificate-authority-data"]
                    .as_str()
                    .ok_or("no CA")?,
            )
            .map_err(|e| e.to_string())?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&ca).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Portal {
            child,
            host: host.to_owned(),
            port: port.parse().map_err(|_| "bad port")?,
            token: config["users"][0]["user"]["token"]
                .as_str()
                .ok_or("no token")?
                .to_owned(),
            tls: Arc::new(tls),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new TLS connection: what one client process would open.
    pub(crate) async fn connect(&self) -> Result<Client, String> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from(self.host.clone()).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("bench connection failed: {e}");
            }
        });
        Ok(Client {
            sender,
            token: self.token.clone(),
        })
    }
}

pub(crate) struct Client {
    sender: SendRequest<Full<Bytes>>,
    token: String,
}

impl Client {
    fn request(&self, method: &str, path: &str, body: Bytes) -> http::Request<Full<Bytes>> {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap_or_default()
    }

    /// One request; the status code and the whole body.
    pub(crate) async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> Result<(u16, Bytes), String> {
        let request = self.request(method, path, body);
        let context = |e: hyper::Error| format!("{method} {path}: {e}");
        self.sender.ready().await.map_err(context)?;
        let response = self.sender.send_request(request).await.map_err(context)?;
        let code = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(context)?
            .to_bytes();
        Ok((code, body))
    }

    /// Starts a watch and returns its streaming body.
    pub(crate) async fn watch(mut self, path: &str) -> Result<hyper::body::Incoming, String> {
        let request = self.request("GET", path, Bytes::new());
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != 200 {
            return Err(format!("watch answered {}", response.status()));
        }
        Ok(response.into_body())
    }
}
