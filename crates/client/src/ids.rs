//! Maps and sets keyed by request id, with a hasher made for them.
//!
//! Request ids are chosen by this client (a counter), so there is nothing
//! for an attacker to collide and SipHash's defence costs ~30 ns per lookup
//! on a path whose whole budget over shared memory is well under a
//! microsecond. A Fibonacci multiply spreads consecutive ids over the
//! table's buckets.

use std::collections::{HashMap, HashSet};
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
}
