//! [`Reactor`]: the agent's worker threads, and the connections that wait
//! without one.
//!
//! A connection that is waiting — for its Hello, or between requests once
//! its session has gone quiet — is *parked*: its [`Task`] (the session's
//! state and buffers) sits in a table and its descriptor in one epoll set,
//! armed one-shot for "readable or hung up". It holds no thread. Workers
//! wait in `epoll_wait` themselves, so when a parked connection becomes
//! readable the kernel wakes one worker and that worker runs the task on
//! the spot: the same single wake-up a thread blocked in `read` would have
//! cost, and no hand-off between threads. The task then serves the
//! connection for as long as it stays busy (spinning briefly between
//! requests, as sessions always did) and parks again when it goes quiet.
//! A busy connection keeps its worker exactly as it used to keep a thread
//! of its own; an idle one costs its memory and its descriptor only.
//!
//! One-shot arming is what makes this safe without locks around a task:
//! an armed descriptor is reported to one worker, and is not armed again
//! until that worker has put the task back in the table.
//!
//! **Pool size.** The pool grows only while every worker is *stuck*: when
//! a worker takes the last waiting place, a monitor thread (asleep
//! otherwise) looks again after [`GROW_AFTER`]; if no worker has come back
//! to `epoll_wait` meanwhile, it starts one more (up to `max_workers`), and
//! so on while they stay stuck. Workers that cycle through many short tasks
//! (a burst of hang-ups, say) keep coming back and get no help they do not
//! need; a ready connection waits at most about [`GROW_AFTER`] behind long
//! ones. A worker about to wait for something other than its connection
//! (a request waiting in its model's queue, or in a batch) calls
//! [`will_block`]: if no other worker waits for connections, one more
//! starts at once rather than after [`GROW_AFTER`], so the requests a batch
//! is made of can all be read. A worker that waits for tasks while
//! [`spare`] others already wait exits after [`SURPLUS_RETIRE`] without
//! one (a pool grown for a load keeps its workers while the load lasts,
//! instead of starting them again for every batch), and one with nothing
//! to do for [`RETIRE_AFTER`] exits too, down to [`MIN_WORKERS`].

use rustix::event::epoll::{self, Event, EventData, EventFlags};
use rustix::event::{eventfd, EventfdFlags};
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Workers kept even when there is nothing to do.
pub const MIN_WORKERS: usize = 2;
/// A worker that waited this long without a task exits (above
/// [`MIN_WORKERS`]).
pub const RETIRE_AFTER: Duration = Duration::from_secs(10);
/// How long every worker must have been busy, with none coming back to
/// wait, before the pool grows by one.
pub const GROW_AFTER: Duration = Duration::from_micros(100);
/// A worker beyond the [`spare`] ones waiting for tasks exits after this
/// long without one.
pub const SURPLUS_RETIRE: Duration = Duration::from_millis(200);

thread_local! {
    /// The pool this thread works for (workers only).
    static POOL: std::cell::RefCell<std::sync::Weak<Inner>> =
        const { std::cell::RefCell::new(std::sync::Weak::new()) };
}

/// Called by a worker about to block on something other than its
/// connection (the model's queue): when no other worker waits for ready
/// connections, starts one now, so ready connections are not left
/// unread while this one waits. Does nothing on other threads.
pub fn will_block() {
    let Some(inner) = POOL.with(|p| p.borrow().upgrade()) else {
        return;
    };
    // A worker started for an earlier call and not yet waiting counts as
    // waiting: a burst of blocking requests starts one, not one each.
    if inner.waiting.load(Ordering::SeqCst) + inner.starting.load(Ordering::SeqCst) != 0
        || inner.closing.load(Ordering::SeqCst)
    {
        return;
    }
    // Reserve the place under the cap first, so concurrent callers (and
    // the monitor) cannot overshoot it.
    let mut n = inner.workers.load(Ordering::SeqCst);
    loop {
        if n >= inner.max_workers {
            return;
        }
        match inner
            .workers
            .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    inner.starting.fetch_add(1, Ordering::SeqCst);
    if let Err(e) = Inner::spawn_reserved(&inner, true) {
        eprintln!("tensorwire agent: cannot start a worker thread: {e}");
    }
}

/// Workers that may wait for tasks at once: one that finishes a task while
/// this many others wait exits at once (the minimum plus one per CPU).
pub fn spare() -> usize {
    MIN_WORKERS + std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How long dropping a reactor waits for its workers to finish their tasks.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// The epoll key of the stop signal (task keys start at 1).
const STOP_KEY: u64 = 0;

/// What a task does when its worker runs it.
pub trait Task: Send {
    /// The descriptor whose readability (or hang-up) means there is work.
    fn fd(&self) -> BorrowedFd<'_>;
    /// Works until there is nothing more to do without waiting.
    fn run(&mut self) -> Step;
}

/// How a [`Task::run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for its descriptor: park it until it is readable.
    Park,
    /// Finished: drop it (its connection closes).
    Done,
}

/// Counters of a reactor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReactorStats {
    /// Worker threads alive now.
    pub workers: usize,
    /// Tasks parked now (connections waiting with no thread).
    pub parked: usize,
}

/// The worker pool and its epoll set. Dropping it stops the workers and
/// drops every parked task.
pub struct Reactor {
    inner: Arc<Inner>,
}

struct Inner {
    epoll: OwnedFd,
    stop: OwnedFd,
    closing: AtomicBool,
    parked: Mutex<HashMap<u64, Box<dyn Task>>>,
    next_key: AtomicU64,
    workers: AtomicUsize,
    waiting: AtomicUsize,
    /// Workers started by [`will_block`] that have not reached their
    /// first wait yet.
    starting: AtomicUsize,
    /// Times a worker went back to waiting (the monitor's sign of life).
    returns: AtomicU64,
    max_workers: usize,
    spare: usize,
    retire_after: Duration,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Set (and the monitor woken) when the last waiting worker took a task.
    busy: Mutex<bool>,
    busy_cv: Condvar,
    monitor: Mutex<Option<JoinHandle<()>>>,
}

/// `epoll::add` or `epoll::modify`.
type Ctl = fn(&OwnedFd, BorrowedFd<'_>, EventData, EventFlags) -> rustix::io::Result<()>;

fn interest() -> EventFlags {
    EventFlags::IN | EventFlags::RDHUP | EventFlags::ONESHOT
}

impl Reactor {
    /// Starts [`MIN_WORKERS`] workers; the pool may grow to `max_workers`.
    pub fn new(max_workers: usize) -> std::io::Result<Reactor> {
        Reactor::with_retire(max_workers, RETIRE_AFTER)
    }

    /// As [`Reactor::new`], with idle workers retiring after `retire_after`
    /// (tests).
    fn with_retire(max_workers: usize, retire_after: Duration) -> std::io::Result<Reactor> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        // Level-triggered and never re-armed: once written, every worker
        // that waits sees it and leaves.
        epoll::add(&epoll, &stop, EventData::new_u64(STOP_KEY), EventFlags::IN)?;
        let inner = Arc::new(Inner {
            epoll,
            stop,
            closing: AtomicBool::new(false),
            parked: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(STOP_KEY + 1),
            workers: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            starting: AtomicUsize::new(0),
            returns: AtomicU64::new(0),
            max_workers: max_workers.max(MIN_WORKERS),
            spare: spare(),
            retire_after,
            handles: Mutex::new(Vec::new()),
            busy: Mutex::new(false),
            busy_cv: Condvar::new(),
            monitor: Mutex::new(None),
        });
        // Dropped on an error below, it stops what was started.
        let reactor = Reactor { inner };
        let inner = &reactor.inner;
        for _ in 0..MIN_WORKERS {
            Inner::spawn_worker(inner)?;
        }
        let me = inner.clone();
        let monitor = std::thread::Builder::new()
            .name("tw-pool-monitor".into())
            .spawn(move || me.monitor())?;
        *inner.monitor.lock().unwrap_or_else(|p| p.into_inner()) = Some(monitor);
        Ok(reactor)
    }

    /// Parks a new task: it runs when its descriptor becomes readable (at
    /// once if it already is).
    pub fn add(&self, task: Box<dyn Task>) -> std::io::Result<()> {
        let key = self.inner.next_key.fetch_add(1, Ordering::Relaxed);
        self.inner
            .arm(key, task, |e, f, d, i| epoll::add(e, f, d, i))
    }

    /// Workers alive and tasks parked now.
    pub fn stats(&self) -> ReactorStats {
        ReactorStats {
            workers: self.inner.workers.load(Ordering::Relaxed),
            parked: self.inner.lock().len(),
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&self.inner.stop, &1u64.to_ne_bytes());
        {
            let _busy = self.inner.busy.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.busy_cv.notify_all();
        }
        let monitor = self
            .inner
            .monitor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(m) = monitor {
            let _ = m.join();
        }
        // Workers finish the task in hand first. A task that does not end
        // (a model still running, say) is left to finish on its own, as
        // shutdown's grace period already ran out: the wait is bounded.
        let handles =
            std::mem::take(&mut *self.inner.handles.lock().unwrap_or_else(|p| p.into_inner()));
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while handles.iter().any(|h| !h.is_finished()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for h in handles.into_iter().filter(|h| h.is_finished()) {
            let _ = h.join();
        }
        // Parked tasks drop here, closing their connections.
        let parked = std::mem::take(&mut *self.inner.lock());
        drop(parked);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Box<dyn Task>>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn_worker(inner: &Arc<Inner>) -> std::io::Result<()> {
        inner.workers.fetch_add(1, Ordering::SeqCst);
        Inner::spawn_reserved(inner, false)
    }

    /// Starts a worker whose place in `workers` is already counted (given
    /// back if the thread cannot be started); `starting`: it is counted in
    /// `starting` too, until its first wait.
    fn spawn_reserved(inner: &Arc<Inner>, starting: bool) -> std::io::Result<()> {
        let me = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("tw-worker".into())
            .spawn(move || me.work(starting));
        match spawned {
            Ok(h) => {
                let mut handles = inner.handles.lock().unwrap_or_else(|p| p.into_inner());
                // Keep the list short: finished (retired) workers go.
                handles.retain(|h| !h.is_finished());
                handles.push(h);
                Ok(())
            }
            Err(e) => {
                inner.workers.fetch_sub(1, Ordering::SeqCst);
                if starting {
                    inner.starting.fetch_sub(1, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    /// One worker: wait for a ready task, run it, park or drop it, repeat.
    fn work(self: Arc<Self>, mut starting: bool) {
        POOL.with(|p| *p.borrow_mut() = Arc::downgrade(&self));
        // A worker started from a turn that runs in a tenant's cgroup
        // began there too: it serves everyone, so it starts at home.
        crate::tenants::cgroup::start_at_home();
        let timespec = |d: Duration| rustix::time::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        };
        let idle = timespec(self.retire_after);
        let surplus = timespec(self.retire_after.min(SURPLUS_RETIRE));
        let mut events = [Event {
            flags: EventFlags::empty(),
            data: EventData::new_u64(STOP_KEY),
        }];
        loop {
            let others = self.waiting.fetch_add(1, Ordering::SeqCst);
            if std::mem::take(&mut starting) {
                self.starting.fetch_sub(1, Ordering::SeqCst);
            }
            self.returns.fetch_add(1, Ordering::Relaxed);
            let timeout = if others >= self.spare {
                &surplus
            } else {
                &idle
            };
            // One event per wait: a worker never holds on to a ready
            // connection that another worker could be serving.
            let n = epoll::wait(&self.epoll, &mut events[..], Some(timeout));
            let still_waiting = self.waiting.fetch_sub(1, Ordering::SeqCst) - 1;
            if self.closing.load(Ordering::SeqCst) {
                break;
            }
            match n {
                // Nothing for `retire_after` (or, beyond the spare
                // workers, for `SURPLUS_RETIRE`): leave, unless this was the
                // last worker waiting (the others are busy and would have
                // nobody to notice the next connection).
                Ok(0) if still_waiting > 0 && self.retire() => return,
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    eprintln!("tensorwire agent: epoll_wait failed: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
            let key = events[0].data.u64();
            if key == STOP_KEY {
                break;
            }
            if still_waiting == 0 {
                // Nobody is left to notice the next ready connection: the
                // monitor adds a worker if this one and the others stay busy.
                self.pool_busy();
            }
            let Some(mut task) = self.lock().remove(&key) else {
                continue;
            };
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run()))
                .unwrap_or(Step::Done);
            match step {
                Step::Park if !self.closing.load(Ordering::SeqCst) => self.repark(key, task),
                _ => {
                    let _ = epoll::delete(&self.epoll, task.fd());
                    drop(task);
                }
            }
        }
        self.workers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes the monitor (once) because every worker is taken.
    fn pool_busy(&self) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if !*busy {
            *busy = true;
            self.busy_cv.notify_one();
        }
    }

    /// The monitor: asleep until the pool is fully taken, then adds a worker
    /// every [`GROW_AFTER`] during which no worker came back to wait.
    fn monitor(self: Arc<Self>) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            while !*busy && !self.closing.load(Ordering::SeqCst) {
                busy = self.busy_cv.wait(busy).unwrap_or_else(|p| p.into_inner());
            }
            if self.closing.load(Ordering::SeqCst) {
                return;
            }
            drop(busy);
            loop {
                let seen = self.returns.load(Ordering::Relaxed);
                std::thread::sleep(GROW_AFTER);
                if self.closing.load(Ordering::SeqCst) {
                    return;
                }
                if self.waiting.load(Ordering::SeqCst) > 0 {
                    break;
                }
                let stuck = self.returns.load(Ordering::Relaxed) == seen;
                if self.workers.load(Ordering::SeqCst) >= self.max_workers {
                    // At the cap: nothing to add; look again, but rarely.
                    std::thread::sleep(Duration::from_millis(10));
                } else if stuck {
                    if let Err(e) = Inner::spawn_worker(&self) {
                        eprintln!("tensorwire agent: cannot start a worker thread: {e}");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
            busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
            // A worker that took the last place after the look above found
            // `busy` still set and did not wake us: look again.
            *busy = self.waiting.load(Ordering::SeqCst) == 0;
        }
    }

    /// Puts `task` back and re-arms its descriptor.
    fn repark(&self, key: u64, task: Box<dyn Task>) {
        // On failure the task is dropped and its connection closes.
        let _ = self.arm(key, task, |e, f, d, i| epoll::modify(e, f, d, i));
    }

    /// Puts `task` in the table under `key` and arms its own descriptor
    /// (with `ctl`: add or modify). The table stays locked across both, so
    /// a worker that gets the event finds the task there. (Arming a `dup`
    /// would not do: epoll keys a registration by descriptor number.)
    fn arm(&self, key: u64, task: Box<dyn Task>, ctl: Ctl) -> std::io::Result<()> {
        let mut parked = self.lock();
        ctl(&self.epoll, task.fd(), EventData::new_u64(key), interest())?;
        parked.insert(key, task);
        Ok(())
    }

    /// A worker that timed out leaves if the pool is above its minimum.
    fn retire(&self) -> bool {
        let mut n = self.workers.load(Ordering::SeqCst);
        while n > MIN_WORKERS {
            match self
                .workers
                .compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;

    /// Echoes what it reads, one byte at a time, and parks in between.
    struct Echo {
        sock: UnixStream,
        runs: Arc<AtomicUsize>,
    }

    impl Task for Echo {
        fn fd(&self) -> BorrowedFd<'_> {
            self.sock.as_fd()
        }
        fn run(&mut self) -> Step {
            self.runs.fetch_add(1, Ordering::SeqCst);
            self.sock.set_nonblocking(true).unwrap();
            let mut b = [0u8; 16];
            loop {
                match self.sock.read(&mut b) {
                    Ok(0) => return Step::Done,
                    Ok(n) => {
                        self.sock.set_nonblocking(false).unwrap();
                        self.sock.write_all(&b[..n]).unwrap();
                        self.sock.set_nonblocking(true).unwrap();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Park,
                    Err(_) => return Step::Done,
                }
            }
        }
    }

    /// Parks `n` echo tasks; returns their peers and the tasks' run count.
    fn echoes(r: &Reactor, n: usize) -> (Vec<UnixStream>, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let clients = (0..n)
            .map(|_| {
                let (a, b) = UnixStream::pair().unwrap();
                r.add(Box::new(Echo {
                    sock: b,
                    runs: runs.clone(),
                }))
                .unwrap();
                a
            })
            .collect();
        (clients, runs)
    }

    #[test]
    fn many_parked_connections_hold_no_thread_and_are_served_when_they_speak() {
        let r = Reactor::new(64).unwrap();
        let (mut clients, runs) = echoes(&r, 500);
        let s = r.stats();
        assert_eq!(s.parked, 500);
        assert!(s.workers <= MIN_WORKERS + 1, "{s:?}");
        // Every tenth speaks, twice: answered each time, and parked again
        // in between (waited for, so the second byte cannot be read by the
        // run that answered the first: each round costs a run of its own).
        let parked_again = || {
            let t = std::time::Instant::now();
            while r.stats().parked < 500 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            r.stats().parked
        };
        for round in 0..2u8 {
            for c in clients.iter_mut().step_by(10) {
                c.write_all(&[round]).unwrap();
                let mut b = [9u8];
                c.read_exact(&mut b).unwrap();
                assert_eq!(b[0], round);
            }
            assert_eq!(parked_again(), 500);
            assert!(runs.load(Ordering::SeqCst) >= 50 * (round as usize + 1));
        }
        // Hang-ups end their tasks.
        clients.truncate(100);
        let t = std::time::Instant::now();
        while r.stats().parked > 100 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(r.stats().parked, 100);
    }

    /// Blocks in `run` until told to go on.
    struct Busy {
        sock: UnixStream,
        started: mpsc::Sender<()>,
        go: Arc<Mutex<mpsc::Receiver<()>>>,
    }

    impl Task for Busy {
        fn fd(&self) -> BorrowedFd<'_> {
            self.sock.as_fd()
        }
        fn run(&mut self) -> Step {
            let _ = self.started.send(());
            let _ = self.go.lock().unwrap().recv();
            Step::Done
        }
    }

    /// Parks `n` tasks that block in `run` until released, makes each
    /// ready and waits until all of them run (so `n` workers are stuck);
    /// returns their peers and the sender that releases them (one send each).
    fn stuck(r: &Reactor, n: usize) -> (Vec<UnixStream>, mpsc::Sender<()>) {
        let (started_tx, started) = mpsc::channel();
        let (go_tx, go) = mpsc::channel();
        let go = Arc::new(Mutex::new(go));
        let mut peers = Vec::new();
        for _ in 0..n {
            let (a, b) = UnixStream::pair().unwrap();
            r.add(Box::new(Busy {
                sock: b,
                started: started_tx.clone(),
                go: go.clone(),
            }))
            .unwrap();
            (&a).write_all(b"x").unwrap();
            peers.push(a);
        }
        for i in 0..n {
            started
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("task {i} never ran"));
        }
        (peers, go_tx)
    }

    #[test]
    fn a_busy_task_never_holds_up_another() {
        // More blocking tasks than the pool starts with: it grows.
        let r = Reactor::new(64).unwrap();
        let (_peers, go) = stuck(&r, MIN_WORKERS + 3);
        assert!(r.stats().workers > MIN_WORKERS);
        for _ in 0..(MIN_WORKERS + 3) {
            go.send(()).unwrap();
        }
    }

    #[test]
    fn a_burst_of_short_tasks_does_not_grow_the_pool() {
        let r = Reactor::new(4096).unwrap();
        let (clients, _runs) = echoes(&r, 2000);
        // 2000 hang-ups at once: each task reads EOF and ends.
        drop(clients);
        let t = std::time::Instant::now();
        let mut peak = 0;
        while r.stats().parked > 0 && t.elapsed() < Duration::from_secs(20) {
            peak = peak.max(r.stats().workers);
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(r.stats().parked, 0);
        // Workers came back between tasks: growth is for stuck workers.
        // (A loaded machine can stall a cycling worker past GROW_AFTER now
        // and then, hence some slack.)
        assert!(
            peak < 64,
            "the pool grew to {peak} for a burst of short tasks"
        );
    }

    #[test]
    fn the_last_waiting_worker_does_not_retire() {
        // Every worker but one stuck in long tasks, and the one left idle
        // past its retirement time: it must stay, or nobody would notice the
        // next connection (the monitor only wakes when a worker takes the
        // last place).
        let r = Reactor::with_retire(64, Duration::from_millis(30)).unwrap();
        let (_peers, go) = stuck(&r, MIN_WORKERS);
        std::thread::sleep(Duration::from_millis(300));
        let mut c = echoes(&r, 1).0.remove(0);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"z").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b)
            .expect("served while the others are stuck");
        for _ in 0..MIN_WORKERS {
            go.send(()).unwrap();
        }
    }

    #[test]
    fn a_panicking_task_is_dropped_and_the_worker_goes_on() {
        struct Panics(UnixStream);
        impl Task for Panics {
            fn fd(&self) -> BorrowedFd<'_> {
                self.0.as_fd()
            }
            fn run(&mut self) -> Step {
                panic!("task failed");
            }
        }
        let r = Reactor::new(4).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        r.add(Box::new(Panics(b))).unwrap();
        (&a).write_all(b"x").unwrap();
        // Its socket closes when the task is dropped: the peer reads EOF
        // (or a reset: the byte it sent was never read).
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 1];
        match (&a).read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("expected the connection closed, got {other:?}"),
        }
        // Still serving.
        let mut c = echoes(&r, 1).0.remove(0);
        c.write_all(b"y").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"y");
    }
}
