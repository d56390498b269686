//! [`AlignedBuf`]: the memory tensor bytes live in.
//!
//! Payloads are read from sockets straight into an `AlignedBuf`, engines read
//! typed slices out of it in place, and engines write their outputs into one.
//! It is 64-byte aligned (cache line, and enough for every dtype and for SIMD
//! kernels) and built without `unsafe`: small buffers are a `Vec` of 64-byte
//! blocks; large ones are anonymous memory maps, page aligned and zero-filled
//! lazily by the kernel, so allocating a 64 MiB destination costs no memset.
//!
//! Fresh pages are not free either: the kernel zero-fills each one on first
//! touch (~0.5 ms per MiB here, more than copying it). [`BufPool`] keeps a
//! bounded number of large buffers for reuse, and a [`PooledBuf`] goes back
//! to its pool when dropped, so steady traffic of big tensors touches no new
//! pages.

use bytemuck::{Pod, Zeroable};
use memmap2::MmapMut;
use std::sync::{Arc, Mutex};

/// Buffers at least this large are anonymous mappings instead of heap blocks.
const MAP_THRESHOLD: usize = 256 * 1024;

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Block([u8; 64]);

enum Storage {
    Blocks(Vec<Block>),
    Map(MmapMut),
}

/// A zero-initialised, 64-byte aligned byte buffer of a fixed length.
pub struct AlignedBuf {
    storage: Storage,
    len: usize,
}

impl AlignedBuf {
    /// An empty buffer.
    pub fn empty() -> AlignedBuf {
        AlignedBuf {
            storage: Storage::Blocks(Vec::new()),
            len: 0,
        }
    }

    /// A zeroed buffer of `len` bytes. Fails only if the system is out of memory
    /// (for a large buffer, if the anonymous mapping cannot be created).
    pub fn zeroed(len: usize) -> std::io::Result<AlignedBuf> {
        let storage = if len >= MAP_THRESHOLD {
            Storage::Map(MmapMut::map_anon(len)?)
        } else {
            let blocks = len.div_ceil(64);
            let mut v = Vec::new();
            v.try_reserve_exact(blocks)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
            v.resize(blocks, Block([0; 64]));
            Storage::Blocks(v)
        };
        Ok(AlignedBuf { storage, len })
    }

    /// A buffer holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> std::io::Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bytes.len())?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes the buffer can hold without reallocating.
    pub fn capacity(&self) -> usize {
        match &self.storage {
            Storage::Blocks(v) => v.len() * 64,
            Storage::Map(m) => m.len(),
        }
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Blocks(v) => &bytemuck::cast_slice(v)[..self.len],
            Storage::Map(m) => &m[..self.len],
        }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Blocks(v) => &mut bytemuck::cast_slice_mut(v)[..self.len],
            Storage::Map(m) => &mut m[..self.len],
        }
    }
}

/// A bounded cache of large [`AlignedBuf`]s for reuse.
///
/// Only buffers of at least 256 KiB are kept (smaller ones come from the
/// heap, which recycles them itself). A reused buffer's bytes are whatever
/// its last user left: callers must overwrite what they read back (payload
/// reads and engine outputs do; alignment gaps between tensors are never
/// read or sent).
#[derive(Debug)]
pub struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    max_bytes: usize,
    max_bufs: usize,
}

impl BufPool {
    /// A pool keeping at most `max_bufs` buffers and `max_bytes` bytes.
    pub fn new(max_bytes: usize, max_bufs: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            max_bytes,
            max_bufs,
        })
    }

    /// A buffer of `len` bytes: a pooled one if one fits (capacity at least
    /// `len`, at most twice it), else a new zeroed one.
    pub fn take(self: &Arc<Self>, len: usize) -> std::io::Result<PooledBuf> {
        if len >= MAP_THRESHOLD {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut buf = free.swap_remove(i);
                buf.len = len;
                return Ok(PooledBuf {
                    buf,
                    pool: Some(self.clone()),
                });
            }
        }
        Ok(PooledBuf {
            buf: AlignedBuf::zeroed(len)?,
            pool: (len >= MAP_THRESHOLD).then(|| self.clone()),
        })
    }

    /// Buffers held for reuse now.
    pub fn held(&self) -> usize {
        self.free.lock().map_or(0, |f| f.len())
    }

    fn put(&self, buf: AlignedBuf) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = free.iter().map(AlignedBuf::capacity).sum();
        if free.len() < self.max_bufs && held + buf.capacity() <= self.max_bytes {
            free.push(buf);
        }
    }
}

/// An [`AlignedBuf`] that returns to its [`BufPool`] (if any) when dropped.
#[derive(Debug)]
pub struct PooledBuf {
    buf: AlignedBuf,
    pool: Option<Arc<BufPool>>,
}

impl PooledBuf {
    /// The buffer itself.
    pub fn buf(&self) -> &AlignedBuf {
        &self.buf
    }
}

impl From<AlignedBuf> for PooledBuf {
    /// Wraps a buffer that belongs to no pool (freed normally on drop).
    fn from(buf: AlignedBuf) -> PooledBuf {
        PooledBuf { buf, pool: None }
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::replace(&mut self.buf, AlignedBuf::empty()));
        }
    }
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed_at_every_size() {
        for len in [
            0,
            1,
            63,
            64,
            65,
            4096,
            MAP_THRESHOLD - 1,
            MAP_THRESHOLD,
            3 << 20,
        ] {
            let mut b = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b.as_ptr() as usize % 64, 0, "len {len}");
            if len > 0 {
                b[len - 1] = 7;
                assert_eq!(b.as_slice()[len - 1], 7);
            }
        }
    }

    #[test]
    fn pool_reuses_large_buffers_within_bounds() {
        let pool = BufPool::new(8 << 20, 2);
        let a = pool.take(1 << 20).unwrap();
        let ptr = a.as_ptr();
        drop(a);
        assert_eq!(pool.held(), 1);
        // Same or slightly smaller size: reused, with the requested length.
        let b = pool.take((1 << 20) - 100).unwrap();
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.len(), (1 << 20) - 100);
        drop(b);
        // Less than half the capacity: not reused (a fresh buffer instead).
        let c = pool.take(300 << 10).unwrap();
        assert_ne!(c.as_ptr(), ptr);
        // Small buffers are never pooled.
        drop(pool.take(100).unwrap());
        drop(c);
        assert_eq!(pool.held(), 2);
        // Over the byte budget: dropped, not kept.
        drop(pool.take(7 << 20).unwrap());
        assert_eq!(pool.held(), 2);
    }

    #[test]
    fn copy_from_copies() {
        let b = AlignedBuf::copy_from(b"hello").unwrap();
        assert_eq!(&*b, b"hello");
    }
}
