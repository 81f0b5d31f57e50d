//! SPDY/3 header blocks: a count, then length-prefixed names and values
//! (32-bit big-endian lengths; several values of one name joined by NUL),
//! compressed with zlib primed by the protocol's dictionary. Each direction
//! of a connection is one zlib stream, flushed (`SYNC_FLUSH`) after every
//! block, so the two sides' (de)compressors live as long as the connection.

use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The most a header block may decompress to: more is an error, not memory.
const MAX_BLOCK: usize = 64 * 1024;

/// The SPDY/3 header compression dictionary (section 2.6.10.1 of the
/// SPDY/3 draft): the common header names, each with its 32-bit length,
/// then common values as one run of text.
fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const NAMES: [&str; 66] = [
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
            "",
        ];
        const VALUES: &str = "100101201202205206300302303304305306307402405406407408409\
            410411412413414415416417502504505203 Non-Authoritative Information\
            204 No Content301 Moved Permanently400 Bad Request401 Unauthorized\
            403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented\
            503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec \
            00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,\
            image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,\
            text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch\
            charset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
        let mut bytes = Vec::with_capacity(1423);
        for name in NAMES.iter().filter(|n| !n.is_empty()) {
            bytes.extend_from_slice(&(name.len() as u32).to_be_bytes());
            bytes.extend_from_slice(name.as_bytes());
        }
        bytes.extend_from_slice(VALUES.as_bytes());
        bytes
    })
}

/// Header names and values, names lower-case as SPDY requires.
pub type Headers = Vec<(String, String)>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("header block: {0}")]
    Compression(String),
    #[error("header block larger than {MAX_BLOCK} bytes")]
    TooLarge,
    #[error("malformed header block")]
    Malformed,
}

/// Compresses this side's header blocks.
pub struct Compressor(Compress);

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compressor")
    }
}

impl Compressor {
    pub fn new() -> Self {
        let mut zlib = Compress::new(Compression::default(), true);
        // Never fails on a fresh stream.
        let _ = zlib.set_dictionary(dictionary());
        Compressor(zlib)
    }

    pub fn encode(&mut self, headers: &[(&str, &str)]) -> Result<Bytes, Error> {
        let mut plain = BytesMut::new();
        plain.put_u32(headers.len() as u32);
        for (name, value) in headers {
            plain.put_u32(name.len() as u32);
            plain.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            plain.put_u32(value.len() as u32);
            plain.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let status = self
                .0
                .compress_vec(&plain[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| Error::Compression(e.to_string()))?;
            let done = (self.0.total_in() - start) as usize == plain.len();
            // Done when all input is in and the flush left room to spare.
            if done && out.capacity() > out.len() && status != Status::BufError {
                break;
            }
        }
        Ok(Bytes::from(out))
    }
}

impl Default for Compressor {
    fn default() -> Self {
        Self::new()
    }
}

/// Decompresses the peer's header blocks.
pub struct Decompressor(Decompress);

impl std::fmt::Debug for Decompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Decompressor")
    }
}

impl Decompressor {
    pub fn new() -> Self {
        Decompressor(Decompress::new(true))
    }

    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, Error> {
        let mut out: Vec<u8> = Vec::with_capacity(1024);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.len() == out.capacity() {
                if out.len() >= MAX_BLOCK {
                    return Err(Error::TooLarge);
                }
                out.reserve(out.len());
            }
            match self
                .0
                .decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0
                        .set_dictionary(dictionary())
                        .map_err(|e| Error::Compression(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(Error::Compression(e.to_string())),
            }
            let consumed = (self.0.total_in() - start) as usize;
            if consumed == block.len() && out.len() < out.capacity() {
                break;
            }
        }
        parse(&out)
    }
}

impl Default for Decompressor {
    fn default() -> Self {
        Self::new()
    }
}

fn parse(mut block: &[u8]) -> Result<Headers, Error> {
    fn take<'a>(block: &mut &'a [u8], n: usize) -> Result<&'a [u8], Error> {
        if block.len() < n {
            return Err(Error::Malformed);
        }
        let (head, rest) = block.split_at(n);
        *block = rest;
        Ok(head)
    }
    fn length(block: &mut &[u8]) -> Result<usize, Error> {
        let bytes = take(block, 4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize)
    }
    let count = length(&mut block)?;
    // Each pair needs at least 8 bytes: a bogus count fails fast.
    if count > block.len() / 8 {
        return Err(Error::Malformed);
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let n = length(&mut block)?;
        let name = String::from_utf8_lossy(take(&mut block, n)?).to_ascii_lowercase();
        let n = length(&mut block)?;
        let value = take(&mut block, n)?;
        for one in value.split(|b| *b == 0) {
            headers.push((name.clone(), String::from_utf8_lossy(one).into_owned()));
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_protocols() {
        let dictionary = dictionary();
        assert_eq!(dictionary.len(), 1423);
        assert_eq!(&dictionary[..11], b"\0\0\0\x07options");
        assert!(dictionary.ends_with(b",*,enq=0."));
    }

    #[test]
    fn blocks_round_trip_across_one_connection() {
        let (mut out, mut inn) = (Compressor::new(), Decompressor::new());
        for i in 0..3 {
            let port = i.to_string();
            let block = out
                .encode(&[("streamType", "data"), ("port", &port)])
                .unwrap();
            let headers = inn.decode(&block).unwrap();
            assert_eq!(
                headers,
                vec![
                    ("streamtype".to_string(), "data".to_string()),
                    ("port".to_string(), port)
                ]
            );
        }
        assert_eq!(
            Compressor::new().encode(&[]).map(|b| b.is_empty()),
            Ok(false)
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Decompressor::new().decode(b"not zlib at all").is_err());
        assert_eq!(parse(&[0, 0, 0, 9, 0]), Err(Error::Malformed));
    }
}
