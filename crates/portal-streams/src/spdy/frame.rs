//! SPDY/3.1 frames: an 8-byte header (control frames: the high bit, the
//! version 3, the type; data frames: the stream id; then 8 bits of flags
//! and a 24-bit length) and the payloads the streaming protocols use. Header
//! blocks are left compressed here; [`super::headers`] deals with them.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const VERSION: u16 = 3;
/// The last frame of a stream from this side.
pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// The largest payload a frame may announce (24 bits).
pub const MAX_LENGTH: usize = (1 << 24) - 1;

/// `RST_STREAM` status codes used here.
pub const PROTOCOL_ERROR: u32 = 1;
pub const CANCEL: u32 = 5;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Bytes,
    },
    SynReply {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings(Bytes),
    Ping(u32),
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    Data {
        stream: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type this side does not know: ignored, as the
    /// protocol asks.
    Unknown(u16),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("SPDY version {0} is not supported")]
    Version(u16),
    #[error("a {0} frame is too short")]
    Short(&'static str),
}

const STREAM_MASK: u32 = 0x7fff_ffff;

/// Takes one whole frame off the front of `buffer`; `Ok(None)` when more
/// bytes are needed.
pub fn decode(buffer: &mut BytesMut) -> Result<Option<Frame>, Error> {
    if buffer.len() < 8 {
        return Ok(None);
    }
    let length =
        (usize::from(buffer[5]) << 16) | (usize::from(buffer[6]) << 8) | usize::from(buffer[7]);
    if buffer.len() < 8 + length {
        buffer.reserve(8 + length - buffer.len());
        return Ok(None);
    }
    let mut head = buffer.split_to(8);
    let mut payload = buffer.split_to(length).freeze();
    let first = head.get_u32();
    let flags = head[0];
    if first & 0x8000_0000 == 0 {
        return Ok(Some(Frame::Data {
            stream: first & STREAM_MASK,
            flags,
            data: payload,
        }));
    }
    let version = ((first >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(Error::Version(version));
    }
    let kind = (first & 0xffff) as u16;
    let need = |n: usize, name: &'static str| {
        if payload.len() < n {
            Err(Error::Short(name))
        } else {
            Ok(())
        }
    };
    let frame = match kind {
        SYN_STREAM => {
            need(10, "SYN_STREAM")?;
            let stream = payload.get_u32() & STREAM_MASK;
            let associated = payload.get_u32() & STREAM_MASK;
            let priority = payload.get_u8() >> 5;
            let _slot = payload.get_u8();
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                headers: payload,
            }
        }
        SYN_REPLY => {
            need(4, "SYN_REPLY")?;
            Frame::SynReply {
                stream: payload.get_u32() & STREAM_MASK,
                flags,
                headers: payload,
            }
        }
        RST_STREAM => {
            need(8, "RST_STREAM")?;
            Frame::RstStream {
                stream: payload.get_u32() & STREAM_MASK,
                status: payload.get_u32(),
            }
        }
        SETTINGS => Frame::Settings(payload),
        PING => {
            need(4, "PING")?;
            Frame::Ping(payload.get_u32())
        }
        GOAWAY => {
            need(4, "GOAWAY")?;
            let last_good = payload.get_u32() & STREAM_MASK;
            let status = if payload.len() >= 4 {
                payload.get_u32()
            } else {
                0
            };
            Frame::GoAway { last_good, status }
        }
        HEADERS => {
            need(4, "HEADERS")?;
            Frame::Headers {
                stream: payload.get_u32() & STREAM_MASK,
                flags,
                headers: payload,
            }
        }
        WINDOW_UPDATE => {
            need(8, "WINDOW_UPDATE")?;
            Frame::WindowUpdate {
                stream: payload.get_u32() & STREAM_MASK,
                delta: payload.get_u32() & STREAM_MASK,
            }
        }
        other => Frame::Unknown(other),
    };
    Ok(Some(frame))
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, length: usize) {
    out.put_u32(0x8000_0000 | (u32::from(VERSION) << 16) | u32::from(kind));
    out.put_u32((u32::from(flags) << 24) | (length as u32 & 0x00ff_ffff));
}

/// Appends `frame` to `out`. Payloads longer than [`MAX_LENGTH`] are the
/// caller's mistake (data is sent in small pieces).
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Data {
            stream,
            flags,
            data,
        } => {
            out.put_u32(stream & STREAM_MASK);
            out.put_u32((u32::from(*flags) << 24) | (data.len() as u32 & 0x00ff_ffff));
            out.extend_from_slice(data);
        }
        Frame::SynStream {
            stream,
            associated,
            priority,
            flags,
            headers,
        } => {
            control(out, SYN_STREAM, *flags, 10 + headers.len());
            out.put_u32(*stream);
            out.put_u32(*associated);
            out.put_u8(priority << 5);
            out.put_u8(0);
            out.extend_from_slice(headers);
        }
        Frame::SynReply {
            stream,
            flags,
            headers,
        } => {
            control(out, SYN_REPLY, *flags, 4 + headers.len());
            out.put_u32(*stream);
            out.extend_from_slice(headers);
        }
        Frame::Headers {
            stream,
            flags,
            headers,
        } => {
            control(out, HEADERS, *flags, 4 + headers.len());
            out.put_u32(*stream);
            out.extend_from_slice(headers);
        }
        Frame::RstStream { stream, status } => {
            control(out, RST_STREAM, 0, 8);
            out.put_u32(*stream);
            out.put_u32(*status);
        }
        Frame::Settings(payload) => {
            control(out, SETTINGS, 0, payload.len());
            out.extend_from_slice(payload);
        }
        Frame::Ping(id) => {
            control(out, PING, 0, 4);
            out.put_u32(*id);
        }
        Frame::GoAway { last_good, status } => {
            control(out, GOAWAY, 0, 8);
            out.put_u32(*last_good);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream, delta } => {
            control(out, WINDOW_UPDATE, 0, 8);
            out.put_u32(*stream);
            out.put_u32(*delta);
        }
        Frame::Unknown(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 2,
                flags: FLAG_FIN,
                headers: Bytes::from_static(b"hdr"),
            },
            Frame::SynReply {
                stream: 3,
                flags: 0,
                headers: Bytes::new(),
            },
            Frame::RstStream {
                stream: 5,
                status: CANCEL,
            },
            Frame::Ping(7),
            Frame::GoAway {
                last_good: 9,
                status: 0,
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 65536,
            },
            Frame::Data {
                stream: 1,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"payload"),
            },
        ];
        let mut wire = BytesMut::new();
        for frame in &frames {
            encode(frame, &mut wire);
        }
        // Fed a byte at a time: frames come out whole, in order.
        let mut buffer = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in wire {
            buffer.put_u8(byte);
            while let Some(frame) = decode(&mut buffer).unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let mut wrong_version = BytesMut::from(&[0x80, 2, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(decode(&mut wrong_version), Err(Error::Version(2)));
        let mut short = BytesMut::from(&[0x80, 3, 0, 3, 0, 0, 0, 2, 0, 0][..]);
        assert_eq!(decode(&mut short), Err(Error::Short("RST_STREAM")));
    }
}
