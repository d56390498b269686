//! [`PeerId`]: who is on the other end of a socket, as far as the kernel
//! can vouch for it — the key that per-peer limits count connections by.
//!
//! Over a Unix socket (and so over `shm://`, whose sessions start on one)
//! that is the connecting process's user id, from `SO_PEERCRED`: the
//! kernel records it at `connect`, so a peer cannot lie about it, and every
//! process of one user counts as one peer (a user who can open a thousand
//! connections can also ptrace the others of its processes: there is no
//! finer line to draw). Over TCP it is the source address: all a listener
//! knows of a remote peer. A host that owns many addresses (IPv6 prefixes)
//! counts as many peers; tokens (issue "tenants") are the answer to that.
//! Over vsock it is the peer's CID (its virtual machine, or 2 for the
//! host): the port is a connection's own, as a TCP source port is, and
//! vsock has no `SO_PEERCRED`.
//!
//! [`hung_up`]: whether the other end has closed the connection, asked
//! without reading from it (a session whose client died, for a request of
//! its that is still waiting).

use rustix::event::{poll, PollFd, PollFlags};
use std::fmt;
use std::io;
use std::net::{IpAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

/// The identity a connection's limits are counted under.
///
/// # Examples
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use transport::PeerId;
/// let l = TcpListener::bind("127.0.0.1:0")?;
/// let s = TcpStream::connect(l.local_addr()?)?;
/// let (accepted, _) = l.accept()?;
/// let id = PeerId::of_tcp(&accepted)?;
/// assert_eq!(id.to_string(), "address 127.0.0.1"); // limits count per source address
/// # drop(s);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerId {
    /// A local process, by user id (Unix and shared-memory control sockets).
    Uid(u32),
    /// A remote (or loopback) TCP peer, by source address.
    Addr(IpAddr),
    /// A vsock peer, by CID: every process of one VM counts as one peer.
    Vsock(u32),
}

/// What the kernel recorded of a local peer when it connected
/// (`SO_PEERCRED`): its process, user and group ids. The agent's tenants
/// are matched on them; a peer cannot forge them.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::Credentials;
/// let (a, _b) = UnixStream::pair()?;
/// let who = Credentials::of_unix(&a)?;
/// assert_eq!(who.pid, std::process::id() as i32);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The connecting process's id (it may have exited since).
    pub pid: i32,
    /// Its effective user id at `connect`.
    pub uid: u32,
    /// Its effective group id at `connect`.
    pub gid: u32,
}

impl Credentials {
    /// The credentials of the process that connected the Unix socket `s`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::fs::MetadataExt;
    /// use std::os::unix::net::UnixStream;
    /// use transport::Credentials;
    /// let (a, _b) = UnixStream::pair()?;
    /// let who = Credentials::of_unix(&a)?;
    /// let me = std::fs::metadata("/proc/self")?;
    /// assert_eq!((who.uid, who.gid), (me.uid(), me.gid()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_unix(s: impl AsFd) -> io::Result<Credentials> {
        let c = rustix::net::sockopt::socket_peercred(s)?;
        Ok(Credentials {
            pid: c.pid.as_raw_nonzero().get(),
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
        })
    }
}

impl PeerId {
    /// The user id of the process that connected `s` (`SO_PEERCRED`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::fs::MetadataExt;
    /// use std::os::unix::net::UnixStream;
    /// use transport::PeerId;
    /// let (a, _b) = UnixStream::pair()?;
    /// let me = std::fs::metadata("/proc/self")?.uid();
    /// assert_eq!(PeerId::of_unix(&a)?, PeerId::Uid(me));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_unix(s: &UnixStream) -> io::Result<PeerId> {
        Ok(PeerId::Uid(Credentials::of_unix(s)?.uid))
    }

    /// The source address of `s`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
    /// use transport::PeerId;
    /// let l = TcpListener::bind("127.0.0.1:0")?;
    /// let _c = TcpStream::connect(l.local_addr()?)?;
    /// let (s, _) = l.accept()?;
    /// assert_eq!(PeerId::of_tcp(&s)?, PeerId::Addr(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_tcp(s: &TcpStream) -> io::Result<PeerId> {
        // An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d:
        // counted as the IPv4 address it is.
        let ip = match s.peer_addr()?.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        Ok(PeerId::Addr(ip))
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerId::Uid(u) => write!(f, "uid {u}"),
            PeerId::Addr(a) => write!(f, "address {a}"),
            PeerId::Vsock(cid) => write!(f, "vsock CID {cid}"),
        }
    }
}

/// True once the other end of the connected socket `sock` has closed it
/// (its process exited or was killed) or the connection failed: a
/// zero-timeout `poll(2)` sees `POLLHUP`, `POLLRDHUP` or `POLLERR`, or the
/// socket is readable with end of stream next. Unread data ahead (a
/// pipelined message) is not a hang-up. A signal landing in the poll is
/// not one either: even a zero-timeout `poll(2)` returns `EINTR` when a
/// signal is pending and no fd is ready, so it is retried. A client that
/// closes only its write side (`shutdown(SHUT_WR)`) counts as gone.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// let (a, b) = UnixStream::pair()?;
/// assert!(!transport::hung_up(&a));
/// drop(b);
/// assert!(transport::hung_up(&a));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn hung_up(sock: impl AsFd) -> bool {
    let sock = sock.as_fd();
    let mut fds = [PollFd::new(&sock, PollFlags::IN | PollFlags::RDHUP)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let polled = loop {
        match poll(&mut fds, Some(&zero)) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r,
        }
    };
    match polled {
        Ok(0) => false,
        Ok(_) => {
            let r = fds[0].revents();
            r.intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
                || (r.contains(PollFlags::IN) && {
                    let mut b = [0u8; 1];
                    matches!(
                        rustix::net::recv(
                            sock,
                            &mut b,
                            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
                        ),
                        Ok((0, _))
                    )
                })
        }
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hang_up_is_seen_with_or_without_unread_data_and_data_alone_is_not_one() {
        use std::io::Write;
        // Unix: data waiting is not a hang-up; the close after it is.
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"next message").unwrap();
        assert!(!hung_up(&a));
        drop(b);
        assert!(hung_up(&a));
        // TCP: the peer's FIN (what a killed client's kernel sends).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(!hung_up(&s));
        drop(c);
        let t0 = std::time::Instant::now();
        while !hung_up(&s) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "the FIN never showed"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // A peer that closes only its write side counts as gone.
        let (a, b) = UnixStream::pair().unwrap();
        b.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(hung_up(&a));
    }
    use std::net::TcpListener;

    #[test]
    fn a_unix_peer_is_its_user() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = rustix::process::getuid().as_raw();
        assert_eq!(PeerId::of_unix(&a).unwrap(), PeerId::Uid(me));
        assert_eq!(PeerId::Uid(1000).to_string(), "uid 1000");
        let c = Credentials::of_unix(&a).unwrap();
        assert_eq!(c.uid, me);
        assert_eq!(c.gid, rustix::process::getgid().as_raw());
        assert_eq!(c.pid, std::process::id() as i32);
    }

    #[test]
    fn a_tcp_peer_is_its_source_address() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // Bind the client to another loopback address: it is another peer.
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(
            &"127.0.0.3:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        s.connect(&addr.into()).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(
            PeerId::of_tcp(&accepted).unwrap(),
            PeerId::Addr("127.0.0.3".parse().unwrap())
        );
        assert_eq!(
            PeerId::Addr("127.0.0.3".parse().unwrap()).to_string(),
            "address 127.0.0.3"
        );
    }
}
