//! TCP: accept, connect to an endpoint (another one when a connect fails),
//! then copy both ways until both sides are done.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::balancer::Balancer;

/// Connect timeouts of successive attempts (kube-proxy's userspace mode
/// used the same escalation).
const ATTEMPTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = super::socket(addr, socket2::Type::STREAM)?;
    super::retry_in_use(|| socket.bind(&addr.into()))?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Concurrent connections per listener (bounded memory and descriptors);
/// beyond it new connections are closed at once.
const MAX_CONNECTIONS: usize = 16_384;

pub(crate) async fn serve(listener: TcpListener, balancer: Arc<Balancer>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        match listener.accept().await {
            Ok((client, from)) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(%from, "userspace proxy: too many connections; closing");
                    continue;
                };
                let balancer = balancer.clone();
                tokio::spawn(async move {
                    proxy(client, from, balancer).await;
                    drop(slot);
                });
            }
            Err(error) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(%error, "userspace proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn proxy(client: TcpStream, from: SocketAddr, balancer: Arc<Balancer>) {
    let mut upstream = None;
    let candidates = balancer.candidates(from.ip(), ATTEMPTS.len());
    // Every attempt is made, cycling through the candidates: one lost SYN
    // to a single endpoint must not fail the client.
    for (endpoint, timeout) in candidates.iter().cycle().zip(ATTEMPTS) {
        match tokio::time::timeout(timeout, TcpStream::connect(*endpoint)).await {
            Ok(Ok(stream)) => {
                balancer.used(from.ip(), *endpoint);
                upstream = Some(stream);
                break;
            }
            Ok(Err(error)) => {
                tracing::debug!(%endpoint, %error, "connect failed; trying another endpoint")
            }
            Err(_) => tracing::debug!(%endpoint, "connect timed out; trying another endpoint"),
        }
    }
    let Some(upstream) = upstream else {
        // Closing the client connection is all we can tell it.
        return;
    };
    for stream in [&client, &upstream] {
        let _ = stream.set_nodelay(true);
        // Dead peers are found and their slots freed.
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&KEEPALIVE);
    }
    let _ = super::splice::relay(&client, &upstream).await;
}

static KEEPALIVE: std::sync::LazyLock<socket2::TcpKeepalive> = std::sync::LazyLock::new(|| {
    socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
});
