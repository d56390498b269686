//! Placement between real processes (issue 20): a `tensorwire serve` child
//! is the agent, this test process the shm client, and CPU masks are set
//! from outside with `sched_setaffinity` on every thread of the agent, as
//! `taskset -a -p` would.
//!
//! - agent and client pinned to one CPU: both sides find each other there
//!   and neither may move; the agent's spin CPU word says it is pinned,
//!   both sleep instead of spinning, and every request is answered (a
//!   lost wake-up in that hand-off would hang here);
//! - the agent pinned to one CPU, the client free to move but started on
//!   that CPU: the client ends up on another CPU (it moves itself when it
//!   sees the agent's pinned word; the scheduler may also place it there
//!   first, when the client wakes from a sleep) and its thread's mask is
//!   left as it was; the pinned agent never moves.
//!
//! Which of the two separated them is the scheduler's race, so the moves
//! themselves are checked by the unit tests beside the code
//! (`transport::shm::channel`, `transport::cpu`). Latency is not checked
//! here (benchmarks do that: `scripts/bench-placement.py`).

use client::{Client, TensorRef};
use common::{shm_dir, within, ServeProcess};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use wire::DType;

static SEQ: AtomicU64 = AtomicU64::new(0);
const LIMIT: Duration = Duration::from_secs(60);

/// The tests read this process's move count: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; `sched_getaffinity` fills the one
    // we pass and reads nothing else.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        set
    };
    // SAFETY: reads a bit of the set filled above.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Sets the mask of thread `tid` (0: the calling thread) to `cpus`.
fn set_mask(tid: i32, cpus: &[usize]) {
    // SAFETY: as in `cpus`: a plain-data set, filled and passed by pointer.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "sched_setaffinity({tid}, {cpus:?})");
}

/// Pins every thread the agent has now to `cpus`. Threads it starts later
/// inherit the mask of the thread that starts them.
fn pin_agent(agent: &ServeProcess, cpus: &[usize]) {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", agent.pid())).expect("agent tasks");
    for t in tasks.filter_map(Result::ok) {
        let tid: i32 = t.file_name().to_string_lossy().parse().expect("tid");
        set_mask(tid, cpus);
    }
}

fn current_cpu() -> usize {
    transport::cpu::current()
}

/// An agent on a fresh `shm://` name, pinned to `agent_cpus`.
fn agent(agent_cpus: &[usize]) -> (ServeProcess, String) {
    shm_dir();
    let uri = format!(
        "shm://twp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let p = ServeProcess::spawn(&["--listen", &uri]);
    pin_agent(&p, agent_cpus);
    (p, uri)
}

/// `n` empty requests through the identity model; each must come back.
fn requests(c: &Client, n: usize) {
    let m = c.model("identity").expect("identity");
    let data = [7u8; 64];
    for i in 0..n {
        let t = TensorRef::new(DType::U8, &[64], &data).expect("tensor");
        let out = m.infer(&[t]).unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(out.outputs[0].bytes(), &data[..]);
    }
}

#[test]
fn agent_and_client_pinned_to_one_cpu_hand_over_instead_of_spinning() {
    let _one = one_at_a_time();
    let before = transport::cpu::moves_total();
    let (agent, uri) = agent(&[cpus()[0]]);
    let cpu = cpus()[0];
    within(LIMIT, "requests between two pinned sides", move || {
        set_mask(0, &[cpu]);
        let c = Client::connect(&uri).expect("connect");
        requests(&c, 3000);
        // Neither side may leave the CPU: nobody moved.
        assert_eq!(transport::cpu::moves_total(), before);
    });
    agent.signal(libc::SIGTERM);
    common::wait_until(Duration::from_secs(10), "agent exits", || {
        agent.stderr().contains("stopped (")
    });
    let err = agent.stderr();
    assert!(err.contains("moved off a client's CPU 0 times"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_client_next_to_a_pinned_agent_ends_up_elsewhere_with_its_mask_kept() {
    let _one = one_at_a_time();
    let before = transport::cpu::moves_total();
    let all = cpus();
    if all.len() < 2 {
        eprintln!("skipped: this test needs two CPUs, the process may use {all:?}");
        return;
    }
    let (agent, uri) = agent(&[all[0]]);
    let (moved, off, mask_kept) = within(LIMIT, "a client next to a pinned agent", move || {
        // Connect on the agent's CPU (a thread that blocks may be woken
        // anywhere it may run), then get the full mask back and go on
        // there: the scheduler has no reason to move a running thread.
        set_mask(0, &[all[0]]);
        let c = Client::connect(&uri).expect("connect");
        requests(&c, 100);
        set_mask(0, &all);
        requests(&c, 5000);
        (
            transport::cpu::moves_total() - before,
            current_cpu() != all[0],
            cpus() == all,
        )
    });
    assert!(mask_kept, "the client's mask must be left as it was");
    assert!(off, "the client still polls on the pinned agent's CPU");
    eprintln!("the client moved itself {moved} times (0: the scheduler placed it first)");
    agent.signal(libc::SIGTERM);
    common::wait_until(Duration::from_secs(10), "agent exits", || {
        agent.stderr().contains("stopped (")
    });
    let err = agent.stderr();
    assert!(
        err.contains("moved off a client's CPU 0 times"),
        "a pinned agent moved: {err}"
    );
}
