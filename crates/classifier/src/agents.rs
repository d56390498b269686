//! The agents a comparison runs against, started for one configuration and
//! stopped after it:
//!
//! - `inproc`: an agent embedded in this process ([`server::Agent`] on a
//!   unique `inproc://` name), the model loaded into it;
//! - `unix`, `tcp`, `tcp?nodelay=0`: `tensorwire serve` run as a child
//!   process ([`AgentProcess`]) on a Unix socket in a fresh temporary
//!   directory, or on `tcp://127.0.0.1:0` (the port the OS picks is read
//!   back from its `listening on URI` line).
//!
//! A child agent is stopped with SIGTERM (and waited for) when its
//! configuration is done; on every other path (an error, a panic, a timeout)
//! dropping it kills it, and on Linux the child also gets SIGTERM if this
//! process dies first (`PR_SET_PDEATHSIG`). No agent outlives its run.

use crate::ClassifierError;
use server::{Agent, AgentConfig, ModelConfig};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use transport::Endpoint;

/// How long a child agent may take to load its model and print its
/// `listening on` lines.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child agent may take to exit after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The transport a configuration uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// The agent embedded in this process.
    Inproc,
    /// A child agent on a Unix socket.
    Unix,
    /// A child agent serving a shared-memory session (`shm://NAME`).
    Shm,
    /// A child agent on TCP loopback; `nodelay: false` switches Nagle on
    /// (both ends).
    Tcp {
        /// `TCP_NODELAY` on both ends.
        nodelay: bool,
    },
}

/// The model an agent serves.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The name it is served under.
    pub model_name: String,
    /// The ONNX file.
    pub model_path: PathBuf,
    /// ONNX Runtime intra-op threads.
    pub intra_threads: usize,
    /// Whether ONNX Runtime's intra-op threads spin after a run
    /// (`serve --intra-spinning on|off`; `local` uses the same).
    pub intra_spinning: bool,
    /// The `tensorwire` binary whose `serve` runs child agents.
    pub serve_exe: PathBuf,
    /// The agent's poll budget in µs for socket and shared-memory sessions
    /// (`serve --socket-spin-us --shm-spin-us`); `None` = its defaults.
    pub spin_us: Option<u64>,
}

/// An agent running for one configuration.
#[derive(Debug)]
pub enum RunningAgent {
    /// Embedded in this process.
    Embedded {
        /// The agent (taken out on stop).
        agent: Option<Agent>,
        /// `inproc://NAME`.
        uri: String,
    },
    /// A `tensorwire serve` child process.
    Process(AgentProcess),
}

static INPROC_SEQ: AtomicU64 = AtomicU64::new(0);

impl AgentSpec {
    /// The model as an agent's `[[model]]` entry.
    pub fn model_config(&self) -> ModelConfig {
        ModelConfig::new(self.model_name.clone(), self.model_path.clone())
    }

    /// The configuration of an agent serving this model on `listen`: what
    /// an embedded agent runs with, and what a child agent's `serve` flags
    /// ([`AgentProcess::serve`]) amount to.
    pub fn agent_config(&self, listen: Vec<Endpoint>) -> AgentConfig {
        AgentConfig {
            listen,
            models: vec![self.model_config()],
            intra_threads: self.intra_threads,
            intra_spinning: self.intra_spinning,
            ..AgentConfig::default()
        }
    }

    /// The ONNX Runtime options an agent loads this model with, for running
    /// the engine without an agent the same way (`local`).
    pub fn ort_options(&self) -> engine::OrtOptions {
        server::registry::ort_options(&self.model_config(), &self.agent_config(Vec::new()))
    }
}

impl RunningAgent {
    /// Starts an agent for `transport` serving `spec`'s model; `config`
    /// names the configuration in errors.
    pub fn start(
        config: &str,
        transport: Transport,
        spec: &AgentSpec,
    ) -> Result<RunningAgent, ClassifierError> {
        match transport {
            Transport::Inproc => {
                let name = format!(
                    "classify-{}-{}",
                    std::process::id(),
                    INPROC_SEQ.fetch_add(1, Ordering::Relaxed)
                );
                let cfg = spec.agent_config(vec![Endpoint::Inproc(name.clone())]);
                let agent =
                    Agent::start(cfg).map_err(|e| ClassifierError::agent(config, e.to_string()))?;
                Ok(RunningAgent::Embedded {
                    agent: Some(agent),
                    uri: format!("inproc://{name}"),
                })
            }
            Transport::Unix | Transport::Shm | Transport::Tcp { .. } => {
                AgentProcess::serve(config, transport, spec).map(RunningAgent::Process)
            }
        }
    }

    /// The URI to connect to.
    pub fn uri(&self) -> &str {
        match self {
            RunningAgent::Embedded { uri, .. } => uri,
            RunningAgent::Process(p) => p.uri(),
        }
    }

    /// The child's process id (`None` when embedded).
    pub fn pid(&self) -> Option<u32> {
        match self {
            RunningAgent::Embedded { .. } => None,
            RunningAgent::Process(p) => Some(p.pid()),
        }
    }

    /// Stops the agent cleanly (an embedded one shuts down; a child gets
    /// SIGTERM and is waited for). Errors if a child does not exit cleanly.
    pub fn stop(self) -> Result<(), ClassifierError> {
        match self {
            RunningAgent::Embedded { mut agent, .. } => {
                if let Some(a) = agent.take() {
                    a.shutdown(Duration::from_secs(5));
                }
                Ok(())
            }
            RunningAgent::Process(p) => p.stop(STOP_TIMEOUT),
        }
    }
}

/// A `tensorwire serve` child process on a temporary Unix socket or TCP
/// loopback port. Dropping it kills it (SIGKILL) if it is still running.
#[derive(Debug)]
pub struct AgentProcess {
    config: String,
    child: Child,
    uri: String,
    dir: tempfile::TempDir,
    stderr_path: PathBuf,
}

impl AgentProcess {
    /// Runs `SPEC.serve_exe serve --model NAME=PATH --listen URI
    /// --intra-threads N --intra-spinning on|off [--socket-spin-us US
    /// --shm-spin-us US]` for
    /// `transport` (Unix, TCP or shared memory), and waits (at most
    /// [`START_TIMEOUT`]) until it prints `listening on URI`.
    pub fn serve(
        config: &str,
        transport: Transport,
        spec: &AgentSpec,
    ) -> Result<AgentProcess, ClassifierError> {
        let err = |reason: String| ClassifierError::agent(config, reason);
        let dir = tempfile::Builder::new()
            .prefix("tw-classify-")
            .tempdir()
            .map_err(|e| err(format!("cannot create a temporary directory: {e}")))?;
        let listen = match transport {
            Transport::Unix => format!("unix://{}", dir.path().join("agent.sock").display()),
            // Parent and child share the control-socket directory (same
            // environment); the name is unique per run.
            Transport::Shm => format!(
                "shm://classify-{}-{}",
                std::process::id(),
                INPROC_SEQ.fetch_add(1, Ordering::Relaxed)
            ),
            Transport::Tcp { nodelay: true } => "tcp://127.0.0.1:0".to_string(),
            Transport::Tcp { nodelay: false } => "tcp://127.0.0.1:0?nodelay=0".to_string(),
            Transport::Inproc => return Err(err("inproc agents are not child processes".into())),
        };
        let mut model = OsString::from(format!("{}=", spec.model_name));
        model.push(spec.model_path.as_os_str());
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--model".into(),
            model,
            "--listen".into(),
            listen.into(),
            "--intra-threads".into(),
            spec.intra_threads.to_string().into(),
            "--intra-spinning".into(),
            if spec.intra_spinning { "on" } else { "off" }.into(),
        ];
        if let Some(us) = spec.spin_us {
            for flag in ["--socket-spin-us", "--shm-spin-us"] {
                args.push(flag.into());
                args.push(us.to_string().into());
            }
        }
        AgentProcess::spawn(config, &spec.serve_exe, &args, dir, START_TIMEOUT)
    }

    /// Runs `exe args...` (which must print one `listening on URI` line on
    /// stdout when ready), keeping `dir` until it is stopped, and waits at
    /// most `timeout` for the line. Its stderr goes to a file in `dir`,
    /// quoted in errors.
    pub fn spawn(
        config: &str,
        exe: &Path,
        args: &[OsString],
        dir: tempfile::TempDir,
        timeout: Duration,
    ) -> Result<AgentProcess, ClassifierError> {
        let err = |reason: String| ClassifierError::agent(config, reason);
        let stderr_path = dir.path().join("agent.stderr");
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| err(format!("cannot create {}: {e}", stderr_path.display())))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| err(format!("cannot run {}: {e}", exe.display())))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("no stdout pipe".into()));
        };
        let (tx, rx) = mpsc::channel();
        // Reads stdout to the end (so the child never blocks on a full pipe);
        // the lines go to whoever still listens.
        std::thread::Builder::new()
            .name("agent-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            })
            .map_err(|e| err(format!("cannot start a thread: {e}")))?;
        let mut p = AgentProcess {
            config: config.to_string(),
            child,
            uri: String::new(),
            dir,
            stderr_path,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(uri) = line.strip_prefix("listening on ") {
                        p.uri = uri.trim().to_string();
                        return Ok(p);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(p.fail(format!(
                        "did not print `listening on URI` within {timeout:?}"
                    )))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: it exited (or is about to).
                    let status = p.wait_for(Duration::from_secs(5));
                    let how =
                        status.map_or("closed its stdout".to_string(), |s| format!("exited ({s})"));
                    return Err(p.fail(format!("{how} before listening")));
                }
            }
        }
    }

    /// The URI it listens on (with the resolved TCP port).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its temporary directory (socket, stderr log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends SIGTERM and waits up to `grace` for it to exit; kills it after
    /// that. Errors unless it exited by itself with status 0.
    pub fn stop(mut self, grace: Duration) -> Result<(), ClassifierError> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return Err(self.fail(format!("had already exited ({s})")));
        }
        self.signal(libc::SIGTERM);
        match self.wait_for(grace) {
            Some(s) if s.success() => Ok(()),
            Some(s) => Err(self.fail(format!("exited with {s} after SIGTERM"))),
            None => Err(self.fail(format!("still running {grace:?} after SIGTERM; killed it"))),
        }
    }

    /// Waits up to `limit` for the child to exit.
    fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => return None,
            }
        }
    }

    /// Kills the child (if running) and builds an error quoting its stderr.
    fn fail(&mut self, what: String) -> ClassifierError {
        self.kill();
        let stderr = self.stderr();
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        let mut reason = format!("`tensorwire serve` (pid {}) {what}", self.pid());
        if !tail.is_empty() {
            reason.push_str("; its stderr ends with:\n  ");
            reason.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join("\n  "));
        }
        ClassifierError::agent(&self.config, reason)
    }

    fn signal(&self, sig: libc::c_int) {
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        if pid > 0 {
            // SAFETY: kill(2) takes plain integers and touches no memory of
            // ours; `pid` is our own child, not yet reaped (so its id cannot
            // have been reused), and positive, so it never means a process
            // group or every process.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Asks the kernel to send the child SIGTERM when the thread that started
/// it exits (so a killed `tensorwire classify` leaves no agent behind).
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl(2) and getppid(2), which are async-signal-safe and
    // allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // The parent died between fork and prctl: go now.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> (PathBuf, Vec<OsString>) {
        ("/bin/sh".into(), vec!["-c".into(), script.into()])
    }

    #[test]
    fn waits_for_the_listening_line_and_stops_with_sigterm() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (exe, args) = sh(
            "trap 'exit 0' TERM; echo loading; echo 'listening on tcp://127.0.0.1:5'; \
             while :; do sleep 0.05; done",
        );
        let p = AgentProcess::spawn("t", &exe, &args, dir, Duration::from_secs(10)).expect("ready");
        assert_eq!(p.uri(), "tcp://127.0.0.1:5");
        let pid = p.pid();
        p.stop(Duration::from_secs(5)).expect("clean stop");
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie_free(pid));
    }

    fn is_zombie_free(pid: u32) -> bool {
        // Reaped: /proc/PID is gone (or reused by an unrelated process).
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(" Z "))
            .unwrap_or(true)
    }

    #[test]
    fn an_agent_that_dies_early_is_reported_with_its_stderr() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (exe, args) = sh("echo 'cannot load model /x.onnx: nope' >&2; exit 3");
        let e = AgentProcess::spawn("unix", &exe, &args, dir, Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unix") && e.contains("exited") && e.contains("/x.onnx"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_agent_times_out_and_is_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (exe, args) = sh("exec sleep 30");
        let t = Instant::now();
        let e = AgentProcess::spawn("tcp", &exe, &args, dir, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not print"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn an_agent_ignoring_sigterm_is_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (exe, args) = sh("trap '' TERM; echo 'listening on unix:///x'; exec sleep 30");
        let p =
            AgentProcess::spawn("unix", &exe, &args, dir, Duration::from_secs(10)).expect("ready");
        let e = p.stop(Duration::from_millis(200)).unwrap_err().to_string();
        assert!(e.contains("killed"), "{e}");
    }

    #[test]
    fn dropping_kills() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (exe, args) = sh("echo 'listening on unix:///x'; exec sleep 30");
        let p =
            AgentProcess::spawn("unix", &exe, &args, dir, Duration::from_secs(10)).expect("ready");
        let pid = p.pid();
        drop(p);
        assert!(is_zombie_free(pid) || !Path::new(&format!("/proc/{pid}")).exists());
    }
}
