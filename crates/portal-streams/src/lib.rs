//! The Kubernetes streaming protocols, server side, as the kubelet speaks
//! them for `kubectl exec`, `attach` and `port-forward`:
//!
//! - [`websocket`]: the `channel.k8s.io` subprotocols (v1 to v5, and the
//!   base64 ones) — one WebSocket, each message prefixed by its channel —
//!   and the port-forward channels; also the tunnel that carries SPDY inside
//!   a WebSocket (`SPDY/3.1+portforward.k8s.io`, kubectl ≥ 1.30);
//! - [`spdy`]: SPDY/3.1 framing, header compression and flow control, with
//!   one SPDY stream per standard stream (what kubectl ≤ 1.29 speaks).
//!
//! Either way the caller gets the same thing: for exec and attach a
//! [`Streams`] (stdin and resize events in, stdout and stderr out, a final
//! [`Outcome`] on the error stream); for port-forward one [`Forward`] per
//! connection, a byte stream to splice onto a socket in the pod.

pub mod spdy;
mod status;
pub mod websocket;

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

pub use status::Outcome;

/// The protocol versions of the `X-Stream-Protocol-Version` header and the
/// WebSocket subprotocols: what the error stream carries depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// `channel.k8s.io`: no error stream contents but a message.
    V1,
    /// `v2.channel.k8s.io`: stdin and stdout and stderr streams only.
    V2,
    /// `v3.channel.k8s.io`: adds the resize stream.
    V3,
    /// `v4.channel.k8s.io`: the error stream carries a JSON `Status`.
    V4,
    /// `v5.channel.k8s.io`: WebSocket only; the client can close stdin.
    V5,
}

/// Which standard streams an exec or attach asked for (its query).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Wanted {
    /// From `stdin=true&stdout=true&stderr=true&tty=true` (`input`,
    /// `output` and `error` are the old spellings). A terminal has no
    /// separate stderr.
    pub fn from_query(query: &[(String, String)]) -> Self {
        let flag = |names: &[&str]| {
            query
                .iter()
                .any(|(k, v)| names.contains(&k.as_str()) && matches!(v.as_str(), "true" | "1"))
        };
        let tty = flag(&["tty"]);
        Wanted {
            stdin: flag(&["stdin", "input"]),
            stdout: flag(&["stdout", "output"]),
            stderr: flag(&["stderr", "error"]) && !tty,
            tty,
        }
    }

    /// At least one stream: a request with none is refused.
    pub fn any(&self) -> bool {
        self.stdin || self.stdout || self.stderr
    }
}

/// A terminal size change (`{"Width":80,"Height":24}` on the resize stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The most bytes of one piece of output or input passed along at a time.
pub const CHUNK: usize = 32 * 1024;

/// What the protocol side is asked to send.
#[derive(Debug)]
enum Outgoing {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The end: the outcome on the error stream, then every stream closed.
    Finish(Outcome, oneshot::Sender<()>),
}

/// The streams of one exec or attach, whatever the protocol.
#[derive(Debug)]
pub struct Streams {
    /// The client's input; `None` when it ends (closed or half-closed).
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    /// Terminal size changes (with a tty).
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    finish: mpsc::Sender<Outgoing>,
}

impl Streams {
    /// Sends the outcome and closes every stream cleanly (all output is
    /// delivered first), once output has been written.
    pub async fn finish(self, outcome: Outcome) {
        let (done, wait) = oneshot::channel();
        drop(self.stdout);
        drop(self.stderr);
        if self
            .finish
            .send(Outgoing::Finish(outcome, done))
            .await
            .is_ok()
        {
            let _ = wait.await;
        }
    }
}

/// Where stdout or stderr goes.
#[derive(Debug, Clone)]
pub struct Output {
    stderr: bool,
    sink: mpsc::Sender<Outgoing>,
}

impl Output {
    /// Sends output (waiting while the client is slow); false once the
    /// client is gone.
    pub async fn write(&self, data: Bytes) -> bool {
        let message = if self.stderr {
            Outgoing::Stderr(data)
        } else {
            Outgoing::Stdout(data)
        };
        self.sink.send(message).await.is_ok()
    }
}

/// The sending half a protocol builds [`Streams`] around.
fn outputs(
    wanted: Wanted,
) -> (
    Option<Output>,
    Option<Output>,
    mpsc::Sender<Outgoing>,
    mpsc::Receiver<Outgoing>,
) {
    let (sink, outgoing) = mpsc::channel(8);
    let make = |on: bool, stderr: bool| {
        on.then(|| Output {
            stderr,
            sink: sink.clone(),
        })
    };
    (
        make(wanted.stdout, false),
        make(wanted.stderr, true),
        sink.clone(),
        outgoing,
    )
}

/// One forwarded connection: bytes to and from `port` in the pod.
#[derive(Debug)]
pub struct Forward {
    pub port: u16,
    /// The client's side of the connection.
    pub stream: tokio::io::DuplexStream,
    /// Reports a failure (the port refused the connection) to the client.
    pub error: mpsc::Sender<String>,
}

/// Size of the in-memory pipe between a protocol and a forwarded socket.
const FORWARD_BUFFER: usize = 256 * 1024;
