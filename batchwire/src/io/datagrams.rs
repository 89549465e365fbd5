//! Membership on its own datagrams: SWIM packets and leave notices travel over UDP on the
//! node's own address (the TCP port's number), never on a data connection, so
//! backpressure, a broken connection or a slow reader can neither delay nor fake a
//! membership decision.
//!
//! Every datagram is sealed (`core::membership::datagram`: ChaCha20-Poly1305 under a key
//! derived from the cluster secret, bound to its receiver, numbered against replays). The
//! membership thread owns both ends: it reads and opens each datagram (`DatagramReader`),
//! refuses (and counts) what is not ours, forged, damaged, meant for another member or
//! replayed, and hands the rest to SWIM; it seals and sends (`Sender`). Other threads wake
//! it with an empty datagram from its own socket (`DatagramWaker`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use batchwire_core::codec::Name;
use batchwire_core::membership::datagram::{
    DatagramError, DatagramKey, MAX_DATAGRAM, ReplayGuard, Sealer, open,
};
use tracing::debug;

use crate::io::logs::warn_limited;

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

    /// Seal `body` for the member `to` in its boot `to_boot` and send it to `addr`. A
    /// failure (no route, a full socket buffer) is counted: SWIM takes a lost packet in its
    /// stride.
    pub fn send(&mut self, to: &Name, to_boot: u64, addr: SocketAddr, body: &[u8]) {
        let d = self.sealer.seal(to.as_bytes(), to_boot, body);
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
    if let Err(e) = crate::sys::set_receive_buffer(sock.as_raw_fd(), RECEIVE_BUFFER) {
        debug!(error = %e, "membership socket: receive buffer not grown");
    }
}

/// The receiving side, also owned by the membership thread: it waits for datagrams
/// (or a wake-up, or the next timer), reads every one waiting, refuses (and counts, with
/// rate-limited log lines) what is not ours, forged, damaged, meant for another member or
/// replayed, and hands the rest straight to the machine. No second thread and no channel
/// between the socket and SWIM: each datagram cost a hand-off (a wake-up of another
/// thread) before, most of a member's CPU at rest and during a join at 512 processes.
pub(crate) struct DatagramReader {
    sock: UdpSocket,
    key: DatagramKey,
    guard: ReplayGuard,
    buf: Vec<u8>,
    me: Name,
    /// This node's boot (its incarnation): datagrams sealed for another are stale.
    boot: u64,
    stats: Arc<MemberStats>,
    /// Where the node's own wake-ups come from (`DatagramWaker`): empty datagrams from
    /// there only make the thread look at its inbox.
    waker: Option<SocketAddr>,
}

impl DatagramReader {
    /// The socket is made non-blocking (its clone in `Sender` too: a datagram that finds
    /// the send buffer full is counted as not sent, which SWIM takes in its stride).
    pub fn new(
        sock: UdpSocket,
        key: DatagramKey,
        (me, boot): (Name, u64),
        stats: Arc<MemberStats>,
        max_senders: usize,
        waker: Option<SocketAddr>,
    ) -> std::io::Result<Self> {
        sock.set_nonblocking(true)?;
        grow_receive_buffer(&sock);
        Ok(DatagramReader {
            sock,
            key,
            guard: ReplayGuard::new(max_senders),
            // One byte more than the largest datagram: a longer one shows as too long.
            buf: vec![0u8; MAX_DATAGRAM + 1],
            me,
            boot,
            stats,
            waker,
        })
    }

    /// Wait until a datagram waits to be read, or at most `limit`.
    pub fn wait(&self, limit: Duration) {
        if limit.is_zero() {
            return;
        }
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let ms = limit.as_micros().div_ceil(1000).min(60_000) as i32;
            // `self` keeps the socket open; an interrupted wait just returns.
            let _ = crate::sys::poll_readable([self.sock.as_raw_fd()], ms);
        }
        #[cfg(not(unix))]
        std::thread::sleep(limit.min(Duration::from_millis(10)));
    }

    /// Read at most `max` datagrams waiting now; each that opens and passes the replay
    /// check goes to `take(sender, body)`. Returns whether anything was read.
    pub fn drain(&mut self, max: usize, mut take: impl FnMut(Name, Vec<u8>)) -> bool {
        let mut any = false;
        for _ in 0..max {
            let (n, from) = match self.sock.recv_from(&mut self.buf) {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. an ICMP error for an earlier send (ECONNREFUSED): nothing to
                    // read; the next call reads on.
                    debug!(node = %self.me, error = %e, "membership socket");
                    continue;
                }
            };
            any = true;
            if n == 0 && self.waker == Some(from) {
                continue;
            }
            let checked =
                open(&self.key, self.me.as_bytes(), self.boot, &self.buf[..n]).and_then(|d| {
                    self.guard.check(&d)?;
                    Ok(d)
                });
            match checked {
                Ok(d) => take(d.sender, d.body),
                Err(e) => {
                    self.stats.refused.fetch_add(1, Relaxed);
                    let kind = match e {
                        DatagramError::Replayed { .. } => "replayed",
                        DatagramError::Forged { .. } => "forged",
                        // Sealed for this node's previous boot: a member that has not
                        // heard of the restart yet (as expected for a moment), or a
                        // recording replayed. Not worth a warning either way.
                        DatagramError::Stale { .. } => {
                            debug!(node = %self.me, %from, error = %e, "membership datagram refused");
                            continue;
                        }
                        _ => "malformed",
                    };
                    warn_limited!(node = %self.me, %from, kind, error = %e, "membership datagram refused");
                }
            }
        }
        any
    }
}

/// Wakes the membership thread from other threads: an empty datagram to its socket from
/// that same socket, which the reader recognises by its source (`DatagramReader::drain`).
/// No socket of its own: an ephemeral port taken per node could be the very port another
/// node on the host is about to bind (1000 nodes started together lost 18 that way).
pub(crate) struct DatagramWaker {
    sock: UdpSocket,
    to: SocketAddr,
}

impl DatagramWaker {
    /// A waker for `sock` (a clone of it), bound to `addr` (a wildcard address is reached
    /// on loopback).
    pub fn new(sock: &UdpSocket, addr: SocketAddr) -> std::io::Result<DatagramWaker> {
        Ok(DatagramWaker {
            sock: sock.try_clone()?,
            to: crate::io::reachable(addr),
        })
    }

    /// Where its datagrams come from (and go to).
    pub fn addr(&self) -> SocketAddr {
        self.to
    }

    /// Wake the thread (never waits once the reader made the socket non-blocking; a
    /// wake-up already on its way is enough).
    pub fn wake(&self) {
        let _ = self.sock.send_to(&[], self.to);
    }
}

/// The membership's own counters, shared with `stats()`.
#[derive(Default)]
pub(crate) struct MemberStats {
    pub bytes_in: std::sync::atomic::AtomicU64,
    pub bytes_out: std::sync::atomic::AtomicU64,
    pub packets_in: std::sync::atomic::AtomicU64,
    pub packets_out: std::sync::atomic::AtomicU64,
    /// Of those: probes and their answers, gossip, full-state answers.
    pub probes_out: std::sync::atomic::AtomicU64,
    pub gossip_out: std::sync::atomic::AtomicU64,
    pub state_out: std::sync::atomic::AtomicU64,
    pub rate_limited: std::sync::atomic::AtomicU64,
    pub violations: std::sync::atomic::AtomicU64,
    pub members_refused: std::sync::atomic::AtomicU64,
    pub swim_full: std::sync::atomic::AtomicU64,
    /// Datagrams refused: not ours, forged, damaged, for another member, replayed.
    pub refused: std::sync::atomic::AtomicU64,
    /// Datagrams the socket would not send.
    pub send_errors: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::members::Members;
    use std::time::Instant;

    fn rig() -> (UdpSocket, DatagramReader, DatagramWaker, Arc<MemberStats>) {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        let waker = DatagramWaker::new(&sock, addr).unwrap();
        let stats = Arc::new(MemberStats::default());
        let key = DatagramKey::from_secret(b"s");
        let me = Name::new("me").unwrap();
        let reader = DatagramReader::new(
            sock.try_clone().unwrap(),
            key,
            (me, 1),
            stats.clone(),
            8,
            Some(waker.addr()),
        )
        .unwrap();
        (sock, reader, waker, stats)
    }

    /// Wait (bounded) until the reader has something; the time it took.
    fn woken(r: &mut DatagramReader, taken: &mut Vec<(Name, Vec<u8>)>) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            r.wait(Duration::from_secs(5));
            if r.drain(16, |n, b| taken.push((n, b))) {
                return Some(t.elapsed());
            }
        }
        None
    }

    #[test]
    fn the_nodes_own_wake_up_wakes_the_reader_and_is_not_a_datagram() {
        let (_sock, mut r, w, stats) = rig();
        let mut taken = Vec::new();
        w.wake();
        let t = woken(&mut r, &mut taken).expect("woken");
        // Far under the 5 s the wait was given (a sleeping reader would take all of it).
        assert!(t < Duration::from_secs(4), "{t:?}");
        assert!(taken.is_empty());
        assert_eq!(stats.refused.load(Relaxed), 0);
        // Nothing more: the wait runs out, and the drain finds nothing.
        let t0 = Instant::now();
        r.wait(Duration::from_millis(50));
        assert!(t0.elapsed() >= Duration::from_millis(40));
        assert!(!r.drain(16, |n, b| taken.push((n, b))));
    }

    #[test]
    fn an_empty_datagram_from_anyone_else_is_refused_and_counted() {
        let (sock, mut r, _w, stats) = rig();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(&[], sock.local_addr().unwrap()).unwrap();
        let mut taken = Vec::new();
        woken(&mut r, &mut taken).expect("read");
        assert!(taken.is_empty());
        assert_eq!(stats.refused.load(Relaxed), 1);
    }

    #[test]
    fn every_input_to_the_membership_thread_wakes_it() {
        let (_sock, mut r, w, _stats) = rig();
        let (m, rx) = Members::new();
        m.set_waker(w);
        let mut taken = Vec::new();
        // Setting the waker wakes it once (inputs may be waiting already).
        woken(&mut r, &mut taken).expect("woken by set_waker");
        let name = Name::new("peer").unwrap();
        m.heard(&name, 7);
        woken(&mut r, &mut taken).expect("woken by an input");
        m.unreachable(&name);
        woken(&mut r, &mut taken).expect("woken by an input");
        m.wake();
        woken(&mut r, &mut taken).expect("woken by wake");
        assert_eq!(rx.try_iter().count(), 3);
    }
}
