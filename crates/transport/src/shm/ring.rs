//! Single-producer/single-consumer rings of 64-byte slots in an [`Arena`].
//!
//! ```text
//! offset + 0     unused (its own cache line)
//! offset + 64    tail: u64, slots consumed so far (written by the consumer)
//! offset + 128   slots × 64 bytes
//! ```
//!
//! A ring carries **messages**: a first slot (a wire header) and the slots
//! of its body. The producer publishes a message by storing its **mark** in
//! the first slot's last word (bytes 56..64, reserved and zero in a wire
//! header): `i + 1`, where `i` counts slots since the session began, stored
//! last and with release ordering, after the body and the rest of the slot.
//! The consumer polls the mark of the slot it expects next. So a message
//! crosses cores as one cache line (more only with a body): a head index
//! beside the slots would be a second line, fetched only after the first
//! says there is something, and each line the other core last wrote costs a
//! transfer (~70 ns between cores here), a fifth of an empty round trip.
//!
//! The consumer clears the marks of the slots it consumed before it
//! publishes `tail`, so a stale slot of an earlier lap can never carry the
//! mark the consumer waits for, whatever bytes a body left in it.
//!
//! It gives consumed slots back later, not at once:
//! [`Consumer::consume`] only copies the message out, and
//! [`Consumer::give_back`] clears the marks and publishes `tail` for
//! everything consumed since. The channel gives back at the start of each
//! receive, that is, after the side has answered what it took. Clearing a
//! mark writes a line the peer shares, and the next atomic read-modify-write
//! (a lock, a counter) waits for that write to reach the peer: done at
//! once, it put a cross-core round trip between taking a request and
//! answering it. The producer sees at most the messages consumed since the
//! last receive as still in use.
//!
//! The producer keeps its own count and caches the consumer's `tail`,
//! reading the shared one only when the cached value says the ring is full;
//! the `tail` it reads is checked (a distance over the capacity means the
//! peer broke the ring: [`RingError::Corrupt`]). Slot contents are copied in
//! and out with atomic word accesses, so a peer scribbling over a slot can
//! garble that message (which is then validated like any untrusted input)
//! but nothing else.

use crate::shm::Arena;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// Bytes in one slot: one wire header.
///
/// # Examples
///
/// ```
/// use transport::shm::SLOT_LEN;
/// assert_eq!(wire::Header::new(wire::Kind::Ping).encode().len(), SLOT_LEN);
/// ```
pub const SLOT_LEN: usize = 64;
/// Bytes of a message's first slot the message may use: the last word is
/// the ring's mark.
///
/// # Examples
///
/// A wire header's reserved last 8 bytes are where the mark goes:
///
/// ```
/// use transport::shm::ring::FIRST_SLOT_USABLE;
/// let h = wire::Header::new(wire::Kind::Ping).encode();
/// assert!(h[FIRST_SLOT_USABLE..].iter().all(|&b| b == 0));
/// ```
pub const FIRST_SLOT_USABLE: usize = SLOT_LEN - 8;
const TAIL: usize = 64;
const SLOTS: usize = 128;
/// The word of a slot that holds the mark.
const MARK: usize = SLOT_LEN / 8 - 1;

/// The peer broke the ring's invariants.
///
/// # Examples
///
/// A message longer than the ring is refused, on either side:
///
/// ```
/// use std::sync::Arc;
/// use transport::shm::{Arena, Ring, RingError, SLOT_LEN};
/// let arena = Arc::new(Arena::create("ring", 4096)?);
/// let ring = Ring::new(arena, 0, 4)?;
/// let mut c = ring.consumer();
/// let mut body = Vec::new();
/// let e = c.consume(8, 8 * SLOT_LEN, &mut body).unwrap_err();
/// assert_eq!(e, RingError::TooLong { slots: 9, capacity: 4 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RingError {
    /// The indices are further apart than the ring holds.
    #[error("ring corrupted: head {head}, tail {tail}, capacity {capacity}")]
    Corrupt {
        /// The producer's count.
        head: u64,
        /// Tail as read.
        tail: u64,
        /// Slots in the ring.
        capacity: u32,
    },
    /// A message's body needs more slots than the ring holds.
    #[error("a message of {slots} slots cannot be in a ring of {capacity}")]
    TooLong {
        /// Slots the message claims.
        slots: u64,
        /// Slots in the ring.
        capacity: u32,
    },
}

/// Where a ring lives in an arena.
///
/// # Examples
///
/// One message with a body, from the producer end to the consumer end
/// (in a session each end is in its own process, over a shared arena):
///
/// ```
/// use std::sync::Arc;
/// use transport::shm::{Arena, Ring, SLOT_LEN};
/// let arena = Arc::new(Arena::create("ring", Ring::bytes_needed(8))?);
/// let ring = Ring::new(arena, 0, 8)?;
/// let (mut p, mut c) = (ring.producer(), ring.consumer());
///
/// let mut first = [0u8; SLOT_LEN];
/// first[..5].copy_from_slice(b"hello");
/// first[8] = 2; // (the slots of its body, as a wire header's desc_len would say)
/// assert!(p.push_message(&first, &[7u8; 100])?);
///
/// assert!(c.ready());
/// let got = c.peek().ok_or("published")?;
/// assert_eq!(&got[..5], b"hello");
/// let mut body = Vec::new();
/// c.consume(usize::from(got[8]), 100, &mut body)?;
/// assert_eq!(body, [7u8; 100]);
/// c.give_back(); // after answering: the slots are free again
/// assert!(!c.ready());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Ring {
    arena: Arc<Arena>,
    offset: usize,
    capacity: u32,
}

impl Ring {
    /// Bytes a ring of `capacity` slots takes.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::{Ring, SLOT_LEN};
    /// assert_eq!(Ring::bytes_needed(256), 128 + 256 * SLOT_LEN); // tail line, then slots
    /// ```
    pub const fn bytes_needed(capacity: u32) -> usize {
        SLOTS + capacity as usize * SLOT_LEN
    }

    /// A ring of `capacity` slots (a power of two) at `offset` (64-byte
    /// aligned) in `arena`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use transport::shm::{Arena, Ring};
    /// let arena = Arc::new(Arena::create("rings", 1 << 16)?);
    /// assert!(Ring::new(arena.clone(), 0, 64).is_ok());
    /// assert!(Ring::new(arena.clone(), 0, 48).is_err()); // not a power of two
    /// assert!(Ring::new(arena.clone(), 32, 64).is_err()); // not 64-byte aligned
    /// assert!(Ring::new(arena, 0, 4096).is_err()); // does not fit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(arena: Arc<Arena>, offset: usize, capacity: u32) -> Result<Ring, String> {
        if !capacity.is_power_of_two() {
            return Err(format!("ring capacity {capacity} is not a power of two"));
        }
        if !offset.is_multiple_of(64) || offset + Ring::bytes_needed(capacity) > arena.len() {
            return Err(format!(
                "ring at {offset} does not fit a {}-byte arena",
                arena.len()
            ));
        }
        Ok(Ring {
            arena,
            offset,
            capacity,
        })
    }

    /// The producer end of a fresh ring (exactly one process may use it).
    /// It starts at slot 0 whatever the arena says: a `tail` the peer wrote
    /// before this end existed must not decide where it publishes.
    /// Example: [`Ring`].
    pub fn producer(&self) -> Producer {
        Producer {
            next: 0,
            // "Full" until the real tail is read: the first push reads
            // (and checks) it.
            cached_tail: 0u64.wrapping_sub(u64::from(self.capacity)),
            ring: self.clone(),
        }
    }

    /// The consumer end of a fresh ring (exactly one process may use it),
    /// at slot 0. Example: [`Ring`].
    pub fn consumer(&self) -> Consumer {
        Consumer {
            next: 0,
            given: 0,
            ring: self.clone(),
        }
    }

    fn tail(&self) -> &AtomicU64 {
        self.arena.atomic_u64(self.offset + TAIL)
    }

    /// The 8 words of the slot `index` maps to.
    fn slot(&self, index: u64) -> &[AtomicU64] {
        // A mask, not `%`: the capacity is a power of two, and a 64-bit
        // division costs tens of cycles on every slot access.
        let slot = (index & u64::from(self.capacity - 1)) as usize;
        self.arena
            .atomic_u64s(self.offset + SLOTS + slot * SLOT_LEN, SLOT_LEN / 8)
    }
}

/// Copies `bytes` (at most a slot; zero-padded) into the words of `slot`
/// (relaxed: publication orders them).
fn write_slot(slot: &[AtomicU64], bytes: &[u8]) {
    let mut buf = [0u8; SLOT_LEN];
    buf[..bytes.len()].copy_from_slice(bytes);
    for (word, b) in slot.iter().zip(buf.chunks_exact(8)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
    }
}

/// Pushes messages; keeps its own count of slots pushed. Examples:
/// [`Ring`], [`Producer::push`].
#[derive(Debug)]
pub struct Producer {
    ring: Ring,
    next: u64,
    /// The consumer's tail as last read (checked then): at most the real
    /// one, so free space computed from it is never overstated.
    cached_tail: u64,
}

impl Producer {
    /// Publishes a message of one slot: the first [`FIRST_SLOT_USABLE`]
    /// bytes of `slot` (the rest is the mark); `Ok(false)` when the ring is
    /// full.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use transport::shm::{Arena, Ring, SLOT_LEN};
    /// let ring = Ring::new(Arc::new(Arena::create("full", 4096)?), 0, 2)?;
    /// let (mut p, mut c) = (ring.producer(), ring.consumer());
    /// let slot = [1u8; SLOT_LEN];
    /// assert!(p.push(&slot)? && p.push(&slot)?);
    /// assert!(!p.push(&slot)?); // full until the consumer gives slots back
    /// assert_eq!(c.pop()?.map(|s| s[0]), Some(1));
    /// assert!(p.push(&slot)?);
    /// assert_eq!(p.capacity(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push(&mut self, slot: &[u8; SLOT_LEN]) -> Result<bool, RingError> {
        self.push_message(slot, &[])
    }

    /// Publishes a message: the first slot (its first [`FIRST_SLOT_USABLE`]
    /// bytes; a wire header's last 8 bytes are reserved zero) and `body`
    /// zero-padded to whole slots after it; `Ok(false)` when they do not fit
    /// now. The consumer sees all of it or nothing. More slots than the ring
    /// holds never fit. Example: [`Ring`].
    pub fn push_message(&mut self, first: &[u8; SLOT_LEN], body: &[u8]) -> Result<bool, RingError> {
        let r = &self.ring;
        let n = 1 + body.len().div_ceil(SLOT_LEN) as u64;
        let cap = u64::from(r.capacity);
        if self.next.wrapping_sub(self.cached_tail) + n > cap {
            let tail = r.tail().load(Ordering::Acquire);
            let used = self.next.wrapping_sub(tail);
            if used > cap {
                return Err(RingError::Corrupt {
                    head: self.next,
                    tail,
                    capacity: r.capacity,
                });
            }
            self.cached_tail = tail;
            if used + n > cap {
                return Ok(false);
            }
        }
        for (i, chunk) in body.chunks(SLOT_LEN).enumerate() {
            write_slot(r.slot(self.next.wrapping_add(1 + i as u64)), chunk);
        }
        let head = r.slot(self.next);
        write_slot(&head[..MARK], &first[..FIRST_SLOT_USABLE]);
        // Publishes the body and the slot: pairs with the consumer's
        // acquire load of the mark.
        head[MARK].store(self.next.wrapping_add(1), Ordering::Release);
        self.next = self.next.wrapping_add(n);
        Ok(true)
    }

    /// Slots the ring holds. Example: [`Producer::push`].
    pub fn capacity(&self) -> u32 {
        self.ring.capacity
    }
}

/// Takes messages; keeps its own tail. Example: [`Ring`].
#[derive(Debug)]
pub struct Consumer {
    ring: Ring,
    next: u64,
    /// Slots before this one are given back (`tail`); `given..next` are
    /// consumed and still marked.
    given: u64,
}

impl Consumer {
    /// Whether the next message is published. Example: [`Ring`].
    pub fn ready(&self) -> bool {
        let r = &self.ring;
        r.slot(self.next)[MARK].load(Ordering::Acquire) == self.next.wrapping_add(1)
    }

    /// A copy of the next message's first slot, if it is published (its
    /// mark bytes zeroed). It stays in the ring until [`consume`](Self::consume).
    /// Example: [`Ring`].
    pub fn peek(&self) -> Option<[u8; SLOT_LEN]> {
        if !self.ready() {
            return None;
        }
        let mut out = [0u8; SLOT_LEN];
        let words = &self.ring.slot(self.next)[..MARK];
        for (word, chunk) in words.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        Some(out)
    }

    /// Consumes the peeked message with a body of `body_slots` slots, whose
    /// first `body_len` bytes are appended to `body`. Its slots go back to
    /// the producer at the next [`give_back`](Self::give_back).
    /// Examples: [`Ring`], [`RingError`].
    pub fn consume(
        &mut self,
        body_slots: usize,
        body_len: usize,
        body: &mut Vec<u8>,
    ) -> Result<(), RingError> {
        let r = &self.ring;
        let n = 1 + body_slots as u64;
        if n > u64::from(r.capacity) || body_len > body_slots * SLOT_LEN {
            return Err(RingError::TooLong {
                slots: n,
                capacity: r.capacity,
            });
        }
        body.reserve(body_slots * SLOT_LEN);
        for i in 1..n {
            for word in r.slot(self.next.wrapping_add(i)) {
                body.extend_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
            }
        }
        body.truncate(body.len() - (body_slots * SLOT_LEN - body_len));
        self.next = self.next.wrapping_add(n);
        Ok(())
    }

    /// Gives every slot consumed so far back to the producer: clears their
    /// marks (see the module docs), then publishes `tail`. Cheap when there
    /// is nothing to give back. Example: [`Ring`].
    pub fn give_back(&mut self) {
        if self.given == self.next {
            return;
        }
        let r = &self.ring;
        let mut i = self.given;
        while i != self.next {
            r.slot(i)[MARK].store(0, Ordering::Relaxed);
            i = i.wrapping_add(1);
        }
        self.given = self.next;
        r.tail().store(self.next, Ordering::Release);
    }

    /// Takes the next message if it is published and has no body, and
    /// gives its slot back at once. Example: [`Producer::push`].
    pub fn pop(&mut self) -> Result<Option<[u8; SLOT_LEN]>, RingError> {
        let Some(first) = self.peek() else {
            return Ok(None);
        };
        self.consume(0, 0, &mut Vec::new())?;
        self.give_back();
        Ok(Some(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(capacity: u32) -> (Ring, Ring) {
        let a = Arc::new(Arena::create("tw-ring", 1 << 16).unwrap());
        let b = Arc::new(Arena::open(a.fd().try_clone_to_owned().unwrap(), None).unwrap());
        (
            Ring::new(a, 256, capacity).unwrap(),
            Ring::new(b, 256, capacity).unwrap(),
        )
    }

    fn slot(n: u64) -> [u8; SLOT_LEN] {
        let mut s = [0u8; SLOT_LEN];
        s[..8].copy_from_slice(&n.to_le_bytes());
        s[48..56].copy_from_slice(&(!n).to_le_bytes());
        s
    }

    #[test]
    fn fills_and_drains_in_order() {
        let (a, b) = ring(4);
        let (mut p, mut c) = (a.producer(), b.consumer());
        for i in 0..4 {
            assert!(p.push(&slot(i)).unwrap());
        }
        assert!(!p.push(&slot(9)).unwrap(), "full");
        for i in 0..4 {
            assert_eq!(c.pop().unwrap(), Some(slot(i)));
        }
        assert_eq!(c.pop().unwrap(), None);
    }

    #[test]
    fn threads_through_two_mappings() {
        let (a, b) = ring(64);
        const N: u64 = 200_000;
        let t = std::thread::spawn(move || {
            let mut p = a.producer();
            let mut i = 0;
            while i < N {
                if p.push(&slot(i)).unwrap() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut c = b.consumer();
        let mut i = 0;
        while i < N {
            match c.pop().unwrap() {
                Some(s) => {
                    assert_eq!(s, slot(i));
                    i += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        t.join().unwrap();
    }

    /// A message of `slot(i)` and a body of `len` bytes whose every word
    /// is `word`.
    fn push_with_body(p: &mut Producer, i: u64, len: usize, word: u64) -> bool {
        let body: Vec<u8> = (0..len).map(|k| word.to_ne_bytes()[k % 8]).collect();
        p.push_message(&slot(i), &body).unwrap()
    }

    #[test]
    fn bodies_arrive_whole_across_laps_and_stale_slots_never_look_published() {
        // Bodies whose words equal marks a later lap waits for: without the
        // consumer clearing marks, a stale body slot would read as a header.
        let (a, b) = ring(8);
        let (mut p, mut c) = (a.producer(), b.consumer());
        let mut sent = 0u64;
        for i in 0..200u64 {
            let len = (i % 3) as usize * 64 + (i % 5) as usize * 7;
            let future_mark = sent + 8 + 1;
            assert!(push_with_body(&mut p, i, len, future_mark));
            let first = c.peek().expect("published");
            assert_eq!(first, slot(i));
            let slots = len.div_ceil(SLOT_LEN);
            let mut body = Vec::new();
            c.consume(slots, len, &mut body).unwrap();
            c.give_back();
            assert_eq!(body.len(), len);
            assert!(body
                .chunks(8)
                .all(|w| w == &future_mark.to_ne_bytes()[..w.len()]));
            sent += 1 + slots as u64;
            assert!(c.peek().is_none(), "message {i}: nothing else is published");
        }
    }

    #[test]
    fn consumed_slots_return_only_when_given_back() {
        let (a, b) = ring(4);
        let (mut p, mut c) = (a.producer(), b.consumer());
        assert!(push_with_body(&mut p, 0, 64, 0));
        assert!(p.push(&slot(1)).unwrap());
        let mut body = Vec::new();
        assert!(c.peek().is_some());
        c.consume(1, 64, &mut body).unwrap();
        assert_eq!(
            c.peek(),
            Some(slot(1)),
            "the next message is readable at once"
        );
        c.consume(0, 0, &mut body).unwrap();
        // Consumed but not given back: still the consumer's, still marked.
        assert!(p.push(&slot(2)).unwrap());
        assert!(
            !p.push(&slot(3)).unwrap(),
            "3 slots consumed, none given back"
        );
        assert_ne!(a.slot(0)[MARK].load(Ordering::Relaxed), 0);
        c.give_back();
        assert_eq!(a.tail().load(Ordering::Relaxed), 3);
        assert!((0..3).all(|i| a.slot(i)[MARK].load(Ordering::Relaxed) == 0));
        assert!(p.push(&slot(3)).unwrap());
        // Giving back twice gives nothing more.
        c.give_back();
        assert_eq!(a.tail().load(Ordering::Relaxed), 3);
        assert_eq!(c.pop().unwrap(), Some(slot(2)));
        assert_eq!(c.pop().unwrap(), Some(slot(3)));
    }

    #[test]
    fn scribbles_are_caught_or_harmless() {
        let (a, b) = ring(8);
        let (mut p, mut c) = (a.producer(), b.consumer());
        // A wrong mark is no message.
        a.slot(0)[MARK].store(77, Ordering::Release);
        assert_eq!(c.pop().unwrap(), None);
        // A body longer than the ring is refused before anything is read.
        assert!(p.push(&slot(1)).unwrap());
        assert!(c.peek().is_some());
        let mut body = Vec::new();
        assert!(matches!(
            c.consume(8, 0, &mut body),
            Err(RingError::TooLong { .. })
        ));
        assert!(body.is_empty());
        // A tail moved past what was produced breaks the producer's ring.
        b.tail().store(1000, Ordering::Release);
        p.cached_tail = p.next.wrapping_sub(8);
        assert!(matches!(p.push(&slot(2)), Err(RingError::Corrupt { .. })));
    }

    #[test]
    fn a_message_larger_than_the_ring_never_fits() {
        let (a, _b) = ring(4);
        let mut p = a.producer();
        assert!(!p.push_message(&slot(0), &[1u8; 4 * 64]).unwrap());
        assert!(p.push_message(&slot(0), &[1u8; 3 * 64]).unwrap());
    }

    #[test]
    fn layout_is_checked() {
        let a = Arc::new(Arena::create("tw-ring", 4096).unwrap());
        assert!(Ring::new(a.clone(), 0, 3).is_err());
        assert!(Ring::new(a.clone(), 8, 4).is_err());
        assert!(Ring::new(a, 0, 64).is_err(), "does not fit");
    }
}
