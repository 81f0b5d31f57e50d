//! UDP: a session per client address, with its own socket connected to the
//! chosen endpoint; replies go back through the listening socket. Idle
//! sessions end.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::balancer::Balancer;

/// A session without traffic either way for this long ends.
const IDLE: Duration = Duration::from_secs(30);
/// At most this many concurrent client sessions per Service port.
const MAX_SESSIONS: usize = 4096;
const MAX_DATAGRAM: usize = 65_536;

pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = super::socket(addr, socket2::Type::DGRAM)?;
    super::retry_in_use(|| socket.bind(&addr.into()))?;
    UdpSocket::from_std(socket.into())
}

/// A client's session: its socket to the endpoint, and when the client
/// last sent (replies alone do not keep a session alive).
#[derive(Debug)]
struct Session {
    upstream: Arc<UdpSocket>,
    last_sent: Mutex<Instant>,
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Arc<Session>>>>;

pub(crate) async fn serve(socket: UdpSocket, balancer: Arc<Balancer>) {
    let socket = Arc::new(socket);
    let sessions: Sessions = Arc::default();
    // The sessions' tasks end with this one (the listener closes with them).
    let mut relays = JoinSet::new();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    loop {
        while relays.try_join_next().is_some() {}
        let Ok((len, client)) = socket.recv_from(&mut buffer).await else {
            continue;
        };
        let existing = sessions.lock().get(&client).cloned();
        let session = match existing {
            Some(session) => session,
            None => {
                if sessions.lock().len() >= MAX_SESSIONS {
                    continue;
                }
                let Some(upstream) = open(client, &balancer).await else {
                    continue;
                };
                let session = Arc::new(Session {
                    upstream,
                    last_sent: Mutex::new(Instant::now()),
                });
                sessions.lock().insert(client, session.clone());
                relays.spawn(relay_replies(
                    socket.clone(),
                    session.clone(),
                    client,
                    sessions.clone(),
                ));
                session
            }
        };
        *session.last_sent.lock() = Instant::now();
        let _ = session.upstream.send(&buffer[..len]).await;
    }
}

/// A socket connected to an endpoint for `client`. UDP has no handshake, so
/// a "failed connect" is only a local error (no route): then the next.
async fn open(client: SocketAddr, balancer: &Balancer) -> Option<Arc<UdpSocket>> {
    for endpoint in balancer.candidates(client.ip(), 4) {
        let any: SocketAddr = match endpoint {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let Ok(socket) = UdpSocket::bind(any).await else {
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
    session: Arc<Session>,
    client: SocketAddr,
    sessions: Sessions,
) {
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    loop {
        match tokio::time::timeout(IDLE, session.upstream.recv(&mut buffer)).await {
            Ok(Ok(len)) => {
                let _ = listener.send_to(&buffer[..len], client).await;
            }
            // Quiet upstream: the session lives while the client sends.
            Err(_) if session.last_sent.lock().elapsed() < IDLE => {}
            // Idle both ways, or the endpoint refused (ICMP): end it.
            _ => break,
        }
    }
    sessions.lock().remove(&client);
}
