//! [`Arena`]: a memfd mapped shared, sealed so that its size can never change.
//!
//! The creator makes it (`memfd_create`), sizes it, seals it against growing
//! and shrinking (a peer that could shrink it would make our next access a
//! SIGBUS), and passes the fd to exactly one peer. The receiver checks the
//! seals before mapping it.

use memmap2::{MmapMut, MmapOptions};
use rustix::fs::{
    fcntl_add_seals, fcntl_get_seals, fstat, ftruncate, memfd_create, MemfdFlags, SealFlags,
};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// The seals every arena carries.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A shared, fixed-size memory region backed by a sealed memfd.
///
/// # Examples
///
/// ```
/// use transport::shm::Arena;
/// let a = Arena::create("doc-arena", 1 << 16)?;
/// assert_eq!(a.len(), 1 << 16);
/// assert!(a.bytes(0..4096).iter().all(|&b| b == 0)); // zeroed
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Arena {
    map: MmapMut,
    fd: OwnedFd,
}

impl Arena {
    /// Creates a zeroed arena of `len` bytes (a multiple of the page size is
    /// sensible), sealed against resizing. `name` only shows in /proc.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::Arena;
    /// let a = Arena::create("session-1", 4096)?;
    /// assert!(!a.is_empty());
    /// assert!(Arena::create("empty", 0).is_err());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create(name: &str, len: usize) -> io::Result<Arena> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an arena needs a size",
            ));
        }
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, len as u64)?;
        fcntl_add_seals(&fd, SEALS)?;
        Arena::map(fd, len)
    }

    /// Maps an arena received from a peer, after checking that it is sealed
    /// against shrinking and growing (so its size is what `fstat` says, now
    /// and later) and, if given, that its size is `expect_len`.
    ///
    /// # Examples
    ///
    /// The peer's side of an arena handed over a Unix socket:
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::shm::{fdpass, Arena};
    /// let (agent, client) = UnixStream::pair()?;
    /// let mine = Arena::create("handed-over", 1 << 16)?;
    /// fdpass::send_with_fd(&agent, b"arena", mine.fd())?;
    ///
    /// let (_, fd) = fdpass::recv_with_fd(&client, &mut [0u8; 16])?;
    /// let fd = fd.ok_or("an fd came with the message")?;
    /// let theirs = Arena::open(fd.try_clone()?, Some(1 << 16))?;
    /// assert_eq!(theirs.len(), mine.len());
    /// assert!(Arena::open(fd, Some(4096)).is_err()); // not the size agreed
    ///
    /// // A memfd without the seals is refused: its size could change under us.
    /// let unsealed = rustix::fs::memfd_create("unsealed", rustix::fs::MemfdFlags::CLOEXEC)?;
    /// rustix::fs::ftruncate(&unsealed, 4096)?;
    /// assert!(Arena::open(unsealed, None).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(fd: OwnedFd, expect_len: Option<usize>) -> io::Result<Arena> {
        let seals = fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the arena is not sealed against resizing",
            ));
        }
        let len = usize::try_from(fstat(&fd)?.st_size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "arena size is negative"))?;
        if expect_len.is_some_and(|e| e != len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the arena is {len} bytes, expected {expect_len:?}"),
            ));
        }
        Arena::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Arena> {
        let file = File::from(fd);
        // SAFETY: the memfd is sealed against shrinking (checked or set by
        // the callers), so the mapping stays backed for its whole life and
        // no access can SIGBUS. The peer does modify the memory while it is
        // mapped: that is the point of it; we only touch it through atomics
        // (`atomic_u32`/`atomic_u64`) and through byte views whose contents
        // we treat as untrusted.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(Arena {
            map,
            fd: OwnedFd::from(file),
        })
    }

    /// The arena's size in bytes. Example: [`Arena`].
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the arena is empty (never: arenas have a size). Example:
    /// [`Arena::create`].
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The memfd, to pass to the peer. Example: [`Arena::open`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Base address of the mapping.
    ///
    /// # Examples
    ///
    /// Where a tensor placed at an offset lies, for an engine that takes a
    /// pointer:
    ///
    /// ```
    /// let a = transport::shm::Arena::create("ptr", 1 << 16)?;
    /// let t = a.bytes(4096..8192);
    /// assert_eq!(t.as_ptr(), a.as_ptr().wrapping_add(4096).cast_const());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr().cast_mut()
    }

    /// The bytes of `range`. The peer may change them at any time: treat
    /// them as untrusted input (validate before acting on them).
    ///
    /// # Examples
    ///
    /// Two mappings of one arena see the same bytes:
    ///
    /// ```
    /// use transport::shm::Arena;
    /// let a = Arena::create("shared", 4096)?;
    /// let b = Arena::open(a.fd().try_clone_to_owned()?, None)?; // as the peer maps it
    /// // SAFETY: nothing else in this process uses bytes 0..5 of `b` meanwhile.
    /// unsafe { b.bytes_mut(0..5) }.copy_from_slice(b"hello");
    /// assert_eq!(a.bytes(0..5), b"hello");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "bad range {range:?}"
        );
        // SAFETY: in bounds (asserted) of a mapping that lives as long as
        // `&self`. Any byte pattern is a valid `u8`; concurrent writes by the
        // peer process can only change values we already treat as untrusted.
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(range.start), range.len()) }
    }

    /// The bytes of `range`, writable.
    ///
    /// # Safety
    /// Nothing else in this process may access `range` while the returned
    /// slice lives (the caller owns that part of the arena, e.g. an
    /// allocation it made); the peer is expected not to touch it either.
    ///
    /// Example: [`Arena::bytes`].
    #[allow(clippy::mut_from_ref)] // exclusivity is the caller's contract (above)
    pub unsafe fn bytes_mut(&self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "bad range {range:?}"
        );
        // SAFETY: in bounds (asserted); exclusivity within this process is
        // the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(range.start), range.len()) }
    }

    /// The `AtomicU32` at byte `offset` (must be 4-byte aligned and in bounds).
    ///
    /// # Examples
    ///
    /// A word both sides of a session see (a sleep flag):
    ///
    /// ```
    /// use std::sync::atomic::Ordering;
    /// use transport::shm::Arena;
    /// let a = Arena::create("words", 4096)?;
    /// let peer = Arena::open(a.fd().try_clone_to_owned()?, None)?;
    /// a.atomic_u32(64).store(1, Ordering::Release);
    /// assert_eq!(peer.atomic_u32(64).load(Ordering::Acquire), 1);
    /// a.atomic_u64(128).store(u64::MAX, Ordering::Release);
    /// let pair = peer.atomic_u64s(128, 2);
    /// assert_eq!((pair[0].load(Ordering::Acquire), pair[1].load(Ordering::Acquire)), (u64::MAX, 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len(),
            "bad atomic offset {offset}"
        );
        // SAFETY: in bounds and aligned (asserted); the mapping lives as long
        // as `&self`; AtomicU32 has the layout of u32 and any bit pattern is
        // a valid u32; all accesses to shared words go through atomics.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The `count` consecutive `AtomicU64`s from byte `offset` (8-byte
    /// aligned, in bounds): one bounds check for a whole ring slot.
    /// Example: [`Arena::atomic_u32`].
    pub fn atomic_u64s(&self, offset: usize, count: usize) -> &[AtomicU64] {
        assert!(
            offset.is_multiple_of(8)
                && count
                    .checked_mul(8)
                    .and_then(|b| b.checked_add(offset))
                    .is_some_and(|end| end <= self.len()),
            "bad atomic range {offset} + {count} words"
        );
        // SAFETY: as for `atomic_u64`, for each of the `count` words: the
        // range is in the mapping (checked above) and 8-byte aligned (the
        // mapping is page-aligned and `offset` is a multiple of 8).
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset).cast::<AtomicU64>(), count) }
    }

    /// The `AtomicU64` at byte `offset` (must be 8-byte aligned and in bounds).
    /// Example: [`Arena::atomic_u32`].
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len(),
            "bad atomic offset {offset}"
        );
        // SAFETY: as for `atomic_u32`, with 8-byte alignment.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn create_seal_reopen_share() {
        let a = Arena::create("tw-test", 1 << 16).unwrap();
        assert_eq!(a.len(), 1 << 16);
        // Resizing is refused by the seals.
        assert!(ftruncate(a.fd(), 1 << 12).is_err());
        assert!(ftruncate(a.fd(), 1 << 20).is_err());
        let fd = a.fd().try_clone_to_owned().unwrap();
        let b = Arena::open(fd, Some(1 << 16)).unwrap();
        a.atomic_u64(64).store(0xfeed, Ordering::Release);
        assert_eq!(
            b.atomic_u64(64).load(Ordering::Acquire),
            0xfeed,
            "same memory"
        );
        let fd = a.fd().try_clone_to_owned().unwrap();
        assert!(Arena::open(fd, Some(4096)).is_err(), "size checked");
    }

    #[test]
    fn unsealed_memfd_is_refused() {
        let fd = memfd_create("tw-unsealed", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, 4096).unwrap();
        assert!(Arena::open(fd, None).is_err());
    }
}
