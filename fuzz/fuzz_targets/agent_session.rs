//! Fuzz target: structure-aware client sessions. The input decodes (with
//! `arbitrary`) into `server::fuzzing::SessionInput`: Hellos with odd
//! fields, requests with fuzzer-chosen model ids, dtypes, shapes, offsets,
//! lengths, flags, priorities and queue budgets, pipelined; pings, model
//! queries and lists, Releases, raw bytes, hang-ups. They run against a
//! real `AgentCore` serving the built-in identity models (no ONNX Runtime)
//! through the agent's socket session, over a Unix socket pair. Assertions
//! inside report a panic, an answer owed and not given (or out of order,
//! or with another id), a valid identity request not returning its own
//! bytes, and a core that still holds a connection, a request, payload
//! budget or a queued run once the sequence is over.
//!
//! Run from the repository root: `cargo +nightly fuzz run agent_session`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    server::fuzzing::agent_session(data);
});
