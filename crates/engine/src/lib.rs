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
pub use ort_backend::{OrtBackend, OrtOptions};
pub use ort_runtime::{find_onnxruntime, init_onnxruntime, OrtRuntimeInfo};
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
}

/// Checks `inputs` against `sig`: count, dtype and shape of every tensor.
/// The error names the first offending tensor and what was expected.
pub fn check_against_signature(
    sig: &ModelSignature,
    inputs: &[(DType, &[u64])],
) -> Result<(), EngineError> {
    if inputs.len() != sig.inputs.len() {
        return Err(EngineError::InvalidInput(format!(
            "model '{}' takes {} inputs, got {}",
            sig.name,
            sig.inputs.len(),
            inputs.len()
        )));
    }
    for (spec, &(dtype, shape)) in sig.inputs.iter().zip(inputs) {
        if !spec.accepts(dtype, shape) {
            return Err(EngineError::InvalidInput(format!(
                "model '{}' input '{}' must be {}, got {}{:?}",
                sig.name,
                spec.name,
                spec.describe(),
                dtype,
                shape
            )));
        }
    }
    Ok(())
}
