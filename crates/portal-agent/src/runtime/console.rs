//! Terminals for containers and exec sessions. runc makes the pseudo
//! terminal itself and passes its master end over a Unix socket
//! (`--console-socket`, SCM_RIGHTS); whoever holds the master reads the
//! process's output from it, writes its input to it, and sets its size.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// How long runc may take to hand over the terminal.
const HANDOVER: Duration = Duration::from_secs(10);

/// A listening console socket.
#[derive(Debug)]
pub struct ConsoleSocket(UnixListener);

impl ConsoleSocket {
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        Ok(ConsoleSocket(UnixListener::bind(path)?))
    }

    /// Waits (blocking, bounded) for runc to connect and send the master.
    pub fn receive(&self) -> std::io::Result<OwnedFd> {
        self.0.set_nonblocking(true)?;
        let deadline = std::time::Instant::now() + HANDOVER;
        let stream = loop {
            match self.0.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() > deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "runc did not hand over the terminal",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(HANDOVER))?;
        receive_fd(&stream)
    }
}

fn receive_fd(stream: &UnixStream) -> std::io::Result<OwnedFd> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // runc sends the terminal's name as the message itself.
    let mut name = [0u8; 4096];
    rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut name)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            if let Some(fd) = fds.next() {
                return Ok(fd);
            }
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "runc sent no terminal",
    ))
}

/// Sets a terminal's size (columns × rows).
pub fn resize(master: &impl std::os::fd::AsFd, width: u16, height: u16) -> std::io::Result<()> {
    rustix::termios::tcsetwinsize(
        master,
        rustix::termios::Winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(std::io::Error::from)
}
