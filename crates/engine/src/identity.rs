//! The identity backend: outputs are the inputs, aliased, never copied.
//!
//! Every agent serves it as the built-in model `identity`, which takes any
//! number of tensors of any dtype and shape. It is what the transport tests
//! and the empty-RPC benchmark run, so that what is measured is tensorwire.

use crate::{Backend, EngineError, Output, OutputData, TensorView};
use wire::{DType, ModelSignature};

/// Returns its inputs as outputs, aliased (no copy).
#[derive(Debug)]
pub struct IdentityBackend {
    signature: ModelSignature,
}

impl IdentityBackend {
    /// The name every agent serves it under.
    pub const NAME: &'static str = "identity";

    /// A new identity backend. Its signature lists no tensors: it accepts any.
    pub fn new() -> IdentityBackend {
        IdentityBackend {
            signature: ModelSignature {
                name: Self::NAME.to_string(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
        }
    }
}

impl Default for IdentityBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for IdentityBackend {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn check_inputs(&self, _inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        Ok(inputs
            .iter()
            .enumerate()
            .map(|(i, t)| Output {
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                data: OutputData::Input(i),
            })
            .collect())
    }
}
