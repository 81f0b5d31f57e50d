//! The sockets: UDP served by a few threads, each with its own
//! `SO_REUSEPORT` socket and a blocking receive loop (no task switch per
//! query), TCP by tokio (length-prefixed messages, several per connection),
//! and the upstream forwarder for names outside the cluster.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::answer::{answer, Outcome, Settings, Summary, Transport};
use crate::metrics::Metrics;
use crate::records::Records;

/// Upstream answers wait this long.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// A TCP connection with no query for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Concurrent TCP connections and concurrent upstream queries.
const MAX_TCP_CONNECTIONS: usize = 256;
pub(crate) const MAX_FORWARDS: usize = 1024;
/// The largest DNS message.
const MAX_MESSAGE: usize = 65_535;

/// What every socket shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) records: Arc<RwLock<Records>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Settings,
    pub(crate) upstream: Option<SocketAddr>,
    pub(crate) forwards: Semaphore,
}

impl Shared {
    fn answer(&self, query: &[u8], transport: Transport) -> Outcome {
        let records = self.records.read();
        answer(&records, query, transport, self.settings)
    }
}

fn udp_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Binds `threads` UDP sockets to `addr` (port 0: one free port for all) and
/// serves each on its own thread. Returns the bound address.
pub(crate) fn serve_udp(
    addr: SocketAddr,
    threads: usize,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
) -> io::Result<SocketAddr> {
    let first = udp_socket(addr)?;
    let bound = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..threads.max(1) {
        sockets.push(udp_socket(bound)?);
    }
    for (index, socket) in sockets.into_iter().enumerate() {
        let shared = shared.clone();
        let runtime = runtime.clone();
        std::thread::Builder::new()
            .name(format!("dns-udp-{index}"))
            .spawn(move || udp_loop(&socket, &shared, &runtime))?;
    }
    Ok(bound)
}

fn udp_loop(socket: &UdpSocket, shared: &Arc<Shared>, runtime: &tokio::runtime::Handle) {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    loop {
        let (length, peer) = match socket.recv_from(&mut buffer) {
            Ok(received) => received,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                tracing::warn!(%error, "DNS UDP receive failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let started = Instant::now();
        let query = &buffer[..length];
        match shared.answer(query, Transport::Udp) {
            Outcome::Reply(reply, summary) => {
                if let Err(error) = socket.send_to(&reply, peer) {
                    tracing::debug!(%error, %peer, "DNS UDP send failed");
                }
                shared.metrics.query(summary, started.elapsed());
            }
            Outcome::Forward(summary) => {
                let (Some(upstream), Ok(permit), Ok(reply_socket)) = (
                    shared.upstream,
                    shared.forwards.try_acquire(),
                    socket.try_clone(),
                ) else {
                    continue;
                };
                permit.forget();
                let shared = shared.clone();
                let query = query.to_vec();
                runtime.spawn(async move {
                    let reply = forward_udp(upstream, &query).await;
                    shared.forwards.add_permits(1);
                    match reply {
                        Ok(reply) => {
                            let _ = reply_socket.send_to(&reply, peer);
                            shared.metrics.query(summary, started.elapsed());
                        }
                        Err(error) => tracing::debug!(%error, "upstream query failed"),
                    }
                });
            }
            Outcome::Drop => {}
        }
    }
}

/// One query to the upstream resolver over UDP; the reply must carry the
/// query's ID (anything else on the socket is ignored).
async fn forward_udp(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buffer = vec![0u8; MAX_MESSAGE];
    tokio::time::timeout(UPSTREAM_TIMEOUT, async {
        loop {
            let length = socket.recv(&mut buffer).await?;
            if length >= 2 && buffer[..2] == query[..2] {
                return Ok(buffer[..length].to_vec());
            }
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream did not answer"))?
}

async fn forward_tcp(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    tokio::time::timeout(UPSTREAM_TIMEOUT, async {
        let mut stream = TcpStream::connect(upstream).await?;
        write_message(&mut stream, query).await?;
        read_message(&mut stream).await
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream did not answer"))?
}

async fn read_message(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let length = usize::from(stream.read_u16().await?);
    let mut message = vec![0u8; length];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

async fn write_message(stream: &mut TcpStream, message: &[u8]) -> io::Result<()> {
    let length = u16::try_from(message.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "message too long"))?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}

/// Serves DNS over TCP on `listener` until the process ends.
pub(crate) async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "DNS TCP accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Over the limit: the connection is closed at once.
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(error) = tcp_connection(stream, &shared).await {
                tracing::debug!(%error, %peer, "DNS TCP connection ended");
            }
            drop(permit);
        });
    }
}

async fn tcp_connection(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    loop {
        let query = match tokio::time::timeout(TCP_IDLE, read_message(&mut stream)).await {
            Ok(Ok(query)) => query,
            Ok(Err(error)) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(error)) => return Err(error),
            Err(_) => return Ok(()),
        };
        let started = Instant::now();
        let (reply, summary): (Vec<u8>, Summary) = match shared.answer(&query, Transport::Tcp) {
            Outcome::Reply(reply, summary) => (reply, summary),
            Outcome::Forward(summary) => match shared.upstream {
                Some(upstream) => (forward_tcp(upstream, &query).await?, summary),
                None => return Ok(()),
            },
            Outcome::Drop => return Ok(()),
        };
        write_message(&mut stream, &reply).await?;
        shared.metrics.query(summary, started.elapsed());
    }
}
