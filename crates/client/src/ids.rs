//! Maps and sets keyed by request id, with a hasher made for them.
//!
//! Request ids are chosen by this client (a counter), so there is nothing
//! for an attacker to collide and SipHash's defence costs ~30 ns per lookup
//! on a path whose whole budget over shared memory is well under a
//! microsecond. A Fibonacci multiply spreads consecutive ids over the
//! table's buckets.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one `u64` by multiplying with 2^64 / φ.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed; fold anything else in bytewise.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by request id.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
/// A set of request ids.
pub(crate) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Ids of the requests sent on one session and not yet answered, oldest
/// first.
///
/// An agent answers a session's requests in the order they reached it (one
/// thread per shared-memory session; a socket session's responses follow
/// the model queue, in order for one model), so an answer is almost always
/// to the oldest request: found at the front in one comparison, where a
/// hash set hashed and probed on every insert and removal. Out of order
/// (threads racing to send, several models, an agent that misbehaves)
/// removal scans at most `max_in_flight` ids.
#[derive(Debug, Default)]
pub(crate) struct PendingIds(VecDeque<u64>);

impl PendingIds {
    /// How many are pending.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds `id` (newest).
    pub(crate) fn push(&mut self, id: u64) {
        self.0.push_back(id);
    }

    /// Whether `id` is pending.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.0.contains(&id)
    }

    /// Forgets `id`; false if it was not pending.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        if self.0.front() == Some(&id) {
            self.0.pop_front();
            return true;
        }
        match self.0.iter().position(|&p| p == id) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_and_spread() {
        let mut m: IdMap<u64> = IdMap::default();
        for i in 0..1000 {
            m.insert(i, i * 2);
        }
        assert_eq!(m.get(&999), Some(&1998));
        assert_eq!(m.remove(&5), Some(10));
        let mut s = IdSet::default();
        assert!(s.insert(7) && !s.insert(7));
        let h = |x: u64| {
            let mut h = IdHasher::default();
            h.write_u64(x);
            h.finish()
        };
        // Consecutive ids land far apart in the top bits (bucket index).
        assert_ne!(h(1) >> 57, h(2) >> 57);
    }

    #[test]
    fn pending_ids_in_and_out_of_order() {
        let mut p = PendingIds::default();
        for id in [3, 4, 5, 6] {
            p.push(id);
        }
        assert!(p.remove(3), "the oldest, at the front");
        assert!(p.remove(5), "out of order");
        assert!(!p.remove(5), "already gone");
        assert!(!p.remove(99), "never sent");
        assert!(p.contains(4) && p.contains(6) && !p.contains(3));
        assert_eq!(p.len(), 2);
        assert!(p.remove(6) && p.remove(4));
        assert_eq!(p.len(), 0);
    }
}
