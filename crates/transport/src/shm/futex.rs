//! Sleeping and waking on a 32-bit word in shared memory (cross-process
//! futexes: not the `PRIVATE` variant, which only works within a process).

use rustix::thread::futex;
use std::io;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout`. Returns early on a
/// wake, a signal, or if the word already differs (all normal: the caller
/// re-checks its condition).
///
/// # Examples
///
/// A sleeper that waits for a word to change, and the thread that changes
/// it and wakes it:
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use transport::shm::futex;
/// let word = Arc::new(AtomicU32::new(0));
/// let waker = {
///     let w = word.clone();
///     std::thread::spawn(move || -> std::io::Result<()> {
///         std::thread::sleep(Duration::from_millis(10));
///         w.store(1, Ordering::Release);
///         futex::wake(&w, 1)?;
///         Ok(())
///     })
/// };
/// for _ in 0..1000 { // bounded: each wait ends within 100 ms
///     if word.load(Ordering::Acquire) != 0 { break; }
///     futex::wait(&word, 0, Some(Duration::from_millis(100)))?;
/// }
/// assert_eq!(word.load(Ordering::Acquire), 1);
/// waker.join().unwrap()?;
///
/// // A word that already differs returns at once:
/// futex::wait(&word, 0, None)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> io::Result<()> {
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match futex::wait(word, futex::Flags::empty(), expected, ts.as_ref()) {
        Ok(()) => Ok(()),
        Err(e)
            if e == rustix::io::Errno::AGAIN
                || e == rustix::io::Errno::INTR
                || e == rustix::io::Errno::TIMEDOUT =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Wakes up to `n` sleepers on `word`; returns how many woke.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::AtomicU32;
/// let word = AtomicU32::new(0);
/// assert_eq!(transport::shm::futex::wake(&word, 1)?, 0); // nobody sleeps on it
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// Waking a sleeper: [`wait`].
pub fn wake(word: &AtomicU32, n: u32) -> io::Result<usize> {
    Ok(futex::wake(word, futex::Flags::empty(), n)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Arena;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_on_wake_and_on_timeout() {
        let arena = Arc::new(Arena::create("tw-futex", 4096).unwrap());
        let word = arena.atomic_u32(0);
        let t = Instant::now();
        wait(word, 0, Some(Duration::from_millis(20))).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(15));
        // Value differs: returns at once.
        word.store(1, Ordering::Release);
        wait(word, 0, Some(Duration::from_secs(5))).unwrap();
        // A waker in another thread through a second mapping of the memfd.
        let other = Arena::open(arena.fd().try_clone_to_owned().unwrap(), None).unwrap();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            other.atomic_u32(0).store(2, Ordering::Release);
            wake(other.atomic_u32(0), 1).unwrap();
        });
        let t = Instant::now();
        while word.load(Ordering::Acquire) == 1 {
            wait(word, 1, Some(Duration::from_secs(5))).unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(4));
        h.join().unwrap();
    }
}
