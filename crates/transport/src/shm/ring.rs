//! Single-producer/single-consumer rings of 64-byte slots in an [`Arena`].
//!
//! ```text
//! offset + 0     head: u64, slots pushed so far (written by the producer)
//! offset + 64    tail: u64, slots popped so far (written by the consumer)
//! offset + 128   slots × 64 bytes
//! ```
//!
//! Each side keeps its own index privately and only *publishes* it; the
//! peer's index is read from shared memory and checked before use (a
//! distance over the capacity means the peer broke the ring:
//! [`RingError::Corrupt`]).
//!
//! Each side also **caches** the peer's index and reads the shared one only
//! when the cached value says the ring is full (producer) or empty
//! (consumer). On the hot path this is what costs: every read of a line the
//! other core last wrote is a cache-line transfer (~100 ns between cores
//! here), so a producer that re-read `tail` on every push would pull the
//! consumer's line over once per message for nothing. Slot contents are copied in and out with atomic
//! word accesses, so a peer scribbling over a slot can garble that message
//! (which is then validated like any untrusted input) but nothing else.

use crate::shm::Arena;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use thiserror::Error;

/// Bytes in one slot: one wire header.
pub const SLOT_LEN: usize = 64;
const HEAD: usize = 0;
const TAIL: usize = 64;
const SLOTS: usize = 128;

/// The peer broke the ring's invariants.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RingError {
    /// The indices are further apart than the ring holds.
    #[error("ring corrupted: head {head}, tail {tail}, capacity {capacity}")]
    Corrupt {
        /// Head as read.
        head: u64,
        /// Tail as read.
        tail: u64,
        /// Slots in the ring.
        capacity: u32,
    },
}

/// Where a ring lives in an arena.
#[derive(Clone, Debug)]
pub struct Ring {
    arena: Arc<Arena>,
    offset: usize,
    capacity: u32,
}

impl Ring {
    /// Bytes a ring of `capacity` slots takes.
    pub const fn bytes_needed(capacity: u32) -> usize {
        SLOTS + capacity as usize * SLOT_LEN
    }

    /// A ring of `capacity` slots (a power of two) at `offset` (64-byte
    /// aligned) in `arena`.
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

    /// The producer end (exactly one process may use it).
    pub fn producer(&self) -> Producer {
        let next = self
            .arena
            .atomic_u64(self.offset + HEAD)
            .load(Ordering::Acquire);
        Producer {
            next,
            // "Full" until the real tail is read: the first push reads it.
            cached_tail: next.wrapping_sub(u64::from(self.capacity)),
            ring: self.clone(),
        }
    }

    /// The consumer end (exactly one process may use it).
    pub fn consumer(&self) -> Consumer {
        let next = self
            .arena
            .atomic_u64(self.offset + TAIL)
            .load(Ordering::Acquire);
        Consumer {
            next,
            cached_head: next,
            ring: self.clone(),
        }
    }

    /// The 8 words of the slot `index` maps to.
    fn slot(&self, index: u64) -> &[std::sync::atomic::AtomicU64] {
        let slot = (index % u64::from(self.capacity)) as usize;
        self.arena
            .atomic_u64s(self.offset + SLOTS + slot * SLOT_LEN, SLOT_LEN / 8)
    }

    fn check(&self, head: u64, tail: u64) -> Result<u64, RingError> {
        let used = head.wrapping_sub(tail);
        if used > u64::from(self.capacity) {
            return Err(RingError::Corrupt {
                head,
                tail,
                capacity: self.capacity,
            });
        }
        Ok(used)
    }
}

/// Pushes slots; keeps its own head.
#[derive(Debug)]
pub struct Producer {
    ring: Ring,
    next: u64,
    /// The consumer's tail as last read (checked then): at most the real
    /// one, so free space computed from it is never overstated.
    cached_tail: u64,
}

impl Producer {
    /// Copies `slot` into the ring; `Ok(false)` when the ring is full.
    pub fn push(&mut self, slot: &[u8; SLOT_LEN]) -> Result<bool, RingError> {
        self.push_bytes(slot)
    }

    /// Copies `bytes` (zero-padded to whole slots) into consecutive slots and
    /// publishes them at once, so the consumer sees all or none; `Ok(false)`
    /// when they do not fit now. More slots than the ring holds never fit.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<bool, RingError> {
        self.push_message(&[], bytes)
    }

    /// Like [`push_bytes`](Self::push_bytes) with `first` then `rest`,
    /// each zero-padded to whole slots (a header slot and its descriptor
    /// section), without joining them in a buffer first.
    pub fn push_message(&mut self, first: &[u8], rest: &[u8]) -> Result<bool, RingError> {
        let r = &self.ring;
        let n1 = first.len().div_ceil(SLOT_LEN);
        let n = (n1 + rest.len().div_ceil(SLOT_LEN)).max(1) as u64;
        if self.next.wrapping_sub(self.cached_tail) + n > u64::from(r.capacity) {
            let tail = r.arena.atomic_u64(r.offset + TAIL).load(Ordering::Acquire);
            let used = r.check(self.next, tail)?;
            self.cached_tail = tail;
            if used + n > u64::from(r.capacity) {
                return Ok(false);
            }
        }
        for i in 0..n {
            let (bytes, slot) = if (i as usize) < n1 {
                (first, i as usize)
            } else {
                (rest, i as usize - n1)
            };
            let src = bytes.get(slot * SLOT_LEN..).unwrap_or(&[]);
            let mut buf = [0u8; SLOT_LEN];
            if let Some(full) = src.get(..SLOT_LEN) {
                buf.copy_from_slice(full);
            } else {
                buf[..src.len()].copy_from_slice(src);
            }
            let words = r.slot(self.next.wrapping_add(i));
            for (word, b) in words.iter().zip(buf.chunks_exact(8)) {
                let mut w = [0u8; 8];
                w.copy_from_slice(b);
                word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
            }
        }
        self.next = self.next.wrapping_add(n);
        r.arena
            .atomic_u64(r.offset + HEAD)
            .store(self.next, Ordering::Release);
        Ok(true)
    }

    /// Slots the ring holds.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity
    }
}

/// Pops slots; keeps its own tail.
#[derive(Debug)]
pub struct Consumer {
    ring: Ring,
    next: u64,
    /// The producer's head as last read (checked then).
    cached_head: u64,
}

impl Consumer {
    /// Slots ready to pop.
    pub fn available(&mut self) -> Result<u64, RingError> {
        if self.cached_head != self.next {
            return Ok(self.cached_head.wrapping_sub(self.next));
        }
        let r = &self.ring;
        let head = r.arena.atomic_u64(r.offset + HEAD).load(Ordering::Acquire);
        let n = r.check(head, self.next)?;
        self.cached_head = head;
        Ok(n)
    }

    /// Copies the next slot out of the ring, if there is one.
    pub fn pop(&mut self) -> Result<Option<[u8; SLOT_LEN]>, RingError> {
        if self.available()? == 0 {
            return Ok(None);
        }
        let r = &self.ring;
        let mut out = [0u8; SLOT_LEN];
        for (word, chunk) in r.slot(self.next).iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        self.next = self.next.wrapping_add(1);
        r.arena
            .atomic_u64(r.offset + TAIL)
            .store(self.next, Ordering::Release);
        Ok(Some(out))
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
        s[56..].copy_from_slice(&(!n).to_le_bytes());
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

    #[test]
    fn scribbled_indices_are_detected() {
        let (a, b) = ring(8);
        let mut c = b.consumer();
        a.arena
            .atomic_u64(256 + HEAD)
            .store(1000, Ordering::Release);
        assert!(matches!(c.pop(), Err(RingError::Corrupt { .. })));
        let mut p = a.producer();
        a.arena.atomic_u64(256 + HEAD).store(0, Ordering::Release);
        b.arena
            .atomic_u64(256 + TAIL)
            .store(u64::MAX - 3, Ordering::Release);
        assert!(matches!(p.push(&slot(1)), Err(RingError::Corrupt { .. })));
    }

    #[test]
    fn layout_is_checked() {
        let a = Arc::new(Arena::create("tw-ring", 4096).unwrap());
        assert!(Ring::new(a.clone(), 0, 3).is_err());
        assert!(Ring::new(a.clone(), 8, 4).is_err());
        assert!(Ring::new(a, 0, 64).is_err(), "does not fit");
    }
}
