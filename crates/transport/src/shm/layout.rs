//! The arena's layout: a header page, the two rings, the data area.
//!
//! ```text
//! header page (4096 B)
//!    0  magic "TWSHM002"          u64
//!    8  arena length              u64
//!   16  ring capacity (slots)     u32, 4 bytes zero
//!   24  request ring offset       u64   (client → agent)
//!   32  response ring offset      u64   (agent → client)
//!   40  data area offset          u64
//!   48  data area length          u64
//!   56  client region length      u64   data[0, client) is the client's; the rest the agent's
//!   64  agent sleep word          u32   (futex; its own cache line)
//!   68  agent spin CPU word       u32   (see below; the agent's cache line)
//!  128  client sleep word         u32   (futex; its own cache line)
//!  132  client spin CPU word      u32
//! request ring, response ring (each 128 + capacity × 64 B, page aligned)
//! data area (page aligned)
//! ```
//!
//! The agent writes the header before it hands the arena over; the client
//! checks every field before using any.
//!
//! A spin CPU word says where its side is polling the ring right now: 0
//! when it is not polling (working, or asleep), else the CPU number + 1,
//! with [`CPU_PINNED`] set when that side's mask allows it no other CPU.
//! Only a hint, read to find both sides on one CPU (PROTOCOL §14.9): a
//! peer that writes nonsense there only changes where this side runs or
//! whether it spins.

use crate::shm::ring::Ring;
use crate::shm::Arena;
use std::sync::atomic::Ordering;

/// First eight bytes of every arena.
///
/// # Examples
///
/// ```
/// use transport::shm::layout::MAGIC;
/// use transport::shm::{Arena, Layout};
/// let l = Layout::new(8, 4096, 4096)?;
/// let a = Arena::create("magic", l.arena_len)?;
/// l.write(&a, 0);
/// assert_eq!(&a.bytes(0..8), b"TWSHM002");
/// assert_eq!(u64::from_le_bytes(a.bytes(0..8).try_into()?), MAGIC);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAGIC: u64 = u64::from_le_bytes(*b"TWSHM002");

/// Offset of the header page's `features` word (PROTOCOL §14.3): what the
/// agent accepts beyond the first release; 0 from older agents.
///
/// # Examples
///
/// This and [`FEATURE_PULL`]: what a client reads to know whether the
/// agent pulls inputs:
///
/// ```
/// use std::sync::atomic::Ordering;
/// use transport::shm::layout::{FEATURES_OFF, FEATURE_PULL};
/// use transport::shm::{Arena, Layout};
/// let l = Layout::new(8, 4096, 4096)?;
/// let a = Arena::create("features", l.arena_len)?;
/// l.write(&a, FEATURE_PULL);
/// assert_eq!(a.atomic_u64(FEATURES_OFF).load(Ordering::Acquire), FEATURE_PULL);
/// assert_ne!(Layout::features(&a) & FEATURE_PULL, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const FEATURES_OFF: usize = 192;
/// Feature bit: the agent pulls inputs named by address (`flags::PULL`).
/// Example: [`FEATURES_OFF`].
pub const FEATURE_PULL: u64 = 1;
/// Offset of the agent's sleep word.
///
/// # Examples
///
/// The header page's words of each side (this, [`CLIENT_SLEEP`],
/// [`AGENT_CPU`], [`CLIENT_CPU`]) are 4-byte words that do not overlap
/// each other or the layout fields (bytes 0..64):
///
/// ```
/// use transport::shm::layout::{AGENT_CPU, AGENT_SLEEP, CLIENT_CPU, CLIENT_SLEEP, FEATURES_OFF};
/// use transport::shm::{Arena, SLEEP_FUTEX};
/// use std::sync::atomic::Ordering;
/// let mut words = [AGENT_SLEEP, AGENT_CPU, CLIENT_SLEEP, CLIENT_CPU];
/// words.sort();
/// assert!(words[0] >= 64 && words.windows(2).all(|w| w[1] >= w[0] + 4) && words[3] + 4 <= FEATURES_OFF);
/// let a = Arena::create("words", 4096)?;
/// a.atomic_u32(AGENT_SLEEP).store(SLEEP_FUTEX, Ordering::Release); // "I sleep on my futex"
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const AGENT_SLEEP: usize = 64;
/// Offset of the client's sleep word. Example: [`AGENT_SLEEP`].
pub const CLIENT_SLEEP: usize = 128;
/// Offset of the agent's spin CPU word. Example: [`AGENT_SLEEP`].
pub const AGENT_CPU: usize = 68;
/// Offset of the client's spin CPU word. Example: [`AGENT_SLEEP`].
pub const CLIENT_CPU: usize = 132;
/// Flag of a spin CPU word: this side may run on no other CPU.
///
/// # Examples
///
/// ```
/// use transport::shm::layout::CPU_PINNED;
/// let word = 3 | CPU_PINNED; // polling on CPU 3, pinned there
/// assert_eq!((word & !CPU_PINNED, word & CPU_PINNED != 0), (3, true));
/// ```
pub const CPU_PINNED: u32 = 1 << 31;
const PAGE: usize = 4096;

/// Where everything lives in one arena.
///
/// # Examples
///
/// ```
/// use transport::shm::Layout;
/// let l = Layout::new(256, 1 << 20, 1 << 20)?;
/// assert!(l.data_off >= l.response_ring); // header page, rings, then data
/// assert_eq!(l.arena_len, l.data_off + l.data_len);
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Total bytes.
    pub arena_len: usize,
    /// Slots per ring.
    pub ring_capacity: u32,
    /// Offset of the request ring.
    pub request_ring: usize,
    /// Offset of the response ring.
    pub response_ring: usize,
    /// Offset of the data area.
    pub data_off: usize,
    /// Length of the data area.
    pub data_len: usize,
    /// The client's part of the data area: `[0, client_len)`.
    pub client_len: usize,
}

fn page_up(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// A layout with `ring_capacity` slots per ring, a client region of
    /// `client_len` bytes and an agent region of `agent_len` bytes (both
    /// rounded up to pages).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::Layout;
    /// let l = Layout::new(64, 5000, 1)?;
    /// assert_eq!((l.client_len, l.agent_len()), (8192, 4096)); // whole pages
    /// assert!(Layout::new(100, 4096, 4096).is_err()); // not a power of two
    /// # Ok::<(), String>(())
    /// ```
    pub fn new(ring_capacity: u32, client_len: usize, agent_len: usize) -> Result<Layout, String> {
        if !ring_capacity.is_power_of_two() || ring_capacity < 2 {
            return Err(format!(
                "ring capacity {ring_capacity} must be a power of two ≥ 2"
            ));
        }
        let ring = page_up(Ring::bytes_needed(ring_capacity));
        let client_len = page_up(client_len);
        let data_len = client_len
            .checked_add(page_up(agent_len))
            .ok_or("arena size overflows")?;
        let request_ring = PAGE;
        let response_ring = request_ring + ring;
        let data_off = response_ring + ring;
        let arena_len = data_off
            .checked_add(data_len)
            .ok_or("arena size overflows")?;
        Ok(Layout {
            arena_len,
            ring_capacity,
            request_ring,
            response_ring,
            data_off,
            data_len,
            client_len,
        })
    }

    /// Writes the header into a fresh arena, with the agent's `features`.
    ///
    /// # Examples
    ///
    /// The agent writes it; the client reads it back and gets the same
    /// layout:
    ///
    /// ```
    /// use transport::shm::{Arena, Layout};
    /// let l = Layout::new(64, 1 << 16, 1 << 16)?;
    /// let a = Arena::create("layout", l.arena_len)?;
    /// l.write(&a, 0);
    /// let peer = Arena::open(a.fd().try_clone_to_owned()?, None)?;
    /// assert_eq!(Layout::read(&peer)?, l);
    /// assert_eq!(Layout::features(&peer), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, a: &Arena, features: u64) {
        let w = |off: usize, v: u64| a.atomic_u64(off).store(v, Ordering::Relaxed);
        w(8, self.arena_len as u64);
        w(16, u64::from(self.ring_capacity));
        w(24, self.request_ring as u64);
        w(32, self.response_ring as u64);
        w(40, self.data_off as u64);
        w(48, self.data_len as u64);
        w(56, self.client_len as u64);
        w(FEATURES_OFF, features);
        a.atomic_u64(0).store(MAGIC, Ordering::Release);
    }

    /// The agent's `features` word of a checked arena (bits it does not
    /// know are the client's to ignore). Examples: [`Layout::write`],
    /// [`FEATURES_OFF`].
    pub fn features(a: &Arena) -> u64 {
        a.atomic_u64(FEATURES_OFF).load(Ordering::Acquire)
    }

    /// Reads and checks the header of an arena received from the agent: it
    /// must describe exactly the layout `Layout::new` would make for its
    /// sizes, and fit the arena.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::Ordering;
    /// use transport::shm::{Arena, Layout};
    /// let l = Layout::new(64, 1 << 16, 1 << 16)?;
    /// let a = Arena::create("checked", l.arena_len)?;
    /// assert!(Layout::read(&a).is_err()); // no header yet
    /// l.write(&a, 0);
    /// a.atomic_u64(40).store(0, Ordering::Release); // a peer moves the data area onto the header
    /// let e = Layout::read(&a).unwrap_err();
    /// assert!(e.starts_with("inconsistent arena header"), "{e}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(a: &Arena) -> Result<Layout, String> {
        if a.len() < PAGE {
            return Err(format!("arena of {} bytes has no header page", a.len()));
        }
        let r = |off: usize| a.atomic_u64(off).load(Ordering::Acquire);
        if r(0) != MAGIC {
            return Err("arena has no tensorwire shm header".into());
        }
        let cap = u32::try_from(r(16)).map_err(|_| "ring capacity out of range")?;
        let (data_len, client_len) = (r(48) as usize, r(56) as usize);
        let agent_len = data_len
            .checked_sub(client_len)
            .ok_or("client region larger than data area")?;
        let want = Layout::new(cap, client_len, agent_len)?;
        let got = Layout {
            arena_len: r(8) as usize,
            ring_capacity: cap,
            request_ring: r(24) as usize,
            response_ring: r(32) as usize,
            data_off: r(40) as usize,
            data_len,
            client_len,
        };
        if got != want || got.arena_len != a.len() {
            return Err(format!(
                "inconsistent arena header: {got:?} (arena {} bytes)",
                a.len()
            ));
        }
        Ok(got)
    }

    /// Bytes of the agent's region.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::shm::Layout;
    /// assert_eq!(Layout::new(8, 4096, 65536)?.agent_len(), 65536);
    /// # Ok::<(), String>(())
    /// ```
    pub fn agent_len(&self) -> usize {
        self.data_len - self.client_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_layout_reads_back_and_tampering_is_caught() {
        let l = Layout::new(256, 1 << 20, 1 << 18).unwrap();
        assert_eq!(l.data_off % 4096, 0);
        assert!(l.response_ring >= l.request_ring + Ring::bytes_needed(256));
        let a = Arena::create("tw-layout", l.arena_len).unwrap();
        l.write(&a, FEATURE_PULL);
        assert_eq!(Layout::read(&a).unwrap(), l);
        a.atomic_u64(56).store(u64::MAX, Ordering::Release);
        assert!(Layout::read(&a).is_err());
        l.write(&a, FEATURE_PULL);
        a.atomic_u64(40).store(8, Ordering::Release);
        assert!(Layout::read(&a).is_err());
        assert!(Layout::new(3, 1, 1).is_err());
    }
}
