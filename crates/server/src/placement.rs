//! Where a session's worker runs relative to its client.
//!
//! A shared-memory session's worker and its client both spin while the
//! session is busy; on the same CPU they can only take turns (each yields
//! to the other: ~8 µs a round trip instead of ~0.5). A pooled worker is
//! *woken* by its client's write, and the scheduler tends to run a woken
//! thread where its waker ran (wake-affine), so a session would often start
//! on its client's CPU and stay there until the load balancer separates
//! them (a millisecond or two here: enough to put 1 % of a short run at
//! ~8 µs). [`step_off_client_cpu`] is run when a worker takes up a session:
//! if the client last ran on this CPU, the worker moves to another of the
//! CPUs it may use, once, and leaves its mask as it was — the scheduler
//! stays free to place it later, and a user's own pinning (a mask of one
//! CPU, or one that the client's CPU is not in) is never overridden.
//!
//! The client's CPU is what `/proc/PID/stat` says of its main thread (pid
//! from `SO_PEERCRED`): exact for a single-threaded client, a guess for a
//! client that calls from another thread (a wrong guess costs one needless
//! migration). Issue 20 (placement) replaces this with both sides
//! publishing their CPU in the arena.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

/// Moves the calling thread off the CPU its client last ran on, if it is
/// on it now and may run elsewhere. Returns whether it moved.
pub fn step_off_client_cpu(control: &UnixStream) -> bool {
    use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity};
    let Some(client_cpu) = client_cpu(control) else {
        return false;
    };
    if sched_getcpu() != client_cpu {
        return false;
    }
    let Ok(allowed) = sched_getaffinity(None) else {
        return false;
    };
    if allowed.count() < 2 || !allowed.is_set(client_cpu) {
        return false;
    }
    let mut elsewhere = allowed;
    elsewhere.unset(client_cpu);
    // Setting the narrower mask migrates this thread now; restoring the
    // old one does not move it back.
    let moved = sched_setaffinity(None, &elsewhere).is_ok();
    let _ = sched_setaffinity(None, &allowed);
    moved
}

/// The CPU the process at the other end of `control` last ran on.
fn client_cpu(control: &UnixStream) -> Option<usize> {
    let cred = rustix::net::sockopt::socket_peercred(control.as_fd()).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", cred.pid.as_raw_nonzero())).ok()?;
    processor_of(&stat)
}

/// Field 39 (`processor`) of a `/proc/PID/stat` line. The command name
/// (field 2) is in parentheses and may hold spaces or parentheses itself,
/// so fields are counted from the last `)`.
fn processor_of(stat: &str) -> Option<usize> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name: `processor` is the 37th of them.
    rest.split_whitespace().nth(36)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_processor_field_is_read_past_an_awkward_name() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[39 - 3] = "1".into();
        let line = format!("4242 (a) b (c) {}", fields.join(" "));
        assert_eq!(processor_of(&line), Some(1));
        assert_eq!(processor_of("garbage"), None);
        assert_eq!(processor_of("1 (x) S 2"), None);
    }

    #[test]
    fn this_process_is_found_on_a_cpu_it_may_use() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cpu = client_cpu(&a).expect("our own /proc/PID/stat");
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        assert!(allowed.is_set(cpu) || allowed.count() == 0, "cpu {cpu}");
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_is_never_moved() {
        use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
        let t = std::thread::spawn(|| {
            let mut one = CpuSet::new();
            one.set(sched_getcpu());
            sched_setaffinity(None, &one).unwrap();
            let (a, _b) = UnixStream::pair().unwrap();
            // Its "client" is this very process, maybe on this CPU: still
            // it stays, and its mask is untouched.
            assert!(!step_off_client_cpu(&a));
            sched_getaffinity(None).unwrap() == one
        });
        assert!(t.join().unwrap());
    }
}
