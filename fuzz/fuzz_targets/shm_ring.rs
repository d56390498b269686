//! Fuzz target: a hostile shared-memory client. `server::fuzzing::shm_ring`
//! bootstraps a real shm session (Hello on a control socket, the sealed
//! memfd arena passed back), then lays the input into the arena — messages
//! published through the request ring, words written straight into the
//! rings, the header page and the data area — and runs the agent's session
//! over it. Assertions inside report a panic, an answer owed and not given
//! (or given twice, or with another id), a tensor pointed at outside the
//! data area or an aliased one outside the client region, a session that
//! does not end once its client hangs up, or anything left held in the core.
//!
//! Run from the repository root: `cargo +nightly fuzz run shm_ring`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    server::fuzzing::shm_ring(data);
});
