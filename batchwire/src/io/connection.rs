//! The connection layer: the threads that move bytes between sockets and the sans-IO core.
//! Every step is commented, in the manner of mini-redis' `connection.rs`.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tracing::{debug, info, warn};

use crate::error::LinkError;
use crate::io::detector::{declare_down, fail_window};
use crate::io::mailbox::MailboxQueue;
use crate::io::node::{Address, Conn, Event, Peer, PeerState, Shared};
use crate::io::tls::Link;
use crate::stats::HandshakeFailure;
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, MessageList, Resume};
use batchwire_core::handshake::{Handshake, HandshakeConfig, HandshakeError, PeerInfo, Role};

/// Handshake frames are small; anything bigger than this before authentication is refused.
const HANDSHAKE_MAX_FRAME: usize = 4096;

/// Accept connections until the node shuts down; each gets a thread of its own, which
/// first runs the handshake. At most `max_handshakes` of those run at once: beyond that a
/// new connection is closed at once and counted, so a flood of unauthenticated clients costs
/// a bounded number of threads. Nothing here can end the loop but the node's shutdown: a
/// failure to accept or to spawn is logged, counted and retried after a pause.
pub(crate) fn run_acceptor(shared: &Arc<Shared>, listener: TcpListener) {
    for stream in listener.incoming() {
        // `shutdown` wakes us with a connection of its own once its writers are done; the
        // flag says to stop. (Until then peers may reconnect, so queues can still flush.)
        if shared.ticker_should_stop() {
            break;
        }
        let s = match stream {
            Ok(s) => s,
            Err(e) => {
                // Typically EMFILE; back off a little rather than spin.
                shared.security.accept_errors.fetch_add(1, Relaxed);
                warn!(node = %shared.name, error = %e, "accept failed; retrying in 50 ms");
                if !shared.sleep(Duration::from_millis(50)) {
                    break;
                }
                continue;
            }
        };
        let from = s.peer_addr().map(|a| a.ip()).ok();
        let Some(slot) = from.and_then(|ip| HandshakeSlot::take(shared, ip)) else {
            // Too many handshakes in progress (from that address, or in all): close at once
            // (dropping the socket).
            let n = shared.security.busy.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                warn!(node = %shared.name, addr = ?from, refused_so_far = n, max = shared.config.max_handshakes, per_address = shared.config.max_handshakes_per_address, "too many handshakes in progress; closing new connections at once");
            }
            continue;
        };
        let name = format!("bw-in-{}", shared.name);
        if let Err(e) = shared.spawn(name, move |sh| {
            run_connection(&sh, s, None, Some(slot));
        }) {
            // The closure (socket and slot) was dropped: the connection is closed.
            shared.security.spawn_errors.fetch_add(1, Relaxed);
            warn!(node = %shared.name, error = %e, "cannot start a thread for a new connection; closed it, retrying in 50 ms");
            if !shared.sleep(Duration::from_millis(50)) {
                break;
            }
        }
    }
}

/// One of the `max_handshakes` places for an inbound handshake, taken by one source
/// address (which holds at most `max_handshakes_per_address`, so a flood from one address
/// cannot take every place); freed when dropped.
pub(crate) struct HandshakeSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl HandshakeSlot {
    fn take(shared: &Arc<Shared>, ip: IpAddr) -> Option<HandshakeSlot> {
        let cfg = &shared.config;
        let mut g = shared.handshakes.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = g.values().sum();
        let here = g.get(&ip).copied().unwrap_or(0);
        if total >= cfg.max_handshakes || here >= cfg.max_handshakes_per_address {
            return None;
        }
        *g.entry(ip).or_insert(0) += 1;
        Some(HandshakeSlot {
            shared: shared.clone(),
            ip,
        })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut g = self
            .shared
            .handshakes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = g.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                g.remove(&self.ip);
            }
        }
    }
}

/// Dial `peer` at `addr`, run the connection until it breaks, and dial again with
/// exponential back-off, until the node shuts down.
pub(crate) fn run_dialer(shared: &Arc<Shared>, peer: &Arc<Peer>, addr: SocketAddr) {
    let cfg = &shared.config;
    let mut backoff = cfg.reconnect_min;
    let mut failures = 0u32;
    while !shared.ticker_should_stop() {
        match TcpStream::connect_timeout(&addr, cfg.handshake_timeout) {
            Ok(s) => {
                // A completed handshake resets the back-off.
                if run_connection(shared, s, Some(peer.name.clone()), None) {
                    backoff = cfg.reconnect_min;
                    failures = 0;
                }
            }
            Err(e) => {
                failures += 1;
                // Log the first failure and then rarely: a peer that is not up yet is normal.
                if failures == 1 || failures.is_power_of_two() {
                    debug!(node = %shared.name, peer = %peer.name, %addr, error = %e, failures, "cannot connect yet; retrying with back-off");
                }
            }
        }
        if !shared.sleep(backoff) {
            break;
        }
        backoff = (backoff * 2).min(cfg.reconnect_max);
    }
}

/// Handshake on a fresh socket, then read from it until it closes. `expect` is the peer's
/// name when we dialled; `slot` is the inbound handshake's place, freed once the peer is
/// authenticated. Returns whether the handshake succeeded.
pub(crate) fn run_connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    expect: Option<Name>,
    slot: Option<HandshakeSlot>,
) -> bool {
    let addr = match stream.peer_addr() {
        Ok(a) => a,
        Err(_) => return false, // already gone
    };
    // Small messages must not wait for Nagle: batching is the bundler's job.
    let _ = stream.set_nodelay(true);
    // One deadline for everything before the connection carries messages: TLS, the
    // batchwire handshake and the RESUME exchange.
    let deadline = Instant::now() + shared.config.handshake_timeout;

    // 1. With TLS configured: the TLS handshake first (mutual), then everything else runs
    //    inside it. 2. Authenticate (both sides prove the cluster secret; see
    //    core::handshake), and with TLS check that the peer's certificate names the node it
    //    claims to be.
    let setup = open_link(shared, stream, expect.as_ref(), deadline).and_then(|link| {
        let link = Arc::new(link);
        let (info, buf) = handshake(shared, &link, expect.clone(), deadline)?;
        check_certificate(shared, &link, &info)?;
        Ok((link, info, buf))
    });
    let (link, info, leftover) = match setup {
        Ok(x) => x,
        Err(e) => {
            if !shared.is_shutting_down() {
                let kind = HandshakeFailure::of(&e);
                shared.security.count(kind);
                let peer = match &e {
                    LinkError::Handshake(h) => h.peer().map(|p| p.to_string()),
                    LinkError::Certificate { peer, .. } => Some(peer.clone()),
                    _ => None,
                }
                .or_else(|| expect.as_ref().map(|n| n.to_string()));
                warn!(node = %shared.name, %addr, peer = ?peer, kind = ?kind, error = %e, "handshake failed; connection closed");
                shared.emit(Event::HandshakeFailed {
                    addr,
                    peer,
                    kind,
                    reason: e.to_string(),
                });
            }
            return false;
        }
    };
    drop(slot);

    // 2. Find the peer's state. A peer that restarted (a new incarnation) starts both
    //    streams from 0; what we held for its old incarnation can never be delivered.
    let Some(peer) = shared.peer_or_insert(&info.name) else {
        return false;
    };
    let restarted = {
        let mut inc = peer.incarnation.lock().unwrap_or_else(|e| e.into_inner());
        let r = inc.is_some_and(|i| i != info.incarnation);
        *inc = Some(info.incarnation);
        r
    };
    if restarted {
        info!(node = %shared.name, peer = %info.name, "peer restarted (new incarnation)");
        fail_window(
            shared,
            &peer,
            true,
            "the peer restarted (new incarnation) before acknowledging",
        );
        peer.recv.lock().unwrap_or_else(|e| e.into_inner()).reset();
    }

    // 3. RESUME each way: what each side received, and the oldest it still holds.
    let leftover = match resume(shared, &peer, &link, leftover, deadline) {
        Ok(l) => l,
        Err(e) => {
            warn!(node = %shared.name, peer = %info.name, %addr, error = %e, "connection lost while resuming");
            if let LinkError::Sequence(_) = &e {
                peer.stats.violations.fetch_add(1, Relaxed);
            }
            if !shared.is_shutting_down() {
                let kind = HandshakeFailure::of(&e);
                shared.security.count(kind);
                shared.emit(Event::HandshakeFailed {
                    addr,
                    peer: Some(info.name.to_string()),
                    kind,
                    reason: e.to_string(),
                });
            }
            return true;
        }
    };

    // 4. Make this the peer's current connection; its writer picks it up and first writes
    //    everything the peer has not acknowledged.
    let conn = Arc::new(Conn::new(link.clone()));
    peer.last_read.store(shared.now_ms(), Relaxed);
    peer.install(conn.clone());
    peer.stats.connects.fetch_add(1, Relaxed);
    info!(node = %shared.name, peer = %info.name, %addr, "connected");
    if peer.set_state(PeerState::Up) != PeerState::Up {
        shared.emit(Event::PeerUp {
            peer: info.name.to_string(),
            incarnation: info.incarnation,
        });
    }
    shared.emit(Event::Connected {
        peer: info.name.to_string(),
        incarnation: info.incarnation,
        addr,
    });

    // 5. Read frames until the connection ends one way or another.
    let result = read_loop(shared, &peer, &info, &conn, &link, leftover);

    // 6. Tear down: close both halves (the writer notices) and forget the connection.
    conn.close();
    peer.uninstall(&conn);
    peer.disconnected_at.store(shared.now_ms(), Relaxed);
    let reason = match &result {
        Ok(()) => "peer shut down".to_string(),
        Err(e) => e.to_string(),
    };
    if let Err(LinkError::Sequence(_)) = &result {
        peer.stats.violations.fetch_add(1, Relaxed);
    }
    if shared.is_shutting_down() {
        debug!(node = %shared.name, peer = %info.name, reason, "connection closed during shutdown");
    } else if result.is_ok() {
        info!(node = %shared.name, peer = %info.name, "peer said goodbye");
        // It will not acknowledge anything more: hand back what it did not.
        declare_down(shared, &peer, "the peer shut down");
    } else {
        warn!(node = %shared.name, peer = %info.name, %addr, reason, "connection lost; will resume");
    }
    shared.emit(Event::Disconnected {
        peer: info.name.to_string(),
        reason,
    });
    true
}

/// Exchange RESUME frames on a fresh connection and set both windows from the peer's.
/// Returns the bytes read past the peer's RESUME. A RESUME that claims more than was sent
/// is a protocol violation: the connection closes and nothing changes.
fn resume(
    shared: &Shared,
    peer: &Peer,
    stream: &Link,
    mut buf: BytesMut,
    deadline: Instant,
) -> Result<BytesMut, LinkError> {
    let ours = Resume {
        next: peer.recv.lock().unwrap_or_else(|e| e.into_inner()).next(),
        base: peer.send.lock().unwrap_or_else(|e| e.into_inner()).base(),
    };
    let mut out = Vec::new();
    Frame::Resume(ours).encode(&mut out);
    stream.set_deadline(deadline)?;
    stream.write_all(&out)?;
    let theirs = loop {
        match frame::decode(&mut buf, HANDSHAKE_MAX_FRAME)? {
            Some(Frame::Resume(r)) => break r,
            // Refused after the handshake (e.g. our certificate does not name us).
            Some(Frame::Refuse(r)) => {
                return Err(HandshakeError::Refused {
                    peer: Some(peer.name.clone()),
                    code: r.code,
                    reason: r.reason,
                }
                .into());
            }
            Some(other) => return Err(LinkError::Unexpected(other.kind_name())),
            None => read_small(stream, &mut buf, deadline, shared.config.handshake_timeout)?,
        }
    };
    stream.clear_deadline()?;
    {
        let mut w = peer.send.lock().unwrap_or_else(|e| e.into_inner());
        let before = w.messages();
        w.rewind(theirs.next)?;
        let resent = w.messages();
        if before > 0 {
            peer.stats.resent.fetch_add(resent, Relaxed);
        }
    }
    peer.recv
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .resume(theirs.base);
    Ok(buf)
}

/// Wrap a fresh socket: plain, or after a TLS handshake (over by `deadline`) if this node
/// has TLS.
fn open_link(
    shared: &Shared,
    stream: TcpStream,
    expect: Option<&Name>,
    deadline: Instant,
) -> Result<Link, LinkError> {
    let Some(tls) = &shared.tls else {
        return Ok(Link::Plain(stream));
    };
    Link::tls(stream, tls, expect.map(|n| n.as_str()), deadline).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ) {
            return LinkError::HandshakeTimeout(shared.config.handshake_timeout);
        }
        LinkError::Tls(format!(
            "{e} (does the peer run TLS with a certificate from the same CA, naming the node?)"
        ))
    })
}

/// With TLS: the peer's certificate must name the node it claimed in the handshake. (A
/// dialler's rustls already checked the name it dialled; the acceptor checks here.) On a
/// mismatch both sides learn why: a REFUSE goes out before the connection closes.
fn check_certificate(shared: &Shared, link: &Link, info: &PeerInfo) -> Result<(), LinkError> {
    if !link.is_tls() {
        return Ok(());
    }
    let res = match link.peer_certificate() {
        Some(cert) => crate::io::tls::cert_names(&cert, info.name.as_str()),
        None => Err("the peer presented no certificate".to_string()),
    };
    res.map_err(|why| {
        let reason = format!(
            "node {:?} refuses {:?}: {why}",
            shared.name.as_str(),
            info.name.as_str()
        );
        let mut out = Vec::new();
        Frame::Refuse(frame::Refuse {
            code: frame::RefuseCode::Name,
            reason: reason.clone(),
        })
        .encode(&mut out);
        let _ = link.write_all(&out);
        LinkError::Certificate {
            peer: info.name.to_string(),
            reason,
        }
    })
}

/// Drive the sans-IO handshake over a blocking socket, finishing by `deadline`. Returns the
/// peer and any bytes read past the handshake (the peer may already have sent messages).
fn handshake(
    shared: &Shared,
    stream: &Link,
    expect: Option<Name>,
    deadline: Instant,
) -> Result<(PeerInfo, BytesMut), LinkError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let role = match expect {
        Some(expect) => Role::Dial { expect },
        None => Role::Accept {
            refuse: shared.dials.clone(),
        },
    };
    let mut hs = Handshake::new(
        HandshakeConfig {
            name: shared.name.clone(),
            incarnation: shared.incarnation,
            secret: shared.secret.clone(),
            role,
        },
        nonce,
    );
    let mut buf = BytesMut::with_capacity(HANDSHAKE_MAX_FRAME);
    let mut out = Vec::new();
    loop {
        // Send what the machine queued: HELLO first, then AUTH, or a REFUSE.
        while let Some(f) = hs.poll_transmit() {
            f.encode(&mut out);
        }
        if !out.is_empty() {
            stream.set_deadline(deadline)?;
            stream.write_all(&out)?;
            out.clear();
        }
        if let Some(peer) = hs.peer() {
            stream.clear_deadline()?;
            return Ok((peer, buf));
        }
        // Read until a whole frame is buffered.
        let frame = loop {
            // A TLS record (handshake 0x16 or alert 0x15, version 3.x) where a HELLO
            // should be: the peer runs TLS and this node does not.
            if !stream.is_tls() && buf.len() >= 2 && matches!(buf[0], 0x15 | 0x16) && buf[1] == 3 {
                return Err(LinkError::PeerSpeaksTls);
            }
            match frame::decode(&mut buf, HANDSHAKE_MAX_FRAME) {
                Ok(Some(f)) => break f,
                Ok(None) => {}
                Err(e) => {
                    // Not a batchwire peer, or a broken one: say so, best effort, and close.
                    let refuse = Frame::Refuse(frame::Refuse {
                        code: frame::RefuseCode::Protocol,
                        reason: format!(
                            "node {:?}: bad handshake frame: {e}",
                            shared.name.as_str()
                        ),
                    });
                    refuse.encode(&mut out);
                    let _ = stream.write_all(&out);
                    return Err(e.into());
                }
            }
            read_small(stream, &mut buf, deadline, shared.config.handshake_timeout)?;
        };
        // Feed it to the machine; on failure send its REFUSE (best effort) and give up.
        if let Err(e) = hs.handle(frame) {
            while let Some(f) = hs.poll_transmit() {
                f.encode(&mut out);
            }
            let _ = stream.write_all(&out);
            return Err(e.into());
        }
    }
}

/// One small read while the connection is being set up, with what is left of `deadline`
/// as its timeout: end of stream and running out of time are errors.
fn read_small(
    stream: &Link,
    buf: &mut BytesMut,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), LinkError> {
    let timed_out = LinkError::HandshakeTimeout(timeout);
    if stream.set_deadline(deadline).is_err() {
        return Err(timed_out);
    }
    match read_more(stream, buf, 512) {
        Ok(0) => Err(LinkError::Eof),
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(timed_out)
        }
        Err(e) => Err(e.into()),
    }
}

/// Read once into the spare room at the end of `buf`, making room for `want` bytes.
fn read_more(stream: &Link, buf: &mut BytesMut, want: usize) -> std::io::Result<usize> {
    let len = buf.len();
    buf.resize(len + want, 0);
    let r = stream.read(&mut buf[len..]);
    buf.truncate(len + *r.as_ref().unwrap_or(&0));
    r
}

/// Read frames and deliver them until the peer says goodbye (`Ok`) or something breaks.
fn read_loop(
    shared: &Arc<Shared>,
    peer: &Arc<Peer>,
    info: &PeerInfo,
    conn: &Conn,
    stream: &Link,
    mut buf: BytesMut,
) -> Result<(), LinkError> {
    let reliable = shared.config.reliable;
    let ack_every = shared.config.ack_every;
    let ack_bytes = shared.config.ack_every_bytes;
    // Bytes of messages received since this reader last acknowledged.
    let mut since_ack = 0usize;
    let max_frame = shared.config.max_frame();
    let read_bytes = shared.config.read_bytes;
    let mut d = Deliverer {
        shared,
        peer,
        from: info.name.clone(),
        cache: None,
    };
    loop {
        // Decode and handle every whole frame already buffered.
        while let Some(frame) = frame::decode(&mut buf, max_frame)? {
            peer.stats.frames_received.fetch_add(1, Relaxed);
            match frame {
                Frame::Messages(list) => {
                    // A connection that was replaced delivers nothing more: its successor
                    // resends from where the receive window stands.
                    if conn.is_closed() {
                        return Err(LinkError::Eof);
                    }
                    // Accept and deliver under the receive lock, so two readers of one
                    // peer (a dying connection's and its successor's) never interleave.
                    let mut rw = peer.recv.lock().unwrap_or_else(|e| e.into_inner());
                    let skip = rw.accept(list.first_seq, list.len() as u32)?;
                    if skip == 0 {
                        d.deliver(&list);
                    } else {
                        d.deliver(&list.skip(skip));
                    }
                    since_ack += list.body().len();
                    let due = if reliable && (rw.unacked() >= ack_every || since_ack >= ack_bytes) {
                        since_ack = 0;
                        rw.ack_due()
                    } else {
                        None
                    };
                    drop(rw);
                    if let Some(n) = due {
                        peer.lane.push_frame(peer.id, &Frame::Ack(n));
                    }
                }
                Frame::Ack(next) => {
                    // A replaced connection's late frames describe a stream that has moved on.
                    if conn.is_closed() {
                        return Err(LinkError::Eof);
                    }
                    let limit = shared.config.unacked_bytes;
                    let mut w = peer.send.lock().unwrap_or_else(|e| e.into_inner());
                    let (before, base) = (w.bytes(), w.base());
                    // An ack of messages never sent closes the connection (a violation).
                    w.ack(next)?;
                    let (after, acked) = (w.bytes(), w.base() - base);
                    drop(w);
                    peer.stats.acked.fetch_add(acked, Relaxed);
                    // Wake a writer that stopped taking because the window was full.
                    if before >= limit && after < limit {
                        peer.lane.poke();
                    }
                }
                Frame::Resume(_) => return Err(LinkError::Unexpected("RESUME")),
                Frame::Undeliverable(u) => {
                    peer.stats
                        .undeliverable_reported
                        .fetch_add(u.count as u64, Relaxed);
                    if u.to.is_empty() {
                        warn!(node = %shared.name, peer = %info.name, count = u.count, "peer reports messages undeliverable: no such mailbox (a summary over more mailbox names than it reports one by one)");
                    } else {
                        warn!(node = %shared.name, peer = %info.name, mailbox = %u.to, from = %u.from, count = u.count, "peer reports messages undeliverable: no such mailbox");
                    }
                    shared.emit(Event::Undeliverable {
                        to: Address {
                            node: info.name.clone(),
                            mailbox: u.to,
                        },
                        from: u.from.to_string(),
                        count: u.count as u64,
                    });
                }
                Frame::Goodbye => return Ok(()),
                Frame::Refuse(r) => {
                    return Err(HandshakeError::Refused {
                        peer: Some(info.name.clone()),
                        code: r.code,
                        reason: r.reason,
                    }
                    .into());
                }
                other @ (Frame::Hello(_) | Frame::Auth(_)) => {
                    return Err(LinkError::Unexpected(other.kind_name()));
                }
            }
        }
        // Then read at least `read_bytes` more in one call.
        let n = read_more(stream, &mut buf, read_bytes)?;
        if n == 0 {
            return Err(LinkError::Eof);
        }
        peer.last_read.store(shared.now_ms(), Relaxed);
        peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
    }
}

/// Hands the messages of one frame to their mailboxes, one run of consecutive messages
/// for the same mailbox at a time (one lock and at most one wake-up per run), and reports
/// the ones for mailboxes that do not exist.
struct Deliverer<'a> {
    shared: &'a Arc<Shared>,
    peer: &'a Arc<Peer>,
    from: Name,
    /// The last mailbox looked up, so a stream to one mailbox costs one lookup.
    cache: Option<Arc<MailboxQueue>>,
}

impl Deliverer<'_> {
    fn deliver(&mut self, list: &MessageList) {
        self.peer
            .stats
            .messages_received
            .fetch_add(list.len() as u64, Relaxed);
        for (to, range, count) in list.runs() {
            if self
                .cache
                .as_ref()
                .is_none_or(|mb| mb.name.as_bytes() != to)
            {
                self.cache = self.shared.mailbox(to);
            }
            let data = list.body().slice(range);
            let delivered = match &self.cache {
                // Waits while the mailbox is full: backpressure through TCP.
                Some(mb) => mb.push_run(&self.from, data.clone(), count),
                None => false,
            };
            if !delivered {
                // No such mailbox (or it was dropped meanwhile).
                self.cache = None;
                self.count_undeliverable(to, data);
            }
        }
    }

    /// Report a run of messages for mailbox `to`, which does not exist: once per stretch of
    /// consecutive messages from one sender (the node sums and bounds the notices).
    fn count_undeliverable(&mut self, to: &[u8], mut data: bytes::Bytes) {
        // Validated with the frame: UTF-8, at most 255 bytes.
        let to = Name::new(std::str::from_utf8(to).unwrap_or("")).unwrap_or(Name::from_static(""));
        let mut stretch: Option<(Name, u32)> = None;
        while let Some((from, _, _)) = frame::next_message(&mut data) {
            match &mut stretch {
                Some((f, n)) if *f == from => *n += 1,
                _ => {
                    if let Some((f, n)) = stretch.replace((from, 1)) {
                        self.shared.undeliverable(Some(self.peer), &to, &f, n);
                    }
                }
            }
        }
        if let Some((f, n)) = stretch {
            self.shared.undeliverable(Some(self.peer), &to, &f, n);
        }
    }
}
