//! [`AlignedBuf`]: the memory tensor bytes live in.
//!
//! Payloads are read from sockets straight into an `AlignedBuf`, engines read
//! typed slices out of it in place, and engines write their outputs into one.
//! It is 64-byte aligned (cache line, and enough for every dtype and for SIMD
//! kernels) and built without `unsafe`: small buffers are a `Vec` of 64-byte
//! blocks; large ones are anonymous memory maps, page aligned and zero-filled
//! lazily by the kernel, so allocating a 64 MiB destination costs no memset.

use bytemuck::{Pod, Zeroable};
use memmap2::MmapMut;

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
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed_at_every_size() {
        for len in [0, 1, 63, 64, 65, 4096, MAP_THRESHOLD - 1, MAP_THRESHOLD, 3 << 20] {
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
    fn copy_from_copies() {
        let b = AlignedBuf::copy_from(b"hello").unwrap();
        assert_eq!(&*b, b"hello");
    }
}
