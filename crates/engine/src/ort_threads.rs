//! The threads of ONNX Runtime's intra-op pools (per session, or the
//! global one of `init_onnxruntime`), spawned by us
//! so they carry a name: `tw-ort` in `ps -L`, `top -H` and `perf`, beside
//! the agent's `tw-session-*` threads, rather than a copy of the agent's
//! process name. Whoever looks at where an agent's CPU time goes can then
//! tell the model's compute from the agent's own work.

use std::thread::{self, JoinHandle};

use ort::environment::ThreadManager;

/// Spawns ONNX Runtime's pool threads as named `std` threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OrtThreads;

impl ThreadManager for OrtThreads {
    type Thread = JoinHandle<()>;

    fn create(&self, work: impl FnOnce() + Send + 'static) -> ort::Result<Self::Thread> {
        thread::Builder::new()
            .name("tw-ort".to_string())
            .spawn(work)
            .map_err(|e| ort::Error::new(format!("cannot spawn an intra-op thread: {e}")))
    }

    fn join(thread: Self::Thread) -> ort::Result<()> {
        thread
            .join()
            .map_err(|_| ort::Error::new("an intra-op thread panicked"))
    }
}

#[cfg(test)]
mod tests {
    use crate::{OrtBackend, OrtOptions};

    /// The names of this process's threads.
    fn thread_names() -> Vec<String> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    }

    #[test]
    fn intra_op_threads_are_named() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/build/digits_mlp.onnx"
        );
        let opts = OrtOptions {
            intra_threads: 3,
            ..OrtOptions::default()
        };
        let _digits = OrtBackend::load("digits", path.as_ref(), &opts).expect("loads");
        // Two pool threads (the caller is the third); other tests may load
        // more models meanwhile, so at least two. A new thread names itself
        // once it runs (until then it shows its parent's name), so wait for
        // that, at most 5 s.
        let named = || thread_names().iter().filter(|n| *n == "tw-ort").count();
        let t0 = std::time::Instant::now();
        while named() < 2 && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(named() >= 2, "{:?}", thread_names());
    }
}
