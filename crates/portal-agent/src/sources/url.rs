//! The `http` source: the static pods served at `--manifest-url`, fetched
//! every `--http-check-frequency` with the `--manifest-url-header`s. A URL
//! that cannot be reached, answers with an error or serves a bad manifest
//! keeps the last good set running (and the problem is reported); the set
//! is all or nothing.

use std::time::Duration;

use super::manifest::{self, Origin, Problem};
use super::{Source, Update, Updates};

/// One request's time limit.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The manifest URL and how to ask for it.
#[derive(Clone, Debug)]
pub struct ManifestUrl {
    pub url: String,
    /// Extra request headers (name, value).
    pub headers: Vec<(String, String)>,
}

/// Fetches the set now and every `every`, for `node`.
pub async fn run(source: ManifestUrl, node: String, every: Duration, updates: Updates) {
    // The process's TLS provider (`portal` installs the same at start).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "the manifest URL's HTTP client");
            return;
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let update = match fetch(&client, &source).await {
            Ok(bytes) => {
                let origin = Origin {
                    node: &node,
                    source: Source::Url,
                    location: &source.url,
                };
                match manifest::read(&bytes, origin) {
                    Ok(pods) => {
                        let located = pods.into_iter().map(|p| (p, source.url.clone())).collect();
                        let (pods, problems) = manifest::first_of_each_name(located);
                        Update {
                            source: Source::Url,
                            pods: Some(pods),
                            problems,
                        }
                    }
                    Err(message) => kept(&source.url, message),
                }
            }
            Err(message) => kept(&source.url, message),
        };
        if updates.send(update).await.is_err() {
            return;
        }
    }
}

/// The last good set stays; the problem is reported.
fn kept(url: &str, message: String) -> Update {
    Update {
        source: Source::Url,
        pods: None,
        problems: vec![Problem {
            origin: url.to_owned(),
            message: format!("{message}; the last good set keeps running"),
        }],
    }
}

/// The body at the URL (at most [`manifest::MAX_BYTES`]).
async fn fetch(client: &reqwest::Client, source: &ManifestUrl) -> Result<Vec<u8>, String> {
    let mut request = client.get(&source.url);
    for (name, value) in &source.headers {
        request = request.header(name, value);
    }
    let mut response = request.send().await.map_err(|e| error_chain(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        body.extend_from_slice(&chunk);
        if body.len() > manifest::MAX_BYTES {
            return Err(format!("larger than {} bytes", manifest::MAX_BYTES));
        }
    }
    Ok(body)
}

/// An error with its causes (reqwest's own message alone says little).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves `responses` one connection each, recording the requests.
    async fn serve(responses: Vec<String>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/pods.yaml", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut requests = Vec::new();
            for response in responses {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buffer = vec![0; 4096];
                let n = socket.read(&mut buffer).await.unwrap();
                requests.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
                socket.write_all(response.as_bytes()).await.unwrap();
            }
            requests
        });
        (url, task)
    }

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_good_set_then_errors_keep_it() {
        let pod = "metadata: {name: u}\nspec: {containers: [{name: c, image: x}]}\n";
        let (url, server) = serve(vec![
            ok(pod),
            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .into(),
            ok("{broken"),
        ])
        .await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let source = ManifestUrl {
            url: url.clone(),
            headers: vec![("X-Token".into(), "secret".into())],
        };
        let task = tokio::spawn(run(source, "n1".into(), Duration::from_millis(50), tx));
        let first = rx.recv().await.unwrap();
        assert_eq!(
            first.pods.unwrap()[0].metadata.name.as_deref(),
            Some("u-n1")
        );
        let failed = rx.recv().await.unwrap();
        assert!(failed.pods.is_none());
        assert!(
            failed.problems[0].message.contains("500"),
            "{:?}",
            failed.problems
        );
        let bad = rx.recv().await.unwrap();
        assert!(bad.pods.is_none());
        assert!(bad.problems[0].message.contains("not YAML"));
        // The server is gone now: unreachable keeps the set too.
        let unreachable = rx.recv().await.unwrap();
        assert!(unreachable.pods.is_none());
        task.abort();
        let requests = server.await.unwrap();
        assert!(
            requests[0].to_ascii_lowercase().contains("x-token: secret"),
            "{}",
            requests[0]
        );
    }
}
