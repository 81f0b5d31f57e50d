//! SPDY/3.1 from a peer: any bytes decode into frames or fail cleanly, and
//! header blocks (zlib with the SPDY dictionary, one stream per
//! connection) decompress within their bound or fail cleanly.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portal_streams::spdy::frame::{self, Frame};
use portal_streams::spdy::headers::Decompressor;

fuzz_target!(|data: &[u8]| {
    let mut buffer = BytesMut::from(data);
    let mut headers = Decompressor::new();
    while let Ok(Some(frame)) = frame::decode(&mut buffer) {
        if let Frame::SynStream { headers: block, .. } | Frame::Headers { headers: block, .. } = frame {
            let _ = headers.decode(&block);
        }
    }
});
