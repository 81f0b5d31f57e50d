//! UDP: a session per client address, with its own socket connected to the
//! chosen endpoint; replies go back through the listening socket. Idle
//! sessions end.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::UdpSocket;

use super::balancer::Balancer;

/// A session without traffic either way for this long ends.
const IDLE: Duration = Duration::from_secs(30);
/// At most this many concurrent client sessions per Service port.
const MAX_SESSIONS: usize = 4096;
const MAX_DATAGRAM: usize = 65_536;

pub(crate) fn bind(addr: SocketAddrV4) -> std::io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>;

pub(crate) async fn serve(socket: UdpSocket, balancer: Arc<Balancer>) {
    let socket = Arc::new(socket);
    let sessions: Sessions = Arc::default();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    loop {
        let Ok((len, client)) = socket.recv_from(&mut buffer).await else {
            continue;
        };
        let existing = sessions.lock().get(&client).cloned();
        let upstream = match existing {
            Some(upstream) => upstream,
            None => {
                if sessions.lock().len() >= MAX_SESSIONS {
                    continue;
                }
                let Some(upstream) = open(client, &balancer).await else {
                    continue;
                };
                sessions.lock().insert(client, upstream.clone());
                tokio::spawn(relay_replies(
                    socket.clone(),
                    upstream.clone(),
                    client,
                    sessions.clone(),
                ));
                upstream
            }
        };
        let _ = upstream.send(&buffer[..len]).await;
    }
}

/// A socket connected to an endpoint for `client`. UDP has no handshake, so
/// a "failed connect" is only a local error (no route): then the next.
async fn open(client: SocketAddr, balancer: &Balancer) -> Option<Arc<UdpSocket>> {
    for endpoint in balancer.candidates(client.ip(), 4) {
        let Ok(socket) = UdpSocket::bind("0.0.0.0:0").await else {
            return None;
        };
        if socket.connect(endpoint).await.is_ok() {
            balancer.used(client.ip(), endpoint);
            return Some(Arc::new(socket));
        }
    }
    None
}

async fn relay_replies(
    listener: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    client: SocketAddr,
    sessions: Sessions,
) {
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    while let Ok(Ok(len)) = tokio::time::timeout(IDLE, upstream.recv(&mut buffer)).await {
        let _ = listener.send_to(&buffer[..len], client).await;
    }
    sessions.lock().remove(&client);
}
