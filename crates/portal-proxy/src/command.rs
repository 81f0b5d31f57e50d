//! Running the kernel's command-line tools (`nft`, `conntrack`) with a time
//! limit: a hung tool is killed instead of stalling every later sync.

use std::io::{self, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Runs `program args`, feeding it `stdin`, and returns its output; kills
/// it after `timeout`.
pub(crate) fn run(
    program: &str,
    args: &[&str],
    stdin: Option<String>,
    timeout: Duration,
) -> io::Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let input = child.stdin.take();
    let (done, result) = mpsc::channel();
    // Writing, reading and reaping happen on a thread, so a tool that stops
    // reading or never exits cannot block the caller past the timeout.
    std::thread::spawn(move || {
        if let (Some(mut pipe), Some(text)) = (input, stdin) {
            // A tool that quit early closed its end; its output says why.
            let _ = pipe.write_all(text.as_bytes());
        }
        let _ = done.send(child.wait_with_output());
    });
    match result.recv_timeout(timeout) {
        Ok(output) => output,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{program} did not finish within {timeout:?}; killed"),
            ))
        }
    }
}
