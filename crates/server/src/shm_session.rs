//! [`ShmSession`]: one shared-memory session (`shm://name`), from the
//! bootstrap to the client's departure, run by the agent's
//! [`reactor`](crate::reactor) workers.
//!
//! The accept thread only accepts the control socket and parks the session
//! in the reactor; a worker reads the Hello as it arrives, without blocking,
//! and once it is whole answers it ([`ShmChannel::accept_hello`]: it
//! creates the session's private,
//! sealed arena and passes it over the socket), then serves the rings. A
//! client that connects and never says Hello holds no thread, and is closed
//! at `handshake_timeout`.
//!
//! **Placement.** The arena's data area is split in two: the client's
//! region `[0, client_len)` holds input tensors the client wrote in place;
//! the agent's region `[client_len, data_len)` holds outputs. Offsets in
//! descriptors are relative to the data area, both ways. A request's tensors
//! must lie in the client's region, without overlapping (else an Error for
//! that request; the session goes on); the engine reads them where they are.
//! A response describes each output where it is: an output that is one of
//! the inputs (identity) at that input's offset, nothing moved; any other in
//! a block of the agent's region that this session's [`OutputRegion`] hands
//! out. A backend that writes outputs into caller buffers (ONNX Runtime:
//! [`ModelEntry::outputs_in_place`](crate::ModelEntry::outputs_in_place))
//! gets those blocks before the run and writes there directly; other
//! outputs are copied in once. Bytes are counted in [`Counters`]
//! (`shm_output_bytes_aliased` / `_in_place` / `_copied`). Blocks stay the
//! client's to read until it sends `Release` with the response's
//! `request_id`; a response that does not fit gets `limit-exceeded`.
//!
//! **Waiting.** Between messages the worker waits with
//! [`ShmChannel::recv_or_park`]: it spins on the request ring for
//! `shm_spin_us` (default 50 µs; `AgentConfig::shm_spin_us`, TOML `[shm]
//! spin_us`) — a client sending again within that window is served without
//! any syscall or wake-up — then marks itself asleep in the arena's agent
//! sleep word and sleeps on it (futex) in slices of at most 250 ms; the
//! client's send wakes it only when that word says it sleeps. Between
//! slices it checks the control socket: a client that exited or was killed
//! is noticed, and the session ends (its arena is unmapped when the channel
//! drops; no request is running then, so nothing writes into freed memory).
//! After `shm_park_after` (default 250 ms) with no message the session
//! *parks*: its sleep word says so, the worker goes back to the reactor, and
//! the session waits in the epoll set on its control socket, holding no
//! thread. The client's next send sees the word and wakes it with one byte
//! on that socket (PROTOCOL §14.9); a client that dies hangs the socket up,
//! which wakes it too. A spin of 0 sleeps at once (lowest CPU, ~5 µs more
//! per request for the wake-up); longer spins help clients that pipeline,
//! but each spinning session holds a core that engine threads may need on
//! small machines. So a session spins only in one of the agent's polling
//! slots ([`SHM_POLLERS`]: one per CPU); with more busy sessions than
//! slots, the others sleep at once after each response.
//! Slotless sessions still poll 3 µs: a client that is running sends its
//! next request within that, and catching it saves two wake-ups.
//! While it spins, the worker publishes its CPU and moves off its client's
//! when both poll on one ([`ShmChannel`]'s placement).
//!
//! **A client with a rhythm.** A client that works between an answer and
//! its next request (tokenizing, waiting for a frame) sends after a gap
//! longer than the spin, and its request would pay a wake-up (30–50 µs on
//! these VMs). Each session keeps the [`Cadence`] of its client's gaps,
//! from an answer to the client's next message that is not a `Release`
//! (a Release is answered by nothing; its wait's time carries into the
//! next), and passes it to each wait, which, holding a polling slot, spins
//! through short regular gaps, or sleeps until the request is due and
//! polls again (`transport::cadence`; `AgentStats::shm_forecast_caught` /
//! `_missed`).
//!
//! When the response ring is full (the client is not reading), the worker
//! retries with a growing pause up to `stall_timeout`, then closes the
//! session; other sessions are served by other workers and not affected.
//!
//! **Faults.** A message that cannot be decoded or a ring whose indices are
//! impossible gets an Error with request id 0 (if the response ring still
//! takes one) and the session is closed: the ring cannot be trusted to be
//! in sync any more. Agent shutdown refuses new requests (`shutting-down`),
//! lets the one in flight finish, then closes the control socket and wakes
//! the session.

use crate::conns::{Phase, Slot};
use crate::dispatch::{AgentCore, Counters, Grant, Prepared, Reply};
use crate::reactor::{Step, Task};
use crate::region::{Blocks, OutputRegion};
use crate::stats::Via;
use crate::tenants::{CpuMeter, Identity};
use engine::{OutputData, TensorView};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use transport::cadence::Cadence;
use transport::shm::{futex, layout::AGENT_SLEEP, Arena, Layout, ShmChannel, ShmError};
use transport::shm::{ShmSizes, WaitPolicy, SLOT_LEN};
use transport::spin::SHM_POLLERS;
use transport::Credentials;
use wire::{Header, Kind, Limits, Placement, Stage, Status, TensorDesc, Timeline, HEADER_LEN};

/// How shared-memory sessions are set up and wait (from `AgentConfig`).
#[derive(Clone, Copy, Debug)]
pub struct ShmSettings {
    /// Arena sizes of each session.
    pub sizes: ShmSizes,
    /// How long a session spins before it sleeps.
    pub spin: Duration,
    /// How long a session with no message sleeps on its futex before it
    /// parks (gives its worker back).
    pub park_after: Duration,
    /// Bounds the bootstrap and a wait for room in a full response ring.
    pub stall: Duration,
}

/// What the agent keeps of a session to close it from another thread.
#[derive(Debug)]
pub struct ShmHandle {
    /// The control socket (the same open file as the session's).
    sock: UnixStream,
    /// The arena, once the bootstrap made it (weak: the session owns it).
    arena: Mutex<Weak<Arena>>,
    /// Set by [`ShmHandle::close`]: the session ends after the message in
    /// hand (ring traffic goes on after the socket is shut down).
    closed: AtomicBool,
}

/// The session's control socket.
impl AsFd for ShmHandle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl ShmHandle {
    /// A handle over a clone of the session's control socket.
    pub fn new(sock: UnixStream) -> ShmHandle {
        ShmHandle {
            sock,
            arena: Mutex::new(Weak::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Closes the session: shuts its control socket down (the client sees
    /// the agent gone; a parked session sees its peer gone) and wakes the
    /// session if it sleeps on its futex, so it notices at once.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let arena = self
            .arena
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade();
        if let Some(a) = arena {
            let word = a.atomic_u32(AGENT_SLEEP);
            word.store(0, Ordering::SeqCst);
            let _ = futex::wake(word, 1);
        }
    }
}

/// One shared-memory session between its turns on a worker.
pub struct ShmSession {
    core: Arc<AgentCore>,
    cfg: ShmSettings,
    handle: Arc<ShmHandle>,
    slot: Slot,
    state: State,
}

enum State {
    /// Accepted; reading the Hello (what arrived so far).
    Hello(UnixStream, Vec<u8>),
    /// Bootstrapped.
    Serving(Box<Serving>),
    /// Over (the bootstrap failed).
    Gone,
}

/// A bootstrapped session's own state (the parts [`Session`] borrows).
struct Serving {
    ch: ShmChannel,
    arena: Arc<Arena>,
    layout: Layout,
    grant: Grant,
    region: OutputRegion,
    parked: bool,
    /// Where pulled inputs are read from, when this agent pulls
    /// (`allow_kernel_pull`).
    pull_from: Option<PullSource>,
    /// The rhythm of the client's requests after its answers.
    cadence: Cadence,
}

/// The client process a session's pulled inputs are read from: its pid
/// from the control socket's `SO_PEERCRED` (never from anything it
/// writes), held by a pidfd opened at accept and checked against the
/// socket again, so a pid reused after the client exited is never read:
/// the pidfd says the client is gone.
struct PullSource {
    pid: i32,
    pidfd: std::os::fd::OwnedFd,
}

impl PullSource {
    /// The peer of `sock`, pinned by a pidfd; `None` when the kernel
    /// cannot say who it is.
    fn of(sock: &std::os::unix::net::UnixStream) -> Option<PullSource> {
        let pid = Credentials::of_unix(sock).ok()?.pid;
        let p = rustix::process::Pid::from_raw(pid)?;
        let pidfd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
        // The pidfd names whichever process has `pid` now: still the
        // socket's peer only if the socket still says so.
        (Credentials::of_unix(sock).ok()?.pid == pid).then_some(PullSource { pid, pidfd })
    }

    /// Whether the client process still runs (its pidfd is not readable).
    /// A signal in the poll (`EINTR`, even with a zero timeout) is retried,
    /// not taken for the client's death.
    fn alive(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            match poll(&mut fds, Some(&zero)) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return matches!(r, Ok(0)),
            }
        }
    }
}

impl ShmSession {
    /// A session for a freshly accepted control socket, holding `slot` in
    /// the agent's connection table until it ends; `handle` is how the
    /// agent closes it.
    pub fn new(
        core: Arc<AgentCore>,
        sock: UnixStream,
        cfg: ShmSettings,
        handle: Arc<ShmHandle>,
        slot: Slot,
    ) -> ShmSession {
        ShmSession {
            core,
            cfg,
            handle,
            slot,
            state: State::Hello(sock, Vec::new()),
        }
    }

    /// Answers the Hello once it has arrived whole (else `Park`). It is
    /// read without blocking, kept across parks: a client that sends it
    /// slowly, or half of it, holds no worker (and is closed at
    /// `handshake_timeout`).
    fn bootstrap(&mut self) -> Step {
        let State::Hello(sock, got) = &mut self.state else {
            return Step::Done;
        };
        match read_hello(sock, got) {
            Ok(false) => return Step::Park,
            Ok(true) => {}
            Err(_) => return Step::Done,
        }
        let State::Hello(sock, got) = std::mem::replace(&mut self.state, State::Gone) else {
            return Step::Done;
        };
        let core = &*self.core;
        // The tenant first: a refused client gets no arena.
        let grant = match hello_grant(core, &sock, &got) {
            Ok(g) => g,
            Err(refusal) => {
                let _ = sock.set_nonblocking(false);
                let _ = sock.set_write_timeout(Some(self.cfg.stall));
                let _ = (&sock).write_all(&[&refusal.header.encode()[..], &refusal.desc].concat());
                return Step::Done;
            }
        };
        let sizes = match grant.as_ref().map(|g| &g.seat) {
            Some(Some(seat)) => match seat.tenant().ok().and_then(|t| t.quotas.max_arena_bytes) {
                Some(max) => self.cfg.sizes.within(max),
                None => self.cfg.sizes,
            },
            _ => self.cfg.sizes,
        };
        let agent_limits = grant.as_ref().map_or(core.limits, |g| g.limits);
        let pull_from = (sizes.features & transport::shm::layout::FEATURE_PULL != 0)
            .then(|| PullSource::of(&sock))
            .flatten();
        let (ch, limits) =
            match ShmChannel::accept_hello(sock, &got, &agent_limits, sizes, self.cfg.stall) {
                Ok(x) => x,
                Err(ShmError::Wire(_) | ShmError::Bootstrap(_)) => {
                    // `accept_hello` answered a bad Hello with an Error itself.
                    core.counters.errors.fetch_add(1, Ordering::Relaxed);
                    return Step::Done;
                }
                Err(_) => return Step::Done,
            };
        *self.handle.arena.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(ch.arena());
        // Shutdown closed the socket before it could know the arena (and
        // wake this session through it)?
        if !ch.peer_alive() {
            ch.close();
            return Step::Done;
        }
        self.slot.set(Phase::Busy);
        let layout = *ch.layout();
        self.state = State::Serving(Box::new(Serving {
            arena: ch.arena().clone(),
            region: OutputRegion::new(layout.agent_len()),
            ch,
            layout,
            grant: Grant {
                limits,
                seat: grant.and_then(|g| g.seat),
            },
            parked: false,
            pull_from,
            cadence: Cadence::default(),
        }));
        self.serve()
    }

    /// Serves the rings until the session parks or ends; a tenant's
    /// session charges its tenant the turn's CPU time.
    fn serve(&mut self) -> Step {
        let State::Serving(st) = &mut self.state else {
            return Step::Done;
        };
        let mut meter = st.grant.seat.as_ref().map(CpuMeter::start);
        // A request that waits in a model's queue is dropped if the client
        // hangs up meanwhile (its control socket, through the handle).
        let _watch = crate::queue::watch_caller(self.handle.clone());
        if st.parked {
            if st.ch.unpark().is_err() {
                st.ch.close();
                return Step::Done;
            }
            st.parked = false;
        }
        let policy = WaitPolicy {
            spin: self.cfg.spin,
            ..WaitPolicy::AGENT
        };
        let sleep_at_once = WaitPolicy {
            spin: Duration::from_micros(3).min(policy.spin),
            step_off: false,
            ..policy
        };
        let cadence = &mut st.cadence;
        // Whether the waits follow the client's rhythm: from its first
        // answer of this turn on (the gap before the turn's first message
        // was a pause, not a rhythm).
        let mut following = false;
        let mut s = Session {
            core: &self.core,
            arena: &st.arena,
            ch: &mut st.ch,
            layout: st.layout,
            grant: &st.grant,
            region: &mut st.region,
            stall: self.cfg.stall,
            pull_from: st.pull_from.as_ref(),
        };
        loop {
            // Poll only in one of the agent's shm polling slots (one per
            // CPU): more pollers than that only take turns on a CPU.
            // Without one, sleep until woken.
            let slot = SHM_POLLERS.try_take();
            // A polling session moves off its client's CPU whenever they
            // collide, also with as many polling sessions as CPUs: two
            // clients on two CPUs then settle with each CPU holding one
            // client and the other's session (with the sessions held
            // still, 8 starts in 30 polled on their client's CPU, ~7 µs a
            // request; moving, 3 in 30).
            let policy = match slot {
                Some(_) => policy,
                None => sleep_at_once,
            };
            let follow = following.then_some(&mut *cadence);
            let got =
                s.ch.recv_or_park(&s.grant.limits, policy, self.cfg.park_after, slot, follow);
            let (h, desc) = match got {
                Ok(Some(m)) => m,
                Ok(None) if !s.core.is_closing() => {
                    if let (Some(m), Some(seat)) = (meter.take(), &s.grant.seat) {
                        m.finish(seat);
                    }
                    st.parked = true;
                    return Step::Park;
                }
                Ok(None) => break,
                Err(ShmError::Wire(e)) => {
                    s.fatal(e.status(), &e.to_string());
                    break;
                }
                Err(ShmError::Ring(e)) => {
                    s.fatal(Status::Malformed, &e.to_string());
                    break;
                }
                Err(_) => break,
            };
            // A gap runs from an answer to the client's next message that
            // is not a `Release`: a Release is answered by nothing, and the
            // client flushes it before its next request, or while it waits
            // for an answer, or when enough queue up.
            match (following, h.kind) {
                (true, Kind::Release) => cadence.carried(),
                (true, _) => cadence.ended(self.cfg.spin),
                (false, _) => cadence.forgot(),
            }
            following = following || h.kind != Kind::Release;
            let ok = match h.kind {
                Kind::Request => {
                    if let (Some(m), Some(seat)) = (meter.as_mut(), &s.grant.seat) {
                        m.tick(seat);
                    }
                    s.request(&h, &desc)
                }
                Kind::Release => s.release(&h, &desc),
                _ => {
                    let r = s.core.control(&h, &desc, s.grant);
                    s.send(&r)
                }
            };
            if !ok || self.handle.closed.load(Ordering::Relaxed) {
                break;
            }
        }
        if let (Some(m), Some(seat)) = (meter.take(), &s.grant.seat) {
            m.finish(seat);
        }
        s.ch.close();
        Step::Done
    }
}

/// The grant of the client whose whole Hello is `got` on `sock` (its uid
/// from the socket, its token from the Hello): `Ok(None)` when the Hello
/// is malformed (`accept_hello` answers that), the Error refusing the
/// session when its tenant may not have one.
fn hello_grant(core: &AgentCore, sock: &UnixStream, got: &[u8]) -> Result<Option<Grant>, Reply> {
    let Ok(h) = Header::decode(&got[..got.len().min(HEADER_LEN)]) else {
        return Ok(None);
    };
    let body = got.get(HEADER_LEN..HEADER_LEN + h.desc_len as usize);
    let Some(Ok(hello)) = body.map(wire::decode_hello_request) else {
        return Ok(None);
    };
    if h.kind != Kind::Hello {
        return Ok(None);
    }
    // A relay's anonymous session is known by its token only, never by
    // the relay's own uid.
    let who = Identity {
        creds: (!hello.anonymous)
            .then(|| Credentials::of_unix(sock).ok())
            .flatten(),
        ..Identity::REMOTE
    };
    core.grant(&who, hello.token, &hello.limits)
        .map(Some)
        .map_err(|(status, msg)| core.fail(Reply::error(h.request_id, status, &msg)))
}

/// Splits a Request with `flags::PULL` into the header and section of an
/// ordinary one and its source addresses (one u64 per tensor at the end of
/// the section, PROTOCOL §14.6); a request without it is returned as is
/// with no addresses.
fn split_pulls<'d>(h: &Header, desc: &'d [u8]) -> Result<(Header, &'d [u8], Vec<u64>), String> {
    let mut h = *h;
    if h.flags & wire::flags::PULL == 0 {
        return Ok((h, desc, Vec::new()));
    }
    let n = h.tensor_count as usize;
    let cut = n
        .checked_mul(8)
        .and_then(|b| desc.len().checked_sub(b))
        .ok_or_else(|| {
            format!(
                "a pulled request of {n} tensors needs {} address bytes, its section is {} bytes",
                n.saturating_mul(8),
                desc.len()
            )
        })?;
    let addrs = desc[cut..]
        .chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect();
    h.flags &= !wire::flags::PULL;
    h.desc_len = cut as u32;
    Ok((h, &desc[..cut], addrs))
}

/// Reads what has arrived of the Hello on `sock` into `got`, without
/// blocking: true once it is whole (or once its header shows it is bad:
/// `accept_hello` refuses it), false when more is to come; an error when
/// the peer hung up first.
fn read_hello(sock: &UnixStream, got: &mut Vec<u8>) -> std::io::Result<bool> {
    use rustix::net::{recv, RecvFlags};
    loop {
        let want = if got.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            match Header::decode(&got[..HEADER_LEN]) {
                Ok(h) if h.check_limits(&Limits::default()).is_ok() => {
                    HEADER_LEN + h.desc_len as usize
                }
                _ => return Ok(true),
            }
        };
        if got.len() >= want {
            return Ok(true);
        }
        let mut buf = [0u8; 1024];
        let room = (want - got.len()).min(buf.len());
        match recv(sock, &mut buf[..room], RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(rustix::io::Errno::AGAIN) => return Ok(false),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

impl Task for ShmSession {
    fn fd(&self) -> BorrowedFd<'_> {
        match &self.state {
            State::Hello(sock, _) => sock.as_fd(),
            State::Serving(st) => st.ch.as_fd(),
            // Never parked in this state: any open descriptor will do.
            State::Gone => self.handle.sock.as_fd(),
        }
    }

    fn run(&mut self) -> Step {
        let step = match self.state {
            State::Hello(..) => self.bootstrap(),
            State::Serving(_) => {
                self.slot.set(Phase::Busy);
                self.serve()
            }
            State::Gone => Step::Done,
        };
        if step == Step::Park && matches!(self.state, State::Serving(_)) {
            // Parked only after a quiet spell, its responses all sent.
            self.slot.set(Phase::Idle);
        }
        step
    }
}

/// A session's working view, for one turn on a worker: the agent core, the
/// arena and the session's state, borrowed (a request copies references
/// instead of cloning `Arc`s — two atomic read-modify-writes each, on every
/// request).
struct Session<'a> {
    core: &'a AgentCore,
    ch: &'a mut ShmChannel,
    arena: &'a Arena,
    layout: Layout,
    grant: &'a Grant,
    region: &'a mut OutputRegion,
    stall: Duration,
    pull_from: Option<&'a PullSource>,
}

impl<'a> Session<'a> {
    fn counters(&self) -> &'a Counters {
        &self.core.counters
    }

    /// One request: validate, run on views over the client's region, place
    /// the outputs, answer. False when the session must end.
    fn request(&mut self, h: &wire::Header, desc: &[u8]) -> bool {
        let core = self.core;
        let mut tl = core.timeline(h);
        tl.stamp(Stage::Received);
        let region = Placement::Region {
            len: self.layout.client_len as u64,
        };
        // A pulled request: the section ends with one source address per
        // tensor; the rest is an ordinary request's section.
        let (h, desc, pulls) = match split_pulls(h, desc) {
            Ok(x) => x,
            Err(msg) => {
                let reply = Reply::error(h.request_id, Status::Malformed, &msg);
                return self.send(&core.fail(reply));
            }
        };
        let prep = match core.prepare_via(Via::Shm, &h, desc, self.grant, region, &tl) {
            Ok(p) => p,
            Err(reply) => return self.send(&reply),
        };
        if pulls.is_empty() {
            // The tensors were in place before the header was published:
            // they are where the client wrote them (no clock read needed).
            tl.set(Stage::PayloadInPlace, tl.get(Stage::Received));
        } else {
            if let Err(msg) = self.pull(&prep, &pulls) {
                let reply = core.fail(Reply::error(h.request_id, Status::InvalidInput, &msg));
                if let Some(t) = &prep.ticket {
                    t.release();
                }
                let ok = self.send(&reply);
                drop(prep);
                return ok;
            }
            tl.stamp(Stage::PayloadInPlace);
        }
        let arena = self.arena;
        let base = self.layout.data_off;
        let views = prep.views(arena.bytes(base..base + self.layout.client_len));
        let mut blocks = Blocks::new();
        let reply = match self.execute(&prep, &views, &mut blocks, &mut tl) {
            Ok(r) => {
                self.region.hold(prep.request_id, blocks);
                r
            }
            Err(e) => {
                self.region.free_all(blocks);
                e
            }
        };
        // `prep` (the request's in-flight count) lives until the response
        // is published, as on sockets. Its tenant's quota is given back
        // first: a client that has its answer may send again at once.
        if let Some(t) = &prep.ticket {
            t.release();
        }
        let ok = self.send(&reply);
        drop(prep);
        ok
    }

    /// Pulls a request's inputs named by address out of the client's
    /// memory into their slots of the client region (validated by
    /// `prepare_in`: inside the region, not overlapping), with
    /// `process_vm_readv` from the client's process (its control socket's
    /// credentials). The kernel checks each range against the client's own
    /// mappings: a range it does not have fails this request only.
    fn pull(&mut self, p: &Prepared<'_>, addrs: &[u64]) -> Result<(), String> {
        let src = self.pull_from.ok_or(
            "pulled inputs: this agent does not pull (start it with --allow-kernel-pull), \
             or the client's process could not be pinned",
        )?;
        if !src.alive() {
            return Err("pulled inputs: the client's process has exited".into());
        }
        let pid = src.pid;
        for (i, (t, &addr)) in p.tensors.iter().zip(addrs).enumerate() {
            if addr == 0 || t.len == 0 {
                continue;
            }
            let start = self.layout.data_off + t.offset as usize;
            // SAFETY: the descriptor was checked to lie inside the client
            // region and not to overlap another input of this request; the
            // client does not touch a request's input slots until its
            // reply (PROTOCOL §14.6), and if it does it garbles only its
            // own inputs. Nothing else in this process holds these bytes.
            let dst = unsafe { self.arena.bytes_mut(start..start + t.len as usize) };
            transport::mover::kernel_read(pid, &[(addr, t.len as usize)], dst)
                .map_err(|e| format!("pulling input {i}: {e}"))?;
            crate::movers().count(transport::mover::Mover::Kernel, t.len);
        }
        Ok(())
    }

    /// Runs the model and places its outputs; the blocks it allocated are
    /// pushed onto `blocks` (freed by the caller if this fails).
    fn execute(
        &mut self,
        p: &Prepared<'_>,
        views: &[TensorView<'_>],
        blocks: &mut Blocks,
        tl: &mut Timeline,
    ) -> Result<Reply, Reply> {
        let core = self.core;
        let model = &p.model;
        if model.outputs_in_place {
            let metas: Vec<(wire::DType, &[u64])> =
                p.tensors.iter().map(|t| (t.dtype, &t.shape[..])).collect();
            let specs = &model.signature().outputs;
            if let Some(shapes) = model
                .backend
                .output_shapes(&metas)
                .filter(|s| s.len() == specs.len())
            {
                let outs: Vec<_> = specs.iter().map(|s| s.dtype).zip(shapes).collect();
                return self.execute_in_place(p, views, outs, blocks, tl);
            }
        }
        let outputs = core.run(p, views, tl)?;
        let lens = core.check_outputs(p, &outputs, views)?;
        let mut aliased = vec![false; views.len()];
        let mut descs = Vec::with_capacity(outputs.len());
        let (mut copied, mut alias_bytes) = (0u64, 0u64);
        for (o, &len) in outputs.iter().zip(&lens) {
            let offset = match o.data {
                // The output is an input, untouched: point at it. (A second
                // output aliasing the same input is copied: descriptors of a
                // response must not overlap.)
                OutputData::Input(i) if !aliased[i] => {
                    aliased[i] = true;
                    alias_bytes += len;
                    p.tensors[i].offset
                }
                _ => {
                    let off = self.place(p, len, blocks)?;
                    if len > 0 {
                        let start = self.layout.data_off + off as usize;
                        // SAFETY: `off..off+len` is a block of the agent's
                        // region this session just allocated: nothing else
                        // in this process touches it (the client is told to
                        // leave the agent's region alone; if it does not,
                        // it only garbles its own outputs).
                        let dst = unsafe { self.arena.bytes_mut(start..start + len as usize) };
                        crate::movers().move_bytes(dst, o.bytes(views));
                        copied += len;
                    }
                    off
                }
            };
            descs.push(TensorDesc {
                dtype: o.dtype,
                shape: o.shape.clone(),
                offset,
                len,
            });
        }
        let total = lens.iter().sum();
        let r = core.respond(p, &descs, total, tl)?;
        let c = self.counters();
        c.shm_output_bytes_copied
            .fetch_add(copied, Ordering::Relaxed);
        c.shm_output_bytes_aliased
            .fetch_add(alias_bytes, Ordering::Relaxed);
        Ok(r)
    }

    /// Outputs of known dtypes and shapes: blocks first, then the engine
    /// writes into them.
    fn execute_in_place(
        &mut self,
        p: &Prepared<'_>,
        views: &[TensorView<'_>],
        outs: Vec<(wire::DType, Vec<u64>)>,
        blocks: &mut Blocks,
        tl: &mut Timeline,
    ) -> Result<Reply, Reply> {
        let core = self.core;
        let mut descs = Vec::with_capacity(outs.len());
        let mut total = 0u64;
        for (i, (dtype, shape)) in outs.into_iter().enumerate() {
            let len = TensorDesc::byte_len(dtype, &shape).ok_or_else(|| {
                core.fail(Reply::error(
                    p.request_id,
                    Status::InvalidInput,
                    &format!("output {i} ({dtype}{shape:?}) would overflow"),
                ))
            })?;
            let offset = self.place(p, len, blocks)?;
            total += len;
            descs.push(TensorDesc {
                dtype,
                shape,
                offset,
                len,
            });
        }
        {
            let base = self.layout.data_off;
            let arena = self.arena;
            let mut bufs: Vec<&mut [u8]> = descs
                .iter()
                .map(|d| {
                    if d.len == 0 {
                        return &mut [][..];
                    }
                    let start = base + d.offset as usize;
                    // SAFETY: each descriptor with bytes is its own block of
                    // the agent's region, just allocated by this session:
                    // the slices are disjoint and nothing else in this
                    // process touches them.
                    unsafe { arena.bytes_mut(start..start + d.len as usize) }
                })
                .collect();
            core.run_into(p, views, &mut bufs, tl)?;
        }
        let r = core.respond(p, &descs, total, tl)?;
        self.counters()
            .shm_output_bytes_in_place
            .fetch_add(total, Ordering::Relaxed);
        Ok(r)
    }

    /// A block of `len` bytes in the agent's region for an output of `p`;
    /// returns its offset in the data area. Zero bytes take no block.
    fn place(&mut self, p: &Prepared<'_>, len: u64, blocks: &mut Blocks) -> Result<u64, Reply> {
        let client = self.layout.client_len as u64;
        if len == 0 {
            return Ok(client);
        }
        if len > self.region.len() {
            return Err(self.core.fail(Reply::error(
                p.request_id,
                Status::LimitExceeded,
                &format!(
                    "a {len}-byte output is larger than the whole {}-byte shm output area \
                     (raise shm agent_bytes)",
                    self.region.len()
                ),
            )));
        }
        match self.region.alloc(len) {
            Some(off) => {
                blocks.push((off, len));
                Ok(client + off)
            }
            None => Err(self.core.fail(Reply::error(
                p.request_id,
                Status::LimitExceeded,
                &format!(
                    "the shm output area is full: {} of its {} bytes hold {} responses \
                     not yet released, and a {len}-byte output does not fit; read and \
                     drop (Release) old responses, or raise shm agent_bytes",
                    self.region.used(),
                    self.region.len(),
                    self.region.held()
                ),
            ))),
        }
    }

    /// A client's Release: frees the blocks of that response. No reply.
    fn release(&mut self, h: &wire::Header, desc: &[u8]) -> bool {
        if !desc.is_empty() {
            let r = self.core.fail(Reply::error(
                h.request_id,
                Status::Malformed,
                &format!("Release carries no body, got {} bytes", desc.len()),
            ));
            return self.send(&r);
        }
        self.region.release(h.request_id);
        true
    }

    /// The session cannot go on: say why (request id 0) if the ring takes
    /// it soon, then the caller closes.
    fn fatal(&mut self, status: Status, message: &str) {
        let mut r = self.core.fail(Reply::error(0, status, message));
        if !self.fits(&r) {
            r = self.refit(&r);
        }
        let stall = self.stall.min(Duration::from_millis(100));
        let _ = self.publish(&r, stall);
    }

    /// Publishes `reply`, waiting (up to `stall_timeout`) for room in the
    /// response ring. False when the session must end.
    fn send(&mut self, reply: &Reply) -> bool {
        if self.fits(reply) {
            self.publish(reply, self.stall)
        } else {
            let r = self.refit(reply);
            self.publish(&r, self.stall)
        }
    }

    /// Whether `reply` fits the response ring as it is.
    fn fits(&self, reply: &Reply) -> bool {
        reply.desc.len() <= (self.layout.ring_capacity as usize - 1) * SLOT_LEN
    }

    /// A reply that fits the response ring in place of `reply`, which does
    /// not: a truncated error, or an error saying the reply was too big.
    #[cold]
    fn refit(&self, reply: &Reply) -> Reply {
        let cap = self.layout.ring_capacity as usize;
        let room = (cap - 1) * SLOT_LEN;
        let id = reply.header.request_id;
        if reply.header.kind == Kind::Error {
            let msg = String::from_utf8_lossy(&reply.desc);
            let mut end = room.min(msg.len());
            while !msg.is_char_boundary(end) {
                end -= 1;
            }
            Reply::error(id, reply.header.status, &msg[..end])
        } else {
            self.core.fail(Reply::error(
                id,
                Status::LimitExceeded,
                &format!(
                    "the {:?} reply is {} bytes, more than this session's response ring \
                     holds ({cap} slots of {SLOT_LEN} bytes; raise shm ring_slots)",
                    reply.header.kind,
                    reply.desc.len() + wire::HEADER_LEN
                ),
            ))
        }
    }

    fn publish(&mut self, r: &Reply, stall: Duration) -> bool {
        match self.ch.send(&r.header, &r.desc) {
            Ok(true) => true,
            Ok(false) => self.publish_when_room(r, stall),
            Err(_) => false,
        }
    }

    /// The response ring was full: retry until the client makes room, or
    /// give up on it after `stall`.
    #[cold]
    fn publish_when_room(&mut self, r: &Reply, stall: Duration) -> bool {
        let mut pause = Duration::from_micros(20);
        let mut tries = 0u32;
        let mut deadline: Option<Instant> = None;
        loop {
            match self.ch.send(&r.header, &r.desc) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(_) => return false,
            }
            // The client is not draining its responses: back off (it may
            // be busy), but give up on it after the deadline.
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
                std::thread::yield_now();
                continue;
            }
            let now = Instant::now();
            let deadline = *deadline.get_or_insert(now + stall);
            if now >= deadline || !self.ch.peer_alive() {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_pulls;
    use wire::{encode_tensor_section, flags, DType, Header, Kind, TensorDesc};

    /// The bytes of the pulled-request example of PROTOCOL §14.6.
    fn doc_example() -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/PROTOCOL.md");
        let doc = std::fs::read_to_string(path).expect("PROTOCOL.md");
        let at = doc
            .find("A pulled request for the identity model")
            .expect("the example");
        let block = doc[at..].split("```text").nth(1).expect("its block");
        let block = block.split("```").next().expect("its end");
        block
            .lines()
            .filter_map(|l| l.split_once(':'))
            .flat_map(|(_, rest)| {
                let hex = rest.split('#').next().unwrap_or("");
                hex.split_whitespace()
                    .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn the_pull_example_of_protocol_splits() {
        let t = TensorDesc {
            dtype: DType::F32,
            shape: vec![1, 4],
            offset: 0,
            len: 16,
        };
        let mut desc = Vec::new();
        encode_tensor_section(std::slice::from_ref(&t), None, &mut desc);
        desc.extend_from_slice(&0x7ffc_1234_5640u64.to_le_bytes());
        let mut h = Header::new(Kind::Request);
        h.request_id = 9;
        h.tensor_count = 1;
        h.desc_len = desc.len() as u32;
        h.payload_len = 16;
        h.flags = flags::PULL;
        let bytes = [&h.encode()[..], &desc].concat();
        assert_eq!(bytes, doc_example());
        let got = Header::decode(&bytes[..64]).expect("a sound header");
        let (plain, section, addrs) = split_pulls(&got, &bytes[64..]).expect("splits");
        assert_eq!(plain.flags, 0);
        assert_eq!(plain.desc_len, 40);
        assert_eq!(section, &desc[..40]);
        assert_eq!(addrs, vec![0x7ffc_1234_5640]);
        // Too short for its addresses.
        assert!(split_pulls(&got, &bytes[64..64 + 4]).is_err());
    }
}
