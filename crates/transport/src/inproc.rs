//! The in-process transport: `inproc://name` reaches a service registered
//! under that name in the same process, by a plain function call on the
//! caller's thread. No bytes are encoded into a stream and no tensor is
//! copied on the way in: the service reads the caller's own buffers.
//!
//! The service sees the same header and descriptor section a socket peer
//! would (so it validates them with the same code), plus the tensors as
//! borrowed slices, one per descriptor, instead of a payload buffer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use wire::{Header, PooledBuf};

/// One message handed to an in-process service.
///
/// Example: [`InprocService`].
#[derive(Debug)]
pub struct InprocRequest<'a> {
    /// The message header (as it would be on the wire).
    pub header: Header,
    /// The descriptor section (as it would be on the wire).
    pub desc: &'a [u8],
    /// The tensors, one per descriptor, borrowed from the caller.
    pub tensors: &'a [&'a [u8]],
}

/// A service's reply.
///
/// Example: [`InprocService`].
#[derive(Debug)]
pub struct InprocReply {
    /// The reply header.
    pub header: Header,
    /// The reply's descriptor section.
    pub desc: Vec<u8>,
    /// Output tensors, one per descriptor, each in its own buffer.
    pub tensors: Vec<PooledBuf>,
}

/// Something that answers in-process messages (the agent implements it).
///
/// # Examples
///
/// A service that echoes its tensors, reached by name and called on the
/// caller's thread:
///
/// ```
/// use std::sync::Arc;
/// use transport::inproc::{lookup, register, InprocReply, InprocRequest, InprocService};
/// use wire::{AlignedBuf, Header, Kind};
/// struct Echo;
/// impl InprocService for Echo {
///     fn call(&self, req: InprocRequest<'_>) -> InprocReply {
///         let mut header = req.header;
///         header.kind = Kind::Response;
///         InprocReply {
///             header,
///             desc: req.desc.to_vec(),
///             tensors: req.tensors.iter().map(|t| AlignedBuf::copy_from(t).map(Into::into)).collect::<Result<_, _>>().unwrap_or_default(),
///         }
///     }
/// }
/// let _reg = register("doc-echo", Arc::new(Echo))?;
/// let svc = lookup("doc-echo").ok_or("registered")?;
/// let reply = svc.call(InprocRequest { header: Header::new(Kind::Request), desc: &[], tensors: &[b"abc"] });
/// assert_eq!(reply.header.kind, Kind::Response);
/// assert_eq!(&*reply.tensors[0], b"abc");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait InprocService: Send + Sync {
    /// Handles one message on the caller's thread and returns the reply.
    fn call(&self, req: InprocRequest<'_>) -> InprocReply;
}

type Registry = Mutex<HashMap<String, Arc<dyn InprocService>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Keeps a service registered; dropping it unregisters the name.
///
/// Example: [`register`].
pub struct Registration {
    name: String,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registration({})", self.name)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut r) = registry().lock() {
            r.remove(&self.name);
        }
    }
}

/// Registers `service` as `inproc://name`. Fails if the name is taken.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use transport::inproc::{lookup, register, InprocReply, InprocRequest, InprocService};
/// use wire::{AlignedBuf, Header, Kind};
/// struct Echo;
/// impl InprocService for Echo {
///     fn call(&self, req: InprocRequest<'_>) -> InprocReply {
///         let mut header = req.header;
///         header.kind = Kind::Response;
///         InprocReply {
///             header,
///             desc: req.desc.to_vec(),
///             tensors: req.tensors.iter().map(|t| AlignedBuf::copy_from(t).map(Into::into)).collect::<Result<_, _>>().unwrap_or_default(),
///         }
///     }
/// }
/// let reg = register("doc-once", Arc::new(Echo))?;
/// assert!(register("doc-once", Arc::new(Echo)).is_err()); // taken
/// drop(reg); // unregistered
/// assert!(lookup("doc-once").is_none());
/// assert!(register("doc-once", Arc::new(Echo)).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn register(name: &str, service: Arc<dyn InprocService>) -> Result<Registration, String> {
    let mut r = registry()
        .lock()
        .map_err(|_| "in-process registry poisoned".to_string())?;
    if r.contains_key(name) {
        return Err(format!("an in-process agent named '{name}' already exists"));
    }
    r.insert(name.to_string(), service);
    Ok(Registration {
        name: name.to_string(),
    })
}

/// The service registered as `inproc://name`, if any.
///
/// # Examples
///
/// (An embedded agent listening on `inproc://NAME` registers itself so.)
///
/// ```
/// use std::sync::Arc;
/// use transport::inproc::{lookup, register, InprocReply, InprocRequest, InprocService};
/// use wire::{AlignedBuf, Header, Kind};
/// struct Echo;
/// impl InprocService for Echo {
///     fn call(&self, req: InprocRequest<'_>) -> InprocReply {
///         let mut header = req.header;
///         header.kind = Kind::Response;
///         InprocReply {
///             header,
///             desc: req.desc.to_vec(),
///             tensors: req.tensors.iter().map(|t| AlignedBuf::copy_from(t).map(Into::into)).collect::<Result<_, _>>().unwrap_or_default(),
///         }
///     }
/// }
/// let _reg = register("doc-lookup", Arc::new(Echo))?;
/// assert!(lookup("doc-lookup").is_some());
/// assert!(lookup("nobody").is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn lookup(name: &str) -> Option<Arc<dyn InprocService>> {
    registry().lock().ok()?.get(name).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{AlignedBuf, Kind};

    struct Echo;
    impl InprocService for Echo {
        fn call(&self, req: InprocRequest<'_>) -> InprocReply {
            InprocReply {
                header: req.header,
                desc: req.desc.to_vec(),
                tensors: req
                    .tensors
                    .iter()
                    .map(|t| AlignedBuf::copy_from(t).unwrap().into())
                    .collect(),
            }
        }
    }

    #[test]
    fn register_lookup_unregister() {
        let reg = register("t-echo", Arc::new(Echo)).unwrap();
        assert!(register("t-echo", Arc::new(Echo)).is_err());
        let svc = lookup("t-echo").unwrap();
        let r = svc.call(InprocRequest {
            header: Header::new(Kind::Ping),
            desc: &[],
            tensors: &[b"x"],
        });
        assert_eq!(&*r.tensors[0], b"x");
        drop(reg);
        assert!(lookup("t-echo").is_none());
    }
}
