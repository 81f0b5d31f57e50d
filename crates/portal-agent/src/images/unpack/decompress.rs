//! A layer blob as a tar stream: gzip, zstd or plain, told apart by their
//! magic bytes (as containerd does; the media type is not needed), and
//! decompressed as it is read.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

const GZIP: &[u8] = &[0x1f, 0x8b];
const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// The layer's tar stream.
pub(super) fn open(layer: &Path) -> io::Result<Box<dyn Read>> {
    let mut reader = BufReader::with_capacity(64 * 1024, File::open(layer)?);
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(GZIP) {
        // Several gzip members one after the other are one stream, as Go's
        // reader has it.
        Box::new(flate2::bufread::MultiGzDecoder::new(reader))
    } else if head.starts_with(ZSTD) {
        Box::new(Zstd::new(reader))
    } else {
        Box::new(reader)
    })
}

/// A zstd stream of any number of frames (zstd:chunked layers have many,
/// and skippable ones), decoded by `ruzstd` (pure Rust) a block at a time.
/// Windows up to `ruzstd`'s default 128 MiB are accepted (`zstd --long=27`).
struct Zstd<R> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> Zstd<R> {
    fn new(source: R) -> Self {
        Zstd {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Starts the next frame, skipping skippable ones; false at the end.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let length = u64::from(length);
                    let skipped = io::copy(&mut (&mut self.source).take(length), &mut io::sink())?;
                    if skipped != length {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(invalid(e)),
            }
        }
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.in_frame {
                while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                    self.decoder
                        .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                        .map_err(invalid)?;
                }
                let n = self.decoder.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                // The frame is done and drained: its checksum, if it has one.
                if let (Some(stored), Some(computed)) = (
                    self.decoder.get_checksum_from_data(),
                    self.decoder.get_calculated_checksum(),
                ) {
                    if stored != computed {
                        return Err(invalid("zstd frame checksum mismatch"));
                    }
                }
                self.in_frame = false;
            }
            if !self.next_frame()? {
                return Ok(0);
            }
            self.in_frame = true;
        }
    }
}

fn invalid(error: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {error}"))
}
