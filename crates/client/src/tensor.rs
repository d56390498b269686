//! Tensors going in ([`TensorRef`], borrowed from the caller) and coming out
//! ([`Tensor`], sharing the response's buffer).

use crate::error::ClientError;
use std::ops::Range;
use std::sync::Arc;
use wire::{DType, PooledBuf, TensorDesc};

/// Rust element types with a tensorwire dtype.
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
    pub fn from_slice<T: Element>(
        shape: &'a [u64],
        data: &'a [T],
    ) -> Result<TensorRef<'a>, ClientError> {
        TensorRef::new(T::DTYPE, shape, bytemuck::cast_slice(data))
    }
}

/// An output tensor. Its bytes live in the response buffer it shares with
/// the other outputs of the same response (no copy per output).
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    buf: Arc<PooledBuf>,
    range: Range<usize>,
}

impl Tensor {
    pub(crate) fn new(
        dtype: DType,
        shape: Vec<u64>,
        buf: Arc<PooledBuf>,
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
    pub fn bytes(&self) -> &[u8] {
        self.buf.get(self.range.clone()).unwrap_or(&[])
    }

    /// The elements as a typed slice, borrowed in place.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], ClientError> {
        if T::DTYPE != self.dtype {
            return Err(ClientError::InvalidInput(format!(
                "tensor is {}, not {}",
                self.dtype,
                T::DTYPE
            )));
        }
        bytemuck::try_cast_slice(self.bytes())
            .map_err(|e| ClientError::Protocol(format!("tensor bytes misaligned: {e}")))
    }

    /// The elements copied into a `Vec`.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, ClientError> {
        self.as_slice().map(<[T]>::to_vec)
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
        let buf = Arc::new(
            wire::AlignedBuf::copy_from(bytemuck::cast_slice(&[1f32, 2.0]))
                .unwrap()
                .into(),
        );
        let t = Tensor::new(DType::F32, vec![2], buf, 0..8);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert!(t.as_slice::<i32>().is_err());
    }
}
