//! The WebSocket side: `channel.k8s.io` subprotocols for exec and attach
//! (every binary message is one channel byte then data: 0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize; v5 adds 255 = "close this channel"; the
//! base64 variants send text messages, an ASCII channel digit then base64),
//! the same framing for port-forward (per port two channels, data and
//! error, each opened by the port number), and [`tunnel`], which turns a
//! WebSocket carrying `SPDY/3.1+portforward.k8s.io` back into a byte
//! stream for [`crate::spdy`].
//!
//! The HTTP upgrade itself is the server's job: [`choose`] picks the
//! subprotocol and [`accept_key`] answers the key; the upgraded connection
//! is then handed to [`exec`], [`port_forward`] or [`tunnel`].

use std::time::Duration;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::{outputs, Forward, Outgoing, Streams, Version, Wanted, CHUNK, FORWARD_BUFFER};

/// The subprotocol a port-forward client asks for to tunnel SPDY.
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: `[255, channel]` closes that channel (the client's stdin).
const CLOSE: u8 = 255;

/// How long a finished session waits for the client's close reply.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A negotiated `channel.k8s.io` subprotocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protocol {
    pub version: Version,
    /// Text messages with base64 data instead of binary ones.
    pub base64: bool,
}

/// What a WebSocket client may be answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Channel(Protocol, &'static str),
    /// SPDY inside the WebSocket (port-forward only).
    SpdyTunnel,
}

impl Choice {
    /// The `Sec-WebSocket-Protocol` to answer with.
    pub fn name(&self) -> &'static str {
        match self {
            Choice::Channel(_, name) => name,
            Choice::SpdyTunnel => SPDY_TUNNEL,
        }
    }
}

const CHANNEL_PROTOCOLS: [(&str, Version, bool); 7] = [
    ("v5.channel.k8s.io", Version::V5, false),
    ("v4.channel.k8s.io", Version::V4, false),
    ("v3.channel.k8s.io", Version::V3, false),
    ("v2.channel.k8s.io", Version::V2, false),
    ("channel.k8s.io", Version::V1, false),
    ("v4.base64.channel.k8s.io", Version::V4, true),
    ("base64.channel.k8s.io", Version::V1, true),
];

/// The first subprotocol the client offers (in its order) that is served;
/// `tunnel` allows SPDY inside the WebSocket (port-forward).
pub fn choose<'a>(offered: impl IntoIterator<Item = &'a str>, tunnel: bool) -> Option<Choice> {
    offered
        .into_iter()
        .flat_map(|header| header.split(','))
        .map(str::trim)
        .find_map(|name| {
            if tunnel && name.eq_ignore_ascii_case(SPDY_TUNNEL) {
                return Some(Choice::SpdyTunnel);
            }
            CHANNEL_PROTOCOLS
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(n, version, base64)| {
                    Choice::Channel(
                        Protocol {
                            version: *version,
                            base64: *base64,
                        },
                        n,
                    )
                })
        })
}

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key)
}

fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

async fn socket<S>(io: S) -> WebSocketStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let config = WebSocketConfig::default()
        .max_message_size(Some(16 << 20))
        .max_frame_size(Some(16 << 20));
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

fn frame(protocol: Protocol, channel: u8, data: &[u8]) -> Message {
    if protocol.base64 {
        let mut text = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        text.push(char::from(b'0' + channel % 10));
        base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
        Message::text(text)
    } else {
        let mut bytes = BytesMut::with_capacity(1 + data.len());
        bytes.extend_from_slice(&[channel]);
        bytes.extend_from_slice(data);
        Message::Binary(bytes.freeze())
    }
}

/// A received data message: its channel and data; `None` for anything
/// else (pings, malformed messages).
fn unframe(protocol: Protocol, message: Message) -> Option<(u8, Bytes)> {
    match message {
        Message::Binary(bytes) if !protocol.base64 && !bytes.is_empty() => {
            Some((bytes[0], bytes.slice(1..)))
        }
        // The Python client sends text input as text messages, channel
        // byte included; the kubelet takes them as bytes too.
        Message::Text(text) if !protocol.base64 && !text.is_empty() => {
            let bytes = Bytes::from(text);
            Some((bytes[0], bytes.slice(1..)))
        }
        Message::Text(text) if protocol.base64 && !text.is_empty() => {
            let channel = text.as_bytes()[0].checked_sub(b'0')?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(&text.as_bytes()[1..])
                .ok()?;
            Some((channel, Bytes::from(data)))
        }
        _ => None,
    }
}

/// Runs an exec or attach session on an upgraded connection.
pub fn exec<S>(io: S, protocol: Protocol, wanted: Wanted) -> Streams
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (stdout, stderr, finish, mut outgoing) = outputs(wanted);
    let (stdin_tx, stdin) = mpsc::channel::<Bytes>(8);
    let (resize_tx, resize) = mpsc::channel(4);
    tokio::spawn(async move {
        let (mut sink, mut source) = socket(io).await.split();
        let reader = tokio::spawn(async move {
            let mut stdin = Some(stdin_tx);
            while let Some(Ok(message)) = source.next().await {
                let Some((channel, data)) = unframe(protocol, message) else {
                    continue;
                };
                match channel {
                    STDIN => {
                        if let Some(tx) = &stdin {
                            if tx.send(data).await.is_err() {
                                stdin = None;
                            }
                        }
                    }
                    RESIZE => {
                        if let Ok(size) = serde_json::from_slice(&data) {
                            let _ = resize_tx.try_send(size);
                        }
                    }
                    CLOSE if protocol.version >= Version::V5 && data.first() == Some(&STDIN) => {
                        stdin = None;
                    }
                    _ => {}
                }
            }
        });
        // One empty message on the lowest channel this session writes
        // tells the client the session is up, as the kubelet does.
        let first = if wanted.stdout {
            STDOUT
        } else if wanted.stderr {
            STDERR
        } else {
            ERROR
        };
        if sink.send(frame(protocol, first, &[])).await.is_err() {
            return;
        }
        while let Some(first) = outgoing.recv().await {
            // What is queued goes out in one flush.
            let mut next = Some(first);
            while let Some(message) = next {
                let fed = match message {
                    Outgoing::Stdout(data) => sink.feed(frame(protocol, STDOUT, &data)).await,
                    Outgoing::Stderr(data) => sink.feed(frame(protocol, STDERR, &data)).await,
                    Outgoing::Finish(outcome, done) => {
                        if let Some(status) = outcome.encode(protocol.version) {
                            let _ = sink.feed(frame(protocol, ERROR, &status)).await;
                        }
                        // A close frame (1000: Go clients take anything
                        // else for an error), then the client's reply: the
                        // output before it is never cut off.
                        let _ = sink.send(normal_close()).await;
                        let _ = sink.close().await;
                        let _ = tokio::time::timeout(CLOSE_WAIT, reader).await;
                        let _ = done.send(());
                        return;
                    }
                };
                if fed.is_err() {
                    return;
                }
                next = outgoing.try_recv().ok();
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    Streams {
        stdin: wanted.stdin.then_some(stdin),
        resize: wanted.tty.then_some(resize),
        stdout,
        stderr,
        finish,
    }
}

/// Runs a port-forward session over `channel.k8s.io` (the Python client's
/// way): one connection per port of `ports`, on channels 2i (data) and
/// 2i+1 (error), each opened by the port number (little-endian).
pub fn port_forward<S>(io: S, protocol: Protocol, ports: &[u16]) -> Vec<Forward>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(16);
    let mut forwards = Vec::new();
    let mut inputs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let Ok(data_channel) = u8::try_from(2 * i) else {
            break;
        };
        let (ours, theirs) = tokio::io::duplex(FORWARD_BUFFER);
        let (mut from_pod, to_pod) = tokio::io::split(ours);
        inputs.push(to_pod);
        let (error, mut errors) = mpsc::channel::<String>(1);
        forwards.push(Forward {
            port: *port,
            stream: theirs,
            error,
        });
        let out = out_tx.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; CHUNK];
            loop {
                tokio::select! {
                    read = from_pod.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => if out.send((data_channel, Bytes::copy_from_slice(&buffer[..n]))).await.is_err() { break },
                    },
                    Some(message) = errors.recv() => {
                        let _ = out.send((data_channel + 1, Bytes::from(message))).await;
                    }
                }
            }
        });
    }
    drop(out_tx);
    let announce: Vec<(u8, u16)> = ports
        .iter()
        .take(forwards.len())
        .enumerate()
        .flat_map(|(i, port)| [(2 * i as u8, *port), (2 * i as u8 + 1, *port)])
        .collect();
    tokio::spawn(async move {
        let (mut sink, mut source) = socket(io).await.split();
        for (channel, port) in announce {
            if sink
                .send(frame(protocol, channel, &port.to_le_bytes()))
                .await
                .is_err()
            {
                return;
            }
        }
        let reader = async move {
            while let Some(Ok(message)) = source.next().await {
                let Some((channel, data)) = unframe(protocol, message) else {
                    continue;
                };
                if channel % 2 == 0 {
                    if let Some(input) = inputs.get_mut(usize::from(channel / 2)) {
                        if input.write_all(&data).await.is_err() {
                            continue;
                        }
                    }
                }
            }
            for mut input in inputs {
                let _ = input.shutdown().await;
            }
        };
        let writer = async {
            while let Some((channel, data)) = out_rx.recv().await {
                if sink.send(frame(protocol, channel, &data)).await.is_err() {
                    return;
                }
            }
            let _ = sink.send(normal_close()).await;
            let _ = sink.close().await;
        };
        tokio::join!(reader, writer);
    });
    forwards
}

/// The byte stream inside a WebSocket whose binary messages carry it (the
/// SPDY port-forward tunnel): reads what the client sends, and sends what
/// is written as binary messages.
pub fn tunnel<S>(io: S) -> tokio::io::DuplexStream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(FORWARD_BUFFER);
    tokio::spawn(async move {
        let (mut sink, mut source) = socket(io).await.split();
        let (mut from_inside, mut to_inside) = tokio::io::split(ours);
        let inbound = async move {
            while let Some(Ok(message)) = source.next().await {
                if let Message::Binary(data) = message {
                    if to_inside.write_all(&data).await.is_err() {
                        break;
                    }
                }
            }
            let _ = to_inside.shutdown().await;
        };
        let outbound = async move {
            let mut buffer = vec![0u8; CHUNK];
            loop {
                match from_inside.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let data = Bytes::copy_from_slice(&buffer[..n]);
                        if sink.send(Message::Binary(data)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = sink.send(normal_close()).await;
            let _ = sink.close().await;
        };
        tokio::join!(inbound, outbound);
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_first_served_protocol_wins() {
        let offered = ["v5.channel.k8s.io, v4.channel.k8s.io"];
        assert!(matches!(
            choose(offered, false),
            Some(Choice::Channel(p, "v5.channel.k8s.io")) if p.version == Version::V5
        ));
        assert_eq!(choose(["nope", "SPDY/3.1+portforward.k8s.io"], false), None);
        assert_eq!(
            choose(["SPDY/3.1+portforward.k8s.io", "v4.channel.k8s.io"], true),
            Some(Choice::SpdyTunnel)
        );
        assert!(matches!(
            choose(["base64.channel.k8s.io"], false),
            Some(Choice::Channel(p, _)) if p.base64
        ));
    }

    #[test]
    fn frames_round_trip_in_both_encodings() {
        for base64 in [false, true] {
            let protocol = Protocol {
                version: Version::V4,
                base64,
            };
            let message = frame(protocol, STDERR, b"hi");
            assert_eq!(
                unframe(protocol, message),
                Some((STDERR, Bytes::from_static(b"hi")))
            );
        }
    }
}
