//! Passing one file descriptor with a message over a Unix socket
//! (`SCM_RIGHTS`): how a tenant receives its private arena without the arena
//! ever having a name another process could open.
//!
//! Both calls retry when a signal interrupts them: the sockets carry
//! `SO_RCVTIMEO`/`SO_SNDTIMEO`, and on such a socket the kernel returns
//! `EINTR` even for a handler installed with `SA_RESTART`, so any signal the
//! host process takes (a profiler's timer, libFuzzer's alarm) would
//! otherwise end a healthy bootstrap.

use rustix::io::Errno;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Sends `data` with `fd` attached, in one message.
///
/// # Examples
///
/// Handing an open file to another process over a Unix socket (here both
/// ends are in one process):
///
/// ```
/// use std::io::{Read, Seek, Write};
/// use std::os::fd::AsFd;
/// use std::os::unix::net::UnixStream;
/// use transport::shm::fdpass::{recv_with_fd, send_with_fd};
/// let (a, b) = UnixStream::pair()?;
/// let mut f = tempfile::tempfile()?;
/// f.write_all(b"passed")?;
/// send_with_fd(&a, b"here", f.as_fd())?;
///
/// let mut buf = [0u8; 16];
/// let (n, fd) = recv_with_fd(&b, &mut buf)?;
/// assert_eq!(&buf[..n], b"here");
/// let mut got = std::fs::File::from(fd.ok_or("an fd came")?);
/// got.rewind()?; // the same open file: one offset for both
/// let mut text = String::new();
/// got.read_to_string(&mut text)?;
/// assert_eq!(text, "passed");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn send_with_fd(sock: &UnixStream, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(
            "no room for the fd in the control message",
        ));
    }
    let n = loop {
        match sendmsg(sock, &[IoSlice::new(data)], &mut cmsg, SendFlags::NOSIGNAL) {
            Err(Errno::INTR) => continue,
            r => break r?,
        }
    };
    if n != data.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send of the fd message",
        ));
    }
    Ok(())
}

/// Receives one message into `buf`, with at most one attached fd. Extra fds
/// (a misbehaving peer) are closed and make this an error.
///
/// # Examples
///
/// A message without an fd, and the end of the stream:
///
/// ```
/// use std::io::Write;
/// use std::os::unix::net::UnixStream;
/// use transport::shm::fdpass::recv_with_fd;
/// let (mut a, b) = UnixStream::pair()?;
/// a.write_all(b"plain")?;
/// drop(a);
/// let mut buf = [0u8; 16];
/// let (n, fd) = recv_with_fd(&b, &mut buf)?;
/// assert_eq!((&buf[..n], fd.is_none()), (&b"plain"[..], true));
/// assert_eq!(recv_with_fd(&b, &mut buf)?.0, 0); // closed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        match recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut got: Vec<OwnedFd> = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            got.extend(fds);
        }
    }
    if r.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated",
        ));
    }
    if got.len() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("peer sent {} fds, expected at most one", got.len()),
        ));
    }
    Ok((r.bytes, got.pop()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Arena;
    use std::sync::atomic::Ordering;

    #[test]
    fn arena_travels_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let arena = Arena::create("tw-pass", 8192).unwrap();
        arena.atomic_u64(0).store(42, Ordering::Release);
        send_with_fd(&a, b"hello", arena.fd()).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let peer = Arena::open(fd.unwrap(), Some(8192)).unwrap();
        assert_eq!(peer.atomic_u64(0).load(Ordering::Acquire), 42);
        // A plain message carries no fd.
        use std::io::Write;
        (&a).write_all(b"x").unwrap();
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((n, fd.is_none()), (1, true));
    }

    /// A signal landing while the receiver waits (on a socket with a
    /// timeout, where `SA_RESTART` does not apply) must not fail the call.
    #[test]
    fn a_signal_does_not_interrupt_the_fd_message() {
        crate::shm::signals::catch_sigusr1();
        let (a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let receiver = std::thread::spawn(move || {
            tid_tx.send(crate::shm::signals::this_thread()).unwrap();
            let mut buf = [0u8; 16];
            recv_with_fd(&b, &mut buf).map(|(n, fd)| (buf[..n].to_vec(), fd.is_some()))
        });
        let tid = tid_rx.recv().unwrap();
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            // The receiver is alive: blocked in recvmsg until the send.
            crate::shm::signals::interrupt(tid);
        }
        let arena = Arena::create("tw-pass-signal", 4096).unwrap();
        send_with_fd(&a, b"after", arena.fd()).unwrap();
        let got = receiver
            .join()
            .unwrap()
            .expect("recv_with_fd survives signals");
        assert_eq!(got, (b"after".to_vec(), true));
    }
}
