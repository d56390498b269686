//! Failures and how they reach C: [`Failure`] (a [`ClientError`] or a
//! C-side problem), the per-thread last error message ([`tw_last_error`]),
//! and the guards every entry point runs its body in, which turn a failure
//! into a [`TwStatus`] and a panic into `TW_ERR_INTERNAL` instead of
//! unwinding into C.

use crate::status::TwStatus;
use client::ClientError;
use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why a C call failed.
#[derive(Debug)]
pub enum Failure {
    /// The client said no; its message is the Rust error's.
    Client(ClientError),
    /// A pointer argument (named) was NULL.
    Null(Cow<'static, str>),
    /// An argument is out of range or malformed.
    InvalidArgument(String),
    /// An output buffer is too small.
    BufferTooSmall(String),
    /// A bug: something that cannot happen did.
    Internal(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        Failure::Client(e)
    }
}

impl Failure {
    /// A [`ClientError::InvalidInput`] (what the Rust client says about a
    /// tensor that does not fit).
    pub fn invalid_input(msg: impl Into<String>) -> Failure {
        Failure::Client(ClientError::InvalidInput(msg.into()))
    }

    /// A NULL pointer argument, named as the C caller knows it.
    pub fn null(name: impl Into<Cow<'static, str>>) -> Failure {
        Failure::Null(name.into())
    }

    /// The status code.
    pub fn status(&self) -> TwStatus {
        match self {
            Failure::Client(e) => TwStatus::of(e),
            Failure::Null(_) => TwStatus::TW_ERR_NULL_ARGUMENT,
            Failure::InvalidArgument(_) => TwStatus::TW_ERR_INVALID_ARGUMENT,
            Failure::BufferTooSmall(_) => TwStatus::TW_ERR_BUFFER_TOO_SMALL,
            Failure::Internal(_) => TwStatus::TW_ERR_INTERNAL,
        }
    }

    /// The message `tw_last_error` returns.
    pub fn message(&self) -> String {
        match self {
            Failure::Client(e) => e.to_string(),
            Failure::Null(what) => format!("null argument: `{what}` is NULL"),
            Failure::InvalidArgument(m) => format!("invalid argument: {m}"),
            Failure::BufferTooSmall(m) => format!("buffer too small: {m}"),
            Failure::Internal(m) => format!("internal error: {m}"),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (NUL bytes in it are shown as
/// `\0`, since C strings cannot hold them). Never panics.
pub fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = c;
        }
    });
}

/// This thread's last error message, as Rust text (for tests).
pub fn last_error() -> String {
    LAST_ERROR
        .try_with(|l| {
            l.try_borrow()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// The message of the last call on this thread that failed: the same text
/// the Rust `ClientError` prints (e.g. `unknown model: ...`), or a C-side
/// problem (`null argument: ...`, `buffer too small: ...`). An empty string
/// if no call has failed on this thread. Successful calls leave it as it
/// is. Never NULL; it stays valid until the next failing call on this
/// thread. Do not free it.
///
/// Example:
/// ```c
/// tw_client *c = NULL;
/// tw_status s = tw_connect("bogus://nowhere", 0, &c);
/// assert(s == TW_ERR_CONNECT && c == NULL);
/// printf("%s\n", tw_last_error());
/// // prints: cannot connect: bad endpoint 'bogus://nowhere': unknown scheme 'bogus' (known: inproc, unix, tcp, tls, shm, vsock)
/// ```
#[no_mangle]
pub extern "C" fn tw_last_error() -> *const c_char {
    guard_value(c"".as_ptr(), || {
        Ok(LAST_ERROR
            .try_with(|l| l.try_borrow().map_or(c"".as_ptr(), |s| s.as_ptr()))
            .unwrap_or(c"".as_ptr()))
    })
}

/// Runs an entry point's body: `TW_OK`, or the failure's code with its
/// message recorded, or `TW_ERR_INTERNAL` if the body panicked.
pub fn guard(f: impl FnOnce() -> Result<(), Failure>) -> TwStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => TwStatus::TW_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message());
            e.status()
        }
        Err(panic) => {
            set_last_error(&panic_message(panic.as_ref()));
            TwStatus::TW_ERR_INTERNAL
        }
    }
}

/// Runs the body of an entry point that returns a value rather than a
/// status: its value, or `fallback` with the failure (or panic) recorded
/// as the last error.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> Result<T, Failure>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.message());
            fallback
        }
        Err(panic) => {
            set_last_error(&panic_message(panic.as_ref()));
            fallback
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    Failure::Internal(format!("the library panicked: {what}")).message()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn c_last_error() -> String {
        // SAFETY: tw_last_error never returns NULL and its string lives
        // until the next failing call on this thread.
        unsafe { CStr::from_ptr(tw_last_error()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_failure_sets_the_message_and_success_keeps_it() {
        std::thread::spawn(|| {
            assert_eq!(c_last_error(), "", "nothing failed on this thread yet");
            let s = guard(|| Err(ClientError::UnknownModel("no such model 'x'".into()).into()));
            assert_eq!(s, TwStatus::TW_ERR_UNKNOWN_MODEL);
            assert_eq!(c_last_error(), "unknown model: no such model 'x'");
            assert_eq!(guard(|| Ok(())), TwStatus::TW_OK);
            assert_eq!(c_last_error(), "unknown model: no such model 'x'");
            assert_eq!(
                guard(|| Err(Failure::null("uri"))),
                TwStatus::TW_ERR_NULL_ARGUMENT
            );
            assert_eq!(c_last_error(), "null argument: `uri` is NULL");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_panic_becomes_an_internal_error() {
        let s = guard(|| panic!("boom {}", 42));
        assert_eq!(s, TwStatus::TW_ERR_INTERNAL);
        assert_eq!(
            last_error(),
            "internal error: the library panicked: boom 42"
        );
        assert_eq!(guard_value(7usize, || panic!("static")), 7);
        assert_eq!(last_error(), "internal error: the library panicked: static");
    }

    #[test]
    fn nul_bytes_in_a_message_are_escaped() {
        set_last_error("a\0b");
        assert_eq!(c_last_error(), "a\\0b");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        set_last_error("here");
        std::thread::spawn(|| assert_eq!(last_error(), ""))
            .join()
            .unwrap();
        assert_eq!(last_error(), "here");
    }
}
