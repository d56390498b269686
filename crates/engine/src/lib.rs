//! Engines: what runs a model once the agent has the tensors in place.
//!
//! A [`Backend`] loads a model once and runs it on borrowed [`TensorView`]s:
//! it never owns transport buffers and never sees a socket. Outputs come
//! back as [`Output`]s that either own fresh 64-byte aligned memory or alias
//! one of the inputs (the identity backend returns its inputs without a
//! copy). Two backends ship: [`IdentityBackend`] (outputs = inputs; the
//! built-in `identity` model every agent serves) and [`OrtBackend`] (ONNX
//! Runtime, loaded at run time from the `onnxruntime` wheel's
//! `libonnxruntime.so`).
//!
//! # Examples
//!
//! Load a model once, then run it on memory the caller owns:
//!
//! ```
//! use engine::{Backend, DType, OrtBackend, OrtOptions, TensorView};
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
//! let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
//! let pixels = vec![0f32; 4 * 64];
//! let x = TensorView::new(DType::F32, &[4, 64], bytemuck::cast_slice(&pixels));
//! digits.check_inputs(&[(x.dtype, x.shape)])?;
//! let outputs = digits.run(&[x])?;
//! let logits: &[f32] = bytemuck::cast_slice(outputs[0].bytes(&[x]));
//! assert_eq!(logits.len(), 4 * 10);
//! # Ok::<(), engine::EngineError>(())
//! ```

mod error;
mod identity;
mod ort_backend;
mod ort_runtime;
mod ort_threads;
mod stop;
mod view;

pub use error::EngineError;
pub use identity::IdentityBackend;
pub use ort_backend::{OrtBackend, OrtOptions, DEFAULT_INTRA_SPINNING};
pub use ort_runtime::{
    find_onnxruntime, init_onnxruntime, onnxruntime_info, OrtRuntimeInfo, ORT_DYLIB_ENV,
};
pub use stop::RunStop;
pub use view::{Device, Output, OutputData, TensorView};
pub use wire::{DType, ModelSignature, TensorSpec};

/// A loaded model that can be run many times, from many threads at once.
///
/// # Examples
///
/// ```
/// use engine::{Backend, EngineError, Output, OutputData, TensorView};
/// use wire::{AlignedBuf, DType, ModelSignature, TensorSpec};
/// /// A model that adds one to every float32.
/// struct AddOne(ModelSignature);
/// impl Backend for AddOne {
///     fn signature(&self) -> &ModelSignature {
///         &self.0
///     }
///     fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
///         let x: &[f32] = bytemuck::try_cast_slice(inputs[0].data)
///             .map_err(|e| EngineError::InvalidInput(e.to_string()))?;
///         let y: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
///         let buf = AlignedBuf::copy_from(bytemuck::cast_slice(&y))
///             .map_err(|e| EngineError::OutOfMemory(e.to_string()))?;
///         Ok(vec![Output { dtype: DType::F32, shape: inputs[0].shape.to_vec(), data: OutputData::Owned(buf) }])
///     }
/// }
/// let spec = |n: &str| TensorSpec { name: n.into(), dtype: DType::F32, shape: vec![None] };
/// let model = AddOne(ModelSignature { name: "add_one".into(), inputs: vec![spec("x")], outputs: vec![spec("y")] });
/// let x = [1f32, 2.0];
/// let view = TensorView::new(DType::F32, &[2], bytemuck::cast_slice(&x));
/// model.check_inputs(&[(view.dtype, view.shape)])?; // the default: the signature
/// let out = model.run(&[view])?;
/// assert_eq!(out[0].bytes(&[view]), bytemuck::cast_slice::<f32, u8>(&[2.0, 3.0]));
/// // The default run_into runs and copies into the caller's buffer.
/// let mut dst = [0u8; 8];
/// model.run_into(&[view], &mut [&mut dst[..]])?;
/// assert_eq!(dst, out[0].bytes(&[view]));
/// # Ok::<(), EngineError>(())
/// ```
pub trait Backend: Send + Sync {
    /// The model's name, inputs and outputs.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, IdentityBackend};
    /// assert_eq!(IdentityBackend::new().signature().name, "identity");
    /// ```
    fn signature(&self) -> &ModelSignature;

    /// Checks tensors (dtype and shape, in order) against what the model
    /// takes, before their bytes are read. The default checks the signature;
    /// a backend that takes anything (identity) overrides it.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// assert!(digits.check_inputs(&[(DType::F32, &[8, 64])]).is_ok());
    /// assert!(digits.check_inputs(&[(DType::F32, &[8, 32])]).is_err());
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    fn check_inputs(&self, inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        check_against_signature(self.signature(), inputs)
    }

    /// Runs the model on `inputs` (in signature order, already checked
    /// against the signature by the caller) and returns the outputs in
    /// signature order.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, OrtBackend, OrtOptions, TensorView};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// let pixels = [0f32; 2 * 64];
    /// let x = TensorView::new(DType::F32, &[2, 64], bytemuck::cast_slice(&pixels));
    /// let out = digits.run(&[x])?;
    /// assert_eq!((out[0].dtype, out[0].shape.as_slice()), (DType::F32, &[2, 10][..]));
    /// assert_eq!(out[0].bytes(&[x]).len(), 2 * 10 * 4);
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError>;

    /// Whether a run may wait on something outside this process (a
    /// remote agent), however fast its recent runs were: such a run must
    /// never hold an async runtime's worker. The default: no.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, IdentityBackend};
    /// // Local engines never wait on another process.
    /// assert!(!IdentityBackend::new().may_block());
    /// ```
    fn may_block(&self) -> bool {
        false
    }

    /// The shapes [`run`](Backend::run) would give the outputs (in signature
    /// order) for inputs of these dtypes and shapes, if the backend can tell
    /// before running; `None` if it cannot (or the inputs do not fit). A
    /// caller that gets them can place the outputs in their final memory (a
    /// response buffer, a shared-memory arena) and call
    /// [`run_into`](Backend::run_into). The default cannot tell.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, OrtBackend, OrtOptions};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// // The batch dimension of the logits is the batch dimension of x.
    /// assert_eq!(digits.output_shapes(&[(DType::F32, &[5, 64])]), Some(vec![vec![5, 10]]));
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    fn output_shapes(&self, _inputs: &[(DType, &[u64])]) -> Option<Vec<Vec<u64>>> {
        None
    }

    /// Runs the model like [`run`](Backend::run), writing output `i` into
    /// `outputs[i]`, which must hold exactly its bytes (`product(shape) ×
    /// dtype.size()`, with the shapes [`output_shapes`](Backend::output_shapes)
    /// gives) and should be aligned for its dtype. A backend that can writes
    /// there directly; the default runs [`run`](Backend::run) and copies.
    /// A buffer of the wrong size is [`EngineError::InvalidInput`].
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, OrtBackend, OrtOptions, TensorView};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx");
    /// let digits = OrtBackend::load("digits", path.as_ref(), &OrtOptions::default())?;
    /// let pixels = [0.5f32; 64];
    /// let x = TensorView::new(DType::F32, &[1, 64], bytemuck::cast_slice(&pixels));
    /// // Outputs straight into memory the caller owns (a response buffer, an arena).
    /// let mut logits = [0f32; 10];
    /// digits.run_into(&[x], &mut [bytemuck::cast_slice_mut(&mut logits)])?;
    /// let owned = digits.run(&[x])?;
    /// assert_eq!(bytemuck::cast_slice::<f32, u8>(&logits), owned[0].bytes(&[x]));
    /// // A buffer of the wrong size is refused.
    /// let mut short = [0u8; 8];
    /// assert!(digits.run_into(&[x], &mut [&mut short[..]]).is_err());
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    fn run_into(
        &self,
        inputs: &[TensorView<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), EngineError> {
        let produced = self.run(inputs)?;
        if produced.len() != outputs.len() {
            return Err(EngineError::InvalidInput(format!(
                "model '{}' gave {} outputs, got {} buffers",
                self.signature().name,
                produced.len(),
                outputs.len()
            )));
        }
        for (i, (out, dst)) in produced.iter().zip(outputs.iter_mut()).enumerate() {
            let src = out.bytes(inputs);
            if src.len() != dst.len() {
                return Err(EngineError::InvalidInput(format!(
                    "model '{}' output {i} is {}{:?} ({} bytes), its buffer has {}",
                    self.signature().name,
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
}

/// Checks `inputs` against `sig`: count, dtype and shape of every tensor.
/// The error names the first offending tensor and what was expected.
///
/// # Examples
///
/// ```
/// use engine::{check_against_signature, DType, ModelSignature, TensorSpec};
/// let sig = ModelSignature {
///     name: "m".into(),
///     inputs: vec![TensorSpec { name: "x".into(), dtype: DType::I64, shape: vec![Some(1), None] }],
///     outputs: vec![],
/// };
/// assert!(check_against_signature(&sig, &[(DType::I64, &[1, 12])]).is_ok());
/// let e = check_against_signature(&sig, &[(DType::I32, &[1, 12])]);
/// assert!(matches!(e, Err(engine::EngineError::InvalidInput(_))));
/// ```
pub fn check_against_signature(
    sig: &ModelSignature,
    inputs: &[(DType, &[u64])],
) -> Result<(), EngineError> {
    sig.check_inputs(inputs.iter().copied())
        .map_err(EngineError::InvalidInput)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> ModelSignature {
        ModelSignature {
            name: "mlp".into(),
            inputs: vec![
                TensorSpec {
                    name: "x".into(),
                    dtype: DType::F32,
                    shape: vec![None, Some(64)],
                },
                TensorSpec {
                    name: "mask".into(),
                    dtype: DType::Bool,
                    shape: vec![Some(2)],
                },
            ],
            outputs: vec![],
        }
    }

    fn message(r: Result<(), EngineError>) -> String {
        match r {
            Err(EngineError::InvalidInput(m)) => m,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn signature_accepts_matching_inputs() {
        let s = sig();
        check_against_signature(&s, &[(DType::F32, &[5, 64]), (DType::Bool, &[2])]).expect("fits");
        check_against_signature(&s, &[(DType::F32, &[0, 64]), (DType::Bool, &[2])])
            .expect("empty batch fits");
    }

    #[test]
    fn signature_errors_name_the_tensor() {
        let s = sig();
        let m = message(check_against_signature(&s, &[(DType::F32, &[5, 64])]));
        assert!(m.contains("takes 2 inputs, got 1"), "{m}");

        let m = message(check_against_signature(
            &s,
            &[(DType::F64, &[5, 64]), (DType::Bool, &[2])],
        ));
        assert!(
            m.contains("'x'") && m.contains("float32[?, 64]") && m.contains("float64"),
            "{m}"
        );

        let m = message(check_against_signature(
            &s,
            &[(DType::F32, &[5, 63]), (DType::Bool, &[2])],
        ));
        assert!(m.contains("'x'") && m.contains("[5, 63]"), "{m}");

        let m = message(check_against_signature(
            &s,
            &[(DType::F32, &[64]), (DType::Bool, &[2])],
        ));
        assert!(m.contains("'x'"), "rank mismatch: {m}");

        let m = message(check_against_signature(
            &s,
            &[(DType::F32, &[1, 64]), (DType::Bool, &[3])],
        ));
        assert!(m.contains("'mask'") && m.contains("bool[2]"), "{m}");
    }

    #[test]
    fn default_check_inputs_uses_the_signature() {
        struct Fixed(ModelSignature);
        impl Backend for Fixed {
            fn signature(&self) -> &ModelSignature {
                &self.0
            }
            fn run(&self, _inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
                Ok(Vec::new())
            }
        }
        let b = Fixed(sig());
        assert!(b
            .check_inputs(&[(DType::F32, &[1, 64]), (DType::Bool, &[2])])
            .is_ok());
        assert!(matches!(
            b.check_inputs(&[(DType::I64, &[1, 64]), (DType::Bool, &[2])]),
            Err(EngineError::InvalidInput(_))
        ));
    }
}
