//! The tensorwire C library: `libtensorwire.so` and its header
//! `include/tensorwire.h` (generated from this crate by cbindgen), so that
//! C and C++ programs — and anything with a C foreign-function interface —
//! can call models served by a tensorwire agent over the same `shm://`,
//! `unix://`, `tcp://` and `inproc://` URIs as the Rust [`client`](::client) crate,
//! which does all the work: this crate only translates handles, tensor
//! descriptions, buffers and errors between C and Rust.
//!
//! ```c
//! tw_client *c;
//! tw_model *m;
//! if (tw_connect("unix:///tmp/tensorwire.sock", 0, &c) != TW_OK ||
//!     tw_model_lookup(c, "digits", &m) != TW_OK) {
//!     fprintf(stderr, "%s\n", tw_last_error());
//!     return 1;
//! }
//! float x[64] = {0}, logits[10];
//! tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {1, 64},
//!                 .data = x, .len = sizeof x};
//! tw_tensor out = {.data = logits, .capacity = sizeof logits};
//! tw_status s = tw_infer(m, &in, 1, &out, 1);
//! tw_model_free(m);
//! tw_client_close(c);
//! ```
//!
//! Conventions, the same for every function:
//! - Functions that can fail return a [`TwStatus`] (`tw_status`); on
//!   failure [`tw_last_error`] returns the message, the same text the Rust
//!   [`ClientError`](::client::ClientError) prints. Nothing panics across the boundary: a
//!   panic inside the library becomes `TW_ERR_INTERNAL`.
//! - Handles (`tw_client`, `tw_model`, `tw_buffer`, `tw_ticket`) are opaque
//!   and created through an out-pointer (set to NULL on failure); each has a
//!   free function that accepts NULL.
//! - Outputs are copied into buffers the caller provides ([`TwTensor`]),
//!   and a buffer that is too small is reported with the size it needs.
//!
//! Threads: a `tw_client` and the `tw_model`s looked up on it may be used
//! from any number of threads at once (calls on one connection are matched
//! to their responses by id). A `tw_buffer` or `tw_ticket` is used by one
//! thread at a time. The last error is per thread. Freeing a handle while
//! another thread still uses it is the caller's bug, as in any C library.

// In the order the header presents them (cbindgen follows the modules;
// the blank lines keep rustfmt from sorting them).
pub mod status;

pub mod error;

pub mod types;

pub mod client;

pub mod model;

pub mod infer;

pub mod buffer;

pub mod args;

#[cfg(test)]
mod testing;

pub use buffer::{
    tw_alloc, tw_buffer_data, tw_buffer_free, tw_buffer_in_arena, tw_buffer_len, tw_buffer_tensor,
    TwBuffer,
};
pub use client::{tw_client_close, tw_client_copy_stats, tw_connect, tw_version, TwClient};
pub use error::tw_last_error;
pub use infer::{tw_infer, tw_submit, tw_ticket_free, tw_wait, TwTicket};
pub use model::{
    tw_model_free, tw_model_input, tw_model_lookup, tw_model_name, tw_model_num_inputs,
    tw_model_num_outputs, tw_model_output, tw_model_set_priority, tw_model_set_queue_timeout_us,
    TwModel,
};
pub use status::{tw_status_name, TwStatus};
pub use types::{
    tw_dtype_name, tw_dtype_size, TwCopyStats, TwDtype, TwTensor, TwTensorInfo, TW_DTYPE_BF16,
    TW_DTYPE_BOOL, TW_DTYPE_F16, TW_DTYPE_F32, TW_DTYPE_F64, TW_DTYPE_I16, TW_DTYPE_I32,
    TW_DTYPE_I64, TW_DTYPE_I8, TW_DTYPE_U16, TW_DTYPE_U32, TW_DTYPE_U64, TW_DTYPE_U8, TW_MAX_DIMS,
};
