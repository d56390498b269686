//! [`ConnTable`]: every open connection of an agent, who holds it, and the
//! limits that keep one peer from locking the others out.
//!
//! A connection is admitted ([`ConnTable::admit`]) only while the agent
//! holds fewer than `max_connections` and its peer ([`PeerId`]: a uid over
//! unix and shm, a source address over tcp) fewer than
//! `max_connections_per_peer`; otherwise it is refused at once, before it
//! costs a thread or a buffer. Refusals are counted and logged once per
//! peer per [`LOG_INTERVAL`] ([`RefusalLog`]), so a flood cannot flood the
//! log too.
//!
//! Each admitted connection gets a [`Slot`], owned by its session: the slot
//! tells the table what the session is doing ([`Phase`]: waiting for its
//! Hello, busy, idle) and gives the connection back when dropped. The
//! [`Reaper`] thread closes connections that stayed in the handshake longer
//! than `handshake_timeout`, parked in the middle of a message longer than
//! `stall_timeout`, or idle longer than `idle_timeout`: it only
//! shuts their sockets down, and the sessions end themselves as they see
//! the hang-up.

use crate::shm_session::ShmHandle;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use transport::{PeerId, StreamWriter};

/// At most one log line per refused peer per interval ([`RefusalLog`]).
///
/// # Examples
///
/// ```
/// assert_eq!(server::conns::LOG_INTERVAL.as_secs(), 10);
/// ```
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How shutdown and the reaper reach an open connection.
///
/// Example: [`ConnTable`] (a front door's TCP connection, `Conn::Tcp`).
pub enum Conn {
    /// A socket session: shutting its socket down ends it.
    Stream(StreamWriter),
    /// A shared-memory session.
    Shm(Arc<ShmHandle>),
    /// A TCP connection served outside the agent's sessions (a KServe
    /// front door's): shutting its socket down ends it there too.
    Tcp(Arc<std::net::TcpStream>),
}

impl Conn {
    fn close(&self) {
        match self {
            Conn::Stream(w) => {
                let _ = w.shutdown();
            }
            Conn::Shm(h) => h.close(),
            Conn::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// What a connection is doing, as far as the reaper cares.
///
/// Example: [`ConnTable`] (a slot moved out of its handshake with
/// [`Slot::set`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Accepted; its Hello has not been answered yet.
    Handshake = 0,
    /// Serving (or waiting briefly for) a request.
    Busy = 1,
    /// Parked with nothing in flight.
    Idle = 2,
    /// Parked with part of a message read: the peer stalled mid-message.
    Stalled = 3,
}

/// The part of a table entry its session updates: the phase (top byte)
/// and the milliseconds since the table's epoch when it began (the rest),
/// in one word, so the reaper never pairs a phase with another phase's
/// start; [`CLOSING`] once the reaper closed it.
#[derive(Debug)]
struct SlotState(AtomicU64);

/// A slot the reaper has closed: its phase no longer changes.
const CLOSING: u64 = u64::MAX;
const MS_BITS: u32 = 56;

fn pack(phase: Phase, ms: u64) -> u64 {
    ((phase as u64) << MS_BITS) | (ms & ((1 << MS_BITS) - 1))
}

fn unpack(word: u64) -> (u8, u64) {
    ((word >> MS_BITS) as u8, word & ((1 << MS_BITS) - 1))
}

struct Entry {
    conn: Conn,
    peer: PeerId,
    state: Arc<SlotState>,
}

#[derive(Default)]
struct Open {
    entries: HashMap<u64, Entry>,
    per_peer: HashMap<PeerId, usize>,
}

/// Counters of the table.
///
/// # Examples
///
/// A running agent's table, read through its core (one client session,
/// past its handshake, idle between requests):
///
/// ```
/// use server::conns::ConnCounts;
/// # let dir = tempfile::tempdir()?;
/// # let uri = format!("unix://{}", dir.path().join("a.sock").display());
/// let mut cfg = server::AgentConfig::default();
/// cfg.add_listen(&uri)?;
/// let agent = server::Agent::start(cfg)?;
/// let c = client::Client::connect(&uri)?;
/// let mut counts = agent.core().conns().counts();
/// for _ in 0..1000 {
///     if counts.idle == 1 { break; } // the session parks once its Hello is answered
///     std::thread::sleep(std::time::Duration::from_millis(1));
///     counts = agent.core().conns().counts();
/// }
/// assert_eq!(counts, ConnCounts { open: 1, peers: 1, idle: 1, ..ConnCounts::default() });
/// drop(c);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnCounts {
    /// Connections open now.
    pub open: usize,
    /// Of which shared-memory sessions.
    pub shm: usize,
    /// Of which still in their handshake.
    pub handshaking: usize,
    /// Of which idle (parked with nothing in flight).
    pub idle: usize,
    /// Distinct peers holding connections now.
    pub peers: usize,
}

/// Why a connection was refused.
///
/// Example: [`ConnTable`] (a second connection of one peer over its
/// limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The agent holds `max_connections`.
    Full(usize),
    /// The peer holds `max_connections_per_peer`.
    PeerFull(PeerId, usize),
}

impl Refusal {
    /// What the refused client is told.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::conns::Refusal;
    /// let m = Refusal::Full(256).message();
    /// assert_eq!(m, "the agent already serves 256 connections (its limit)");
    /// ```
    pub fn message(&self) -> String {
        match self {
            Refusal::Full(n) => format!("the agent already serves {n} connections (its limit)"),
            Refusal::PeerFull(p, n) => format!(
                "{p} already holds {n} connections to this agent (the per-peer limit, \
                 max_connections_per_peer)"
            ),
        }
    }
}

/// Every open connection, counted per peer.
///
/// An agent has one ([`AgentCore::conns`](crate::dispatch::AgentCore::conns));
/// a listener that runs beside it (as the KServe front doors do) admits
/// each connection it accepts there, so every connection counts against
/// the same limits.
///
/// # Examples
///
/// A front end's TCP connections, at most one per peer:
///
/// ```
/// use server::conns::{Conn, ConnTable, Phase, Refusal};
/// use std::net::{TcpListener, TcpStream};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use transport::PeerId;
/// let table = Arc::new(ConnTable::new(16, 1));
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let _a = TcpStream::connect(listener.local_addr()?)?;
/// let (s, addr) = listener.accept()?;
/// let peer = PeerId::Addr(addr.ip());
/// let slot = table.admit(Conn::Tcp(Arc::new(s)), peer).map_err(|r| r.message())?;
/// assert_eq!(slot.phase(), Phase::Handshake);
/// slot.set(Phase::Busy); // its first request came
/// assert_eq!((table.counts().open, table.counts().handshaking), (1, 0));
///
/// let _b = TcpStream::connect(listener.local_addr()?)?;
/// let (s2, _) = listener.accept()?;
/// let refused = table.admit(Conn::Tcp(Arc::new(s2)), peer).err();
/// assert_eq!(refused, Some(Refusal::PeerFull(peer, 1)));
///
/// drop(slot); // the session ended: its place is given back
/// assert_eq!(table.counts().open, 0);
/// assert!(table.close_all(Duration::from_millis(10)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ConnTable {
    open: Mutex<Open>,
    closed: Condvar,
    next: AtomicU64,
    epoch: Instant,
    max: usize,
    max_per_peer: usize,
    /// Connections admitted since start.
    pub accepted: AtomicU64,
    /// Refused because the agent was full.
    pub refused: AtomicU64,
    /// Refused because their peer was at its limit.
    pub refused_per_peer: AtomicU64,
    /// Closed for not completing the handshake in time.
    pub handshake_timeouts: AtomicU64,
    /// Closed for being idle too long.
    pub idle_timeouts: AtomicU64,
    /// Closed for stalling in the middle of a message.
    pub stalls: AtomicU64,
    refusals: Mutex<RefusalLog>,
}

impl std::fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTable")
            .field("max", &self.max)
            .field("max_per_peer", &self.max_per_peer)
            .field("counts", &self.counts())
            .finish()
    }
}

/// A session's place in the table: dropping it gives the connection back.
///
/// Example: [`ConnTable`].
pub struct Slot {
    table: Arc<ConnTable>,
    id: u64,
    state: Arc<SlotState>,
}

impl ConnTable {
    /// An empty table with these limits.
    ///
    /// # Examples
    ///
    /// ```
    /// let table = server::conns::ConnTable::new(1024, 64);
    /// assert_eq!(table.counts().open, 0);
    /// ```
    pub fn new(max: usize, max_per_peer: usize) -> ConnTable {
        ConnTable {
            open: Mutex::new(Open::default()),
            closed: Condvar::new(),
            next: AtomicU64::new(1),
            epoch: Instant::now(),
            max,
            max_per_peer,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refused_per_peer: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            refusals: Mutex::new(RefusalLog::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Admits a connection from `peer`, in its handshake, unless a limit is
    /// reached; a refusal is counted and logged (rate-limited).
    ///
    /// Example: [`ConnTable`].
    pub fn admit(self: &Arc<Self>, conn: Conn, peer: PeerId) -> Result<Slot, Refusal> {
        let mut open = self.lock();
        let refusal = if open.entries.len() >= self.max {
            Some(Refusal::Full(self.max))
        } else if open.per_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer {
            Some(Refusal::PeerFull(peer, self.max_per_peer))
        } else {
            None
        };
        if let Some(r) = refusal {
            drop(open);
            match r {
                Refusal::Full(_) => &self.refused,
                Refusal::PeerFull(..) => &self.refused_per_peer,
            }
            .fetch_add(1, Ordering::Relaxed);
            self.refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .refused(peer, &r, Instant::now());
            return Err(r);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(SlotState(AtomicU64::new(pack(
            Phase::Handshake,
            self.now_ms(),
        ))));
        open.entries.insert(
            id,
            Entry {
                conn,
                peer,
                state: state.clone(),
            },
        );
        *open.per_peer.entry(peer).or_insert(0) += 1;
        drop(open);
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            table: self.clone(),
            id,
            state,
        })
    }

    fn remove(&self, id: u64) {
        let mut open = self.lock();
        if let Some(e) = open.entries.remove(&id) {
            if let Some(n) = open.per_peer.get_mut(&e.peer) {
                *n -= 1;
                if *n == 0 {
                    open.per_peer.remove(&e.peer);
                }
            }
        }
        drop(open);
        self.closed.notify_all();
    }

    /// What is open now. Examples: [`ConnCounts`], [`ConnTable`].
    pub fn counts(&self) -> ConnCounts {
        let open = self.lock();
        let mut c = ConnCounts {
            open: open.entries.len(),
            peers: open.per_peer.len(),
            ..ConnCounts::default()
        };
        for e in open.entries.values() {
            c.shm += usize::from(matches!(e.conn, Conn::Shm(_)));
            match e.state.0.load(Ordering::Relaxed) {
                CLOSING => {}
                w if unpack(w).0 == Phase::Handshake as u8 => c.handshaking += 1,
                w if unpack(w).0 == Phase::Idle as u8 => c.idle += 1,
                _ => {}
            }
        }
        c
    }

    /// Closes every open connection and waits up to `limit` for their
    /// sessions to end; true when none is left.
    ///
    /// # Examples
    ///
    /// A connection whose owner drops its slot when its socket is shut
    /// down, as a session does:
    ///
    /// ```
    /// use server::conns::{Conn, ConnTable};
    /// use std::io::Read;
    /// use std::net::{TcpListener, TcpStream};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// let table = Arc::new(ConnTable::new(16, 16));
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let _peer = TcpStream::connect(listener.local_addr()?)?;
    /// let (s, addr) = listener.accept()?;
    /// let s = Arc::new(s);
    /// let slot = table.admit(Conn::Tcp(s.clone()), transport::PeerId::Addr(addr.ip()))
    ///     .map_err(|r| r.message())?;
    /// let session = std::thread::spawn(move || {
    ///     let _ = (&*s).read(&mut [0u8; 1]); // returns once close_all shuts the socket
    ///     drop(slot);
    /// });
    /// assert!(table.close_all(Duration::from_secs(5)));
    /// session.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close_all(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut open = self.lock();
        while !open.entries.is_empty() && Instant::now() < deadline {
            // Again each round: a shared-memory session that was between
            // its spin and its sleep when woken would otherwise sleep out
            // its slice; closing twice is harmless.
            for e in open.entries.values() {
                e.conn.close();
            }
            open = self
                .closed
                .wait_timeout(open, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        open.entries.is_empty()
    }

    /// Closes connections past their deadline; returns how many.
    fn reap(&self, d: &Deadlines) -> usize {
        let (handshake, stall, idle) = (d.handshake, d.stall, d.idle);
        let now = self.now_ms();
        let late =
            |since: u64, limit: Duration| now.saturating_sub(since) >= limit.as_millis() as u64;
        let open = self.lock();
        let mut n = 0;
        for e in open.entries.values() {
            let word = e.state.0.load(Ordering::Relaxed);
            if word == CLOSING {
                continue;
            }
            let (phase, since) = unpack(word);
            let counter = if phase == Phase::Handshake as u8 && late(since, handshake) {
                &self.handshake_timeouts
            } else if phase == Phase::Stalled as u8 && late(since, stall) {
                &self.stalls
            } else if phase == Phase::Idle as u8 && idle.is_some_and(|t| late(since, t)) {
                &self.idle_timeouts
            } else {
                continue;
            };
            // Only if the session did not move on meanwhile; then it stays
            // marked, so it is neither counted twice nor revived. The
            // session sees the hang-up and ends; its entry goes then.
            if e.state
                .0
                .compare_exchange(word, CLOSING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                counter.fetch_add(1, Ordering::Relaxed);
                e.conn.close();
                n += 1;
            }
        }
        n
    }
}

impl Slot {
    /// The session moved to `phase`: the reaper's deadline counts from now,
    /// unless it already was in that phase (a stalled peer that trickles
    /// bytes does not restart its clock). No effect once the reaper closed
    /// it. Example: [`ConnTable`].
    pub fn set(&self, phase: Phase) {
        let word = &self.state.0;
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            if cur == CLOSING || unpack(cur).0 == phase as u8 {
                return;
            }
            let new = pack(phase, self.table.now_ms());
            match word.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Its owner closes the connection for not completing its handshake
    /// in time (a listener that keeps its own deadline, as the KServe
    /// doors do): counted as the reaper counts it, unless the reaper
    /// already did or the connection has left its handshake.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::conns::{Conn, ConnTable};
    /// use std::net::{TcpListener, TcpStream};
    /// use std::sync::atomic::Ordering;
    /// use std::sync::Arc;
    /// let table = Arc::new(ConnTable::new(16, 16));
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let _silent = TcpStream::connect(listener.local_addr()?)?;
    /// let (s, addr) = listener.accept()?;
    /// let slot = table.admit(Conn::Tcp(Arc::new(s)), transport::PeerId::Addr(addr.ip()))
    ///     .map_err(|r| r.message())?;
    /// slot.handshake_timed_out(); // no byte within the door's deadline
    /// slot.handshake_timed_out(); // counted once
    /// assert_eq!(table.handshake_timeouts.load(Ordering::Relaxed), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn handshake_timed_out(&self) {
        let word = self.state.0.load(Ordering::Relaxed);
        if word != CLOSING
            && unpack(word).0 == Phase::Handshake as u8
            && self
                .state
                .0
                .compare_exchange(word, CLOSING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.table
                .handshake_timeouts
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The session's phase now (`Busy` once the reaper closed it).
    /// Example: [`ConnTable`].
    pub fn phase(&self) -> Phase {
        match self.state.0.load(Ordering::Relaxed) {
            CLOSING => Phase::Busy,
            w => match unpack(w).0 {
                0 => Phase::Handshake,
                2 => Phase::Idle,
                3 => Phase::Stalled,
                _ => Phase::Busy,
            },
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.remove(self.id);
    }
}

/// Refusals per peer, so that each peer costs at most one log line per
/// [`LOG_INTERVAL`] however fast it is refused.
#[derive(Default)]
pub struct RefusalLog {
    peers: HashMap<PeerId, Logged>,
}

struct Logged {
    at: Instant,
    unlogged: u64,
    last: String,
}

/// Peers remembered at most (a flood from many addresses must not grow the
/// log's memory without bound); the quietest are forgotten first.
const LOG_PEERS: usize = 4096;

impl RefusalLog {
    /// Records a refusal; logs it at once if this peer was not logged in the
    /// last interval.
    pub fn refused(&mut self, peer: PeerId, why: &Refusal, now: Instant) {
        if let Some(l) = self.peers.get_mut(&peer) {
            l.unlogged += 1;
            l.last = why.message();
            if now.duration_since(l.at) >= LOG_INTERVAL {
                Self::log(peer, l, now);
            }
            return;
        }
        if self.peers.len() >= LOG_PEERS {
            self.flush(now);
            self.peers
                .retain(|_, l| now.duration_since(l.at) < LOG_INTERVAL || l.unlogged > 0);
            if self.peers.len() >= LOG_PEERS {
                return; // counted in the agent's counters, not logged
            }
        }
        let mut l = Logged {
            at: now,
            unlogged: 1,
            last: why.message(),
        };
        Self::log(peer, &mut l, now);
        self.peers.insert(peer, l);
    }

    /// Logs what was refused but not yet logged, for peers whose interval
    /// has passed.
    pub fn flush(&mut self, now: Instant) {
        for (peer, l) in self.peers.iter_mut() {
            if l.unlogged > 0 && now.duration_since(l.at) >= LOG_INTERVAL {
                Self::log(*peer, l, now);
            }
        }
    }

    fn log(peer: PeerId, l: &mut Logged, now: Instant) {
        eprintln!(
            "tensorwire agent: refused {} connection(s) from {peer}: {}",
            l.unlogged, l.last
        );
        l.unlogged = 0;
        l.at = now;
    }

    /// Refusals not logged yet, per peer (for tests).
    #[cfg(test)]
    fn pending(&self, peer: PeerId) -> u64 {
        self.peers.get(&peer).map_or(0, |l| l.unlogged)
    }
}

/// How long a connection may stay in each waiting phase.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// In [`Phase::Handshake`].
    pub handshake: Duration,
    /// In [`Phase::Stalled`].
    pub stall: Duration,
    /// In [`Phase::Idle`] (`None`: forever).
    pub idle: Option<Duration>,
}

/// The thread that closes connections past their deadlines and writes the
/// refusal log's summaries.
pub struct Reaper {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts reaping `table` with these deadlines.
    pub fn start(table: Arc<ConnTable>, d: Deadlines) -> std::io::Result<Reaper> {
        // A deadline is enforced within a quarter of itself (at least every
        // 250 ms, at most every 5 ms).
        let shortest = d
            .idle
            .map_or(d.handshake, |i| i.min(d.handshake))
            .min(d.stall);
        let tick = (shortest / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tw-reaper".into())
            .spawn(move || {
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !*stopped {
                    stopped = cv
                        .wait_timeout(stopped, tick)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    table.reap(&d);
                    table
                        .refusals
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .flush(Instant::now());
                }
            })?;
        Ok(Reaper {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Raises this process's soft file-descriptor limit to its hard limit (an
/// agent holds one per connection); returns the limit in force.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
    getrlimit(Resource::Nofile).current
}

static FD_WARNED: AtomicBool = AtomicBool::new(false);

/// Warns once per process when `max_connections` cannot all be open within
/// the file-descriptor limit.
pub fn check_fd_limit(max_connections: usize) {
    if let Some(limit) = raise_fd_limit() {
        // One descriptor per socket connection (shared memory: three), plus
        // listeners, model files and the runtime's own.
        let want = max_connections as u64 + 64;
        if want > limit && !FD_WARNED.swap(true, Ordering::Relaxed) {
            eprintln!(
                "tensorwire agent: max_connections {max_connections} needs about {want} file \
                 descriptors but this process may open {limit}; connections past that are \
                 refused by the kernel (raise `ulimit -n`, or lower max_connections)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use transport::StreamConn;

    fn conn() -> (Conn, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let w = StreamConn::from_unix(a, "t".into()).writer().unwrap();
        (Conn::Stream(w), b)
    }

    #[test]
    fn a_peer_at_its_limit_is_refused_while_others_get_in() {
        let t = Arc::new(ConnTable::new(10, 3));
        let (a, b) = (PeerId::Uid(1), PeerId::Uid(2));
        let held: Vec<Slot> = (0..3).map(|_| t.admit(conn().0, a).unwrap()).collect();
        assert_eq!(t.admit(conn().0, a).err(), Some(Refusal::PeerFull(a, 3)));
        let other = t.admit(conn().0, b).unwrap();
        assert_eq!(t.counts().open, 4);
        assert_eq!(t.counts().peers, 2);
        assert_eq!(t.refused_per_peer.load(Ordering::Relaxed), 1);
        drop(held);
        // Given back: a gets in again.
        let _again = t.admit(conn().0, a).unwrap();
        drop(other);
        assert_eq!(t.counts().open, 1);
        assert_eq!(t.counts().peers, 1);
    }

    #[test]
    fn the_agent_wide_limit_holds_across_peers() {
        let t = Arc::new(ConnTable::new(4, 4));
        let _held: Vec<Slot> = (0..4)
            .map(|i| t.admit(conn().0, PeerId::Uid(i)).unwrap())
            .collect();
        let r = t.admit(conn().0, PeerId::Uid(9)).err().unwrap();
        assert_eq!(r, Refusal::Full(4));
        assert!(r.message().contains("4 connections"));
        assert!(Refusal::PeerFull(PeerId::Uid(7), 2)
            .message()
            .contains("uid 7 already holds 2"));
    }

    #[test]
    fn the_reaper_closes_late_handshakes_and_idle_sessions_only() {
        let t = Arc::new(ConnTable::new(10, 10));
        let (c1, mut s1) = conn();
        let (c2, mut s2) = conn();
        let (c3, mut s3) = conn();
        let late_hello = t.admit(c1, PeerId::Uid(1)).unwrap();
        let idle = t.admit(c2, PeerId::Uid(1)).unwrap();
        let busy = t.admit(c3, PeerId::Uid(1)).unwrap();
        let (c4, mut s4) = conn();
        let stalled = t.admit(c4, PeerId::Uid(1)).unwrap();
        idle.set(Phase::Idle);
        busy.set(Phase::Busy);
        stalled.set(Phase::Stalled);
        std::thread::sleep(Duration::from_millis(30));
        let ms = Duration::from_millis;
        let d = |handshake, stall, idle| Deadlines {
            handshake,
            stall,
            idle,
        };
        assert_eq!(t.reap(&d(ms(20), ms(60_000), Some(ms(60_000)))), 1);
        assert_eq!(t.reap(&d(ms(20), ms(20), Some(ms(60_000)))), 1);
        assert_eq!(t.reap(&d(ms(20), ms(20), Some(ms(20)))), 1);
        assert_eq!(t.reap(&d(ms(20), ms(20), Some(ms(20)))), 0);
        assert_eq!(t.handshake_timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(t.stalls.load(Ordering::Relaxed), 1);
        assert_eq!(t.idle_timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(s4.read(&mut [0u8; 1]).unwrap(), 0);
        drop(stalled);
        // Closed sockets read EOF; the busy one does not.
        let mut b = [0u8; 1];
        assert_eq!(s1.read(&mut b).unwrap(), 0);
        assert_eq!(s2.read(&mut b).unwrap(), 0);
        s3.set_nonblocking(true).unwrap();
        assert!(s3.read(&mut b).is_err());
        // A session being closed does not come back to life.
        late_hello.set(Phase::Idle);
        assert_eq!(late_hello.phase(), Phase::Busy);
        drop((late_hello, idle, busy));
    }

    #[test]
    fn a_stalled_peer_that_trickles_does_not_restart_its_clock() {
        let t = Arc::new(ConnTable::new(10, 10));
        let (c, mut s) = conn();
        let slot = t.admit(c, PeerId::Uid(1)).unwrap();
        slot.set(Phase::Stalled);
        let ms = Duration::from_millis;
        let d = Deadlines {
            handshake: ms(60_000),
            stall: ms(40),
            idle: None,
        };
        for _ in 0..5 {
            std::thread::sleep(ms(10));
            slot.set(Phase::Stalled); // another byte came, the message did not
        }
        assert_eq!(t.reap(&d), 1, "stalled 50 ms in all, over the 40 ms limit");
        assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
        // Closed by the reaper: later phases do not bring it back.
        slot.set(Phase::Busy);
        assert_eq!(slot.phase(), Phase::Busy);
        assert_eq!(t.counts().handshaking + t.counts().idle, 0);
        assert_eq!(t.reap(&d), 0);
    }

    #[test]
    fn refusals_are_logged_once_per_peer_per_interval() {
        let mut log = RefusalLog::default();
        let p = PeerId::Uid(5);
        let r = Refusal::PeerFull(p, 1);
        let t0 = Instant::now();
        log.refused(p, &r, t0);
        assert_eq!(log.pending(p), 0, "the first refusal is logged at once");
        for _ in 0..1000 {
            log.refused(p, &r, t0 + Duration::from_secs(1));
        }
        assert_eq!(log.pending(p), 1000, "then held back");
        log.flush(t0 + Duration::from_secs(2));
        assert_eq!(log.pending(p), 1000);
        log.flush(t0 + LOG_INTERVAL);
        assert_eq!(log.pending(p), 0, "and summed up once the interval passed");
        // Bounded memory under a flood from many addresses.
        for i in 0..(LOG_PEERS as u32 + 100) {
            let q = PeerId::Uid(1000 + i);
            log.refused(q, &Refusal::Full(1), t0);
        }
        assert!(log.peers.len() <= LOG_PEERS);
    }
}
