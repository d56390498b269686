//! The shared-memory floor: request/response ping-pong between two processes
//! over one shared mapping, by **spinning**, with no tensorwire code in the
//! path and no system call per round trip.
//!
//! `tensorwire ping --raw shm` runs this; it is the best case of the shm
//! transport (a peer that is already spinning when the request arrives), just
//! as `--raw unix|tcp` ([`crate::raw`]) is the floor of the socket transports.
//! Payload bytes stay in place in the shm transport, so what a round trip
//! costs here is the notification alone: one cache line carried to the peer
//! and one carried back.
//!
//! The mapping is one page of a file in a fresh private temporary directory
//! (under `/dev/shm` when it exists). Three `AtomicU64` words live in it, each
//! on its own cache line, 128 bytes apart (so that an adjacent-line prefetcher
//! pairing 64-byte lines cannot couple them either):
//!
//! * the **request** word (offset 0), written by the client: the sequence
//!   number `i + 1` of round trip `i`, or [`STOP`] to end;
//! * the **response** word (offset 128), written by the echo peer: a copy of
//!   each request it saw;
//! * the **ready** word (offset 256), set by the peer once it has mapped the
//!   page (and pinned itself), so process start-up is not timed.
//!
//! This module owns both ends:
//!
//! * [`run_shm_ping`], the client: it creates the file, starts the echo peer,
//!   waits for it to be ready, then times `warmup + iterations` round trips:
//!   store `i + 1` to the request word (`Release`), spin until the response
//!   word changes (`Acquire`), and check it is `i + 1`.
//! * [`serve_shm_echo`], the peer (behind the hidden `tensorwire raw-echo
//!   --shm PATH`): spin on the request word and copy every new value into the
//!   response word, until [`STOP`].
//!
//! Nothing here can hang. Every wait spins with a deadline (the clock is read
//! once every [`CHECK_EVERY`] spins, so the fast path reads no clock): no
//! change within [`SPIN_TIMEOUT`] is a `TimedOut` error. At the same points
//! the client checks that its peer is still running, and a child peer checks
//! that its parent is (a changed parent pid means it died). A child peer is
//! killed and reaped on every exit path of the client.

use crate::child::{copy_command, describe, ChildPeer};
use memmap2::{MmapOptions, MmapRaw};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::hint;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// How long any single wait may last: for the peer to become ready, for a
/// response, for the next request. Hitting it is an error, never a hang.
pub const SPIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Spins between two looks at the clock (and at the other side's liveness).
pub const CHECK_EVERY: u32 = 1024;

/// The request value that ends the echo peer.
pub const STOP: u64 = u64::MAX;

/// Bytes mapped: one page.
pub const MAP_LEN: usize = 4096;

/// Offset of the request word (client → peer).
const REQ: usize = 0;
/// Offset of the response word (peer → client), on another cache line.
const RESP: usize = 128;
/// Offset of the ready word (set by the peer once mapped).
const READY: usize = 256;
/// The value the peer stores to the ready word ("twshmrdy").
const READY_MAGIC: u64 = u64::from_le_bytes(*b"twshmrdy");

/// The name of the file in the temporary directory.
const FILE_NAME: &str = "ping.shm";

/// What [`run_shm_ping`] measures.
#[derive(Clone, Debug)]
pub struct ShmOptions {
    /// Timed round trips (returned).
    pub iterations: usize,
    /// Untimed round trips first (not returned).
    pub warmup: usize,
}

/// The arguments that follow `tensorwire raw-echo` to start a peer on the
/// mapping file `path`: `--shm PATH`.
///
/// [`run_shm_ping`] appends these to the command it is given, so that command
/// should be the program and the subcommand name (and any `--cpu N`) only.
pub fn echo_args(path: &Path) -> Vec<OsString> {
    vec!["--shm".into(), path.as_os_str().to_owned()]
}

/// Runs the echo peer on the mapping file `path` (created and sized by the
/// client): maps it, marks itself ready, then copies every new request value
/// into the response word until the request is [`STOP`] (`Ok(())`). An error
/// when the file is not a regular file of at least [`MAP_LEN`] bytes, when no
/// new request arrives within [`SPIN_TIMEOUT`], or when this process's parent
/// changes (the client died).
pub fn serve_shm_echo(path: &Path) -> io::Result<()> {
    let shared = Shared::open(path)?;
    let parent = std::os::unix::process::parent_id();
    echo_on(&shared, SPIN_TIMEOUT, &mut || {
        if std::os::unix::process::parent_id() == parent {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client process is gone",
            ))
        }
    })
}

/// Measures `opts.warmup + opts.iterations` round trips over a fresh shared
/// mapping and returns the round-trip time of each of the last
/// `opts.iterations`, in nanoseconds, in order.
///
/// The echo peer is `echo_cmd` with [`echo_args`] appended (its program,
/// arguments, explicitly set environment and working directory are copied;
/// its stdin and stdout are null, its stderr inherited), or, with `None`, a
/// thread of this process that maps the same file. The file lives in a fresh
/// private temporary directory (under `/dev/shm` when it exists), removed as
/// soon as the peer has it mapped (and in any case on return).
///
/// Every response must be the sequence number just sent, or the run fails
/// with `InvalidData`. Any wait longer than [`SPIN_TIMEOUT`] fails with
/// `TimedOut`; a peer that exits early fails the run as soon as it is seen
/// (within [`CHECK_EVERY`] spins). A child peer is killed and reaped on every
/// path; on success it must have exited cleanly.
pub fn run_shm_ping(opts: &ShmOptions, echo_cmd: Option<&Command>) -> io::Result<Vec<u64>> {
    run_with_timeout(opts, echo_cmd, SPIN_TIMEOUT)
}

fn run_with_timeout(
    opts: &ShmOptions,
    echo_cmd: Option<&Command>,
    timeout: Duration,
) -> io::Result<Vec<u64>> {
    let total = opts
        .warmup
        .checked_add(opts.iterations)
        .filter(|&t| (t as u64) < STOP)
        .ok_or_else(|| invalid_input("warmup + iterations is too large"))?;
    let mut samples = Vec::new();
    samples
        .try_reserve_exact(opts.iterations)
        .map_err(|_| invalid_input(format!("cannot hold {} samples", opts.iterations)))?;

    // Declared before the peer so that, on an early error, it is removed
    // after the peer is gone.
    let dir = temp_dir()?;
    let path = dir.path().join(FILE_NAME);
    let shared = Shared::create(&path)?;
    // Dropped before `shared` and (declared later) before the peer: whatever
    // happens, the peer is told to stop.
    let _stop = StopOnDrop(shared.word(REQ));

    match echo_cmd {
        Some(base) => {
            let mut cmd = copy_command(base);
            cmd.args(echo_args(&path))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let mut peer = ChildPeer::spawn(cmd, "raw shm ping")?;
            let mut alive = || peer.check_running();
            wait_ready(&shared, timeout, &mut alive)?;
            unlink_when_mapped(&dir);
            let samples = ping_loop(&shared, opts.warmup, total, samples, timeout, &mut alive)?;
            shared.word(REQ).store(STOP, Ordering::Release);
            peer.finish()?;
            Ok(samples)
        }
        None => {
            let echo_path = path.clone();
            let echo = thread::Builder::new().name("raw-shm-echo".into()).spawn(
                move || -> io::Result<()> {
                    let shared = Shared::open(&echo_path)?;
                    echo_on(&shared, timeout, &mut || Ok(()))
                },
            )?;
            let mut alive = || {
                if echo.is_finished() {
                    Err(io::Error::other(
                        "raw shm ping: the echo thread ended early",
                    ))
                } else {
                    Ok(())
                }
            };
            // On an error the thread is left to end by itself: it sees STOP
            // (written on drop), or gives up after `timeout`.
            let result = wait_ready(&shared, timeout, &mut alive).and_then(|()| {
                unlink_when_mapped(&dir);
                ping_loop(&shared, opts.warmup, total, samples, timeout, &mut alive)
            });
            let samples = match result {
                Ok(s) => s,
                Err(e) if echo.is_finished() => {
                    // The thread's own error says more than "ended early".
                    return match echo.join() {
                        Ok(Err(te)) => Err(context(te, "echo thread")),
                        _ => Err(e),
                    };
                }
                Err(e) => return Err(e),
            };
            shared.word(REQ).store(STOP, Ordering::Release);
            match echo.join() {
                Ok(r) => r.map_err(|e| context(e, "echo thread"))?,
                Err(_) => return Err(io::Error::other("raw shm ping: the echo thread panicked")),
            }
            Ok(samples)
        }
    }
}

/// A fresh private (mode 0700) temporary directory, under `/dev/shm` when it
/// exists and accepts one, else under the system temporary directory.
fn temp_dir() -> io::Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix("tensorwire-raw-shm-");
    let dev_shm = Path::new("/dev/shm");
    if dev_shm.is_dir() {
        if let Ok(d) = b.tempdir_in(dev_shm) {
            return Ok(d);
        }
    }
    b.tempdir()
}

/// Once both sides have the page mapped, the file and its directory are no
/// longer needed: removing them now leaves nothing behind in `/dev/shm` even
/// if the client is killed. (A failure is left to `TempDir`'s drop.)
fn unlink_when_mapped(dir: &tempfile::TempDir) {
    let _ = std::fs::remove_dir_all(dir.path());
}

/// The client's loop: `total` round trips; keeps the times of those after
/// the first `warmup`. `alive` is called every [`CHECK_EVERY`] spins and
/// fails the run when the peer is gone.
fn ping_loop(
    shared: &Shared,
    warmup: usize,
    total: usize,
    mut samples: Vec<u64>,
    timeout: Duration,
    alive: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<Vec<u64>> {
    let req = shared.word(REQ);
    let resp = shared.word(RESP);
    for i in 0..total {
        let seq = i as u64 + 1;
        let t0 = Instant::now();
        req.store(seq, Ordering::Release);
        // The stale value is the previous sequence number; anything else is
        // the answer (checked below).
        let got = spin_until(resp, |v| v != seq - 1, timeout, alive)
            .map_err(|e| context(e, &format!("response to round trip {i}")))?;
        let dt = t0.elapsed();
        if got != seq {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("raw shm ping: round trip {i} sent {seq} and got {got} back"),
            ));
        }
        if i >= warmup {
            samples.push(u64::try_from(dt.as_nanos()).unwrap_or(u64::MAX));
        }
    }
    Ok(samples)
}

/// The peer's loop: mark ready, then copy each new request value into the
/// response word until [`STOP`] (which is copied too).
fn echo_on(
    shared: &Shared,
    timeout: Duration,
    alive: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let req = shared.word(REQ);
    let resp = shared.word(RESP);
    shared.word(READY).store(READY_MAGIC, Ordering::Release);
    let mut last = 0;
    loop {
        let v = spin_until(req, |v| v != last, timeout, alive)
            .map_err(|e| context(e, "raw shm echo: waiting for a request"))?;
        resp.store(v, Ordering::Release);
        if v == STOP {
            return Ok(());
        }
        last = v;
    }
}

/// Waits until the peer has marked the mapping ready. Not timed, so it sleeps
/// between looks instead of spinning (the peer may still be starting on the
/// same CPU).
fn wait_ready(
    shared: &Shared,
    timeout: Duration,
    alive: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let ready = shared.word(READY);
    let deadline = Instant::now() + timeout;
    loop {
        if ready.load(Ordering::Acquire) == READY_MAGIC {
            return Ok(());
        }
        alive()?;
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "raw shm ping: the echo peer was not ready within {}s",
                    timeout.as_secs_f64()
                ),
            ));
        }
        thread::sleep(Duration::from_micros(100));
    }
}

/// Spins until `done(word)` and returns that value. Every [`CHECK_EVERY`]
/// spins it reads the clock (the deadline is set at the first such look, so
/// a quick answer costs no clock read) and calls `alive`. `TimedOut` after
/// `timeout` (plus at most [`CHECK_EVERY`] spins).
fn spin_until(
    word: &AtomicU64,
    mut done: impl FnMut(u64) -> bool,
    timeout: Duration,
    alive: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<u64> {
    let mut spins: u32 = 0;
    let mut deadline: Option<Instant> = None;
    loop {
        let v = word.load(Ordering::Acquire);
        if done(v) {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(CHECK_EVERY) {
            let now = Instant::now();
            if now >= *deadline.get_or_insert(now + timeout) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no change within {}s", timeout.as_secs_f64()),
                ));
            }
            alive()?;
        }
        hint::spin_loop();
    }
}

/// One shared page, accessed only through the atomic words in it.
struct Shared {
    map: MmapRaw,
}

impl Shared {
    /// Creates `path` (which must not exist), sizes it to [`MAP_LEN`] zero
    /// bytes and maps it shared.
    fn create(path: &Path) -> io::Result<Shared> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| context(e, &format!("create {}", path.display())))?;
        file.set_len(MAP_LEN as u64)?;
        Shared::map(&file)
    }

    /// Opens the existing `path`, which must be a regular file of at least
    /// [`MAP_LEN`] bytes, and maps its first [`MAP_LEN`] bytes shared.
    fn open(path: &Path) -> io::Result<Shared> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| context(e, &format!("open {}", path.display())))?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() < MAP_LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "raw shm: {} is not a regular file of at least {MAP_LEN} bytes",
                    path.display()
                ),
            ));
        }
        Shared::map(&file)
    }

    fn map(file: &File) -> io::Result<Shared> {
        // `MmapRaw` hands out raw pointers only (no `&[u8]` over memory the
        // peer writes), which is why mapping it is safe to call.
        let map = MmapOptions::new().len(MAP_LEN).map_raw(file)?;
        if map.len() < MAP_LEN {
            return Err(io::Error::other("raw shm: the mapping is too short"));
        }
        Ok(Shared { map })
    }

    /// The `AtomicU64` at byte `offset` (a multiple of 64, in bounds).
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(64) && offset + 8 <= MAP_LEN,
            "bad word offset {offset}"
        );
        // SAFETY: the mapping is page-aligned and at least `MAP_LEN` bytes
        // long (checked in `map`), so `offset` (a multiple of 64, asserted
        // in bounds) is an 8-byte-aligned address of 8 mapped bytes; the
        // mapping lives as long as `self`, which the reference borrows.
        // `AtomicU64` has the size and bit validity of `u64`, and every byte
        // of the page is only ever accessed through atomics, here and in the
        // peer, so there is no non-atomic race. The file is in a private
        // (0700) directory created by the client and sized before the peer
        // opens it; nobody truncates it while it is mapped (which would make
        // an access fault, not read garbage).
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }
}

/// Stores [`STOP`] to the request word when dropped, so a peer thread ends
/// promptly on every exit path of the client.
struct StopOnDrop<'a>(&'a AtomicU64);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(STOP, Ordering::Release);
    }
}

fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("raw shm ping: {}", msg.into()),
    )
}

/// `e` with `what` in front, keeping its kind.
fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl ChildPeer {
    /// An error if the child has exited (it never should before [`STOP`]).
    fn check_running(&mut self) -> io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err(io::Error::other("raw shm ping: no echo peer"));
        };
        match child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                self.child = None;
                Err(io::Error::other(format!(
                    "raw shm ping: the echo peer exited early ({})",
                    describe(status)
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(iterations: usize, warmup: usize) -> ShmOptions {
        ShmOptions { iterations, warmup }
    }

    fn fresh() -> (tempfile::TempDir, std::path::PathBuf, Shared) {
        let dir = temp_dir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let shared = Shared::create(&path).unwrap();
        (dir, path, shared)
    }

    /// The whole protocol with the peer on a thread: 10 000 round trips, each
    /// checked by `ping_loop` to return exactly its own sequence number.
    #[test]
    fn ping_in_thread() {
        let s = run_shm_ping(&opts(10_000, 100), None).unwrap();
        assert_eq!(s.len(), 10_000);
        assert!(s.iter().all(|&ns| ns > 0));
    }

    #[test]
    fn zero_iterations_and_overflow() {
        assert!(run_shm_ping(&opts(0, 0), None).unwrap().is_empty());
        assert!(run_shm_ping(&opts(0, 3), None).unwrap().is_empty());
        for (n, w) in [(1, usize::MAX), (usize::MAX, 0)] {
            let e = run_shm_ping(&opts(n, w), None).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
    }

    /// A peer that is ready but never answers: an error within the deadline.
    #[test]
    fn silent_peer_times_out() {
        let (_dir, _path, shared) = fresh();
        shared.word(READY).store(READY_MAGIC, Ordering::Release);
        let t0 = Instant::now();
        let e = ping_loop(
            &shared,
            0,
            5,
            Vec::new(),
            Duration::from_millis(200),
            &mut || Ok(()),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// A peer that answers with the wrong value is caught.
    #[test]
    fn wrong_answer_is_invalid_data() {
        let (_dir, path, shared) = fresh();
        let liar = thread::spawn(move || {
            let s = Shared::open(&path).unwrap();
            let (req, resp) = (s.word(REQ), s.word(RESP));
            let v = spin_until(req, |v| v != 0, SPIN_TIMEOUT, &mut || Ok(())).unwrap();
            resp.store(v + 7, Ordering::Release);
        });
        let e = ping_loop(&shared, 0, 3, Vec::new(), SPIN_TIMEOUT, &mut || Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        liar.join().unwrap();
    }

    /// A peer that dies mid-run: seen through `alive`, long before the deadline.
    #[test]
    fn dead_peer_is_seen_before_the_deadline() {
        let (_dir, _path, shared) = fresh();
        let t0 = Instant::now();
        let mut calls = 0;
        let e = ping_loop(&shared, 0, 5, Vec::new(), SPIN_TIMEOUT, &mut || {
            calls += 1;
            if calls < 3 {
                Ok(())
            } else {
                Err(io::Error::other("gone"))
            }
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Other, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// The echo side driven by hand: copies every request, ends on STOP.
    #[test]
    fn echo_copies_until_stop() {
        let (_dir, path, shared) = fresh();
        let echo = thread::spawn(move || {
            let s = Shared::open(&path).unwrap();
            echo_on(&s, SPIN_TIMEOUT, &mut || Ok(()))
        });
        wait_ready(&shared, SPIN_TIMEOUT, &mut || Ok(())).unwrap();
        let (req, resp) = (shared.word(REQ), shared.word(RESP));
        for v in [1u64, 2, 3, 1000, 5] {
            req.store(v, Ordering::Release);
            let got = spin_until(resp, |r| r == v, SPIN_TIMEOUT, &mut || Ok(())).unwrap();
            assert_eq!(got, v);
        }
        req.store(STOP, Ordering::Release);
        echo.join().unwrap().unwrap();
        assert_eq!(resp.load(Ordering::Acquire), STOP);
    }

    /// The echo side gives up without requests, and when its client is gone.
    #[test]
    fn echo_gives_up() {
        let (_dir, _path, shared) = fresh();
        let t0 = Instant::now();
        let e = echo_on(&shared, Duration::from_millis(100), &mut || Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));

        let (_dir, _path, shared) = fresh();
        let e = echo_on(&shared, SPIN_TIMEOUT, &mut || {
            Err(io::Error::new(io::ErrorKind::BrokenPipe, "parent gone"))
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
    }

    #[test]
    fn open_rejects_short_or_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, [0u8; 100]).unwrap();
        let e = Shared::open(&short).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = Shared::open(&dir.path().join("missing")).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(serve_shm_echo(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn words_are_on_separate_cache_lines() {
        let (_dir, _path, shared) = fresh();
        let addr = |o| shared.word(o) as *const AtomicU64 as usize;
        assert_eq!(addr(REQ) % 64, 0);
        assert!(addr(RESP) / 64 != addr(REQ) / 64);
        assert!(addr(READY) / 64 != addr(RESP) / 64);
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        // The echo arguments appended after the script become $0, $1.
        c.arg("-c").arg(script);
        c
    }

    /// Misbehaving child peers: every case is an error, promptly, and leaves
    /// no child behind.
    #[test]
    fn child_peer_failures_are_errors_not_hangs() {
        let quick = Duration::from_millis(300);
        let cases = [
            // Never becomes ready (never answers).
            ("exec sleep 30", io::ErrorKind::TimedOut),
            // Exits without becoming ready.
            ("exit 3", io::ErrorKind::Other),
        ];
        for (script, kind) in cases {
            let t0 = Instant::now();
            let e = run_with_timeout(&opts(10, 0), Some(&sh(script)), quick).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(5), "{script}: too slow");
            assert_eq!(e.kind(), kind, "{script}: {e}");
        }
        let e =
            run_shm_ping(&opts(1, 0), Some(&Command::new("/nonexistent/tensorwire"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn args_for_the_echo_subcommand() {
        assert_eq!(
            echo_args(Path::new("/dev/shm/x/ping.shm")),
            ["--shm", "/dev/shm/x/ping.shm"]
        );
    }
}
