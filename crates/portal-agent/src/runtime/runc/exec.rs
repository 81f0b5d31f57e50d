//! Processes run in a running container with `runc exec`: for hooks and
//! probes (output captured, bounded, with a timeout) and for exec sessions
//! (streams handed to the caller; on a terminal runc relays from a pty
//! pair of ours).

use super::*;

impl Runc {
    pub(super) async fn exec_in(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<crate::runtime::ExecResult> {
        use tokio::io::AsyncReadExt;
        let mut child = Command::new(&self.runc)
            .arg("--root")
            .arg(self.dir.join("runc"))
            .args(["exec", id])
            .args(argv)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("runc exec"))?;
        let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
        let run = async {
            let (mut output, mut errors) = (Vec::new(), Vec::new());
            let limit = crate::runtime::EXEC_OUTPUT_LIMIT as u64;
            // Both at once: a command filling one pipe must not stall.
            tokio::join!(
                async {
                    if let Some(out) = stdout.as_mut() {
                        let _ = out.take(limit).read_to_end(&mut output).await;
                    }
                },
                async {
                    if let Some(err) = stderr.as_mut() {
                        let _ = err.take(limit).read_to_end(&mut errors).await;
                    }
                }
            );
            output.extend(errors);
            output.truncate(crate::runtime::EXEC_OUTPUT_LIMIT);
            let status = child.wait().await;
            (status, output)
        };
        match tokio::time::timeout(timeout, run).await {
            Ok((status, output)) => Ok(crate::runtime::ExecResult {
                exit_code: status.ok().and_then(|s| s.code()),
                output,
            }),
            // Dropping the future kills runc exec (kill_on_drop); the
            // command itself may linger in the container, as with the kubelet.
            Err(_) => Ok(crate::runtime::ExecResult {
                exit_code: None,
                output: Vec::new(),
            }),
        }
    }

    pub(super) async fn exec_interactive(
        &self,
        id: &str,
        argv: &[String],
        stdin: bool,
        tty: bool,
        size: Option<(u16, u16)>,
    ) -> Result<crate::runtime::ExecSession> {
        use std::process::Stdio;
        let mut command = Command::new(&self.runc);
        command
            .arg("--root")
            .arg(self.dir.join("runc"))
            .arg("exec")
            .kill_on_drop(true);
        // On a terminal runc stays in the foreground (its exit code is the
        // command's) and relays between a terminal of ours and the
        // container's; without one the process gets pipes.
        let relay = if tty {
            let relay = crate::shim::console::Relay::open().map_err(io("exec terminal"))?;
            // runc gives the container's terminal the size of ours at start.
            if let Some((width, height)) = size {
                crate::shim::console::resize(&relay.master, width, height)
                    .map_err(io("exec terminal size"))?;
            }
            let end =
                |f: &std::fs::File| f.try_clone().map(Stdio::from).map_err(io("exec terminal"));
            command
                .arg("--tty")
                .stdin(end(&relay.far_end)?)
                .stdout(end(&relay.far_end)?)
                .stderr(end(&relay.far_end)?);
            Some(relay)
        } else {
            command
                .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        };
        command.arg(id).args(argv);
        let mut child = command.spawn().map_err(io("runc exec"))?;
        let Some(relay) = relay else {
            return Ok(crate::runtime::ExecSession {
                stdin: child
                    .stdin
                    .take()
                    .map(|w| Box::new(w) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>),
                stdout: child
                    .stdout
                    .take()
                    .map(|r| Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                stderr: child
                    .stderr
                    .take()
                    .map(|r| Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                terminal: None,
                child,
            });
        };
        // Only runc keeps the far end: its exit reads as the end of output.
        drop(relay.far_end);
        let dup = |fd: &std::os::fd::OwnedFd| {
            fd.try_clone()
                .map(|fd| tokio::fs::File::from_std(std::fs::File::from(fd)))
                .map_err(io("exec terminal"))
        };
        Ok(crate::runtime::ExecSession {
            stdin: Some(Box::new(dup(&relay.master)?)),
            stdout: Some(Box::new(dup(&relay.master)?)),
            stderr: None,
            terminal: Some(crate::shim::console::Terminal::new(
                relay.master,
                child.id(),
            )),
            child,
        })
    }
}
