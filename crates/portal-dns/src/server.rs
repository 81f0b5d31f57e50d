//! The sockets: UDP served by a few threads, each with its own
//! `SO_REUSEPORT` socket and a blocking loop that takes and answers queries
//! in batches (`recvmmsg`/`sendmmsg`, no task switch per query), TCP by tokio (length-prefixed messages, several per connection),
//! and the upstream forwarder for names outside the cluster.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmmsg, sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage,
};
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

/// Binds `threads` UDP sockets to `addr` (port 0: one free port for all).
pub(crate) fn bind_udp(
    addr: SocketAddr,
    threads: usize,
) -> io::Result<(SocketAddr, Vec<UdpSocket>)> {
    let first = udp_socket(addr)?;
    let bound = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..threads.max(1) {
        sockets.push(udp_socket(bound)?);
    }
    Ok((bound, sockets))
}

/// Serves each socket on its own thread.
pub(crate) fn serve_udp(
    sockets: Vec<UdpSocket>,
    shared: &Arc<Shared>,
    runtime: &tokio::runtime::Handle,
) -> io::Result<()> {
    for (index, socket) in sockets.into_iter().enumerate() {
        let shared = shared.clone();
        let runtime = runtime.clone();
        std::thread::Builder::new()
            .name(format!("dns-udp-{index}"))
            .spawn(move || udp_loop(&socket, &shared, &runtime))?;
    }
    Ok(())
}

/// Datagrams taken from (and answers given to) the kernel per system call.
const BATCH: usize = 32;
/// A UDP query larger than this is cut (and then answered FORMERR).
const MAX_UDP_QUERY: usize = 4096;

fn std_address(address: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    address
        .as_sockaddr_in6()
        .map(|v6| SocketAddr::V6((*v6).into()))
}

/// Receives up to `BATCH` queries with one `recvmmsg`, answers them under
/// one read lock and sends the answers with one `sendmmsg`: under load the
/// system calls, not the answering, are what costs (as Knot does).
fn udp_loop(socket: &UdpSocket, shared: &Arc<Shared>, runtime: &tokio::runtime::Handle) {
    let fd = socket.as_raw_fd();
    let mut buffers = vec![[0u8; MAX_UDP_QUERY]; BATCH];
    let mut receive_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    loop {
        let received: Vec<(usize, Option<SockaddrStorage>)> = {
            let mut slices: Vec<[IoSliceMut<'_>; 1]> = buffers
                .iter_mut()
                .map(|buffer| [IoSliceMut::new(&mut buffer[..])])
                .collect();
            match recvmmsg(
                fd,
                &mut receive_headers,
                slices.iter_mut(),
                MsgFlags::MSG_WAITFORONE,
                None,
            ) {
                Ok(messages) => messages.map(|m| (m.bytes, m.address)).collect(),
                Err(Errno::EINTR) => continue,
                Err(error) => {
                    tracing::warn!(%error, "DNS UDP receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        };
        let started = Instant::now();
        let mut replies: Vec<Vec<u8>> = Vec::with_capacity(received.len());
        let mut peers: Vec<Option<SockaddrStorage>> = Vec::with_capacity(received.len());
        let mut summaries: Vec<Summary> = Vec::with_capacity(received.len());
        {
            let records = shared.records.read();
            for ((length, peer), buffer) in received.iter().zip(&buffers) {
                let query = &buffer[..*length];
                match answer(&records, query, Transport::Udp, shared.settings) {
                    Outcome::Reply(reply, summary) => {
                        replies.push(reply);
                        peers.push(*peer);
                        summaries.push(summary);
                    }
                    Outcome::Forward(summary) => {
                        if let Some(peer) = peer.as_ref().and_then(std_address) {
                            let query = query.to_vec();
                            let relayed = Relayed {
                                query,
                                peer,
                                summary,
                                started,
                            };
                            relay(socket, shared, runtime, relayed, Some);
                        }
                    }
                    Outcome::Chase(chase) => {
                        if let (Some(peer), Some(query)) =
                            (peer.as_ref().and_then(std_address), chase.query())
                        {
                            let summary = chase.summary;
                            let finish = move |reply: Vec<u8>| chase.complete(&reply);
                            let relayed = Relayed {
                                query,
                                peer,
                                summary,
                                started,
                            };
                            relay(socket, shared, runtime, relayed, finish);
                        }
                    }
                    Outcome::Drop => {}
                }
            }
        }
        if replies.is_empty() {
            continue;
        }
        let slices: Vec<[IoSlice<'_>; 1]> = replies.iter().map(|r| [IoSlice::new(r)]).collect();
        // sendmmsg stops at the first datagram the kernel refuses (a bad
        // peer address, say): skip that one and send the rest.
        let mut next = 0;
        while next < slices.len() {
            let no_control: [ControlMessage<'_>; 0] = [];
            let sent = sendmmsg(
                fd,
                &mut send_headers,
                slices[next..].iter(),
                &peers[next..],
                no_control,
                MsgFlags::empty(),
            );
            match sent {
                Ok(results) => next += results.count() + 1,
                Err(error) => {
                    tracing::debug!(%error, "DNS UDP send failed");
                    next += 1;
                }
            }
        }
        let took = started.elapsed();
        for summary in summaries {
            shared.metrics.query(summary, took);
        }
    }
}

/// A query for the upstream resolver, and for whom.
struct Relayed {
    query: Vec<u8>,
    peer: SocketAddr,
    summary: Summary,
    started: Instant,
}

/// Asks the upstream resolver off the UDP thread; `finish` turns its reply
/// into the answer, sent back from a clone of the serving socket.
fn relay(
    socket: &UdpSocket,
    shared: &Arc<Shared>,
    runtime: &tokio::runtime::Handle,
    relayed: Relayed,
    finish: impl FnOnce(Vec<u8>) -> Option<Vec<u8>> + Send + 'static,
) {
    let Relayed {
        query,
        peer,
        summary,
        started,
    } = relayed;
    let (Some(upstream), Ok(permit), Ok(reply_socket)) = (
        shared.upstream,
        shared.forwards.try_acquire(),
        socket.try_clone(),
    ) else {
        return;
    };
    permit.forget();
    let shared = shared.clone();
    runtime.spawn(async move {
        let reply = forward_udp(upstream, &query).await;
        shared.forwards.add_permits(1);
        match reply.map(finish) {
            Ok(Some(answer)) => {
                let _ = reply_socket.send_to(&answer, peer);
                shared.metrics.query(summary, started.elapsed());
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, "upstream query failed"),
        }
    });
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
            Outcome::Chase(chase) => {
                let (Some(upstream), Some(query)) = (shared.upstream, chase.query()) else {
                    return Ok(());
                };
                let reply = forward_udp(upstream, &query).await?;
                match chase.complete(&reply) {
                    Some(answer) => (answer, chase.summary),
                    None => return Ok(()),
                }
            }
            Outcome::Drop => return Ok(()),
        };
        // A client that does not read must not hold a connection for ever.
        tokio::time::timeout(TCP_IDLE, write_message(&mut stream, &reply))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "client did not read"))??;
        shared.metrics.query(summary, started.elapsed());
    }
}
