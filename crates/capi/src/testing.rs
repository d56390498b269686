//! Test helpers: an agent in this process (the built-in `identity` model
//! on `inproc://` and `shm://`), and clients and models opened through the
//! C functions, freed when dropped.

use crate::client::{tw_client_close, tw_connect, TwClient};
use crate::error::last_error;
use crate::model::{tw_model_free, tw_model_lookup, TwModel};
use crate::status::TwStatus;
use server::{Agent, AgentConfig};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use transport::Endpoint;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// An agent serving `identity` on fresh `inproc://` and `shm://` names.
pub struct TestAgent {
    _agent: Agent,
    /// `inproc://NAME`.
    pub inproc: String,
    /// `shm://NAME`.
    pub shm: String,
}

impl TestAgent {
    /// Starts one.
    pub fn start() -> TestAgent {
        let name = format!(
            "tw-capi-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cfg = AgentConfig {
            listen: vec![Endpoint::Inproc(name.clone()), Endpoint::Shm(name.clone())],
            ..AgentConfig::default()
        };
        let agent = Agent::start(cfg).unwrap_or_else(|e| panic!("agent did not start: {e}"));
        TestAgent {
            _agent: agent,
            inproc: format!("inproc://{name}"),
            shm: format!("shm://{name}"),
        }
    }
}

/// A client connected with `tw_connect`, closed when dropped.
pub struct Conn(pub *mut TwClient);

impl Conn {
    /// Connects (panics with the last error on failure).
    pub fn open(uri: &str) -> Conn {
        let uri = CString::new(uri).unwrap();
        let mut c = std::ptr::null_mut();
        // SAFETY: a valid string and out-pointer.
        let s = unsafe { tw_connect(uri.as_ptr(), 10.0, &mut c) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        Conn(c)
    }

    /// Looks a model up (panics with the last error on failure).
    pub fn model(&self, name: &str) -> ModelHandle {
        let name = CString::new(name).unwrap();
        let mut m = std::ptr::null_mut();
        // SAFETY: a live client, a valid string and out-pointer.
        let s = unsafe { tw_model_lookup(self.0, name.as_ptr(), &mut m) };
        assert_eq!(s, TwStatus::TW_OK, "{}", last_error());
        ModelHandle(m)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: from tw_connect, closed only here.
        unsafe { tw_client_close(self.0) };
    }
}

/// A model from `tw_model_lookup`, freed when dropped.
pub struct ModelHandle(pub *mut TwModel);

impl Drop for ModelHandle {
    fn drop(&mut self) {
        // SAFETY: from tw_model_lookup, freed only here.
        unsafe { tw_model_free(self.0) };
    }
}
