//! Membership on its own datagrams: SWIM packets and leave notices travel over UDP on the
//! node's own address (the TCP port's number), never on a data connection, so
//! backpressure, a broken connection or a slow reader can neither delay nor fake a
//! membership decision.
//!
//! Every datagram is sealed (`core::membership::datagram`: ChaCha20-Poly1305 under a key
//! derived from the cluster secret, bound to its receiver, numbered against replays). The
//! reader thread opens each one, refuses (and counts, with rate-limited log lines) what
//! is not ours, forged, damaged, meant for another member or replayed, and hands the rest
//! to the membership thread, whose inbox never blocks it. The membership thread seals and
//! sends (`Sender`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use batchwire_core::codec::Name;
use batchwire_core::membership::datagram::{
    DatagramError, DatagramKey, MAX_DATAGRAM, ReplayGuard, Sealer, open,
};
use bytes::Bytes;
use tracing::debug;

use crate::io::logs::warn_limited;
use crate::io::members::{MemberStats, Members};
use crate::io::shutdown::Shutdown;

/// Longest a receive waits before it looks at the shutdown signal again (the node also
/// wakes it with a datagram of its own).
const POLL: Duration = Duration::from_secs(1);

/// The sending side, owned by the membership thread.
pub(crate) struct Sender {
    sock: UdpSocket,
    sealer: Sealer,
    stats: Arc<MemberStats>,
}

impl Sender {
    pub fn new(
        sock: UdpSocket,
        key: &DatagramKey,
        me: Name,
        boot: u64,
        stats: Arc<MemberStats>,
    ) -> Self {
        Sender {
            sock,
            sealer: Sealer::new(key, me, boot),
            stats,
        }
    }

    /// Seal `body` for the member `to` and send it to `addr`. A failure (no route, a full
    /// socket buffer) is counted: SWIM takes a lost packet in its stride.
    pub fn send(&mut self, to: &Name, addr: SocketAddr, body: &[u8]) {
        let d = self.sealer.seal(to.as_bytes(), body);
        if let Err(e) = self.sock.send_to(&d, addr) {
            self.stats.send_errors.fetch_add(1, Relaxed);
            debug!(member = %to, %addr, error = %e, "membership datagram not sent");
        }
    }
}

/// What the reader asks the kernel to buffer: a join sends a burst of datagrams, and on a
/// busy machine the reader may not run for a while (the kernel caps it at
/// `net.core.rmem_max`, 4 MiB on Debian; its default, 208 KiB, holds about 90 datagrams).
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// Ask for a receive buffer of `RECEIVE_BUFFER` (best effort).
fn grow_receive_buffer(sock: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let v = RECEIVE_BUFFER;
    // SAFETY: a valid socket descriptor, a pointer to a c_int that lives across the call
    // and its size; the call reads them only.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        debug!(error = %std::io::Error::last_os_error(), "membership socket: receive buffer not grown");
    }
}

/// The reader thread's body: until the node stops, receive, open, check, hand over.
pub(crate) fn run_reader(
    sock: UdpSocket,
    key: DatagramKey,
    me: Name,
    members: Members,
    stats: Arc<MemberStats>,
    shutdown: Shutdown,
    max_senders: usize,
) {
    let _ = sock.set_read_timeout(Some(POLL));
    grow_receive_buffer(&sock);
    let mut guard = ReplayGuard::new(max_senders);
    // One byte more than the largest datagram: a longer one shows as too long.
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let got = sock.recv_from(&mut buf);
        if shutdown.is_stopped() {
            return;
        }
        let (n, from) = match got {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                // E.g. an ICMP error for an earlier send (ECONNREFUSED): nothing to read.
                debug!(node = %me, error = %e, "membership socket");
                continue;
            }
        };
        let checked = open(&key, me.as_bytes(), &buf[..n]).and_then(|d| {
            guard.check(&d)?;
            Ok(d)
        });
        match checked {
            Ok(d) => members.frame(&d.sender, Bytes::from(d.body)),
            Err(e) => {
                stats.refused.fetch_add(1, Relaxed);
                let kind = match e {
                    DatagramError::Replayed { .. } => "replayed",
                    DatagramError::Forged { .. } => "forged",
                    _ => "malformed",
                };
                warn_limited!(node = %me, %from, kind, error = %e, "membership datagram refused");
            }
        }
    }
}

/// Wake a reader bound to `addr` (a wildcard address is reached on loopback).
pub(crate) fn wake(addr: SocketAddr) {
    let to = crate::io::reachable(addr);
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    if let Ok(s) = UdpSocket::bind(any) {
        let _ = s.send_to(&[], to);
    }
}
