//! Borrowed input views and owned-or-aliased outputs.

use wire::{AlignedBuf, DType};

/// Where a tensor's memory lives. Only host memory exists today; the variant
/// keeps the buffer abstraction ready for device destinations (GPUDirect).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// Ordinary host memory.
    #[default]
    Host,
    /// Memory on CUDA device `n` (not produced by anything yet).
    Cuda(u32),
}

/// A tensor borrowed from whoever owns its bytes (a transport buffer, a
/// shared-memory arena, the caller's own array).
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [u64],
    /// The bytes: exactly `product(shape) × dtype.size()` of them.
    pub data: &'a [u8],
    /// Where `data` lives.
    pub device: Device,
}

impl<'a> TensorView<'a> {
    /// A host tensor view.
    pub fn new(dtype: DType, shape: &'a [u64], data: &'a [u8]) -> TensorView<'a> {
        TensorView {
            dtype,
            shape,
            data,
            device: Device::Host,
        }
    }
}

/// Where an output's bytes are.
#[derive(Debug)]
pub enum OutputData {
    /// Memory the engine allocated and filled.
    Owned(AlignedBuf),
    /// The bytes of input number `n`, unchanged: no copy was made.
    Input(usize),
}

/// One output of a run.
#[derive(Debug)]
pub struct Output {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// The bytes.
    pub data: OutputData,
}

impl Output {
    /// The output's bytes, resolving an alias against the run's inputs.
    pub fn bytes<'a>(&'a self, inputs: &[TensorView<'a>]) -> &'a [u8] {
        match &self.data {
            OutputData::Owned(b) => b.as_slice(),
            OutputData::Input(i) => inputs.get(*i).map_or(&[], |t| t.data),
        }
    }
}
