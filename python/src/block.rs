//! [`Block`]: memory NumPy views, owned by Rust.
//!
//! A block is either an output (a [`Tensor`]: over shm it views the arena,
//! elsewhere the response buffer) or a buffer from `Client.empty` (a
//! [`TensorBuf`]: over shm an arena allocation that requests send in place).
//! [`crate::arrays::over_block`] makes the one ndarray over it, with the
//! block as the array's `base`, so the memory lives as long as that array
//! or any view of it does, and not a moment longer: there is no way to
//! free a block an array can still read (`Outputs.release` drops its own
//! references and reports, through weak references, which blocks other
//! arrays still hold).

use crate::fork;
use client::{Tensor, TensorBuf};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::mem::ManuallyDrop;
use wire::DType;

/// What keeps a block's memory alive.
enum Holder {
    /// An output of a response.
    Output(#[allow(dead_code)] Tensor),
    /// A buffer the caller fills and sends.
    Buffer(#[allow(dead_code)] TensorBuf),
}

/// Memory an ndarray views (the array's `base`): an output, or a buffer
/// made by `Client.empty`. Private to the package: use the arrays.
#[pyclass(frozen, weakref, module = "tensorwire._native")]
pub struct Block {
    dtype: DType,
    shape: Vec<u64>,
    addr: usize,
    len: usize,
    writable: bool,
    in_arena: bool,
    made: u64,
    /// Dropped by hand: forgotten instead in a forked child.
    holder: ManuallyDrop<Holder>,
}

impl Block {
    /// An output, read-only (over shm it is the agent's memory, or an input
    /// the identity model handed back).
    pub fn output(t: Tensor, in_arena: bool) -> Block {
        let bytes = t.bytes();
        Block {
            dtype: t.dtype,
            shape: t.shape.clone(),
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
            writable: false,
            in_arena,
            made: fork::now(),
            holder: ManuallyDrop::new(Holder::Output(t)),
        }
    }

    /// A fresh buffer for the caller to fill.
    pub fn buffer(mut b: TensorBuf) -> Block {
        let in_arena = b.in_arena();
        let addr = b.as_mut_bytes().as_mut_ptr() as usize;
        Block {
            dtype: b.dtype(),
            shape: b.shape().to_vec(),
            addr,
            len: b.len(),
            writable: true,
            in_arena,
            made: fork::now(),
            holder: ManuallyDrop::new(Holder::Buffer(b)),
        }
    }

    /// The element type.
    pub fn wire_dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u64] {
        &self.shape
    }

    /// The memory's address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Whether arrays over it may write (buffers: yes; outputs: no).
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // In a forked child the memory is the parent's arena and allocator:
        // freeing it from here would corrupt them, so it is forgotten.
        if fork::same_process(self.made) {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.holder) };
        }
    }
}

#[pymethods]
impl Block {
    /// The element type's name (`float32`, `bfloat16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// The dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Whether the memory lies in the session's shared-memory arena.
    #[getter]
    fn in_arena(&self) -> bool {
        self.in_arena
    }

    fn __repr__(&self) -> String {
        format!(
            "Block({}{:?}, {} bytes{})",
            self.dtype,
            self.shape,
            self.len,
            if self.in_arena { ", in arena" } else { "" },
        )
    }
}
