//! [`OutputRegion`]: the allocator of a shared-memory session's agent region,
//! where outputs live until the client releases them.
//!
//! Its bookkeeping is in the agent's own memory, never in the arena (the
//! client can write the arena; it must not be able to steer the allocator).
//! Blocks are 64-byte aligned, found first-fit in a free list kept sorted by
//! offset and coalesced on free. Each response's blocks are held under its
//! `request_id` until a `Release` with that id frees them all.

use std::collections::{BTreeMap, HashMap};
use wire::PAYLOAD_ALIGN;

/// Offsets and lengths of the blocks one response holds.
pub type Blocks = Vec<(u64, u64)>;

/// First-fit allocator over `[0, len)` of one session's agent region.
#[derive(Debug)]
pub struct OutputRegion {
    len: u64,
    /// Free blocks: offset → length; disjoint, never adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    /// Blocks held by responses the client has not released, by request id.
    held: HashMap<u64, Blocks>,
    used: u64,
}

impl OutputRegion {
    /// An empty allocator over `len` bytes (rounded down to the alignment).
    pub fn new(len: usize) -> OutputRegion {
        let len = len as u64 & !(PAYLOAD_ALIGN - 1);
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(0, len);
        }
        OutputRegion {
            len,
            free,
            held: HashMap::new(),
            used: 0,
        }
    }

    /// The region's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region has no room at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated now (aligned sizes).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Responses holding blocks now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Allocates `len` bytes (`len` > 0), 64-byte aligned; returns the
    /// block's offset, or `None` if no free block is large enough.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let need = wire::align_up(len.max(1))?;
        let (&off, &have) = self.free.iter().find(|(_, &l)| l >= need)?;
        self.free.remove(&off);
        if have > need {
            self.free.insert(off + need, have - need);
        }
        self.used += need;
        Some(off)
    }

    /// Returns a block from [`alloc`](OutputRegion::alloc) (`len` as asked),
    /// merging it with free neighbours.
    pub fn free(&mut self, off: u64, len: u64) {
        let Some(mut size) = wire::align_up(len.max(1)) else {
            return;
        };
        debug_assert!(off + size <= self.len, "block {off}+{size} outside region");
        self.used -= size;
        let mut start = off;
        if let Some((&p, &pl)) = self.free.range(..off).next_back() {
            debug_assert!(p + pl <= off, "double free at {off}");
            if p + pl == off {
                self.free.remove(&p);
                start = p;
                size += pl;
            }
        }
        // The block (merged or not) ends where a free successor would start.
        if let Some(nl) = self.free.remove(&(start + size)) {
            size += nl;
        }
        self.free.insert(start, size);
    }

    /// Frees `blocks` (those of a response that was never sent).
    pub fn free_all(&mut self, blocks: Blocks) {
        for (off, len) in blocks {
            self.free(off, len);
        }
    }

    /// Keeps `blocks` until a `Release` of `request_id` (a client reusing an
    /// id before releasing it adds to what that Release frees).
    pub fn hold(&mut self, request_id: u64, blocks: Blocks) {
        if !blocks.is_empty() {
            self.held.entry(request_id).or_default().extend(blocks);
        }
    }

    /// Frees every block held for `request_id`; returns the bytes freed (0
    /// for an unknown id, which is not an error: identity responses hold
    /// nothing, and a repeated Release is harmless).
    pub fn release(&mut self, request_id: u64) -> u64 {
        let Some(blocks) = self.held.remove(&request_id) else {
            return 0;
        };
        let before = self.used;
        self.free_all(blocks);
        before - self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_list(r: &OutputRegion) -> Vec<(u64, u64)> {
        r.free.iter().map(|(&o, &l)| (o, l)).collect()
    }

    #[test]
    fn first_fit_aligned_and_coalescing() {
        let mut r = OutputRegion::new(1000);
        assert_eq!(r.len(), 960);
        let a = r.alloc(1).unwrap();
        let b = r.alloc(100).unwrap();
        let c = r.alloc(64).unwrap();
        assert_eq!((a, b, c), (0, 64, 192));
        assert_eq!(r.used(), 256);
        // Free the middle block: a hole that first fit reuses.
        r.free(b, 100);
        assert_eq!(free_list(&r), vec![(64, 128), (256, 704)]);
        assert_eq!(r.alloc(64), Some(64));
        assert_eq!(r.alloc(64), Some(128));
        assert_eq!(r.alloc(65), Some(256), "does not fit the hole: next block");
        // Free everything in a scattered order: one block again.
        for (off, len) in [(128, 64), (0, 1), (256, 65), (192, 64), (64, 64)] {
            r.free(off, len);
        }
        assert_eq!(free_list(&r), vec![(0, 960)]);
        assert_eq!(r.used(), 0);
        assert_eq!(r.alloc(961), None);
        assert_eq!(r.alloc(960), Some(0));
        assert_eq!(r.alloc(1), None, "full");
    }

    #[test]
    fn release_frees_a_responses_blocks() {
        let mut r = OutputRegion::new(4096);
        let x = r.alloc(1000).unwrap();
        let y = r.alloc(1000).unwrap();
        r.hold(7, vec![(x, 1000), (y, 1000)]);
        let z = r.alloc(64).unwrap();
        r.hold(8, vec![(z, 64)]);
        assert_eq!(r.held(), 2);
        assert_eq!(r.release(99), 0, "unknown ids are ignored");
        assert_eq!(r.release(7), 2048);
        assert_eq!(r.release(7), 0, "twice is harmless");
        assert_eq!(r.alloc(2048), Some(0), "the freed blocks merged");
        r.release(8);
        r.free(0, 2048);
        assert_eq!(free_list(&r), vec![(0, 4096)]);
    }
}
