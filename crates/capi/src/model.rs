//! Models: `tw_model_lookup` looks one up by name on a client ([`TwModel`], a
//! [`client::Model`]), the accessors read its signature (name, inputs,
//! outputs), and two setters say what its later requests ask of the
//! agent's queue (priority level, queue timeout).

use crate::args::{arg_mut, arg_out, arg_ref, arg_str};
use crate::client::TwClient;
use crate::error::{guard, guard_value, Failure};
use crate::status::TwStatus;
use crate::types::{c_string, SpecInfo, TwTensorInfo, TW_MAX_DIMS};
use client::Model;
use std::ffi::{c_char, CString};

/// A model resolved on a client (`tw_model`): its id and signature. May be
/// used from many threads at once; it keeps its client's session open.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// printf("%s: %zu input(s), %zu output(s)\n", tw_model_name(digits),
///        tw_model_num_inputs(digits), tw_model_num_outputs(digits));
/// // prints: digits: 1 input(s), 1 output(s)
/// tw_model_free(digits);
/// ```
#[derive(Debug)]
pub struct TwModel {
    /// The Rust model handle.
    pub model: Model,
    name: CString,
    inputs: Vec<SpecInfo>,
    outputs: Vec<SpecInfo>,
}

impl TwModel {
    /// Wraps a model, converting its signature for C once.
    pub fn new(model: Model) -> Result<TwModel, Failure> {
        let sig = model.signature();
        Ok(TwModel {
            name: c_string(&sig.name),
            inputs: sig
                .inputs
                .iter()
                .map(SpecInfo::new)
                .collect::<Result<_, _>>()?,
            outputs: sig
                .outputs
                .iter()
                .map(SpecInfo::new)
                .collect::<Result<_, _>>()?,
            model,
        })
    }
}

/// Looks a model up by name. On success `*out` is the model (free it with
/// `tw_model_free`); on failure it is NULL and the status is
/// `TW_ERR_UNKNOWN_MODEL` when the agent serves no such model.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// printf("found %s\n", tw_model_name(digits));
/// // prints: found digits
/// tw_model_free(digits);
///
/// tw_model *none = NULL;
/// s = tw_model_lookup(client, "no-such-model", &none);
/// printf("%s, none is %s\n", tw_status_name(s), none == NULL ? "NULL" : "set");
/// // prints: TW_ERR_UNKNOWN_MODEL, none is NULL
/// ```
///
/// # Safety
/// `client` is NULL or a live client; `name` is NULL or a NUL-terminated
/// string; `out` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn tw_model_lookup(
    client: *const TwClient,
    name: *const c_char,
    out: *mut *mut TwModel,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: the caller's contract on `client`.
        let c = unsafe { arg_ref(client, "client") }?;
        // SAFETY: the caller's contract on `name`.
        let name = unsafe { arg_str(name, "name") }?;
        let m = TwModel::new(c.client.model(name)?)?;
        *out = Box::into_raw(Box::new(m));
        Ok(())
    })
}

/// Frees a model (NULL is ignored). Strings it handed out become invalid.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// const char *name = tw_model_name(digits);
/// printf("%s\n", name);
/// // prints: digits
/// tw_model_free(digits);  // name is invalid from here on
/// tw_model_free(NULL);    // NULL is ignored
/// ```
///
/// # Safety
/// `model` is NULL or a model from `tw_model_lookup` not freed before, which no
/// other thread is using.
#[no_mangle]
pub unsafe extern "C" fn tw_model_free(model: *mut TwModel) {
    guard_value((), || {
        if !model.is_null() {
            // SAFETY: made by Box::into_raw in tw_model_lookup and not freed
            // before (the caller's contract).
            drop(unsafe { Box::from_raw(model) });
        }
        Ok(())
    })
}

/// Sets the priority level of the model's later requests through this
/// handle: 1 is the highest, up to the model's `priority_levels`; 0 (the
/// default) is the model's default level. A level the model does not have
/// is refused by the agent, per request (`TW_ERR_INVALID_INPUT`).
///
/// Example:
/// ```c
/// tw_model *identity = NULL;
/// tw_status s = tw_model_lookup(client, "identity", &identity);
/// assert(s == TW_OK);
/// float x[4] = {1, 2, 3, 4}, y[4];
/// tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 1, .dims = {4}, .data = x, .len = sizeof x};
/// tw_tensor out = {.data = y, .capacity = sizeof y};
/// s = tw_model_set_priority(identity, 1);  // the highest level
/// assert(s == TW_OK);
/// s = tw_infer(identity, &in, 1, &out, 1);
/// printf("level 1: %s\n", tw_status_name(s));
/// // prints: level 1: TW_OK
/// s = tw_model_set_priority(identity, 2);  // a level this model does not have
/// assert(s == TW_OK);
/// s = tw_infer(identity, &in, 1, &out, 1);
/// printf("level 2: %s\n", tw_status_name(s));
/// // prints: level 2: TW_ERR_INVALID_INPUT
/// tw_model_free(identity);
/// ```
///
/// # Safety
/// `model` is NULL or a live model that no other thread uses during the
/// call.
#[no_mangle]
pub unsafe extern "C" fn tw_model_set_priority(model: *mut TwModel, level: u8) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_mut(model, "model") }?;
        m.model = m.model.clone().with_priority(level);
        Ok(())
    })
}

/// Sets how long the model's later requests through this handle may wait
/// in the agent's queue, in µs: past it a request is answered
/// `TW_ERR_TIMEOUT` without being computed (the model's own default
/// timeout, when it has one, caps it). 0 (the default): the model's
/// default.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// s = tw_model_set_queue_timeout_us(digits, 50000);  // wait at most 50 ms in the queue
/// assert(s == TW_OK);
/// float x[64] = {0}, logits[10];
/// tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {1, 64}, .data = x, .len = sizeof x};
/// tw_tensor out = {.data = logits, .capacity = sizeof logits};
/// s = tw_infer(digits, &in, 1, &out, 1);  // TW_ERR_TIMEOUT if it waited longer
/// printf("%s\n", tw_status_name(s));
/// // prints: TW_OK
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model that no other thread uses during the
/// call.
#[no_mangle]
pub unsafe extern "C" fn tw_model_set_queue_timeout_us(
    model: *mut TwModel,
    timeout_us: u32,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_mut(model, "model") }?;
        m.model = m
            .model
            .clone()
            .with_queue_timeout(std::time::Duration::from_micros(timeout_us.into()));
        Ok(())
    })
}

/// The model's name (valid as long as the model), or NULL if `model` is
/// NULL.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// printf("%s\n", tw_model_name(digits));
/// // prints: digits
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tw_model_name(model: *const TwModel) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_ref(model, "model") }?;
        Ok(m.name.as_ptr())
    })
}

/// How many inputs the model declares (0 if `model` is NULL). The built-in
/// `identity` model declares none and takes any tensors.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// tw_tensor_info info;
/// for (size_t i = 0; i < tw_model_num_inputs(digits); i++) {
///     s = tw_model_input(digits, i, &info);
///     assert(s == TW_OK);
///     printf("input %zu: %s\n", i, info.name);
/// }
/// // prints: input 0: x
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tw_model_num_inputs(model: *const TwModel) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract on `model`.
        Ok(unsafe { arg_ref(model, "model") }?.inputs.len())
    })
}

/// How many outputs the model declares (0 if `model` is NULL; the
/// `identity` model declares none and returns its inputs).
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// tw_tensor_info info;
/// for (size_t i = 0; i < tw_model_num_outputs(digits); i++) {
///     s = tw_model_output(digits, i, &info);
///     assert(s == TW_OK);
///     printf("output %zu: %s\n", i, info.name);
/// }
/// // prints: output 0: logits
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tw_model_num_outputs(model: *const TwModel) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract on `model`.
        Ok(unsafe { arg_ref(model, "model") }?.outputs.len())
    })
}

/// Input `index` of the model, into `*out` (dynamic dimensions are -1).
/// `TW_ERR_INVALID_ARGUMENT` if there is no such input.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// tw_tensor_info info;
/// s = tw_model_input(digits, 0, &info);
/// assert(s == TW_OK);
/// printf("%s %s[%" PRId64 ", %" PRId64 "]\n", info.name, tw_dtype_name(info.dtype),
///        info.dims[0], info.dims[1]);
/// // prints: x float32[-1, 64]
/// s = tw_model_input(digits, 1, &info);  // digits has one input
/// printf("%s\n", tw_status_name(s));
/// // prints: TW_ERR_INVALID_ARGUMENT
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model; `out` is NULL or valid for a write of
/// a `tw_tensor_info`.
#[no_mangle]
pub unsafe extern "C" fn tw_model_input(
    model: *const TwModel,
    index: usize,
    out: *mut TwTensorInfo,
) -> TwStatus {
    // SAFETY: the caller's contract, passed on.
    unsafe { spec(model, index, out, "input") }
}

/// Output `index` of the model, into `*out` (dynamic dimensions are -1).
/// `TW_ERR_INVALID_ARGUMENT` if there is no such output.
///
/// Example:
/// ```c
/// tw_model *digits = NULL;
/// tw_status s = tw_model_lookup(client, "digits", &digits);
/// assert(s == TW_OK);
/// tw_tensor_info info;
/// s = tw_model_output(digits, 0, &info);
/// assert(s == TW_OK);
/// printf("%s %s[%" PRId64 ", %" PRId64 "]\n", info.name, tw_dtype_name(info.dtype),
///        info.dims[0], info.dims[1]);
/// // prints: logits float32[-1, 10]
/// tw_model_free(digits);
/// ```
///
/// # Safety
/// `model` is NULL or a live model; `out` is NULL or valid for a write of
/// a `tw_tensor_info`.
#[no_mangle]
pub unsafe extern "C" fn tw_model_output(
    model: *const TwModel,
    index: usize,
    out: *mut TwTensorInfo,
) -> TwStatus {
    // SAFETY: the caller's contract, passed on.
    unsafe { spec(model, index, out, "output") }
}

/// # Safety
/// As for [`tw_model_input`].
unsafe fn spec(
    model: *const TwModel,
    index: usize,
    out: *mut TwTensorInfo,
    kind: &'static str,
) -> TwStatus {
    guard(|| {
        let empty = TwTensorInfo {
            name: std::ptr::null(),
            dtype: 0,
            ndim: 0,
            dims: [0; TW_MAX_DIMS],
        };
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, empty, "out") }?;
        // SAFETY: the caller's contract on `model`.
        let m = unsafe { arg_ref(model, "model") }?;
        let specs = if kind == "input" {
            &m.inputs
        } else {
            &m.outputs
        };
        let s = specs.get(index).ok_or_else(|| {
            Failure::InvalidArgument(format!(
                "{kind} {index} does not exist: model '{}' declares {} {kind}s",
                m.model.signature().name,
                specs.len()
            ))
        })?;
        *out = s.to_c();
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
            assert!(tw_model_name(std::ptr::null()).is_null());
            assert_eq!(last_error(), "null argument: `model` is NULL");
            assert_eq!(tw_model_num_inputs(std::ptr::null()), 0);
            assert_eq!(tw_model_num_outputs(std::ptr::null()), 0);
            let mut info = std::mem::MaybeUninit::<TwTensorInfo>::uninit();
            let s = tw_model_input(std::ptr::null(), 0, info.as_mut_ptr());
            assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
            assert!(info.assume_init().name.is_null(), "out is cleared first");
            let s = tw_model_output(std::ptr::null(), 0, std::ptr::null_mut());
            assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
            let mut m: *mut TwModel = std::ptr::null_mut();
            let s = tw_model_lookup(std::ptr::null(), c"digits".as_ptr(), &mut m);
            assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
            assert_eq!(last_error(), "null argument: `client` is NULL");
            tw_model_free(std::ptr::null_mut());
        }
    }
}
