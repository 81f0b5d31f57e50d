//! SPDY/3.1 as Kubernetes uses it (kubectl ≤ 1.29 for exec and attach,
//! every kubectl for port-forward): the client opens one stream per
//! standard stream (header `streamtype`: `error`, `stdin`, `stdout`,
//! `stderr`, `resize`) or per forwarded connection (`streamtype` `error`
//! and `data`, with `port` and `requestid`), the server replies to each and
//! writes data frames; FIN ends one direction of a stream.
//!
//! Like the Go implementation both sides use (moby/spdystream), there is no
//! per-stream flow control: TCP's is the only back-pressure, so window
//! updates are accepted and ignored, and none is needed for the peer to
//! send more than a window's worth.

pub mod frame;
pub mod headers;

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::{
    outputs, Forward, Outgoing, Streams, TerminalSize, Version, Wanted, CHUNK, FORWARD_BUFFER,
};
use frame::{Frame, FLAG_FIN};
use headers::{Compressor, Decompressor, Headers};

/// How long a session waits for the client to open its streams.
const STREAM_WAIT: Duration = Duration::from_secs(30);
/// How long a finished session waits for the client to hang up.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the `X-Stream-Protocol-Version` header may pick for exec/attach.
pub const EXEC_PROTOCOLS: [(&str, Version); 4] = [
    ("v4.channel.k8s.io", Version::V4),
    ("v3.channel.k8s.io", Version::V3),
    ("v2.channel.k8s.io", Version::V2),
    ("channel.k8s.io", Version::V1),
];
/// The one port-forward protocol.
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// The first protocol the client offers (in its order) that is served.
pub fn choose_exec<'a>(
    offered: impl IntoIterator<Item = &'a str>,
) -> Option<(&'static str, Version)> {
    offered
        .into_iter()
        .flat_map(|h| h.split(','))
        .map(str::trim)
        .find_map(|name| EXEC_PROTOCOLS.iter().find(|(n, _)| *n == name).copied())
}

/// A stream the client opened.
#[derive(Debug)]
pub struct Opened {
    pub id: u32,
    pub headers: Headers,
    /// Its data; ends at the client's FIN (or reset).
    pub data: mpsc::Receiver<Bytes>,
}

impl Opened {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
enum Command {
    Reply(u32),
    Data(u32, Bytes, bool),
    Reset(u32, u32),
    Ping(u32),
}

/// Writes to the connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sender(mpsc::Sender<Command>);

impl Sender {
    /// Data on a stream, in pieces of at most [`CHUNK`]; `fin` ends it.
    pub async fn data(&self, stream: u32, data: Bytes, fin: bool) -> bool {
        let mut rest = data;
        while rest.len() > CHUNK {
            let piece = rest.split_to(CHUNK);
            if self
                .0
                .send(Command::Data(stream, piece, false))
                .await
                .is_err()
            {
                return false;
            }
        }
        self.0.send(Command::Data(stream, rest, fin)).await.is_ok()
    }

    pub async fn reset(&self, stream: u32, status: u32) {
        let _ = self.0.send(Command::Reset(stream, status)).await;
    }
}

/// A SPDY connection, server side.
#[derive(Debug)]
pub struct Connection {
    /// Streams as the client opens them (each already replied to).
    pub opened: mpsc::Receiver<Opened>,
    pub sender: Sender,
    writer: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl Connection {
    /// Starts serving SPDY on an upgraded connection.
    pub fn serve<S>(io: S) -> Connection
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (commands, queue) = mpsc::channel(32);
        let (opened_tx, opened) = mpsc::channel(16);
        let writer = tokio::spawn(write_frames(write, queue));
        let reader = tokio::spawn(read_frames(read, Sender(commands.clone()), opened_tx));
        Connection {
            opened,
            sender: Sender(commands),
            writer,
            reader,
        }
    }

    /// Flushes what was sent, then gives the client a moment to hang up.
    pub async fn close(self) {
        let Connection {
            sender,
            writer,
            reader,
            opened,
        } = self;
        drop(sender);
        drop(opened);
        let _ = writer.await;
        let _ = tokio::time::timeout(CLOSE_WAIT, reader).await;
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut io: W, mut queue: mpsc::Receiver<Command>) {
    let mut compressor = Compressor::new();
    let mut out = BytesMut::with_capacity(CHUNK + 64);
    while let Some(command) = queue.recv().await {
        let mut next = Some(command);
        // Everything queued goes out in one write.
        while let Some(command) = next {
            let frame = match command {
                Command::Reply(stream) => match compressor.encode(&[]) {
                    Ok(headers) => Frame::SynReply {
                        stream,
                        flags: 0,
                        headers,
                    },
                    Err(_) => Frame::RstStream {
                        stream,
                        status: frame::PROTOCOL_ERROR,
                    },
                },
                Command::Data(stream, data, fin) => Frame::Data {
                    stream,
                    flags: if fin { FLAG_FIN } else { 0 },
                    data,
                },
                Command::Reset(stream, status) => Frame::RstStream { stream, status },
                Command::Ping(id) => Frame::Ping(id),
            };
            frame::encode(&frame, &mut out);
            next = if out.len() < CHUNK {
                queue.try_recv().ok()
            } else {
                None
            };
        }
        if io.write_all(&out).await.is_err() || io.flush().await.is_err() {
            return;
        }
        out.clear();
    }
    let _ = io.shutdown().await;
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut io: R,
    sender: Sender,
    opened: mpsc::Sender<Opened>,
) {
    let mut decompressor = Decompressor::new();
    let mut streams: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut buffer = BytesMut::with_capacity(64 * 1024);
    loop {
        let frame = match frame::decode(&mut buffer) {
            Ok(Some(frame)) => frame,
            Ok(None) => match io.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            Err(error) => {
                tracing::debug!(%error, "SPDY: bad frame; closing");
                return;
            }
        };
        match frame {
            Frame::SynStream {
                stream,
                flags,
                headers,
                ..
            } => {
                let headers = match decompressor.decode(&headers) {
                    Ok(headers) => headers,
                    Err(error) => {
                        // The shared compression state is lost: the end.
                        tracing::debug!(%error, "SPDY: bad header block; closing");
                        return;
                    }
                };
                if stream == 0 || streams.contains_key(&stream) {
                    sender.reset(stream, frame::PROTOCOL_ERROR).await;
                    continue;
                }
                let (tx, data) = mpsc::channel(16);
                if flags & FLAG_FIN == 0 {
                    streams.insert(stream, tx);
                }
                let _ = sender.0.send(Command::Reply(stream)).await;
                let _ = opened
                    .send(Opened {
                        id: stream,
                        headers,
                        data,
                    })
                    .await;
            }
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                if let Some(tx) = streams.get(&stream) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        // Nobody reads this stream any more: drop its data.
                    }
                }
                if flags & FLAG_FIN != 0 {
                    streams.remove(&stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                streams.remove(&stream);
            }
            Frame::Ping(id) => {
                let _ = sender.0.send(Command::Ping(id)).await;
            }
            Frame::GoAway { .. } => return,
            Frame::Headers { headers, .. } => {
                // Keeps the compression state in step.
                if decompressor.decode(&headers).is_err() {
                    return;
                }
            }
            Frame::SynReply { .. }
            | Frame::Settings(_)
            | Frame::WindowUpdate { .. }
            | Frame::Unknown(_) => {}
        }
    }
}

/// Runs an exec or attach session: waits for the client's streams, then
/// hands them over.
pub async fn exec<S>(io: S, version: Version, wanted: Wanted) -> Result<Streams, String>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut connection = Connection::serve(io);
    let mut expected = vec!["error"];
    if wanted.stdin {
        expected.push("stdin");
    }
    if wanted.stdout {
        expected.push("stdout");
    }
    if wanted.stderr {
        expected.push("stderr");
    }
    if wanted.tty && version >= Version::V3 {
        expected.push("resize");
    }
    let mut streams: HashMap<String, Opened> = HashMap::new();
    let wait = tokio::time::timeout(STREAM_WAIT, async {
        while expected.iter().any(|e| !streams.contains_key(*e)) {
            let Some(opened) = connection.opened.recv().await else {
                return false;
            };
            let kind = opened.header("streamtype").unwrap_or("").to_owned();
            streams.insert(kind, opened);
        }
        true
    })
    .await;
    if !matches!(wait, Ok(true)) {
        connection.close().await;
        return Err(format!(
            "the client did not open the {} streams in time",
            expected.join(", ")
        ));
    }
    let mut take = |kind: &str| streams.remove(kind);
    let (error, stdin, stdout_stream, stderr_stream, resize_stream) = (
        take("error"),
        take("stdin"),
        take("stdout"),
        take("stderr"),
        take("resize"),
    );
    let (stdout, stderr, finish, mut outgoing) = outputs(wanted);
    let resize = resize_stream.map(|stream| {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(read_resizes(stream.data, tx));
        rx
    });
    let ids = (
        error.as_ref().map(|s| s.id),
        stdout_stream.as_ref().map(|s| s.id),
        stderr_stream.as_ref().map(|s| s.id),
    );
    tokio::spawn(async move {
        let sender = connection.sender.clone();
        let (error_id, out_id, err_id) = ids;
        while let Some(message) = outgoing.recv().await {
            match message {
                Outgoing::Stdout(data) => {
                    if let Some(id) = out_id {
                        sender.data(id, data, false).await;
                    }
                }
                Outgoing::Stderr(data) => {
                    if let Some(id) = err_id {
                        sender.data(id, data, false).await;
                    }
                }
                Outgoing::Finish(outcome, done) => {
                    if let (Some(id), Some(status)) = (error_id, outcome.encode(version)) {
                        sender.data(id, Bytes::from(status), false).await;
                    }
                    for id in [error_id, out_id, err_id].into_iter().flatten() {
                        sender.data(id, Bytes::new(), true).await;
                    }
                    drop(sender);
                    connection.close().await;
                    let _ = done.send(());
                    return;
                }
            }
        }
    });
    Ok(Streams {
        stdin: stdin.map(|s| s.data),
        resize,
        stdout,
        stderr,
        finish,
    })
}

/// The resize stream: JSON objects, one after another.
async fn read_resizes(mut data: mpsc::Receiver<Bytes>, sizes: mpsc::Sender<TerminalSize>) {
    let mut pending = Vec::new();
    while let Some(chunk) = data.recv().await {
        pending.extend_from_slice(&chunk);
        let mut objects =
            serde_json::Deserializer::from_slice(&pending).into_iter::<TerminalSize>();
        let mut used = 0;
        while let Some(Ok(size)) = objects.next() {
            used = objects.byte_offset();
            let _ = sizes.try_send(size);
        }
        pending.drain(..used);
        if pending.len() > 4096 {
            pending.clear();
        }
    }
}

/// Runs a port-forward session: every pair of streams the client opens
/// (`error` and `data` with one `requestid`) becomes a [`Forward`].
pub fn port_forward<S>(io: S) -> mpsc::Receiver<Forward>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (forwards, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut connection = Connection::serve(io);
        let sender = connection.sender.clone();
        let mut halves: HashMap<String, Opened> = HashMap::new();
        while let Some(opened) = connection.opened.recv().await {
            let request = opened.header("requestid").unwrap_or("").to_owned();
            let Some(other) = halves.remove(&request) else {
                halves.insert(request, opened);
                // A client opens both at once; a lone half is dropped
                // with the connection.
                continue;
            };
            let (data, error) = if opened.header("streamtype") == Some("data") {
                (opened, other)
            } else {
                (other, opened)
            };
            let port = data.header("port").and_then(|p| p.parse::<u16>().ok());
            let (Some(port), Some("data"), Some("error")) = (
                port.filter(|p| *p != 0),
                data.header("streamtype"),
                error.header("streamtype"),
            ) else {
                sender.reset(data.id, frame::PROTOCOL_ERROR).await;
                sender.reset(error.id, frame::PROTOCOL_ERROR).await;
                continue;
            };
            let forward = forward_pair(&sender, data, error.id, port);
            if forwards.send(forward).await.is_err() {
                break;
            }
        }
        drop(sender);
        connection.close().await;
    });
    rx
}

fn forward_pair(sender: &Sender, data: Opened, error_id: u32, port: u16) -> Forward {
    let (ours, theirs) = tokio::io::duplex(FORWARD_BUFFER);
    let (mut from_pod, mut to_pod) = tokio::io::split(ours);
    let (error, mut errors) = mpsc::channel::<String>(1);
    let data_id = data.id;
    let mut inbound = data.data;
    tokio::spawn(async move {
        while let Some(chunk) = inbound.recv().await {
            if to_pod.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    });
    let sender = sender.clone();
    tokio::spawn(async move {
        let mut buffer = vec![0u8; CHUNK];
        let mut failed = false;
        loop {
            tokio::select! {
                biased;
                Some(message) = errors.recv(), if !failed => {
                    failed = true;
                    sender.data(error_id, Bytes::from(message), false).await;
                }
                read = from_pod.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if !sender.data(data_id, Bytes::copy_from_slice(&buffer[..n]), false).await {
                            return;
                        }
                    }
                },
            }
        }
        if let (false, Ok(message)) = (failed, errors.try_recv()) {
            sender.data(error_id, Bytes::from(message), false).await;
        }
        sender.data(data_id, Bytes::new(), true).await;
        sender.data(error_id, Bytes::new(), true).await;
    });
    Forward {
        port,
        stream: theirs,
        error,
    }
}
