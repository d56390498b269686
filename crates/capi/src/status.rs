//! [`TwStatus`] (`tw_status`): what every fallible C function returns, one
//! code per [`ClientError`] variant plus the C-side failures (a NULL
//! argument, a buffer too small, ...), and their names.

use crate::error::guard_value;
use client::ClientError;
use std::ffi::{c_char, c_int, CStr};

/// The result of a call: `TW_OK` or why it failed (the message is in
/// `tw_last_error()`).
///
/// Example:
/// ```c
/// tw_model *m = NULL;
/// tw_status s = tw_model_lookup(client, "no-such-model", &m);
/// if (s != TW_OK) {
///     printf("%s: %s\n", tw_status_name(s), tw_last_error());
/// }
/// // prints: TW_ERR_UNKNOWN_MODEL: unknown model: no model named 'no-such-model' (see `tensorwire models`)
/// assert(m == NULL);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // the C names, as the header spells them
pub enum TwStatus {
    /// Success.
    TW_OK = 0,
    /// The URI is malformed or the agent could not be reached.
    TW_ERR_CONNECT = 1,
    /// The agent serves no model by this name.
    TW_ERR_UNKNOWN_MODEL = 2,
    /// The tensors do not fit the model (count, dtype, shape, byte length)
    /// or are malformed.
    TW_ERR_INVALID_INPUT = 3,
    /// A size or count is over the session's limits (or the shared-memory
    /// arena is full).
    TW_ERR_LIMIT_EXCEEDED = 4,
    /// The session already has its maximum of requests in flight, or the
    /// model's queue in the agent is full (the request was not run).
    TW_ERR_OVERLOADED = 5,
    /// No response arrived within the timeout, or the request waited its
    /// whole queue timeout in the agent (it was not run).
    TW_ERR_TIMEOUT = 6,
    /// The agent closed the connection or died.
    TW_ERR_DISCONNECTED = 7,
    /// The agent is shutting down and refused the request.
    TW_ERR_SHUTTING_DOWN = 8,
    /// The engine failed to run the model.
    TW_ERR_ENGINE = 9,
    /// The agent reported another error.
    TW_ERR_REMOTE = 10,
    /// The agent sent something that breaks the protocol.
    TW_ERR_PROTOCOL = 11,
    /// A pointer argument that must not be NULL was NULL.
    TW_ERR_NULL_ARGUMENT = 12,
    /// An argument is out of range or malformed (a string that is not
    /// UTF-8, an index past the end, a negative timeout, a count that does
    /// not match).
    TW_ERR_INVALID_ARGUMENT = 13,
    /// An output buffer is too small: the output's `len` says how many
    /// bytes it needs (its dtype and shape are filled in too).
    TW_ERR_BUFFER_TOO_SMALL = 14,
    /// A bug in the library (it panicked); the message says where.
    TW_ERR_INTERNAL = 15,
    /// The client's tenant may not do this: call or see the model, or
    /// connect with this token (the agent's tenants file decides).
    TW_ERR_PERMISSION_DENIED = 16,
}

/// Every status, in code order.
const ALL: [TwStatus; 17] = [
    TwStatus::TW_OK,
    TwStatus::TW_ERR_CONNECT,
    TwStatus::TW_ERR_UNKNOWN_MODEL,
    TwStatus::TW_ERR_INVALID_INPUT,
    TwStatus::TW_ERR_LIMIT_EXCEEDED,
    TwStatus::TW_ERR_OVERLOADED,
    TwStatus::TW_ERR_TIMEOUT,
    TwStatus::TW_ERR_DISCONNECTED,
    TwStatus::TW_ERR_SHUTTING_DOWN,
    TwStatus::TW_ERR_ENGINE,
    TwStatus::TW_ERR_REMOTE,
    TwStatus::TW_ERR_PROTOCOL,
    TwStatus::TW_ERR_NULL_ARGUMENT,
    TwStatus::TW_ERR_INVALID_ARGUMENT,
    TwStatus::TW_ERR_BUFFER_TOO_SMALL,
    TwStatus::TW_ERR_INTERNAL,
    TwStatus::TW_ERR_PERMISSION_DENIED,
];

impl TwStatus {
    /// The code for a client error (one per variant).
    pub fn of(e: &ClientError) -> TwStatus {
        match e {
            ClientError::Connect(_) => TwStatus::TW_ERR_CONNECT,
            ClientError::UnknownModel(_) => TwStatus::TW_ERR_UNKNOWN_MODEL,
            ClientError::InvalidInput(_) => TwStatus::TW_ERR_INVALID_INPUT,
            ClientError::LimitExceeded(_) => TwStatus::TW_ERR_LIMIT_EXCEEDED,
            ClientError::TooManyInFlight(_) | ClientError::Overloaded(_) => {
                TwStatus::TW_ERR_OVERLOADED
            }
            ClientError::Timeout(_) | ClientError::QueueTimeout(_) => TwStatus::TW_ERR_TIMEOUT,
            ClientError::AgentGone(_) => TwStatus::TW_ERR_DISCONNECTED,
            ClientError::ShuttingDown(_) => TwStatus::TW_ERR_SHUTTING_DOWN,
            ClientError::Engine(_) => TwStatus::TW_ERR_ENGINE,
            ClientError::Remote { .. } => TwStatus::TW_ERR_REMOTE,
            ClientError::Protocol(_) => TwStatus::TW_ERR_PROTOCOL,
            ClientError::PermissionDenied(_) => TwStatus::TW_ERR_PERMISSION_DENIED,
        }
    }

    /// The code's C name, e.g. `TW_ERR_TIMEOUT`.
    pub fn name(self) -> &'static CStr {
        match self {
            TwStatus::TW_OK => c"TW_OK",
            TwStatus::TW_ERR_CONNECT => c"TW_ERR_CONNECT",
            TwStatus::TW_ERR_UNKNOWN_MODEL => c"TW_ERR_UNKNOWN_MODEL",
            TwStatus::TW_ERR_INVALID_INPUT => c"TW_ERR_INVALID_INPUT",
            TwStatus::TW_ERR_LIMIT_EXCEEDED => c"TW_ERR_LIMIT_EXCEEDED",
            TwStatus::TW_ERR_OVERLOADED => c"TW_ERR_OVERLOADED",
            TwStatus::TW_ERR_TIMEOUT => c"TW_ERR_TIMEOUT",
            TwStatus::TW_ERR_DISCONNECTED => c"TW_ERR_DISCONNECTED",
            TwStatus::TW_ERR_SHUTTING_DOWN => c"TW_ERR_SHUTTING_DOWN",
            TwStatus::TW_ERR_ENGINE => c"TW_ERR_ENGINE",
            TwStatus::TW_ERR_REMOTE => c"TW_ERR_REMOTE",
            TwStatus::TW_ERR_PROTOCOL => c"TW_ERR_PROTOCOL",
            TwStatus::TW_ERR_PERMISSION_DENIED => c"TW_ERR_PERMISSION_DENIED",
            TwStatus::TW_ERR_NULL_ARGUMENT => c"TW_ERR_NULL_ARGUMENT",
            TwStatus::TW_ERR_INVALID_ARGUMENT => c"TW_ERR_INVALID_ARGUMENT",
            TwStatus::TW_ERR_BUFFER_TOO_SMALL => c"TW_ERR_BUFFER_TOO_SMALL",
            TwStatus::TW_ERR_INTERNAL => c"TW_ERR_INTERNAL",
        }
    }

    /// The status with code `code`, if there is one.
    pub fn from_code(code: c_int) -> Option<TwStatus> {
        usize::try_from(code).ok().and_then(|i| ALL.get(i).copied())
    }
}

/// The name of a status code, e.g. `"TW_ERR_TIMEOUT"`, or
/// `"TW_UNKNOWN_STATUS"` for a code that is none of them. The string is
/// static: never free it.
///
/// Example:
/// ```c
/// printf("%s\n", tw_status_name(TW_ERR_TIMEOUT));
/// // prints: TW_ERR_TIMEOUT
/// printf("%s\n", tw_status_name(99));
/// // prints: TW_UNKNOWN_STATUS
/// ```
#[no_mangle]
pub extern "C" fn tw_status_name(status: c_int) -> *const c_char {
    guard_value(c"TW_UNKNOWN_STATUS".as_ptr(), || {
        Ok(TwStatus::from_code(status)
            .map_or(c"TW_UNKNOWN_STATUS", TwStatus::name)
            .as_ptr())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn name(code: c_int) -> String {
        // SAFETY: tw_status_name returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(tw_status_name(code)) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn codes_are_dense_and_named() {
        for (i, s) in ALL.into_iter().enumerate() {
            assert_eq!(s as c_int, i as c_int);
            assert_eq!(TwStatus::from_code(i as c_int), Some(s));
            let n = name(s as c_int);
            assert!(n.starts_with("TW_"), "{n}");
            assert_eq!(format!("{s:?}"), n, "Debug and C names agree");
        }
        assert_eq!(name(0), "TW_OK");
        assert_eq!(name(14), "TW_ERR_BUFFER_TOO_SMALL");
        for bad in [-1, 17, 1000, c_int::MIN, c_int::MAX] {
            assert_eq!(name(bad), "TW_UNKNOWN_STATUS");
        }
    }

    #[test]
    fn each_client_error_has_its_code() {
        let cases = [
            (
                ClientError::Connect(transport::TransportError::NoInprocAgent("x".into())),
                TwStatus::TW_ERR_CONNECT,
            ),
            (
                ClientError::UnknownModel("m".into()),
                TwStatus::TW_ERR_UNKNOWN_MODEL,
            ),
            (
                ClientError::InvalidInput("i".into()),
                TwStatus::TW_ERR_INVALID_INPUT,
            ),
            (
                ClientError::LimitExceeded("l".into()),
                TwStatus::TW_ERR_LIMIT_EXCEEDED,
            ),
            (ClientError::TooManyInFlight(4), TwStatus::TW_ERR_OVERLOADED),
            (
                ClientError::Timeout(Duration::from_secs(1)),
                TwStatus::TW_ERR_TIMEOUT,
            ),
            (
                ClientError::AgentGone("g".into()),
                TwStatus::TW_ERR_DISCONNECTED,
            ),
            (
                ClientError::ShuttingDown("s".into()),
                TwStatus::TW_ERR_SHUTTING_DOWN,
            ),
            (ClientError::Engine("e".into()), TwStatus::TW_ERR_ENGINE),
            (
                ClientError::Remote {
                    status: wire::Status::Internal,
                    message: "r".into(),
                },
                TwStatus::TW_ERR_REMOTE,
            ),
            (ClientError::Protocol("p".into()), TwStatus::TW_ERR_PROTOCOL),
        ];
        for (e, s) in cases {
            assert_eq!(TwStatus::of(&e), s, "{e}");
        }
    }
}
