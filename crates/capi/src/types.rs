//! The plain C data types: dtype codes ([`TwDtype`]), tensor descriptions
//! going in and out of `tw_infer` ([`TwTensor`]), a model's declared inputs
//! and outputs ([`TwTensorInfo`]) and copy counters ([`TwCopyStats`]), with
//! their conversions to and from the [`client`] crate's types.

use crate::error::{guard_value, Failure};
use client::{ClientError, CopyStats, DType, TensorSpec};
use std::ffi::{c_char, c_void, CString};

/// Most dimensions a tensor may have.
///
/// Example:
/// ```c
/// tw_tensor t = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {1, 64}};
/// assert(t.ndim <= TW_MAX_DIMS);
/// printf("at most %d dims\n", TW_MAX_DIMS);
/// // prints: at most 8 dims
/// ```
pub const TW_MAX_DIMS: usize = 8;

const _: () = assert!(TW_MAX_DIMS == wire::MAX_DIMS);

/// An element type: one of the `TW_DTYPE_*` codes (the wire protocol's).
/// An integer rather than an enum, so that any value a C caller passes is
/// defined (unknown codes are refused with an error).
///
/// Example:
/// ```c
/// tw_dtype dt = TW_DTYPE_I64;
/// printf("%s, %zu bytes\n", tw_dtype_name(dt), tw_dtype_size(dt));
/// // prints: int64, 8 bytes
/// ```
pub type TwDtype = i32;

/// IEEE 754 binary32 (`float`).
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_F32), tw_dtype_size(TW_DTYPE_F32));
/// // prints: float32, 4 byte(s)
/// ```
pub const TW_DTYPE_F32: TwDtype = 1;
/// IEEE 754 binary16.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_F16), tw_dtype_size(TW_DTYPE_F16));
/// // prints: float16, 2 byte(s)
/// ```
pub const TW_DTYPE_F16: TwDtype = 2;
/// bfloat16 (the upper half of a binary32).
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_BF16), tw_dtype_size(TW_DTYPE_BF16));
/// // prints: bfloat16, 2 byte(s)
/// ```
pub const TW_DTYPE_BF16: TwDtype = 3;
/// IEEE 754 binary64 (`double`).
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_F64), tw_dtype_size(TW_DTYPE_F64));
/// // prints: float64, 8 byte(s)
/// ```
pub const TW_DTYPE_F64: TwDtype = 4;
/// `int8_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_I8), tw_dtype_size(TW_DTYPE_I8));
/// // prints: int8, 1 byte(s)
/// ```
pub const TW_DTYPE_I8: TwDtype = 5;
/// `int16_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_I16), tw_dtype_size(TW_DTYPE_I16));
/// // prints: int16, 2 byte(s)
/// ```
pub const TW_DTYPE_I16: TwDtype = 6;
/// `int32_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_I32), tw_dtype_size(TW_DTYPE_I32));
/// // prints: int32, 4 byte(s)
/// ```
pub const TW_DTYPE_I32: TwDtype = 7;
/// `int64_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_I64), tw_dtype_size(TW_DTYPE_I64));
/// // prints: int64, 8 byte(s)
/// ```
pub const TW_DTYPE_I64: TwDtype = 8;
/// `uint8_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_U8), tw_dtype_size(TW_DTYPE_U8));
/// // prints: uint8, 1 byte(s)
/// ```
pub const TW_DTYPE_U8: TwDtype = 9;
/// `uint16_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_U16), tw_dtype_size(TW_DTYPE_U16));
/// // prints: uint16, 2 byte(s)
/// ```
pub const TW_DTYPE_U16: TwDtype = 10;
/// `uint32_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_U32), tw_dtype_size(TW_DTYPE_U32));
/// // prints: uint32, 4 byte(s)
/// ```
pub const TW_DTYPE_U32: TwDtype = 11;
/// `uint64_t`.
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_U64), tw_dtype_size(TW_DTYPE_U64));
/// // prints: uint64, 8 byte(s)
/// ```
pub const TW_DTYPE_U64: TwDtype = 12;
/// Boolean, one byte per element (0 or 1).
///
/// Example:
/// ```c
/// printf("%s, %zu byte(s)\n", tw_dtype_name(TW_DTYPE_BOOL), tw_dtype_size(TW_DTYPE_BOOL));
/// // prints: bool, 1 byte(s)
/// ```
pub const TW_DTYPE_BOOL: TwDtype = 13;

/// A tensor passed to `tw_infer` / `tw_submit` (an input) or filled in by
/// `tw_infer` / `tw_wait` (an output).
///
/// Input: set `dtype`, `ndim`, `dims[0..ndim]` (none negative), `data`
/// (little-endian, C order; may be NULL only if `len` is 0) and `len`, its
/// size in bytes, which must be exactly what dtype and dims need.
/// `capacity` is not read. `data` is only read, and not kept after the
/// call returns; if it lies in a `tw_buffer` of a `shm://` client it is
/// sent without being copied.
///
/// Output: set `data` and `capacity`, the bytes available there. The call
/// sets `dtype`, `ndim`, `dims` and `len` (the output's size in bytes) and
/// copies the output into `data` if it fits; if it does not, nothing is
/// written there and the call fails with `TW_ERR_BUFFER_TOO_SMALL` (after
/// filling in every output's fields, so that all the sizes needed are
/// known at once).
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// // An input: a float32[2, 3] in C order.
/// float x[2][3] = {{1, 2, 3}, {4, 5, 6}};
/// tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {2, 3},
///                 .data = x, .len = sizeof x};
/// // An output: room for it; the call fills in dtype, ndim, dims and len.
/// float y[2][3];
/// tw_tensor out = {.data = y, .capacity = sizeof y};
/// s = tw_infer(identity, &in, 1, &out, 1);
/// assert(s == TW_OK);
/// printf("%s[%" PRId64 ", %" PRId64 "], %zu bytes, y[1][2] = %g\n",
///        tw_dtype_name(out.dtype), out.dims[0], out.dims[1], out.len, y[1][2]);
/// // prints: float32[2, 3], 24 bytes, y[1][2] = 6
/// tw_model_free(identity);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TwTensor {
    /// Element type: a `TW_DTYPE_*` code.
    pub dtype: TwDtype,
    /// Number of dimensions, at most `TW_MAX_DIMS` (0 for a scalar).
    pub ndim: usize,
    /// The dimensions; entries past `ndim` are ignored (set to 0 in
    /// outputs).
    pub dims: [i64; TW_MAX_DIMS],
    /// The bytes.
    pub data: *mut c_void,
    /// Size of the tensor in bytes (input: set by the caller; output: set
    /// by the call).
    pub len: usize,
    /// Output only: how many bytes `data` can hold.
    pub capacity: usize,
}

/// One input or output a model declares (see `tw_model_input`).
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// tw_tensor_info info;
/// s = tw_model_input(digits, 0, &info);
/// assert(s == TW_OK);
/// printf("%s: %s, %zu dims: %" PRId64 " %" PRId64 "\n", info.name,
///        tw_dtype_name(info.dtype), info.ndim, info.dims[0], info.dims[1]);
/// // prints: x: float32, 2 dims: -1 64
/// tw_model_free(digits);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TwTensorInfo {
    /// Its name, valid as long as the `tw_model` it came from.
    pub name: *const c_char,
    /// Element type: a `TW_DTYPE_*` code.
    pub dtype: TwDtype,
    /// Number of dimensions.
    pub ndim: usize,
    /// The dimensions, -1 for a dynamic one (any size); entries past `ndim`
    /// are 0.
    pub dims: [i64; TW_MAX_DIMS],
}

/// Tensor bytes a client has copied in user space (see `tw_client_copy_stats`).
///
/// Example:
/// ```c
/// tw_client *c = NULL;  // a fresh client: its counters start at 0
/// tw_status s = tw_connect(uri, 0, &c);
/// assert(s == TW_OK);
/// tw_model *identity = NULL;
/// s = tw_model_lookup(c, "identity", &identity);
/// assert(s == TW_OK);
/// float x[64] = {0}, y[64];
/// tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 1, .dims = {64},
///                 .data = x, .len = sizeof x};
/// tw_tensor out = {.data = y, .capacity = sizeof y};
/// s = tw_infer(identity, &in, 1, &out, 1);
/// assert(s == TW_OK);
/// tw_copy_stats stats;
/// s = tw_client_copy_stats(c, &stats);
/// assert(s == TW_OK);
/// // Over shm://, x (ordinary memory) was copied into the arena once.
/// printf("%" PRIu64 " request(s), %" PRIu64 " input bytes copied\n",
///        stats.requests, stats.input_bytes_copied);
/// // prints: 1 request(s), 256 input bytes copied
/// tw_model_free(identity);
/// tw_client_close(c);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwCopyStats {
    /// Input bytes copied by the client: over `shm://`, inputs outside a
    /// `tw_buffer` are copied into the arena once; inputs in one are not.
    pub input_bytes_copied: u64,
    /// Output bytes copied by the Rust client (outputs are read in place;
    /// the copy into the caller's output buffers is not counted).
    pub output_bytes_copied: u64,
    /// Requests sent.
    pub requests: u64,
    /// Response bytes moved out of the socket's staging buffer (sockets
    /// only).
    pub staged_bytes: u64,
}

impl From<CopyStats> for TwCopyStats {
    fn from(s: CopyStats) -> TwCopyStats {
        TwCopyStats {
            input_bytes_copied: s.input_bytes_copied,
            output_bytes_copied: s.output_bytes_copied,
            requests: s.requests,
            staged_bytes: s.staged_bytes,
        }
    }
}

/// The dtype with C code `code`.
pub fn dtype_from_c(code: TwDtype) -> Option<DType> {
    u8::try_from(code)
        .ok()
        .and_then(|c| DType::from_code(c).ok())
}

/// A tensor's dtype, as an input: an unknown code is invalid input.
pub fn input_dtype(code: TwDtype, what: &str) -> Result<DType, Failure> {
    dtype_from_c(code)
        .ok_or_else(|| Failure::invalid_input(format!("{what}: unknown dtype code {code}")))
}

/// Dimensions given by C (`ndim` of them), as the client's shape: more
/// than [`TW_MAX_DIMS`] or a negative one is invalid input.
pub fn shape_from_c(dims: &[i64], what: &str) -> Result<Vec<u64>, Failure> {
    if dims.len() > TW_MAX_DIMS {
        return Err(Failure::invalid_input(format!(
            "{what}: {} dims, at most {TW_MAX_DIMS} allowed",
            dims.len()
        )));
    }
    dims.iter()
        .enumerate()
        .map(|(i, &d)| {
            u64::try_from(d).map_err(|_| {
                Failure::invalid_input(format!("{what}: dimension {i} is negative ({d})"))
            })
        })
        .collect()
}

/// The `dims` of a [`TwTensor`] from `ndim`, checked first.
pub fn tensor_shape(t: &TwTensor, what: &str) -> Result<Vec<u64>, Failure> {
    let dims = t.dims.get(..t.ndim).ok_or_else(|| {
        Failure::invalid_input(format!(
            "{what}: {} dims, at most {TW_MAX_DIMS} allowed",
            t.ndim
        ))
    })?;
    shape_from_c(dims, what)
}

/// A shape as C dimensions (`ndim`, `dims`); the agent sent a shape C
/// cannot hold if it has too many dims or one over `INT64_MAX`.
pub fn shape_to_c(shape: &[u64]) -> Result<(usize, [i64; TW_MAX_DIMS]), Failure> {
    let mut dims = [0i64; TW_MAX_DIMS];
    if shape.len() > TW_MAX_DIMS {
        return Err(ClientError::Protocol(format!(
            "the agent sent a tensor of {} dims, at most {TW_MAX_DIMS} allowed",
            shape.len()
        ))
        .into());
    }
    for (slot, &d) in dims.iter_mut().zip(shape) {
        *slot = i64::try_from(d)
            .map_err(|_| ClientError::Protocol(format!("the agent sent a dimension of {d}")))?;
    }
    Ok((shape.len(), dims))
}

/// A declared input or output, held by a model handle so that the name it
/// hands out stays valid.
#[derive(Debug)]
pub struct SpecInfo {
    name: CString,
    dtype: TwDtype,
    ndim: usize,
    dims: [i64; TW_MAX_DIMS],
}

impl SpecInfo {
    /// Converts a signature entry (dynamic dimensions become -1).
    pub fn new(spec: &TensorSpec) -> Result<SpecInfo, Failure> {
        let fixed: Vec<u64> = spec.shape.iter().map(|d| d.unwrap_or(0)).collect();
        let (ndim, mut dims) = shape_to_c(&fixed)?;
        for (slot, d) in dims.iter_mut().zip(&spec.shape) {
            if d.is_none() {
                *slot = -1;
            }
        }
        Ok(SpecInfo {
            name: c_string(&spec.name),
            dtype: TwDtype::from(spec.dtype.code()),
            ndim,
            dims,
        })
    }

    /// The C view (its name borrows from `self`).
    pub fn to_c(&self) -> TwTensorInfo {
        TwTensorInfo {
            name: self.name.as_ptr(),
            dtype: self.dtype,
            ndim: self.ndim,
            dims: self.dims,
        }
    }
}

/// `s` as a C string (a NUL inside, which C cannot hold, shows as `\0`).
pub fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// The name of a dtype code (`"float32"`, `"int64"`, ... as numpy spells
/// them), or NULL for an unknown code. Static: never free it.
///
/// Example:
/// ```c
/// printf("%s %s\n", tw_dtype_name(TW_DTYPE_F16), tw_dtype_name(TW_DTYPE_BOOL));
/// // prints: float16 bool
/// assert(tw_dtype_name(0) == NULL);  // not a dtype code
/// ```
#[no_mangle]
pub extern "C" fn tw_dtype_name(dtype: TwDtype) -> *const c_char {
    guard_value(std::ptr::null(), || {
        Ok(dtype_from_c(dtype).map_or(std::ptr::null(), |d| match d {
            DType::F32 => c"float32".as_ptr(),
            DType::F16 => c"float16".as_ptr(),
            DType::BF16 => c"bfloat16".as_ptr(),
            DType::F64 => c"float64".as_ptr(),
            DType::I8 => c"int8".as_ptr(),
            DType::I16 => c"int16".as_ptr(),
            DType::I32 => c"int32".as_ptr(),
            DType::I64 => c"int64".as_ptr(),
            DType::U8 => c"uint8".as_ptr(),
            DType::U16 => c"uint16".as_ptr(),
            DType::U32 => c"uint32".as_ptr(),
            DType::U64 => c"uint64".as_ptr(),
            DType::Bool => c"bool".as_ptr(),
        }))
    })
}

/// The size of one element of a dtype in bytes, or 0 for an unknown code.
///
/// Example:
/// ```c
/// size_t bytes = tw_dtype_size(TW_DTYPE_F64) * 2 * 3;  // a float64[2, 3]
/// printf("%zu\n", bytes);
/// // prints: 48
/// assert(tw_dtype_size(0) == 0);  // not a dtype code
/// ```
#[no_mangle]
pub extern "C" fn tw_dtype_size(dtype: TwDtype) -> usize {
    guard_value(0, || Ok(dtype_from_c(dtype).map_or(0, DType::size)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn dtype_codes_match_the_wire() {
        let codes = [
            (TW_DTYPE_F32, DType::F32),
            (TW_DTYPE_F16, DType::F16),
            (TW_DTYPE_BF16, DType::BF16),
            (TW_DTYPE_F64, DType::F64),
            (TW_DTYPE_I8, DType::I8),
            (TW_DTYPE_I16, DType::I16),
            (TW_DTYPE_I32, DType::I32),
            (TW_DTYPE_I64, DType::I64),
            (TW_DTYPE_U8, DType::U8),
            (TW_DTYPE_U16, DType::U16),
            (TW_DTYPE_U32, DType::U32),
            (TW_DTYPE_U64, DType::U64),
            (TW_DTYPE_BOOL, DType::Bool),
        ];
        assert_eq!(codes.len(), DType::ALL.len());
        for (c, d) in codes {
            assert_eq!(dtype_from_c(c), Some(d));
            assert_eq!(tw_dtype_size(c), d.size());
            // SAFETY: a known code's name is a static C string.
            let name = unsafe { CStr::from_ptr(tw_dtype_name(c)) };
            assert_eq!(name.to_str().unwrap(), d.name());
        }
        for bad in [0, -1, 14, 256 + 1, i32::MIN] {
            assert_eq!(dtype_from_c(bad), None);
            assert!(tw_dtype_name(bad).is_null());
            assert_eq!(tw_dtype_size(bad), 0);
        }
    }

    #[test]
    fn shapes_are_checked_both_ways() {
        assert_eq!(shape_from_c(&[4, 64], "x").unwrap(), vec![4, 64]);
        let e = shape_from_c(&[4, -1], "input 0").unwrap_err();
        assert_eq!(
            e.message(),
            "invalid input: input 0: dimension 1 is negative (-1)"
        );
        let mut t = TwTensor {
            dtype: TW_DTYPE_F32,
            ndim: 9,
            dims: [1; TW_MAX_DIMS],
            data: std::ptr::null_mut(),
            len: 0,
            capacity: 0,
        };
        assert!(tensor_shape(&t, "input 0")
            .unwrap_err()
            .message()
            .contains("9 dims, at most 8"));
        t.ndim = 0;
        assert!(tensor_shape(&t, "input 0").unwrap().is_empty());
        assert_eq!(shape_to_c(&[2, 3]).unwrap(), (2, [2, 3, 0, 0, 0, 0, 0, 0]));
        assert!(shape_to_c(&[1; 9]).is_err());
        assert!(shape_to_c(&[u64::MAX]).is_err());
    }

    #[test]
    fn dynamic_dims_are_minus_one() {
        let spec = TensorSpec {
            name: "x".into(),
            dtype: DType::F32,
            shape: vec![None, Some(64)],
        };
        let info = SpecInfo::new(&spec).unwrap().to_c();
        assert_eq!(
            (info.dtype, info.ndim, &info.dims[..3]),
            (TW_DTYPE_F32, 2, &[-1, 64, 0][..])
        );
    }
}
