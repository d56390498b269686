//! The fixed 64-byte control header that starts every message.
//!
//! ```text
//! offset size field
//!  0      4   magic         "TWIR"
//!  4      2   version       1
//!  6      1   kind          Kind
//!  7      1   flags         bit 0 WANT_TIMELINE (requests only),
//!                           bit 1 HAS_TIMELINE (responses only),
//!                           bit 2 PULL (shm requests only)
//!  8      8   request_id    chosen by the client, echoed by the agent
//! 16      4   model_id      resolved once per session with ModelQuery
//! 20      4   tensor_count  tensors described in the descriptor section
//! 24      4   desc_len      bytes in the descriptor section
//! 28      4   status        0, except in Error messages (never 0 there)
//! 32      8   payload_len   bytes in the payload
//! 40      4   timeout_us    Request: queue budget in µs (0 = the model's)
//! 44      1   priority      Request: level, 1 = highest (0 = the model's)
//! 45     19   reserved      zero
//! ```

use crate::error::{need, Status, WireError};
use crate::limits::Limits;

/// Length of the header in bytes.
///
/// # Examples
///
/// This, [`MAGIC`] and [`VERSION`]: what every message starts with.
///
/// ```
/// use wire::{Header, Kind, HEADER_LEN, MAGIC, VERSION};
/// let bytes = Header::new(Kind::Ping).encode();
/// assert_eq!(bytes.len(), HEADER_LEN);
/// assert_eq!(bytes[..4], MAGIC);
/// assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), VERSION);
/// let mut other = bytes;
/// other[..4].copy_from_slice(b"HTTP"); // a peer speaking another protocol
/// assert!(Header::decode(&other).is_err());
/// ```
pub const HEADER_LEN: usize = 64;
/// The first four bytes of every message. Example: [`HEADER_LEN`].
pub const MAGIC: [u8; 4] = *b"TWIR";
/// The protocol version this crate speaks. Example: [`HEADER_LEN`].
pub const VERSION: u16 = 1;

/// Header flag bits.
///
/// # Examples
///
/// ```
/// use wire::{flags, Header, Kind};
/// let mut h = Header::new(Kind::Request);
/// h.flags |= flags::WANT_TIMELINE;
/// assert_eq!(h.flags & !flags::KNOWN, 0);
/// let mut unknown = h.encode();
/// unknown[7] |= 0x80; // a flag version 1 does not define
/// assert!(Header::decode(&unknown).is_err());
/// ```
pub mod flags {
    /// Request: the client asks for the agent's timeline in the response.
    /// Example: [the module](self).
    pub const WANT_TIMELINE: u8 = 1 << 0;
    /// Response: a 64-byte timeline follows the tensor descriptors.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{decode_tensor_section, encode_tensor_section, flags, Header, Kind, Timeline};
    /// let mut desc = Vec::new();
    /// encode_tensor_section(&[], Some(&Timeline::from_stamps([1, 2, 3, 4, 5, 6])), &mut desc);
    /// let mut h = Header::new(Kind::Response);
    /// h.flags |= flags::HAS_TIMELINE;
    /// h.desc_len = desc.len() as u32;
    /// let section = decode_tensor_section(&h, &desc)?;
    /// assert_eq!(section.timeline.map(|t| t.stamps[5]), Some(6));
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub const HAS_TIMELINE: u8 = 1 << 1;
    /// Request, shared memory only (PROTOCOL §14.6, "Pulled inputs"): the
    /// descriptor section ends with one u64 per tensor, the address of its
    /// bytes in the client's own memory (0: already in place), and the
    /// agent pulls them into the tensor's slot with `process_vm_readv`.
    /// Sent only to an agent whose arena header advertises it.
    /// Example: [the module](self) (it is one of the [`KNOWN`] flags).
    pub const PULL: u8 = 1 << 2;
    /// All flag bits version 1 defines. Example: [the module](self).
    pub const KNOWN: u8 = WANT_TIMELINE | HAS_TIMELINE | PULL;
}

/// What a message is.
///
/// # Examples
///
/// ```
/// use wire::Kind;
/// assert_eq!(Kind::from_code(3)?, Kind::Request);
/// assert!(Kind::Response.carries_tensors());
/// assert!(!Kind::Ping.carries_tensors());
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Client → agent, first message of a session: proposed limits.
    Hello = 1,
    /// Agent → client: the limits in force for the session.
    HelloAck = 2,
    /// Client → agent: run a model on tensors.
    Request = 3,
    /// Agent → client: a request's outputs.
    Response = 4,
    /// Agent → client: a request (or the session) failed; status says why.
    Error = 5,
    /// Either way: liveness probe, answered with Pong.
    Ping = 6,
    /// Answer to Ping.
    Pong = 7,
    /// Client → agent: look up a model by name.
    ModelQuery = 8,
    /// Agent → client: a model's id and signature.
    ModelInfo = 9,
    /// Client → agent: list every model.
    ListModels = 10,
    /// Agent → client: every model's id and signature.
    ModelList = 11,
    /// Client → agent, shared-memory sessions only: the response with this
    /// `request_id` has been read; its outputs' space may be reused. No reply.
    Release = 12,
}

impl Kind {
    /// The kind with wire code `code`.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Kind, WireError};
    /// assert_eq!(Kind::from_code(6)?, Kind::Ping);
    /// assert!(matches!(Kind::from_code(200), Err(WireError::UnknownKind(200))));
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub fn from_code(code: u8) -> Result<Kind, WireError> {
        use Kind::*;
        [
            Hello, HelloAck, Request, Response, Error, Ping, Pong, ModelQuery, ModelInfo,
            ListModels, ModelList, Release,
        ]
        .get(usize::from(code).wrapping_sub(1))
        .copied()
        .ok_or(WireError::UnknownKind(code))
    }

    /// True for the two kinds that carry tensors.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Kind;
    /// assert!(Kind::Request.carries_tensors());
    /// assert!(!Kind::ModelInfo.carries_tensors());
    /// ```
    pub fn carries_tensors(self) -> bool {
        matches!(self, Kind::Request | Kind::Response)
    }
}

/// A decoded header. Field meanings are in the module documentation.
///
/// # Examples
///
/// ```
/// use wire::{Header, Kind, Limits, HEADER_LEN};
/// let mut h = Header::new(Kind::Request);
/// h.request_id = 42;
/// h.model_id = 1;
/// let bytes: [u8; HEADER_LEN] = h.encode();
/// let back = Header::decode(&bytes)?;
/// assert_eq!(back, h);
/// back.check_limits(&Limits::default())?; // before reading what it announces
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// Flag bits ([`flags`]).
    pub flags: u8,
    /// Request id chosen by the client; responses echo it.
    pub request_id: u64,
    /// Model id (requests and responses, model info); 0 otherwise.
    pub model_id: u32,
    /// Number of tensor descriptors in the descriptor section.
    pub tensor_count: u32,
    /// Length of the descriptor section in bytes.
    pub desc_len: u32,
    /// `Status::Ok` except in `Error` messages.
    pub status: Status,
    /// Length of the payload in bytes.
    pub payload_len: u64,
    /// Request only: how long the request may wait in the model's queue,
    /// in µs from when it enters that queue; past it the request is
    /// answered `timeout` and never computed. 0: the model's default.
    pub timeout_us: u32,
    /// Request only: its priority level, 1 the highest; 0: the model's
    /// default level.
    pub priority: u8,
}

impl Header {
    /// A header of `kind` with every other field zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind, Status};
    /// let h = Header::new(Kind::Ping);
    /// assert_eq!((h.request_id, h.payload_len, h.status), (0, 0, Status::Ok));
    /// ```
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            flags: 0,
            request_id: 0,
            model_id: 0,
            tensor_count: 0,
            desc_len: 0,
            status: Status::Ok,
            payload_len: 0,
            timeout_us: 0,
            priority: 0,
        }
    }

    /// The 64 wire bytes of this header.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind, MAGIC};
    /// let mut h = Header::new(Kind::Ping);
    /// h.request_id = 7;
    /// let b = h.encode();
    /// assert_eq!(b[..4], MAGIC);
    /// assert_eq!(b[8..16], 7u64.to_le_bytes());
    /// ```
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = self.flags;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.model_id.to_le_bytes());
        b[20..24].copy_from_slice(&self.tensor_count.to_le_bytes());
        b[24..28].copy_from_slice(&self.desc_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.status.code().to_le_bytes());
        b[32..40].copy_from_slice(&self.payload_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.timeout_us.to_le_bytes());
        b[44] = self.priority;
        b
    }

    /// Decodes a header, checking magic, version, kind, flags, status and the
    /// reserved bytes. Lengths are checked separately by [`Header::check_limits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind, WireError};
    /// let b = Header::new(Kind::Pong).encode();
    /// assert_eq!(Header::decode(&b)?.kind, Kind::Pong);
    /// assert!(matches!(Header::decode(b"GET / HTTP/1.1\r\n"), Err(_)));
    /// let mut bad = b;
    /// bad[0] = b'X';
    /// assert!(matches!(Header::decode(&bad), Err(WireError::BadMagic(_))));
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Header, WireError> {
        // Every message pays for this function, so its failures are built
        // out of line (`bad_header`): the checks stay a few compares.
        need("header", bytes, HEADER_LEN)?;
        let magic: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        let kind = Kind::from_code(bytes[6])?;
        let flags = bytes[7];
        // WANT_TIMELINE belongs on requests and HAS_TIMELINE on responses only:
        // a HAS_TIMELINE request would make the receiver expect a timeline in
        // the client's descriptor section.
        let allowed = match kind {
            Kind::Request => flags::WANT_TIMELINE | flags::PULL,
            Kind::Response => flags::HAS_TIMELINE,
            _ => 0,
        };
        if flags & !allowed != 0 {
            return Err(bad_header(BadHeader::Flags(kind, flags)));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(a)
        };
        // Two words and a mask, not 19 bytes one at a time: every message
        // pays this. Bytes 40..45 are the request's scheduling fields.
        if (u64_at(40) & !0xff_ffff_ffff) | u64_at(48) | u64_at(56) != 0 {
            return Err(WireError::ReservedNotZero);
        }
        let status_code = u32_at(28);
        let status = Status::from_code(status_code).ok_or(WireError::UnknownStatus(status_code))?;
        let h = Header {
            kind,
            flags,
            request_id: u64_at(8),
            model_id: u32_at(16),
            tensor_count: u32_at(20),
            desc_len: u32_at(24),
            status,
            payload_len: u64_at(32),
            timeout_us: u32_at(40),
            priority: bytes[44],
        };
        if !kind.carries_tensors() && (h.tensor_count != 0 || h.payload_len != 0) {
            return Err(bad_header(BadHeader::Tensors(&h)));
        }
        if (kind == Kind::Error) == (status == Status::Ok) {
            return Err(bad_header(BadHeader::Status(kind, status)));
        }
        if kind != Kind::Request && (h.timeout_us != 0 || h.priority != 0) {
            return Err(bad_header(BadHeader::Scheduling(&h)));
        }
        Ok(h)
    }

    /// Checks every length and count against `limits`. Call this before
    /// allocating or reading anything the header announces.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind, Limits, Status};
    /// let mut h = Header::new(Kind::Request);
    /// h.payload_len = 1 << 40;
    /// let e = h.check_limits(&Limits::default()).unwrap_err();
    /// assert_eq!(e.status(), Status::LimitExceeded);
    /// ```
    pub fn check_limits(&self, limits: &Limits) -> Result<(), WireError> {
        let over = |what, value: u64, limit: u64| {
            if value > limit {
                Err(WireError::LimitExceeded { what, value, limit })
            } else {
                Ok(())
            }
        };
        over(
            "tensor count",
            self.tensor_count.into(),
            limits.max_tensors.into(),
        )?;
        over(
            "descriptor section length",
            self.desc_len.into(),
            limits.max_desc_len.into(),
        )?;
        over("payload length", self.payload_len, limits.max_payload)
    }
}

/// What [`Header::decode`] found wrong, turned into its error out of line.
enum BadHeader<'a> {
    /// Flag bits unknown, or not valid on this kind.
    Flags(Kind, u8),
    /// Tensors declared by a kind that carries none.
    Tensors(&'a Header),
    /// A status on a kind that is not Error, or an Error with status ok.
    Status(Kind, Status),
    /// A timeout or priority on a kind that is not Request.
    Scheduling(&'a Header),
}

#[cold]
#[inline(never)]
fn bad_header(bad: BadHeader<'_>) -> WireError {
    match bad {
        BadHeader::Flags(_, flags) if flags & !flags::KNOWN != 0 => {
            WireError::malformed(format!("unknown flag bits {flags:#04x}"))
        }
        BadHeader::Flags(kind, flags) => {
            WireError::malformed(format!("flag bits {flags:#04x} are not valid on {kind:?}"))
        }
        BadHeader::Tensors(h) => WireError::malformed(format!(
            "{:?} carries no tensors but declares {} tensors and {} payload bytes",
            h.kind, h.tensor_count, h.payload_len
        )),
        BadHeader::Status(Kind::Error, _) => WireError::malformed("Error message with status ok"),
        BadHeader::Status(kind, status) => {
            WireError::malformed(format!("{kind:?} with non-zero status {status}"))
        }
        BadHeader::Scheduling(h) => WireError::malformed(format!(
            "{:?} with a timeout ({} µs) or priority ({}): only requests carry them",
            h.kind, h.timeout_us, h.priority
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            kind: Kind::Request,
            flags: flags::WANT_TIMELINE,
            request_id: 0x0102030405060708,
            model_id: 7,
            tensor_count: 2,
            desc_len: 80,
            status: Status::Ok,
            payload_len: 4160,
            timeout_us: 2500,
            priority: 2,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn rejects_bad_fields() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(WireError::BadMagic(_))));
        let mut b = good;
        b[4] = 2;
        assert_eq!(Header::decode(&b), Err(WireError::UnsupportedVersion(2)));
        let mut b = good;
        b[6] = 0;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(0)));
        let mut b = good;
        b[7] = 0x80;
        assert!(matches!(Header::decode(&b), Err(WireError::Malformed(_))));
        let mut b = good;
        b[63] = 1;
        assert_eq!(Header::decode(&b), Err(WireError::ReservedNotZero));
        assert!(matches!(
            Header::decode(&good[..63]),
            Err(WireError::Truncated { .. })
        ));
        let mut b = good;
        b[28] = 99;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownStatus(99)));
    }

    #[test]
    fn only_requests_carry_a_timeout_and_priority() {
        // Every reserved byte after the scheduling fields is checked.
        for i in 45..64 {
            let mut b = sample().encode();
            b[i] = 1;
            assert_eq!(
                Header::decode(&b),
                Err(WireError::ReservedNotZero),
                "byte {i}"
            );
        }
        let mut h = sample();
        h.kind = Kind::Response;
        h.flags = flags::HAS_TIMELINE;
        let e = Header::decode(&h.encode()).expect_err("a response with a priority");
        assert!(e.to_string().contains("only requests"), "{e}");
        h.timeout_us = 0;
        h.priority = 0;
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut b = sample().encode();
        b[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        b[44] = 255;
        let d = Header::decode(&b).expect("any value of the fields");
        assert_eq!((d.timeout_us, d.priority), (u32::MAX, 255));
    }

    #[test]
    fn each_bad_header_says_what_is_wrong() {
        let text = |h: &Header, b: Option<(usize, u8)>| {
            let mut bytes = h.encode();
            if let Some((i, v)) = b {
                bytes[i] = v;
            }
            match Header::decode(&bytes) {
                Err(WireError::Malformed(m)) => m,
                other => panic!("expected Malformed, got {other:?}"),
            }
        };
        let req = Header::new(Kind::Request);
        assert_eq!(text(&req, Some((7, 0x80))), "unknown flag bits 0x80");
        assert_eq!(
            text(&req, Some((7, flags::HAS_TIMELINE))),
            "flag bits 0x02 are not valid on Request"
        );
        let mut ping = Header::new(Kind::Ping);
        ping.tensor_count = 1;
        assert_eq!(
            text(&ping, None),
            "Ping carries no tensors but declares 1 tensors and 0 payload bytes"
        );
        let mut resp = Header::new(Kind::Response);
        resp.status = Status::EngineError;
        assert_eq!(
            text(&resp, None),
            format!("Response with non-zero status {}", Status::EngineError)
        );
        assert_eq!(
            text(&Header::new(Kind::Error), None),
            "Error message with status ok"
        );
    }

    #[test]
    fn flags_and_status_checked_per_kind() {
        let mut h = Header::new(Kind::Request);
        h.flags = flags::HAS_TIMELINE;
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Malformed(_))
        ));
        let mut h = Header::new(Kind::Response);
        h.flags = flags::WANT_TIMELINE;
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Malformed(_))
        ));
        let mut h = Header::new(Kind::Ping);
        h.flags = flags::WANT_TIMELINE;
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Malformed(_))
        ));
        let h = Header::new(Kind::Error);
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Malformed(_))
        ));
        let mut h = Header::new(Kind::Error);
        h.status = Status::UnknownModel;
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn control_messages_carry_no_payload() {
        let mut h = Header::new(Kind::Ping);
        h.payload_len = 1;
        assert!(Header::decode(&h.encode()).is_err());
    }

    #[test]
    fn limits_checked() {
        let limits = Limits {
            max_tensors: 1,
            ..Limits::default()
        };
        let err = sample().check_limits(&limits).unwrap_err();
        assert_eq!(err.status(), Status::LimitExceeded);
        let mut h = sample();
        h.payload_len = u64::MAX;
        assert!(h.check_limits(&Limits::default()).is_err());
    }
}
