//! The few calls into the C library that the IO layer makes, each behind a safe function
//! with its SAFETY argument: the only `unsafe` of the library (`lib.rs` denies it
//! everywhere else, and `batchwire-core` forbids it).
//!
//! Each takes descriptors the caller keeps open for the call (borrowed `RawFd`s of
//! sockets or eventfds it owns) and memory the call may touch only through the slices and
//! buffers it is given.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use bytes::BytesMut;

/// Most buffers one `sendmsg` takes (Linux's IOV_MAX); the rest is left over.
pub(crate) const IOV_MAX: usize = 1024;

/// Wait until one of `fds` is readable (or hung up), for at most `timeout_ms`
/// milliseconds (negative: no limit). A negative descriptor is ignored. Returns which
/// were ready; `Interrupted` if a signal ended the wait.
pub(crate) fn poll_readable<const N: usize>(
    fds: [RawFd; N],
    timeout_ms: i32,
) -> io::Result<[bool; N]> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: poll(2) reads and writes exactly `N` pollfds, which live in this frame for
    // the call; a negative fd is ignored by the kernel, the others the caller keeps open.
    let r = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, timeout_ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p.map(|p| p.revents != 0))
}

/// Give the C allocator's free pages back to the kernel (glibc's `malloc_trim`): the
/// touched pages of freed buffers otherwise stay resident until something reuses them.
/// Nothing where that is not glibc.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it returns whole free pages of glibc's heaps to
    // the kernel (madvise) under the allocator's own locks, and is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A new non-blocking eventfd (a counter that is readable while above zero).
#[cfg(target_os = "linux")]
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just made and nothing else owns it, so `OwnedFd` may
    // close it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Make the eventfd `fd` readable. It fails only if the counter would overflow, when it
/// is readable anyway.
pub(crate) fn eventfd_signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: write(2) of 8 bytes from a live stack buffer; the caller keeps `fd` open.
    let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
}

/// Make the non-blocking eventfd `fd` unreadable again (one read takes every signal;
/// `EAGAIN`, nothing signalled, is fine).
pub(crate) fn eventfd_drain(fd: RawFd) {
    let mut buf = [0u8; 8];
    // SAFETY: read(2) of at most 8 bytes into a live stack buffer; the caller keeps `fd`
    // open.
    let _ = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
}

/// One `recv(2)` of at most `max` bytes from `fd` onto the end of `buf`, straight into its
/// spare capacity (nothing zeroed first); how many, 0 at the end of the stream. Without
/// `wait`, `WouldBlock` at once if nothing is there; with it, the socket's read timeout
/// applies.
pub(crate) fn recv_append(
    fd: RawFd,
    buf: &mut BytesMut,
    max: usize,
    wait: bool,
) -> io::Result<usize> {
    buf.reserve(max);
    let len = buf.len();
    let spare = buf.spare_capacity_mut();
    let n = spare.len().min(max);
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: recv(2) writes at most `n` bytes through a raw pointer into the spare
    // capacity (no reference to uninitialized memory is made) and returns how many it
    // wrote; exactly those are then counted as initialized by `set_len`.
    let r = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), n, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let r = r as usize;
    // SAFETY: the first `r` bytes of the spare capacity were written by recv above.
    unsafe { buf.set_len(len + r) };
    Ok(r)
}

/// One `recvmsg(2)` from `fd` without waiting (`WouldBlock` if nothing is there): at most
/// `first.1` bytes onto the end of `first.0`, then at most `then.1` onto the end of
/// `then.0`, straight into their spare capacity. Returns how many in all; the first
/// buffer is filled first.
pub(crate) fn recv_pair(
    fd: RawFd,
    first: (&mut Vec<u8>, usize),
    then: (&mut BytesMut, usize),
) -> io::Result<usize> {
    let (a, a_max) = first;
    let (b, b_max) = then;
    a.reserve(a_max);
    b.reserve(b_max);
    let (a_len, b_len) = (a.len(), b.len());
    let a_spare = a.spare_capacity_mut();
    let b_spare = b.spare_capacity_mut();
    let mut iov = [
        libc::iovec {
            iov_base: a_spare.as_mut_ptr().cast(),
            iov_len: a_spare.len().min(a_max),
        },
        libc::iovec {
            iov_base: b_spare.as_mut_ptr().cast(),
            iov_len: b_spare.len().min(b_max),
        },
    ];
    let a_room = iov[0].iov_len;
    // SAFETY: an all-zero msghdr is valid (no name, no control data); it points at two
    // iovecs on this stack frame, each describing spare capacity of a live buffer.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: recvmsg(2) writes at most each iovec's length through its raw pointer (no
    // reference to uninitialized memory is made), filling the first before the second,
    // and returns how many bytes it wrote; exactly those are then counted as initialized
    // below.
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let r = r as usize;
    let into_a = r.min(a_room);
    // SAFETY: recvmsg wrote `into_a` bytes at the start of `a`'s spare capacity and the
    // rest at the start of `b`'s.
    unsafe {
        a.set_len(a_len + into_a);
        b.set_len(b_len + (r - into_a));
    }
    Ok(r)
}

/// One `sendmsg(2)` of the first [`IOV_MAX`] of `bufs`, in order, without waiting and
/// without SIGPIPE: how many bytes the socket took (`WouldBlock` if none).
pub(crate) fn send_vectored(fd: RawFd, bufs: &[&[u8]]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = bufs
        .iter()
        .take(IOV_MAX)
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: an all-zero msghdr is valid (no name, no control data); `msg_iov` points at
    // `iov.len()` iovecs that each describe a live, readable slice of `bufs`, all borrowed
    // for the duration of the call, and sendmsg only reads them.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: see above.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Ask the kernel to buffer up to `bytes` received on socket `fd` (it caps the request
/// at `net.core.rmem_max`).
pub(crate) fn set_receive_buffer(fd: RawFd, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: a pointer to a c_int that lives across the call, and its size; setsockopt
    // only reads them.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Let the listening socket `fd` queue up to `backlog` connections that the node has not
/// accepted yet (Linux updates the queue of a socket that already listens; it caps the
/// length at `net.core.somaxconn`).
pub(crate) fn set_listen_backlog(fd: RawFd, backlog: libc::c_int) -> io::Result<()> {
    // SAFETY: listen(2) takes a descriptor the caller keeps open and an integer; it
    // touches no memory of this process.
    if unsafe { libc::listen(fd, backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes received on socket `fd` that no one has read yet (ioctl FIONREAD).
pub(crate) fn unread_bytes(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int, here a local that lives across the call; the
    // descriptor is one the caller keeps open.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// The CPU time the calling thread has used.
#[cfg(test)]
pub(crate) fn thread_cpu_time() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec on this stack frame.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
