//! NumPy arrays in and out, without a copy.
//!
//! In: an input is any ndarray (other objects go through `numpy.asarray`);
//! its dtype is mapped to the wire's, its shape checked against the
//! model's signature, and its bytes borrowed where they lie (an array that
//! is not C-contiguous is copied once with `numpy.ascontiguousarray`, and
//! the copy counted). Out: an ndarray is made over a [`Block`]'s memory
//! with the block as its `base`, read-only for outputs, writable for
//! `Client.empty` buffers.

use crate::block::Block;
use crate::errors::InvalidInput;
use numpy::npyffi::{self, npy_intp, NpyTypes, NPY_TYPES, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyAny;
use wire::DType;

/// `ml_dtypes.bfloat16`'s descriptor, if that package is installed.
fn bfloat16(py: Python<'_>) -> Option<&Bound<'_, PyArrayDescr>> {
    static BF16: PyOnceLock<Option<Py<PyArrayDescr>>> = PyOnceLock::new();
    BF16.get_or_init(py, || {
        let t = py.import("ml_dtypes").ok()?.getattr("bfloat16").ok()?;
        PyArrayDescr::new(py, t).ok().map(Bound::unbind)
    })
    .as_ref()
    .map(|d| d.bind(py))
}

/// The wire dtype of a NumPy dtype, or `None` if the wire has no such type
/// (complex, object, strings, big-endian, ...).
pub fn wire_dtype(py: Python<'_>, d: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    if d.is_native_byteorder() == Some(false) {
        return None;
    }
    let t = match (d.kind(), d.itemsize()) {
        (b'f', 4) => DType::F32,
        (b'f', 2) => DType::F16,
        (b'f', 8) => DType::F64,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'b', 1) => DType::Bool,
        _ => {
            return bfloat16(py)
                .filter(|b| d.is_equiv_to(b))
                .map(|_| DType::BF16)
        }
    };
    Some(t)
}

/// The NumPy descriptor of a wire dtype (bfloat16: `ml_dtypes`', else
/// uint16 with the same bits).
pub fn descr<'py>(py: Python<'py>, d: DType) -> Bound<'py, PyArrayDescr> {
    let t = match d {
        DType::F32 => NPY_TYPES::NPY_FLOAT,
        DType::F16 => NPY_TYPES::NPY_HALF,
        DType::BF16 => {
            if let Some(b) = bfloat16(py) {
                return b.clone();
            }
            NPY_TYPES::NPY_USHORT
        }
        DType::F64 => NPY_TYPES::NPY_DOUBLE,
        DType::I8 => NPY_TYPES::NPY_BYTE,
        DType::I16 => NPY_TYPES::NPY_SHORT,
        DType::I32 => NPY_TYPES::NPY_INT,
        DType::I64 => NPY_TYPES::NPY_LONGLONG,
        DType::U8 => NPY_TYPES::NPY_UBYTE,
        DType::U16 => NPY_TYPES::NPY_USHORT,
        DType::U32 => NPY_TYPES::NPY_UINT,
        DType::U64 => NPY_TYPES::NPY_ULONGLONG,
        DType::Bool => NPY_TYPES::NPY_BOOL,
    };
    // SAFETY: NumPy's C API with the GIL held; `PyArray_DescrFromType`
    // returns a new reference to a built-in descriptor (never null for
    // these built-in type numbers), which `from_owned_ptr` takes over.
    unsafe {
        let p = PY_ARRAY_API.PyArray_DescrFromType(py, t as i32);
        Bound::from_owned_ptr(py, p as *mut pyo3::ffi::PyObject).cast_into_unchecked()
    }
}

/// An input made ready to send: a C-contiguous array of a wire dtype.
pub struct InputArray<'py> {
    /// The array (a contiguous copy if the caller's was not contiguous).
    pub array: Bound<'py, PyUntypedArray>,
    /// Its wire dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Bytes copied to make it contiguous (0 when it already was).
    pub copied: usize,
}

impl InputArray<'_> {
    /// The array's bytes, where they lie.
    pub fn bytes(&self) -> &[u8] {
        let len = self.array.len() * self.dtype.size();
        if len == 0 {
            return &[];
        }
        // SAFETY: the array is C-contiguous (checked or made so) and holds
        // `len` bytes from its data pointer; `self` keeps a reference to it,
        // so it is not freed while the slice lives, and a referenced array
        // cannot be resized by NumPy.
        unsafe {
            let data = (*self.array.as_array_ptr()).fields.data as *const u8;
            std::slice::from_raw_parts(data, len)
        }
    }
}

/// `value` as an input array; `what` names it in errors (`model: input "x"`,
/// made only when there is an error).
pub fn input<'py>(
    what: impl Fn() -> String,
    value: &Bound<'py, PyAny>,
) -> PyResult<InputArray<'py>> {
    let py = value.py();
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static CONTIGUOUS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let mut array = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            let f = ASARRAY.get_or_try_init(py, || {
                Ok::<_, PyErr>(py.import("numpy")?.getattr("asarray")?.unbind())
            })?;
            f.bind(py)
                .call1((value,))?
                .cast_into::<PyUntypedArray>()
                .map_err(|_| InvalidInput::new_err(format!("{} is not an array", what())))?
        }
    };
    let dt = array.dtype();
    let dtype = wire_dtype(py, &dt).ok_or_else(|| {
        InvalidInput::new_err(format!(
            "{} is {}, which tensorwire does not carry",
            what(),
            dt.str().map(|s| s.to_string()).unwrap_or_default()
        ))
    })?;
    let mut copied = 0;
    if !array.is_c_contiguous() {
        let f = CONTIGUOUS.get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("numpy")?.getattr("ascontiguousarray")?.unbind())
        })?;
        array = f
            .bind(py)
            .call1((&array,))?
            .cast_into::<PyUntypedArray>()
            .map_err(|_| InvalidInput::new_err(format!("{}: no contiguous copy", what())))?;
        copied = array.len() * dtype.size();
    }
    let shape = array.shape().iter().map(|&d| d as u64).collect();
    Ok(InputArray {
        array,
        dtype,
        shape,
        copied,
    })
}

/// An ndarray over `block`'s memory, with `block` as its base.
pub fn over_block(py: Python<'_>, block: Block) -> PyResult<Bound<'_, PyAny>> {
    let (dtype, addr, writable) = (block.wire_dtype(), block.addr(), block.writable());
    let mut dims: Vec<npy_intp> = block.dims().iter().map(|&d| d as npy_intp).collect();
    let block = Bound::new(py, block)?;
    let flags = if writable {
        npyffi::NPY_ARRAY_CARRAY
    } else {
        npyffi::NPY_ARRAY_CARRAY_RO
    };
    let descr = descr(py, dtype);
    // SAFETY: NumPy's C API, called with the GIL held. The descriptor's
    // reference is stolen by `PyArray_NewFromDescr` (hence `into_dtype_ptr`,
    // which hands one over); `dims` outlives the call, which copies it; the
    // data pointer is the block's memory, `len` bytes, alive as long as the
    // block, which `PyArray_SetBaseObject` makes the array's base (stealing
    // the reference `into_ptr` hands over). A null result is an error NumPy
    // has set.
    unsafe {
        let arr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as i32,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            addr as *mut std::ffi::c_void,
            flags,
            std::ptr::null_mut(),
        );
        let arr = Bound::from_owned_ptr_or_err(py, arr)?;
        if PY_ARRAY_API.PyArray_SetBaseObject(
            py,
            arr.as_ptr() as *mut npyffi::PyArrayObject,
            block.into_ptr(),
        ) != 0
        {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}
