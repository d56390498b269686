//! Where the bench's threads and its servers run.
//!
//! On this kind of machine a cross-core wake-up costs ~5 µs and a same-core
//! hand-over is cheaper, so an unpinned comparison measures the scheduler's
//! placement as much as the RPC path (the raw floor's forked echo tends to
//! share the client's core, an agent started earlier does not). With a
//! [`Placement`], every client thread runs on one CPU and every server
//! process (agent, peer, raw echo) on another, so all targets of a run get
//! the same, cross-core placement.

use crate::caller::BenchError;
use rustix::process::Pid;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// CPUs for the client threads and the server processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Every client thread (and the in-process targets).
    pub client_cpu: usize,
    /// Every server process.
    pub server_cpu: usize,
}

impl Placement {
    /// Parses `--pin`: `cross` ([`Placement::cross_core`]), `same`
    /// ([`Placement::same_core`]) or `none`.
    pub fn parse(s: &str) -> Result<Option<Placement>, BenchError> {
        match s {
            "none" => Ok(None),
            "cross" => Placement::cross_core()
                .map(Some)
                .ok_or_else(|| BenchError::new("--pin cross needs two CPUs")),
            "same" => Placement::same_core()
                .map(Some)
                .ok_or_else(|| BenchError::new("no CPU to pin to")),
            other => Err(BenchError::new(format!(
                "--pin takes cross, same or none, not '{other}'"
            ))),
        }
    }

    /// How results name it: `cross-core (clients CPU 0, servers CPU 1)`.
    pub fn describe(p: Option<Placement>) -> String {
        match p {
            None => "unpinned (scheduler's choice)".to_string(),
            Some(p) if p.client_cpu == p.server_cpu => {
                format!("same core (clients and servers on CPU {})", p.client_cpu)
            }
            Some(p) => format!(
                "cross-core (clients on CPU {}, servers on CPU {})",
                p.client_cpu, p.server_cpu
            ),
        }
    }

    /// Clients and servers on the first CPU this process may use.
    pub fn same_core() -> Option<Placement> {
        let set = sched_getaffinity(None).ok()?;
        let cpu = (0..CpuSet::MAX_CPU).find(|&c| set.is_set(c))?;
        Some(Placement {
            client_cpu: cpu,
            server_cpu: cpu,
        })
    }

    /// The first CPU for clients, the second for servers; `None` on a
    /// machine with one CPU this process may use.
    pub fn cross_core() -> Option<Placement> {
        let set = sched_getaffinity(None).ok()?;
        let mut cpus = (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c));
        let client_cpu = cpus.next()?;
        let server_cpu = cpus.next()?;
        Some(Placement {
            client_cpu,
            server_cpu,
        })
    }
}

fn one(cpu: usize) -> Result<CpuSet, BenchError> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(BenchError::new(format!("CPU {cpu} is out of range")));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    Ok(set)
}

/// Pins the calling thread (threads it starts afterwards inherit it) and
/// returns its previous CPU set, to restore with [`restore_current_thread`].
pub fn pin_current_thread(cpu: usize) -> Result<CpuSet, BenchError> {
    let old = sched_getaffinity(None)
        .map_err(|e| BenchError::new(format!("cannot read this thread's CPUs: {e}")))?;
    sched_setaffinity(None, &one(cpu)?)
        .map_err(|e| BenchError::new(format!("cannot pin to CPU {cpu}: {e}")))?;
    Ok(old)
}

/// Gives the calling thread back the CPU set [`pin_current_thread`] took.
pub fn restore_current_thread(old: &CpuSet) {
    let _ = sched_setaffinity(None, old);
}

/// Pins every thread of process `pid` to `cpu` (threads it starts later
/// inherit it from their creator).
pub fn pin_process(pid: u32, cpu: usize) -> Result<(), BenchError> {
    let set = one(cpu)?;
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| BenchError::new(format!("{dir}: {e}")))?;
    for t in tasks.flatten() {
        let Some(tid) = t
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        // A thread that exited meanwhile is no error.
        if let Err(e) = sched_setaffinity(Some(tid), &set) {
            if e != rustix::io::Errno::SRCH {
                return Err(BenchError::new(format!(
                    "cannot pin thread {tid:?} of process {pid} to CPU {cpu}: {e}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_a_thread_and_restoring_it() {
        let Some(p) = Placement::cross_core() else {
            eprintln!("skipped: fewer than two CPUs");
            return;
        };
        std::thread::spawn(move || {
            let old = pin_current_thread(p.client_cpu).expect("pin");
            let now = sched_getaffinity(None).expect("read");
            assert!(now.is_set(p.client_cpu) && !now.is_set(p.server_cpu));
            restore_current_thread(&old);
            assert!(sched_getaffinity(None).expect("read").is_set(p.server_cpu));
        })
        .join()
        .expect("thread");
        assert!(pin_current_thread(CpuSet::MAX_CPU).is_err());
    }

    #[test]
    fn pinning_a_child_process() {
        let Some(p) = Placement::cross_core() else {
            eprintln!("skipped: fewer than two CPUs");
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        pin_process(child.id(), p.server_cpu).expect("pin");
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
        let _ = child.kill();
        let _ = child.wait();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list");
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(p.server_cpu.to_string().as_str())
        );
        assert!(pin_process(u32::MAX, 0).is_err(), "no such process");
    }
}
