//! The shared-memory transport (`shm://`; the agent's sessions are in
//! `server::shm_session`, the client's link in `client::shm`): each tenant gets its own sealed memfd [`Arena`], passed over a Unix
//! socket with `SCM_RIGHTS` ([`fdpass`]), so no other process can name or map
//! it; control messages travel through single-producer/single-consumer
//! [`Ring`]s of 64-byte slots inside it; a side with nothing to do sleeps on a
//! [`futex`] word in the arena after spinning briefly.
//!
//! Everything the peer writes into the arena is untrusted: the consumer's
//! ring index is checked before use, slots are copied out before they are validated, and
//! tensor bytes are only ever read as bytes.
//!
//! Beside the transport, [`mirror`] holds the agent's tensor queue memory: a
//! [`TensorRing`] whose memfd is mapped twice back to back, so a batch of
//! back-to-back [`RingSpan`]s is one slice even where it wraps.

pub mod arena;
pub mod channel;
pub mod fdpass;
pub mod futex;
pub mod layout;
pub mod mirror;
pub mod ring;

pub use arena::Arena;
pub use channel::{
    control_path, ShmChannel, ShmError, ShmSizes, ShmYield, WaitPolicy, WantChannel, SLEEP_FUTEX,
    SLEEP_PARKED,
};
pub use layout::Layout;
pub use mirror::{RingSpan, TensorRing};
pub use ring::{Ring, RingError, SLOT_LEN};

/// Test support: signals that interrupt system calls.
#[cfg(test)]
pub(crate) mod signals {
    extern "C" fn ignore(_: libc::c_int) {}

    /// Installs a handler doing nothing for SIGUSR1 (which no other test
    /// in this crate uses), so that a `pthread_kill` with it interrupts a
    /// system call instead of killing the process.
    pub(crate) fn catch_sigusr1() {
        // SAFETY: the sigaction struct is zeroed and then filled as
        // sigaction(2) documents; the handler is async-signal-safe (it does
        // nothing). SA_RESTART is set as most programs set it: the calls
        // under test must survive the signal even so.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
    }

    /// The calling thread, for [`interrupt`].
    pub(crate) fn this_thread() -> libc::pthread_t {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() }
    }

    /// Sends SIGUSR1 to `thread`. A thread that has just ended (its
    /// caller not yet joined it) is not an error.
    pub(crate) fn interrupt(thread: libc::pthread_t) {
        // SAFETY: `thread` is not joined yet (the callers join it after
        // their last call), so its id still names it.
        let _ = unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
    }
}
