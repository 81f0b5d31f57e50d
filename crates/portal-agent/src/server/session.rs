//! One streaming session on an upgraded connection: the protocol (from
//! `portal-streams`) gives the client's streams; this wires them to a
//! process run in the container (exec), to the container's attach socket
//! (attach), or to sockets opened inside the pod's network namespace
//! (port-forward).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use portal_streams::websocket::{self, Choice};
use portal_streams::{spdy, Forward, Outcome, Output, Streams, Version, Wanted, CHUNK};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::pods::Context;
use crate::runtime::{ExecSession, Runtime};
use crate::shim::attach as frames;

/// How long connecting to a port in the pod may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) enum Protocol {
    WebSocket(Choice),
    Spdy(Version),
}

#[derive(Debug)]
pub(super) enum Target {
    /// A command in this container (by runtime id).
    Exec(String, Vec<String>),
    /// This container's own streams.
    Attach(String),
    /// The pod's network namespace.
    Pod,
}

#[derive(Debug)]
pub(super) struct Session {
    pub protocol: Protocol,
    pub wanted: Wanted,
    pub target: Target,
    /// Port-forward over `channel.k8s.io`: the ports, from the query.
    pub ports: Vec<u16>,
    /// `namespace/name`, for messages.
    pub pod: String,
    pub pod_uid: String,
}

impl Session {
    pub(super) async fn run<R, S>(self, ctx: &Arc<Context<R>>, io: S)
    where
        R: Runtime,
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Session {
            protocol,
            wanted,
            target,
            ports,
            pod,
            pod_uid,
        } = self;
        if let Target::Pod = target {
            let netns = ctx.runtime.sandbox(&pod_uid).and_then(|s| s.netns);
            let place = Arc::new((netns, pod, pod_uid));
            let mut forwards = match protocol {
                Protocol::WebSocket(Choice::Channel(channel, _)) => {
                    let (tx, rx) = mpsc::channel(ports.len().max(1));
                    for forward in websocket::port_forward(io, channel, &ports) {
                        let _ = tx.try_send(forward);
                    }
                    rx
                }
                Protocol::WebSocket(Choice::SpdyTunnel) => {
                    spdy::port_forward(websocket::tunnel(io))
                }
                Protocol::Spdy(_) => spdy::port_forward(io),
            };
            while let Some(forward) = forwards.recv().await {
                tokio::spawn(forward_one(forward, place.clone()));
            }
            return;
        }
        let streams = match protocol {
            Protocol::WebSocket(Choice::Channel(channel, _)) => {
                websocket::exec(io, channel, wanted)
            }
            Protocol::WebSocket(Choice::SpdyTunnel) => return,
            Protocol::Spdy(version) => match spdy::exec(io, version, wanted).await {
                Ok(streams) => streams,
                Err(error) => {
                    tracing::debug!(%error, %pod, "exec session not set up");
                    return;
                }
            },
        };
        match target {
            Target::Exec(id, argv) => exec(ctx, &id, &argv, wanted, streams).await,
            Target::Attach(id) => attach(ctx, &id, streams).await,
            Target::Pod => {}
        }
    }
}

/// Copies a process's output to the client (or to nowhere, so that the
/// process never blocks on a full pipe).
async fn pump(from: Option<Box<dyn AsyncRead + Send + Unpin>>, to: Option<Output>) {
    let Some(mut from) = from else { return };
    let mut buffer = vec![0u8; CHUNK];
    let mut to = to;
    loop {
        // A terminal whose last user went away reads as an error (EIO).
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(output) = &to {
            if !output.write(Bytes::copy_from_slice(&buffer[..n])).await {
                to = None;
            }
        }
    }
}

/// How long a terminal session waits for the client's first size, which
/// the command should start with (kubectl sends it at once).
const FIRST_SIZE_WAIT: Duration = Duration::from_millis(500);

async fn exec<R: Runtime>(
    ctx: &Context<R>,
    id: &str,
    argv: &[String],
    wanted: Wanted,
    mut streams: Streams,
) {
    let mut size = None;
    if let Some(sizes) = streams.resize.as_mut() {
        if let Ok(Some(first)) = tokio::time::timeout(FIRST_SIZE_WAIT, sizes.recv()).await {
            size = Some((first.width, first.height));
        }
    }
    let session = match ctx
        .runtime
        .exec_session(id, argv, wanted.stdin, wanted.tty, size)
        .await
    {
        Ok(session) => session,
        Err(error) => {
            let why = format!("error executing command in container: {error}");
            streams.finish(Outcome::Failed(why)).await;
            return;
        }
    };
    let ExecSession {
        mut child,
        stdin,
        stdout,
        stderr,
        terminal,
    } = session;
    if let (Some(mut input), Some(mut to)) = (streams.stdin.take(), stdin.filter(|_| wanted.stdin))
    {
        tokio::spawn(async move {
            while let Some(data) = input.recv().await {
                if to.write_all(&data).await.is_err() || to.flush().await.is_err() {
                    return;
                }
            }
            // The client's end of input is the process's.
            let _ = to.shutdown().await;
        });
    }
    if let (Some(mut sizes), Some(terminal)) = (streams.resize.take(), terminal) {
        tokio::spawn(async move {
            while let Some(size) = sizes.recv().await {
                let _ = terminal.resize(size.width, size.height);
            }
        });
    }
    let (status, (), ()) = tokio::join!(
        child.wait(),
        pump(stdout, streams.stdout.clone()),
        pump(stderr, streams.stderr.clone())
    );
    let outcome = match status {
        Ok(status) => Outcome::Exited(
            status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1),
        ),
        Err(error) => Outcome::Failed(format!("error executing command in container: {error}")),
    };
    streams.finish(outcome).await;
}

async fn write_frame(
    to: &mut (impl AsyncWrite + Unpin),
    kind: u8,
    data: &[u8],
) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(5 + data.len());
    frame.push(kind);
    frame.extend_from_slice(&(data.len() as u32).to_be_bytes());
    frame.extend_from_slice(data);
    to.write_all(&frame).await
}

async fn read_frame(from: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).await.ok()?;
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length > 1 << 20 {
        return None;
    }
    let mut data = vec![0u8; length];
    from.read_exact(&mut data).await.ok()?;
    Some((head[0], data))
}

async fn attach<R: Runtime>(ctx: &Context<R>, id: &str, mut streams: Streams) {
    let socket = match tokio::net::UnixStream::connect(ctx.runtime.attach_socket(id)).await {
        Ok(socket) => socket,
        Err(error) => {
            let why = format!("error attaching to container: {error}");
            streams.finish(Outcome::Failed(why)).await;
            return;
        }
    };
    let (mut from_shim, mut to_shim) = socket.into_split();
    let (frames_tx, mut frames_rx) = mpsc::channel::<(u8, Vec<u8>)>(8);
    if let Some(mut input) = streams.stdin.take() {
        let tx = frames_tx.clone();
        tokio::spawn(async move {
            while let Some(data) = input.recv().await {
                if tx.send((frames::STDIN, data.to_vec())).await.is_err() {
                    return;
                }
            }
            let _ = tx.send((frames::CLOSE_STDIN, Vec::new())).await;
        });
    }
    if let Some(mut sizes) = streams.resize.take() {
        let tx = frames_tx.clone();
        tokio::spawn(async move {
            while let Some(size) = sizes.recv().await {
                let mut data = size.width.to_be_bytes().to_vec();
                data.extend_from_slice(&size.height.to_be_bytes());
                if tx.send((frames::RESIZE, data)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(frames_tx);
    tokio::spawn(async move {
        while let Some((kind, data)) = frames_rx.recv().await {
            if write_frame(&mut to_shim, kind, &data).await.is_err() {
                return;
            }
        }
    });
    // Output until the container ends (the shim closes the socket) or the
    // client goes away.
    while let Some((kind, data)) = read_frame(&mut from_shim).await {
        let output = match kind {
            frames::STDOUT => streams.stdout.as_ref(),
            frames::STDERR => streams.stderr.as_ref(),
            _ => None,
        };
        if let Some(output) = output {
            if !output.write(Bytes::from(data)).await {
                break;
            }
        }
    }
    streams.finish(Outcome::Exited(0)).await;
}

/// Connects to `port` on the pod's loopback, from inside its network
/// namespace (a thread of its own enters it, and ends with it).
async fn connect_in(netns: Option<PathBuf>, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("port-forward".into())
        .spawn(move || {
            let connect = || -> std::io::Result<std::net::TcpStream> {
                if let Some(netns) = &netns {
                    let file = std::fs::File::open(netns)?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                }
                let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let tcp = std::net::TcpStream::connect_timeout(&address, CONNECT_TIMEOUT)?;
                tcp.set_nonblocking(true)?;
                let _ = tcp.set_nodelay(true);
                Ok(tcp)
            };
            let _ = tx.send(connect());
        })?;
    let tcp = rx
        .await
        .map_err(|_| std::io::Error::other("the connecting thread died"))??;
    tokio::net::TcpStream::from_std(tcp)
}

async fn forward_one(forward: Forward, place: Arc<(Option<PathBuf>, String, String)>) {
    let (netns, pod, uid) = &*place;
    let Forward {
        port,
        mut stream,
        error,
    } = forward;
    match connect_in(netns.clone(), port).await {
        Ok(mut tcp) => {
            let _ = tokio::io::copy_bidirectional_with_sizes(
                &mut stream,
                &mut tcp,
                CHUNK * 2,
                CHUNK * 2,
            )
            .await;
        }
        Err(e) => {
            let message = format!("error forwarding port {port} to pod {pod}, uid {uid}: {e}");
            let _ = error.send(message).await;
        }
    }
}
