//! [`ShmChannel`]: one shared-memory session seen from one side — its arena,
//! its two rings, its sleep words, and the Unix socket it was bootstrapped
//! over (kept open only to notice the peer's death).
//!
//! Bootstrap: the client connects to the agent's control socket and sends a
//! Hello (wire framing); the agent creates the session's arena, writes its
//! [`Layout`], and answers with a HelloAck carrying the arena's memfd
//! (`SCM_RIGHTS`) in the same `sendmsg`. From then on messages travel
//! through the rings: a 64-byte header slot followed by the descriptor
//! section in whole slots, published at once. Tensor bytes never travel:
//! descriptors point into the data area.
//!
//! Waiting is hybrid: a receiver spins for a bounded time (no syscalls while
//! the peer answers quickly), then marks itself asleep in its sleep word and
//! sleeps on it (futex) in slices, checking between slices that the peer is
//! still alive. A sender wakes the peer only when that word says it sleeps,
//! so busy sessions make no syscalls at all.
//!
//! Placement: two sides polling for each other on one CPU can only take
//! turns (~8 µs a round trip instead of ~0.5). While it polls, each side
//! publishes its CPU in its spin CPU word ([`layout`](crate::shm::layout));
//! at each of its spin's clock reads it compares the peer's. When both poll
//! on one CPU, the agent steps off it ([`CpuStep`]); the client steps off
//! only when the agent's word says the agent may not. A side whose turn it
//! is to move but whose mask holds it there stops spinning and sleeps,
//! handing the CPU to its peer; one that moved less than 1 ms ago polls on
//! (more polling threads than CPUs: moving again would only bounce them).
//!
//! Yielding: a side may share its channel among threads (the client: one
//! reads while others send). A thread that wants the channel while another
//! waits in it asks the waiter to give it up ([`ShmYield::want`]): the
//! waiter's receive ends early, `TimedOut`, within one poll or at once from
//! its futex sleep. So a waiter can sleep as long as its answer takes
//! without holding senders back, and need not wake on a short clock to let
//! them through.
//!
//! Parking: the agent can hand a session that has been quiet for a while
//! back to its event loop instead of keeping a thread asleep on the futex
//! ([`ShmChannel::recv_or_park`]). It then sets its sleep word to
//! [`SLEEP_PARKED`], and a sender that finds that value wakes it with one
//! byte on the control socket, which the event loop watches (with the
//! peer's hang-up) — the futex cannot be watched by `epoll`.

use crate::cadence::{Cadence, Forecast};
use crate::cpu::{self, CpuStep, Step};
use crate::shm::fdpass::{recv_with_fd, send_with_fd};
use crate::shm::layout::{Layout, AGENT_CPU, AGENT_SLEEP, CLIENT_CPU, CLIENT_SLEEP, CPU_PINNED};
use crate::shm::ring::{Consumer, Producer, Ring, RingError, SLOT_LEN};
use crate::shm::{futex, Arena};
use crate::spin::{Spin, SpinSlot, SHM_POLLERS};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use wire::{
    decode_error_body, decode_hello, decode_hello_request, encode_hello, Header, Kind, Limits,
    Status, WireError, HEADER_LEN,
};

/// Why a shared-memory session failed.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use transport::shm::{ShmChannel, ShmError};
/// use wire::Limits;
/// let dir = tempfile::tempdir()?;
/// let r = ShmChannel::connect(&dir.path().join("none"), &Limits::default(), None, 1, Duration::from_secs(1));
/// assert!(matches!(r, Err(ShmError::Io(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Error)]
pub enum ShmError {
    /// The control socket failed.
    #[error("shm control socket: {0}")]
    Io(#[from] io::Error),
    /// A message broke the protocol.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The peer broke a ring.
    #[error("{0}")]
    Ring(#[from] RingError),
    /// The bootstrap went wrong (bad arena, missing fd, ...).
    #[error("shm bootstrap: {0}")]
    Bootstrap(String),
    /// The agent refused the session.
    #[error("agent refused the session ({status}): {message}")]
    Refused {
        /// The status.
        status: Status,
        /// The agent's message.
        message: String,
    },
    /// The peer's process is gone (its end of the control socket closed).
    #[error("peer gone (its control socket closed)")]
    PeerGone,
    /// Nothing arrived before the deadline.
    #[error("timed out waiting for the peer")]
    TimedOut,
}

/// Sleep-word value of a side that sleeps on the futex (PROTOCOL §14.9).
///
/// # Examples
///
/// The client sees the agent fall asleep in its word, and its next
/// message wakes it:
///
/// ```
/// use std::sync::atomic::Ordering;
/// use std::time::Duration;
/// use transport::shm::layout::AGENT_SLEEP;
/// use transport::shm::{WaitPolicy, SLEEP_FUTEX};
/// use wire::{Header, Kind};
/// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
/// #     let dir = tempfile::tempdir()?;
/// #     let path = dir.path().join("c.sock");
/// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
/// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
/// #     let t = std::time::Duration::from_secs(5);
/// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
/// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
/// #     });
/// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
/// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
/// # }
/// let (mut agent, mut client, limits) = session()?;
/// let arena = client.arena().clone();
/// let waiter = std::thread::spawn(move || {
///     let quick = WaitPolicy { spin: Duration::from_micros(10), ..WaitPolicy::AGENT };
///     agent.recv(&limits, quick, Some(Duration::from_secs(10))).map(|(h, _)| h.kind)
/// });
/// for _ in 0..10_000 { // bounded: ~10 s at most
///     if arena.atomic_u32(AGENT_SLEEP).load(Ordering::Acquire) == SLEEP_FUTEX { break; }
///     std::thread::sleep(Duration::from_millis(1));
/// }
/// assert_eq!(arena.atomic_u32(AGENT_SLEEP).load(Ordering::Acquire), SLEEP_FUTEX);
/// client.send(&Header::new(Kind::Ping), &[])?; // sees the word, wakes the futex
/// assert_eq!(waiter.join().map_err(|_| "agent panicked")??, Kind::Ping);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const SLEEP_FUTEX: u32 = 1;
/// Sleep-word value of a side that waits on its control socket instead of
/// the futex: a sender wakes it by writing one byte there (PROTOCOL §14.9).
/// Example: [`ShmChannel::recv_or_park`].
pub const SLEEP_PARKED: u32 = 2;

/// Sizes of a session's arena (the agent decides them).
///
/// # Examples
///
/// ```
/// use transport::shm::{Layout, ShmSizes};
/// let sizes = ShmSizes { client_len: 16 << 20, agent_len: 4 << 20, ..ShmSizes::default() };
/// let layout = Layout::new(sizes.ring_capacity, sizes.client_len, sizes.agent_len)?;
/// assert_eq!((layout.client_len, layout.agent_len()), (16 << 20, 4 << 20));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmSizes {
    /// Slots per ring.
    pub ring_capacity: u32,
    /// Bytes of the client's region (its input tensors).
    pub client_len: usize,
    /// Bytes of the agent's region (outputs).
    pub agent_len: usize,
    /// The arena header's `features` word: what this agent offers its
    /// clients ([`crate::shm::layout::FEATURE_PULL`]: it pulls inputs from
    /// the client's memory, when started to).
    pub features: u64,
}

impl ShmSizes {
    /// These sizes, with the two regions shrunk in proportion (to whole
    /// pages) so that the whole arena (header page, rings, regions) takes
    /// at most `max_arena` bytes. Unchanged when they fit. Rings that would
    /// take more than half the budget are halved (down to 8 slots) first;
    /// a budget below the header and the smallest rings leaves one page per
    /// region (over the budget: the least a session needs).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::ShmSizes;
    /// let asked = ShmSizes::default(); // 256 MiB + 64 MiB
    /// let fitted = asked.within(64 << 20); // a tenant limited to 64 MiB arenas
    /// assert!(fitted.client_len + fitted.agent_len < 64 << 20);
    /// assert!(fitted.client_len > fitted.agent_len); // in proportion
    /// assert_eq!(asked.within(1 << 40), asked); // fits: unchanged
    /// ```
    pub fn within(self, max_arena: u64) -> ShmSizes {
        const PAGE: usize = 4096;
        let budget = usize::try_from(max_arena).unwrap_or(usize::MAX);
        let ring_bytes = |cap: u32| Ring::bytes_needed(cap).div_ceil(PAGE) * PAGE;
        let mut ring_capacity = self.ring_capacity;
        while ring_capacity > 8 && PAGE + 2 * ring_bytes(ring_capacity) > budget / 2 {
            ring_capacity /= 2;
        }
        let this = ShmSizes {
            ring_capacity,
            ..self
        };
        let fixed = PAGE + 2 * ring_bytes(ring_capacity);
        let data = budget.saturating_sub(fixed) / PAGE * PAGE;
        let (c, a) = (
            this.client_len.div_ceil(PAGE),
            this.agent_len.div_ceil(PAGE),
        );
        if (c + a) * PAGE <= data {
            return this;
        }
        let pages = (data / PAGE).max(2);
        // u128: pages × c cannot overflow.
        let client = ((pages as u128 * c as u128) / (c + a).max(1) as u128) as usize;
        let client = client.clamp(1, pages - 1);
        ShmSizes {
            client_len: client * PAGE,
            agent_len: (pages - client) * PAGE,
            ..this
        }
    }
}

impl Default for ShmSizes {
    fn default() -> Self {
        // Virtual sizes: pages are only backed once touched.
        ShmSizes {
            ring_capacity: 256,
            client_len: 256 << 20,
            agent_len: 64 << 20,
            features: 0,
        }
    }
}

/// How a receiver waits.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use transport::shm::WaitPolicy;
/// // A latency-critical client: spin longer before sleeping.
/// let eager = WaitPolicy { spin: Duration::from_millis(1), ..WaitPolicy::CLIENT };
/// assert!(eager.spin > WaitPolicy::CLIENT.spin);
/// assert_eq!(eager.slice, Duration::from_millis(20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long to spin before sleeping.
    pub spin: Duration,
    /// How long each sleep lasts before the peer's liveness is checked.
    pub slice: Duration,
    /// Whether this wait may move its thread off a CPU it finds shared
    /// with the peer, when that is this side's turn (see the module docs).
    /// Off, a collision is polled through, yielding (a side pinned there
    /// still sleeps). The agent turns it off for the short polls of
    /// sessions beyond its polling slots.
    pub step_off: bool,
}

impl WaitPolicy {
    /// The agent's default: spin 50 µs, check liveness every 250 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::shm::WaitPolicy;
    /// assert_eq!((WaitPolicy::AGENT.spin, WaitPolicy::CLIENT.spin), (Duration::from_micros(50), Duration::from_micros(200)));
    /// // `serve --shm-spin-us 0`: sleep at once
    /// let idle_friendly = WaitPolicy { spin: Duration::ZERO, ..WaitPolicy::AGENT };
    /// assert!(idle_friendly.step_off);
    /// ```
    pub const AGENT: WaitPolicy = WaitPolicy {
        spin: Duration::from_micros(50),
        slice: Duration::from_millis(250),
        step_off: true,
    };
    /// The client's default: spin 200 µs, check liveness every 20 ms.
    /// Example: [`WaitPolicy::AGENT`].
    pub const CLIENT: WaitPolicy = WaitPolicy {
        spin: Duration::from_micros(200),
        slice: Duration::from_millis(20),
        step_off: true,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Agent,
    Client,
}

/// One side of a shared-memory session.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixListener;
/// use std::time::Duration;
/// use transport::shm::{ShmChannel, ShmSizes, WaitPolicy};
/// use wire::{Header, Kind, Limits};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("control.sock");
/// let listener = UnixListener::bind(&path)?;
/// let sizes = ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..ShmSizes::default() };
/// let t = Duration::from_secs(5);
/// // The agent side: answer the Hello, make the arena, hand it over.
/// let agent = std::thread::spawn(move || -> Result<(), transport::shm::ShmError> {
///     let (sock, _) = listener.accept()?;
///     let (mut ch, limits) = ShmChannel::accept(sock, &Limits::default(), sizes, t)?;
///     let (h, _) = ch.recv(&limits, WaitPolicy::AGENT, Some(t))?;
///     let mut pong = Header::new(Kind::Pong);
///     pong.request_id = h.request_id;
///     ch.send(&pong, &[])?;
///     Ok(())
/// });
/// // The client side: connect, map the arena, talk through its rings.
/// let (mut ch, limits) = ShmChannel::connect(&path, &Limits::default(), None, 1, t)?;
/// assert_eq!(ch.layout().client_len, 1 << 20);
/// let mut ping = Header::new(Kind::Ping);
/// ping.request_id = 2;
/// assert!(ch.send(&ping, &[])?); // room in the ring
/// let (h, _) = ch.recv(&limits, WaitPolicy::CLIENT, Some(t))?;
/// assert_eq!((h.kind, h.request_id), (Kind::Pong, 2));
/// agent.join().map_err(|_| "agent panicked")??;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ShmChannel {
    arena: Arc<Arena>,
    layout: Layout,
    side: Side,
    tx: Producer,
    rx: Consumer,
    sock: UnixStream,
    /// This side's moves off its peer's CPU.
    step: CpuStep,
    /// What this side last wrote in its spin CPU word (0: not polling).
    spinning: u32,
    /// Whether this thread's mask allows it one CPU only (read when the
    /// channel is made, and when a move finds the mask narrowed; not at
    /// every collision: a system call every 64 polls while two threads
    /// take turns on one CPU would lengthen each turn).
    pinned: bool,
    /// Threads of this side that want the channel ([`ShmYield`]): a wait
    /// ends early while it is not 0.
    wanted: Arc<AtomicUsize>,
}

/// Asks a thread waiting in a [`ShmChannel`]'s receive to give the channel
/// up (see "Yielding" in the module docs). Cheap to clone; one per channel
/// ([`ShmChannel::yielder`]).
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use transport::shm::{ShmChannel, ShmError, WaitPolicy};
/// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
/// #     let dir = tempfile::tempdir()?;
/// #     let path = dir.path().join("c.sock");
/// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
/// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
/// #     let t = std::time::Duration::from_secs(5);
/// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
/// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
/// #     });
/// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
/// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
/// # }
/// let (_agent, client, limits) = session()?;
/// let yielder = client.yielder();
/// let ch = Arc::new(Mutex::new(client));
/// let reader = {
///     let ch = ch.clone();
///     // Waits up to 10 s for a message that never comes...
///     std::thread::spawn(move || ch.lock().unwrap().recv(&limits, WaitPolicy::CLIENT, Some(Duration::from_secs(10))))
/// };
/// std::thread::sleep(Duration::from_millis(50));
/// let t = std::time::Instant::now();
/// let want = yielder.want(); // ...until another thread wants the channel
/// let _ch = ch.lock().unwrap();
/// drop(want);
/// assert!(t.elapsed() < Duration::from_secs(5));
/// assert!(matches!(reader.join().unwrap(), Err(ShmError::TimedOut)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ShmYield {
    arena: Arc<Arena>,
    /// This side's sleep word's offset in the arena.
    sleep: usize,
    wanted: Arc<AtomicUsize>,
}

/// A thread's wish for the channel, from [`ShmYield::want`] until dropped
/// (drop it once the channel is had: waits end early while it lives).
#[derive(Debug)]
pub struct WantChannel<'a>(&'a ShmYield);

impl ShmYield {
    /// Asks the thread waiting in the channel, if any, to give it up: its
    /// receive ends `TimedOut` (at once if it sleeps), and waits end early
    /// until the returned guard drops.
    pub fn want(&self) -> WantChannel<'_> {
        self.wanted.fetch_add(1, Ordering::SeqCst);
        // The futex handshake of `wake_peer`, on this side's own word: a
        // waiter that stored SLEEP_FUTEX before this load sleeps on a
        // value that is no longer there (woken, or its wait returns at
        // once); one that stores it after sees `wanted` first.
        let word = self.arena.atomic_u32(self.sleep);
        if word.swap(0, Ordering::SeqCst) == SLEEP_FUTEX {
            // A failed wake leaves the waiter to its own time limit.
            let _ = futex::wake(word, 1);
        }
        WantChannel(self)
    }

    /// Whether a thread wants the channel now.
    pub fn is_wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) != 0
    }
}

impl Drop for WantChannel<'_> {
    fn drop(&mut self) {
        self.0.wanted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The control-socket path for `shm://name`: `$TENSORWIRE_SHM_DIR/name.sock`,
/// else `$XDG_RUNTIME_DIR/tensorwire/name.sock`, else
/// `<temp dir>/tensorwire-<uid>/name.sock`. The directory is created with
/// mode 0700 (only this user can reach the agent's control socket). An
/// existing one is trusted when it is owned by this user or by root and
/// writable by no one else: an agent run by root serves clients of other
/// users through a `TENSORWIRE_SHM_DIR` they can enter (e.g. a root-owned
/// 0755 directory), with `serve --socket-mode`. (An agent run by another
/// service user would need its clients to trust that user's directory:
/// not supported.)
///
/// # Examples
///
/// ```
/// use transport::shm::control_path;
/// let dir = tempfile::tempdir()?;
/// std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
/// assert_eq!(control_path("agent")?, dir.path().join("agent.sock"));
/// assert!(control_path("../etc").is_err()); // names only, never paths
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn control_path(name: &str) -> io::Result<PathBuf> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shm name '{name}' must be 1..=64 characters of [A-Za-z0-9._-]"),
        ));
    }
    let dir = if let Some(d) = std::env::var_os("TENSORWIRE_SHM_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("tensorwire")
    } else {
        std::env::temp_dir().join(format!("tensorwire-{}", rustix::process::getuid().as_raw()))
    };
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    // The directory may have existed already (e.g. made by another user in a
    // shared temp dir, to plant an impostor agent): trust it only if it is a
    // real directory, ours or root's, and writable by no one else.
    let meta = std::fs::symlink_metadata(&dir)?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || (meta.uid() != uid && meta.uid() != 0) || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a directory owned by uid {uid} or root that no one else can write to (it is {}, owner uid {}, mode {:o}); \
                 remove it or set TENSORWIRE_SHM_DIR",
                dir.display(),
                if meta.is_dir() { "a directory" } else { "not a directory" },
                meta.uid(),
                meta.mode() & 0o777
            ),
        ));
    }
    Ok(dir.join(format!("{name}.sock")))
}

fn read_message(sock: &mut UnixStream, first: &[u8]) -> Result<(Header, Vec<u8>), ShmError> {
    let mut head = [0u8; HEADER_LEN];
    head[..first.len()].copy_from_slice(first);
    sock.read_exact(&mut head[first.len()..])?;
    let h = Header::decode(&head)?;
    h.check_limits(&Limits::default())?;
    let mut body = vec![0u8; h.desc_len as usize];
    sock.read_exact(&mut body)?;
    Ok((h, body))
}

impl ShmChannel {
    /// Agent side: answers the Hello on a freshly accepted control socket,
    /// creates the session's arena and hands it over. Returns the channel and
    /// the limits in force. Example: [`ShmChannel`].
    pub fn accept(
        mut sock: UnixStream,
        agent_limits: &Limits,
        sizes: ShmSizes,
        timeout: Duration,
    ) -> Result<(ShmChannel, Limits), ShmError> {
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let (h, body) = read_message(&mut sock, &[])?;
        ShmChannel::answer_hello(sock, h, body, agent_limits, sizes)
    }

    /// Agent side, for a server that reads the Hello itself without
    /// blocking (so that a client sending it slowly holds no thread):
    /// `hello` is the whole message as read (header and body), and the
    /// rest is [`ShmChannel::accept`]'s. Writes are bounded by `timeout`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Read;
    /// use std::os::unix::net::UnixListener;
    /// use std::time::Duration;
    /// use transport::shm::{ShmChannel, ShmSizes};
    /// use wire::{Header, Limits, HEADER_LEN};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("c.sock");
    /// let listener = UnixListener::bind(&path)?;
    /// let t = Duration::from_secs(5);
    /// let agent = std::thread::spawn(move || -> Result<Limits, Box<dyn std::error::Error + Send + Sync>> {
    ///     let (mut sock, _) = listener.accept()?;
    ///     // (A server reads these bytes as they come, holding no thread.)
    ///     let mut hello = vec![0u8; HEADER_LEN];
    ///     sock.read_exact(&mut hello)?;
    ///     let h = Header::decode(&hello)?;
    ///     hello.resize(HEADER_LEN + h.desc_len as usize, 0);
    ///     sock.read_exact(&mut hello[HEADER_LEN..])?;
    ///     let sizes = ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..ShmSizes::default() };
    ///     Ok(ShmChannel::accept_hello(sock, &hello, &Limits::default(), sizes, t)?.1)
    /// });
    /// let asked = Limits { max_in_flight: 4, ..Limits::default() };
    /// let (_client, limits) = ShmChannel::connect(&path, &asked, None, 1, t)?;
    /// assert_eq!(limits.max_in_flight, 4);
    /// assert_eq!(agent.join().map_err(|_| "agent panicked")?.map_err(|e| e.to_string())?, limits);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn accept_hello(
        sock: UnixStream,
        hello: &[u8],
        agent_limits: &Limits,
        sizes: ShmSizes,
        timeout: Duration,
    ) -> Result<(ShmChannel, Limits), ShmError> {
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let h = Header::decode(&hello[..hello.len().min(HEADER_LEN)])?;
        h.check_limits(&Limits::default())?;
        let end = HEADER_LEN + h.desc_len as usize;
        let body = hello.get(HEADER_LEN..end).ok_or_else(|| {
            ShmError::Bootstrap(format!(
                "the Hello is {} bytes, its header says {end}",
                hello.len()
            ))
        })?;
        ShmChannel::answer_hello(sock, h, body.to_vec(), agent_limits, sizes)
    }

    /// Answers a Hello read off `sock`: refuses it, or creates the arena and
    /// sends the HelloAck with it.
    fn answer_hello(
        mut sock: UnixStream,
        h: Header,
        body: Vec<u8>,
        agent_limits: &Limits,
        sizes: ShmSizes,
    ) -> Result<(ShmChannel, Limits), ShmError> {
        let refuse = |sock: &mut UnixStream, status: Status, msg: &str| {
            let body = wire::encode_error_body(msg);
            let mut e = Header::new(Kind::Error);
            e.request_id = h.request_id;
            e.status = status;
            e.desc_len = body.len() as u32;
            let _ = sock.write_all(&[&e.encode()[..], &body].concat());
        };
        if h.kind != Kind::Hello {
            refuse(
                &mut sock,
                Status::UnknownKind,
                "the first message must be Hello",
            );
            return Err(ShmError::Bootstrap(format!(
                "first message was {:?}",
                h.kind
            )));
        }
        // The token (if any) was the agent's to check before this call.
        let asked = match decode_hello_request(&body) {
            Ok(hello) => hello.limits,
            Err(e) => {
                refuse(&mut sock, e.status(), &e.to_string());
                return Err(e.into());
            }
        };
        let layout = Layout::new(sizes.ring_capacity, sizes.client_len, sizes.agent_len)
            .map_err(ShmError::Bootstrap)?;
        let mut limits = agent_limits.narrowed_by(&asked);
        // A message's descriptors must fit the ring beside its header, and
        // a request's tensors the client's region.
        limits.max_desc_len = limits
            .max_desc_len
            .min((sizes.ring_capacity - 1) * SLOT_LEN as u32);
        limits.max_payload = limits.max_payload.min(layout.client_len as u64);
        let arena = Arena::create("tensorwire-shm", layout.arena_len)?;
        layout.write(&arena, sizes.features);
        let ack_body = encode_hello(&limits);
        let mut ack = Header::new(Kind::HelloAck);
        ack.request_id = h.request_id;
        ack.desc_len = ack_body.len() as u32;
        send_with_fd(&sock, &[&ack.encode()[..], &ack_body].concat(), arena.fd())?;
        sock.set_read_timeout(None)?;
        let ch = ShmChannel::new(Arc::new(arena), layout, Side::Agent, sock)?;
        Ok((ch, limits))
    }

    /// Client side: connects to the control socket at `path`, says Hello
    /// asking for `asked` (with `token`, the bearer token naming the
    /// client's tenant, if it has one), and maps the arena the agent sends
    /// back.
    ///
    /// Example: [`ShmChannel`]; an agent that is not there: [`ShmError`].
    pub fn connect(
        path: &Path,
        asked: &Limits,
        token: Option<&[u8]>,
        request_id: u64,
        timeout: Duration,
    ) -> Result<(ShmChannel, Limits), ShmError> {
        ShmChannel::connect_as(path, asked, token, false, request_id, timeout)
    }

    /// [`connect`](ShmChannel::connect), the Hello marked
    /// `wire::HELLO_ANONYMOUS` when `anonymous` (a relay speaking for a
    /// client it could not identify).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixListener;
    /// use std::time::Duration;
    /// use transport::shm::{ShmChannel, ShmSizes};
    /// use wire::Limits;
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("c.sock");
    /// let listener = UnixListener::bind(&path)?;
    /// let t = Duration::from_secs(5);
    /// let agent = std::thread::spawn(move || -> Result<(), transport::shm::ShmError> {
    ///     let sizes = ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..ShmSizes::default() };
    ///     ShmChannel::accept(listener.accept()?.0, &Limits::default(), sizes, t).map(drop)
    /// });
    /// // A gateway relaying a client it could not identify:
    /// let (ch, _) = ShmChannel::connect_as(&path, &Limits::default(), None, true, 1, t)?;
    /// assert_eq!(ch.layout().client_len, 1 << 20);
    /// agent.join().map_err(|_| "agent panicked")??;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_as(
        path: &Path,
        asked: &Limits,
        token: Option<&[u8]>,
        anonymous: bool,
        request_id: u64,
        timeout: Duration,
    ) -> Result<(ShmChannel, Limits), ShmError> {
        let mut sock = UnixStream::connect(path)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let body = wire::encode_hello_as(asked, token, anonymous);
        let mut h = Header::new(Kind::Hello);
        h.request_id = request_id;
        h.desc_len = body.len() as u32;
        // An agent that refuses the session answers at once and closes,
        // maybe before this write: its answer is still there to read, and
        // says more than the broken pipe.
        let unsent = sock.write_all(&[&h.encode()[..], &body].concat()).err();
        let mut first = [0u8; HEADER_LEN];
        let (n, fd) = match (recv_with_fd(&sock, &mut first), unsent) {
            (Ok((0, _)), Some(e)) | (Err(_), Some(e)) => return Err(e.into()),
            (Ok(got), _) => got,
            (Err(e), None) => return Err(e.into()),
        };
        if n == 0 {
            return Err(ShmError::PeerGone);
        }
        let (reply, body) = read_message(&mut sock, &first[..n])?;
        if reply.kind == Kind::Error {
            return Err(ShmError::Refused {
                status: reply.status,
                message: decode_error_body(&body).unwrap_or_default(),
            });
        }
        if reply.kind != Kind::HelloAck {
            return Err(ShmError::Bootstrap(format!(
                "expected HelloAck, got {:?}",
                reply.kind
            )));
        }
        let limits = decode_hello(&body)?;
        let fd = fd.ok_or_else(|| ShmError::Bootstrap("the HelloAck carried no arena".into()))?;
        let arena = Arena::open(fd, None)?;
        let layout = Layout::read(&arena).map_err(ShmError::Bootstrap)?;
        sock.set_read_timeout(None)?;
        let ch = ShmChannel::new(Arc::new(arena), layout, Side::Client, sock)?;
        Ok((ch, limits))
    }

    fn new(
        arena: Arc<Arena>,
        layout: Layout,
        side: Side,
        sock: UnixStream,
    ) -> Result<ShmChannel, ShmError> {
        let req = Ring::new(arena.clone(), layout.request_ring, layout.ring_capacity)
            .map_err(ShmError::Bootstrap)?;
        let resp = Ring::new(arena.clone(), layout.response_ring, layout.ring_capacity)
            .map_err(ShmError::Bootstrap)?;
        let (tx, rx) = match side {
            Side::Client => (req.producer(), resp.consumer()),
            Side::Agent => (resp.producer(), req.consumer()),
        };
        Ok(ShmChannel {
            arena,
            layout,
            side,
            tx,
            rx,
            sock,
            step: CpuStep::new(),
            spinning: 0,
            pinned: !cpu::may_leave(cpu::current()),
            wanted: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The handle other threads of this side use to ask a waiter here to
    /// give the channel up ([`ShmYield`]).
    pub fn yielder(&self) -> ShmYield {
        ShmYield {
            arena: self.arena.clone(),
            sleep: match self.side {
                Side::Agent => AGENT_SLEEP,
                Side::Client => CLIENT_SLEEP,
            },
            wanted: self.wanted.clone(),
        }
    }

    /// The session's arena.
    ///
    /// # Examples
    ///
    /// Both sides map the same memory:
    ///
    /// ```
    /// use std::sync::atomic::Ordering;
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (agent, client, _) = session()?;
    /// let data = client.layout().data_off; // the client's region starts here
    /// client.arena().atomic_u64(data).store(42, Ordering::Release);
    /// assert_eq!(agent.arena().atomic_u64(data).load(Ordering::Acquire), 42);
    /// assert_eq!(agent.arena().len(), agent.layout().arena_len);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// Where everything lives in it. Examples: [`ShmChannel`],
    /// [`ShmChannel::arena`].
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// This side's word (`mine`) or the peer's, of a pair that has one
    /// for the agent at `agent` and one for the client at `client`.
    fn word(&self, agent: usize, client: usize, mine: bool) -> &AtomicU32 {
        let agents = (self.side == Side::Agent) == mine;
        self.arena.atomic_u32(if agents { agent } else { client })
    }

    fn my_sleep(&self) -> &AtomicU32 {
        self.word(AGENT_SLEEP, CLIENT_SLEEP, true)
    }

    fn peer_sleep(&self) -> &AtomicU32 {
        self.word(AGENT_SLEEP, CLIENT_SLEEP, false)
    }

    fn my_cpu(&self) -> &AtomicU32 {
        self.word(AGENT_CPU, CLIENT_CPU, true)
    }

    fn peer_cpu(&self) -> &AtomicU32 {
        self.word(AGENT_CPU, CLIENT_CPU, false)
    }

    /// Publishes where this side polls: `word` (0: not polling), written
    /// only when it changes (the peer reads that cache line).
    fn publish_spin(&mut self, word: u32) {
        if self.spinning != word {
            self.my_cpu().store(word, Ordering::Relaxed);
            self.spinning = word;
        }
    }

    /// This side's spin CPU word for `cpu`.
    fn spin_word(&self, cpu: usize) -> u32 {
        let n = u32::try_from(cpu + 1).unwrap_or(u32::MAX) & !CPU_PINNED;
        n | if self.pinned { CPU_PINNED } else { 0 }
    }

    /// At a spin's clock read: publishes this side's CPU and, if the peer
    /// polls on the same one, steps off it (see the module docs). True
    /// when this side should stop spinning and sleep instead.
    fn collides(&mut self, step_off: bool) -> bool {
        let here = cpu::current();
        self.publish_spin(self.spin_word(here));
        let peer = self.peer_cpu().load(Ordering::Relaxed);
        if peer & !CPU_PINNED != self.spinning & !CPU_PINNED {
            return false;
        }
        // One side acts, so the two do not both move (onto the same other
        // CPU): the agent, unless its mask holds it; then the client.
        if self.side == Side::Client && peer & CPU_PINNED == 0 {
            // Keep polling, word published: the agent sees it at its next
            // clock read and moves. (Sleeping here would clear the word
            // and hide the collision from the agent.)
            return false;
        }
        if self.pinned {
            // This side's turn, and its mask holds it here: hand the CPU
            // over (sleep), the word saying the peer must move.
            return true;
        }
        if !step_off {
            // No CPU to move to (more pollers than CPUs): poll on.
            return false;
        }
        match self.step.step_off(here) {
            Step::Moved => {
                self.publish_spin(self.spin_word(cpu::current()));
                false
            }
            Step::TooSoon | Step::NotThere => false,
            Step::Pinned => {
                // Its mask narrowed since the channel was made.
                self.pinned = true;
                self.publish_spin(self.spin_word(here));
                true
            }
        }
    }

    /// How many times this side moved off its peer's CPU.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (_agent, client, _) = session()?;
    /// assert!(client.cpu_moves() <= transport::cpu::moves_total());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cpu_moves(&self) -> u64 {
        self.step.moves()
    }

    /// Publishes one message (header + descriptor section); `Ok(false)` when
    /// the ring has no room for it now. Wakes the peer if it sleeps.
    ///
    /// Example: [`ShmChannel`]; a message with a descriptor section:
    /// [`ShmChannel::try_recv`].
    pub fn send(&mut self, header: &Header, desc: &[u8]) -> Result<bool, ShmError> {
        if header.desc_len as usize != desc.len() {
            return Err(ShmError::Bootstrap(
                "desc_len does not match the descriptor section".into(),
            ));
        }
        if !self.tx.push_message(&header.encode(), desc)? {
            return Ok(false);
        }
        // Pairs with the fence in `recv`: either the sleeper sees the
        // message when it re-checks, or we see its sleep word set.
        fence(Ordering::SeqCst);
        let peer = self.peer_sleep();
        if peer.load(Ordering::SeqCst) != 0 {
            self.wake_peer()?;
        }
        Ok(true)
    }

    /// Wakes a peer whose sleep word was seen set: on the futex, or with a
    /// byte on the control socket when it is parked there. The word is
    /// taken with one swap, and the wake-up follows what the swap found: a
    /// peer that moved from the futex to parked since the word was first
    /// read must get its byte, not a futex wake nobody waits for.
    #[cold]
    fn wake_peer(&self) -> Result<(), ShmError> {
        let peer = self.peer_sleep();
        let word = peer.swap(0, Ordering::SeqCst);
        if word == 0 {
            Ok(()) // woke by itself (or by its own timeout) meanwhile
        } else if word == SLEEP_PARKED {
            use rustix::net::{send, SendFlags};
            match send(&self.sock, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                // A full socket already holds wake-up bytes the peer has not
                // read; a closed one means the peer is gone, which the next
                // wait notices.
                Ok(_) | Err(rustix::io::Errno::AGAIN | rustix::io::Errno::PIPE) => Ok(()),
                Err(e) => Err(ShmError::Io(e.into())),
            }
        } else {
            futex::wake(peer, 1)?;
            Ok(())
        }
    }

    /// Takes the next message if one is there. Its header is checked
    /// against `limits` before its descriptor slots are read.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind};
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (mut agent, mut client, limits) = session()?;
    /// assert!(agent.try_recv(&limits)?.is_none()); // nothing yet: no waiting
    /// let body = wire::encode_hello(&limits);
    /// let mut h = Header::new(Kind::ModelList);
    /// h.desc_len = body.len() as u32;
    /// assert!(client.send(&h, &body)?);
    /// let (got, desc) = agent.try_recv(&limits)?.ok_or("sent")?;
    /// assert_eq!((got.kind, desc), (Kind::ModelList, body));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv(&mut self, limits: &Limits) -> Result<Option<(Header, Vec<u8>)>, ShmError> {
        // What the last receive took is answered by now (or never will be
        // by this call's caller): its slots go back first.
        self.rx.give_back();
        let Some(first) = self.rx.peek() else {
            return Ok(None);
        };
        let h = Header::decode(&first)?;
        h.check_limits(limits)?;
        let len = h.desc_len as usize;
        let mut desc = Vec::new();
        self.rx.consume(len.div_ceil(SLOT_LEN), len, &mut desc)?;
        Ok(Some((h, desc)))
    }

    /// Waits for the next message: spins for `policy.spin`, then sleeps in
    /// `policy.slice`s, checking the peer is alive between them. Gives up
    /// after `limit` (from about the call).
    ///
    /// The clock is first read after 64 empty polls, so a message that is
    /// already there or comes within them costs no clock read (a
    /// `clock_gettime` is ~20 ns here, a fifth of the raw hand-off); the
    /// spin budget and `limit` count from that first read.
    ///
    /// Example: [`ShmChannel`]; giving up:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::shm::{ShmError, WaitPolicy};
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (mut agent, _client, limits) = session()?;
    /// let r = agent.recv(&limits, WaitPolicy::AGENT, Some(Duration::from_millis(20)));
    /// assert!(matches!(r, Err(ShmError::TimedOut)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv(
        &mut self,
        limits: &Limits,
        policy: WaitPolicy,
        limit: Option<Duration>,
    ) -> Result<(Header, Vec<u8>), ShmError> {
        match self.wait(limits, policy, limit, None, None, None)? {
            Some(m) => Ok(m),
            None => Err(ShmError::TimedOut),
        }
    }

    /// As [`ShmChannel::recv`] with no time limit, except that after
    /// `park_after` without a message it parks instead of sleeping on:
    /// sets its sleep word to [`SLEEP_PARKED`] and returns `Ok(None)`. The
    /// caller then waits for the control socket ([`AsFd`]) to become
    /// readable — a sender's wake-up byte, or the peer's hang-up — and
    /// calls [`ShmChannel::unpark`] before receiving again.
    ///
    /// `slot` is the polling slot the caller took for this wait (see
    /// [`crate::spin::SpinSlots`]), if any: it is given back as soon as the
    /// wait stops polling, not held through the sleep.
    ///
    /// `cadence`, for a wait that begins when this side has answered its
    /// peer: the rhythm of the peer's messages, which this wait follows
    /// (when it holds a slot) and teaches ([`crate::cadence`]). A forecast
    /// poll after a sleep takes a slot of [`SHM_POLLERS`] (none free: no
    /// poll).
    ///
    /// # Examples
    ///
    /// An agent session that parks after 1 ms, waits for its control
    /// socket, and takes the message that woke it:
    ///
    /// ```
    /// use rustix::event::{poll, PollFd, PollFlags};
    /// use std::sync::atomic::Ordering;
    /// use std::time::Duration;
    /// use transport::shm::layout::AGENT_SLEEP;
    /// use transport::shm::{WaitPolicy, SLEEP_PARKED};
    /// use wire::{Header, Kind};
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (mut agent, mut client, limits) = session()?;
    /// let parked = agent.recv_or_park(&limits, WaitPolicy::AGENT, Duration::from_millis(1), None, None)?;
    /// assert!(parked.is_none());
    /// assert_eq!(client.arena().atomic_u32(AGENT_SLEEP).load(Ordering::Acquire), SLEEP_PARKED);
    ///
    /// client.send(&Header::new(Kind::Ping), &[])?; // writes the wake-up byte
    /// let mut fds = [PollFd::new(agent.control(), PollFlags::IN)];
    /// let five_s = rustix::time::Timespec { tv_sec: 5, tv_nsec: 0 };
    /// assert_eq!(poll(&mut fds, Some(&five_s))?, 1); // (an agent's epoll does this)
    /// agent.unpark()?;
    /// let (h, _) = agent.try_recv(&limits)?.ok_or("the message that woke it")?;
    /// assert_eq!(h.kind, Kind::Ping);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_or_park(
        &mut self,
        limits: &Limits,
        policy: WaitPolicy,
        park_after: Duration,
        slot: Option<SpinSlot<'_>>,
        cadence: Option<&mut Cadence>,
    ) -> Result<Option<(Header, Vec<u8>)>, ShmError> {
        self.wait(limits, policy, None, Some(park_after), slot, cadence)
    }

    /// After [`ShmChannel::recv_or_park`] parked and the control socket
    /// became readable: takes the wake-up bytes off it and marks this side
    /// awake. `PeerGone` when the socket was closed instead.
    ///
    /// Example: [`ShmChannel::recv_or_park`]; the peer gone instead:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::shm::{ShmError, WaitPolicy};
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (mut agent, client, limits) = session()?;
    /// assert!(agent.recv_or_park(&limits, WaitPolicy::AGENT, Duration::from_millis(1), None, None)?.is_none());
    /// drop(client); // the client process ends
    /// assert!(matches!(agent.unpark(), Err(ShmError::PeerGone)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unpark(&mut self) -> Result<(), ShmError> {
        use rustix::net::{recv, RecvFlags};
        self.my_sleep().store(0, Ordering::SeqCst);
        let mut bytes = [0u8; 64];
        loop {
            match recv(&self.sock, &mut bytes, RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Err(ShmError::PeerGone),
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return Err(ShmError::PeerGone),
            }
        }
    }

    /// The wait loop of `recv` and `recv_or_park`: `Ok(None)` when `limit`
    /// ran out (`recv`) or the side parked (`park_after`).
    fn wait(
        &mut self,
        limits: &Limits,
        policy: WaitPolicy,
        limit: Option<Duration>,
        park_after: Option<Duration>,
        slot: Option<SpinSlot<'_>>,
        cadence: Option<&mut Cadence>,
    ) -> Result<Option<(Header, Vec<u8>)>, ShmError> {
        let r = self.wait_polling_then_sleeping(limits, policy, limit, park_after, slot, cadence);
        // However the wait ended (message, time limit, park, error), this
        // side is not polling any more.
        self.publish_spin(0);
        r
    }

    fn wait_polling_then_sleeping(
        &mut self,
        limits: &Limits,
        policy: WaitPolicy,
        limit: Option<Duration>,
        park_after: Option<Duration>,
        mut slot: Option<SpinSlot<'_>>,
        mut cadence: Option<&mut Cadence>,
    ) -> Result<Option<(Header, Vec<u8>)>, ShmError> {
        // A cadence forecasts only for a wait that may poll (holds a slot).
        let forecast = match (cadence.as_deref_mut(), &slot) {
            (Some(c), Some(_)) => c.forecast(policy.spin),
            _ => Forecast::Spin(policy.spin),
        };
        let (budget, mut window) = match forecast {
            Forecast::Spin(b) => (b, None),
            Forecast::Wake { wake, window } => (policy.spin, Some((wake, window))),
        };
        // Polling past this side's own spin for a forecast message (a
        // stretched spin, or the window after a sleep): how it ends
        // teaches the cadence.
        let mut ahead = if budget > policy.spin {
            Ahead::Stretched
        } else {
            Ahead::No
        };
        let mut spin = Spin::new(budget, 64);
        // The wait's first clock read (the spin's), which gaps and sleeps
        // count from: a message within the first polls reads no clock.
        let mut started: Option<Instant> = None;
        // Set when this side sleeps because its mask holds it on its
        // peer's CPU: its word stays published (pinned bit set) while it
        // sleeps, so that the peer, polling there, sees whose turn it is;
        // `wait` clears it when the wait ends.
        let mut handed_over = false;
        // The window's poll, once the wait has lasted until it is due.
        let due = |window: &mut Option<(Duration, Duration)>, since: Duration| match *window {
            Some((wake, poll_for)) if since >= wake => {
                *window = None;
                Some(poll_for)
            }
            _ => None,
        };
        loop {
            if let Some(m) = self.try_recv(limits)? {
                self.publish_spin(0);
                if let Some(c) = cadence {
                    let waited = started.or(spin.started()).map(|t| t.elapsed());
                    // A stretched spin caught only what came after this
                    // side's own spin would have ended.
                    let past_own = waited.is_some_and(|w| w > policy.spin);
                    if ahead == Ahead::Window || (ahead == Ahead::Stretched && past_own) {
                        c.polled(true);
                    }
                    c.waited(waited);
                }
                return Ok(Some(m));
            }
            if self.wanted.load(Ordering::Relaxed) != 0 {
                // Another thread of this side wants the channel.
                return Ok(None);
            }
            if spin.again() {
                if spin.at_check() && self.collides(policy.step_off) {
                    handed_over = true;
                    spin.stop();
                }
                continue;
            }
            // A forecast poll ran out (one cut short to hand the CPU to the
            // peer proves nothing).
            if std::mem::replace(&mut ahead, Ahead::No) != Ahead::No && !handed_over {
                if let Some(c) = cadence.as_deref_mut() {
                    c.polled(false);
                }
            }
            drop(slot.take());
            if !handed_over {
                self.publish_spin(0);
            }
            let since = match started {
                Some(t0) => t0.elapsed(),
                None => {
                    let e = spin.elapsed();
                    started = spin.started();
                    e
                }
            };
            if let Some((s, w)) = due(&mut window, since).and_then(open_window) {
                (slot, spin, ahead, handed_over) = (Some(s), w, Ahead::Window, false);
                continue;
            }
            let left = limit.map(|l| l.saturating_sub(since));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            if park_after.is_some_and(|p| since >= p) {
                // The same handshake as a futex sleep (§14.9): word, fence,
                // look again; a sender that published before seeing the
                // word is seen here, one that publishes after sees it.
                self.publish_spin(0);
                self.my_sleep().store(SLEEP_PARKED, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if !self.rx.ready() {
                    return Ok(None);
                }
                self.my_sleep().store(0, Ordering::SeqCst);
                continue;
            }
            let slice = left.map_or(policy.slice, |l| l.min(policy.slice));
            let slice = park_after.map_or(slice, |p| slice.min(p.saturating_sub(since)));
            // Wake for a forecast message in time to poll for it.
            let slice = window.map_or(slice, |(wake, _)| slice.min(wake.saturating_sub(since)));
            self.my_sleep().store(SLEEP_FUTEX, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !self.rx.ready() && self.wanted.load(Ordering::SeqCst) == 0 {
                futex::wait(self.my_sleep(), SLEEP_FUTEX, Some(slice))?;
            }
            self.my_sleep().store(0, Ordering::SeqCst);
            if !self.rx.ready() && !self.peer_alive() {
                return Err(ShmError::PeerGone);
            }
            // Woken when the forecast message is due: the window opens
            // before the ring is looked at, so a message already there is
            // its catch.
            // (No clock read after a sleep without a forecast.)
            if window.is_some() {
                let since = started.map_or(Duration::ZERO, |t0| t0.elapsed());
                if let Some((s, w)) = due(&mut window, since).and_then(open_window) {
                    (slot, spin, ahead, handed_over) = (Some(s), w, Ahead::Window, false);
                }
            }
        }
    }

    /// False once the peer's end of the control socket is closed (its
    /// process exited or was killed). A signal landing in the poll is not
    /// the peer's death: even a zero-timeout poll(2) returns `EINTR` when a
    /// signal is pending and no fd is ready, so it is retried.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (agent, client, _) = session()?;
    /// assert!(agent.peer_alive());
    /// client.close();
    /// assert!(!agent.peer_alive());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_alive(&self) -> bool {
        !crate::peer::hung_up(&self.sock)
    }

    /// Closes the control socket: the peer sees this side as gone.
    /// Example: [`ShmChannel::peer_alive`].
    pub fn close(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// What a wait polls for beyond its own spin (see [`crate::cadence`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// Nothing: its own spin, if any.
    No,
    /// A spin stretched over a short forecast gap.
    Stretched,
    /// The window after a sleep until the forecast message was due.
    Window,
}

/// A forecast window of `poll_for`, polled in one of the agent's polling
/// slots; `None` when every slot is taken (the wait sleeps on instead).
fn open_window(poll_for: Duration) -> Option<(SpinSlot<'static>, Spin)> {
    SHM_POLLERS.try_take().map(|s| (s, Spin::new(poll_for, 64)))
}

impl ShmChannel {
    /// The control socket (a parked side waits on it; the agent asks it
    /// who the client is).
    ///
    /// # Examples
    ///
    /// ```
    /// # fn session() -> Result<(transport::shm::ShmChannel, transport::shm::ShmChannel, wire::Limits), Box<dyn std::error::Error>> {
    /// #     let dir = tempfile::tempdir()?;
    /// #     let path = dir.path().join("c.sock");
    /// #     let l = std::os::unix::net::UnixListener::bind(&path)?;
    /// #     let sizes = transport::shm::ShmSizes { client_len: 1 << 20, agent_len: 1 << 20, ..Default::default() };
    /// #     let t = std::time::Duration::from_secs(5);
    /// #     let agent = std::thread::spawn(move || -> Result<transport::shm::ShmChannel, transport::shm::ShmError> {
    /// #         Ok(transport::shm::ShmChannel::accept(l.accept()?.0, &wire::Limits::default(), sizes, t)?.0)
    /// #     });
    /// #     let (client, limits) = transport::shm::ShmChannel::connect(&path, &wire::Limits::default(), None, 1, t)?;
    /// #     Ok((agent.join().map_err(|_| "agent panicked")??, client, limits))
    /// # }
    /// let (agent, _client, _) = session()?;
    /// let who = transport::Credentials::of_unix(agent.control())?;
    /// assert_eq!(who.pid, std::process::id() as i32); // the client is this process
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn control(&self) -> &UnixStream {
        &self.sock
    }
}

/// The control socket: what a parked side waits on.
impl AsFd for ShmChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags};
    use std::os::unix::net::UnixListener;

    #[test]
    fn sizes_shrink_in_proportion_to_fit_an_arena_budget() {
        let d = ShmSizes::default();
        assert_eq!(d.within(u64::MAX), d);
        let s = d.within(8 << 20);
        let l = Layout::new(s.ring_capacity, s.client_len, s.agent_len).unwrap();
        assert!(l.arena_len <= 8 << 20, "{}", l.arena_len);
        assert!(l.arena_len > 7 << 20, "uses the budget: {}", l.arena_len);
        // 256:64 in the defaults, kept.
        let ratio = s.client_len as f64 / s.agent_len as f64;
        assert!((ratio - 4.0).abs() < 0.01, "{ratio}");
        let tiny = d.within(0);
        assert_eq!((tiny.client_len, tiny.agent_len), (4096, 4096));
        assert_eq!(tiny.ring_capacity, 8);
        // Big rings shrink to fit a 1 MiB budget.
        let big = ShmSizes {
            ring_capacity: 65536,
            ..d
        }
        .within(1 << 20);
        let l = Layout::new(big.ring_capacity, big.client_len, big.agent_len).unwrap();
        assert!(
            l.arena_len <= 1 << 20,
            "{} with {} slots",
            l.arena_len,
            big.ring_capacity
        );
    }

    fn pair(sizes: ShmSizes) -> (ShmChannel, ShmChannel, Limits) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            ShmChannel::accept(s, &Limits::default(), sizes, Duration::from_secs(5)).unwrap()
        });
        let (client, limits) =
            ShmChannel::connect(&path, &Limits::default(), None, 1, Duration::from_secs(5))
                .unwrap();
        let (agent, agent_limits) = t.join().unwrap();
        assert_eq!(limits, agent_limits);
        (client, agent, limits)
    }

    fn small() -> ShmSizes {
        ShmSizes {
            ring_capacity: 8,
            client_len: 1 << 16,
            agent_len: 1 << 16,
            features: 0,
        }
    }

    fn cpus() -> u32 {
        rustix::thread::sched_getaffinity(None).map_or(1, |m| m.count())
    }

    /// Pins the calling thread to the CPU it is on; returns that CPU.
    fn pin_here() -> usize {
        let mut one = rustix::thread::CpuSet::new();
        let here = cpu::current();
        one.set(here);
        rustix::thread::sched_setaffinity(None, &one).unwrap();
        here
    }

    #[test]
    fn the_agent_steps_off_a_client_polling_on_its_cpu() {
        if cpus() < 2 {
            eprintln!("skipped: this process may use one CPU only");
            return;
        }
        let (client, mut agent, _) = pair(small());
        std::thread::spawn(move || {
            let mask = rustix::thread::sched_getaffinity(None).unwrap();
            // Start on a known CPU with the full mask back: nothing moves
            // a thread that does not have to move.
            let here = pin_here();
            rustix::thread::sched_setaffinity(None, &mask).unwrap();
            client.my_cpu().store(here as u32 + 1, Ordering::Relaxed);
            // The scheduler may have moved us meanwhile (then: no
            // collision, and no move).
            let sleep = agent.collides(true);
            assert!(!sleep, "an agent that may move keeps polling");
            if agent.cpu_moves() == 1 {
                assert_ne!(cpu::current(), here);
                let word = agent.my_cpu().load(Ordering::Relaxed);
                assert_eq!(word, cpu::current() as u32 + 1, "its new CPU is published");
            }
            assert_eq!(rustix::thread::sched_getaffinity(None).unwrap(), mask);
            // A message ends the poll and clears the word.
            let h = Header::new(Kind::Ping);
            let mut client = client;
            client.send(&h, &[]).unwrap();
            agent
                .recv(&Limits::default(), WaitPolicy::AGENT, None)
                .unwrap();
            assert_eq!(agent.my_cpu().load(Ordering::Relaxed), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_pinned_agent_sleeps_and_the_client_moves_instead() {
        let (mut client, agent, _) = pair(small());
        std::thread::spawn(move || {
            let mut agent = agent;
            let here = pin_here();
            agent.pinned = !cpu::may_leave(here);
            client.my_cpu().store(here as u32 + 1, Ordering::Relaxed);
            assert!(agent.collides(true), "a pinned agent must sleep, not spin");
            assert_eq!(agent.cpu_moves(), 0);
            let word = agent.my_cpu().load(Ordering::Relaxed);
            assert_eq!(word, (here as u32 + 1) | CPU_PINNED);
            // The client, on the same CPU, sees the flag: it is its turn.
            client.pinned = true;
            assert!(client.collides(true), "pinned too: it sleeps");
        })
        .join()
        .unwrap();
        if cpus() < 2 {
            return;
        }
        // An unpinned client in the same spot moves.
        let (mut client, agent, _) = pair(small());
        std::thread::spawn(move || {
            let mask = rustix::thread::sched_getaffinity(None).unwrap();
            let here = pin_here();
            rustix::thread::sched_setaffinity(None, &mask).unwrap();
            client.pinned = false;
            agent
                .my_cpu()
                .store((here as u32 + 1) | CPU_PINNED, Ordering::Relaxed);
            assert!(!client.collides(true));
            assert!(client.cpu_moves() <= 1);
            // And with an agent free to move, the client only polls on.
            let (mut client, agent, _) = pair(small());
            let here = cpu::current();
            agent.my_cpu().store(here as u32 + 1, Ordering::Relaxed);
            assert!(!client.collides(true));
            assert_eq!(client.cpu_moves(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn bootstrap_shares_the_arena_and_narrows_limits() {
        let (c, a, limits) = pair(small());
        assert_eq!(limits.max_desc_len, 7 * 64);
        assert_eq!(limits.max_payload, 1 << 16);
        assert_eq!(c.layout(), a.layout());
        c.arena()
            .atomic_u64(c.layout().data_off)
            .store(7, Ordering::Release);
        assert_eq!(
            a.arena()
                .atomic_u64(a.layout().data_off)
                .load(Ordering::Acquire),
            7
        );
    }

    #[test]
    fn messages_with_descriptors_cross_both_ways_with_sleep_and_wake() {
        let (mut c, mut a, limits) = pair(small());
        let t = std::thread::spawn(move || {
            for i in 0..2000u64 {
                let (h, d) = a.recv(&limits, WaitPolicy::AGENT, None).unwrap();
                assert_eq!(h.request_id, i);
                assert_eq!(d.len(), (i % 200) as usize);
                let mut r = Header::new(Kind::Pong);
                r.request_id = i;
                while !a.send(&r, &[]).unwrap() {}
            }
            a
        });
        for i in 0..2000u64 {
            let mut h = Header::new(Kind::ListModels);
            h.request_id = i;
            let desc = vec![i as u8; (i % 200) as usize];
            h.desc_len = desc.len() as u32;
            while !c.send(&h, &desc).unwrap() {}
            if i % 500 == 0 {
                // Let the agent fall asleep now and then: the wake path.
                std::thread::sleep(Duration::from_millis(5));
            }
            let (r, _) = c
                .recv(&limits, WaitPolicy::CLIENT, Some(Duration::from_secs(5)))
                .unwrap();
            assert_eq!(r.request_id, i);
        }
        t.join().unwrap();
    }

    #[test]
    fn a_dead_peer_is_noticed_and_a_silent_one_times_out() {
        let (mut c, a, limits) = pair(small());
        let t = Instant::now();
        assert!(matches!(
            c.recv(
                &limits,
                WaitPolicy::CLIENT,
                Some(Duration::from_millis(100))
            ),
            Err(ShmError::TimedOut)
        ));
        assert!(t.elapsed() < Duration::from_secs(2));
        drop(a);
        assert!(matches!(
            c.recv(&limits, WaitPolicy::CLIENT, None),
            Err(ShmError::PeerGone)
        ));
    }

    /// Signals landing while the agent checks its peer do not make a live
    /// peer look dead (without the retry, more than half the checks under
    /// this storm said so, and a real session would have ended).
    #[test]
    fn a_signal_does_not_make_a_live_peer_look_dead() {
        use crate::shm::signals;
        use std::sync::atomic::AtomicBool;
        signals::catch_sigusr1();
        let (_c, a, _) = pair(small());
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let checker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                tid_tx.send(signals::this_thread()).unwrap();
                let start = Instant::now();
                let (mut checks, mut dead) = (0u64, 0u64);
                while checks < 2_000_000 && start.elapsed() < Duration::from_secs(1) {
                    checks += 1;
                    dead += u64::from(!a.peer_alive());
                }
                stop.store(true, Ordering::SeqCst);
                (checks, dead)
            })
        };
        let tid = tid_rx.recv().unwrap();
        let mut sent = 0u64;
        while !stop.load(Ordering::SeqCst) {
            signals::interrupt(tid);
            sent += 1;
        }
        let (checks, dead) = checker.join().unwrap();
        assert!(sent > 1000, "only {sent} signals sent");
        assert_eq!(
            dead, 0,
            "{dead} of {checks} checks under {sent} signals said the peer was dead"
        );
    }

    /// Waits up to 2 s for `fd` to be readable (what an event loop does).
    fn readable(fd: BorrowedFd<'_>) -> bool {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let ts = rustix::time::Timespec {
            tv_sec: 2,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&ts)), Ok(1))
    }

    #[test]
    fn a_parked_side_is_woken_through_its_control_socket() {
        let (mut c, mut a, limits) = pair(small());
        let quick = WaitPolicy {
            spin: Duration::ZERO,
            slice: Duration::from_millis(5),
            step_off: true,
        };
        for round in 0..3 {
            // Nothing to read: the agent parks after 10 ms.
            let got = a.recv_or_park(&limits, quick, Duration::from_millis(10), None, None);
            assert!(matches!(got, Ok(None)), "round {round}: {got:?}");
            assert_eq!(
                a.arena.atomic_u32(AGENT_SLEEP).load(Ordering::SeqCst),
                SLEEP_PARKED
            );
            assert!(!readable(a.as_fd()) || round > 0, "no byte before a send");
            let mut h = Header::new(Kind::Ping);
            h.request_id = round;
            assert!(c.send(&h, &[]).unwrap());
            assert!(readable(a.as_fd()), "the send wrote a wake-up byte");
            a.unpark().unwrap();
            let (got, _) = a
                .recv(&limits, quick, Some(Duration::from_secs(1)))
                .unwrap();
            assert_eq!(got.request_id, round);
        }
        // A parked side whose peer leaves sees it on the same socket.
        assert!(matches!(
            a.recv_or_park(&limits, quick, Duration::ZERO, None, None),
            Ok(None)
        ));
        drop(c);
        assert!(readable(a.as_fd()));
        assert!(matches!(a.unpark(), Err(ShmError::PeerGone)));
    }

    /// A wait policy (no liveness wake-ups) and a cadence that learned a
    /// rhythm of `gap`.
    fn following(gap: Duration) -> (WaitPolicy, Cadence) {
        let policy = WaitPolicy {
            spin: Duration::from_micros(50),
            slice: Duration::from_secs(5),
            step_off: false,
        };
        let mut cadence = Cadence::default();
        cadence.arrived(Some(gap), policy.spin);
        cadence.arrived(Some(gap), policy.spin);
        (policy, cadence)
    }

    /// The agent's sleep word, seen from the client.
    fn agent_word(c: &ShmChannel) -> u32 {
        c.arena().atomic_u32(AGENT_SLEEP).load(Ordering::SeqCst)
    }

    /// Spins until `cond` holds or `limit` passes; whether it held.
    fn spin_until(limit: Duration, cond: impl Fn() -> bool) -> bool {
        let t0 = Instant::now();
        while !cond() {
            if t0.elapsed() > limit {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    /// One message through `recv_or_park` (parking after 10 s), as the
    /// agent waits for a request.
    fn recv_one(
        a: &mut ShmChannel,
        limits: &Limits,
        policy: WaitPolicy,
        slot: Option<SpinSlot<'_>>,
        cadence: Option<&mut Cadence>,
    ) {
        let got = a.recv_or_park(limits, policy, Duration::from_secs(10), slot, cadence);
        assert!(matches!(got, Ok(Some(_))), "{got:?}");
    }

    #[test]
    fn a_wait_polls_again_when_a_forecast_message_is_due() {
        let (mut c, mut a, limits) = pair(small());
        let gap = Duration::from_millis(20);
        let slots = crate::spin::SpinSlots::with_cap(1);
        // The message comes after the window: the wait sleeps, wakes by
        // itself at ~20 ms, polls, misses, sleeps again (its slice is 5 s),
        // and the send wakes it. The sender sends once the agent sleeps
        // again (or, if it never saw the agent awake, after 1 s).
        let (policy, mut cadence) = following(gap);
        let late = std::thread::spawn(move || {
            let s = Duration::from_secs(1);
            spin_until(s, || agent_word(&c) == SLEEP_FUTEX);
            if spin_until(s, || agent_word(&c) != SLEEP_FUTEX) {
                spin_until(s, || agent_word(&c) == SLEEP_FUTEX);
            }
            assert!(c.send(&Header::new(Kind::Ping), &[]).unwrap());
            c
        });
        recv_one(
            &mut a,
            &limits,
            policy,
            slots.try_take(),
            Some(&mut cadence),
        );
        let mut c = late.join().unwrap();
        assert_eq!(cadence.polls(), (0, 1), "one window, missed");
        // Without a slot, or without a cadence, no window.
        for (slot, follow) in [(false, true), (true, false)] {
            let (policy, mut cadence) = following(gap);
            let late = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(40));
                assert!(c.send(&Header::new(Kind::Ping), &[]).unwrap());
                c
            });
            let slot = slot.then(|| slots.try_take()).flatten();
            recv_one(
                &mut a,
                &limits,
                policy,
                slot,
                follow.then_some(&mut cadence),
            );
            c = late.join().unwrap();
            assert_eq!(cadence.polls(), (0, 0));
        }
        // A message that is there when the agent wakes by itself is
        // caught by its window: the sender publishes it while the agent
        // sleeps (5 ms into its sleep, 15 before the window), without the
        // wake-up a send would make. (An agent descheduled between its
        // sleep word and its sleep sees the message before sleeping: that
        // round is tried again.)
        let mut caught = false;
        for _ in 0..3 {
            let (policy, mut cadence) = following(gap);
            let sender = std::thread::spawn(move || {
                spin_until(Duration::from_secs(2), || agent_word(&c) == SLEEP_FUTEX);
                std::thread::sleep(Duration::from_millis(5));
                let ping = Header::new(Kind::Ping).encode();
                assert!(c.tx.push_message(&ping, &[]).unwrap());
                c
            });
            recv_one(
                &mut a,
                &limits,
                policy,
                slots.try_take(),
                Some(&mut cadence),
            );
            c = sender.join().unwrap();
            if cadence.polls() == (1, 0) {
                caught = true;
                break;
            }
        }
        assert!(
            caught,
            "no window caught a message that was there when it opened"
        );
    }

    #[test]
    fn a_wake_follows_the_word_as_it_is_when_taken() {
        // The client saw the agent asleep on the futex (1); before it woke
        // it, the agent timed out and parked (2). The wake must be the byte.
        let (c, mut a, limits) = pair(small());
        let quick = WaitPolicy {
            spin: Duration::ZERO,
            slice: Duration::from_millis(5),
            step_off: true,
        };
        assert!(matches!(
            a.recv_or_park(&limits, quick, Duration::ZERO, None, None),
            Ok(None)
        ));
        c.wake_peer().unwrap();
        assert!(readable(a.as_fd()), "a parked peer is woken with a byte");
        assert_eq!(c.peer_sleep().load(Ordering::SeqCst), 0);
        a.unpark().unwrap();
        // Nothing set: nothing to do, no byte.
        c.wake_peer().unwrap();
        let mut fds = [PollFd::new(&a.sock, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 0);
    }

    #[test]
    fn garbage_headers_are_errors_not_panics() {
        let (c, mut a, limits) = pair(small());
        // The client scribbles a bogus header straight into its ring.
        let ring = Ring::new(c.arena().clone(), c.layout().request_ring, 8).unwrap();
        let mut p = ring.producer();
        p.push(&[0xAB; 64]).unwrap();
        assert!(matches!(a.try_recv(&limits), Err(ShmError::Wire(_))));
        // A consumer's tail scribbled past what was produced: the agent's
        // next response finds its ring broken.
        c.arena()
            .atomic_u64(c.layout().response_ring + 64)
            .store(1 << 40, Ordering::Release);
        let mut r = Header::new(Kind::Pong);
        r.request_id = 1;
        let mut sent = Ok(true);
        // The producer reads the tail only once its cached one says full.
        for _ in 0..=c.layout().ring_capacity {
            sent = a.send(&r, &[]);
            if sent.is_err() {
                break;
            }
        }
        assert!(matches!(sent, Err(ShmError::Ring(_))), "{sent:?}");
    }

    #[test]
    fn control_path_is_private_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("TENSORWIRE_SHM_DIR", dir.path().join("d"));
        let p = control_path("agent-1").unwrap();
        assert!(p.ends_with("d/agent-1.sock"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(p.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(control_path("../x").is_err());
        // A directory others can write to is refused.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::env::set_var("TENSORWIRE_SHM_DIR", &open);
        assert!(control_path("x").is_err());
        // So is a symlink to a directory.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("d"), &link).unwrap();
        std::env::set_var("TENSORWIRE_SHM_DIR", &link);
        assert!(control_path("x").is_err());
        assert!(control_path("").is_err());
        std::env::remove_var("TENSORWIRE_SHM_DIR");
    }
}
