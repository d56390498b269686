//! The client's side of a shared-memory session (`shm://`).
//!
//! The agent hands the client a private arena: two rings and a data area.
//! The client owns the data area's first `client_len` bytes (its input
//! tensors); the agent owns the rest (outputs). This module keeps:
//!
//! - [`RegionAllocator`]: first-fit allocation with coalescing over the
//!   client region, 64-byte aligned. Each [`Allocation`] is reference
//!   counted: a [`TensorBuf`](crate::TensorBuf), a request in flight that
//!   reads it and an output that aliases it (the identity model's) each hold
//!   it, and its range returns to the free list when the last one lets go.
//!   A tensor whose bytes already lie in an allocation is sent where it is
//!   (zero copy); any other is copied into a fresh allocation once.
//! - [`ShmLink`]: the channel behind a mutex, the id-matching of responses
//!   (out of order, pipelined, abandoned tickets), and the queue of
//!   `Release` messages. An output in the agent region is a view into the
//!   arena that holds a [`ResponseRegion`]; when the last output of a
//!   response is dropped, its request id is queued for a `Release` (never a
//!   blocking call in `Drop`), which the next send or receive flushes.
//!
//! Waiting: one caller at a time holds the reader role; it receives with the
//! channel's hybrid wait (spin, then futex) in chunks growing from 2 ms to
//! [`SLEEP_CHUNK`] (its deadline and pending releases are looked at between
//! chunks), and files others' responses under their ids. A sender that
//! finds the channel held asks the reader to give it up
//! ([`transport::shm::ShmYield`]): the reader's wait ends at once, so a
//! sleeping reader never holds a sender back, and a request that takes
//! 170 ms costs its waiting client 7 wake-ups, not one every 2 ms. For a
//! model whose answers take longer than the poll, the wait first sleeps
//! until shortly before the answer is due and polls only then
//! ([`crate::service_time`]), so the poll does not take a CPU from the
//! model's compute.

use crate::error::ClientError;
use crate::ids::{IdMap, PendingIds};
use crate::service_time::{Expect, ServiceTimes, WaitPlan};
use crate::tensor::{Tensor, TensorBytes, TensorRef};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use transport::mover::{Mover, MoverChoice, MoverCounters};
use transport::shm::{Arena, Layout, ShmChannel, ShmError, ShmYield, WaitPolicy};
use wire::{
    decode_tensor_section_in, Header, Kind, Limits, Placement, TensorDesc, Timeline, PAYLOAD_ALIGN,
};

/// Alignment (and smallest size) of every allocation in the client region.
pub(crate) const ALIGN: usize = PAYLOAD_ALIGN as usize;

/// Once this many releases are queued, the dropping thread flushes them if
/// the channel is free.
const FLUSH_AT: usize = 32;

/// Longest a reader sleeps in the channel before it looks at its deadline
/// and flushes queued releases (senders need not wait for it: they ask
/// the reader to give the channel up).
pub(crate) const SLEEP_CHUNK: Duration = Duration::from_millis(100);

/// A reader's first chunk of sleep (after its spin); each next one is twice
/// as long, up to [`SLEEP_CHUNK`]. Short first chunks keep a reader whose
/// answer takes a few milliseconds as it was with 2 ms chunks (a 2 ms
/// MobileNetV2 call: mean 3.0 ms with them, 3.7 ms with 100 ms chunks at
/// once); doubling takes a 170 ms wait from 85 wake-ups to 7.
const FIRST_CHUNK: Duration = Duration::from_millis(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// The client-region allocator

/// Why an allocation failed: no free block is large enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NoSpace {
    /// Bytes asked for (rounded up to [`ALIGN`]; `usize::MAX` on overflow).
    pub need: usize,
    /// Free bytes in all.
    pub free: usize,
    /// The largest free block.
    pub largest: usize,
    /// The region's size.
    pub region: usize,
}

impl NoSpace {
    pub(crate) fn into_error(self) -> ClientError {
        ClientError::LimitExceeded(format!(
            "shm arena full: no room for {} bytes in the client region ({} of {} bytes free, \
             largest free block {}); drop tensors, outputs or tickets that hold arena memory",
            self.need, self.free, self.region, self.largest
        ))
    }
}

#[derive(Default)]
struct AllocState {
    /// Free blocks, start → length, coalesced (no two touch).
    free: BTreeMap<usize, usize>,
    /// Live allocations by start (weak: the table never keeps one alive).
    live: BTreeMap<usize, Weak<Allocation>>,
    free_bytes: usize,
}

/// First-fit allocator with coalescing over the client region
/// `[0, len)` of an arena's data area (which starts at `base`).
pub(crate) struct RegionAllocator {
    arena: Arc<Arena>,
    base: usize,
    len: usize,
    state: Mutex<AllocState>,
}

impl std::fmt::Debug for RegionAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (free, largest) = self.usage();
        f.debug_struct("RegionAllocator")
            .field("len", &self.len)
            .field("free", &free)
            .field("largest", &largest)
            .finish()
    }
}

impl RegionAllocator {
    /// An allocator over `arena[base .. base + len]` (`base` 64-byte aligned).
    pub(crate) fn new(arena: Arc<Arena>, base: usize, len: usize) -> Arc<RegionAllocator> {
        assert!(
            base.is_multiple_of(ALIGN) && base.checked_add(len).is_some_and(|e| e <= arena.len()),
            "client region {base}..+{len} does not fit the {}-byte arena",
            arena.len()
        );
        let len = len / ALIGN * ALIGN;
        let mut state = AllocState::default();
        if len > 0 {
            state.free.insert(0, len);
        }
        state.free_bytes = len;
        Arc::new(RegionAllocator {
            arena,
            base,
            len,
            state: Mutex::new(state),
        })
    }

    /// The region's size.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Allocates `size` bytes (at least [`ALIGN`], rounded up to it, so
    /// even empty tensors get an offset of their own).
    pub(crate) fn alloc(self: &Arc<Self>, size: usize) -> Result<Arc<Allocation>, NoSpace> {
        let mut st = lock(&self.state);
        let need = size.max(1).checked_next_multiple_of(ALIGN);
        let found = need.and_then(|need| {
            st.free
                .iter()
                .find(|&(_, &l)| l >= need)
                .map(|(&s, &l)| (s, l, need))
        });
        let Some((start, block, need)) = found else {
            return Err(NoSpace {
                need: need.unwrap_or(usize::MAX),
                free: st.free_bytes,
                largest: st.free.values().copied().max().unwrap_or(0),
                region: self.len,
            });
        };
        st.free.remove(&start);
        if block > need {
            st.free.insert(start + need, block - need);
        }
        st.free_bytes -= need;
        let a = Arc::new(Allocation {
            region: self.clone(),
            off: start,
            len: need,
        });
        st.live.insert(start, Arc::downgrade(&a));
        Ok(a)
    }

    fn release(&self, off: usize, len: usize) {
        let mut st = lock(&self.state);
        st.live.remove(&off);
        let (mut start, mut end) = (off, off + len);
        if let Some((&ps, &pl)) = st.free.range(..off).next_back() {
            if ps + pl == off {
                st.free.remove(&ps);
                start = ps;
            }
        }
        if let Some(nl) = st.free.remove(&end) {
            end += nl;
        }
        st.free.insert(start, end - start);
        st.free_bytes += len;
    }

    /// The live allocation holding all of `data`, and `data`'s offset in the
    /// data area — if `data` lies in this client region at all.
    pub(crate) fn find(&self, data: &[u8]) -> Option<(Arc<Allocation>, usize)> {
        let region = self.arena.as_ptr() as usize + self.base;
        let off = (data.as_ptr() as usize).checked_sub(region)?;
        let end = off.checked_add(data.len())?;
        if end > self.len {
            return None;
        }
        let st = lock(&self.state);
        let (&start, w) = st.live.range(..=off).next_back()?;
        let a = w.upgrade()?;
        (end <= start + a.len).then_some((a, off))
    }

    /// Free bytes, and the largest free block.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let st = lock(&self.state);
        (st.free_bytes, st.free.values().copied().max().unwrap_or(0))
    }

    #[cfg(test)]
    fn free_blocks(&self) -> usize {
        lock(&self.state).free.len()
    }
}

/// A range of the client region, returned to the allocator when the last
/// holder drops it.
pub(crate) struct Allocation {
    region: Arc<RegionAllocator>,
    off: usize,
    len: usize,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Allocation({}..+{})", self.off, self.len)
    }
}

impl Allocation {
    /// Offset in the data area (a multiple of [`ALIGN`]).
    pub(crate) fn offset(&self) -> usize {
        self.off
    }

    /// Bytes reserved (a multiple of [`ALIGN`], at least one).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn abs(&self) -> Range<usize> {
        let s = self.region.base + self.off;
        s..s + self.len
    }

    /// The reserved bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.region.arena.bytes(self.abs())
    }

    /// The reserved bytes, writable.
    ///
    /// # Safety
    /// Nothing else may access this allocation's bytes while the slice
    /// lives (e.g. the caller holds the only reference to it).
    #[allow(clippy::mut_from_ref)] // exclusivity is the caller's contract (above)
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: the range is this allocation's, which the allocator gave
        // to no one else; exclusivity within it is the caller's contract.
        unsafe { self.region.arena.bytes_mut(self.abs()) }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.region.release(self.off, self.len);
    }
}

impl TensorBytes for Allocation {
    fn bytes(&self) -> &[u8] {
        Allocation::bytes(self)
    }
}

// ---------------------------------------------------------------------------
// Releases of the agent's region

/// Request ids whose agent-region outputs the client is done with.
struct ReleaseQueue {
    ids: Mutex<Vec<u64>>,
    /// `ids.len()`, readable without the lock: every request flushes, and
    /// almost always there is nothing to flush.
    queued: AtomicUsize,
    ch: Weak<Mutex<ShmChannel>>,
}

impl ReleaseQueue {
    /// Queues `id`; flushes if the queue is long and the channel is free
    /// right now (never waits for it).
    fn push(&self, id: u64) {
        let n = {
            let mut ids = lock(&self.ids);
            ids.push(id);
            self.queued.store(ids.len(), Ordering::Release);
            ids.len()
        };
        if n >= FLUSH_AT {
            if let Some(ch) = self.ch.upgrade() {
                if let Ok(mut ch) = ch.try_lock() {
                    self.flush(&mut ch);
                }
            }
        }
    }

    /// Sends the queued releases the ring has room for (the channel lock is
    /// held by the caller); the rest wait for the next flush. Every send
    /// and wait calls it, and almost always there is nothing to flush.
    #[inline]
    fn flush(&self, ch: &mut ShmChannel) {
        if self.queued.load(Ordering::Acquire) != 0 {
            self.flush_queued(ch);
        }
    }

    #[cold]
    fn flush_queued(&self, ch: &mut ShmChannel) {
        let ids = {
            let mut q = lock(&self.ids);
            self.queued.store(0, Ordering::Release);
            std::mem::take(&mut *q)
        };
        for (i, &id) in ids.iter().enumerate() {
            let mut h = Header::new(Kind::Release);
            h.request_id = id;
            match ch.send(&h, &[]) {
                Ok(true) => {}
                Ok(false) => {
                    let mut q = lock(&self.ids);
                    q.extend_from_slice(&ids[i..]);
                    self.queued.store(q.len(), Ordering::Release);
                    return;
                }
                // The session is broken: nothing to release any more.
                Err(_) => return,
            }
        }
    }
}

/// The agent-region outputs of one response: a view of the arena's data
/// area that queues a `Release` for the response when the last output
/// viewing it is dropped.
struct ResponseRegion {
    arena: Arc<Arena>,
    data: Range<usize>,
    id: u64,
    releases: Arc<ReleaseQueue>,
}

impl TensorBytes for ResponseRegion {
    fn bytes(&self) -> &[u8] {
        self.arena.bytes(self.data.clone())
    }
}

impl Drop for ResponseRegion {
    fn drop(&mut self) {
        self.releases.push(self.id);
    }
}

// ---------------------------------------------------------------------------
// The link

/// Copies `src` into the arena slot `dst` with the mover `pick`; returns
/// the mover used. A copy the client makes itself cannot be the agent's
/// pull, so `kernel` here (a submitted request, or an agent that does not
/// pull) is `process_vm_readv` from this process itself, and a failure of
/// it (a sandbox that forbids the call) falls back to memcpy.
fn copy_in(pick: Mover, dst: &mut [u8], src: &[u8]) -> Mover {
    let m = match pick {
        Mover::Zero => Mover::Memcpy,
        m => m,
    };
    match transport::mover::copy(m, dst, src) {
        Ok(()) => m,
        Err(_) => {
            dst.copy_from_slice(src);
            Mover::Memcpy
        }
    }
}

/// Inputs placed in the client region for one request.
pub(crate) struct Placed {
    /// One descriptor per input, offsets relative to the data area.
    pub descs: Vec<TensorDesc>,
    /// The allocations the request reads (kept until its response).
    pub pins: Vec<Arc<Allocation>>,
    /// Bytes copied into the arena (inputs not already in it).
    pub copied: u64,
    /// The mover of the request's largest input (`Zero`: every input was
    /// already in the arena, or there were none).
    pub mover: Mover,
    /// When the agent is to pull inputs (`mover=kernel`): each input's
    /// address in this process (0: in place), for the request's section;
    /// empty when nothing is pulled.
    pub pulls: Vec<u64>,
}

struct Shared {
    /// Messages received for callers that have not collected them yet.
    completed: IdMap<(Header, Vec<u8>)>,
    /// Requests given up on (ticket dropped, timed out), with the
    /// allocations they read: kept until their response arrives, since the
    /// agent may be reading them until then.
    abandoned: IdMap<Vec<Arc<Allocation>>>,
    /// Requests sent and not yet answered.
    pending: PendingIds,
    reading: bool,
    /// Callers parked on the condvar (no wake-up syscall when there are none).
    parked: usize,
    dead: Option<String>,
}

/// A shared-memory session seen from the client.
pub(crate) struct ShmLink {
    ch: Arc<Mutex<ShmChannel>>,
    /// Asks a reader waiting in `ch` to give it up to a sender.
    yielder: ShmYield,
    arena: Arc<Arena>,
    layout: Layout,
    alloc: Arc<RegionAllocator>,
    releases: Arc<ReleaseQueue>,
    shared: Mutex<Shared>,
    /// Messages ever filed under `shared.completed` (changed with `shared`
    /// locked). A reader that saw this count with `shared` locked and sees
    /// it unchanged once it holds the channel knows nobody filed its
    /// answer in between (senders file while holding the channel), without
    /// locking `shared` again.
    filed: AtomicU64,
    cv: Condvar,
    uri: String,
    /// How inputs not already in the arena are moved in (`?mover=`).
    mover: MoverChoice,
    /// Bytes and tensors per mover (`Zero`: sent where they lay).
    movers: MoverCounters,
    /// The agent pulls inputs named by address (its arena's features).
    pull: bool,
}

impl ShmLink {
    /// Bootstraps the session over the control socket at `path`, saying
    /// Hello as `opts` say (limits asked, token, anonymous; within its
    /// connect timeout).
    pub(crate) fn connect(
        path: &Path,
        uri: &str,
        opts: &crate::ClientOptions,
        request_id: u64,
        mover: MoverChoice,
    ) -> Result<(ShmLink, Limits), ClientError> {
        let timeout = opts.connect_timeout;
        let (ch, limits) = ShmChannel::connect_as(
            path,
            &opts.limits,
            opts.token.as_deref().map(str::as_bytes),
            opts.anonymous,
            request_id,
            timeout,
        )
        .map_err(|e| match e {
            ShmError::Io(source)
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                ClientError::Timeout(timeout)
            }
            ShmError::Io(source) => ClientError::Connect(transport::TransportError::Io {
                what: "connect to",
                endpoint: format!("{uri} ({})", path.display()),
                source,
            }),
            ShmError::Refused { status, message } => ClientError::from_remote(status, message),
            ShmError::PeerGone => {
                ClientError::AgentGone(format!("{uri} closed the session during the hello"))
            }
            ShmError::TimedOut => ClientError::Timeout(timeout),
            e => ClientError::Protocol(format!("{uri}: {e}")),
        })?;
        let arena = ch.arena().clone();
        let layout = *ch.layout();
        let pull = Layout::features(&arena) & transport::shm::layout::FEATURE_PULL != 0;
        let alloc = RegionAllocator::new(arena.clone(), layout.data_off, layout.client_len);
        let yielder = ch.yielder();
        let ch = Arc::new(Mutex::new(ch));
        let releases = Arc::new(ReleaseQueue {
            ids: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            ch: Arc::downgrade(&ch),
        });
        Ok((
            ShmLink {
                ch,
                yielder,
                arena,
                layout,
                alloc,
                releases,
                shared: Mutex::new(Shared {
                    completed: IdMap::default(),
                    abandoned: IdMap::default(),
                    pending: PendingIds::default(),
                    reading: false,
                    parked: 0,
                    dead: None,
                }),
                filed: AtomicU64::new(0),
                cv: Condvar::new(),
                uri: uri.to_string(),
                mover,
                movers: MoverCounters::default(),
                pull,
            },
            limits,
        ))
    }

    /// The arena's layout.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Bytes and tensors moved into the arena per mover.
    pub(crate) fn mover_stats(&self) -> transport::mover::MoverStats {
        self.movers.snapshot()
    }

    /// The client-region allocator.
    pub(crate) fn allocator(&self) -> &Arc<RegionAllocator> {
        &self.alloc
    }

    /// Places `inputs` in the client region: a tensor whose bytes already
    /// lie in a live allocation (64-byte aligned, not overlapping another
    /// input of this request) is described where it is and pinned; any
    /// other is copied into a fresh allocation.
    pub(crate) fn place_inputs(
        &self,
        inputs: &[TensorRef<'_>],
        may_pull: bool,
    ) -> Result<Placed, ClientError> {
        let mut placed = Placed {
            descs: Vec::with_capacity(inputs.len()),
            pins: Vec::with_capacity(inputs.len()),
            copied: 0,
            mover: Mover::Zero,
            pulls: Vec::new(),
        };
        let mut addrs: Vec<u64> = Vec::new();
        let mut largest = 0usize;
        let mut taken: Vec<(usize, usize)> = Vec::with_capacity(inputs.len());
        for t in inputs {
            let len = t.data.len();
            let in_place = self.alloc.find(t.data).filter(|&(_, off)| {
                off.is_multiple_of(ALIGN) && !taken.iter().any(|&r| conflicts(r, (off, off + len)))
            });
            let (off, pin, mover) = match in_place {
                Some((a, off)) => (off, a, Mover::Zero),
                None => {
                    if self.mover == MoverChoice::Fixed(Mover::Zero) {
                        return Err(ClientError::InvalidInput(format!(
                            "mover=zero: input {} ({len} bytes) is not in the arena; \
                             make it with Client::alloc_tensor",
                            placed.descs.len()
                        )));
                    }
                    let a = self.alloc.alloc(len).map_err(NoSpace::into_error)?;
                    let decision = self.mover.decide(len);
                    let pick = decision.mover;
                    if pick == Mover::Kernel && may_pull && self.pull && len > 0 {
                        // The agent pulls it into the slot: nothing to do here.
                        addrs.resize(placed.descs.len(), 0);
                        addrs.push(t.data.as_ptr() as u64);
                        (a.offset(), a, Mover::Kernel)
                    } else {
                        // SAFETY: a fresh allocation that only this function
                        // holds; the source cannot overlap it (it is either
                        // outside the arena or in another allocation).
                        let dst = unsafe { &mut a.bytes_mut()[..len] };
                        let m = copy_in(pick, dst, t.data);
                        placed.copied += len as u64;
                        (a.offset(), a, m)
                    }
                }
            };
            self.movers.add(mover, len as u64);
            if len >= largest {
                largest = len;
                placed.mover = mover;
            }
            taken.push((off, off + len));
            placed.descs.push(TensorDesc {
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                offset: off as u64,
                len: len as u64,
            });
            placed.pins.push(pin);
        }
        if !addrs.is_empty() {
            addrs.resize(placed.descs.len(), 0);
            placed.pulls = addrs;
        }
        Ok(placed)
    }

    /// Sends one message (a request is counted in flight first). A full
    /// ring is retried, taking responses off the other ring meanwhile (the
    /// agent may be waiting for room to answer), until `timeout`.
    pub(crate) fn send(
        &self,
        h: &Header,
        desc: &[u8],
        recv_limits: &Limits,
        timeout: Duration,
        max_in_flight: u32,
    ) -> Result<(), ClientError> {
        let is_request = h.kind == Kind::Request;
        {
            let mut sh = lock(&self.shared);
            if let Some(d) = &sh.dead {
                return Err(ClientError::AgentGone(d.clone()));
            }
            if is_request {
                if sh.pending.len() >= max_in_flight as usize {
                    return Err(ClientError::TooManyInFlight(max_in_flight));
                }
                sh.pending.push(h.request_id);
            }
        }
        let r = self.send_locked(h, desc, recv_limits, timeout);
        if r.is_err() && is_request {
            lock(&self.shared).pending.remove(h.request_id);
        }
        r
    }

    /// The channel for a sender: if a reader holds it (it may sleep there
    /// until its answer comes), asks it to give the channel up.
    fn channel_for_sending(&self) -> MutexGuard<'_, ShmChannel> {
        match self.ch.try_lock() {
            Ok(ch) => ch,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let _want = self.yielder.want();
                lock(&self.ch)
            }
        }
    }

    fn send_locked(
        &self,
        h: &Header,
        desc: &[u8],
        recv_limits: &Limits,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        // The clock is read only if the ring stays full for a while.
        let mut deadline: Option<Instant> = None;
        let mut ch = self.channel_for_sending();
        self.releases.flush(&mut ch);
        let mut tries = 0u32;
        loop {
            match ch.send(h, desc) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.fail(e)),
            }
            match ch.try_recv(recv_limits) {
                Ok(Some(m)) => {
                    let mut sh = lock(&self.shared);
                    self.absorb(&mut sh, m);
                    self.wake(&sh);
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
            tries = tries.wrapping_add(1);
            if tries.is_multiple_of(256) {
                let now = Instant::now();
                if now >= *deadline.get_or_insert(now + timeout) {
                    return Err(ClientError::Timeout(timeout));
                }
                if !ch.peer_alive() {
                    return Err(self.fail(ShmError::PeerGone));
                }
            }
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Wakes callers parked for a message or the reader role, if any.
    fn wake(&self, sh: &Shared) {
        if sh.parked > 0 {
            self.cv.notify_all();
        }
    }

    /// Marks the session dead (for anything but a timeout) and returns the
    /// error for the caller.
    fn fail(&self, e: ShmError) -> ClientError {
        if matches!(e, ShmError::TimedOut) {
            return ClientError::Protocol("unexpected shm timeout".into());
        }
        let mut sh = lock(&self.shared);
        self.mark_dead(&mut sh, e);
        self.wake(&sh);
        ClientError::AgentGone(sh.dead.clone().unwrap_or_default())
    }

    fn mark_dead(&self, sh: &mut Shared, e: ShmError) {
        let msg = match e {
            ShmError::PeerGone => format!("{} is gone (its end of the session closed)", self.uri),
            e => format!("shared-memory session with {} broken: {e}", self.uri),
        };
        sh.dead.get_or_insert(msg);
    }

    /// Files a received message under its request id, or drops it (and
    /// releases its agent-region outputs) if its caller gave up.
    fn absorb(&self, sh: &mut Shared, (h, desc): (Header, Vec<u8>)) {
        if h.kind == Kind::Error && h.request_id == 0 {
            let msg = wire::decode_error_body(&desc).unwrap_or_default();
            sh.dead
                .get_or_insert(format!("agent closed the session ({}): {msg}", h.status));
            return;
        }
        let id = h.request_id;
        sh.pending.remove(id);
        if let Some(pins) = sh.abandoned.remove(&id) {
            drop(pins);
            if self.needs_release(&h, &desc) {
                self.releases.push(id);
            }
        } else {
            sh.completed.insert(id, (h, desc));
            self.filed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the agent placed outputs of this message in its region (a
    /// response it cannot decode is released too, to be safe).
    fn needs_release(&self, h: &Header, desc: &[u8]) -> bool {
        h.kind == Kind::Response
            && decode_tensor_section_in(h, desc, self.region()).map_or(true, |s| {
                s.tensors
                    .iter()
                    .any(|t| t.offset >= self.layout.client_len as u64)
            })
    }

    fn region(&self) -> Placement {
        Placement::Region {
            len: self.layout.data_len as u64,
        }
    }

    /// Waits for the message answering `id`, as `plan` says (a request's,
    /// with the session's estimates it came from and updates; `None` for
    /// control messages: poll at once).
    pub(crate) fn wait_for(
        &self,
        id: u64,
        timeout: Duration,
        spin: Duration,
        recv_limits: &Limits,
        plan: Option<(&WaitPlan, &ServiceTimes)>,
    ) -> Result<(Header, Vec<u8>), ClientError> {
        let (plan, times) = plan.unzip();
        // What an answer within the poll would teach the estimates,
        // whether or not this wait polls.
        let budget = spin;
        // A timed kind whose polls keep missing sleeps at once.
        let spin = if plan.is_none_or(WaitPlan::polls) {
            spin
        } else {
            Duration::ZERO
        };
        // A response that comes while this caller spins (the common case)
        // costs no `clock_gettime`: the deadline is fixed only when the
        // first chunk of waiting ends without it.
        let mut deadline: Option<Instant> = None;
        let mut spun = false;
        // Timed mode: sleep until shortly before the estimated completion.
        let mut sleep_until = plan.and_then(WaitPlan::sleep_until);
        // Fast mode: the first pass only polls, so that a poll that misses
        // is seen (and the model's next waits timed); the first chunk of
        // sleep then comes on its own pass (hence half: it doubles first).
        let learn = plan
            .filter(|p| p.expect == Expect::Fast && !spin.is_zero())
            .map(|p| p.key);
        // A timed wait's poll (after its sleep, or at once) is a pass of
        // its own too, to see if it caught the answer.
        let judge = plan
            .filter(|p| matches!(p.expect, Expect::Timed { .. }) && !spin.is_zero())
            .map(|p| p.key);
        let mut chunk = if learn.is_some() || judge.is_some() {
            FIRST_CHUNK / 2
        } else {
            FIRST_CHUNK
        };
        let done = |m| {
            if let Some((p, t)) = plan.zip(times) {
                p.answered(t, budget);
            }
            Ok(m)
        };
        let mut sh = lock(&self.shared);
        loop {
            // (Almost always empty: skip hashing the id.)
            if let Some(f) = (!sh.completed.is_empty())
                .then(|| sh.completed.remove(&id))
                .flatten()
            {
                return done(f);
            }
            if let Some(d) = &sh.dead {
                return Err(ClientError::AgentGone(d.clone()));
            }
            // How long the next chunk of waiting may take; `None` on the
            // first pass, which reads no clock.
            let mut limit = None;
            // Whether this pass sleeps until `sleep_until` (then polls).
            let mut napping = false;
            if let Some(until) = sleep_until.filter(|_| !sh.reading) {
                let now = Instant::now();
                let d = *deadline.get_or_insert(now + timeout);
                if now < until && now < d {
                    napping = true;
                    limit = Some((until - now).min(d - now));
                } else {
                    sleep_until = None;
                }
            }
            if !napping && (spun || sh.reading) {
                let now = Instant::now();
                let d = *deadline.get_or_insert(now + timeout);
                if now >= d {
                    // Its answer may still come: drop it then.
                    sh.abandoned.entry(id).or_default();
                    return Err(ClientError::Timeout(timeout));
                }
                if sh.reading {
                    sh.parked += 1;
                    sh = self
                        .cv
                        .wait_timeout(sh, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    sh.parked -= 1;
                    continue;
                }
                chunk = (chunk * 2).min(SLEEP_CHUNK);
                limit = Some((d - now).min(chunk));
            }
            sh.reading = true;
            let filed = self.filed.load(Ordering::Relaxed);
            drop(sh);
            // Spin only on the first chunk after any nap; later chunks go
            // straight to sleep.
            let policy = match (napping, spun, limit) {
                (true, _, Some(nap)) => WaitPolicy {
                    spin: Duration::ZERO,
                    slice: nap,
                    ..WaitPolicy::CLIENT
                },
                (_, true, _) => WaitPolicy {
                    spin: Duration::ZERO,
                    slice: chunk,
                    ..WaitPolicy::CLIENT
                },
                _ => WaitPolicy {
                    spin,
                    ..WaitPolicy::CLIENT
                },
            };
            let first_poll = !napping && !spun;
            let limit = limit.unwrap_or_else(|| match learn.or(judge) {
                Some(_) => timeout.min(spin),
                None => timeout.min(policy.spin + chunk),
            });
            spun |= !napping;
            let r = {
                let mut ch = lock(&self.ch);
                self.releases.flush(&mut ch);
                // A sender may have taken it off the ring while we waited
                // for the channel (and filed something since `filed`).
                if self.filed.load(Ordering::Relaxed) != filed
                    && lock(&self.shared).completed.contains_key(&id)
                {
                    None
                } else {
                    Some(ch.recv(recv_limits, policy, Some(limit)))
                }
            };
            sh = lock(&self.shared);
            sh.reading = false;
            // A poll that ran out (not one a sender cut short, nor one that
            // found the answer filed by a sender) missed.
            let missed = first_poll
                && matches!(r, Some(Err(ShmError::TimedOut)))
                && !self.yielder.is_wanted();
            match r {
                None | Some(Err(ShmError::TimedOut)) => {
                    if let Some(t) = times.filter(|_| missed) {
                        learn.inspect(|&key| t.missed(key));
                        judge.inspect(|&key| t.polled(key, false));
                    }
                    if self.yielder.is_wanted() {
                        // A sender asked for the channel: let it run
                        // before this reader takes the channel again.
                        drop(sh);
                        std::thread::yield_now();
                        sh = lock(&self.shared);
                    }
                }
                Some(Ok(m)) if m.0.request_id == id && id != 0 => {
                    // Ours (the common case): straight back to the caller.
                    sh.pending.remove(id);
                    self.wake(&sh);
                    drop(sh);
                    if let Some((key, t)) = judge.filter(|_| first_poll).zip(times) {
                        t.polled(key, true);
                    }
                    return done(m);
                }
                Some(Ok(m)) => self.absorb(&mut sh, m),
                Some(Err(e)) => self.mark_dead(&mut sh, e),
            }
            self.wake(&sh);
            if deadline.is_none() {
                // The first chunk began about `limit` ago at most.
                deadline = Some(Instant::now() + timeout.saturating_sub(limit));
            }
        }
    }

    /// The response to `id` if it has been filed, or the session's end:
    /// `None` while it may still come. Never waits ([`crate::completion`]).
    pub(crate) fn take_done(&self, id: u64) -> Option<Result<(Header, Vec<u8>), ClientError>> {
        let mut sh = lock(&self.shared);
        if let Some(m) = sh.completed.remove(&id) {
            return Some(Ok(m));
        }
        sh.dead.clone().map(|d| Err(ClientError::AgentGone(d)))
    }

    /// Receives and files at most one message, waiting at most `limit`
    /// (polling for `spin` of it); when another caller holds the reader
    /// role, waits for it to file something instead. What comes is filed
    /// for whoever waits for it ([`crate::completion`] drives this).
    /// `true` when it polled all of `limit` (`spin` at least as long) and
    /// nothing came: a poll that missed.
    pub(crate) fn pump(&self, limit: Duration, spin: Duration, recv_limits: &Limits) -> bool {
        // At most one chunk, as `wait_for`'s (a sender that wants the
        // channel meanwhile ends the wait early).
        let limit = limit.min(SLEEP_CHUNK);
        let mut sh = lock(&self.shared);
        if sh.dead.is_some() {
            return false;
        }
        if sh.reading {
            sh.parked += 1;
            sh = self
                .cv
                .wait_timeout(sh, limit)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            sh.parked -= 1;
            return false;
        }
        sh.reading = true;
        drop(sh);
        let policy = WaitPolicy {
            spin: spin.min(limit),
            ..WaitPolicy::CLIENT
        };
        let r = {
            let mut ch = lock(&self.ch);
            self.releases.flush(&mut ch);
            ch.recv(recv_limits, policy, Some(limit))
        };
        let mut sh = lock(&self.shared);
        sh.reading = false;
        // Not a miss when a sender cut the poll short.
        let missed = matches!(r, Err(ShmError::TimedOut))
            && spin >= limit
            && !spin.is_zero()
            && !self.yielder.is_wanted();
        match r {
            Err(ShmError::TimedOut) => {}
            Ok(m) => self.absorb(&mut sh, m),
            Err(e) => self.mark_dead(&mut sh, e),
        }
        self.wake(&sh);
        missed
    }

    /// A ticket was dropped unwaited: its response is dropped when it comes
    /// (or now, if it is here), and `pins` are kept until then.
    pub(crate) fn abandon(&self, id: u64, pins: Vec<Arc<Allocation>>) {
        let mut sh = lock(&self.shared);
        if let Some((h, desc)) = sh.completed.remove(&id) {
            drop(sh);
            if self.needs_release(&h, &desc) {
                self.releases.push(id);
            }
        } else if sh.pending.contains(id) {
            sh.abandoned.entry(id).or_default().extend(pins);
        }
    }

    /// A wait for `id` failed: if its response may still come, `pins` stay
    /// with it (the agent may still read them).
    pub(crate) fn keep_pins(&self, id: u64, pins: Vec<Arc<Allocation>>) {
        let mut sh = lock(&self.shared);
        if let Some(p) = sh.abandoned.get_mut(&id) {
            p.extend(pins);
        }
    }

    /// The outputs of response `h`/`desc` to request `id`, as views into the
    /// arena: an output in the client region must lie in one of the
    /// request's own input allocations (`pins`; the identity model's outputs
    /// alias its inputs) and holds it; outputs in the agent region share
    /// one [`ResponseRegion`], whose drop queues the `Release`.
    pub(crate) fn outputs(
        &self,
        id: u64,
        h: &Header,
        desc: &[u8],
        pins: &[Arc<Allocation>],
    ) -> Result<(Vec<Tensor>, Option<Timeline>), ClientError> {
        let section = match decode_tensor_section_in(h, desc, self.region()) {
            Ok(s) => s,
            Err(e) => {
                self.releases.push(id);
                return Err(ClientError::Protocol(format!(
                    "bad response descriptors: {e}"
                )));
            }
        };
        let client_len = self.layout.client_len;
        // Made before anything can fail, so the release is never lost.
        let region: Option<Arc<dyn TensorBytes>> = section
            .tensors
            .iter()
            .any(|t| t.offset as usize >= client_len)
            .then(|| {
                Arc::new(ResponseRegion {
                    arena: self.arena.clone(),
                    data: self.layout.data_off..self.layout.data_off + self.layout.data_len,
                    id,
                    releases: self.releases.clone(),
                }) as Arc<dyn TensorBytes>
            });
        let mut outputs = Vec::with_capacity(section.tensors.len());
        for (i, t) in section.tensors.into_iter().enumerate() {
            // Inside the data area: checked by the decoder.
            let (s, e) = (t.offset as usize, (t.offset + t.len) as usize);
            let tensor = if s >= client_len {
                let r = region
                    .clone()
                    .expect("made when an output is in the agent region");
                Tensor::new(t.dtype, t.shape, r, s..e)
            } else if e <= client_len {
                let a = pins
                    .iter()
                    .find(|a| a.offset() <= s && e <= a.offset() + a.len())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!(
                            "output {i} at {s}..{e} lies in the client region outside the \
                             request's inputs"
                        ))
                    })?;
                let base = a.offset();
                Tensor::new(t.dtype, t.shape, a.clone(), s - base..e - base)
            } else {
                return Err(ClientError::Protocol(format!(
                    "output {i} at {s}..{e} straddles the client and agent regions"
                )));
            };
            outputs.push(tensor);
        }
        Ok((outputs, section.timeline))
    }
}

/// Whether two tensor ranges may not both be described in one message
/// (they intersect, or an empty one sits strictly inside the other).
fn conflicts((a0, a1): (usize, usize), (b0, b1): (usize, usize)) -> bool {
    a0.max(b0) < a1.min(b1) || (a0 < b0 && b0 < a1) || (b0 < a0 && a0 < b1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(len: usize) -> Arc<RegionAllocator> {
        let arena = Arc::new(Arena::create("tw-client-alloc", 4096 + len).unwrap());
        RegionAllocator::new(arena, 4096, len)
    }

    #[test]
    fn fill_to_the_last_byte_then_no_space() {
        let r = region(64 * 16);
        let all: Vec<_> = (0..16).map(|_| r.alloc(64).unwrap()).collect();
        let offs: Vec<usize> = all.iter().map(|a| a.offset()).collect();
        assert_eq!(offs, (0..16).map(|i| i * 64).collect::<Vec<_>>());
        assert_eq!(r.usage(), (0, 0));
        let e = r.alloc(1).unwrap_err();
        assert_eq!(
            e,
            NoSpace {
                need: 64,
                free: 0,
                largest: 0,
                region: 1024
            }
        );
        assert!(e.into_error().to_string().contains("shm arena full"));
        drop(all);
        assert_eq!(r.usage(), (1024, 1024));
        assert_eq!(r.free_blocks(), 1, "everything coalesced back");
        // Too large, and overflowing sizes, are errors too.
        assert!(r.alloc(1025).is_err());
        assert_eq!(r.alloc(usize::MAX).unwrap_err().need, usize::MAX);
    }

    #[test]
    fn sizes_round_up_to_64_and_empty_tensors_get_their_own_offset() {
        let r = region(4096);
        let a = r.alloc(0).unwrap();
        let b = r.alloc(0).unwrap();
        let c = r.alloc(65).unwrap();
        assert_eq!((a.offset(), a.len()), (0, 64));
        assert_eq!((b.offset(), b.len()), (64, 64));
        assert_eq!((c.offset(), c.len()), (128, 128));
        let d = r.alloc(1).unwrap();
        assert_eq!(d.offset(), 256);
        assert_eq!(r.usage().0, 4096 - 320);
    }

    #[test]
    fn fragments_first_fit_and_coalesces_both_sides() {
        let r = region(64 * 8);
        let v: Vec<_> = (0..8).map(|_| Some(r.alloc(64).unwrap())).collect();
        let mut v = v;
        // Free every other block: 4 holes of 64, no 128 anywhere.
        for i in [1, 3, 5, 7] {
            v[i] = None;
        }
        assert_eq!(r.free_blocks(), 4);
        assert_eq!(r.usage(), (256, 64));
        assert!(r.alloc(128).is_err(), "fragmented: no 128-byte hole");
        // First fit: the lowest hole.
        let x = r.alloc(64).unwrap();
        assert_eq!(x.offset(), 64);
        drop(x);
        // Freeing block 2 joins holes 1 and 3 (both sides) into 192 bytes.
        v[2] = None;
        assert_eq!(r.free_blocks(), 3);
        assert_eq!(r.usage(), (320, 192));
        let y = r.alloc(192).unwrap();
        assert_eq!(y.offset(), 64);
        drop(y);
        drop(v);
        assert_eq!(r.free_blocks(), 1);
        assert_eq!(r.usage(), (512, 512));
    }

    #[test]
    fn refcounts_pin_until_the_last_holder_drops() {
        let r = region(128);
        let a = r.alloc(100).unwrap();
        let pin = a.clone();
        drop(a);
        assert!(r.alloc(1).is_err(), "still pinned");
        let (found, off) = r.find(&pin.bytes()[10..20]).unwrap();
        assert_eq!(off, 10);
        assert!(Arc::ptr_eq(&found, &pin));
        drop((found, pin));
        assert_eq!(r.alloc(128).unwrap().offset(), 0, "freed");
    }

    #[test]
    fn find_only_matches_live_allocations_in_the_region() {
        let r = region(4096);
        let a = r.alloc(256).unwrap();
        let b = r.alloc(256).unwrap();
        assert_eq!(r.find(&a.bytes()[..0]).unwrap().1, 0);
        assert_eq!(r.find(&b.bytes()[64..128]).unwrap().1, 320);
        // Spanning two allocations, outside the region, or freed: no match.
        let whole = r.arena.bytes(4096..4096 + 512);
        assert!(r.find(&whole[200..300]).is_none());
        assert!(r.find(&[1u8, 2, 3]).is_none());
        assert!(r.find(r.arena.bytes(0..64)).is_none());
        let tail = r.arena.bytes(4096 + 1024..4096 + 1088);
        assert!(r.find(tail).is_none(), "free space");
        drop(b);
        assert!(r.find(&whole[300..310]).is_none());
    }

    #[test]
    fn writes_land_in_the_arena() {
        let r = region(4096);
        let a = r.alloc(8).unwrap();
        // SAFETY: the only reference to a fresh allocation.
        unsafe { a.bytes_mut()[..8].copy_from_slice(b"tensors!") };
        assert_eq!(&r.arena.bytes(4096..4104), b"tensors!");
    }

    #[test]
    fn concurrent_alloc_free_keeps_the_books() {
        let r = region(1 << 20);
        std::thread::scope(|s| {
            for t in 0..4 {
                let r = r.clone();
                s.spawn(move || {
                    for i in 0..2000usize {
                        let a = r.alloc((i * 37 + t) % 5000).unwrap();
                        assert!(a.offset().is_multiple_of(64));
                    }
                });
            }
        });
        assert_eq!(r.usage(), (1 << 20, 1 << 20));
        assert_eq!(r.free_blocks(), 1);
    }

    #[test]
    fn conflicting_ranges() {
        assert!(conflicts((0, 100), (64, 128)));
        assert!(conflicts((0, 128), (64, 64)), "empty inside");
        assert!(conflicts((64, 64), (0, 128)));
        assert!(!conflicts((0, 0), (0, 128)), "empty at the start");
        assert!(!conflicts((0, 64), (64, 128)));
        assert!(!conflicts((64, 64), (64, 64)));
    }
}
