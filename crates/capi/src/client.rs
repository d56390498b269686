//! Sessions: `tw_connect` opens one ([`TwClient`], a [`client::Client`]),
//! `tw_client_close` closes it, `tw_client_copy_stats` reads its copy counters.

use crate::args::{arg_out, arg_ref, arg_str};
use crate::error::{guard, guard_value, Failure};
use crate::status::TwStatus;
use crate::types::TwCopyStats;
use client::{Client, ClientOptions};
use std::ffi::c_char;
use std::time::Duration;

/// A session with an agent (`tw_client`). May be used from many threads at
/// once.
///
/// Example:
/// ```c
/// tw_client *c = NULL;
/// tw_status s = tw_connect(uri, 0, &c);
/// assert(s == TW_OK);
/// tw_model *digits = NULL;
/// s = tw_model_lookup(c, "digits", &digits);
/// assert(s == TW_OK);
/// tw_model_free(digits);
/// tw_client_close(c);
/// ```
#[derive(Debug)]
pub struct TwClient {
    /// The Rust client.
    pub client: Client,
}

/// A timeout in seconds from C: 0 means `None` (the default), and a
/// negative, NaN or infinite one is an invalid argument.
pub fn timeout_from_c(seconds: f64, name: &str) -> Result<Option<Duration>, Failure> {
    if seconds == 0.0 {
        return Ok(None);
    }
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        _ => Err(Failure::InvalidArgument(format!(
            "{name} must be a positive number of seconds or 0 for the default, not {seconds}"
        ))),
    }
}

/// Connects to an agent: `uri` is `shm://NAME`, `unix:///PATH`,
/// `tcp://HOST:PORT`, `vsock://CID:PORT` or `inproc://NAME`. `timeout_s`
/// bounds connecting and
/// then each call's wait for its response, in seconds; 0 takes the
/// defaults (5 s to connect, 30 s per call). On success `*out` is the new
/// client (close it with `tw_client_close`); on failure it is NULL. The
/// environment variable `TENSORWIRE_TOKEN`, when set and not empty, is the
/// bearer token sent in the Hello (it names the client's tenant).
///
/// Errors: `TW_ERR_CONNECT` (malformed URI, nothing listening), or what the
/// agent answered (`TW_ERR_DISCONNECTED` when it refuses the session, e.g.
/// at its connection limit; `TW_ERR_PERMISSION_DENIED` for a token it does
/// not accept).
///
/// Example:
/// ```c
/// tw_client *c = NULL;
/// tw_status s = tw_connect(uri, 10.0, &c);  // 10 s to connect, then per call
/// if (s != TW_OK) {
///     fprintf(stderr, "tw_connect: %s: %s\n", tw_status_name(s), tw_last_error());
/// }
/// assert(s == TW_OK && c != NULL);
/// tw_client_close(c);
///
/// s = tw_connect("unix:///nonexistent-dir/agent.sock", 1.0, &c);
/// printf("%s, c is %s\n", tw_status_name(s), c == NULL ? "NULL" : "set");
/// // prints: TW_ERR_CONNECT, c is NULL
/// ```
///
/// # Safety
/// `uri` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn tw_connect(
    uri: *const c_char,
    timeout_s: f64,
    out: *mut *mut TwClient,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: the caller's contract on `uri`.
        let uri = unsafe { arg_str(uri, "uri") }?;
        let mut opts = ClientOptions {
            token: std::env::var("TENSORWIRE_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
            ..ClientOptions::default()
        };
        if let Some(t) = timeout_from_c(timeout_s, "timeout_s")? {
            opts.timeout = t;
            opts.connect_timeout = t;
        }
        let client = Client::connect_with(uri, opts)?;
        *out = Box::into_raw(Box::new(TwClient { client }));
        Ok(())
    })
}

/// Closes a client (NULL is ignored). Models looked up on it keep the
/// session open until they are freed too; buffers from `tw_alloc` stay
/// valid until freed.
///
/// Example:
/// ```c
/// tw_client *c = NULL;
/// tw_status s = tw_connect(uri, 0, &c);
/// assert(s == TW_OK);
/// tw_model *identity = NULL;
/// s = tw_model_lookup(c, "identity", &identity);
/// assert(s == TW_OK);
/// tw_client_close(c);  // the model keeps the session open...
/// uint8_t x = 1, y = 0;
/// tw_tensor in = {.dtype = TW_DTYPE_U8, .ndim = 1, .dims = {1}, .data = &x, .len = 1};
/// tw_tensor out = {.data = &y, .capacity = 1};
/// s = tw_infer(identity, &in, 1, &out, 1);
/// printf("after close: %s\n", tw_status_name(s));
/// // prints: after close: TW_OK
/// tw_model_free(identity);  // ...until it is freed too
/// tw_client_close(NULL);    // NULL is ignored
/// ```
///
/// # Safety
/// `client` is NULL or a client from `tw_connect` not closed before, which
/// no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn tw_client_close(client: *mut TwClient) {
    guard_value((), || {
        if !client.is_null() {
            // SAFETY: made by Box::into_raw in tw_connect and not freed
            // before (the caller's contract).
            drop(unsafe { Box::from_raw(client) });
        }
        Ok(())
    })
}

/// The tensor bytes the client has copied so far, into `*out`: over
/// `shm://`, `input_bytes_copied` stays 0 for inputs that lie in
/// `tw_buffer`s.
///
/// Example:
/// ```c
/// tw_client *c = NULL;  // a fresh client over shm://: its counters start at 0
/// tw_status s = tw_connect(uri, 0, &c);
/// assert(s == TW_OK);
/// tw_model *identity = NULL;
/// s = tw_model_lookup(c, "identity", &identity);
/// assert(s == TW_OK);
/// int64_t dims[1] = {64};
/// tw_buffer *buf = NULL;
/// s = tw_alloc(c, TW_DTYPE_F32, dims, 1, &buf);
/// assert(s == TW_OK);
/// memset(tw_buffer_data(buf), 0, tw_buffer_len(buf));
/// tw_tensor in;
/// s = tw_buffer_tensor(buf, &in);
/// assert(s == TW_OK);
/// float y[64];
/// tw_tensor out = {.data = y, .capacity = sizeof y};
/// s = tw_infer(identity, &in, 1, &out, 1);
/// assert(s == TW_OK);
/// tw_copy_stats stats;
/// s = tw_client_copy_stats(c, &stats);
/// assert(s == TW_OK);
/// printf("%" PRIu64 " request(s), %" PRIu64 " input bytes copied\n",
///        stats.requests, stats.input_bytes_copied);
/// // prints: 1 request(s), 0 input bytes copied
/// tw_buffer_free(buf);
/// tw_model_free(identity);
/// tw_client_close(c);
/// ```
///
/// # Safety
/// `client` is NULL or a live client; `out` is NULL or valid for a write
/// of a `tw_copy_stats`.
#[no_mangle]
pub unsafe extern "C" fn tw_client_copy_stats(
    client: *const TwClient,
    out: *mut TwCopyStats,
) -> TwStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { arg_out(out, TwCopyStats::default(), "out") }?;
        // SAFETY: the caller's contract on `client`.
        let c = unsafe { arg_ref(client, "client") }?;
        *out = c.client.copy_stats().into();
        Ok(())
    })
}

/// The library's version, e.g. `"0.1.0"`. Static: never free it.
///
/// Example:
/// ```c
/// printf("libtensorwire %s\n", tw_version());
/// // prints: libtensorwire 0.1.0
/// ```
#[no_mangle]
pub extern "C" fn tw_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;
    use std::ffi::CStr;

    #[test]
    fn connect_checks_its_arguments() {
        let mut c: *mut TwClient = std::ptr::dangling_mut();
        // SAFETY: valid out-pointer, NULL uri.
        let s = unsafe { tw_connect(std::ptr::null(), 0.0, &mut c) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
        assert!(c.is_null(), "out is NULL on failure");
        assert_eq!(last_error(), "null argument: `uri` is NULL");

        // SAFETY: a valid string, NULL out.
        let s = unsafe { tw_connect(c"unix:///nonexistent".as_ptr(), 0.0, std::ptr::null_mut()) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
        assert_eq!(last_error(), "null argument: `out` is NULL");

        // SAFETY: a NUL-terminated string and a valid out-pointer.
        let s = unsafe { tw_connect(c"unix:///\xff".as_ptr(), 0.0, &mut c) };
        assert_eq!(s, TwStatus::TW_ERR_INVALID_ARGUMENT);
        assert!(
            last_error().contains("`uri` is not UTF-8"),
            "{}",
            last_error()
        );

        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e-12] {
            // SAFETY: as above.
            let s = unsafe { tw_connect(c"inproc://x".as_ptr(), bad, &mut c) };
            assert_eq!(s, TwStatus::TW_ERR_INVALID_ARGUMENT, "{bad}");
            assert!(
                last_error().contains("timeout_s must be"),
                "{}",
                last_error()
            );
        }
    }

    #[test]
    fn connect_failures_say_why() {
        let mut c: *mut TwClient = std::ptr::null_mut();
        // SAFETY: valid string and out-pointer.
        let s = unsafe { tw_connect(c"bogus://x".as_ptr(), 1.0, &mut c) };
        assert_eq!(s, TwStatus::TW_ERR_CONNECT);
        assert!(
            last_error().starts_with("cannot connect: "),
            "{}",
            last_error()
        );
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("unix://{}/none.sock\0", dir.path().display());
        // SAFETY: as above.
        let s = unsafe { tw_connect(uri.as_ptr().cast(), 1.0, &mut c) };
        assert_eq!(s, TwStatus::TW_ERR_CONNECT);
        assert!(c.is_null());
    }

    #[test]
    fn close_and_stats_accept_null() {
        // SAFETY: NULL is allowed.
        unsafe { tw_client_close(std::ptr::null_mut()) };
        let mut st = TwCopyStats::default();
        // SAFETY: NULL client, valid out.
        let s = unsafe { tw_client_copy_stats(std::ptr::null(), &mut st) };
        assert_eq!(s, TwStatus::TW_ERR_NULL_ARGUMENT);
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(tw_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
