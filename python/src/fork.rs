//! The fork generation: a counter a `pthread_atfork` child handler bumps.
//!
//! A client made before `fork()` shares its shm rings and socket with the
//! parent; the child writing to them would corrupt the parent's session.
//! Every object remembers the generation it was made in: a call from a
//! later one raises `ForkedError`, and dropping it in a later one forgets
//! its Rust half (no message sent, no arena block freed) instead of
//! running its destructor. One atomic load per call: cheaper than
//! `getpid()`, which is a system call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    // Async-signal-safe: one atomic add.
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers the child handler, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only bumps an atomic, which is
        // async-signal-safe as the child of a multi-threaded fork requires.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        debug_assert_eq!(rc, 0);
    });
}

/// The process's fork generation now.
pub fn now() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// True when `made` (a generation recorded at creation) is this process's.
pub fn same_process(made: u64) -> bool {
    now() == made
}
