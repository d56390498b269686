//! The identity backend: outputs are the inputs, aliased, never copied.
//!
//! Every agent serves it as the built-in model `identity`, which takes any
//! number of tensors of any dtype and shape. It is what the transport tests
//! and the empty-RPC benchmark run, so that what is measured is tensorwire.

use crate::{Backend, EngineError, Output, OutputData, TensorView};
use wire::{DType, ModelSignature};

/// Returns its inputs as outputs, aliased (no copy).
///
/// # Examples
///
/// ```
/// use engine::{Backend, DType, IdentityBackend, OutputData, TensorView};
/// let id = IdentityBackend::new();
/// let a = [1u8, 2, 3];
/// let x = TensorView::new(DType::U8, &[3], &a);
/// let out = id.run(&[x])?;
/// assert!(matches!(out[0].data, OutputData::Input(0))); // aliased, not copied
/// assert_eq!(out[0].bytes(&[x]), a);
/// # Ok::<(), engine::EngineError>(())
/// ```
#[derive(Debug)]
pub struct IdentityBackend {
    signature: ModelSignature,
}

impl IdentityBackend {
    /// The name every agent serves it under.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::IdentityBackend;
    /// assert_eq!(IdentityBackend::NAME, "identity");
    /// ```
    pub const NAME: &'static str = "identity";

    /// A new identity backend. Its signature lists no tensors: it accepts any.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, DType, IdentityBackend};
    /// let id = IdentityBackend::new();
    /// assert!(id.signature().inputs.is_empty()); // takes anything
    /// assert!(id.check_inputs(&[(DType::Bool, &[7, 7]), (DType::F64, &[])]).is_ok());
    /// ```
    pub fn new() -> IdentityBackend {
        IdentityBackend::named(Self::NAME)
    }

    /// An identity backend served under another name (tests of the
    /// registry and of model loading use it as a model that needs no file).
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Backend, IdentityBackend};
    /// assert_eq!(IdentityBackend::named("echo").signature().name, "echo");
    /// ```
    pub fn named(name: &str) -> IdentityBackend {
        IdentityBackend {
            signature: ModelSignature {
                name: name.to_string(),
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

    fn output_shapes(&self, inputs: &[(DType, &[u64])]) -> Option<Vec<Vec<u64>>> {
        Some(inputs.iter().map(|(_, shape)| shape.to_vec()).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_alias_inputs_without_copying() {
        let a = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let b = [9u8; 3];
        let inputs = [
            TensorView::new(DType::F32, &[2], &a),
            TensorView::new(DType::U8, &[3, 1], &b),
        ];
        let backend = IdentityBackend::new();
        assert_eq!(backend.signature().name, "identity");
        backend
            .check_inputs(&[(DType::F32, &[2]), (DType::Bool, &[1, 2, 3])])
            .expect("identity accepts anything");
        let outputs = backend.run(&inputs).expect("identity cannot fail");
        assert_eq!(outputs.len(), 2);
        for (i, (out, input)) in outputs.iter().zip(&inputs).enumerate() {
            assert!(matches!(out.data, OutputData::Input(n) if n == i));
            assert_eq!(out.dtype, input.dtype);
            assert_eq!(out.shape, input.shape);
            // Same memory, not an equal copy.
            assert_eq!(out.bytes(&inputs).as_ptr(), input.data.as_ptr());
            assert_eq!(out.bytes(&inputs).len(), input.data.len());
        }
        assert!(backend.run(&[]).expect("no inputs is fine").is_empty());
    }

    #[test]
    fn run_into_copies_into_caller_buffers() {
        let a = [1u8, 2, 3, 4];
        let inputs = [TensorView::new(DType::U16, &[2], &a)];
        let backend = IdentityBackend::new();
        assert_eq!(
            backend.output_shapes(&[(DType::U16, &[2])]),
            Some(vec![vec![2]])
        );
        let mut dst = [0u8; 4];
        backend
            .run_into(&inputs, &mut [&mut dst[..]])
            .expect("fits");
        assert_eq!(dst, a);
        let mut short = [0u8; 3];
        assert!(matches!(
            backend.run_into(&inputs, &mut [&mut short[..]]),
            Err(EngineError::InvalidInput(_))
        ));
        assert!(matches!(
            backend.run_into(&inputs, &mut []),
            Err(EngineError::InvalidInput(_))
        ));
    }
}
