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

mod error;
mod identity;
mod ort_backend;
mod ort_runtime;
mod view;

pub use error::EngineError;
pub use identity::IdentityBackend;
pub use ort_backend::{OrtBackend, OrtOptions, DEFAULT_INTRA_SPINNING};
pub use ort_runtime::{
    find_onnxruntime, init_onnxruntime, onnxruntime_info, OrtRuntimeInfo, ORT_DYLIB_ENV,
};
pub use view::{Device, Output, OutputData, TensorView};
pub use wire::{DType, ModelSignature, TensorSpec};

/// A loaded model that can be run many times, from many threads at once.
pub trait Backend: Send + Sync {
    /// The model's name, inputs and outputs.
    fn signature(&self) -> &ModelSignature;

    /// Checks tensors (dtype and shape, in order) against what the model
    /// takes, before their bytes are read. The default checks the signature;
    /// a backend that takes anything (identity) overrides it.
    fn check_inputs(&self, inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        check_against_signature(self.signature(), inputs)
    }

    /// Runs the model on `inputs` (in signature order, already checked
    /// against the signature by the caller) and returns the outputs in
    /// signature order.
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError>;

    /// Whether a run may wait on something outside this process (a
    /// remote agent), however fast its recent runs were: such a run must
    /// never hold an async runtime's worker. The default: no.
    fn may_block(&self) -> bool {
        false
    }

    /// The shapes [`run`](Backend::run) would give the outputs (in signature
    /// order) for inputs of these dtypes and shapes, if the backend can tell
    /// before running; `None` if it cannot (or the inputs do not fit). A
    /// caller that gets them can place the outputs in their final memory (a
    /// response buffer, a shared-memory arena) and call
    /// [`run_into`](Backend::run_into). The default cannot tell.
    fn output_shapes(&self, _inputs: &[(DType, &[u64])]) -> Option<Vec<Vec<u64>>> {
        None
    }

    /// Runs the model like [`run`](Backend::run), writing output `i` into
    /// `outputs[i]`, which must hold exactly its bytes (`product(shape) ×
    /// dtype.size()`, with the shapes [`output_shapes`](Backend::output_shapes)
    /// gives) and should be aligned for its dtype. A backend that can writes
    /// there directly; the default runs [`run`](Backend::run) and copies.
    /// A buffer of the wrong size is [`EngineError::InvalidInput`].
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
