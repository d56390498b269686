//! [`RunStop`]: stopping a model run in progress from another thread.
//!
//! A queue that preempts (a long low-priority run stopped for a request
//! whose turn comes first) needs to end a run someone else is waiting on.
//! ONNX Runtime checks a *terminate* flag of the run's `RunOptions` before
//! each operator and ends the run with an error when it is set, so a run
//! stops within one operator's time. One `RunStop` belongs to each thread
//! that runs models ([`RunStop::for_this_thread`]): ONNX Runtime runs on the
//! thread that calls it, so the thread names the run. Every ONNX Runtime
//! run started on that thread passes its options; another thread (the
//! queue, under its lock) calls [`stop`](RunStop::stop) on a clone of it.
//!
//! The owner keeps the flag clear between the runs it lets be stopped
//! ([`clear`](RunStop::clear)), so a stop that came after its run had
//! already finished never ends the next one. Engines that cannot be
//! stopped (identity) ignore it: their run completes, and the caller sees a
//! result, not [`EngineError::Stopped`](crate::EngineError::Stopped).

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use ort::session::RunOptions;

/// The handle that stops this thread's runs in progress.
///
/// # Examples
///
/// ```
/// use engine::{Backend, EngineError, OrtBackend, OrtOptions, RunStop, TensorView};
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
/// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
/// let stop = RunStop::for_this_thread();
/// let x = [0f32; 64];
/// let x = TensorView::new(engine::DType::F32, &[1, 64], bytemuck::cast_slice(&x));
/// stop.stop(); // as another thread would, while the run goes on
/// assert!(matches!(digits.run(&[x]), Err(EngineError::Stopped)));
/// stop.clear();
/// assert!(digits.run(&[x]).is_ok());
/// # Ok::<(), EngineError>(())
/// ```
pub struct RunStop {
    stopped: AtomicBool,
    /// ONNX Runtime's options for this thread's runs, made when a run
    /// first needs them (ONNX Runtime may not be loaded before); `None`
    /// if they could not be made (such runs cannot be stopped).
    options: OnceLock<Option<RunOptions>>,
}

impl std::fmt::Debug for RunStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStop")
            .field("stopped", &self.is_stopped())
            .finish_non_exhaustive()
    }
}

thread_local! {
    static THIS_THREAD: OnceCell<Arc<RunStop>> = const { OnceCell::new() };
}

impl RunStop {
    /// This thread's handle, made on first use.
    pub fn for_this_thread() -> Arc<RunStop> {
        THIS_THREAD.with(|cell| {
            cell.get_or_init(|| {
                Arc::new(RunStop {
                    stopped: AtomicBool::new(false),
                    options: OnceLock::new(),
                })
            })
            .clone()
        })
    }

    /// The calling thread's handle if it has one: an engine running a
    /// model checks it to end a run early ([`is_stopped`](Self::is_stopped),
    /// answering [`EngineError::Stopped`](crate::EngineError::Stopped)).
    /// No handle is made here: a thread without one is never stopped.
    pub fn this_thread() -> Option<Arc<RunStop>> {
        THIS_THREAD.with(|cell| cell.get().cloned())
    }

    /// Stops the run in progress on the owning thread (and any it starts
    /// before [`clear`](Self::clear)): an ONNX Runtime run ends within one
    /// operator with [`EngineError::Stopped`](crate::EngineError::Stopped).
    pub fn stop(&self) {
        // SeqCst with `options`: either this sees options made meanwhile,
        // or their maker sees the flag and terminates them itself.
        self.stopped.store(true, Ordering::SeqCst);
        if let Some(Some(o)) = self.options.get() {
            // Fails only if ONNX Runtime is gone; the run then completes.
            let _ = o.terminate();
        }
    }

    /// Whether [`stop`](Self::stop) was called since the last
    /// [`clear`](Self::clear).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Lets runs go to completion again.
    pub fn clear(&self) {
        if self.stopped.swap(false, Ordering::SeqCst) {
            if let Some(Some(o)) = self.options.get() {
                let _ = o.unterminate();
            }
        }
    }

    /// This thread's run options for ONNX Runtime's C API, or null (no
    /// handle, or its options could not be made). No reference count is
    /// taken: the handle lives in this thread's slot until the thread ends
    /// and its options, once made, never change, so the pointer stays valid
    /// for a call made on this thread.
    pub(crate) fn this_thread_options_ptr() -> *const ort::sys::OrtRunOptions {
        use ort::AsPointer;
        THIS_THREAD.with(|cell| {
            cell.get()
                .and_then(|s| s.options())
                .map_or(std::ptr::null(), |o| o.ptr())
        })
    }

    /// The options ONNX Runtime runs on this thread pass (ONNX Runtime is
    /// loaded when this is called: a model of it is running).
    pub(crate) fn options(&self) -> Option<&RunOptions> {
        self.options
            .get_or_init(|| {
                let o = RunOptions::new().ok()?;
                if self.stopped.load(Ordering::SeqCst) {
                    let _ = o.terminate();
                }
                Some(o)
            })
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_per_thread_and_made_on_first_use() {
        let other = std::thread::spawn(|| {
            assert!(RunStop::this_thread().is_none());
            RunStop::for_this_thread()
        })
        .join()
        .expect("the thread ran");
        let mine = RunStop::for_this_thread();
        assert!(Arc::ptr_eq(
            &mine,
            &RunStop::this_thread().expect("made above")
        ));
        assert!(!Arc::ptr_eq(&mine, &other));
        mine.stop();
        assert!(mine.is_stopped() && !other.is_stopped());
        mine.clear();
        assert!(!mine.is_stopped());
    }
}
