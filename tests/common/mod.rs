//! Helpers shared by the end-to-end tests in `tests/`: agents started in
//! this process on real temporary sockets, a raw protocol peer that writes
//! hand-built bytes, the `tensorwire` binary run as a child process, and
//! time bounds so that no test can hang.
//!
//! Everything here panics with a message saying what went wrong: these are
//! test helpers, and a panic is how a test fails.

use client::{Client, TensorRef};
use server::{Agent, AgentConfig, ModelConfig, ModelRegistry};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};
use transport::Endpoint;
use wire::{
    encode_hello, encode_model_name, encode_tensor_section, layout_payload, DType, Header, Kind,
    Limits, Status, TensorDesc, HEADER_LEN,
};

/// What to do when a file `scripts/setup.sh` builds is missing.
pub const SETUP_HINT: &str =
    "run `bash scripts/setup.sh` (it installs ONNX Runtime into .venv and builds models/build)";

/// The repository root.
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// A file under `models/build/`; panics (never skips) when it is missing.
pub fn built(name: &str) -> PathBuf {
    let p = repo_root().join("models/build").join(name);
    assert!(p.is_file(), "{} is missing: {SETUP_HINT}", p.display());
    p
}

/// `models/build/digits_mlp.onnx` (fails the test if setup.sh has not run).
pub fn digits_model() -> PathBuf {
    built("digits_mlp.onnx")
}

/// The fixed digits input: raw little-endian f32 `[4, 64]`, as bytes.
pub fn digits_input() -> Vec<u8> {
    let p = built("digits_mlp_input.bin");
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(b.len(), 4 * 64 * 4, "{} is not f32[4, 64]", p.display());
    b
}

/// The Python reference logits for [`digits_input`]: f32 `[4, 10]`.
pub fn digits_expected() -> Vec<f32> {
    let p = built("digits_mlp_expected.bin");
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(b.len(), 4 * 10 * 4, "{} is not f32[4, 10]", p.display());
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs `f` on its own thread and returns its result; panics when it takes
/// longer than `limit` (the thread is left behind: the test has failed).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("within: {what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn a thread");
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what}: finished without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {limit:?} (hang?)")
        }
    }
}

/// Polls `cond` every 5 ms until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `len` bytes of a deterministic pseudo-random pattern depending on `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The VmRSS of this process in KiB (from `/proc/self/status`).
pub fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Points `TENSORWIRE_SHM_DIR` (where `shm://NAME` control sockets live) at
/// a private temporary directory, once per test process, and returns it.
/// Call it before starting any `shm://` agent or client: both this process
/// (its clients read the variable) and the `tensorwire` children (which
/// inherit it) then agree on the directory. Tests in one process share it,
/// so each must use its own shm names.
pub fn shm_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().expect("temporary directory");
        std::env::set_var("TENSORWIRE_SHM_DIR", d.path());
        d
    })
    .path()
}

static INPROC_SEQ: AtomicU64 = AtomicU64::new(0);

/// An agent running in this process, listening on a Unix socket in a
/// temporary directory, on TCP loopback (port chosen by the OS) and on a
/// unique in-process name.
pub struct TestAgent {
    agent: Option<Agent>,
    /// The temporary directory holding the Unix socket.
    pub dir: tempfile::TempDir,
    /// The Unix socket file.
    pub sock_path: PathBuf,
    /// `unix:///.../a.sock`.
    pub unix: String,
    /// `tcp://127.0.0.1:PORT` (the resolved port).
    pub tcp: String,
    /// `inproc://NAME`.
    pub inproc: String,
}

impl TestAgent {
    /// An agent serving `identity` and the given ONNX models, default settings.
    pub fn start(models: &[(&str, &Path)]) -> TestAgent {
        let cfg = AgentConfig {
            models: models
                .iter()
                .map(|(name, path)| ModelConfig::new(name.to_string(), path.to_path_buf()))
                .collect(),
            ..AgentConfig::default()
        };
        TestAgent::start_with(cfg, None)
    }

    /// An agent with `cfg` (its `listen` list is replaced by this helper's
    /// three endpoints), serving `registry` if given, else `cfg`'s models.
    pub fn start_with(mut cfg: AgentConfig, registry: Option<ModelRegistry>) -> TestAgent {
        let dir = tempfile::tempdir().expect("temporary directory");
        let sock_path = dir.path().join("a.sock");
        let name = format!(
            "tw-test-{}-{}",
            std::process::id(),
            INPROC_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        cfg.listen = vec![
            Endpoint::Unix(sock_path.clone()),
            Endpoint::parse("tcp://127.0.0.1:0").expect("tcp endpoint"),
            Endpoint::Inproc(name.clone()),
        ];
        let agent = match registry {
            Some(r) => Agent::with_registry(cfg, r),
            None => Agent::start(cfg),
        }
        .unwrap_or_else(|e| panic!("agent did not start: {e}\n(if a model failed: {SETUP_HINT})"));
        let mut unix = None;
        let mut tcp = None;
        for ep in agent.endpoints() {
            match ep {
                Endpoint::Unix(_) => unix = Some(ep.to_string()),
                Endpoint::Tcp { .. } => tcp = Some(ep.to_string()),
                Endpoint::Inproc(_)
                | Endpoint::Shm(_)
                | Endpoint::Tls { .. }
                | Endpoint::Vsock { .. } => {}
            }
        }
        let tcp = tcp.expect("agent reports its TCP endpoint");
        assert!(!tcp.ends_with(":0"), "TCP port 0 was not resolved: {tcp}");
        TestAgent {
            agent: Some(agent),
            dir,
            sock_path,
            unix: unix.expect("agent reports its Unix endpoint"),
            tcp,
            inproc: format!("inproc://{name}"),
        }
    }

    /// The running agent.
    pub fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("agent already shut down")
    }

    /// Takes the agent out (to shut it down from another thread).
    pub fn take(&mut self) -> Agent {
        self.agent.take().expect("agent already taken")
    }

    /// `(transport name, uri)` for unix, tcp and inproc.
    pub fn all_uris(&self) -> Vec<(&'static str, String)> {
        vec![
            ("unix", self.unix.clone()),
            ("tcp", self.tcp.clone()),
            ("inproc", self.inproc.clone()),
        ]
    }

    /// `(transport name, uri)` for the two socket transports.
    pub fn socket_uris(&self) -> Vec<(&'static str, String)> {
        vec![("unix", self.unix.clone()), ("tcp", self.tcp.clone())]
    }

    /// The id of the model named `name` (the same on every session).
    pub fn model_id(&self, name: &str) -> u32 {
        self.agent()
            .core()
            .registry
            .find(name)
            .unwrap_or_else(|| panic!("the agent serves no model '{name}'"))
            .id
    }

    /// Open connections now.
    pub fn connections(&self) -> usize {
        self.agent().stats().connections
    }

    /// Waits until the agent has at most `n` connections open (a connection
    /// it closed, or whose peer left, is gone from its table).
    pub fn wait_connections(&self, n: usize, what: &str) {
        wait_until(Duration::from_secs(5), what, || self.connections() <= n);
    }
}

/// Connects a client, panicking with the URI on failure.
pub fn connect(uri: &str) -> Client {
    Client::connect(uri).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// One identity round trip of three tensors on `c`, checked byte for byte.
pub fn check_identity(c: &Client, what: &str) {
    let m = c
        .model("identity")
        .unwrap_or_else(|e| panic!("{what}: identity lookup: {e}"));
    let a = pattern(100, 1);
    let b = pattern(7 * 4, 2);
    let shape_a = [100u64];
    let shape_b = [7u64];
    let inputs = [
        TensorRef::new(DType::U8, &shape_a, &a).expect("tensor"),
        TensorRef::new(DType::F32, &shape_b, &b).expect("tensor"),
        TensorRef::new(DType::I64, &[], &[0, 1, 2, 3, 4, 5, 6, 7]).expect("tensor"),
    ];
    let r = m
        .infer(&inputs)
        .unwrap_or_else(|e| panic!("{what}: identity round trip failed: {e}"));
    assert_eq!(r.outputs.len(), 3, "{what}");
    for (o, i) in r.outputs.iter().zip(&inputs) {
        assert_eq!(o.dtype, i.dtype, "{what}");
        assert_eq!(o.shape, i.shape, "{what}");
        assert_eq!(o.bytes(), i.data, "{what}");
    }
}

/// A fresh client on `uri` does an identity round trip.
pub fn identity_roundtrip(uri: &str, what: &str) {
    check_identity(&connect(uri), what);
}

// ---------------------------------------------------------------------------
// Raw protocol peer

/// A socket, Unix or TCP.
pub enum RawStream {
    /// A Unix stream socket.
    Unix(UnixStream),
    /// A TCP socket.
    Tcp(TcpStream),
}

impl Read for RawStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            RawStream::Unix(s) => s.read(buf),
            RawStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for RawStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            RawStream::Unix(s) => s.write(buf),
            RawStream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One received message.
#[derive(Debug)]
pub struct RawMsg {
    /// Its header.
    pub header: Header,
    /// Its descriptor section (or control body).
    pub desc: Vec<u8>,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl RawMsg {
    /// The body of an Error message, as text.
    pub fn error_text(&self) -> String {
        String::from_utf8_lossy(&self.desc).into_owned()
    }
}

/// A peer that speaks the protocol by hand, over a plain socket, so that it
/// can send anything at all.
pub struct RawPeer {
    /// The socket.
    pub s: RawStream,
    next_id: u64,
}

/// How long a raw peer waits for any one read or write.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(10);

impl RawPeer {
    /// Connects to a `unix://` or `tcp://` URI (no Hello is sent).
    pub fn connect(uri: &str) -> RawPeer {
        let s = match Endpoint::parse(uri).expect("uri") {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(&p).unwrap_or_else(|e| panic!("connect {uri}: {e}"));
                s.set_read_timeout(Some(RAW_TIMEOUT)).expect("timeout");
                s.set_write_timeout(Some(RAW_TIMEOUT)).expect("timeout");
                RawStream::Unix(s)
            }
            Endpoint::Tcp { addr, .. } => {
                let s = TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect {uri}: {e}"));
                s.set_nodelay(true).expect("nodelay");
                s.set_read_timeout(Some(RAW_TIMEOUT)).expect("timeout");
                s.set_write_timeout(Some(RAW_TIMEOUT)).expect("timeout");
                RawStream::Tcp(s)
            }
            Endpoint::Inproc(_)
            | Endpoint::Shm(_)
            | Endpoint::Tls { .. }
            | Endpoint::Vsock { .. } => {
                panic!("a raw peer needs a unix or tcp socket, not {uri}")
            }
        };
        RawPeer { s, next_id: 1000 }
    }

    /// Connects and exchanges the Hello (default limits asked).
    pub fn connect_hello(uri: &str) -> RawPeer {
        let mut p = RawPeer::connect(uri);
        p.hello(&Limits {
            max_tensors: 0,
            max_in_flight: 0,
            max_payload: 0,
            max_desc_len: 0,
        });
        p
    }

    /// A fresh request id.
    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a Hello asking for `asked`, returns the limits in force.
    pub fn hello(&mut self, asked: &Limits) -> Limits {
        let body = encode_hello(asked);
        let mut h = Header::new(Kind::Hello);
        h.request_id = self.id();
        h.desc_len = body.len() as u32;
        self.send(&h, &body, &[]);
        let m = self.recv();
        assert_eq!(m.header.kind, Kind::HelloAck, "hello answered with {m:?}");
        assert_eq!(m.header.request_id, h.request_id);
        wire::decode_hello(&m.desc).expect("HelloAck body")
    }

    /// Writes raw bytes; panics on failure.
    pub fn write(&mut self, bytes: &[u8]) {
        self.s
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("raw write failed: {e}"));
    }

    /// Writes header, descriptor section and payload as one write.
    pub fn send(&mut self, h: &Header, desc: &[u8], payload: &[u8]) {
        let mut b = Vec::with_capacity(HEADER_LEN + desc.len() + payload.len());
        b.extend_from_slice(&h.encode());
        b.extend_from_slice(desc);
        b.extend_from_slice(payload);
        self.write(&b);
    }

    /// Reads one whole message; `Ok(None)` when the agent closed the
    /// connection cleanly before its first byte.
    pub fn try_recv(&mut self) -> io::Result<Option<RawMsg>> {
        let mut head = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match self.s.read(&mut head[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "agent closed inside a header",
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let header = Header::decode(&head)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        assert!(
            header.payload_len <= 512 << 20,
            "agent announced a payload of {} bytes",
            header.payload_len
        );
        let mut desc = vec![0u8; header.desc_len as usize];
        self.s.read_exact(&mut desc)?;
        let mut payload = vec![0u8; header.payload_len as usize];
        self.s.read_exact(&mut payload)?;
        Ok(Some(RawMsg {
            header,
            desc,
            payload,
        }))
    }

    /// Reads one whole message; panics on EOF, error or timeout.
    pub fn recv(&mut self) -> RawMsg {
        match self.try_recv() {
            Ok(Some(m)) => m,
            Ok(None) => panic!("agent closed the connection instead of answering"),
            Err(e) => panic!("no answer from the agent: {e}"),
        }
    }

    /// Expects an Error with `status` for `request_id`; returns its text.
    pub fn expect_error(&mut self, status: Status, request_id: u64) -> String {
        let m = self.recv();
        assert_eq!(
            m.header.kind,
            Kind::Error,
            "expected an Error {status}, got {:?} ({})",
            m.header,
            m.error_text()
        );
        assert_eq!(
            m.header.status,
            status,
            "wrong status; message: {}",
            m.error_text()
        );
        assert_eq!(
            m.header.request_id, request_id,
            "Error carries the wrong request id"
        );
        m.error_text()
    }

    /// Expects the agent to close the connection (EOF or reset) within
    /// `limit`, with nothing more sent first.
    pub fn expect_closed(&mut self, limit: Duration) {
        self.set_read_timeout(limit);
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => panic!(
                    "expected the agent to close the connection, it sent {n} more bytes: {:02x?}",
                    &buf[..n.min(64)]
                ),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return
                }
                Err(e) => panic!(
                    "the agent did not close the connection within {limit:?} ({:?}): {e}",
                    start.elapsed()
                ),
            }
        }
    }

    /// Bounds each read.
    pub fn set_read_timeout(&self, t: Duration) {
        match &self.s {
            RawStream::Unix(s) => s.set_read_timeout(Some(t)),
            RawStream::Tcp(s) => s.set_read_timeout(Some(t)),
        }
        .expect("set read timeout");
    }

    /// Closes the write direction (the agent sees EOF).
    pub fn shutdown_write(&self) {
        let _ = match &self.s {
            RawStream::Unix(s) => s.shutdown(Shutdown::Write),
            RawStream::Tcp(s) => s.shutdown(Shutdown::Write),
        };
    }

    /// Resolves a model name with ModelQuery.
    pub fn model_id(&mut self, name: &str) -> u32 {
        let body = encode_model_name(name);
        let mut h = Header::new(Kind::ModelQuery);
        h.request_id = self.id();
        h.desc_len = body.len() as u32;
        self.send(&h, &body, &[]);
        let m = self.recv();
        assert_eq!(
            m.header.kind,
            Kind::ModelInfo,
            "{}: {}",
            name,
            m.error_text()
        );
        assert_eq!(m.header.request_id, h.request_id);
        m.header.model_id
    }

    /// A Ping answered by a Pong on this connection.
    pub fn ping(&mut self) {
        let mut h = Header::new(Kind::Ping);
        h.request_id = self.id();
        self.send(&h, &[], &[]);
        let m = self.recv();
        assert_eq!(m.header.kind, Kind::Pong, "ping answered with {m:?}");
        assert_eq!(m.header.request_id, h.request_id);
    }

    /// Sends a well-formed identity request on this very connection and
    /// checks the response (the connection is still in sync).
    pub fn good_identity_request(&mut self, identity_id: u32) {
        let a = pattern(33, 9);
        let b = pattern(8 * 3, 10);
        let id = self.id();
        let (h, desc, payload) = request(
            id,
            identity_id,
            &[(DType::U8, &[33], &a), (DType::I64, &[3], &b)],
            0,
        );
        self.send(&h, &desc, &payload);
        let m = self.recv();
        assert_eq!(
            m.header.kind,
            Kind::Response,
            "good request answered with {:?}: {}",
            m.header,
            m.error_text()
        );
        assert_eq!(m.header.request_id, id);
        let s = wire::decode_tensor_section(&m.header, &m.desc).expect("response descriptors");
        assert_eq!(s.tensors.len(), 2);
        let t0 = &s.tensors[0];
        let t1 = &s.tensors[1];
        assert_eq!(
            &m.payload[t0.offset as usize..(t0.offset + t0.len) as usize],
            &a[..]
        );
        assert_eq!(
            &m.payload[t1.offset as usize..(t1.offset + t1.len) as usize],
            &b[..]
        );
    }
}

/// A tensor to put in a hand-built request: dtype, shape, bytes.
pub type RawTensor<'a> = (DType, &'a [u64], &'a [u8]);

/// A well-formed Request laid out as senders must (64-byte aligned tensors),
/// with the padding between tensors filled with `pad` (receivers must
/// ignore it). Returns header, descriptor section and payload.
pub fn request(
    request_id: u64,
    model_id: u32,
    tensors: &[RawTensor<'_>],
    pad: u8,
) -> (Header, Vec<u8>, Vec<u8>) {
    let (offsets, payload_len) =
        layout_payload(tensors.iter().map(|t| t.2.len() as u64)).expect("layout");
    let descs: Vec<TensorDesc> = tensors
        .iter()
        .zip(&offsets)
        .map(|(&(dtype, shape, data), &offset)| TensorDesc {
            dtype,
            shape: shape.to_vec(),
            offset,
            len: data.len() as u64,
        })
        .collect();
    let mut payload = vec![pad; payload_len as usize];
    for (t, &off) in tensors.iter().zip(&offsets) {
        payload[off as usize..off as usize + t.2.len()].copy_from_slice(t.2);
    }
    let (h, desc) = request_from_descs(request_id, model_id, &descs, payload_len);
    (h, desc, payload)
}

/// A Request header and descriptor section for arbitrary (possibly invalid)
/// descriptors and payload length.
pub fn request_from_descs(
    request_id: u64,
    model_id: u32,
    descs: &[TensorDesc],
    payload_len: u64,
) -> (Header, Vec<u8>) {
    let mut desc = Vec::new();
    encode_tensor_section(descs, None, &mut desc);
    let mut h = Header::new(Kind::Request);
    h.request_id = request_id;
    h.model_id = model_id;
    h.tensor_count = descs.len() as u32;
    h.desc_len = desc.len() as u32;
    h.payload_len = payload_len;
    (h, desc)
}

// ---------------------------------------------------------------------------
// The `tensorwire` binary

/// A command running the `tensorwire` binary ([`tensorwire_bin`]) that
/// cannot outlive this test process: the child gets SIGKILL when the thread
/// that started it ends (`PR_SET_PDEATHSIG`). A test that times out leaves
/// its thread blocked (see [`within`]), and without this its agents kept
/// running, spinning on a core, after the test binary exited, and skewed
/// whatever ran next. Start children on the thread that owns them (a test
/// body, or [`within`]'s thread), not on a short-lived helper thread.
pub fn tensorwire_command() -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(tensorwire_bin());
    // SAFETY: the closure runs in the forked child before exec and only
    // makes one async-signal-safe system call (prctl), touching no memory
    // of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    cmd
}

/// The `tensorwire` binary of this build profile, built once per test
/// process with `cargo build -p tensorwire-cli` (a no-op when up to date).
pub fn tensorwire_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(build_bin)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn build_bin() -> Result<PathBuf, String> {
    let bin = cargo_build(&["-p", "tensorwire-cli", "--bin", "tensorwire"])?.join("tensorwire");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("built, but {} does not exist", bin.display()))
    }
}

/// Runs `cargo build <what>` for this test's target directory and profile
/// (a no-op when up to date; at most 10 minutes) and returns the profile's
/// output directory (`<target>/<profile>`).
pub fn cargo_build(what: &[&str]) -> Result<PathBuf, String> {
    // Tests run from <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test executable path {}", exe.display()))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("no target directory above {}", profile_dir.display()))?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"])
        .args(what)
        .arg("--manifest-path")
        .arg(repo_root().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::null());
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let what = format!("cargo build {}", what.join(" "));
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `{what}`: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{what}` took over 10 minutes"));
            }
            Err(e) => return Err(format!("waiting for cargo: {e}")),
        }
    };
    if !status.success() {
        return Err(format!("`{what}` failed: {status}"));
    }
    Ok(profile_dir.to_path_buf())
}

/// Runs the binary with `args` to completion (bounded by `limit`);
/// returns (status, stdout, stderr).
pub fn run_bin(args: &[&str], limit: Duration) -> (ExitStatus, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let what = format!("tensorwire {}", args.join(" "));
    within(limit, &what.clone(), move || {
        let out = tensorwire_command()
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
}

/// A `tensorwire serve` child process. Killed (SIGKILL) when dropped if it
/// is still running.
pub struct ServeProcess {
    child: Child,
    _own_dir: Option<tempfile::TempDir>,
    /// The Unix socket file it listens on (`<dir>/s.sock`).
    pub sock_path: PathBuf,
    /// The endpoints it printed (`listening on URI` lines), in order.
    pub uris: Vec<String>,
    stderr_path: PathBuf,
}

static SERVE_SEQ: AtomicU64 = AtomicU64::new(0);

impl ServeProcess {
    /// Starts `tensorwire serve --listen unix://<tmp>/s.sock` plus `extra`
    /// arguments in a fresh temporary directory, and waits (at most 30 s)
    /// until it printed one `listening on` line per `--listen`.
    pub fn spawn(extra: &[&str]) -> ServeProcess {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut p = ServeProcess::spawn_in(dir.path(), extra);
        p._own_dir = Some(dir);
        p
    }

    /// Like [`ServeProcess::spawn`], listening on `<dir>/s.sock` (which may
    /// be left over from an agent that died).
    pub fn spawn_in(dir: &Path, extra: &[&str]) -> ServeProcess {
        let listens = 1 + extra.iter().filter(|a| **a == "--listen").count();
        ServeProcess::spawn_expecting(dir, extra, listens)
    }

    /// Like [`ServeProcess::spawn`], with `--config <dir>/agent.toml`
    /// holding `toml`; waits for a `listening on` line for every URI of
    /// its `listen` list too.
    pub fn spawn_with_config(toml: &str, extra: &[&str]) -> ServeProcess {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, toml).expect("write the config file");
        let cfg = server::AgentConfig::from_toml(toml).expect("a valid config");
        let path = path.to_str().expect("a UTF-8 path").to_string();
        let mut args = vec!["--config", path.as_str()];
        args.extend_from_slice(extra);
        let listens = 1
            + cfg.listen.len()
            + cfg.front_doors.len()
            + extra.iter().filter(|a| **a == "--listen").count();
        let mut p = ServeProcess::spawn_expecting(dir.path(), &args, listens);
        p._own_dir = Some(dir);
        p
    }

    fn spawn_expecting(dir: &Path, extra: &[&str], listens: usize) -> ServeProcess {
        let sock_path = dir.join("s.sock");
        let stderr_path = dir.join(format!(
            "stderr-{}.log",
            SERVE_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let unix = format!("unix://{}", sock_path.display());
        let mut cmd = tensorwire_command();
        cmd.arg("serve")
            .arg("--listen")
            .arg(&unix)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().expect("spawn tensorwire serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let mut p = ServeProcess {
            child,
            _own_dir: None,
            sock_path,
            uris: Vec::new(),
            stderr_path,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.uris.len() < listens {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(uri) = line.strip_prefix("listening on ") {
                        p.uris.push(uri.trim().to_string());
                    }
                }
                Err(_) => panic!(
                    "tensorwire serve did not print {listens} `listening on` lines within 30 s \
                     (got {:?}); stderr:\n{}",
                    p.uris,
                    p.stderr()
                ),
            }
        }
        assert_eq!(p.uris[0], unix, "first endpoint printed");
        p
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends `sig` to it.
    pub fn signal(&self, sig: libc::c_int) {
        send_signal(self.pid(), sig);
    }

    /// Sends SIGSTOP and waits until every thread of it is stopped (a
    /// signal is delivered asynchronously: threads running on another core
    /// may go on for a moment after kill(2) returns).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.pid());
        wait_until(Duration::from_secs(5), "the agent's threads stop", || {
            std::fs::read_dir(&tasks)
                .expect("read /proc/PID/task")
                .filter_map(Result::ok)
                .all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // The state follows the command name, which is in parentheses.
                    let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
                    matches!(state, Some('T') | Some('t') | None)
                })
        });
    }

    /// Whether it is still running (not exited, not killed).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for it to exit, at most `limit`; panics if it does not.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "tensorwire serve still running {limit:?} after being told to stop; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends signal `sig` to process `pid` (one we started).
pub fn send_signal(pid: i32, sig: libc::c_int) {
    assert!(pid > 0, "refusing to signal pid {pid}");
    // SAFETY: kill(2) takes plain integers and touches no memory of ours;
    // `pid` is a child this test started (checked positive above, so it can
    // never mean "every process" or a process group).
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}): {}", io::Error::last_os_error());
}

/// The status code of `GET path` on an HTTP front door at `addr`
/// (`HOST:PORT`), over a bare `TcpStream` (`Connection: close`).
pub fn http_status(addr: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {reply:?}"))
}
