//! `ChildPeer`: the echo-peer process of the raw floors (`ping --raw`):
//! spawned from a copy of the caller's command, killed and reaped on every
//! path unless it exits cleanly when asked, so a floor measurement never
//! leaves a process behind. Shared by [`crate::raw`] and [`crate::raw_shm`],
//! which add their own start-up handshakes in their own `impl ChildPeer`.

use std::io;
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// How long a child peer gets to exit by itself after being told to stop
/// before it is killed.
pub(crate) const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A child echo peer, killed and reaped when dropped unless [`finish`]ed.
///
/// [`finish`]: ChildPeer::finish
pub(crate) struct ChildPeer {
    /// The process, until it has been reaped.
    pub(crate) child: Option<Child>,
    /// Prefix of error messages (`raw ping`, `raw shm ping`).
    pub(crate) label: &'static str,
}

impl ChildPeer {
    /// Starts `cmd`; `label` prefixes every error about it.
    pub(crate) fn spawn(mut cmd: Command, label: &'static str) -> io::Result<ChildPeer> {
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{label}: start the echo peer {}: {e}",
                    cmd.get_program().to_string_lossy()
                ),
            )
        })?;
        Ok(ChildPeer {
            child: Some(child),
            label,
        })
    }

    /// Waits at most `limit` for the child to exit.
    pub(crate) fn wait_within(&mut self, limit: Duration) -> io::Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// After it was told to stop: the child must exit cleanly within
    /// [`EXIT_GRACE`]; otherwise it is killed and this is an error.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        let label = self.label;
        match self.wait_within(EXIT_GRACE)? {
            Some(status) if status.success() => {
                self.child = None;
                Ok(())
            }
            Some(status) => {
                self.child = None;
                Err(io::Error::other(format!(
                    "{label}: the echo peer failed ({})",
                    describe(status)
                )))
            }
            None => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{label}: the echo peer did not exit within {}s of being told to stop",
                    EXIT_GRACE.as_secs()
                ),
            )),
        }
    }
}

impl Drop for ChildPeer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How a child ended, in words.
pub(crate) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// A copy of `base`: program, arguments, explicit environment changes and
/// working directory (a `Command` cannot be cloned, and the caller's is
/// borrowed).
pub(crate) fn copy_command(base: &Command) -> Command {
    let mut cmd = Command::new(base.get_program());
    cmd.args(base.get_args());
    for (k, v) in base.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(d) = base.get_current_dir() {
        cmd.current_dir(d);
    }
    cmd
}
