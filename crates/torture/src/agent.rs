//! [`AgentUnderTest`]: the `tensorwire serve` child every scenario attacks,
//! listening on unix, tcp and shm, tls (with a certificate made for it),
//! the KServe v2 http and grpc front doors and, where this kernel has
//! `AF_VSOCK`, vsock; and what the harness reads of it from `/proc` (open
//! descriptors, resident memory, CPU time) to find leaks and spinning.

use crate::TortureError;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the agent may take to print its `listening on` lines.
const START_TIMEOUT: Duration = Duration::from_secs(60);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running agent (killed when dropped).
pub struct AgentUnderTest {
    child: Child,
    _dir: tempfile::TempDir,
    stderr_path: PathBuf,
    exe: PathBuf,
    /// `serve`'s arguments after `serve`.
    args: Vec<String>,
    /// `unix://…`.
    pub unix: String,
    /// `tcp://127.0.0.1:PORT`.
    pub tcp: String,
    /// `shm://…`.
    pub shm: String,
    /// `http://127.0.0.1:PORT` of its Prometheus metrics, when it was
    /// started with `--metrics-listen`.
    pub metrics: Option<String>,
    /// `tls://127.0.0.1:PORT?ca=…` (trusting the agent's own CA).
    pub tls: String,
    /// `http://127.0.0.1:PORT` (the KServe v2 HTTP/REST front door).
    pub http: String,
    /// `grpc://127.0.0.1:PORT` (the KServe v2 gRPC front door).
    pub grpc: String,
    /// `vsock://local:PORT` (the port the agent printed), when this kernel
    /// let it listen on vsock; otherwise why not.
    pub vsock: Result<String, String>,
    /// The URIs the agent printed (the tcp ports it was given for port 0).
    printed: Vec<String>,
}

impl AgentUnderTest {
    /// Starts `exe serve` on a fresh unix socket, loopback tcp, tls, http
    /// and grpc ports, a fresh shm name and (where the kernel has it) a
    /// vsock port, serving `identity` and `digits` (the model file
    /// `digits`), plus `extra` arguments; waits for its `listening on`
    /// lines.
    pub fn start(
        exe: &Path,
        digits: &Path,
        extra: &[&str],
    ) -> Result<AgentUnderTest, TortureError> {
        let dir = tempfile::Builder::new()
            .prefix("tw-torture-")
            .tempdir()
            .map_err(|e| TortureError(format!("temporary directory: {e}")))?;
        let mut listen = vec![
            format!("unix://{}", dir.path().join("agent.sock").display()),
            "tcp://127.0.0.1:0".to_string(),
            format!(
                "shm://torture-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ),
            "tls://127.0.0.1:0".to_string(),
            "http://127.0.0.1:0".to_string(),
            "grpc://127.0.0.1:0".to_string(),
        ];
        let vsock_here = vsock_here();
        if vsock_here.is_ok() {
            listen.push("vsock://-1:-1".to_string());
        }
        let ca = make_certificates(dir.path())?;
        let mut args: Vec<String> = Vec::new();
        for l in &listen {
            args.push("--listen".into());
            args.push(l.clone());
        }
        for (flag, file) in [("--tls-cert", "agent.pem"), ("--tls-key", "agent.key")] {
            args.push(flag.into());
            args.push(dir.path().join(file).display().to_string());
        }
        args.push("--model".into());
        args.push(format!("digits={}", digits.display()));
        args.extend(extra.iter().map(|s| s.to_string()));
        let stderr_path = dir.path().join("agent.stderr");
        let (child, uris, metrics) = spawn(exe, &args, &stderr_path)?;
        let pick = |scheme: &str| {
            uris.iter()
                .find(|u| u.starts_with(scheme))
                .cloned()
                .ok_or_else(|| TortureError(format!("the agent printed no {scheme} endpoint")))
        };
        Ok(AgentUnderTest {
            unix: pick("unix://")?,
            tcp: pick("tcp://")?,
            shm: pick("shm://")?,
            metrics,
            tls: format!("{}?ca={}", pick("tls://")?, ca.display()),
            http: pick("http://")?,
            grpc: pick("grpc://")?,
            vsock: match vsock_here {
                // Clients reach it at this machine's own CID.
                Ok(()) => Ok(pick("vsock://")?.replacen("vsock://-1:", "vsock://local:", 1)),
                Err(why) => Err(why),
            },
            printed: uris,
            child,
            _dir: dir,
            stderr_path,
            exe: exe.to_path_buf(),
            args,
        })
    }

    /// Kills the agent (if it still runs) and starts it again on the same
    /// endpoints (the ports it was given for port 0), as a supervisor would.
    pub fn restart(&mut self) -> Result<(), TortureError> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                let given = a
                    .strip_suffix("127.0.0.1:0")
                    .or_else(|| a.strip_suffix("-1:-1"))
                    .and_then(|scheme| self.printed.iter().find(|u| u.starts_with(scheme)));
                given.unwrap_or(a).clone()
            })
            .collect();
        let (child, _, metrics) = spawn(&self.exe, &args, &self.stderr_path)?;
        self.metrics = metrics;
        self.child = child;
        Ok(())
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URI of `transport` (`unix`, `tcp`, `tls`, `http`, `grpc`,
    /// `vsock` or `shm`). A vsock client connects to this machine's CID
    /// (`vsock://local:PORT`), which needs `vsock_loopback`.
    pub fn uri(&self, transport: &str) -> &str {
        match transport {
            "unix" => &self.unix,
            "tcp" => &self.tcp,
            "tls" => &self.tls,
            "http" => &self.http,
            "grpc" => &self.grpc,
            "vsock" => self.vsock.as_deref().unwrap_or(""),
            _ => &self.shm,
        }
    }

    /// CPU time the agent has used so far (user + system), from
    /// `/proc/PID/stat` (zero when unreadable).
    pub fn cpu_time(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // utime and stime are the 12th and 13th fields after the command
        // name, which sits in parentheses and may hold spaces.
        let ticks: u64 = stat
            .rsplit_once(") ")
            .map(|(_, rest)| {
                rest.split_whitespace()
                    .skip(11)
                    .take(2)
                    .filter_map(|f| f.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0);
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz)
    }

    /// Whether it still runs; if it died, why (with its stderr's tail).
    pub fn check_alive(&mut self) -> Result<(), TortureError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                let err = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
                let tail: String = err
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                Err(TortureError(format!(
                    "the agent died ({status}); the end of its stderr:\n{tail}"
                )))
            }
            Err(e) => Err(TortureError(format!("waiting on the agent: {e}"))),
        }
    }

    /// Sends `sig` to it.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Sends SIGSTOP and waits (at most 5 s) until every thread of it is
    /// stopped: the signal reaches a thread running on another core a
    /// moment after kill(2) returns.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.pid());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let stopped = std::fs::read_dir(&tasks)
                .map(|d| {
                    d.filter_map(Result::ok).all(|t| {
                        let stat =
                            std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                        // The state follows the command name, in parentheses.
                        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
                        matches!(state, Some('T') | Some('t') | None)
                    })
                })
                .unwrap_or(true);
            if stopped {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Open file descriptors of the agent now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Resident set size of the agent now, KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// Waits (at most `limit`) until the agent's descriptors are back to at
    /// most `baseline`; returns how many it still had over it at the end.
    pub fn settle_fds(&self, baseline: usize, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.fds();
            if now <= baseline || Instant::now() >= deadline {
                return now.saturating_sub(baseline);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for AgentUnderTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `exe serve args…` and waits for a `listening on` line per
/// `--listen` (and its `metrics on` line when asked for); returns the
/// child, the URIs and the metrics URI it printed.
fn spawn(
    exe: &Path,
    args: &[String],
    stderr_path: &Path,
) -> Result<(Child, Vec<String>, Option<String>), TortureError> {
    // With a metrics listener its line comes after the endpoints': wait for
    // it too (the agent must not print into a pipe nobody reads).
    let wants_metrics = args.iter().any(|a| a == "--metrics-listen");
    let mut metrics = None;
    let stderr = std::fs::File::create(stderr_path)
        .map_err(|e| TortureError(format!("{}: {e}", stderr_path.display())))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| TortureError(format!("cannot run {}: {e}", exe.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| TortureError("no stdout pipe to the agent".into()))?;
    // The lines come from a thread, so a silent agent cannot block us past
    // the deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    let mut uris = Vec::new();
    let listens = args.iter().filter(|a| *a == "--listen").count();
    while uris.len() < listens || (wants_metrics && metrics.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(u) = line.strip_prefix("listening on ") {
                    uris.push(u.trim().to_string());
                } else if let Some(u) = line.strip_prefix("metrics on ") {
                    metrics = Some(u.trim().to_string());
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = std::fs::read_to_string(stderr_path).unwrap_or_default();
                return Err(TortureError(format!(
                    "the agent did not start within {START_TIMEOUT:?}; its stderr:\n{err}"
                )));
            }
        }
    }
    Ok((child, uris, metrics))
}

/// Whether this kernel lets a process listen on vsock (`Err`: why not).
pub fn vsock_here() -> Result<(), String> {
    let any = transport::Endpoint::parse("vsock://-1:-1").map_err(|e| e.to_string())?;
    transport::Listener::bind(&any)
        .map(drop)
        .map_err(|e| format!("no vsock on this machine ({e})"))
}

/// Makes a CA and an agent certificate for `localhost` and 127.0.0.1 in
/// `dir` (`agent.pem`, `agent.key`); returns the CA's file, which clients
/// trust.
fn make_certificates(dir: &Path) -> Result<PathBuf, TortureError> {
    let err = |what: &str, e: &dyn std::fmt::Display| TortureError(format!("{what}: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(|e| err("CA key", &e))?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| err("CA parameters", &e))?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tensorwire torture CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(|e| err("CA certificate", &e))?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(|e| err("agent key", &e))?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|e| err("agent certificate parameters", &e))?
        .signed_by(&key, &issuer)
        .map_err(|e| err("agent certificate", &e))?;
    let ca_path = dir.join("ca.pem");
    for (path, text) in [
        (ca_path.clone(), ca.pem()),
        (dir.join("agent.pem"), cert.pem()),
        (dir.join("agent.key"), key.serialize_pem()),
    ] {
        std::fs::write(&path, text).map_err(|e| err(&path.display().to_string(), &e))?;
    }
    Ok(ca_path)
}

/// `VmRSS` of process `pid`, KiB (0 when unreadable).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Makes the child die with this process (`PR_SET_PDEATHSIG`), so an
/// interrupted run leaves no agent spinning.
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes
    // one async-signal-safe system call (prctl), touching no parent memory.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}
