//! [`fuzz_decode`]: decode one whole message the way a receiver does.
//!
//! This module exists for the fuzzer (`fuzz/fuzz_targets/decode.rs`) and for
//! the test that replays its corpus in a plain `cargo test`
//! (`crates/wire/tests/fuzz_corpus.rs`), so that both run exactly the same
//! code. It is not how a receiver should be written (a receiver reads the
//! header, checks it, then reads the sections it announces; it never holds an
//! unchecked message in one slice), but every decision it takes is the one a
//! receiver takes, in the same order.

use crate::control::{
    decode_error_body, decode_hello, decode_hello_request, decode_model_list, decode_model_name,
    decode_signature, encode_error_body, encode_hello, encode_hello_as, encode_model_list,
    encode_model_name, encode_signature,
};
use crate::error::WireError;
use crate::header::{flags, Header, Kind, HEADER_LEN};
use crate::limits::Limits;
use crate::tensor::{decode_tensor_section, encode_tensor_section};

/// A deliberately small limits set: every message that passes it must also
/// pass [`Limits::default`].
const SMALL_LIMITS: Limits = Limits {
    max_tensors: 4,
    max_in_flight: 1,
    max_payload: 4096,
    max_desc_len: 512,
};

/// Decodes `bytes` as exactly one message: the 64-byte header, then
/// `desc_len` bytes of descriptor section, then `payload_len` bytes of
/// payload, and nothing after.
///
/// The header is decoded and checked against [`Limits::default`] (and
/// against a small limits set, which must never accept what the defaults
/// reject); the descriptor section is decoded as a tensor section for
/// Request and Response, and with the kind's body decoder otherwise (Ping,
/// Pong and ListModels must have an empty body). Returns the first error a
/// receiver would answer with.
///
/// It never panics on any input, except to report a bug in this crate: a
/// message that decodes must encode back to exactly its bytes, and every
/// tensor a decoded section describes must lie inside the payload. Those
/// checks are assertions so that the fuzzer reports them as crashes.
///
/// # Examples
///
/// ```
/// use wire::{fuzz_decode, Header, Kind};
/// let ping = Header::new(Kind::Ping).encode();
/// assert!(fuzz_decode(&ping).is_ok());
/// assert!(fuzz_decode(&ping[..63]).is_err());
/// assert!(fuzz_decode(b"not a message at all, but long enough to be read as a header.....").is_err());
/// ```
pub fn fuzz_decode(bytes: &[u8]) -> Result<(), WireError> {
    let header = Header::decode(bytes)?;
    assert_eq!(
        header.encode()[..],
        bytes[..HEADER_LEN],
        "a decoded header must re-encode to its own bytes"
    );
    let small = header.check_limits(&SMALL_LIMITS);
    let checked = header.check_limits(&Limits::default());
    assert!(
        small.is_err() || checked.is_ok(),
        "the small limits accepted a header the default limits reject"
    );
    checked?;

    let rest = &bytes[HEADER_LEN..];
    let desc_len = header.desc_len as usize;
    if rest.len() < desc_len {
        return Err(WireError::Truncated {
            what: "descriptor section",
            need: desc_len,
            have: rest.len(),
        });
    }
    let (desc, payload) = rest.split_at(desc_len);

    match header.kind {
        Kind::Request | Kind::Response => {
            let section = decode_tensor_section(&header, desc)?;
            assert_eq!(section.tensors.len(), header.tensor_count as usize);
            assert_eq!(
                section.timeline.is_some(),
                header.flags & flags::HAS_TIMELINE != 0
            );
            let mut again = Vec::with_capacity(desc.len());
            encode_tensor_section(&section.tensors, section.timeline.as_ref(), &mut again);
            assert_eq!(
                again, desc,
                "a decoded tensor section must re-encode to its bytes"
            );
            check_payload(&header, payload)?;
            for t in &section.tensors {
                let end = t.offset.checked_add(t.len);
                assert!(
                    end.is_some_and(|e| e <= header.payload_len),
                    "a decoded tensor lies outside the payload"
                );
                // In bounds by the assertion above and check_payload.
                let _bytes = &payload[t.offset as usize..(t.offset + t.len) as usize];
            }
            return Ok(());
        }
        Kind::Hello => {
            let hello = decode_hello_request(desc)?;
            // The anonymous flag is part of the body: a Hello re-encoded
            // without it would differ from a relay's by that byte.
            assert_eq!(
                encode_hello_as(&hello.limits, hello.token, hello.anonymous),
                desc
            );
        }
        Kind::HelloAck => {
            let limits = decode_hello(desc)?;
            assert_eq!(encode_hello(&limits), desc);
        }
        Kind::ModelQuery => {
            let name = decode_model_name(desc)?;
            assert_eq!(encode_model_name(name), desc);
        }
        Kind::ModelInfo => {
            let sig = decode_signature(desc)?;
            let mut again = Vec::new();
            encode_signature(&sig, &mut again);
            assert_eq!(
                again, desc,
                "a decoded signature must re-encode to its bytes"
            );
        }
        Kind::ModelList => {
            let list = decode_model_list(desc)?;
            assert_eq!(
                encode_model_list(&list),
                desc,
                "a decoded model list must re-encode to its bytes"
            );
        }
        Kind::Error => {
            let message = decode_error_body(desc)?;
            if std::str::from_utf8(desc).is_ok() {
                assert_eq!(encode_error_body(&message), desc);
            }
        }
        Kind::Ping | Kind::Pong | Kind::ListModels | Kind::Release => {
            if !desc.is_empty() {
                return Err(WireError::Malformed(format!(
                    "{:?} has no body, but desc_len is {}",
                    header.kind,
                    desc.len()
                )));
            }
        }
    }
    // Header::decode guarantees control messages announce no payload.
    check_payload(&header, payload)
}

/// The payload must be exactly `payload_len` bytes, with nothing after it.
fn check_payload(header: &Header, payload: &[u8]) -> Result<(), WireError> {
    let have = payload.len() as u64;
    if have < header.payload_len {
        return Err(WireError::Truncated {
            what: "payload",
            need: usize::try_from(header.payload_len).unwrap_or(usize::MAX),
            have: payload.len(),
        });
    }
    if have > header.payload_len {
        return Err(WireError::Malformed(format!(
            "{} bytes after the end of the message",
            have - header.payload_len
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::error::Status;
    use crate::tensor::TensorDesc;

    #[test]
    fn whole_messages() {
        let mut h = Header::new(Kind::Ping);
        h.request_id = 9;
        assert_eq!(fuzz_decode(&h.encode()), Ok(()));
        let mut m = h.encode().to_vec();
        m.push(0);
        assert!(matches!(fuzz_decode(&m), Err(WireError::Malformed(_))));
        h.desc_len = 1;
        let mut m = h.encode().to_vec();
        m.push(0);
        assert!(matches!(fuzz_decode(&m), Err(WireError::Malformed(_))));

        let t = TensorDesc {
            dtype: DType::U8,
            shape: vec![3],
            offset: 0,
            len: 3,
        };
        let mut desc = Vec::new();
        encode_tensor_section(&[t], None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.tensor_count = 1;
        h.desc_len = desc.len() as u32;
        h.payload_len = 3;
        let mut m = h.encode().to_vec();
        m.extend_from_slice(&desc);
        m.extend_from_slice(&[1, 2, 3]);
        assert_eq!(fuzz_decode(&m), Ok(()));
        assert!(matches!(
            fuzz_decode(&m[..m.len() - 1]),
            Err(WireError::Truncated {
                what: "payload",
                ..
            })
        ));

        let mut h = Header::new(Kind::Error);
        h.status = Status::Internal;
        h.desc_len = u32::MAX;
        assert_eq!(
            fuzz_decode(&h.encode()).unwrap_err().status(),
            Status::LimitExceeded
        );
    }
}
