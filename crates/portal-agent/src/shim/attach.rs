//! The attach socket (`state/attach.sock`) through which the agent reaches
//! a running container's standard streams (`kubectl attach`, `kubectl run
//! -it`): the shim sends every piece of output as it comes (not line by
//! line, as the log gets it: a shell prompt has no newline) and takes
//! input, a stdin close and terminal resizes. Frames both ways: one kind
//! byte, a 32-bit big-endian length, the data.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// Client → shim: input for the container.
pub const STDIN: u8 = 0;
/// Client → shim: the client's input ended.
pub const CLOSE_STDIN: u8 = 1;
/// Client → shim: 2 bytes columns, 2 bytes rows (big-endian).
pub const RESIZE: u8 = 2;
/// Shim → client: output.
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;

/// The largest frame accepted.
const MAX_FRAME: usize = 1 << 20;
/// A client that cannot take output this long is dropped, not waited for.
const SLOW_CLIENT: Duration = Duration::from_secs(10);

pub fn write_frame(to: &mut impl Write, kind: u8, data: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(5 + data.len());
    frame.push(kind);
    frame.extend_from_slice(&(data.len() as u32).to_be_bytes());
    frame.extend_from_slice(data);
    to.write_all(&frame)
}

/// The next frame; `None` at the end of the stream.
pub fn read_frame(from: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match from.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "attach frame too large",
        ));
    }
    let mut data = vec![0u8; length];
    from.read_exact(&mut data)?;
    Ok(Some((head[0], data)))
}

/// The shim's side: who is attached, and where input goes.
#[derive(Debug)]
pub struct Attach {
    clients: Mutex<Vec<UnixStream>>,
    /// The container's stdin (a pipe, or the terminal's master end); gone
    /// once closed.
    input: Mutex<Option<std::fs::File>>,
    /// The terminal, for resizes.
    terminal: Option<OwnedFd>,
    /// `stdinOnce`: the first client to end its input ends the container's.
    stdin_once: bool,
}

impl Attach {
    pub fn new(
        input: Option<std::fs::File>,
        terminal: Option<OwnedFd>,
        stdin_once: bool,
    ) -> Arc<Self> {
        Arc::new(Attach {
            clients: Mutex::new(Vec::new()),
            input: Mutex::new(input),
            terminal,
            stdin_once,
        })
    }

    /// Accepts clients until the process ends (a thread per client).
    pub fn serve(self: &Arc<Self>, listener: UnixListener) {
        let attach = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let Ok(writer) = stream.try_clone() else {
                    continue;
                };
                let _ = writer.set_write_timeout(Some(SLOW_CLIENT));
                attach.clients.lock().push(writer);
                let attach = attach.clone();
                std::thread::spawn(move || attach.take_input(stream));
            }
        });
    }

    fn take_input(&self, mut stream: UnixStream) {
        loop {
            match read_frame(&mut stream) {
                Ok(Some((STDIN, data))) => {
                    let mut input = self.input.lock();
                    if let Some(file) = input.as_mut() {
                        if file.write_all(&data).is_err() {
                            *input = None;
                        }
                    }
                }
                Ok(Some((RESIZE, data))) if data.len() == 4 => {
                    if let Some(terminal) = &self.terminal {
                        let width = u16::from_be_bytes([data[0], data[1]]);
                        let height = u16::from_be_bytes([data[2], data[3]]);
                        let _ = crate::shim::console::resize(terminal, width, height);
                    }
                }
                Ok(Some((CLOSE_STDIN, _))) | Ok(None) | Err(_) => break,
                Ok(Some(_)) => {}
            }
        }
        if self.stdin_once && self.terminal.is_none() {
            *self.input.lock() = None;
        }
    }

    /// Sends output to every client; a client that fails is dropped.
    pub fn publish(&self, kind: u8, data: &[u8]) {
        let mut clients = self.clients.lock();
        if clients.is_empty() {
            return;
        }
        clients.retain_mut(|client| write_frame(client, kind, data).is_ok());
    }

    /// The container ended: every client sees the end of its output.
    pub fn close(&self) {
        for client in self.clients.lock().drain(..) {
            let _ = client.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let mut wire = Vec::new();
        write_frame(&mut wire, STDIN, b"hello").unwrap();
        write_frame(&mut wire, CLOSE_STDIN, b"").unwrap();
        let mut reader = &wire[..];
        assert_eq!(
            read_frame(&mut reader).unwrap(),
            Some((STDIN, b"hello".to_vec()))
        );
        assert_eq!(
            read_frame(&mut reader).unwrap(),
            Some((CLOSE_STDIN, vec![]))
        );
        assert_eq!(read_frame(&mut reader).unwrap(), None);
        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert!(read_frame(&mut &huge[..]).is_err());
    }
}
