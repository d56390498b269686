//! [`HeadWatch`]: whether an HTTP/2 connection is in the middle of a
//! request head, read from the bytes the server reads — what lets the gRPC
//! door give a head the deadline the HTTP door's hyper gives its own
//! (`header_read_timeout`, the agent's `stall_timeout_ms`).
//!
//! hyper's HTTP/2 server has no such deadline: a client that sends a
//! HEADERS frame without END_HEADERS and then trickles CONTINUATION frames
//! (or the bytes of one frame) holds the connection for as long as it
//! likes. The watch follows only the framing (RFC 9113 §4.1: a 9-byte
//! header — 24-bit length, type, flags, stream — then the payload), never
//! decodes a header block, and keeps a few counters: it costs a pass over
//! the frame headers, not over payloads. A head is *pending* from the
//! first byte of the connection preface, of a HEADERS or CONTINUATION
//! frame, or of any frame header, until that preface, frame header or
//! header block (END_HEADERS) is complete. DATA and every other frame's
//! payload may take as long as the client needs (a large request body on
//! a slow link is not a stalled head).

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types whose payload is part of a request head.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// HEADERS / CONTINUATION flag: the header block ends with this frame.
const END_HEADERS: u8 = 0x4;

/// Follows a connection's HTTP/2 framing as its bytes are read (see the
/// module docs; examples in its unit tests: the type is the crate's own).
#[derive(Debug, Default)]
pub(crate) struct HeadWatch {
    /// Preface bytes seen (24 when whole).
    preface: usize,
    /// The frame header being read, and how much of it.
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    /// Whether the current frame's payload is a head's (HEADERS or
    /// CONTINUATION).
    head_frame: bool,
    /// A header block is open: HEADERS without END_HEADERS seen, its last
    /// CONTINUATION not yet.
    block_open: bool,
}

impl HeadWatch {
    /// Takes in bytes read from the connection, in order.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        if self.preface < PREFACE.len() {
            // Not checked against the preface: hyper refuses a wrong one.
            let n = (PREFACE.len() - self.preface).min(bytes.len());
            self.preface += n;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == 9 {
                self.header_len = 0;
                let h = self.header;
                let len = u64::from(h[0]) << 16 | u64::from(h[1]) << 8 | u64::from(h[2]);
                let (kind, flags) = (h[3], h[4]);
                self.head_frame = kind == HEADERS || kind == CONTINUATION;
                if self.head_frame {
                    self.block_open = flags & END_HEADERS == 0;
                }
                self.payload_left = len;
            }
        }
        if self.payload_left == 0 {
            self.head_frame = false;
        }
    }

    /// Whether a request head has begun and is not complete: the preface,
    /// a frame header, a HEADERS or CONTINUATION frame, or a header block
    /// awaiting its END_HEADERS.
    pub(crate) fn head_pending(&self) -> bool {
        (self.preface > 0 && self.preface < PREFACE.len())
            || self.header_len > 0
            || self.head_frame
            || self.block_open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn heads_are_pending_until_whole_and_bodies_never() {
        let mut w = HeadWatch::default();
        assert!(!w.head_pending(), "nothing read yet");
        w.feed(&PREFACE[..5]);
        assert!(w.head_pending(), "half a preface");
        w.feed(&PREFACE[5..]);
        assert!(!w.head_pending());
        // SETTINGS, whole.
        w.feed(&frame(0x4, 0, &[0; 6]));
        assert!(!w.head_pending());
        // A whole HEADERS frame with END_HEADERS: a complete head.
        w.feed(&frame(HEADERS, END_HEADERS, b"abc"));
        assert!(!w.head_pending());
        // HEADERS without END_HEADERS, then CONTINUATION frames.
        w.feed(&frame(HEADERS, 0, b"abc"));
        assert!(w.head_pending(), "block open");
        w.feed(&frame(CONTINUATION, 0, b"de"));
        assert!(w.head_pending(), "still open");
        let last = frame(CONTINUATION, END_HEADERS, b"fgh");
        for (i, b) in last.iter().enumerate() {
            w.feed(&[*b]);
            assert_eq!(
                w.head_pending(),
                i + 1 < last.len(),
                "byte {i} of the last frame"
            );
        }
        // A DATA frame's payload trickling is not a head.
        let data = frame(0x0, 0, &[7; 100]);
        w.feed(&data[..9]);
        assert!(!w.head_pending(), "a body may take its time");
        w.feed(&data[9..50]);
        assert!(!w.head_pending());
        w.feed(&data[50..]);
        // Half a frame header is pending, whatever the frame.
        w.feed(&[0, 0]);
        assert!(w.head_pending());
        w.feed(&[1, 0x8, 0, 0, 0, 0, 1, 9]); // WINDOW_UPDATE... with its 1-byte payload
        assert!(!w.head_pending());
    }

    #[test]
    fn frames_split_anywhere_are_followed() {
        let mut bytes = PREFACE.to_vec();
        for _ in 0..3 {
            bytes.extend(frame(HEADERS, 0, &[1; 40]));
            bytes.extend(frame(CONTINUATION, END_HEADERS, &[2; 300]));
            bytes.extend(frame(0x0, 0x1, &[3; 70_000 % 16_384]));
        }
        for chunk in [1, 2, 7, 9, 10, 64, 1000, bytes.len()] {
            let mut w = HeadWatch::default();
            for c in bytes.chunks(chunk) {
                w.feed(c);
            }
            assert!(!w.head_pending(), "chunks of {chunk}");
        }
    }
}
