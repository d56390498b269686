//! [`TensorRing`]: the agent's tensor queue memory (SplitRPC-style), a byte
//! ring whose memfd is mapped twice back to back.
//!
//! This module owns the ring's memory (the memfd, the 2×capacity address
//! range it is mapped into, unmapped when the last handle goes) and the
//! bookkeeping of which bytes are handed out. The dynamic batcher copies each
//! waiting request's input tensor into a [`RingSpan`] in arrival order; when
//! the spans of a batch lie back to back, [`TensorRing::joined`] hands the
//! engine the whole batch as one slice without a further copy.
//!
//! ```text
//! base              base + capacity          base + 2 × capacity
//! | memfd bytes 0.. |  memfd bytes 0.. again |
//!            [ span that wraps ... ]
//! ```
//!
//! Because the second mapping shows the same pages as the first, a range that
//! runs past the end of the ring (start + len > capacity) is still one
//! contiguous slice starting at `base + start`: nothing ever has to be split
//! at the wrap point.
//!
//! Spans are handed out in FIFO order from the head, but may be released in
//! any order (requests of a batch finish together, a cancelled one goes
//! early); the tail only moves over the released prefix, so the ring stays a
//! single contiguous run of not-free bytes.

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The largest capacity [`TensorRing::new`] accepts (1 TiB): beyond that a
/// request is surely a mistake, and 2× it must still fit the address space.
const MAX_CAPACITY: usize = 1 << 40;

/// The largest alignment [`TensorRing::alloc`] accepts: a page on every
/// platform we run on, so every alignment divides the capacity (a multiple of
/// the page size) and an aligned start rounds up to at most the capacity.
const MAX_ALIGN: usize = 4096;

/// A byte ring mapped twice back to back (memfd), handing out spans in FIFO order.
///
/// Cloning is cheap (an `Arc` inside); every clone and every span keeps the
/// mapping alive.
///
/// # Examples
///
/// Three requests' rows staged back to back, then handed to an engine as
/// one batch, without a copy, even though the batch wraps past the end:
///
/// ```
/// use transport::shm::TensorRing;
/// let ring = TensorRing::new("doc-queue", 4096)?;
/// let cap = ring.capacity();
/// // Earlier requests moved the head near the end, so this batch wraps.
/// let earlier = ring.alloc(cap - 100, 1).ok_or("room")?;
/// let mut row = |fill: u8| -> Result<_, &str> {
///     let mut span = ring.alloc(64, 1).ok_or("room")?;
///     span.bytes_mut().fill(fill);
///     Ok(span)
/// };
/// let first = row(1)?;
/// drop(earlier); // answered: its bytes are free for the next rows
/// let rows = [first, row(2)?, row(3)?];
/// assert!(rows[1].offset() + rows[1].len() > cap); // this one wraps
/// let batch = ring.joined(&rows.iter().collect::<Vec<_>>()).ok_or("back to back")?;
/// assert_eq!(batch.len(), 192);
/// assert!(batch[..64].iter().all(|&b| b == 1) && batch[128..].iter().all(|&b| b == 3));
/// assert_eq!(ring.used(), 192);
/// drop(rows); // the batch ran: the bytes are free again
/// assert_eq!(ring.used(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct TensorRing {
    inner: Arc<Inner>,
}

/// `len` bytes of a ring owned exclusively until dropped; dropping releases them. Not Clone.
///
/// # Examples
///
/// ```
/// use transport::shm::TensorRing;
/// let ring = TensorRing::new("doc-span", 4096)?;
/// let mut span = ring.alloc(10, 8).ok_or("room")?;
/// span.bytes_mut().copy_from_slice(b"0123456789");
/// assert_eq!((span.len(), span.offset(), span.bytes()), (10, 0, &b"0123456789"[..]));
/// let next = ring.alloc(4, 8).ok_or("room")?;
/// assert_eq!(next.offset(), 16); // rounded up to the alignment
/// assert!(ring.alloc(0, 1).ok_or("room")?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RingSpan {
    /// Keeps the mapping alive while the span's bytes are reachable, and
    /// names the ring for [`TensorRing::joined`].
    ring: Arc<Inner>,
    /// Offset of the first byte, in `0..capacity`.
    start: usize,
    len: usize,
    /// The span's entry in the ring's queue (see [`State`]).
    seq: u64,
}

/// What the ring's handles and spans share.
struct Inner {
    map: Mapping,
    capacity: usize,
    state: Mutex<State>,
}

/// The 2×capacity address range: the memfd mapped over both halves.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

/// Allocation bookkeeping.
///
/// The not-free bytes are one run from `tail` to `head` (modulo capacity),
/// `used` long: the entries of `entries` in allocation order, each the
/// alignment padding before a span plus the span itself. A released entry
/// stays in place until every entry before it is released too, so the run
/// never gets holes the next allocation would have to skip.
struct State {
    /// Where the next allocation starts (before alignment), `0..capacity`.
    head: usize,
    /// Start of the oldest entry, `0..capacity`.
    tail: usize,
    /// Bytes from `tail` to `head`; tells a full ring from an empty one
    /// (both have `head == tail`).
    used: usize,
    /// The sequence number of `entries[0]`; entry `i` has `first_seq + i`.
    first_seq: u64,
    entries: VecDeque<Entry>,
}

struct Entry {
    /// Padding plus span length: what the tail moves over when it goes.
    size: usize,
    released: bool,
}

impl TensorRing {
    /// A ring of at least `min_capacity` bytes (rounded up to a multiple of the page size; error if 0 or absurdly large, > 1<<40). `name` shows in /proc (memfd name).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::TensorRing;
    /// let ring = TensorRing::new("model-input-0", 5000)?;
    /// assert_eq!(ring.capacity() % 4096, 0);
    /// assert!(ring.capacity() >= 5000);
    /// assert!(TensorRing::new("empty", 0).is_err());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(name: &str, min_capacity: usize) -> io::Result<TensorRing> {
        if min_capacity == 0 || min_capacity > MAX_CAPACITY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a tensor ring needs 1..={MAX_CAPACITY} bytes, not {min_capacity}"),
            ));
        }
        // The second mapping must start on a page boundary, so the capacity
        // is whole pages. No overflow: min_capacity ≤ 2^40.
        let page = rustix::param::page_size();
        let capacity = min_capacity.div_ceil(page) * page;

        // Not sealed, unlike `Arena`: the fd never leaves this process, and
        // it is closed as soon as it is mapped (the mappings keep the pages).
        let fd = memfd_create(name, MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, capacity as u64)?;

        // Reserve the whole 2×capacity range first, so the two halves are
        // adjacent and no other mapping can land between them. PROT_NONE and
        // NORESERVE: it costs address space only, and is replaced at once.
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks touches no existing memory.
        let reserved = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                2 * capacity,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let base = NonNull::new(reserved.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        // From here on `map` unmaps the range if anything fails.
        let map = Mapping {
            base,
            len: 2 * capacity,
        };
        for half in 0..2 {
            // SAFETY: the target lies inside the range reserved above, which
            // this function owns and nothing references yet, so MAP_FIXED
            // replaces only our own PROT_NONE pages; `half * capacity` is a
            // multiple of the page size, as is the base.
            unsafe {
                mmap(
                    map.base.as_ptr().add(half * capacity).cast::<c_void>(),
                    capacity,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    &fd,
                    0,
                )?;
            }
        }
        drop(fd);

        Ok(TensorRing {
            inner: Arc::new(Inner {
                map,
                capacity,
                state: Mutex::new(State {
                    head: 0,
                    tail: 0,
                    used: 0,
                    first_seq: 0,
                    entries: VecDeque::new(),
                }),
            }),
        })
    }

    /// The ring's size in bytes (a multiple of the page size). Example:
    /// [`TensorRing`].
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Bytes held by live spans plus the padding/gaps between them (what is not free).
    ///
    /// This includes released spans that still wait behind an older live one.
    ///
    /// # Examples
    ///
    /// ```
    /// let ring = transport::shm::TensorRing::new("doc-used", 4096)?;
    /// let (a, b) = (ring.alloc(100, 1).ok_or("room")?, ring.alloc(100, 1).ok_or("room")?);
    /// drop(b); // released, but behind a live span
    /// assert_eq!(ring.used(), 200);
    /// drop(a);
    /// assert_eq!(ring.used(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn used(&self) -> usize {
        self.inner.lock().used
    }

    /// Takes `len` bytes at the ring's head, the start rounded up to `align` (a power of two, 1..=4096; else None), or None when that much is not free now (never blocks). len == 0 gives an empty span (it may still be "joined"). len > capacity → None.
    ///
    /// # Examples
    ///
    /// ```
    /// let ring = transport::shm::TensorRing::new("doc-alloc", 4096)?;
    /// let all = ring.alloc(ring.capacity(), 64).ok_or("room")?;
    /// assert!(ring.alloc(1, 1).is_none()); // full: never waits
    /// drop(all);
    /// assert!(ring.alloc(1, 3).is_none()); // not a power of two
    /// assert!(ring.alloc(ring.capacity() + 1, 1).is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn alloc(&self, len: usize, align: usize) -> Option<RingSpan> {
        let capacity = self.inner.capacity;
        if !align.is_power_of_two() || align > MAX_ALIGN || len > capacity {
            return None;
        }
        let mut state = self.inner.lock();
        // `align` divides the capacity (both powers of two, align ≤ a page),
        // so the rounded start is at most `capacity`, which is offset 0.
        let aligned = state.head.next_multiple_of(align);
        let pad = aligned - state.head;
        let size = pad.checked_add(len)?;
        if size > capacity - state.used {
            return None;
        }
        let start = aligned % capacity;
        // The span may run past the end of the first mapping: the second
        // one is behind it.
        state.head = (start + len) % capacity;
        state.used += size;
        let seq = state.first_seq + state.entries.len() as u64;
        state.entries.push_back(Entry {
            size,
            released: false,
        });
        drop(state);
        Some(RingSpan {
            ring: Arc::clone(&self.inner),
            start,
            len,
            seq,
        })
    }

    /// If `spans` (all from this ring, non-empty list) lie back to back in this order — each starts exactly where the previous one ends, modulo the capacity — the bytes from the first span's start through the last's end as one slice (through the second mapping when it wraps). None otherwise (gaps, other order, other ring).
    ///
    /// # Examples
    ///
    /// Example of a batch: [`TensorRing`]. Spans with a gap between them
    /// are not one slice:
    ///
    /// ```
    /// let ring = transport::shm::TensorRing::new("doc-joined", 4096)?;
    /// let a = ring.alloc(10, 1).ok_or("room")?;
    /// let b = ring.alloc(10, 64).ok_or("room")?; // starts at 64, not 10
    /// assert!(ring.joined(&[&a, &b]).is_none());
    /// assert_eq!(ring.joined(&[&a]).map(<[u8]>::len), Some(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn joined<'a>(&'a self, spans: &[&'a RingSpan]) -> Option<&'a [u8]> {
        let capacity = self.inner.capacity;
        let first = spans.first()?;
        let mut total = 0usize;
        let mut next = first.start;
        for span in spans {
            if !Arc::ptr_eq(&span.ring, &self.inner) || span.start != next {
                return None;
            }
            total += span.len;
            next = (span.start + span.len) % capacity;
        }
        // Live spans are disjoint, so back-to-back distinct spans add up to at
        // most the capacity; more means a span was listed twice and went
        // round the ring (e.g. a full-ring span after itself), which would
        // read its bytes twice. Refuse it.
        if total > capacity {
            return None;
        }
        // SAFETY: `first.start < capacity` and `total ≤ capacity`, so the
        // range lies inside the 2×capacity mapping, which `self` keeps alive
        // for 'a. It covers exactly the bytes of `spans` (adjacent, no gaps,
        // no byte twice), each borrowed shared for 'a, so no `&mut` to them
        // (`bytes_mut` needs the span mutably) exists while the slice does;
        // the memfd pages are initialised (zero-filled when created).
        Some(unsafe {
            std::slice::from_raw_parts(self.inner.map.base.as_ptr().add(first.start), total)
        })
    }
}

impl fmt::Debug for TensorRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRing")
            .field("capacity", &self.capacity())
            .field("used", &self.used())
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The bookkeeping never panics half-way through an update, so a
        // poisoned lock (a panic elsewhere while holding it) still guards a
        // consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the entry `seq` released and moves the tail over the released
    /// prefix.
    fn release(&self, seq: u64) {
        let capacity = self.capacity;
        let mut state = self.lock();
        let index = (seq - state.first_seq) as usize;
        if let Some(entry) = state.entries.get_mut(index) {
            entry.released = true;
        } else {
            debug_assert!(false, "released span {seq} is not in the ring");
            return;
        }
        while let Some(entry) = state.entries.front() {
            if !entry.released {
                break;
            }
            let size = entry.size;
            state.entries.pop_front();
            state.first_seq += 1;
            state.tail = (state.tail + size) % capacity;
            state.used -= size;
        }
        if state.entries.is_empty() {
            // An idle ring starts over at offset 0, aligned for anything,
            // with the whole capacity ahead of it before the wrap.
            state.head = 0;
            state.tail = 0;
        }
    }
}

impl RingSpan {
    /// The span's length in bytes. Example: [`RingSpan`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span holds no bytes. Example: [`RingSpan`].
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of its first byte in the ring, 0..capacity. Example:
    /// [`RingSpan`].
    pub fn offset(&self) -> usize {
        self.start
    }

    /// The span's bytes (through the second mapping where it wraps).
    /// Examples: [`RingSpan`], [`TensorRing`].
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: start < capacity and len ≤ capacity, so the range lies in
        // the 2×capacity mapping, kept alive by `self.ring`. No other span
        // covers these physical bytes while this one lives, and a `&mut` to
        // them only comes from `bytes_mut(&mut self)`, which this shared
        // borrow excludes. The pages are initialised.
        unsafe { std::slice::from_raw_parts(self.ring.map.base.as_ptr().add(self.start), self.len) }
    }

    /// The span's bytes, writable (through the second mapping where it wraps).
    /// Examples: [`RingSpan`], [`TensorRing`].
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: in bounds and alive as for `bytes`. Exclusive: the ring
        // hands each byte to one live span only, the span is borrowed
        // mutably here (so neither `bytes` nor `joined` can reach it), and a
        // span never covers the same physical byte twice (len ≤ capacity).
        unsafe {
            std::slice::from_raw_parts_mut(self.ring.map.base.as_ptr().add(self.start), self.len)
        }
    }
}

impl Drop for RingSpan {
    fn drop(&mut self) {
        self.ring.release(self.seq);
    }
}

impl fmt::Debug for RingSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingSpan")
            .field("offset", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is the range reserved in
        // `TensorRing::new`, owned by this value alone; it is dropped with the
        // last `Inner`, i.e. after the last handle and span, so no slice into
        // it is left.
        let result = unsafe { munmap(self.base.as_ptr().cast::<c_void>(), self.len) };
        debug_assert!(result.is_ok(), "munmap of a tensor ring failed: {result:?}");
    }
}

// SAFETY: `Mapping` is a raw pointer to memory this process owns until the
// mapping is dropped; it is not tied to a thread.
unsafe impl Send for Mapping {}
// SAFETY: `Mapping` itself never dereferences the pointer; every access
// goes through `TensorRing`/`RingSpan`, whose rules keep it race-free: a
// span's bytes are only reachable through that span (the ring hands each
// byte to one live span), `bytes_mut` needs `&mut RingSpan`, and `joined`
// borrows the spans shared. So a span written by one thread and then sent
// or lent to another is read with the ordinary happens-before of the send
// (or of the lock the release takes).
unsafe impl Sync for Mapping {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> TensorRing {
        TensorRing::new("tw-test-mirror", 1).unwrap()
    }

    /// The byte at `offset` of the 2×capacity range, read raw.
    fn raw(ring: &TensorRing, offset: usize) -> u8 {
        assert!(offset < 2 * ring.capacity());
        // SAFETY: in bounds (asserted); a plain read of initialised mapped
        // memory, while no `&mut` from a span is alive in these tests.
        unsafe { ring.inner.map.base.as_ptr().add(offset).read() }
    }

    fn fill(span: &mut RingSpan, seed: u8) {
        for (i, b) in span.bytes_mut().iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8);
        }
    }

    #[test]
    fn capacity_is_whole_pages() {
        let page = rustix::param::page_size();
        assert_eq!(TensorRing::new("t", 1).unwrap().capacity(), page);
        assert_eq!(TensorRing::new("t", page).unwrap().capacity(), page);
        assert_eq!(TensorRing::new("t", page + 1).unwrap().capacity(), 2 * page);
    }

    #[test]
    fn a_wrapped_span_is_seen_through_both_mappings() {
        let r = ring();
        let c = r.capacity();
        let a = r.alloc(c / 2, 1).unwrap();
        let b = r.alloc(c / 2 - 8, 1).unwrap();
        drop(a);
        // head at c - 8, 8 bytes before the end: the next span straddles it.
        let mut w = r.alloc(16, 1).unwrap();
        assert_eq!(w.offset(), c - 8);
        let pattern: Vec<u8> = (100..116).collect();
        w.bytes_mut().copy_from_slice(&pattern);
        assert_eq!(w.bytes(), &pattern[..]);
        // The part past the end landed at the start of the first mapping,
        // and the part before the end is also seen in the second mapping.
        for i in 0..8 {
            assert_eq!(raw(&r, i), pattern[8 + i]);
            assert_eq!(raw(&r, c + i), pattern[8 + i]);
            assert_eq!(raw(&r, c - 8 + i), pattern[i]);
            assert_eq!(raw(&r, 2 * c - 8 + i), pattern[i]);
        }
        drop(b);
        drop(w);
        // Empty again: starts over at 0, where the wrapped tail lies.
        let front = r.alloc(8, 1).unwrap();
        assert_eq!(front.offset(), 0);
        assert_eq!(front.bytes(), &pattern[8..]);
        let middle = r.alloc(c - 16, 1).unwrap();
        let back = r.alloc(8, 1).unwrap();
        assert_eq!(back.offset(), c - 8);
        assert_eq!(back.bytes(), &pattern[..8]);
        drop((front, middle));
    }

    #[test]
    fn fifo_full_out_of_order_release_and_reset() {
        let r = ring();
        let c = r.capacity();
        let q = c / 4;
        let a = r.alloc(q, 1).unwrap();
        let b = r.alloc(q, 1).unwrap();
        let c3 = r.alloc(q, 1).unwrap();
        let d = r.alloc(q, 1).unwrap();
        assert_eq!(
            [a.offset(), b.offset(), c3.offset(), d.offset()],
            [0, q, 2 * q, 3 * q]
        );
        assert_eq!(r.used(), c);
        assert!(r.alloc(1, 1).is_none(), "full ring");
        // A zero-length span needs no room, even in a full ring.
        let e = r.alloc(0, 1).unwrap();
        assert!(e.is_empty());
        drop(e);

        // Out of order: b and c3 go first, but a still holds the tail.
        drop(c3);
        assert_eq!(r.used(), c);
        drop(b);
        assert_eq!(r.used(), c);
        assert!(r.alloc(1, 1).is_none());
        // a goes: the tail moves over a, b and c3 at once.
        drop(a);
        assert_eq!(r.used(), q);
        // The head wrapped to 0; what is free now is 0..3q.
        let f = r.alloc(2 * q, 1).unwrap();
        assert_eq!(f.offset(), 0);
        assert_eq!(r.used(), 3 * q);
        assert!(r.alloc(q + 1, 1).is_none());
        let g = r.alloc(q, 1).unwrap();
        assert_eq!(g.offset(), 2 * q);
        assert_eq!(r.used(), c);
        drop(d);
        assert_eq!(r.used(), 3 * q);
        drop(g);
        assert_eq!(r.used(), 3 * q, "g waits behind f");
        drop(f);
        assert_eq!(r.used(), 0);
        // Empty: the head went back to 0 although the last span ended at 3q.
        let h = r.alloc(1, 1).unwrap();
        assert_eq!(h.offset(), 0);
    }

    #[test]
    fn empty_ring_resets_to_zero() {
        let r = ring();
        let a = r.alloc(5, 1).unwrap();
        let b = r.alloc(7, 1).unwrap();
        drop(a);
        drop(b);
        assert_eq!(r.used(), 0);
        let c = r.alloc(64, 64).unwrap();
        assert_eq!(c.offset(), 0);
        assert_eq!(r.used(), 64);
    }

    #[test]
    fn alignment_pads_and_breaks_adjacency() {
        let r = ring();
        let a = r.alloc(3, 1).unwrap();
        let b = r.alloc(8, 8).unwrap();
        assert_eq!(a.offset(), 0);
        assert_eq!(b.offset(), 8);
        // The 5 bytes of padding count as used.
        assert_eq!(r.used(), 16);
        assert!(r.joined(&[&a, &b]).is_none());
        // Padding that would not fit makes the allocation fail.
        let c = r.capacity();
        let big = r.alloc(c - 16 - 4, 1).unwrap(); // head at c - 4
        assert!(
            r.alloc(2, 8).is_none(),
            "4 free, but padding 4 + 2 does not fit"
        );
        drop(a);
        assert_eq!(r.used(), c - 4 - 3, "a's bytes are free again");
        drop((b, big));
        assert_eq!(r.used(), 0);
    }

    #[test]
    fn alignment_at_the_end_wraps_to_zero() {
        let r = ring();
        let c = r.capacity();
        let a = r.alloc(64, 1).unwrap();
        let b = r.alloc(c - 64 - 4, 1).unwrap();
        drop(a);
        // head at c - 4; aligned to 8 that is c, i.e. offset 0.
        let d = r.alloc(16, 8).unwrap();
        assert_eq!(d.offset(), 0);
        assert_eq!(r.used(), c - 64 - 4 + 4 + 16);
        drop((b, d));
    }

    #[test]
    fn joined_adjacent_spans_are_one_slice() {
        let r = ring();
        let c = r.capacity();
        let mut a = r.alloc(10, 1).unwrap();
        let mut b = r.alloc(0, 1).unwrap();
        let mut d = r.alloc(22, 1).unwrap();
        fill(&mut a, 1);
        fill(&mut b, 50);
        fill(&mut d, 200);
        let want: Vec<u8> = [a.bytes(), b.bytes(), d.bytes()].concat();
        assert_eq!(r.joined(&[&a, &b, &d]).unwrap(), &want[..]);
        assert_eq!(r.joined(&[&a, &d]).unwrap(), &want[..]);
        assert_eq!(r.joined(&[&a]).unwrap(), a.bytes());
        assert_eq!(r.joined(&[&d]).unwrap(), d.bytes());
        // Wrong order, a gap, nothing at all.
        assert!(r.joined(&[&d, &a]).is_none());
        let e = r.alloc(4, 1).unwrap();
        assert!(r.joined(&[&a, &e]).is_none());
        assert!(r.joined(&[]).is_none());
        drop((a, b, d, e));
        assert_eq!(r.used(), 0);

        // A batch across the end of the ring.
        let x = r.alloc(c - 12, 1).unwrap();
        let mut p = r.alloc(8, 1).unwrap();
        drop(x);
        let mut q = r.alloc(8, 1).unwrap(); // c - 4 .. c + 4
        let mut s = r.alloc(8, 1).unwrap(); // 4 .. 12
        assert_eq!([p.offset(), q.offset(), s.offset()], [c - 12, c - 4, 4]);
        fill(&mut p, 10);
        fill(&mut q, 70);
        fill(&mut s, 130);
        let want: Vec<u8> = [p.bytes(), q.bytes(), s.bytes()].concat();
        let batch = r.joined(&[&p, &q, &s]).unwrap();
        assert_eq!(batch, &want[..]);
        assert_eq!(r.joined(&[&q, &s]).unwrap(), &want[8..]);
        assert!(r.joined(&[&p, &s]).is_none());
        assert!(r.joined(&[&s, &p]).is_none());
    }

    #[test]
    fn joined_refuses_another_ring_and_repeats() {
        let r = ring();
        let other = ring();
        let a = r.alloc(16, 1).unwrap();
        let b = r.alloc(16, 1).unwrap();
        // Same offsets and lengths in the other ring: still not ours.
        let oa = other.alloc(16, 1).unwrap();
        let ob = other.alloc(16, 1).unwrap();
        assert!(r.joined(&[&oa]).is_none());
        assert!(r.joined(&[&a, &ob]).is_none());
        assert!(r.joined(&[&oa, &b]).is_none());
        assert!(other.joined(&[&oa, &ob]).is_some());
        // A clone of the handle is the same ring.
        assert!(r.clone().joined(&[&a, &b]).is_some());
        drop((a, b));

        // A full-ring span is "adjacent" to itself; listing it twice would
        // read every byte twice.
        let c = r.capacity();
        let full = r.alloc(c, 1).unwrap();
        assert_eq!(r.joined(&[&full]).unwrap().len(), c);
        assert!(r.joined(&[&full, &full]).is_none());
    }

    #[test]
    fn bad_arguments() {
        assert_eq!(
            TensorRing::new("t", 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            TensorRing::new("t", MAX_CAPACITY + 1).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let r = ring();
        for align in [0, 3, 6, 8192, usize::MAX] {
            assert!(r.alloc(1, align).is_none(), "align {align}");
        }
        assert!(r.alloc(r.capacity() + 1, 1).is_none());
        assert!(r.alloc(usize::MAX, 1).is_none());
        assert!(r.alloc(1, 4096).is_some());
        assert_eq!(r.used(), 0, "the span above was dropped");
    }

    #[test]
    fn spans_cross_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TensorRing>();
        assert_send_sync::<RingSpan>();

        let r = ring();
        let c = r.capacity();
        // Four 50-byte spans, the last two past the end: c - 100, c - 50, 0, 50.
        let pad = r.alloc(c - 100, 1).unwrap();
        let mut spans: Vec<RingSpan> = (0..2).map(|_| r.alloc(50, 1).unwrap()).collect();
        drop(pad);
        spans.extend((0..2).map(|_| r.alloc(50, 1).unwrap()));
        let handles: Vec<_> = spans
            .drain(..)
            .enumerate()
            .map(|(i, mut span)| {
                std::thread::spawn(move || {
                    fill(&mut span, i as u8 * 60);
                    span
                })
            })
            .collect();
        let spans: Vec<RingSpan> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let refs: Vec<&RingSpan> = spans.iter().collect();
        let batch = r.joined(&refs).unwrap();
        assert_eq!(batch.len(), 200);
        for (i, chunk) in batch.chunks(50).enumerate() {
            for (j, &b) in chunk.iter().enumerate() {
                assert_eq!(b, (i as u8 * 60).wrapping_add(j as u8));
            }
        }
        // The batch wrapped: its second half lives at the ring's start.
        assert_eq!(spans[2].offset(), 0);

        // A shared ring handle used from another thread, span read here.
        let r2 = r.clone();
        let mut remote = std::thread::spawn(move || {
            let mut s = r2.alloc(0, 1).unwrap();
            fill(&mut s, 0);
            s
        })
        .join()
        .unwrap();
        assert!(remote.bytes_mut().is_empty());
        drop(spans);
        drop(remote);
        assert_eq!(r.used(), 0);
    }
}
