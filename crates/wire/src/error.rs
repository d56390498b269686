//! Status codes carried in headers, and the decoder's own error type.

use thiserror::Error;

/// A status code: `0` in every successful message, an error code in `Error`
/// messages. Codes are stable wire values; see `docs/PROTOCOL.md`.
///
/// # Examples
///
/// ```
/// use wire::Status;
/// assert_eq!(Status::from_code(6), Some(Status::UnknownModel));
/// assert_eq!(Status::UnknownModel.code(), 6);
/// assert_eq!(Status::UnknownModel.to_string(), "unknown-model");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The header's magic bytes were not `TWIR`.
    BadMagic = 1,
    /// The header's version is not one this peer speaks.
    UnsupportedVersion = 2,
    /// The header's kind is unknown, or not valid in this direction or state.
    UnknownKind = 3,
    /// A field is malformed: reserved bytes set, bad descriptor, bad body.
    Malformed = 4,
    /// A length or count exceeds the session's limits.
    LimitExceeded = 5,
    /// No model has this id or name.
    UnknownModel = 6,
    /// The tensors do not match the model's signature (count, dtype or shape).
    InvalidInput = 7,
    /// The engine failed while running the model.
    EngineError = 8,
    /// The agent is shutting down and accepts no new requests.
    ShuttingDown = 9,
    /// Too many requests are in flight on this session.
    TooManyInFlight = 10,
    /// An internal error in the agent (a bug: please report it).
    Internal = 11,
    /// The request's queue budget (its `timeout_us`, or the model's
    /// default) ran out before it was admitted: it was never computed.
    Timeout = 12,
    /// The model's queue is full (`max_queue` requests wait already): the
    /// request was refused at once, never queued.
    Overloaded = 13,
    /// The session's tenant may not do this: call or see this model, or
    /// connect with this token (see the agent's tenants file).
    PermissionDenied = 14,
    /// The agent behind a gateway cannot be reached (down, restarting, or
    /// not answering): the request was not computed, or its answer was
    /// lost with the upstream session. Retry later, on a new session.
    Unavailable = 15,
}

impl Status {
    /// The status with wire code `code`, if it is one.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Status;
    /// assert_eq!(Status::from_code(0), Some(Status::Ok));
    /// assert_eq!(Status::from_code(999), None);
    /// ```
    pub fn from_code(code: u32) -> Option<Status> {
        use Status::*;
        [
            Ok,
            BadMagic,
            UnsupportedVersion,
            UnknownKind,
            Malformed,
            LimitExceeded,
            UnknownModel,
            InvalidInput,
            EngineError,
            ShuttingDown,
            TooManyInFlight,
            Internal,
            Timeout,
            Overloaded,
            PermissionDenied,
            Unavailable,
        ]
        .get(code as usize)
        .copied()
    }

    /// The wire code.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Status;
    /// assert_eq!(Status::Overloaded.code(), 13);
    /// ```
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// A short name (`unknown-model`, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Status;
    /// assert_eq!(Status::PermissionDenied.name(), "permission-denied");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::BadMagic => "bad-magic",
            Status::UnsupportedVersion => "unsupported-version",
            Status::UnknownKind => "unknown-kind",
            Status::Malformed => "malformed",
            Status::LimitExceeded => "limit-exceeded",
            Status::UnknownModel => "unknown-model",
            Status::InvalidInput => "invalid-input",
            Status::EngineError => "engine-error",
            Status::ShuttingDown => "shutting-down",
            Status::TooManyInFlight => "too-many-in-flight",
            Status::Internal => "internal",
            Status::Timeout => "timeout",
            Status::Overloaded => "overloaded",
            Status::PermissionDenied => "permission-denied",
            Status::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes could not be decoded, or a message breaks a limit.
///
/// # Examples
///
/// ```
/// use wire::{Header, Status, WireError};
/// let e = Header::decode(&[0u8; 10]).unwrap_err(); // fewer than 64 bytes
/// assert!(matches!(e, WireError::Truncated { .. }));
/// assert_eq!(e.status(), Status::Malformed); // what the peer is answered
/// ```
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// The magic bytes are wrong: the stream is not tensorwire (or lost sync).
    #[error("bad magic {0:02x?}{text}: not a tensorwire v1 stream", text = as_text(.0))]
    BadMagic([u8; 4]),
    /// The protocol version is not 1.
    #[error("unsupported protocol version {0} (this peer speaks 1)")]
    UnsupportedVersion(u16),
    /// The message kind is unknown.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// Reserved header bytes were not zero.
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    /// The status field holds no known code.
    #[error("unknown status code {0}")]
    UnknownStatus(u32),
    /// A dtype code is unknown.
    #[error("unknown dtype code {0}")]
    UnknownDType(u8),
    /// Fewer bytes than the structure needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A length or count is over the session limit.
    #[error("{what} is {value}, over the session limit of {limit}")]
    LimitExceeded {
        /// Which length or count.
        what: &'static str,
        /// The value in the message.
        value: u64,
        /// The limit in force.
        limit: u64,
    },
    /// A structural rule was broken; the string says which.
    #[error("malformed message: {0}")]
    Malformed(String),
}

impl WireError {
    /// The status code an agent answers this error with.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{Header, Kind, Status};
    /// let mut b = Header::new(Kind::Ping).encode();
    /// b[4] = 9; // version 9
    /// assert_eq!(Header::decode(&b).unwrap_err().status(), Status::UnsupportedVersion);
    /// ```
    pub fn status(&self) -> Status {
        match self {
            WireError::BadMagic(_) => Status::BadMagic,
            WireError::UnsupportedVersion(_) => Status::UnsupportedVersion,
            WireError::UnknownKind(_) => Status::UnknownKind,
            WireError::LimitExceeded { .. } => Status::LimitExceeded,
            _ => Status::Malformed,
        }
    }

    pub(crate) fn malformed(msg: impl Into<String>) -> WireError {
        WireError::Malformed(msg.into())
    }
}

/// Checks that `bytes` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, bytes: &[u8], need: usize) -> Result<(), WireError> {
    if bytes.len() < need {
        Err(WireError::Truncated {
            what,
            need,
            have: bytes.len(),
        })
    } else {
        Ok(())
    }
}

/// ` ("HTTP")` when the bytes are printable ASCII — what a peer speaking
/// another protocol usually sends first — else nothing.
fn as_text(bytes: &[u8; 4]) -> String {
    if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!(" (\"{}\")", String::from_utf8_lossy(bytes))
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip() {
        for c in 0..16 {
            assert_eq!(Status::from_code(c).unwrap().code(), c);
        }
        assert!(Status::from_code(16).is_none());
    }

    /// A peer speaking another protocol is named by what it sent.
    #[test]
    fn bad_magic_shows_text_when_it_is_text() {
        assert_eq!(
            WireError::BadMagic(*b"HTTP").to_string(),
            "bad magic [48, 54, 54, 50] (\"HTTP\"): not a tensorwire v1 stream"
        );
        assert_eq!(
            WireError::BadMagic([0x16, 3, 1, 0]).to_string(),
            "bad magic [16, 03, 01, 00]: not a tensorwire v1 stream"
        );
    }
}
