//! The ONNX Runtime backend: a model file, loaded once, run many times.
//!
//! This module owns [`OrtBackend`] and [`OrtOptions`]: loading a model into a
//! small pool of ONNX Runtime sessions, turning the model's declared inputs
//! and outputs into a [`ModelSignature`], and running it on borrowed tensor
//! memory.
//!
//! Inputs are never copied: each [`TensorView`]'s bytes are viewed as a typed
//! slice (they are 64-byte aligned in practice) and handed to ONNX Runtime as
//! a borrowed tensor. A view whose bytes are not aligned for their element
//! type is copied once into an [`AlignedBuf`] (the only input copy there is).
//!
//! Outputs land in fresh [`AlignedBuf`]s ([`Backend::run`]) or in buffers
//! the caller provides ([`Backend::run_into`]). When every output's shape can
//! be told before the run (static dimensions, or dynamic ones named like an
//! input's, e.g. `batch`), ONNX Runtime writes its results straight into
//! those buffers (preallocated outputs; `ort`'s safe API only takes outputs
//! it allocated itself, so this one call goes through the C API). Otherwise
//! ONNX Runtime allocates the outputs and they are copied once. A model
//! whose declared output shapes turn out wrong is detected on its first run
//! and switched to copying.

use std::ffi::{c_char, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use ort::memory::MemoryInfo;
use ort::session::builder::PrepackedWeights;
use ort::session::{Session, SessionInputValue};
use ort::value::{
    DynValue, DynValueRefMut, Outlet, PrimitiveTensorElementType, Shape, TensorElementType,
    TensorRef, TensorRefMut, ValueType,
};
use ort::AsPointer;
use wire::{AlignedBuf, DType, ModelSignature, TensorSpec};

use crate::{
    check_against_signature, ort_runtime, Backend, EngineError, Output, OutputData, TensorView,
};

/// Whether intra-op threads spin after a run unless told otherwise
/// ([`OrtOptions::intra_spinning`]).
///
/// # Examples
///
/// ```
/// use engine::{OrtOptions, DEFAULT_INTRA_SPINNING};
/// assert_eq!(OrtOptions::default().intra_spinning, DEFAULT_INTRA_SPINNING);
/// ```
pub const DEFAULT_INTRA_SPINNING: bool = true;

/// How a model is loaded into ONNX Runtime.
///
/// # Examples
///
/// ```
/// use engine::{OrtBackend, OrtOptions};
/// let opts = OrtOptions {
///     intra_threads: 1,
///     intra_spinning: false, // leave the cores to others between runs
///     sessions: 2,           // two runs of this model at once
///     ..OrtOptions::default()
/// };
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
/// let digits = OrtBackend::load("digits", path.as_ref(), &opts)?;
/// assert_eq!(digits.session_count(), 2);
/// # Ok::<(), engine::EngineError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrtOptions {
    /// Threads one run may use inside an operator (ONNX Runtime's intra-op
    /// pool; 0 lets ONNX Runtime pick one per core). Unused when
    /// [`init_onnxruntime`](crate::init_onnxruntime) set up a global pool.
    pub intra_threads: usize,
    /// Whether the intra-op pool's threads spin for a while after a run
    /// before they sleep (ONNX Runtime's `session.intra_op.allow_spinning`,
    /// on in ONNX Runtime itself). Spinning saves their wake-up at the start
    /// of the next operator, but burns a core per thread meanwhile, which
    /// other engines and processes on a small machine then lack. Only
    /// matters with more than one intra-op thread; unused, like
    /// `intra_threads`, under a global pool.
    pub intra_spinning: bool,
    /// Threads one run may use to execute independent operators at once
    /// (only matters for graphs with parallel branches).
    pub inter_threads: usize,
    /// How many runs of this model may go at once: each is its own ONNX
    /// Runtime session (ONNX Runtime's `Run` is not safe to call
    /// concurrently on one session), so memory grows with it. 0 counts as 1.
    pub sessions: usize,
}

impl Default for OrtOptions {
    /// Two intra-op threads (spinning as [`DEFAULT_INTRA_SPINNING`]), one
    /// inter-op thread, one session.
    fn default() -> Self {
        OrtOptions {
            intra_threads: 2,
            intra_spinning: DEFAULT_INTRA_SPINNING,
            inter_threads: 1,
            sessions: 1,
        }
    }
}

/// Where one output dimension's size comes from, when it can be told before a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DimSource {
    /// The model declares it.
    Fixed(u64),
    /// It is named like dimension `dim` of input `input` (e.g. both `batch`).
    Input { input: usize, dim: usize },
}

/// A model loaded into ONNX Runtime. Runs from several threads at once use
/// up to [`OrtOptions::sessions`] sessions in parallel and queue beyond that.
///
/// # Examples
///
/// ```
/// use engine::{Backend, DType, OrtBackend, OrtOptions, TensorView};
/// use std::sync::Arc;
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
/// let digits = Arc::new(OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?);
/// // Loaded once, run from several threads.
/// let runs: Vec<_> = (0..2)
///     .map(|_| {
///         let digits = digits.clone();
///         std::thread::spawn(move || {
///             let pixels = [0f32; 64];
///             let x = TensorView::new(DType::F32, &[1, 64], bytemuck::cast_slice(&pixels));
///             digits.run(&[x]).map(|out| out[0].shape.clone())
///         })
///     })
///     .collect();
/// for r in runs {
///     assert_eq!(r.join().map_err(|_| "panicked")??, [1, 10]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OrtBackend {
    signature: ModelSignature,
    path: PathBuf,
    sessions: Vec<Mutex<Session>>,
    next: AtomicUsize,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
    /// Per output, where each dimension comes from; `None` if some output's
    /// shape cannot be told before a run.
    output_plan: Option<Vec<Vec<DimSource>>>,
    /// Whether outputs are written in place when `output_plan` allows.
    preallocate: AtomicBool,
}

impl std::fmt::Debug for OrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtBackend")
            .field("signature", &self.signature)
            .field("path", &self.path)
            .field("sessions", &self.sessions.len())
            .field("preallocates_outputs", &self.preallocates_outputs())
            .finish()
    }
}

impl OrtBackend {
    /// Loads the ONNX model at `path` under the name `name`.
    ///
    /// Initialises ONNX Runtime first if nothing did (see
    /// [`init_onnxruntime`](crate::init_onnxruntime)). Errors:
    /// [`EngineError::Runtime`] if the library cannot be found or loaded;
    /// [`EngineError::Load`] (naming the path) if the file is missing or is
    /// not a model ONNX Runtime accepts; [`EngineError::Unsupported`]
    /// (naming the tensor) if an input or output is not a tensor of a dtype
    /// tensorwire carries (strings, sequences, maps, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// let sig = digits.signature();
    /// assert_eq!(sig.name, "digits");
    /// assert_eq!((sig.inputs[0].name.as_str(), sig.inputs[0].dtype), ("x", DType::F32));
    /// assert_eq!(sig.outputs[0].describe(), "float32[?, 10]");
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn load(name: &str, path: &Path, opts: &OrtOptions) -> Result<OrtBackend, EngineError> {
        let load_err = |reason: String| EngineError::Load {
            path: path.display().to_string(),
            reason,
        };
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(load_err("not a regular file".to_string())),
            Err(e) => return Err(load_err(e.to_string())),
        }
        let env = ort_runtime::environment()?;

        let n_sessions = opts.sessions.max(1);
        let mut builder = Session::builder(env)
            .and_then(|b| Ok(b.with_intra_threads(opts.intra_threads)?))
            .and_then(|b| Ok(b.with_intra_op_spinning(opts.intra_spinning)?))
            .and_then(|b| Ok(b.with_inter_threads(opts.inter_threads.max(1))?))
            .and_then(|b| Ok(b.with_thread_manager(crate::ort_threads::OrtThreads)?))
            .map_err(|e| load_err(format!("cannot configure a session: {e}")))?;
        if n_sessions > 1 {
            // Sessions of one model share their prepacked weights.
            builder = builder
                .with_prepacked_weights(&PrepackedWeights::new())
                .map_err(|e| load_err(format!("cannot configure a session: {e}")))?;
        }
        let mut sessions = Vec::with_capacity(n_sessions);
        for _ in 0..n_sessions {
            let session = builder
                .commit_from_file(path)
                .map_err(|e| load_err(e.to_string()))?;
            sessions.push(session);
        }

        let first = &sessions[0];
        let inputs = first
            .inputs()
            .iter()
            .map(|o| spec_from_outlet(name, "input", o))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = first
            .outputs()
            .iter()
            .map(|o| spec_from_outlet(name, "output", o))
            .collect::<Result<Vec<_>, _>>()?;
        let output_plan = plan_outputs(first.inputs(), first.outputs());
        let cnames = |outlets: &[Outlet]| -> Result<Vec<CString>, EngineError> {
            outlets
                .iter()
                .map(|o| {
                    CString::new(o.name()).map_err(|_| {
                        load_err(format!("tensor name {:?} contains a NUL byte", o.name()))
                    })
                })
                .collect()
        };
        let input_names = cnames(first.inputs())?;
        let output_names = cnames(first.outputs())?;

        Ok(OrtBackend {
            signature: ModelSignature {
                name: name.to_string(),
                inputs,
                outputs,
            },
            path: path.to_path_buf(),
            sessions: sessions.into_iter().map(Mutex::new).collect(),
            next: AtomicUsize::new(0),
            input_names,
            output_names,
            output_plan,
            preallocate: AtomicBool::new(true),
        })
    }

    /// The model file this backend was loaded from.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// assert_eq!(digits.path(), std::path::Path::new(path));
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many ONNX Runtime sessions (concurrent runs) this backend has.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let opts = OrtOptions { sessions: 0, ..OrtOptions::default() }; // 0 counts as 1
    /// assert_eq!(OrtBackend::load("digits", path.as_ref(), &opts)?.session_count(), 1);
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Whether runs write outputs straight into their final buffers (true
    /// when every output's shape can be told from the inputs' and this was
    /// not switched off); otherwise outputs are copied once.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// assert!(digits.preallocates_outputs()); // [batch, 10] follows from the input
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn preallocates_outputs(&self) -> bool {
        self.output_plan.is_some() && self.preallocate.load(Ordering::Relaxed)
    }

    /// Switches writing outputs in place on or off (on by default where
    /// possible), e.g. to measure what it saves.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// digits.set_preallocate_outputs(false); // measure the copy it saves
    /// assert!(!digits.preallocates_outputs());
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn set_preallocate_outputs(&self, on: bool) {
        self.preallocate.store(on, Ordering::Relaxed);
    }

    /// A free session if there is one, else waits for one (round robin).
    fn session(&self) -> MutexGuard<'_, Session> {
        let n = self.sessions.len();
        let start = if n == 1 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        if n > 1 {
            for k in 0..n {
                match self.sessions[(start + k) % n].try_lock() {
                    Ok(g) => return g,
                    // A run that panicked cannot have left the session inconsistent:
                    // the session's state is ONNX Runtime's, not the guard's.
                    Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                    Err(TryLockError::WouldBlock) => {}
                }
            }
        }
        self.sessions[start]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Output shapes for inputs of these shapes, from the plan.
    fn planned_shapes(plan: &[Vec<DimSource>], input_shapes: &[&[u64]]) -> Option<Vec<Vec<u64>>> {
        plan.iter()
            .map(|dims| {
                dims.iter()
                    .map(|d| match *d {
                        DimSource::Fixed(n) => Some(n),
                        DimSource::Input { input, dim } => {
                            input_shapes.get(input)?.get(dim).copied()
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// The plan, unless in-place outputs are switched off.
    fn active_plan(&self) -> Option<&[Vec<DimSource>]> {
        self.output_plan
            .as_deref()
            .filter(|_| self.preallocate.load(Ordering::Relaxed))
    }

    /// Checks `inputs` (count, signature, byte lengths, host memory), views
    /// them as ONNX Runtime tensors without copying (realigning misaligned
    /// ones) and calls `f` with them.
    fn with_inputs<R>(
        &self,
        inputs: &[TensorView<'_>],
        f: impl FnOnce(&[SessionInputValue<'_>]) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let sig = &self.signature;
        // Callers check the signature first; checking again is a few
        // comparisons, and keeps a bad input from reaching ONNX Runtime.
        sig.check_inputs(inputs.iter().map(|t| (t.dtype, t.shape)))
            .map_err(EngineError::InvalidInput)?;
        // Inputs whose bytes are misaligned for their dtype are copied once, here.
        let mut realigned: Vec<Option<AlignedBuf>> = Vec::with_capacity(inputs.len());
        for (spec, t) in sig.inputs.iter().zip(inputs) {
            let expected = byte_len(t.dtype, t.shape);
            if expected != Some(t.data.len()) {
                return Err(EngineError::InvalidInput(format!(
                    "model '{}' input '{}': {} {:?} needs {} bytes, got {}",
                    sig.name,
                    spec.name,
                    t.dtype,
                    t.shape,
                    expected.map_or("too many".to_string(), |n| n.to_string()),
                    t.data.len()
                )));
            }
            if t.device != crate::Device::Host {
                return Err(EngineError::InvalidInput(format!(
                    "model '{}' input '{}' is on {:?}; only host memory is supported",
                    sig.name, spec.name, t.device
                )));
            }
            realigned.push(if aligned_for(t.data, t.dtype) {
                None
            } else {
                Some(AlignedBuf::copy_from(t.data).map_err(|e| {
                    EngineError::OutOfMemory(format!("realigning input '{}': {e}", spec.name))
                })?)
            });
        }
        let mut values = Vec::with_capacity(inputs.len());
        for ((spec, t), copy) in sig.inputs.iter().zip(inputs).zip(&realigned) {
            let bytes = copy.as_ref().map_or(t.data, |b| b.as_slice());
            values.push(input_value(&spec.name, t.dtype, t.shape, bytes)?);
        }
        f(&values)
    }

    /// Runs with ONNX Runtime writing output `i` straight into `dsts[i]`,
    /// which holds exactly the bytes of `shapes[i]` and is aligned for its dtype.
    fn run_in_place(
        &self,
        values: &[SessionInputValue<'_>],
        shapes: &[Vec<u64>],
        dsts: &mut [&mut [u8]],
    ) -> Result<(), EngineError> {
        let mut out_values: Vec<DynValueRefMut<'_>> = Vec::with_capacity(dsts.len());
        for ((spec, shape), dst) in self
            .signature
            .outputs
            .iter()
            .zip(shapes)
            .zip(dsts.iter_mut())
        {
            out_values.push(borrowed_output(spec.dtype, shape, dst)?);
        }
        let mut session = self.session();
        run_raw(
            &mut session,
            &self.input_names,
            values,
            &self.output_names,
            &mut out_values,
        )
    }

    /// Runs with ONNX Runtime writing into freshly allocated `AlignedBuf`s.
    fn run_preallocated(
        &self,
        values: &[SessionInputValue<'_>],
        shapes: Vec<Vec<u64>>,
    ) -> Result<Vec<Output>, EngineError> {
        let mut bufs = Vec::with_capacity(shapes.len());
        for (spec, shape) in self.signature.outputs.iter().zip(&shapes) {
            let len = byte_len(spec.dtype, shape).ok_or_else(|| {
                EngineError::OutOfMemory(format!(
                    "output '{}' of shape {shape:?} is too large",
                    spec.name
                ))
            })?;
            let buf = AlignedBuf::zeroed(len).map_err(|e| {
                EngineError::OutOfMemory(format!("{len} bytes for output '{}': {e}", spec.name))
            })?;
            bufs.push(buf);
        }
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        self.run_in_place(values, &shapes, &mut dsts)?;
        drop(dsts);
        Ok(self
            .signature
            .outputs
            .iter()
            .zip(shapes)
            .zip(bufs)
            .map(|((spec, shape), buf)| Output {
                dtype: spec.dtype,
                shape,
                data: OutputData::Owned(buf),
            })
            .collect())
    }

    /// Runs with ONNX Runtime allocating the outputs, then copies each once
    /// into an `AlignedBuf`.
    fn run_copying(&self, values: &[SessionInputValue<'_>]) -> Result<Vec<Output>, EngineError> {
        let mut session = self.session();
        let stop = crate::RunStop::this_thread();
        let outputs = match stop.as_ref().and_then(|s| s.options()) {
            Some(options) => session.run_with_options(values, options),
            None => session.run(values),
        }
        .map_err(|e| {
            stopped_or(EngineError::Run(format!(
                "model '{}': {e}",
                self.signature.name
            )))
        })?;
        let mut result = Vec::with_capacity(outputs.len());
        for (spec, value) in self.signature.outputs.iter().zip(outputs.values()) {
            result.push(copy_output(&spec.name, &value)?);
        }
        Ok(result)
    }

    /// After an in-place run failed: runs again with ONNX Runtime allocating
    /// the outputs. Either the inputs are bad (this run fails the same way and
    /// says so), or the model's declared output shapes are wrong, in which
    /// case this run works and in-place outputs are switched off for good.
    fn retry_copying(&self, values: &[SessionInputValue<'_>]) -> Result<Vec<Output>, EngineError> {
        let outputs = self.run_copying(values)?;
        self.preallocate.store(false, Ordering::Relaxed);
        Ok(outputs)
    }
}

impl Backend for OrtBackend {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        let input_shapes: Vec<&[u64]> = inputs.iter().map(|t| t.shape).collect();
        let shapes = self
            .active_plan()
            .and_then(|p| Self::planned_shapes(p, &input_shapes));
        self.with_inputs(inputs, |values| match shapes {
            Some(shapes) => match self.run_preallocated(values, shapes) {
                Err(EngineError::OutOfMemory(m)) => Err(EngineError::OutOfMemory(m)),
                Err(EngineError::Stopped) => Err(EngineError::Stopped),
                Err(_) => self.retry_copying(values),
                ok => ok,
            },
            None => self.run_copying(values),
        })
    }

    fn output_shapes(&self, inputs: &[(DType, &[u64])]) -> Option<Vec<Vec<u64>>> {
        check_against_signature(&self.signature, inputs).ok()?;
        let input_shapes: Vec<&[u64]> = inputs.iter().map(|(_, s)| *s).collect();
        Self::planned_shapes(self.active_plan()?, &input_shapes)
    }

    fn run_into(
        &self,
        inputs: &[TensorView<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), EngineError> {
        let sig = &self.signature;
        if outputs.len() != sig.outputs.len() {
            return Err(EngineError::InvalidInput(format!(
                "model '{}' has {} outputs, got {} buffers",
                sig.name,
                sig.outputs.len(),
                outputs.len()
            )));
        }
        let input_shapes: Vec<&[u64]> = inputs.iter().map(|t| t.shape).collect();
        let shapes = self
            .active_plan()
            .and_then(|p| Self::planned_shapes(p, &input_shapes));
        self.with_inputs(inputs, |values| {
            if let Some(shapes) = &shapes {
                for ((spec, shape), dst) in sig.outputs.iter().zip(shapes).zip(outputs.iter()) {
                    let want = byte_len(spec.dtype, shape);
                    if want != Some(dst.len()) {
                        return Err(EngineError::InvalidInput(format!(
                            "model '{}' output '{}' is {}{shape:?} ({} bytes), its buffer has {}",
                            sig.name,
                            spec.name,
                            spec.dtype,
                            want.map_or("too many".to_string(), |n| n.to_string()),
                            dst.len()
                        )));
                    }
                }
                if sig
                    .outputs
                    .iter()
                    .zip(outputs.iter())
                    .all(|(s, d)| aligned_for(d, s.dtype))
                {
                    match self.run_in_place(values, shapes, outputs) {
                        Ok(()) => return Ok(()),
                        Err(EngineError::OutOfMemory(m)) => {
                            return Err(EngineError::OutOfMemory(m))
                        }
                        Err(EngineError::Stopped) => return Err(EngineError::Stopped),
                        Err(_) => {
                            let produced = self.retry_copying(values)?;
                            return copy_into(sig, &produced, outputs);
                        }
                    }
                }
            }
            // Shapes unknown before the run, or a buffer misaligned for its
            // dtype: ONNX Runtime allocates, and the outputs are copied over.
            let produced = self.run_copying(values)?;
            copy_into(sig, &produced, outputs)
        })
    }
}

/// Whether `bytes` start at an address aligned for `dtype` (every dtype's
/// alignment is its size on the platforms tensorwire runs on).
fn aligned_for(bytes: &[u8], dtype: DType) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(dtype.size())
}

/// Copies owned outputs into the caller's buffers, which must fit exactly.
fn copy_into(
    sig: &ModelSignature,
    produced: &[Output],
    outputs: &mut [&mut [u8]],
) -> Result<(), EngineError> {
    for ((spec, out), dst) in sig.outputs.iter().zip(produced).zip(outputs.iter_mut()) {
        let OutputData::Owned(src) = &out.data else {
            return Err(EngineError::Run(format!(
                "output '{}' is not owned",
                spec.name
            )));
        };
        if src.len() != dst.len() {
            return Err(EngineError::InvalidInput(format!(
                "model '{}' output '{}' is {}{:?} ({} bytes), its buffer has {}",
                sig.name,
                spec.name,
                out.dtype,
                out.shape,
                src.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(src);
    }
    Ok(())
}

/// `product(shape) × dtype.size()`, or `None` on overflow.
fn byte_len(dtype: DType, shape: &[u64]) -> Option<usize> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| usize::try_from(n).ok())
}

/// ONNX Runtime's shape for `shape`.
fn ort_shape(shape: &[u64]) -> Result<Vec<i64>, EngineError> {
    shape
        .iter()
        .map(|&d| {
            i64::try_from(d)
                .map_err(|_| EngineError::InvalidInput(format!("dimension {d} is too large")))
        })
        .collect()
}

/// Runs `$body` with the type alias `$t` bound to the Rust element type of
/// `$dtype`; the second form runs `$bool_body` for [`DType::Bool`] instead.
macro_rules! with_element_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        with_element_type!($dtype, $t => $body, bool => {
            type $t = bool;
            $body
        })
    };
    ($dtype:expr, $t:ident => $body:expr, bool => $bool_body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::I16 => {
                type $t = i16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::U16 => {
                type $t = u16;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
            DType::Bool => $bool_body,
        }
    };
}

/// A borrowed ONNX Runtime tensor over `bytes`, which must be aligned for
/// `dtype` (the caller realigns them if not): no copy.
fn input_value<'a>(
    name: &str,
    dtype: DType,
    shape: &[u64],
    bytes: &'a [u8],
) -> Result<SessionInputValue<'a>, EngineError> {
    let shape = ort_shape(shape)?;
    let bad = |why: String| EngineError::InvalidInput(format!("input '{name}': {why}"));
    with_element_type!(dtype, T => {
        let data: &[T] = bytemuck::try_cast_slice(bytes).map_err(|e| bad(e.to_string()))?;
        borrowed_input(shape, data).map_err(bad)
    }, bool => {
        // `bool` has invalid bit patterns: every byte must be 0 or 1.
        let data: &[bool] = bytemuck::checked::try_cast_slice(bytes)
            .map_err(|_| bad("a bool tensor may hold only the bytes 0 and 1".to_string()))?;
        borrowed_input(shape, data).map_err(bad)
    })
}

fn borrowed_input<'a, T>(shape: Vec<i64>, data: &'a [T]) -> Result<SessionInputValue<'a>, String>
where
    T: PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static,
{
    TensorRef::from_array_view((shape, data))
        .map(SessionInputValue::from)
        .map_err(|e| e.to_string())
}

/// An ONNX Runtime tensor of `dtype` and `shape` over `buf`'s memory, for
/// ONNX Runtime to write an output into. `buf` must hold exactly
/// `byte_len(dtype, shape)` bytes, aligned for `dtype`.
fn borrowed_output<'b>(
    dtype: DType,
    shape: &[u64],
    buf: &'b mut [u8],
) -> Result<DynValueRefMut<'b>, EngineError> {
    let err = |e: ort::Error| EngineError::Run(format!("cannot set up an output tensor: {e}"));
    if byte_len(dtype, shape) != Some(buf.len()) {
        return Err(EngineError::Run(
            "output buffer does not fit its shape".to_string(),
        ));
    }
    let shape = Shape::new(ort_shape(shape)?);
    let info = MemoryInfo::new(
        ort::memory::AllocationDevice::CPU,
        0,
        ort::memory::AllocatorType::Device,
        ort::memory::MemoryType::Default,
    )
    .map_err(err)?;
    let data = buf.as_mut_ptr().cast::<c_void>();
    with_element_type!(dtype, T => {
        // SAFETY: `data` is the start of `buf`: host (CPU) memory, as `info`
        // says, aligned for `T` and holding exactly
        // `shape.num_elements() * size_of::<T>()` bytes (both checked
        // above). ONNX Runtime only writes plain element values into it, and
        // Rust reads them back only as bytes. The returned tensor borrows
        // `buf` mutably for `'b`, so the memory outlives it and nothing else
        // touches it meanwhile.
        let value: TensorRefMut<'b, T> =
            unsafe { TensorRefMut::from_raw(info, data, shape) }.map_err(err)?;
        Ok(value.into_dyn())
    })
}

/// ONNX Runtime's `Run` with every output preallocated: it writes into
/// `outputs` in place. `ort`'s safe `Session::run` only accepts owned
/// preallocated outputs (memory it allocated itself), so this calls the C
/// API the same way `ort` does internally, with our borrowed outputs.
fn run_raw(
    session: &mut Session,
    input_names: &[CString],
    inputs: &[SessionInputValue<'_>],
    output_names: &[CString],
    outputs: &mut [DynValueRefMut<'_>],
) -> Result<(), EngineError> {
    let run_options = crate::RunStop::this_thread_options_ptr();
    if input_names.len() != inputs.len() || output_names.len() != outputs.len() {
        return Err(EngineError::Run(format!(
            "{} inputs for {} names, {} outputs for {} names",
            inputs.len(),
            input_names.len(),
            outputs.len(),
            output_names.len()
        )));
    }
    let in_names: Vec<*const c_char> = input_names.iter().map(|n| n.as_ptr()).collect();
    let in_values: Vec<*const ort::sys::OrtValue> = inputs.iter().map(|v| v.ptr()).collect();
    let out_names: Vec<*const c_char> = output_names.iter().map(|n| n.as_ptr()).collect();
    let preallocated: Vec<*mut ort::sys::OrtValue> =
        outputs.iter().map(|v| v.ptr().cast_mut()).collect();
    let mut out_values = preallocated.clone();
    let run = ort::api().Run;
    // SAFETY: the session pointer is valid while `session` is borrowed, and
    // the `&mut` (a locked pool slot) means no other run uses it meanwhile,
    // which is all `Run` needs. The name arrays point to NUL-terminated
    // strings in `input_names`/`output_names`, the value arrays to live
    // OrtValues (`inputs` borrow their memory for the whole call; `outputs`
    // are tensors over buffers borrowed for the whole call), and each array
    // has exactly the length passed with it (checked above). The run options
    // are this thread's `RunStop`'s (alive until this thread ends), or null
    // (allowed: defaults).
    let status = unsafe {
        run(
            session.ptr().cast_mut(),
            run_options,
            in_names.as_ptr(),
            in_values.as_ptr(),
            in_values.len(),
            out_names.as_ptr(),
            out_names.len(),
            out_values.as_mut_ptr(),
        )
    };
    // SAFETY: `status` was just returned by ONNX Runtime and is used nowhere
    // else; this takes ownership of it (and releases it).
    unsafe { ort::Error::<()>::result_from_status(status) }
        .map_err(|e| stopped_or(EngineError::Run(e.to_string())))?;
    if out_values != preallocated {
        // ONNX Runtime documents that it fills non-null outputs in place; if
        // it ever did not, the values it made would leak rather than be
        // released twice.
        return Err(EngineError::Run(
            "ONNX Runtime replaced a preallocated output".to_string(),
        ));
    }
    Ok(())
}

/// `e`, or [`EngineError::Stopped`] when this thread's run was stopped (the
/// error ONNX Runtime gives then says only that a flag was set).
fn stopped_or(e: EngineError) -> EngineError {
    match crate::RunStop::this_thread() {
        Some(stop) if stop.is_stopped() => EngineError::Stopped,
        _ => e,
    }
}

/// Copies one output ONNX Runtime allocated into a fresh `AlignedBuf`.
fn copy_output(name: &str, value: &DynValue) -> Result<Output, EngineError> {
    let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
        return Err(EngineError::Unsupported(format!(
            "output '{name}' is a {}, not a tensor",
            value.dtype()
        )));
    };
    let dtype = dtype_of(*ty).ok_or_else(|| {
        EngineError::Unsupported(format!("output '{name}' has element type {ty}"))
    })?;
    let shape: Vec<u64> = shape
        .iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            EngineError::Run(format!("output '{name}' has a negative dimension: {shape}"))
        })?;
    let copied = with_element_type!(dtype, T => {
        let (_, data) = value
            .try_extract_tensor::<T>()
            .map_err(|e| EngineError::Run(format!("output '{name}': {e}")))?;
        AlignedBuf::copy_from(bytemuck::cast_slice::<T, u8>(data))
    });
    let buf = copied.map_err(|e| EngineError::OutOfMemory(format!("output '{name}': {e}")))?;
    Ok(Output {
        dtype,
        shape,
        data: OutputData::Owned(buf),
    })
}

/// The tensorwire dtype of an ONNX Runtime element type, if it has one.
pub(crate) fn dtype_of(ty: TensorElementType) -> Option<DType> {
    Some(match ty {
        TensorElementType::Float32 => DType::F32,
        TensorElementType::Float16 => DType::F16,
        TensorElementType::Bfloat16 => DType::BF16,
        TensorElementType::Float64 => DType::F64,
        TensorElementType::Int8 => DType::I8,
        TensorElementType::Int16 => DType::I16,
        TensorElementType::Int32 => DType::I32,
        TensorElementType::Int64 => DType::I64,
        TensorElementType::Uint8 => DType::U8,
        TensorElementType::Uint16 => DType::U16,
        TensorElementType::Uint32 => DType::U32,
        TensorElementType::Uint64 => DType::U64,
        TensorElementType::Bool => DType::Bool,
        _ => return None,
    })
}

/// The ONNX Runtime element type of a tensorwire dtype (the inverse of
/// [`dtype_of`], which the tests check).
#[cfg(test)]
fn element_type_of(dtype: DType) -> TensorElementType {
    match dtype {
        DType::F32 => TensorElementType::Float32,
        DType::F16 => TensorElementType::Float16,
        DType::BF16 => TensorElementType::Bfloat16,
        DType::F64 => TensorElementType::Float64,
        DType::I8 => TensorElementType::Int8,
        DType::I16 => TensorElementType::Int16,
        DType::I32 => TensorElementType::Int32,
        DType::I64 => TensorElementType::Int64,
        DType::U8 => TensorElementType::Uint8,
        DType::U16 => TensorElementType::Uint16,
        DType::U32 => TensorElementType::Uint32,
        DType::U64 => TensorElementType::Uint64,
        DType::Bool => TensorElementType::Bool,
    }
}

/// What kind of value a non-tensor is, for error messages.
fn kind_of(ty: &ValueType) -> &'static str {
    match ty {
        ValueType::Tensor { .. } => "tensor",
        ValueType::Sequence(_) => "sequence",
        ValueType::Map { .. } => "map",
        ValueType::Optional(_) => "optional value",
    }
}

/// A model input's or output's spec (`kind` is "input" or "output"), or
/// `Unsupported` naming the tensor if tensorwire cannot carry it.
pub(crate) fn spec_from_value_type(
    model: &str,
    kind: &str,
    name: &str,
    ty: &ValueType,
) -> Result<TensorSpec, EngineError> {
    let ValueType::Tensor {
        ty: elem, shape, ..
    } = ty
    else {
        return Err(EngineError::Unsupported(format!(
            "model '{model}' {kind} '{name}' is a {}, not a tensor: tensorwire carries only tensors",
            kind_of(ty)
        )));
    };
    let dtype = dtype_of(*elem).ok_or_else(|| {
        EngineError::Unsupported(format!(
            "model '{model}' {kind} '{name}' has element type {elem}, which tensorwire cannot carry"
        ))
    })?;
    Ok(TensorSpec {
        name: name.to_string(),
        dtype,
        shape: shape.iter().map(|&d| u64::try_from(d).ok()).collect(),
    })
}

fn spec_from_outlet(model: &str, kind: &str, outlet: &Outlet) -> Result<TensorSpec, EngineError> {
    spec_from_value_type(model, kind, outlet.name(), outlet.dtype())
}

/// Where each output dimension's size comes from, if every one can be told
/// before a run: declared sizes, or dynamic dimensions whose symbolic name
/// (e.g. `batch`) is also the name of a dynamic input dimension.
fn plan_outputs(inputs: &[Outlet], outputs: &[Outlet]) -> Option<Vec<Vec<DimSource>>> {
    let ins: Vec<&ValueType> = inputs.iter().map(Outlet::dtype).collect();
    let outs: Vec<&ValueType> = outputs.iter().map(Outlet::dtype).collect();
    plan_from_types(&ins, &outs)
}

fn plan_from_types(inputs: &[&ValueType], outputs: &[&ValueType]) -> Option<Vec<Vec<DimSource>>> {
    let find_symbol = |sym: &str| {
        inputs.iter().enumerate().find_map(|(i, ty)| {
            let ValueType::Tensor {
                shape,
                dimension_symbols,
                ..
            } = ty
            else {
                return None;
            };
            (0..shape.len()).find_map(|k| {
                (shape[k] < 0 && dimension_symbols.get(k).is_some_and(|s| s == sym))
                    .then_some(DimSource::Input { input: i, dim: k })
            })
        })
    };
    outputs
        .iter()
        .map(|ty| {
            let ValueType::Tensor {
                shape,
                dimension_symbols,
                ..
            } = ty
            else {
                return None;
            };
            (0..shape.len())
                .map(|j| match u64::try_from(shape[j]) {
                    Ok(n) => Some(DimSource::Fixed(n)),
                    Err(_) => {
                        let sym = dimension_symbols.get(j).filter(|s| !s.is_empty())?;
                        find_symbol(sym)
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ort::value::SymbolicDimensions;

    fn tensor(ty: TensorElementType, dims: &[i64], syms: &[&str]) -> ValueType {
        ValueType::Tensor {
            ty,
            shape: Shape::new(dims.iter().copied()),
            dimension_symbols: SymbolicDimensions::new(syms.iter().map(|s| s.to_string())),
        }
    }

    #[test]
    fn every_dtype_maps_both_ways() {
        for d in DType::ALL {
            let ty = element_type_of(d);
            assert_eq!(dtype_of(ty), Some(d), "{d}");
        }
    }

    #[test]
    fn element_types_tensorwire_cannot_carry() {
        for ty in [
            TensorElementType::String,
            TensorElementType::Complex64,
            TensorElementType::Complex128,
            TensorElementType::Float8E4M3FN,
            TensorElementType::Float8E5M2,
            TensorElementType::Int4,
            TensorElementType::Uint4,
            TensorElementType::Undefined,
        ] {
            assert_eq!(dtype_of(ty), None, "{ty:?}");
        }
    }

    #[test]
    fn specs_from_model_types() {
        let spec = spec_from_value_type(
            "m",
            "input",
            "x",
            &tensor(TensorElementType::Float32, &[-1, 64], &["batch", ""]),
        )
        .expect("f32 tensor is supported");
        assert_eq!(
            spec,
            TensorSpec {
                name: "x".into(),
                dtype: DType::F32,
                shape: vec![None, Some(64)],
            }
        );

        let err = spec_from_value_type(
            "m",
            "input",
            "text",
            &tensor(TensorElementType::String, &[1], &[""]),
        )
        .expect_err("strings are not carried");
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("'text'") && m.contains("String")),
            "{err}"
        );

        let seq = ValueType::Sequence(Box::new(tensor(TensorElementType::Float32, &[2], &[""])));
        let err = spec_from_value_type("m", "output", "parts", &seq)
            .expect_err("sequences are not carried");
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("output 'parts'") && m.contains("sequence")),
            "{err}"
        );

        let map = ValueType::Map {
            key: TensorElementType::Int64,
            value: TensorElementType::Float32,
        };
        let err =
            spec_from_value_type("m", "output", "probs", &map).expect_err("maps are not carried");
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("'probs'") && m.contains("map")),
            "{err}"
        );
    }

    #[test]
    fn output_plans() {
        let x = tensor(TensorElementType::Float32, &[-1, 64], &["batch", ""]);
        let mask = tensor(TensorElementType::Bool, &[-1, -1], &["n", "seq"]);
        let logits = tensor(TensorElementType::Float32, &[-1, 10], &["batch", ""]);
        let tokens = tensor(TensorElementType::Float32, &[-1, 3], &["seq", ""]);
        assert_eq!(
            plan_from_types(&[&x, &mask], &[&logits, &tokens]),
            Some(vec![
                vec![DimSource::Input { input: 0, dim: 0 }, DimSource::Fixed(10)],
                vec![DimSource::Input { input: 1, dim: 1 }, DimSource::Fixed(3)],
            ])
        );
        // An unnamed or unknown dynamic output dimension: no plan.
        let anon = tensor(TensorElementType::Float32, &[-1], &[""]);
        assert_eq!(plan_from_types(&[&x], &[&logits, &anon]), None);
        let other = tensor(TensorElementType::Float32, &[-1], &["other"]);
        assert_eq!(plan_from_types(&[&x], &[&other]), None);
        // Fully static outputs need no inputs.
        let fixed = tensor(TensorElementType::Int64, &[2, 3], &["", ""]);
        assert_eq!(
            plan_from_types(&[], &[&fixed]),
            Some(vec![vec![DimSource::Fixed(2), DimSource::Fixed(3)]])
        );
        let shapes = OrtBackend::planned_shapes(
            &[vec![
                DimSource::Input { input: 0, dim: 0 },
                DimSource::Fixed(10),
            ]],
            &[&[7, 64]],
        );
        assert_eq!(shapes, Some(vec![vec![7, 10]]));
    }

    #[test]
    fn byte_lengths() {
        assert_eq!(byte_len(DType::F32, &[4, 64]), Some(1024));
        assert_eq!(byte_len(DType::Bool, &[]), Some(1));
        assert_eq!(byte_len(DType::F64, &[3, 0]), Some(0));
        assert_eq!(byte_len(DType::F64, &[u64::MAX, 2]), None);
    }

    #[test]
    fn default_options() {
        assert_eq!(
            OrtOptions::default(),
            OrtOptions {
                intra_threads: 2,
                intra_spinning: DEFAULT_INTRA_SPINNING,
                inter_threads: 1,
                sessions: 1
            }
        );
    }
}
