//! `vsock://CID:PORT`: the stream transport over `AF_VSOCK`, the socket
//! family between a virtual machine and its host (virtio-vsock in
//! Firecracker and QEMU, `vsock_loopback` on one machine).
//!
//! A vsock socket is a file descriptor that reads and writes like a Unix
//! stream, so it is one more [`crate::StreamConn`] socket: the same
//! `sendmsg` sends, `recv` polling reads, timeouts and limits. The sockets
//! come from `socket2` (already the workspace's socket crate; its
//! `Domain::VSOCK` and `SockAddr::vsock` cover every call made here), so no
//! hand-written socket calls and no new crate: the `vsock` crate on
//! crates.io wraps the same calls over another `nix` than the workspace's.
//! The one exception is the kernel's own connect time-out
//! (`SO_VM_SOCKETS_CONNECT_TIMEOUT`, 2 s by default), which neither crate
//! sets: one `setsockopt` with `libc`, so a client's connect time-out is the
//! one it asked for rather than the kernel's.
//!
//! Addresses: a CID names a machine (`2` the host, `1` this machine through
//! `vsock_loopback`, a guest's own from its VM configuration; `-1` any, for
//! listeners), a port a listener on it. A vsock peer has no `SO_PEERCRED`:
//! an agent knows it by its (CID, port), counts its connections by CID
//! ([`crate::PeerId::Vsock`]) and matches it to a tenant by token.
//!
//! Errors: what `connect` and `bind` return is explained in words
//! ([`explain_connect`], [`explain_bind`]), as the kernel's codes say little
//! here: in a Firecracker guest without `vsock_loopback`, CID 1 times out
//! (the kernel's 2 s), the host with nothing listening resets
//! (`ECONNRESET`), the guest's own CID is `ENODEV`.

use socket2::{Domain, SockAddr, Socket, Type};
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// `VMADDR_CID_ANY` (`vsock://-1:PORT`): a listener on every CID of this machine.
///
/// # Examples
///
/// This and the other named CIDs and ports ([`CID_LOCAL`], [`CID_HOST`],
/// [`PORT_ANY`]) as URIs write them:
///
/// ```
/// use transport::vsock::{CID_ANY, CID_HOST, CID_LOCAL, PORT_ANY};
/// use transport::Endpoint;
/// let vsock = |uri: &str| match Endpoint::parse(uri) {
///     Ok(Endpoint::Vsock { cid, port }) => Ok((cid, port)),
///     other => Err(format!("{uri}: {other:?}")),
/// };
/// assert_eq!(vsock("vsock://any:5000")?, (CID_ANY, 5000));
/// assert_eq!(vsock("vsock://-1:-1")?, (CID_ANY, PORT_ANY));
/// assert_eq!(vsock("vsock://host:5000")?, (CID_HOST, 5000));
/// assert_eq!(vsock("vsock://local:5000")?, (CID_LOCAL, 5000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const CID_ANY: u32 = u32::MAX;
/// `VMADDR_CID_LOCAL` (`vsock://local:PORT`): this machine, through `vsock_loopback`.
/// Example: [`CID_ANY`].
pub const CID_LOCAL: u32 = 1;
/// `VMADDR_CID_HOST` (`vsock://host:PORT`): the hypervisor's host, seen from a guest.
/// Example: [`CID_ANY`].
pub const CID_HOST: u32 = 2;
/// `VMADDR_PORT_ANY` (`vsock://-1:-1`): a listener on a port the kernel picks.
/// Example: [`CID_ANY`].
pub const PORT_ANY: u32 = u32::MAX;

/// A vsock address: a machine's context id and a port on it.
///
/// # Examples
///
/// (This kernel has no vsock loopback, so nothing here connects.)
///
/// ```
/// use transport::vsock::{VsockAddr, CID_ANY, CID_HOST, PORT_ANY};
/// use transport::Endpoint;
/// let Endpoint::Vsock { cid, port } = Endpoint::parse("vsock://host:5000")? else { unreachable!() };
/// let addr = VsockAddr { cid, port };
/// assert_eq!(addr, VsockAddr { cid: CID_HOST, port: 5000 });
/// assert_eq!(addr.to_string(), "2:5000");
/// assert_eq!(VsockAddr { cid: CID_ANY, port: PORT_ANY }.to_string(), "-1:-1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VsockAddr {
    /// The context id ([`CID_ANY`], [`CID_LOCAL`], [`CID_HOST`] or a guest's).
    pub cid: u32,
    /// The port ([`PORT_ANY`] for a listener: the kernel picks).
    pub port: u32,
}

impl fmt::Display for VsockAddr {
    /// `CID:PORT`, with `-1` for [`CID_ANY`] and [`PORT_ANY`] (the URI form).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |v: u32| {
            if v == u32::MAX {
                "-1".to_string()
            } else {
                v.to_string()
            }
        };
        write!(f, "{}:{}", n(self.cid), n(self.port))
    }
}

/// Level and option of the kernel's connect time-out (`<linux/vm_sockets.h>`:
/// `AF_VSOCK`, `SO_VM_SOCKETS_CONNECT_TIMEOUT_OLD`, a `struct timeval` of two
/// longs, which is the 64-bit ABI's and what `SO_VM_SOCKETS_CONNECT_TIMEOUT`
/// means there). Not in `libc` 0.2.
const SOL_VSOCK: libc::c_int = libc::AF_VSOCK;
const SO_VM_SOCKETS_CONNECT_TIMEOUT: libc::c_int = 6;

fn new_socket() -> io::Result<Socket> {
    // socket2 creates it close-on-exec.
    Socket::new(Domain::VSOCK, Type::STREAM, None).map_err(|e| {
        if e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
            io::Error::new(
                e.kind(),
                format!(
                    "this kernel has no vsock support ({e}): the VM needs a vsock device \
                     (/dev/vsock), the host the vhost_vsock or vsock_loopback module"
                ),
            )
        } else {
            e
        }
    })
}

/// Binds and listens on `addr` (backlog 1024); returns the socket and the
/// address bound (a [`PORT_ANY`] resolved). Errors are explained ([`explain_bind`]).
pub(crate) fn listen(addr: VsockAddr) -> io::Result<(Socket, VsockAddr)> {
    let s = new_socket()?;
    s.bind(&SockAddr::vsock(addr.cid, addr.port))
        .map_err(|e| explain_bind(addr, e))?;
    s.listen(1024)?;
    let bound = local_addr(&s)?;
    Ok((
        s,
        VsockAddr {
            cid: addr.cid,
            port: bound.port,
        },
    ))
}

/// Connects to `addr`, giving up after `timeout` (a non-blocking connect
/// and a poll, the kernel's own time-out set to the same). Errors are
/// explained ([`explain_connect`]).
pub(crate) fn connect(addr: VsockAddr, timeout: Duration) -> io::Result<Socket> {
    if addr.cid == CID_ANY || addr.port == PORT_ANY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "-1 (any) is for listeners: a client names one CID and port, e.g. vsock://2:5000 \
             (2 = the host)",
        ));
    }
    let s = new_socket()?;
    set_connect_timeout(&s, timeout);
    s.connect_timeout(&SockAddr::vsock(addr.cid, addr.port), timeout)
        .and_then(|()| match s.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        })
        .map_err(|e| explain_connect(addr, timeout, e))?;
    Ok(s)
}

/// Sets the kernel's vsock connect time-out (2 s unless set) to `t`, so a
/// longer one is not cut short by it. Best effort: a kernel that refuses
/// keeps its own, and the poll in [`connect`] still bounds a shorter one.
fn set_connect_timeout(s: &Socket, t: Duration) {
    let tv = libc::timeval {
        tv_sec: t.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `s` is an open socket for the duration of the call; the
    // option value is a live, properly aligned `timeval` and its exact size
    // is passed, which is what the kernel reads for this option.
    let _ = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            SOL_VSOCK,
            SO_VM_SOCKETS_CONNECT_TIMEOUT,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// The vsock address `s` is bound to.
pub(crate) fn local_addr(s: &Socket) -> io::Result<VsockAddr> {
    as_vsock(s.local_addr()?)
}

/// The vsock address of the peer connected to `s`.
pub(crate) fn peer_addr(s: &Socket) -> io::Result<VsockAddr> {
    as_vsock(s.peer_addr()?)
}

fn as_vsock(a: SockAddr) -> io::Result<VsockAddr> {
    a.as_vsock_address()
        .map(|(cid, port)| VsockAddr { cid, port })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a vsock socket"))
}

/// `e`, from connecting to `addr`, with a sentence saying what it means
/// (its kind kept, the kernel's words kept in parentheses).
///
/// # Examples
///
/// ```
/// use std::io;
/// use std::time::Duration;
/// use transport::vsock::{explain_connect, VsockAddr, CID_HOST};
/// let e = explain_connect(
///     VsockAddr { cid: CID_HOST, port: 5000 },
///     Duration::from_secs(1),
///     io::Error::from_raw_os_error(libc::ECONNRESET),
/// );
/// assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
/// assert!(e.to_string().starts_with("CID 2 refused port 5000: nothing listens there"), "{e}");
/// ```
pub fn explain_connect(addr: VsockAddr, timeout: Duration, e: io::Error) -> io::Error {
    let VsockAddr { cid, port } = addr;
    let timed_out = |within: String| {
        let hint = if cid == CID_LOCAL {
            "CID 1 (this machine) answers only where the vsock_loopback module is loaded \
             (modprobe vsock_loopback)"
        } else {
            "no VM or host with that CID answers, or it drops the connection (check the CID: \
             2 = the host; a guest's comes from its VM configuration)"
        };
        format!("no answer from CID {cid} port {port} {within}: {hint}")
    };
    let why = match e.raw_os_error() {
        Some(libc::ECONNRESET) | Some(libc::ECONNREFUSED) => format!(
            "CID {cid} refused port {port}: nothing listens there (start the agent there with \
             `tensorwire serve --listen vsock://-1:{port}`; behind Firecracker, a host listener \
             is a Unix socket at the vsock device's uds_path + \"_{port}\")"
        ),
        Some(libc::ETIMEDOUT) => timed_out("within the kernel's connect time-out".into()),
        None if e.kind() == io::ErrorKind::TimedOut => {
            timed_out(format!("within {} ms", timeout.as_millis()))
        }
        Some(libc::ENODEV) => format!(
            "no vsock transport reaches CID {cid}: a guest reaches its host (CID 2), a host its \
             guests (vhost_vsock), and this machine's own CID or CID 1 needs the \
             vsock_loopback module"
        ),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) | Some(libc::EADDRNOTAVAIL) => {
            format!("CID {cid} is unreachable from this machine")
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("not allowed to connect to CID {cid} port {port}")
        }
        _ => return e,
    };
    io::Error::new(e.kind(), format!("{why} ({e})"))
}

/// `e`, from binding `addr`, with a sentence saying what it means.
///
/// # Examples
///
/// ```
/// use std::io;
/// use transport::vsock::{explain_bind, VsockAddr, CID_ANY};
/// let e = explain_bind(VsockAddr { cid: CID_ANY, port: 80 }, io::Error::from_raw_os_error(libc::EACCES));
/// assert!(e.to_string().contains("need CAP_NET_BIND_SERVICE"), "{e}");
/// ```
pub fn explain_bind(addr: VsockAddr, e: io::Error) -> io::Error {
    let VsockAddr { cid, port } = addr;
    let why = match e.raw_os_error() {
        Some(libc::EADDRINUSE) => format!(
            "vsock port {port} is in use on this machine (another agent or listener holds it)"
        ),
        Some(libc::EADDRNOTAVAIL) => format!(
            "CID {cid} is not this machine's: listen on vsock://-1:{port} (any CID) or on its \
             own CID"
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "vsock ports below 1024 need CAP_NET_BIND_SERVICE: choose port {port} >= 1024 or \
             run with that capability"
        ),
        _ => return e,
    };
    io::Error::new(e.kind(), format!("{why} ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_print_as_in_uris() {
        let a = VsockAddr {
            cid: CID_ANY,
            port: 5000,
        };
        assert_eq!(a.to_string(), "-1:5000");
        assert_eq!(
            VsockAddr {
                cid: 2,
                port: PORT_ANY
            }
            .to_string(),
            "2:-1"
        );
    }

    #[test]
    fn errors_are_explained_with_the_kernels_words_kept() {
        let a = VsockAddr { cid: 2, port: 5000 };
        let t = Duration::from_secs(1);
        let e = explain_connect(a, t, io::Error::from_raw_os_error(libc::ECONNRESET));
        let s = e.to_string();
        assert!(
            s.contains("CID 2 refused port 5000") && s.contains("reset"),
            "{s}"
        );
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        let s = explain_connect(
            VsockAddr { cid: 1, port: 5000 },
            t,
            io::Error::from_raw_os_error(libc::ETIMEDOUT),
        )
        .to_string();
        assert!(s.contains("vsock_loopback"), "{s}");
        let s = explain_connect(a, t, io::ErrorKind::TimedOut.into()).to_string();
        assert!(s.contains("within 1000 ms"), "{s}");
        let s = explain_connect(a, t, io::Error::from_raw_os_error(libc::ENODEV)).to_string();
        assert!(s.contains("no vsock transport reaches CID 2"), "{s}");
        let s = explain_bind(a, io::Error::from_raw_os_error(libc::EADDRINUSE)).to_string();
        assert!(s.contains("port 5000 is in use"), "{s}");
        let s = explain_bind(a, io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)).to_string();
        assert!(s.contains("not this machine's"), "{s}");
        // Anything else passes through untouched.
        let e = explain_bind(a, io::Error::from_raw_os_error(libc::ENOMEM));
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
    }

    #[test]
    fn any_is_refused_to_a_client() {
        for a in [
            VsockAddr {
                cid: CID_ANY,
                port: 5000,
            },
            VsockAddr {
                cid: 2,
                port: PORT_ANY,
            },
        ] {
            let e = connect(a, Duration::from_millis(100)).unwrap_err();
            assert!(e.to_string().contains("for listeners"), "{e}");
        }
    }
}
