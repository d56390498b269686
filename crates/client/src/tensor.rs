//! Tensors going in ([`TensorRef`], borrowed from the caller; [`TensorBuf`],
//! allocated by the client so that it can live in a shared-memory arena) and
//! coming out ([`Tensor`], viewing the response's memory in place).

use crate::error::ClientError;
use crate::shm::Allocation;
use std::ops::Range;
use std::sync::Arc;
use wire::{AlignedBuf, DType, PooledBuf, TensorDesc};

/// Rust element types with a tensorwire dtype.
///
/// # Examples
///
/// ```
/// use client::{DType, Element, TensorRef};
/// // Generic code over any element type a tensor can hold.
/// fn row<'a, T: Element>(shape: &'a [u64], data: &'a [T]) -> Result<TensorRef<'a>, client::ClientError> {
///     TensorRef::from_slice(shape, data)
/// }
/// assert_eq!(f32::DTYPE, DType::F32);
/// assert_eq!(half::f16::DTYPE, DType::F16);
/// assert_eq!(row(&[1, 4], &[1i64, 2, 3, 4])?.dtype, DType::I64);
/// # Ok::<(), client::ClientError>(())
/// ```
pub trait Element: bytemuck::Pod {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64,
         u8 => U8, u16 => U16, u32 => U32, u64 => U64,
         half::f16 => F16, half::bf16 => BF16);

/// An input tensor borrowed from the caller: sent without being copied.
///
/// # Examples
///
/// ```
/// use client::{DType, TensorRef};
/// let pixels = vec![0.25f32; 3 * 224 * 224];
/// let image = TensorRef::from_slice(&[1, 3, 224, 224], &pixels)?;
/// assert_eq!((image.dtype, image.data.len()), (DType::F32, 4 * 3 * 224 * 224));
/// # Ok::<(), client::ClientError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [u64],
    /// The bytes (little-endian, C order).
    pub data: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// A tensor over raw bytes; checks the length matches dtype and shape.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{DType, TensorRef};
    /// let bytes = [0u8; 8];
    /// let t = TensorRef::new(DType::F16, &[2, 2], &bytes)?;
    /// assert_eq!(t.shape, [2, 2]);
    /// // The length must match dtype and shape.
    /// assert!(TensorRef::new(DType::F32, &[2, 2], &bytes).is_err());
    /// # Ok::<(), client::ClientError>(())
    /// ```
    pub fn new(
        dtype: DType,
        shape: &'a [u64],
        data: &'a [u8],
    ) -> Result<TensorRef<'a>, ClientError> {
        let want = TensorDesc::byte_len(dtype, shape)
            .ok_or_else(|| ClientError::InvalidInput(format!("shape {shape:?} overflows")))?;
        if want != data.len() as u64 {
            return Err(ClientError::InvalidInput(format!(
                "{dtype}{shape:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(TensorRef { dtype, shape, data })
    }

    /// A tensor over a typed slice.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{DType, TensorRef};
    /// let ids = [101i64, 2023, 102];
    /// let t = TensorRef::from_slice(&[1, 3], &ids)?;
    /// assert_eq!((t.dtype, t.data.len()), (DType::I64, 24));
    /// assert!(TensorRef::from_slice(&[1, 4], &ids).is_err());
    /// # Ok::<(), client::ClientError>(())
    /// ```
    pub fn from_slice<T: Element>(
        shape: &'a [u64],
        data: &'a [T],
    ) -> Result<TensorRef<'a>, ClientError> {
        TensorRef::new(T::DTYPE, shape, bytemuck::cast_slice(data))
    }
}

/// Memory an output [`Tensor`] borrows its bytes from: a response buffer
/// read from a socket, an in-process reply, or a shared-memory arena (an
/// input allocation the output aliases, or the agent's region of a
/// response, released to the agent when the last view of it is dropped).
pub(crate) trait TensorBytes: Send + Sync {
    /// The bytes; a tensor is a range of them.
    fn bytes(&self) -> &[u8];
}

impl TensorBytes for PooledBuf {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// An output tensor. Its bytes are read in place: in the response buffer it
/// shares with the other outputs of the same response (sockets, in-process),
/// or in the session's shared-memory arena (`shm://`), where it holds the
/// memory it views until it is dropped.
///
/// # Examples
///
/// ```
/// use client::{Client, DType, TensorRef};
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let x = [1.5f64, -2.0];
/// let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[1, 2], &x)?])?;
/// let out = &r.outputs[0];
/// assert_eq!((out.dtype, out.shape.as_slice()), (DType::F64, &[1, 2][..]));
/// assert_eq!(out.as_slice::<f64>()?, x);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    buf: Arc<dyn TensorBytes>,
    range: Range<usize>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("len", &self.range.len())
            .finish()
    }
}

impl Tensor {
    pub(crate) fn new(
        dtype: DType,
        shape: Vec<u64>,
        buf: Arc<dyn TensorBytes>,
        range: Range<usize>,
    ) -> Tensor {
        Tensor {
            dtype,
            shape,
            buf,
            range,
        }
    }

    /// The raw bytes (little-endian, C order, 64-byte aligned).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [0x0102u16];
    /// let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[1], &x)?])?;
    /// assert_eq!(r.outputs[0].bytes(), [0x02, 0x01]); // little-endian
    /// assert_eq!(r.outputs[0].bytes().as_ptr() as usize % 64, 0); // aligned
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> &[u8] {
        self.buf.bytes().get(self.range.clone()).unwrap_or(&[])
    }

    /// The elements as a typed slice, borrowed in place.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [1f32, 2.0, 3.0];
    /// let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[3], &x)?])?;
    /// let y: &[f32] = r.outputs[0].as_slice()?; // borrowed in place, no copy
    /// assert_eq!(y, x);
    /// // Asking for another element type is an error, not a reinterpretation.
    /// assert!(r.outputs[0].as_slice::<i32>().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&[T], ClientError> {
        typed(self.dtype, self.bytes())
    }

    /// The elements copied into a `Vec`.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [7u32, 8, 9];
    /// let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[3], &x)?])?;
    /// let owned: Vec<u32> = r.outputs[0].to_vec()?;
    /// drop(r); // the copy outlives the response
    /// assert_eq!(owned, x);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, ClientError> {
        self.as_slice().map(<[T]>::to_vec)
    }

    /// This output as an input to another request (no copy on any
    /// transport: over `shm://` an output that aliases an input allocation
    /// is sent in place again).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let model = c.model("identity")?;
    /// let x = [4i8; 6];
    /// let first = model.infer(&[TensorRef::from_slice(&[2, 3], &x)?])?;
    /// // One model's output straight in as the next request's input.
    /// let second = model.infer(&[first.outputs[0].as_ref()])?;
    /// assert_eq!(second.outputs[0].to_vec::<i8>()?, x);
    /// assert_eq!(second.outputs[0].shape, [2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            dtype: self.dtype,
            shape: &self.shape,
            data: self.bytes(),
        }
    }
}

fn typed<T: Element>(dtype: DType, bytes: &[u8]) -> Result<&[T], ClientError> {
    if T::DTYPE != dtype {
        return Err(ClientError::InvalidInput(format!(
            "tensor is {dtype}, not {}",
            T::DTYPE
        )));
    }
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| ClientError::Protocol(format!("tensor bytes misaligned: {e}")))
}

fn typed_mut<T: Element>(dtype: DType, bytes: &mut [u8]) -> Result<&mut [T], ClientError> {
    if T::DTYPE != dtype {
        return Err(ClientError::InvalidInput(format!(
            "tensor is {dtype}, not {}",
            T::DTYPE
        )));
    }
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| ClientError::Protocol(format!("tensor bytes misaligned: {e}")))
}

enum Store {
    /// An allocation in the client region of a shared-memory arena.
    Arena(Arc<Allocation>),
    /// Ordinary memory (every other transport).
    Heap(AlignedBuf),
}

/// A tensor the caller fills in place and then sends, made by
/// [`Client::alloc_tensor`](crate::Client::alloc_tensor).
///
/// Over `shm://` its bytes live in the session's arena, so sending it
/// ([`TensorBuf::as_ref`] passed to `infer`/`submit`) copies nothing: the
/// agent reads it where it is. On other transports it is an ordinary
/// 64-byte aligned buffer, so the same code works everywhere.
///
/// While a request that reads it is in flight, or while an output that
/// aliases it (the identity model's) is alive, the allocation is shared:
/// writing to it then is refused ([`TensorBuf::try_as_mut_bytes`] returns
/// `None`; `DerefMut` and [`TensorBuf::as_mut_slice`] panic / fail) so
/// nothing can change bytes that are being read. Its memory returns to the
/// arena when it and everything sharing it are dropped.
///
/// A fresh arena allocation holds whatever its range last held (zeroes the
/// first time): overwrite all of it.
///
/// # Examples
///
/// ```
/// use client::{Client, DType};
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("shm://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("shm://doc")?;
/// let model = c.model("identity")?;
/// let mut x = c.alloc_tensor(DType::F32, &[4])?;
/// x.as_mut_slice::<f32>()?.copy_from_slice(&[1., 2., 3., 4.]);
/// let r = model.infer(&[x.as_ref()])?;
/// // The identity model's output is the input itself: it stays read-only
/// // while the output lives...
/// assert!(x.try_as_mut_bytes().is_none());
/// assert_eq!(r.outputs[0].as_slice::<f32>()?, [1., 2., 3., 4.]);
/// drop(r);
/// // ...and writable again once it is gone.
/// x.as_mut_slice::<f32>()?.fill(0.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TensorBuf {
    dtype: DType,
    shape: Vec<u64>,
    len: usize,
    store: Store,
}

impl std::fmt::Debug for TensorBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorBuf")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("len", &self.len)
            .field("in_arena", &self.in_arena())
            .finish()
    }
}

impl TensorBuf {
    pub(crate) fn heap(dtype: DType, shape: &[u64], len: usize) -> Result<TensorBuf, ClientError> {
        let buf = AlignedBuf::zeroed(len).map_err(|e| {
            ClientError::LimitExceeded(format!("cannot allocate a {len}-byte tensor: {e}"))
        })?;
        Ok(TensorBuf {
            dtype,
            shape: shape.to_vec(),
            len,
            store: Store::Heap(buf),
        })
    }

    pub(crate) fn arena(dtype: DType, shape: &[u64], len: usize, a: Arc<Allocation>) -> TensorBuf {
        debug_assert!(a.len() >= len);
        TensorBuf {
            dtype,
            shape: shape.to_vec(),
            len,
            store: Store::Arena(a),
        }
    }

    /// Element type.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// assert_eq!(c.alloc_tensor(DType::BF16, &[8])?.dtype(), DType::BF16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// assert_eq!(c.alloc_tensor(DType::U8, &[2, 3, 4])?.shape(), [2, 3, 4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Length in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// assert_eq!(c.alloc_tensor(DType::F64, &[2, 3])?.len(), 48);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a tensor of zero bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// assert!(c.alloc_tensor(DType::F32, &[0, 10])?.is_empty());
    /// assert!(!c.alloc_tensor(DType::F32, &[1, 10])?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the bytes live in a shared-memory arena (sent without a copy).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// assert!(Client::connect("shm://doc")?.alloc_tensor(DType::U8, &[64])?.in_arena());
    /// assert!(!Client::connect("inproc://doc")?.alloc_tensor(DType::U8, &[64])?.in_arena());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_arena(&self) -> bool {
        matches!(self.store, Store::Arena(_))
    }

    /// The tensor, to pass to [`Model::infer`](crate::Model::infer) or
    /// [`Model::submit`](crate::Model::submit).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let mut x = c.alloc_tensor(DType::I32, &[3])?;
    /// x.as_mut_slice::<i32>()?.copy_from_slice(&[1, 2, 3]);
    /// let r = c.model("identity")?.infer(&[x.as_ref()])?;
    /// assert_eq!(r.outputs[0].to_vec::<i32>()?, [1, 2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            dtype: self.dtype,
            shape: &self.shape,
            data: self.bytes(),
        }
    }

    /// The bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let mut x = c.alloc_tensor(DType::U16, &[2])?;
    /// x.as_mut_slice::<u16>()?.copy_from_slice(&[1, 256]);
    /// assert_eq!(x.bytes(), [1, 0, 0, 1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> &[u8] {
        match &self.store {
            Store::Arena(a) => &a.bytes()[..self.len],
            Store::Heap(b) => b.as_slice(),
        }
    }

    /// The bytes, writable — `None` while a request in flight or an output
    /// still shares them.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("shm://doc")?;
    /// let mut x = c.alloc_tensor(DType::U8, &[4])?;
    /// x.try_as_mut_bytes().ok_or("not shared yet")?.copy_from_slice(&[1, 2, 3, 4]);
    /// let ticket = c.model("identity")?.submit(&[x.as_ref()])?;
    /// // In flight: the agent may be reading it.
    /// assert!(x.try_as_mut_bytes().is_none());
    /// drop(ticket.wait()?); // answered, and the aliasing output dropped
    /// assert!(x.try_as_mut_bytes().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_as_mut_bytes(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        match &mut self.store {
            Store::Arena(a) => {
                if Arc::strong_count(a) != 1 {
                    return None;
                }
                // SAFETY: only this buffer holds the allocation (the
                // allocator's lookup table keeps a `Weak`): no request pins
                // it and no output views it. Another holder could only
                // appear through a lookup of a slice of these bytes, and any
                // such slice borrows `self`, which `&mut self` excludes for
                // as long as the returned slice lives.
                Some(unsafe { &mut a.bytes_mut()[..len] })
            }
            Store::Heap(b) => Some(b.as_mut_slice()),
        }
    }

    /// The bytes, writable. Panics while a request in flight or an output
    /// (e.g. the identity model's, which aliases its input) still shares
    /// them; see [`TensorBuf::try_as_mut_bytes`].
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let mut x = c.alloc_tensor(DType::U8, &[3])?;
    /// x.as_mut_bytes().copy_from_slice(b"abc");
    /// assert_eq!(x.bytes(), b"abc");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.try_as_mut_bytes().expect(
            "TensorBuf is shared with a request in flight or an output that aliases it: \
             wait for the request and drop those outputs before writing to it",
        )
    }

    /// The elements as a typed slice.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = c.alloc_tensor(DType::F32, &[4])?;
    /// assert_eq!(x.as_slice::<f32>()?, [0.0; 4]); // a heap buffer starts zeroed
    /// assert!(x.as_slice::<u32>().is_err()); // not its dtype
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&[T], ClientError> {
        typed(self.dtype, self.bytes())
    }

    /// The elements as a typed, writable slice (an error while the buffer
    /// is shared; see [`TensorBuf::try_as_mut_bytes`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let mut x = c.alloc_tensor(DType::I64, &[1, 4])?;
    /// x.as_mut_slice::<i64>()?.copy_from_slice(&[101, 7592, 2088, 102]);
    /// assert_eq!(x.as_slice::<i64>()?[1], 7592);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], ClientError> {
        let dtype = self.dtype;
        let bytes = self.try_as_mut_bytes().ok_or_else(|| {
            ClientError::InvalidInput(
                "the tensor is still shared with a request in flight or an output that \
                 aliases it"
                    .into(),
            )
        })?;
        typed_mut(dtype, bytes)
    }
}

impl std::ops::Deref for TensorBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::ops::DerefMut for TensorBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_ref_checks_length() {
        let x = [1f32, 2.0, 3.0];
        assert!(TensorRef::from_slice(&[3], &x).is_ok());
        assert!(TensorRef::from_slice(&[2, 2], &x).is_err());
        assert!(TensorRef::new(DType::U8, &[u64::MAX, 2], &[]).is_err());
    }

    #[test]
    fn typed_access() {
        let buf: PooledBuf = AlignedBuf::copy_from(bytemuck::cast_slice(&[1f32, 2.0]))
            .unwrap()
            .into();
        let t = Tensor::new(DType::F32, vec![2], Arc::new(buf), 0..8);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert!(t.as_slice::<i32>().is_err());
        let r = t.as_ref();
        assert_eq!(
            (r.dtype, r.shape, r.data),
            (DType::F32, &[2u64][..], t.bytes())
        );
    }

    #[test]
    fn heap_tensor_buf_is_typed_and_writable() {
        let mut b = TensorBuf::heap(DType::I32, &[2, 3], 24).unwrap();
        assert!(!b.in_arena());
        assert_eq!(
            (b.len(), b.shape(), b.dtype()),
            (24, &[2u64, 3][..], DType::I32)
        );
        b.as_mut_slice::<i32>()
            .unwrap()
            .copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        assert!(b.as_mut_slice::<f32>().is_err(), "dtype checked");
        assert_eq!(b.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        b[0] = 9;
        assert_eq!(b.as_ref().data[0], 9);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        let e = TensorBuf::heap(DType::U8, &[0], 0).unwrap();
        assert!(e.is_empty() && e.as_ref().data.is_empty());
    }
}
