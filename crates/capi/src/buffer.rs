//! Tensor buffers the library allocates (`tw_alloc`, [`TwBuffer`], a
//! [`client::TensorBuf`]): in the session's shared-memory arena over
//! `shm://`, so that an input written there is sent without a copy; in
//! ordinary memory elsewhere, so that the same C code runs on every
//! transport.

use crate::args::{arg_out, arg_ref, arg_slice};
use crate::client::TwClient;
use crate::error::{guard, guard_value, Failure};
use crate::status::TwStatus;
use crate::types::{shape_from_c, shape_to_c, TwDtype, TwTensor, TW_MAX_DIMS};
use client::{DType, TensorBuf};
use std::ffi::c_void;

/// A tensor buffer from `tw_alloc` (`tw_buffer`).
///
/// Example:
/// ```c
/// int64_t dims[2] = {1, 64};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_F32, dims, 2, &buf);
/// assert(s == TW_OK);
/// float *x = tw_buffer_data(buf);
/// for (size_t i = 0; i < tw_buffer_len(buf) / sizeof(float); i++) {
///     x[i] = 0.0f;
/// }
/// tw_tensor in;
/// s = tw_buffer_tensor(buf, &in);
/// assert(s == TW_OK);
/// tw_model *digits = NULL;
/// s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// float logits[10];
/// tw_tensor out = {.data = logits, .capacity = sizeof logits};
/// s = tw_infer(digits, &in, 1, &out, 1);
/// assert(s == TW_OK);
/// printf("sent from the arena: %s\n", tw_buffer_in_arena(buf) ? "yes" : "no");
/// // prints: sent from the arena: yes
/// tw_model_free(digits);
/// tw_buffer_free(buf);
/// ```
#[derive(Debug)]
pub struct TwBuffer {
    buf: TensorBuf,
    /// The bytes, writable by C: taken once when the buffer was made (it
    /// was not shared then), never through `buf` again, so that the Rust
    /// side holds no reference that C's writes could invalidate.
    data: *mut u8,
}

/// Allocates a tensor of `dtype` and `dims[0..ndim]` for the caller to fill
/// (through `tw_buffer_data`) and pass to `tw_infer` (use
/// `tw_buffer_tensor` to describe it). Over `shm://` it lies in the
/// session's arena and is sent without a copy (a full arena is
/// `TW_ERR_LIMIT_EXCEEDED`); elsewhere it is ordinary 64-byte aligned
/// memory. A fresh arena buffer holds what its range last held: overwrite
/// all of it. Free it with `tw_buffer_free`.
///
/// Example:
/// ```c
/// int64_t dims[2] = {2, 64};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_F32, dims, 2, &buf);
/// assert(s == TW_OK);
/// memset(tw_buffer_data(buf), 0, tw_buffer_len(buf));  // overwrite all of it
/// printf("%zu bytes, in the arena: %s\n", tw_buffer_len(buf),
///        tw_buffer_in_arena(buf) ? "yes" : "no");
/// // prints: 512 bytes, in the arena: yes
/// tw_buffer_free(buf);
/// ```
///
/// # Safety
/// `client` is NULL or a live client; `dims` is NULL (only if `ndim` is 0)
/// or points to `ndim` `int64_t`s; `out` is NULL or valid for a write of a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn tw_alloc(
    client: *const TwClient,
    dtype: TwDtype,
    dims: *const i64,
    ndim: usize,
    out: *mut *mut TwBuffer,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: the caller's contract on `client`.
        let c = unsafe { arg_ref(client, "client") }?;
        let dtype = crate::types::input_dtype(dtype, "tw_alloc")?;
        if ndim > TW_MAX_DIMS {
            return Err(Failure::invalid_input(format!(
                "tw_alloc: {ndim} dims, at most {TW_MAX_DIMS} allowed"
            )));
        }
        // SAFETY: the caller's contract on `dims` (ndim checked small).
        let dims = unsafe { arg_slice(dims, ndim, "dims") }?;
        let shape = shape_from_c(dims, "tw_alloc")?;
        let buf = alloc(c, dtype, &shape)?;
        *out = Box::into_raw(Box::new(buf));
        Ok(())
    })
}

fn alloc(c: &TwClient, dtype: DType, shape: &[u64]) -> Result<TwBuffer, Failure> {
    let mut buf = c.client.alloc_tensor(dtype, shape)?;
    let data = buf
        .try_as_mut_bytes()
        .ok_or_else(|| Failure::Internal("a fresh tensor buffer is shared".into()))?
        .as_mut_ptr();
    Ok(TwBuffer { buf, data })
}

/// The buffer's bytes (NULL if `buffer` is NULL), valid until it is
/// freed. Do not write to them while a request that reads them is in
/// flight (`tw_submit` not yet waited for).
///
/// Example:
/// ```c
/// int64_t dims[1] = {4};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_I32, dims, 1, &buf);
/// assert(s == TW_OK);
/// int32_t *v = tw_buffer_data(buf);
/// for (int i = 0; i < 4; i++) {
///     v[i] = i * i;
/// }
/// printf("%" PRId32 " %" PRId32 " %" PRId32 " %" PRId32 "\n", v[0], v[1], v[2], v[3]);
/// // prints: 0 1 4 9
/// tw_buffer_free(buf);
/// ```
///
/// # Safety
/// `buffer` is NULL or a live buffer.
#[no_mangle]
pub unsafe extern "C" fn tw_buffer_data(buffer: *const TwBuffer) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: the caller's contract on `buffer`.
        Ok(unsafe { arg_ref(buffer, "buffer") }?.data.cast())
    })
}

/// The buffer's size in bytes (0 if `buffer` is NULL).
///
/// Example:
/// ```c
/// int64_t dims[2] = {3, 5};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_F64, dims, 2, &buf);
/// assert(s == TW_OK);
/// printf("%zu\n", tw_buffer_len(buf));  // 3 * 5 * 8
/// // prints: 120
/// tw_buffer_free(buf);
/// ```
///
/// # Safety
/// `buffer` is NULL or a live buffer.
#[no_mangle]
pub unsafe extern "C" fn tw_buffer_len(buffer: *const TwBuffer) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract on `buffer`.
        Ok(unsafe { arg_ref(buffer, "buffer") }?.buf.len())
    })
}

/// Whether the buffer lies in a shared-memory arena (and so is sent
/// without a copy); false on other transports and if `buffer` is NULL.
///
/// Example:
/// ```c
/// int64_t dims[1] = {16};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_U8, dims, 1, &buf);
/// assert(s == TW_OK);
/// printf("%s\n", tw_buffer_in_arena(buf) ? "in the arena" : "ordinary memory");
/// // prints: in the arena
/// tw_buffer_free(buf);
/// ```
///
/// # Safety
/// `buffer` is NULL or a live buffer.
#[no_mangle]
pub unsafe extern "C" fn tw_buffer_in_arena(buffer: *const TwBuffer) -> bool {
    guard_value(false, || {
        // SAFETY: the caller's contract on `buffer`.
        Ok(unsafe { arg_ref(buffer, "buffer") }?.buf.in_arena())
    })
}

/// Describes the buffer as an input `tw_tensor` (its dtype, dims, data and
/// len; capacity = len), ready for `tw_infer`.
///
/// Example:
/// ```c
/// int64_t dims[2] = {1, 3};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_F32, dims, 2, &buf);
/// assert(s == TW_OK);
/// float *x = tw_buffer_data(buf);
/// x[0] = 1.0f;
/// x[1] = 2.0f;
/// x[2] = 3.0f;
/// tw_tensor in;
/// s = tw_buffer_tensor(buf, &in);
/// assert(s == TW_OK);
/// printf("%s[%" PRId64 ", %" PRId64 "], %zu bytes\n", tw_dtype_name(in.dtype), in.dims[0],
///        in.dims[1], in.len);
/// // prints: float32[1, 3], 12 bytes
/// tw_model *identity = NULL;
/// s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// float y[3];
/// tw_tensor out = {.data = y, .capacity = sizeof y};
/// s = tw_infer(identity, &in, 1, &out, 1);
/// assert(s == TW_OK);
/// printf("%g %g %g\n", y[0], y[1], y[2]);
/// // prints: 1 2 3
/// tw_model_free(identity);
/// tw_buffer_free(buf);
/// ```
///
/// # Safety
/// `buffer` is NULL or a live buffer; `out` is NULL or valid for a write
/// of a `tw_tensor`.
#[no_mangle]
pub unsafe extern "C" fn tw_buffer_tensor(buffer: *const TwBuffer, out: *mut TwTensor) -> TwStatus {
    guard(|| {
        let empty = TwTensor {
            dtype: 0,
            ndim: 0,
            dims: [0; TW_MAX_DIMS],
            data: std::ptr::null_mut(),
            len: 0,
            capacity: 0,
        };
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, empty, "out") }?;
        // SAFETY: the caller's contract on `buffer`.
        let b = unsafe { arg_ref(buffer, "buffer") }?;
        let (ndim, dims) = shape_to_c(b.buf.shape())?;
        *out = TwTensor {
            dtype: b.buf.dtype().code().into(),
            ndim,
            dims,
            data: b.data.cast(),
            len: b.buf.len(),
            capacity: b.buf.len(),
        };
        Ok(())
    })
}

/// Frees a buffer (NULL is ignored). Over `shm://` its arena range returns
/// to the session once no request in flight reads it.
///
/// Example:
/// ```c
/// int64_t dims[1] = {8};
/// tw_buffer *buf = NULL;
/// tw_status s = tw_alloc(client, TW_DTYPE_F32, dims, 1, &buf);
/// assert(s == TW_OK);
/// tw_buffer_free(buf);   // its arena range is the session's again
/// tw_buffer_free(NULL);  // NULL is ignored
/// ```
///
/// # Safety
/// `buffer` is NULL or a buffer from `tw_alloc` not freed before, which no
/// other thread is using.
#[no_mangle]
pub unsafe extern "C" fn tw_buffer_free(buffer: *mut TwBuffer) {
    guard_value((), || {
        if !buffer.is_null() {
            // SAFETY: made by Box::into_raw in tw_alloc and not freed
            // before (the caller's contract).
            drop(unsafe { Box::from_raw(buffer) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;

    #[test]
    fn accessors_refuse_null() {
        // SAFETY: NULL is allowed everywhere here.
        unsafe {
            assert!(tw_buffer_data(std::ptr::null()).is_null());
            assert_eq!(last_error(), "null argument: `buffer` is NULL");
            assert_eq!(tw_buffer_len(std::ptr::null()), 0);
            assert!(!tw_buffer_in_arena(std::ptr::null()));
            let mut t = std::mem::MaybeUninit::<TwTensor>::uninit();
            let s = tw_buffer_tensor(std::ptr::null(), t.as_mut_ptr());
            assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
            assert!(t.assume_init().data.is_null(), "out is cleared first");
            let mut b: *mut TwBuffer = std::ptr::dangling_mut();
            let s = tw_alloc(std::ptr::null(), 1, std::ptr::null(), 0, &mut b);
            assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
            assert!(b.is_null());
            tw_buffer_free(std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod transport_tests {
    use super::*;
    use crate::client::tw_client_copy_stats;
    use crate::error::last_error;
    use crate::infer::tw_infer;
    use crate::testing::{Conn, TestAgent};
    use crate::types::{TwCopyStats, TW_DTYPE_F32};

    fn alloc(c: &Conn, dims: &[i64]) -> *mut TwBuffer {
        let mut b = std::ptr::null_mut();
        // SAFETY: a live client; dims valid for its length; valid out.
        let s = unsafe { tw_alloc(c.0, TW_DTYPE_F32, dims.as_ptr(), dims.len(), &mut b) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        b
    }

    fn stats(c: &Conn) -> TwCopyStats {
        let mut st = TwCopyStats::default();
        // SAFETY: a live client, a valid out-pointer.
        let s = unsafe { tw_client_copy_stats(c.0, &mut st) };
        assert_eq!(s, TwStatus::TW_OK);
        st
    }

    /// Fills the buffer with 0, 1, 2, ... and sends it through `identity`
    /// into `out` (or back into itself when `out` is None).
    fn round_trip(c: &Conn, b: *mut TwBuffer, out: Option<&mut [f32]>) {
        let m = c.model("identity");
        let mut t = std::mem::MaybeUninit::<TwTensor>::uninit();
        // SAFETY: a live buffer, a valid out-pointer.
        let s = unsafe { tw_buffer_tensor(b, t.as_mut_ptr()) };
        assert_eq!(s, TwStatus::TW_OK);
        // SAFETY: initialized by the successful call.
        let t = unsafe { t.assume_init() };
        // SAFETY: the buffer's data holds len bytes of f32s (64-byte
        // aligned), nothing else uses it now.
        let xs =
            unsafe { std::slice::from_raw_parts_mut(tw_buffer_data(b).cast::<f32>(), t.len / 4) };
        for (i, x) in xs.iter_mut().enumerate() {
            *x = i as f32;
        }
        let mut o = t;
        if let Some(out) = out {
            o.data = out.as_mut_ptr().cast();
            o.capacity = std::mem::size_of_val(out);
        }
        // SAFETY: live model; input and output valid for len / capacity.
        let s = unsafe { tw_infer(m.0, &t, 1, &mut o, 1) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        assert_eq!((o.len, o.ndim, o.dims[0], o.dims[1]), (t.len, 2, 4, 16));
    }

    #[test]
    fn arena_buffers_are_sent_without_a_copy() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.shm);
        let b = alloc(&c, &[4, 16]);
        // SAFETY: a live buffer.
        unsafe {
            assert!(tw_buffer_in_arena(b));
            assert_eq!(tw_buffer_len(b), 256);
            assert_eq!(tw_buffer_data(b) as usize % 64, 0);
        }
        let mut out = [0f32; 64];
        round_trip(&c, b, Some(&mut out));
        assert_eq!(out[63], 63.0);
        assert_eq!(stats(&c).input_bytes_copied, 0, "sent in place");
        // Into the buffer itself: identity's output aliases its input.
        round_trip(&c, b, None);
        assert_eq!(stats(&c).input_bytes_copied, 0);
        // Ordinary memory is copied in once.
        let m = c.model("identity");
        let x = [1f32; 4];
        let t = TwTensor {
            dtype: TW_DTYPE_F32,
            ndim: 1,
            dims: [4, 0, 0, 0, 0, 0, 0, 0],
            data: x.as_ptr().cast_mut().cast(),
            len: 16,
            capacity: 0,
        };
        let mut y = [0f32; 4];
        let mut o = TwTensor {
            data: y.as_mut_ptr().cast(),
            capacity: 16,
            ..t
        };
        // SAFETY: live model; input and output valid for 16 bytes.
        let s = unsafe { tw_infer(m.0, &t, 1, &mut o, 1) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        assert_eq!((y, stats(&c).input_bytes_copied), (x, 16));
        // SAFETY: from tw_alloc, freed once.
        unsafe { tw_buffer_free(b) };
    }

    #[test]
    fn heap_buffers_work_the_same_elsewhere() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let b = alloc(&c, &[4, 16]);
        // SAFETY: a live buffer.
        assert!(!unsafe { tw_buffer_in_arena(b) });
        let mut out = [0f32; 64];
        round_trip(&c, b, Some(&mut out));
        assert_eq!(out[10], 10.0);
        // SAFETY: from tw_alloc, freed once.
        unsafe { tw_buffer_free(b) };
    }

    #[test]
    fn alloc_checks_its_arguments() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let mut b = std::ptr::null_mut();
        let dims = [2i64, -1];
        // SAFETY: a live client, dims valid for 2, valid out.
        let s = unsafe { tw_alloc(c.0, TW_DTYPE_F32, dims.as_ptr(), 2, &mut b) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_INPUT);
        assert!(b.is_null());
        // SAFETY: as above (the dims are not read past the count check).
        let s = unsafe { tw_alloc(c.0, TW_DTYPE_F32, dims.as_ptr(), 9, &mut b) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_INPUT);
        // SAFETY: as above.
        let s = unsafe { tw_alloc(c.0, 0, dims.as_ptr(), 1, &mut b) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_INPUT);
        assert_eq!(
            last_error(),
            "invalid input: tw_alloc: unknown dtype code 0"
        );
        // SAFETY: NULL dims with a count.
        let s = unsafe { tw_alloc(c.0, TW_DTYPE_F32, std::ptr::null(), 1, &mut b) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
        // A scalar needs no dims.
        // SAFETY: NULL dims, no count.
        let s = unsafe { tw_alloc(c.0, TW_DTYPE_F32, std::ptr::null(), 0, &mut b) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        // SAFETY: a live buffer, then freed once.
        unsafe {
            assert_eq!(tw_buffer_len(b), 4);
            tw_buffer_free(b);
        }
    }
}
