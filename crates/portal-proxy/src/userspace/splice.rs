//! Relaying a TCP connection both ways. Small messages (requests and
//! responses of a few KiB) are copied through a buffer, which costs the
//! fewest system calls; once a read fills the whole buffer the direction
//! is a bulk transfer and switches to zero-copy: socket → pipe → socket
//! inside the kernel with splice(2). End of stream in one direction is
//! passed on as a half-close; the relay ends when both directions have, or
//! at the first error (then both sockets close).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{splice, OFlag, SpliceFFlags};
use nix::sys::socket::{shutdown, Shutdown};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The copy buffer; a read that fills it switches to splice.
const BUFFER: usize = 16 * 1024;
/// Bytes moved per splice: a pipe's default capacity.
const CHUNK: usize = 1 << 16;

/// Relays between `a` and `b` until both directions end.
pub(crate) async fn relay(a: &TcpStream, b: &TcpStream) -> io::Result<()> {
    tokio::try_join!(one_way(a, b), one_way(b, a)).map(drop)
}

async fn one_way(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let read = match from.try_read(&mut buffer) {
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                from.readable().await?;
                continue;
            }
            Err(error) => return Err(error),
        };
        if read == 0 {
            return end_of_stream(to);
        }
        write_all(to, &buffer[..read]).await?;
        if read == buffer.len() {
            // The sender has more than a buffer waiting: bulk from here on.
            return spliced(from, to).await;
        }
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match to.try_write(data) {
            Ok(written) => data = &data[written..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Passes the end of stream on; the other direction may go on.
fn end_of_stream(to: &TcpStream) -> io::Result<()> {
    match shutdown(to.as_raw_fd(), Shutdown::Write) {
        Ok(()) | Err(nix::errno::Errno::ENOTCONN) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).map_err(io::Error::from)
}

async fn spliced(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let (pipe_out, pipe_in) = pipe()?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        // EAGAIN means not readable after all: async_io waits and retries.
        let moved = from
            .async_io(Interest::READABLE, || {
                splice(from, None, &pipe_in, None, CHUNK, flags).map_err(io::Error::from)
            })
            .await?;
        if moved == 0 {
            return end_of_stream(to);
        }
        let mut left = moved;
        while left > 0 {
            left -= to
                .async_io(Interest::WRITABLE, || {
                    splice(&pipe_out, None, to, None, left, flags).map_err(io::Error::from)
                })
                .await?;
        }
    }
}
