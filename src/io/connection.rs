//! The connection layer: the threads that move bytes between sockets and the sans-IO core.
//! Every step is commented, in the manner of mini-redis' `connection.rs`.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tracing::{debug, info, warn};

use crate::core::codec::Name;
use crate::core::frame::{self, Frame, ListWriter, MessageList};
use crate::core::handshake::{Handshake, HandshakeConfig, HandshakeError, PeerInfo};
use crate::error::LinkError;
use crate::io::mailbox::{Envelope, MailboxQueue};
use crate::io::node::{Address, Conn, Event, Peer, Shared};
use crate::io::queue::{Next, Outgoing};
use crate::stats::reason_index;

/// Handshake frames are small; anything bigger than this before authentication is refused.
const HANDSHAKE_MAX_FRAME: usize = 4096;

/// Accept connections until the node shuts down; each gets a thread of its own.
pub(crate) fn run_acceptor(shared: &Arc<Shared>, listener: TcpListener) {
    for stream in listener.incoming() {
        // `shutdown` wakes us with a connection of its own; the flag says to stop.
        if shared.is_shutting_down() {
            break;
        }
        match stream {
            Ok(s) => {
                let name = format!("bw-in-{}", shared.name);
                shared.spawn(name, move |sh| {
                    run_connection(&sh, s, None);
                });
            }
            Err(e) => {
                // Typically EMFILE; back off a little rather than spin.
                warn!(node = %shared.name, error = %e, "accept failed");
                if !shared.sleep(Duration::from_millis(50)) {
                    break;
                }
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
    while !shared.is_shutting_down() {
        match TcpStream::connect_timeout(&addr, cfg.handshake_timeout) {
            Ok(s) => {
                // A completed handshake resets the back-off.
                if run_connection(shared, s, Some(peer.name.clone())) {
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
/// name when we dialled. Returns whether the handshake succeeded.
pub(crate) fn run_connection(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    expect: Option<Name>,
) -> bool {
    let addr = match stream.peer_addr() {
        Ok(a) => a,
        Err(_) => return false, // already gone
    };
    // Small messages must not wait for Nagle: batching is the bundler's job.
    let _ = stream.set_nodelay(true);

    // 1. Authenticate (both sides prove the cluster secret; see core::handshake).
    let (info, leftover) = match handshake(shared, &mut stream, expect) {
        Ok(x) => x,
        Err(e) => {
            if !shared.is_shutting_down() {
                let peer = match &e {
                    LinkError::Handshake(h) => handshake_peer(h),
                    _ => None,
                };
                warn!(node = %shared.name, %addr, peer = ?peer, error = %e, "handshake failed; connection closed");
                shared.emit(Event::HandshakeFailed {
                    addr,
                    peer,
                    reason: e.to_string(),
                });
            }
            return false;
        }
    };

    // 2. Find the peer's state and make this its current connection; its writer picks it up.
    let peer = shared.peer_or_insert(&info.name);
    let write_half = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            warn!(node = %shared.name, peer = %info.name, error = %e, "cannot clone socket");
            return true;
        }
    };
    let conn = Arc::new(Conn::new(write_half));
    peer.install(conn.clone());
    peer.stats.connects.fetch_add(1, Relaxed);
    info!(node = %shared.name, peer = %info.name, %addr, "connected");
    shared.emit(Event::PeerUp {
        peer: info.name.to_string(),
        incarnation: info.incarnation,
        addr,
    });

    // 3. Read frames until the connection ends one way or another.
    let result = read_loop(shared, &peer, &info, &mut stream, leftover);

    // 4. Tear down: close both halves (the writer notices) and forget the connection.
    conn.close();
    peer.uninstall(&conn);
    let reason = match &result {
        Ok(()) => "peer shut down".to_string(),
        Err(e) => e.to_string(),
    };
    if shared.is_shutting_down() {
        debug!(node = %shared.name, peer = %info.name, reason, "connection closed during shutdown");
    } else if result.is_ok() {
        info!(node = %shared.name, peer = %info.name, "peer said goodbye");
    } else {
        warn!(node = %shared.name, peer = %info.name, %addr, reason, "connection lost");
    }
    shared.emit(Event::PeerDown {
        peer: info.name.to_string(),
        reason,
    });
    true
}

fn handshake_peer(e: &HandshakeError) -> Option<String> {
    match e {
        HandshakeError::Version { peer, .. } | HandshakeError::Secret { peer } => {
            Some(peer.to_string())
        }
        HandshakeError::WrongPeer { got, .. } => Some(got.to_string()),
        HandshakeError::SameName(p) => Some(p.to_string()),
        HandshakeError::Refused { peer, .. } => peer.as_ref().map(|p| p.to_string()),
        HandshakeError::Unexpected { .. } => None,
    }
}

/// Drive the sans-IO handshake over a blocking socket, with a deadline. Returns the peer and
/// any bytes read past the handshake (the peer may already have sent messages).
fn handshake(
    shared: &Shared,
    stream: &mut TcpStream,
    expect: Option<Name>,
) -> Result<(PeerInfo, BytesMut), LinkError> {
    let timeout = shared.config.handshake_timeout;
    let deadline = Instant::now() + timeout;
    stream.set_read_timeout(Some(timeout))?;
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut hs = Handshake::new(
        HandshakeConfig {
            name: shared.name.clone(),
            incarnation: shared.incarnation,
            secret: shared.secret.clone(),
            expect_peer: expect,
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
            stream.write_all(&out)?;
            out.clear();
        }
        if let Some(peer) = hs.peer() {
            stream.set_read_timeout(None)?;
            return Ok((peer, buf));
        }
        // Read until a whole frame is buffered.
        let frame = loop {
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
            if Instant::now() >= deadline {
                return Err(LinkError::HandshakeTimeout(timeout));
            }
            match read_more(stream, &mut buf, 512) {
                Ok(0) => return Err(LinkError::Eof),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(LinkError::HandshakeTimeout(timeout));
                }
                Err(e) => return Err(e.into()),
            }
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

/// Read once into the spare room at the end of `buf`, making room for `want` bytes.
fn read_more(stream: &mut TcpStream, buf: &mut BytesMut, want: usize) -> std::io::Result<usize> {
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
    stream: &mut TcpStream,
    mut buf: BytesMut,
) -> Result<(), LinkError> {
    let max_frame = shared.config.max_frame();
    let read_bytes = shared.config.read_bytes;
    let mut d = Deliverer {
        shared,
        peer,
        from: info.name.clone(),
        batch: Vec::new(),
        undeliverable: Vec::new(),
    };
    loop {
        // Decode and handle every whole frame already buffered.
        while let Some(frame) = frame::decode(&mut buf, max_frame)? {
            peer.stats.frames_received.fetch_add(1, Relaxed);
            match frame {
                Frame::Messages(list) => d.deliver(&list),
                Frame::Undeliverable(u) => {
                    peer.stats
                        .undeliverable_reported
                        .fetch_add(u.count as u64, Relaxed);
                    warn!(node = %shared.name, peer = %info.name, mailbox = %u.to, from = %u.from, count = u.count, "peer reports messages undeliverable: no such mailbox");
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
        peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
    }
}

/// Hands the messages of one frame to their mailboxes, one batch per run of messages for
/// the same mailbox, and reports the ones for mailboxes that do not exist.
struct Deliverer<'a> {
    shared: &'a Arc<Shared>,
    peer: &'a Arc<Peer>,
    from: Name,
    batch: Vec<Envelope>,
    undeliverable: Vec<(Name, Name, u32)>,
}

impl Deliverer<'_> {
    fn deliver(&mut self, list: &MessageList) {
        self.peer
            .stats
            .messages_received
            .fetch_add(list.len() as u64, Relaxed);
        let mut current: Option<(Name, Option<Arc<MailboxQueue>>)> = None;
        for m in list.iter() {
            // Look the mailbox up once per run of messages to the same mailbox.
            if current.as_ref().is_none_or(|(n, _)| *n != m.to) {
                if let Some((_, Some(mb))) = current.take() {
                    self.flush(&mb);
                }
                let mb = self.shared.mailbox(m.to.as_bytes());
                current = Some((m.to.clone(), mb));
            }
            match &current {
                Some((_, Some(_))) => self.batch.push(Envelope {
                    from: Address {
                        node: self.from.clone(),
                        mailbox: m.from,
                    },
                    payload: m.payload,
                }),
                _ => self.count_undeliverable(m.to, m.from, 1),
            }
        }
        if let Some((_, Some(mb))) = current {
            self.flush(&mb);
        }
        for (to, from, count) in self.undeliverable.drain(..) {
            self.shared
                .undeliverable(Some(self.peer), &to, &from, count);
        }
    }

    /// Push the batch to its mailbox; waits while the mailbox is full (backpressure).
    fn flush(&mut self, mb: &Arc<MailboxQueue>) {
        mb.push_batch(&mut self.batch, true);
        // Left over only if the mailbox was closed (dropped) meanwhile.
        for e in std::mem::take(&mut self.batch) {
            self.count_undeliverable(mb.name.clone(), e.from.mailbox, 1);
        }
    }

    fn count_undeliverable(&mut self, to: Name, from: Name, n: u32) {
        match self
            .undeliverable
            .iter_mut()
            .find(|(t, f, _)| *t == to && *f == from)
        {
            Some(e) => e.2 += n,
            None => self.undeliverable.push((to, from, n)),
        }
    }
}

/// Encode `items` as MESSAGES frames of about `frame_bytes` each, appending to `out`.
/// Returns the number of frames.
pub(crate) fn encode_batch(
    items: &VecDeque<Outgoing>,
    out: &mut Vec<u8>,
    frame_bytes: usize,
) -> u64 {
    let mut frames = 0;
    let mut w = ListWriter::start(out);
    for m in items {
        if !w.is_empty() && w.len(out) + m.cost() > frame_bytes {
            w.finish(out);
            frames += 1;
            w = ListWriter::start(out);
        }
        w.push(out, &m.to, &m.from, &m.payload);
    }
    if w.is_empty() {
        // Remove the header of the empty frame again.
        let keep = out.len() - frame::LIST_OVERHEAD;
        out.truncate(keep);
    } else {
        w.finish(out);
        frames += 1;
    }
    frames
}

/// The writer of one peer: for the node's lifetime, drain the peer's queue into its
/// current connection as the bundler decides.
pub(crate) fn run_writer(shared: &Arc<Shared>, peer: &Arc<Peer>) {
    let mut bundler = shared.config.bundler.build();
    let frame_bytes = shared.config.frame_bytes;
    let mut items = VecDeque::new();
    let mut control = Vec::new();
    let mut out: Vec<u8> = Vec::with_capacity(frame_bytes * 2);
    loop {
        // 1. Wait for a connection. Read the epoch first: a connection installed after
        //    this point moves the epoch, and the batch loop below then starts over.
        let epoch = peer.queue.link_epoch();
        let conn = match peer.current() {
            Some(c) => c,
            None => {
                if let Some(deadline) = shared.shutdown_deadline() {
                    if peer.queue.len() == 0 || Instant::now() >= deadline {
                        fail_all(shared, peer, "node shut down before the peer was reachable");
                        return;
                    }
                }
                peer.wait_link(Duration::from_millis(50));
                continue;
            }
        };
        // 2. Write batches until the connection changes or the queue is drained for good.
        loop {
            match peer
                .queue
                .next_batch(bundler.as_mut(), epoch, &mut items, &mut control)
            {
                Next::Reconnect => break,
                Next::Drained => {
                    // Shutting down and everything is written: say goodbye, stop sending.
                    Frame::Goodbye.encode(&mut out);
                    let _ = (&conn.stream).write_all(&out);
                    let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                    return;
                }
                Next::Batch(reason) => {
                    if conn.is_closed() {
                        // Nothing of this batch was written: put it back for the next
                        // connection. (Control notices are for this connection only.)
                        peer.queue.unshift(&mut items);
                        control.clear();
                        break;
                    }
                    for f in control.drain(..) {
                        f.encode(&mut out);
                    }
                    let frames = encode_batch(&items, &mut out, frame_bytes);
                    // One write call for the whole batch.
                    if let Err(e) = (&conn.stream).write_all(&out) {
                        let n = items.len() as u64;
                        peer.stats.send_failed.fetch_add(n, Relaxed);
                        if !conn.is_closed() {
                            warn!(node = %shared.name, peer = %peer.name, error = %e, messages = n, "write failed; connection closed");
                        }
                        if n > 0 {
                            shared.emit(Event::SendFailed {
                                peer: peer.name.to_string(),
                                count: n,
                                reason: e.to_string(),
                            });
                        }
                        conn.close();
                        items.clear();
                        out.clear();
                        break;
                    }
                    let s = &peer.stats;
                    s.messages_sent.fetch_add(items.len() as u64, Relaxed);
                    s.bytes_sent.fetch_add(out.len() as u64, Relaxed);
                    s.frames_sent.fetch_add(frames, Relaxed);
                    if !items.is_empty() {
                        s.writes.fetch_add(1, Relaxed);
                        s.flushes[reason_index(reason)].fetch_add(1, Relaxed);
                    }
                    items.clear();
                    out.clear();
                }
            }
        }
    }
}

/// Report everything still queued for `peer` as failed (shutdown with the peer away).
fn fail_all(shared: &Shared, peer: &Peer, reason: &str) {
    let left = peer.queue.take_all();
    if left.is_empty() {
        return;
    }
    let n = left.len() as u64;
    peer.stats.send_failed.fetch_add(n, Relaxed);
    warn!(node = %shared.name, peer = %peer.name, messages = n, reason, "messages not sent");
    shared.emit(Event::SendFailed {
        peer: peer.name.to_string(),
        count: n,
        reason: reason.to_string(),
    });
}
