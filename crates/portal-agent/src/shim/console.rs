//! Terminals for containers and exec sessions. runc makes the pseudo
//! terminal itself and passes its master end over a Unix socket
//! (`--console-socket`, SCM_RIGHTS); whoever holds the master reads the
//! process's output from it, writes its input to it, and sets its size.

use std::ffi::CStr;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
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

/// A terminal the agent holds for `runc exec --tty` in the foreground:
/// runc is given the pair's far end as its standard streams and relays
/// between it and the container's own terminal, following its size
/// (read again at every SIGWINCH).
#[derive(Debug)]
pub struct Relay {
    pub master: OwnedFd,
    pub far_end: std::fs::File,
}

impl Relay {
    pub fn open() -> std::io::Result<Self> {
        use rustix::pty::OpenptFlags;
        let master =
            rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let name: &CStr = name.as_c_str();
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let far_end = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
            .open(path)?;
        Ok(Relay { master, far_end })
    }
}

/// Where resizes of an exec session's terminal go.
#[derive(Debug)]
pub struct Terminal {
    master: OwnedFd,
    /// Told with SIGWINCH to pass the new size on (runc relaying).
    relay: Option<nix::unistd::Pid>,
}

impl Terminal {
    pub fn new(master: OwnedFd, relay: Option<u32>) -> Self {
        Terminal {
            master,
            relay: relay
                .and_then(|p| i32::try_from(p).ok())
                .map(nix::unistd::Pid::from_raw),
        }
    }

    pub fn resize(&self, width: u16, height: u16) -> std::io::Result<()> {
        resize(&self.master, width, height)?;
        if let Some(pid) = self.relay {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGWINCH)
                .map_err(std::io::Error::from)?;
        }
        Ok(())
    }
}
