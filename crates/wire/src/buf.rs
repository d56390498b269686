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
///
/// # Examples
///
/// ```
/// use wire::AlignedBuf;
/// let mut b = AlignedBuf::zeroed(100)?;
/// assert_eq!(b.as_ptr() as usize % 64, 0);
/// b[..4].copy_from_slice(&1.5f32.to_le_bytes());
/// assert_eq!(b.len(), 100);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct AlignedBuf {
    storage: Storage,
    len: usize,
}

impl AlignedBuf {
    /// An empty buffer.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// let b = AlignedBuf::empty();
    /// assert!(b.is_empty());
    /// ```
    pub fn empty() -> AlignedBuf {
        AlignedBuf {
            storage: Storage::Blocks(Vec::new()),
            len: 0,
        }
    }

    /// A zeroed buffer of `len` bytes. Fails only if the system is out of memory
    /// (for a large buffer, if the anonymous mapping cannot be created).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// let b = AlignedBuf::zeroed(1 << 20)?; // large: an anonymous map, no memset
    /// assert!(b.iter().all(|&x| x == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// let b = AlignedBuf::copy_from(b"tensor")?;
    /// assert_eq!(b.as_slice(), b"tensor");
    /// assert_eq!(b.as_ptr() as usize % 64, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn copy_from(bytes: &[u8]) -> std::io::Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bytes.len())?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    /// Length in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// assert_eq!(AlignedBuf::zeroed(10)?.len(), 10);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes the buffer can hold without reallocating.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// let b = AlignedBuf::zeroed(10)?;
    /// assert!(b.capacity() >= b.len());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn capacity(&self) -> usize {
        match &self.storage {
            Storage::Blocks(v) => v.len() * 64,
            Storage::Map(m) => m.len(),
        }
    }

    /// True when the buffer holds no bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// assert!(AlignedBuf::zeroed(0)?.is_empty());
    /// assert!(!AlignedBuf::zeroed(1)?.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// assert_eq!(AlignedBuf::copy_from(&[1, 2, 3])?.as_slice(), [1, 2, 3]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Blocks(v) => &bytemuck::cast_slice(v)[..self.len],
            Storage::Map(m) => &m[..self.len],
        }
    }

    /// The bytes, writable.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::AlignedBuf;
    /// let mut b = AlignedBuf::zeroed(3)?;
    /// b.as_mut_slice().copy_from_slice(&[7, 8, 9]);
    /// assert_eq!(b.as_slice(), [7, 8, 9]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
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
///
/// # Examples
///
/// ```
/// use wire::BufPool;
/// let pool = BufPool::new(64 << 20, 4);
/// let b = pool.take(1 << 20)?; // 1 MiB: worth keeping
/// let at = b.as_ptr();
/// drop(b); // back to the pool...
/// assert_eq!(pool.held(), 1);
/// let again = pool.take(1 << 20)?; // ...and out again, already faulted in
/// assert_eq!(again.as_ptr(), at);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    max_bytes: usize,
    max_bufs: usize,
}

impl BufPool {
    /// A pool keeping at most `max_bufs` buffers and `max_bytes` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::BufPool;
    /// let pool = BufPool::new(16 << 20, 2); // at most two buffers, 16 MiB
    /// assert_eq!(pool.held(), 0);
    /// ```
    pub fn new(max_bytes: usize, max_bufs: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            max_bytes,
            max_bufs,
        })
    }

    /// A buffer of `len` bytes: a pooled one if one fits (capacity at least
    /// `len`, at most twice it), else a new zeroed one.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::BufPool;
    /// let pool = BufPool::new(16 << 20, 2);
    /// let small = pool.take(100)?; // small buffers are not pooled
    /// assert_eq!(small.len(), 100);
    /// drop(small);
    /// assert_eq!(pool.held(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::BufPool;
    /// let pool = BufPool::new(16 << 20, 2);
    /// drop((pool.take(1 << 20)?, pool.take(1 << 20)?, pool.take(1 << 20)?));
    /// assert_eq!(pool.held(), 2); // max_bufs
    /// # Ok::<(), std::io::Error>(())
    /// ```
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
///
/// # Examples
///
/// ```
/// use wire::{AlignedBuf, PooledBuf};
/// // A buffer from no pool: freed on drop like any other.
/// let mut b = PooledBuf::from(AlignedBuf::zeroed(8)?);
/// b[0] = 1;
/// assert_eq!(b.buf().as_slice()[0], 1);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PooledBuf {
    buf: AlignedBuf,
    pool: Option<Arc<BufPool>>,
}

impl PooledBuf {
    /// The buffer itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::BufPool;
    /// let pool = BufPool::new(16 << 20, 2);
    /// let b = pool.take(64)?;
    /// assert_eq!(b.buf().len(), 64);
    /// # Ok::<(), std::io::Error>(())
    /// ```
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
