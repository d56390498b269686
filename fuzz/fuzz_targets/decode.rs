//! Fuzz target: the input is one wire message (header, descriptor section,
//! payload). `wire::fuzz_decode` decodes the header, checks it against the
//! default limits and a small limits set, decodes the descriptor section
//! (the tensor section for Request and Response, the kind's control body
//! otherwise) and checks the payload length. It must never panic: errors are
//! the expected outcome for most inputs, and the assertions inside it
//! (decoded messages re-encode to the same bytes, tensors lie inside the
//! payload) report decoder bugs as crashes.
//!
//! Run from the repository root: `cargo +nightly fuzz run decode`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = wire::fuzz_decode(data);
});
