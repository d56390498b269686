//! Running models: `tw_infer` (send, wait, copy the outputs into the
//! caller's buffers) and its pipelined halves `tw_submit` / `tw_wait`
//! ([`TwTicket`], a [`client::Ticket`] and then the response it got, kept
//! so that a wait that found a buffer too small can be retried).

use crate::args::{arg_mut, arg_out, arg_ref, arg_slice, arg_slice_mut};
use crate::client::timeout_from_c;
use crate::error::{guard, guard_value, Failure};
use crate::model::TwModel;
use crate::status::TwStatus;
use crate::types::{input_dtype, shape_to_c, tensor_shape, TwTensor};
use client::{DType, Response, Tensor, TensorRef, Ticket};

/// A request in flight (`tw_ticket`), from `tw_submit`. Used by one thread
/// at a time.
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// int32_t x = 7, y = 0;
/// tw_tensor in = {.dtype = TW_DTYPE_I32, .ndim = 1, .dims = {1}, .data = &x, .len = sizeof x};
/// tw_tensor out = {.data = &y, .capacity = sizeof y};
/// tw_ticket *ticket = NULL;
/// s = tw_submit(identity, &in, 1, &ticket);
/// assert(s == TW_OK);
/// s = tw_wait(ticket, &out, 1, 0);
/// assert(s == TW_OK);
/// printf("%" PRId32 "\n", y);
/// // prints: 7
/// tw_ticket_free(ticket);
/// tw_model_free(identity);
/// ```
pub struct TwTicket {
    /// The request, until `tw_wait` has waited for it.
    pending: Option<Ticket>,
    /// Its response, once it came (kept until the ticket is freed, so that
    /// a wait can be repeated with bigger buffers).
    response: Option<Response>,
}

impl std::fmt::Debug for TwTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwTicket")
            .field("pending", &self.pending)
            .field("answered", &self.response.is_some())
            .finish()
    }
}

/// An input as read from its `tw_tensor`: checked dtype and shape, and
/// where its bytes are.
struct Input {
    dtype: DType,
    shape: Vec<u64>,
    data: *const u8,
    len: usize,
}

/// Reads and checks the input descriptions (not their bytes yet).
fn read_inputs(tensors: &[TwTensor]) -> Result<Vec<Input>, Failure> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let what = format!("input {i}");
            if t.len > isize::MAX as usize {
                return Err(Failure::invalid_input(format!(
                    "{what}: {} bytes do not fit in memory",
                    t.len
                )));
            }
            if t.data.is_null() && t.len > 0 {
                return Err(Failure::null(format!("inputs[{i}].data")));
            }
            Ok(Input {
                dtype: input_dtype(t.dtype, &what)?,
                shape: tensor_shape(t, &what)?,
                data: t.data.cast_const().cast(),
                len: t.len,
            })
        })
        .collect()
}

/// The inputs as the client's tensors, borrowing the caller's bytes; their
/// byte lengths are checked against dtype and shape.
///
/// # Safety
/// Each input's `data` is valid for reads of `len` bytes (NULL only when
/// `len` is 0, which [`read_inputs`] checked) that nothing writes to while
/// the returned tensors live.
unsafe fn tensor_refs(inputs: &[Input]) -> Result<Vec<TensorRef<'_>>, Failure> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let data: &[u8] = if t.len == 0 {
                &[]
            } else {
                // SAFETY: not NULL and at most isize::MAX bytes
                // (read_inputs); valid and unwritten while the tensor
                // lives by the caller's contract; u8 needs no alignment.
                unsafe { std::slice::from_raw_parts(t.data, t.len) }
            };
            TensorRef::new(t.dtype, &t.shape, data).map_err(|e| match e {
                client::ClientError::InvalidInput(m) => {
                    Failure::invalid_input(format!("input {i}: {m}"))
                }
                e => e.into(),
            })
        })
        .collect()
}

/// Refuses an output array that cannot receive the model's outputs, before
/// anything is sent.
fn check_output_args(m: &TwModel, outputs: *mut TwTensor, n: usize) -> Result<(), Failure> {
    if n > 0 && outputs.is_null() {
        return Err(Failure::null("outputs"));
    }
    let sig = m.model.signature();
    if !sig.outputs.is_empty() && n != sig.outputs.len() {
        return Err(Failure::InvalidArgument(format!(
            "model '{}' has {} output(s), n_outputs is {n}",
            sig.name,
            sig.outputs.len()
        )));
    }
    Ok(())
}

/// Fills in each output's dtype, shape and length, and copies those that
/// fit into the caller's buffers; `TW_ERR_BUFFER_TOO_SMALL` for the first
/// that does not (after every output's fields are filled in).
///
/// # Safety
/// `outputs` is NULL or points to `n` valid `tw_tensor`s that nothing else
/// accesses during the call, each `data` valid for writes of `capacity`
/// bytes.
unsafe fn write_outputs(
    tensors: &[Tensor],
    outputs: *mut TwTensor,
    n: usize,
) -> Result<(), Failure> {
    if tensors.len() != n {
        return Err(Failure::InvalidArgument(format!(
            "the model returned {} output(s), n_outputs is {n}",
            tensors.len()
        )));
    }
    // SAFETY: the caller's contract on `outputs`.
    let outs = unsafe { arg_slice_mut(outputs, n, "outputs") }?;
    let mut too_small = None;
    for (i, (t, o)) in tensors.iter().zip(outs.iter_mut()).enumerate() {
        let (ndim, dims) = shape_to_c(&t.shape)?;
        let (src, len) = {
            let b = t.bytes();
            (b.as_ptr(), b.len())
        };
        o.dtype = t.dtype.code().into();
        o.ndim = ndim;
        o.dims = dims;
        o.len = len;
        if len > o.capacity {
            too_small.get_or_insert((i, len, o.capacity, t.dtype, t.shape.clone()));
            continue;
        }
        if len == 0 {
            continue;
        }
        let dst = o.data.cast::<u8>();
        if dst.is_null() {
            return Err(Failure::null(format!("outputs[{i}].data")));
        }
        if dst.cast_const() != src {
            // SAFETY: `src` is the output's `len` bytes, alive while `t`
            // is; `dst` is valid for writes of `capacity >= len` bytes by
            // the caller's contract. `copy` is a memmove: the two may
            // overlap (an output buffer inside a shm input buffer the
            // output aliases), and no reference to either range is alive.
            unsafe { std::ptr::copy(src, dst, len) };
        }
    }
    match too_small {
        None => Ok(()),
        Some((i, len, cap, dtype, shape)) => Err(Failure::BufferTooSmall(format!(
            "output {i} ({dtype}{shape:?}) is {len} bytes, its buffer holds {cap}"
        ))),
    }
}

/// Runs a model: sends `inputs` (in the model's input order), waits for the
/// response (at most the client's timeout) and copies the outputs into
/// `outputs` (see `tw_tensor`). `n_outputs` must be the number of outputs
/// the model declares (for `identity`, which declares none, the number of
/// inputs).
///
/// Errors: `TW_ERR_INVALID_INPUT` when the inputs do not fit the model
/// (count, dtype, shape, byte length), `TW_ERR_BUFFER_TOO_SMALL` when an
/// output does not fit its buffer (every output's `len`, `dtype` and shape
/// are set; the response is gone: use `tw_submit` / `tw_wait` to keep it
/// for a retry), and any error of the session.
///
/// Over `shm://`, input bytes inside a `tw_buffer` are sent where they lie;
/// others are copied into the arena once.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// float x[2][64] = {{0}}, logits[2][10];  // a batch of two 8x8 images
/// tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {2, 64},
///                 .data = x, .len = sizeof x};
/// tw_tensor out = {.data = logits, .capacity = sizeof logits};
/// s = tw_infer(digits, &in, 1, &out, 1);
/// if (s != TW_OK) {
///     fprintf(stderr, "tw_infer: %s: %s\n", tw_status_name(s), tw_last_error());
/// }
/// assert(s == TW_OK);
/// printf("%s[%" PRId64 ", %" PRId64 "], %zu bytes\n", tw_dtype_name(out.dtype),
///        out.dims[0], out.dims[1], out.len);
/// // prints: float32[2, 10], 80 bytes
///
/// float small[4];
/// tw_tensor too_small = {.data = small, .capacity = sizeof small};
/// s = tw_infer(digits, &in, 1, &too_small, 1);
/// printf("%s: needs %zu bytes\n", tw_status_name(s), too_small.len);
/// // prints: TW_ERR_BUFFER_TOO_SMALL: needs 80 bytes
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model. `inputs` is NULL or points to
/// `n_inputs` `tw_tensor`s whose `data` are valid for reads of `len` bytes;
/// `outputs` is NULL or points to `n_outputs` `tw_tensor`s whose `data` are
/// valid for writes of `capacity` bytes. No other thread writes to any of
/// them during the call (`inputs` and `outputs` may be the same array, and
/// an output buffer may be an input's).
#[no_mangle]
pub unsafe extern "C" fn tw_infer(
    model: *const TwModel,
    inputs: *const TwTensor,
    n_inputs: usize,
    outputs: *mut TwTensor,
    n_outputs: usize,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_ref(model, "model") }?;
        // SAFETY: the caller's contract on `inputs`; the descriptions are
        // copied out, so the slice is not used past this statement.
        let inputs = read_inputs(unsafe { arg_slice(inputs, n_inputs, "inputs") }?)?;
        check_output_args(m, outputs, n_outputs)?;
        let response = {
            // SAFETY: the caller's contract on the input bytes; the
            // tensors are dropped at the end of this block, before any
            // output is written.
            let refs = unsafe { tensor_refs(&inputs) }?;
            m.model.infer(&refs)?
        };
        // SAFETY: the caller's contract on `outputs`.
        unsafe { write_outputs(&response.outputs, outputs, n_outputs) }
    })
}

/// Sends a request without waiting for it: `*out` is its ticket, to wait
/// for with `tw_wait` and then free with `tw_ticket_free` (many may be in
/// flight on one client, from one thread or several). The input bytes are
/// not read after this returns, except those in `tw_buffer`s over
/// `shm://`, which the agent reads in place: do not write to those until
/// the request has been waited for.
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// int64_t x[3] = {10, 20, 30}, y[3][3];
/// tw_ticket *tickets[3] = {NULL, NULL, NULL};
/// for (int i = 0; i < 3; i++) {  // three requests in flight at once
///     tw_tensor in = {.dtype = TW_DTYPE_I64, .ndim = 1, .dims = {1},
///                     .data = &x[i], .len = sizeof x[i]};
///     s = tw_submit(identity, &in, 1, &tickets[i]);
///     assert(s == TW_OK);
/// }
/// for (int i = 0; i < 3; i++) {
///     tw_tensor out = {.data = y[i], .capacity = sizeof y[i]};
///     s = tw_wait(tickets[i], &out, 1, 0);
///     assert(s == TW_OK);
///     printf("%" PRId64 " ", y[i][0]);
///     tw_ticket_free(tickets[i]);
/// }
/// printf("\n");
/// // prints: 10 20 30
/// tw_model_free(identity);
/// ```
///
/// # Safety
/// `model` is NULL or a live model; `inputs` is NULL or points to
/// `n_inputs` `tw_tensor`s whose `data` are valid for reads of `len` bytes,
/// unchanged during the call; `out` is NULL or valid for a write of a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn tw_submit(
    model: *const TwModel,
    inputs: *const TwTensor,
    n_inputs: usize,
    out: *mut *mut TwTicket,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_ref(model, "model") }?;
        // SAFETY: the caller's contract on `inputs` (copied out at once).
        let inputs = read_inputs(unsafe { arg_slice(inputs, n_inputs, "inputs") }?)?;
        let ticket = {
            // SAFETY: the caller's contract on the input bytes; the
            // tensors are dropped at the end of this block (the request
            // has been written out, or placed in the arena, by then).
            let refs = unsafe { tensor_refs(&inputs) }?;
            m.model.submit(&refs)?
        };
        *out = Box::into_raw(Box::new(TwTicket {
            pending: Some(ticket),
            response: None,
        }));
        Ok(())
    })
}

/// Waits for a submitted request (at most `timeout_s` seconds; 0 for the
/// client's timeout) and copies its outputs into `outputs`, as `tw_infer`
/// does. The response is kept with the ticket: after
/// `TW_ERR_BUFFER_TOO_SMALL`, call again with bigger buffers. After any
/// other error the request is over (on `TW_ERR_TIMEOUT` its response is
/// discarded when it comes) and further waits fail with
/// `TW_ERR_INVALID_ARGUMENT`. The ticket is still freed with
/// `tw_ticket_free`.
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// double x[3] = {0.5, 1.5, 2.5};
/// tw_tensor in = {.dtype = TW_DTYPE_F64, .ndim = 1, .dims = {3}, .data = x, .len = sizeof x};
/// tw_ticket *ticket = NULL;
/// s = tw_submit(identity, &in, 1, &ticket);
/// assert(s == TW_OK);
/// double one;
/// tw_tensor out = {.data = &one, .capacity = sizeof one};
/// s = tw_wait(ticket, &out, 1, 5.0);  // at most 5 s
/// printf("%s: needs %zu bytes\n", tw_status_name(s), out.len);
/// // prints: TW_ERR_BUFFER_TOO_SMALL: needs 24 bytes
/// double y[3];
/// out.data = y;  // the response is kept: wait again with room for it
/// out.capacity = sizeof y;
/// s = tw_wait(ticket, &out, 1, 5.0);
/// assert(s == TW_OK);
/// printf("%g %g %g\n", y[0], y[1], y[2]);
/// // prints: 0.5 1.5 2.5
/// tw_ticket_free(ticket);
/// tw_model_free(identity);
/// ```
///
/// # Safety
/// `ticket` is NULL or a live ticket that no other thread is using;
/// `outputs` is NULL or points to `n_outputs` `tw_tensor`s whose `data`
/// are valid for writes of `capacity` bytes, unused by other threads during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn tw_wait(
    ticket: *mut TwTicket,
    outputs: *mut TwTensor,
    n_outputs: usize,
    timeout_s: f64,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `ticket`.
        let t = unsafe { arg_mut(ticket, "ticket") }?;
        if n_outputs > 0 && outputs.is_null() {
            return Err(Failure::null("outputs"));
        }
        let timeout = timeout_from_c(timeout_s, "timeout_s")?;
        if let Some(pending) = t.pending.take() {
            let r = match timeout {
                None => pending.wait(),
                Some(d) => pending.wait_timeout(d),
            };
            t.response = Some(r?);
        }
        let r = t.response.as_ref().ok_or_else(|| {
            Failure::InvalidArgument(
                "this ticket's request already failed; free it with tw_ticket_free".into(),
            )
        })?;
        // SAFETY: the caller's contract on `outputs`.
        unsafe { write_outputs(&r.outputs, outputs, n_outputs) }
    })
}

/// Frees a ticket (NULL is ignored). A request not waited for is given up:
/// its response is discarded when it comes.
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// uint16_t x = 42;
/// tw_tensor in = {.dtype = TW_DTYPE_U16, .ndim = 1, .dims = {1}, .data = &x, .len = sizeof x};
/// tw_ticket *ticket = NULL;
/// s = tw_submit(identity, &in, 1, &ticket);
/// assert(s == TW_OK);
/// tw_ticket_free(ticket);  // never waited for: its response is discarded
/// tw_ticket_free(NULL);    // NULL is ignored
/// tw_model_free(identity);
/// ```
///
/// # Safety
/// `ticket` is NULL or a ticket from `tw_submit` not freed before, which
/// no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn tw_ticket_free(ticket: *mut TwTicket) {
    guard_value((), || {
        if !ticket.is_null() {
            // SAFETY: made by Box::into_raw in tw_submit and not freed
            // before (the caller's contract).
            drop(unsafe { Box::from_raw(ticket) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;
    use crate::model::{
        tw_model_input, tw_model_lookup, tw_model_num_inputs, tw_model_num_outputs,
        tw_model_set_priority, tw_model_set_queue_timeout_us,
    };
    use crate::testing::{Conn, TestAgent};
    use crate::types::{TwTensorInfo, TW_DTYPE_F32, TW_DTYPE_I64, TW_DTYPE_U8, TW_MAX_DIMS};
    use std::ffi::c_void;

    /// An input over `data`.
    fn input<T>(dtype: i32, dims: &[i64], data: &[T]) -> TwTensor {
        let mut d = [0; TW_MAX_DIMS];
        d[..dims.len()].copy_from_slice(dims);
        TwTensor {
            dtype,
            ndim: dims.len(),
            dims: d,
            data: data.as_ptr().cast_mut().cast(),
            len: std::mem::size_of_val(data),
            capacity: 0,
        }
    }

    /// An output into `buf`.
    fn output<T>(buf: &mut [T]) -> TwTensor {
        TwTensor {
            dtype: 0,
            ndim: 0,
            dims: [0; TW_MAX_DIMS],
            data: buf.as_mut_ptr().cast::<c_void>(),
            len: 0,
            capacity: std::mem::size_of_val(buf),
        }
    }

    #[test]
    fn priority_and_queue_timeout_reach_the_agent() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let m = c.model("identity");
        let x = [1u8, 2, 3];
        let ins = [input(TW_DTYPE_U8, &[3], &x)];
        let call = || {
            let mut o = [0u8; 3];
            let mut outs = [output(&mut o)];
            // SAFETY: live model; arrays and buffers valid for their lengths.
            unsafe { tw_infer(m.0, ins.as_ptr(), 1, outs.as_mut_ptr(), 1) }
        };
        // identity has one priority level: level 2 is refused by the agent,
        // so the setting travels with the request.
        // SAFETY: a live model no other thread uses.
        assert_eq!(unsafe { tw_model_set_priority(m.0, 2) }, TwStatus::TW_OK);
        assert_eq!(call(), TwStatus::TW_ERR_INVALID_INPUT);
        assert!(last_error().contains("priority 2"), "{}", last_error());
        // SAFETY: as above.
        assert_eq!(unsafe { tw_model_set_priority(m.0, 1) }, TwStatus::TW_OK);
        // SAFETY: as above.
        let s = unsafe { tw_model_set_queue_timeout_us(m.0, 5_000_000) };
        assert_eq!(s, TwStatus::TW_OK);
        assert_eq!(call(), TwStatus::TW_OK, "{}", last_error());
        // SAFETY: NULL is refused, not dereferenced.
        let s = unsafe { tw_model_set_priority(std::ptr::null_mut(), 1) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
    }

    #[test]
    fn identity_round_trip_fills_outputs() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let m = c.model("identity");
        // SAFETY: a live model.
        unsafe {
            assert_eq!(tw_model_num_inputs(m.0), 0, "identity takes anything");
            assert_eq!(tw_model_num_outputs(m.0), 0);
        }
        let x = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let y = [7u8, 8, 9];
        let ins = [
            input(TW_DTYPE_F32, &[2, 3], &x),
            input(TW_DTYPE_U8, &[3], &y),
        ];
        let mut ox = [0f32; 8];
        let mut oy = [0u8; 3];
        let mut outs = [output(&mut ox), output(&mut oy)];
        // SAFETY: live model; arrays and buffers valid for their lengths.
        let s = unsafe { tw_infer(m.0, ins.as_ptr(), 2, outs.as_mut_ptr(), 2) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        assert_eq!(
            (outs[0].dtype, outs[0].ndim, &outs[0].dims[..3], outs[0].len),
            (TW_DTYPE_F32, 2, &[2, 3, 0][..], 24)
        );
        assert_eq!(
            (outs[1].dtype, outs[1].ndim, outs[1].len),
            (TW_DTYPE_U8, 1, 3)
        );
        assert_eq!(&ox[..6], &x);
        assert_eq!(ox[6], 0.0, "nothing written past len");
        assert_eq!(oy, y);
    }

    #[test]
    fn a_small_output_buffer_reports_the_size_it_needs() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let m = c.model("identity");
        let x = [5i64; 10];
        let ins = [input(TW_DTYPE_I64, &[2, 5], &x)];
        let mut small = [0i64; 4];
        let mut outs = [output(&mut small)];
        // SAFETY: as above.
        let s = unsafe { tw_infer(m.0, ins.as_ptr(), 1, outs.as_mut_ptr(), 1) };
        assert_eq!(s, TwStatus::TW_ERR_BUFFER_TOO_SMALL);
        assert_eq!(
            last_error(),
            "buffer too small: output 0 (int64[2, 5]) is 80 bytes, its buffer holds 32"
        );
        assert_eq!((outs[0].len, outs[0].ndim, outs[0].dims[1]), (80, 2, 5));
        assert_eq!(small, [0; 4], "nothing written");

        // The pipelined form keeps the response for a retry.
        let mut t = std::ptr::null_mut();
        // SAFETY: live model, valid inputs and out-pointer.
        let s = unsafe { tw_submit(m.0, ins.as_ptr(), 1, &mut t) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        // SAFETY: a live ticket and valid outputs.
        let s = unsafe { tw_wait(t, outs.as_mut_ptr(), 1, 5.0) };
        assert_eq!(s, TwStatus::TW_ERR_BUFFER_TOO_SMALL);
        let mut big = vec![0i64; outs[0].len / 8];
        let mut outs = [output(&mut big)];
        // SAFETY: as above.
        let s = unsafe { tw_wait(t, outs.as_mut_ptr(), 1, 0.0) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        assert_eq!(big, x);
        // SAFETY: from tw_submit, freed once.
        unsafe { tw_ticket_free(t) };
    }

    #[test]
    fn bad_inputs_are_refused_with_their_codes() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let m = c.model("identity");
        let x = [1f32; 6];
        let mut o = [0f32; 6];
        let call = |ins: &[TwTensor], n_in: usize, outs: *mut TwTensor, n_out: usize| {
            let p = if ins.is_empty() {
                std::ptr::null()
            } else {
                ins.as_ptr()
            };
            // SAFETY: a live model; arrays valid for the counts used below
            // (NULL with a count is what is being tested).
            unsafe { tw_infer(m.0, p, n_in, outs, n_out) }
        };
        let mut outs = [output(&mut o)];
        let op = outs.as_mut_ptr();

        assert_eq!(call(&[], 1, op, 1), TwStatus::TW_ERR_NULL_ARGUMENT);
        assert_eq!(last_error(), "null argument: `inputs` is NULL");

        let mut t = input(TW_DTYPE_F32, &[2, 3], &x);
        t.dtype = 99;
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_INVALID_INPUT);
        assert_eq!(
            last_error(),
            "invalid input: input 0: unknown dtype code 99"
        );

        let t = input(TW_DTYPE_F32, &[2, -3], &x);
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_INVALID_INPUT);
        assert!(
            last_error().contains("dimension 1 is negative"),
            "{}",
            last_error()
        );

        let mut t = input(TW_DTYPE_F32, &[2, 3], &x);
        t.ndim = TW_MAX_DIMS + 1;
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_INVALID_INPUT);

        let mut t = input(TW_DTYPE_F32, &[2, 3], &x);
        t.len = 20;
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_INVALID_INPUT);
        assert_eq!(
            last_error(),
            "invalid input: input 0: float32[2, 3] needs 24 bytes, got 20"
        );

        let mut t = input(TW_DTYPE_F32, &[2, 3], &x);
        t.data = std::ptr::null_mut();
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_NULL_ARGUMENT);
        assert_eq!(last_error(), "null argument: `inputs[0].data` is NULL");

        let t = input(TW_DTYPE_F32, &[2, 3], &x);
        assert_eq!(
            call(&[t], 1, std::ptr::null_mut(), 1),
            TwStatus::TW_ERR_NULL_ARGUMENT
        );
        assert_eq!(last_error(), "null argument: `outputs` is NULL");

        assert_eq!(call(&[t], 1, op, 0), TwStatus::TW_ERR_INVALID_ARGUMENT);
        assert_eq!(
            last_error(),
            "invalid argument: the model returned 1 output(s), n_outputs is 0"
        );

        outs[0].data = std::ptr::null_mut();
        let op = outs.as_mut_ptr();
        assert_eq!(call(&[t], 1, op, 1), TwStatus::TW_ERR_NULL_ARGUMENT);
        assert_eq!(last_error(), "null argument: `outputs[0].data` is NULL");

        // SAFETY: NULL model, everything else unused.
        let s = unsafe { tw_infer(std::ptr::null(), std::ptr::null(), 0, op, 0) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
        // SAFETY: NULL ticket.
        let s = unsafe { tw_wait(std::ptr::null_mut(), op, 0, 0.0) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
        // SAFETY: NULL is allowed.
        unsafe { tw_ticket_free(std::ptr::null_mut()) };
    }

    #[test]
    fn lookups_fail_with_their_codes() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let mut m = std::ptr::null_mut();
        // SAFETY: live client, valid string and out-pointer.
        let s = unsafe { tw_model_lookup(c.0, c"no-such-model".as_ptr(), &mut m) };
        assert_eq!(s, TwStatus::TW_ERR_UNKNOWN_MODEL);
        assert!(m.is_null());
        assert!(
            last_error().starts_with("unknown model: "),
            "{}",
            last_error()
        );
        assert!(last_error().contains("no-such-model"), "{}", last_error());
        // SAFETY: as above, with a NUL-terminated non-UTF-8 name.
        let s = unsafe { tw_model_lookup(c.0, c"\xc3(".as_ptr(), &mut m) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_ARGUMENT);
        assert!(
            last_error().contains("`name` is not UTF-8"),
            "{}",
            last_error()
        );

        let id = c.model("identity");
        let mut info = std::mem::MaybeUninit::<TwTensorInfo>::uninit();
        // SAFETY: live model, valid out-pointer.
        let s = unsafe { tw_model_input(id.0, 0, info.as_mut_ptr()) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_ARGUMENT);
        assert_eq!(
            last_error(),
            "invalid argument: input 0 does not exist: model 'identity' declares 0 inputs"
        );
    }

    #[test]
    fn timeouts_must_be_positive() {
        let agent = TestAgent::start();
        let c = Conn::open(&agent.inproc);
        let m = c.model("identity");
        let mut t = std::ptr::null_mut();
        // SAFETY: live model, no inputs, valid out-pointer.
        let s = unsafe { tw_submit(m.0, std::ptr::null(), 0, &mut t) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        // SAFETY: a live ticket, no outputs.
        let s = unsafe { tw_wait(t, std::ptr::null_mut(), 0, -2.0) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_ARGUMENT);
        // SAFETY: as above.
        let s = unsafe { tw_wait(t, std::ptr::null_mut(), 0, 0.0) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        // SAFETY: from tw_submit, freed once.
        unsafe { tw_ticket_free(t) };
    }
}
