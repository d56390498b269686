//! Borrowed input views and owned-or-aliased outputs.

use wire::{AlignedBuf, DType};

/// Where a tensor's memory lives. Only host memory exists today; the variant
/// keeps the buffer abstraction ready for device destinations (GPUDirect).
///
/// # Examples
///
/// ```
/// use engine::{Device, DType, TensorView};
/// assert_eq!(Device::default(), Device::Host);
/// assert_eq!(TensorView::new(DType::U8, &[0], &[]).device, Device::Host);
/// ```
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
///
/// # Examples
///
/// ```
/// use engine::{DType, TensorView};
/// let ids = [101i64, 2023, 102];
/// let v = TensorView::new(DType::I64, &[1, 3], bytemuck::cast_slice(&ids));
/// assert_eq!(v.data.len(), 24);
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{Device, DType, TensorView};
    /// let bytes = [0u8; 16];
    /// let v = TensorView::new(DType::F32, &[2, 2], &bytes);
    /// assert_eq!((v.shape, v.device), (&[2u64, 2][..], Device::Host));
    /// ```
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
///
/// # Examples
///
/// ```
/// use engine::{Backend, DType, IdentityBackend, OutputData, TensorView};
/// let x = [9u8; 4];
/// let view = TensorView::new(DType::U8, &[4], &x);
/// match &IdentityBackend::new().run(&[view])?[0].data {
///     OutputData::Input(n) => assert_eq!(*n, 0),
///     OutputData::Owned(buf) => panic!("identity copied {} bytes", buf.len()),
/// }
/// # Ok::<(), engine::EngineError>(())
/// ```
#[derive(Debug)]
pub enum OutputData {
    /// Memory the engine allocated and filled.
    Owned(AlignedBuf),
    /// The bytes of input number `n`, unchanged: no copy was made.
    Input(usize),
}

/// One output of a run.
///
/// # Examples
///
/// ```
/// use engine::{DType, Output, OutputData};
/// use wire::AlignedBuf;
/// let out = Output {
///     dtype: DType::U8,
///     shape: vec![2],
///     data: OutputData::Owned(AlignedBuf::copy_from(&[1, 2])?),
/// };
/// assert_eq!(out.bytes(&[]), [1, 2]);
/// # Ok::<(), std::io::Error>(())
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{DType, Output, OutputData, TensorView};
    /// let x = [5u8, 6];
    /// let inputs = [TensorView::new(DType::U8, &[2], &x)];
    /// let alias = Output { dtype: DType::U8, shape: vec![2], data: OutputData::Input(0) };
    /// assert_eq!(alias.bytes(&inputs), x);
    /// ```
    pub fn bytes<'a>(&'a self, inputs: &[TensorView<'a>]) -> &'a [u8] {
        match &self.data {
            OutputData::Owned(b) => b.as_slice(),
            OutputData::Input(i) => inputs.get(*i).map_or(&[], |t| t.data),
        }
    }
}
