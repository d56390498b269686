//! The per-request timeline: monotonic nanosecond stamps the agent takes as a
//! request moves through it, returned to the client on request.
//!
//! Stamps are `CLOCK_MONOTONIC` nanoseconds, which every process on one
//! machine shares, so a client on the same machine can subtract its own
//! stamps from the agent's. A stamp of 0 means "not taken".

use crate::error::{need, WireError};

/// Bytes a timeline takes on the wire: 8 little-endian u64 stamps, the last
/// two reserved (zero).
///
/// # Examples
///
/// ```
/// use wire::{Timeline, TIMELINE_LEN};
/// let bytes = Timeline::from_stamps([1, 2, 3, 4, 5, 6]).encode();
/// assert_eq!(bytes.len(), TIMELINE_LEN);
/// assert!(bytes[48..].iter().all(|&b| b == 0)); // the reserved stamps
/// ```
pub const TIMELINE_LEN: usize = 64;

/// The stages the agent stamps, in order.
///
/// # Examples
///
/// ```
/// use wire::Stage;
/// let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
/// assert_eq!(names[0], "received");
/// assert_eq!(names[5], "response_sent");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Stage {
    /// The request's header was read.
    Received = 0,
    /// The request's tensor bytes are in place where the engine reads them.
    PayloadInPlace = 1,
    /// The request entered its model's queue.
    Queued = 2,
    /// The engine started running the request.
    ComputeStart = 3,
    /// The engine finished.
    ComputeEnd = 4,
    /// The response was handed to the transport.
    ResponseSent = 5,
}

impl Stage {
    /// Every stage in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Stage, Timeline};
    /// let tl = Timeline::from_stamps([10, 20, 30, 40, 50, 60]);
    /// let stamps: Vec<u64> = Stage::ALL.iter().map(|&s| tl.get(s)).collect();
    /// assert_eq!(stamps, [10, 20, 30, 40, 50, 60]);
    /// ```
    pub const ALL: [Stage; 6] = [
        Stage::Received,
        Stage::PayloadInPlace,
        Stage::Queued,
        Stage::ComputeStart,
        Stage::ComputeEnd,
        Stage::ResponseSent,
    ];

    /// Short snake_case name.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Stage;
    /// assert_eq!(Stage::ComputeStart.name(), "compute_start");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Received => "received",
            Stage::PayloadInPlace => "payload_in_place",
            Stage::Queued => "queued",
            Stage::ComputeStart => "compute_start",
            Stage::ComputeEnd => "compute_end",
            Stage::ResponseSent => "response_sent",
        }
    }
}

/// One request's agent-side stamps.
///
/// # Examples
///
/// ```
/// use wire::{Stage, Timeline};
/// let t = Timeline::from_stamps([100, 150, 160, 200, 900, 950]);
/// assert_eq!(t.span(Stage::ComputeStart, Stage::ComputeEnd), Some(700));
/// assert_eq!(t.span(Stage::Received, Stage::ResponseSent), Some(850));
/// assert_eq!(Timeline::decode(&t.encode())?, t);
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Stamps indexed by [`Stage`].
    pub stamps: [u64; 6],
    /// Set for a request whose client did not ask for its timeline:
    /// [`stamp`](Self::stamp) then reads no clock.
    unasked: bool,
}

impl Timeline {
    /// The timeline of the request `h`: one that takes stamps only if its
    /// client asked for them (`flags::WANT_TIMELINE`). Each stamp is a
    /// clock read (~30 ns on the VMs we measure on) and a request takes
    /// five, a sixth of an empty shared-memory round trip, for stamps
    /// nobody reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{flags, Header, Kind, Stage, Timeline};
    /// let mut h = Header::new(Kind::Request);
    /// let mut unasked = Timeline::for_request(&h);
    /// unasked.stamp(Stage::Received);
    /// assert_eq!(unasked.get(Stage::Received), 0); // no clock read
    /// h.flags |= flags::WANT_TIMELINE;
    /// let mut asked = Timeline::for_request(&h);
    /// asked.stamp(Stage::Received);
    /// assert!(asked.get(Stage::Received) > 0);
    /// ```
    pub fn for_request(h: &crate::Header) -> Timeline {
        Timeline {
            unasked: h.flags & crate::flags::WANT_TIMELINE == 0,
            ..Timeline::default()
        }
    }

    /// A timeline with these stamps (indexed by [`Stage`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Stage, Timeline};
    /// let t = Timeline::from_stamps([10, 20, 30, 40, 50, 60]);
    /// assert_eq!(t.get(Stage::Queued), 30);
    /// ```
    pub fn from_stamps(stamps: [u64; 6]) -> Timeline {
        Timeline {
            stamps,
            ..Timeline::default()
        }
    }

    /// Records `stage` as happening now (unless nobody asked: see
    /// [`for_request`](Self::for_request)). Inlined across crates, so an
    /// unasked stamp costs a test and a branch, not a call.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{monotonic_ns, Stage, Timeline};
    /// let before = monotonic_ns();
    /// let mut t = Timeline::default();
    /// t.stamp(Stage::ComputeStart);
    /// assert!(t.get(Stage::ComputeStart) >= before);
    /// ```
    #[inline]
    pub fn stamp(&mut self, stage: Stage) {
        if !self.unasked {
            self.stamps[stage as usize] = monotonic_ns();
        }
    }

    /// Sets `stage` to `ns` (a time already read for another stage).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{monotonic_ns, Stage, Timeline};
    /// let mut t = Timeline::default();
    /// let now = monotonic_ns();
    /// // One clock read for two stages that happen together.
    /// t.set(Stage::PayloadInPlace, now);
    /// t.set(Stage::Queued, now);
    /// assert_eq!(t.span(Stage::PayloadInPlace, Stage::Queued), Some(0));
    /// ```
    pub fn set(&mut self, stage: Stage, ns: u64) {
        self.stamps[stage as usize] = ns;
    }

    /// The stamp of `stage` (0 if not taken).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Stage, Timeline};
    /// let t = Timeline::default();
    /// assert_eq!(t.get(Stage::ResponseSent), 0); // not taken
    /// ```
    pub fn get(&self, stage: Stage) -> u64 {
        self.stamps[stage as usize]
    }

    /// Nanoseconds from `a` to `b`, or `None` when either is missing or out of order.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Stage, Timeline};
    /// let t = Timeline::from_stamps([100, 0, 160, 200, 900, 950]);
    /// assert_eq!(t.span(Stage::Queued, Stage::ComputeStart), Some(40));
    /// assert_eq!(t.span(Stage::PayloadInPlace, Stage::Queued), None); // missing
    /// assert_eq!(t.span(Stage::ComputeEnd, Stage::Received), None); // out of order
    /// ```
    pub fn span(&self, a: Stage, b: Stage) -> Option<u64> {
        let (x, y) = (self.get(a), self.get(b));
        (x != 0 && y >= x).then(|| y - x)
    }

    /// The 64 wire bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Timeline, TIMELINE_LEN};
    /// let bytes = Timeline::from_stamps([1, 2, 3, 4, 5, 6]).encode();
    /// assert_eq!(bytes.len(), TIMELINE_LEN);
    /// assert_eq!(bytes[8..16], 2u64.to_le_bytes());
    /// assert_eq!(bytes[48..], [0; 16]); // reserved
    /// ```
    pub fn encode(&self) -> [u8; TIMELINE_LEN] {
        let mut b = [0u8; TIMELINE_LEN];
        for (i, s) in self.stamps.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&s.to_le_bytes());
        }
        b
    }

    /// Decodes 64 wire bytes (the reserved stamps must be zero).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Timeline;
    /// let t = Timeline::from_stamps([1, 2, 3, 4, 5, 6]);
    /// assert_eq!(Timeline::decode(&t.encode())?, t);
    /// let mut bad = t.encode();
    /// bad[63] = 1; // a reserved stamp set
    /// assert!(Timeline::decode(&bad).is_err());
    /// assert!(Timeline::decode(&bad[..32]).is_err()); // truncated
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Timeline, WireError> {
        need("timeline", bytes, TIMELINE_LEN)?;
        if bytes[48..64].iter().any(|&b| b != 0) {
            return Err(WireError::malformed("timeline reserved stamps not zero"));
        }
        let mut t = Timeline::default();
        for (i, s) in t.stamps.iter_mut().enumerate() {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            *s = u64::from_le_bytes(a);
        }
        Ok(t)
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock every process on the
/// machine shares, so stamps from a client and an agent can be subtracted).
///
/// # Examples
///
/// ```
/// use wire::monotonic_ns;
/// let a = monotonic_ns();
/// let b = monotonic_ns();
/// assert!(b >= a);
/// ```
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_spans() {
        let t = Timeline::from_stamps([10, 20, 30, 40, 50, 60]);
        assert_eq!(Timeline::decode(&t.encode()).unwrap(), t);
        assert_eq!(t.span(Stage::Received, Stage::ResponseSent), Some(50));
        assert_eq!(
            Timeline::default().span(Stage::Received, Stage::Queued),
            None
        );
    }

    #[test]
    fn monotonic_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
