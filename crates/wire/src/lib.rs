//! The tensorwire wire protocol, version 1: what travels between a client and
//! an agent, and nothing about how it travels.
//!
//! Every message is a fixed 64-byte little-endian [`Header`], then a bounded
//! *descriptor section* of `desc_len` bytes, then a *payload* of
//! `payload_len` bytes. Requests and responses carry [`TensorDesc`]s (and
//! optionally a [`Timeline`]) in the descriptor section and tensor bytes in the
//! payload; control messages (hello, model lookup, errors) carry a small body
//! in the descriptor section and no payload. Every length and count is checked
//! against the session's [`Limits`] before anything is allocated or read.
//!
//! The crate also owns the two value types every other crate shares:
//! [`DType`] (element types) and [`AlignedBuf`] (64-byte aligned tensor
//! memory). It performs no I/O; `docs/PROTOCOL.md` is its byte-level
//! specification and the test vectors in `tests/vectors.rs` check both agree.

mod buf;
mod control;
mod dtype;
mod error;
mod fuzzing;
mod header;
mod limits;
mod tensor;
mod timeline;

pub use buf::{AlignedBuf, BufPool, PooledBuf};
pub use control::{
    check_token, decode_error_body, decode_hello, decode_hello_request, decode_model_list,
    decode_model_name, decode_signature, encode_error_body, encode_hello, encode_hello_as,
    encode_hello_with_token, encode_model_list, encode_model_name, encode_signature, Hello,
    HelloBody, ModelSignature, TensorSpec, HELLO_ANONYMOUS, MAX_ERROR_MESSAGE, MAX_NAME_LEN,
    MAX_TOKEN_LEN,
};
pub use dtype::DType;
pub use error::{Status, WireError};
pub use fuzzing::fuzz_decode;
pub use header::{flags, Header, Kind, HEADER_LEN, MAGIC, VERSION};
pub use limits::Limits;
pub use tensor::{
    align_up, decode_tensor_section, decode_tensor_section_in, encode_tensor_section,
    layout_payload, Placement, TensorDesc, TensorSection, DESC_FIXED_LEN, MAX_DIMS, PAYLOAD_ALIGN,
};
pub use timeline::{monotonic_ns, Stage, Timeline, TIMELINE_LEN};
