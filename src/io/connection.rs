//! The connection layer: the threads that move bytes between sockets and the sans-IO core.
//! Every step is commented, in the manner of mini-redis' `connection.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tracing::{debug, info, warn};

use crate::core::bundler::FlushReason;
use crate::core::codec::Name;
use crate::core::frame::{self, Frame, MessageList};
use crate::core::handshake::{Handshake, HandshakeConfig, HandshakeError, PeerInfo};
use crate::core::outbox::{ALL, Batch, Run};
use crate::error::LinkError;
use crate::io::mailbox::MailboxQueue;
use crate::io::node::{Address, Conn, Event, LaneMembers, Peer, Shared};
use crate::io::queue::{Lane, Next};
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
        cache: None,
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

/// Hands the messages of one frame to their mailboxes, one run of consecutive messages
/// for the same mailbox at a time (one lock and at most one wake-up per run), and reports
/// the ones for mailboxes that do not exist.
struct Deliverer<'a> {
    shared: &'a Arc<Shared>,
    peer: &'a Arc<Peer>,
    from: Name,
    /// The last mailbox looked up, so a stream to one mailbox costs one lookup.
    cache: Option<Arc<MailboxQueue>>,
    undeliverable: Vec<(Name, Name, u32)>,
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
        for (to, from, count) in self.undeliverable.drain(..) {
            self.shared
                .undeliverable(Some(self.peer), &to, &from, count);
        }
    }

    fn count_undeliverable(&mut self, to: &[u8], mut data: bytes::Bytes) {
        while let Some((from, _, _)) = frame::next_message(&mut data) {
            match self
                .undeliverable
                .iter_mut()
                .find(|(t, f, _)| t.as_bytes() == to && *f == from)
            {
                Some(e) => e.2 += 1,
                None => {
                    let to = Name::new(std::str::from_utf8(to).unwrap_or(""))
                        .unwrap_or(Name::from_static(""));
                    self.undeliverable.push((to, from, 1));
                }
            }
        }
    }
}

/// Bytes encoded for a peer that had no connection when they were taken from the lane.
struct Held {
    peer: Arc<Peer>,
    bytes: Vec<u8>,
    messages: u64,
    frames: u64,
}

/// The writer of one lane: for the node's lifetime, take batches as the bundler decides
/// and write each run of frames to its destination's current connection.
pub(crate) fn run_writer(shared: &Arc<Shared>, lane: &Arc<Lane>, members: LaneMembers) {
    let mut bundler = shared.config.bundler.build();
    let mut batch = Batch::default();
    let mut held: Vec<Held> = Vec::new();
    loop {
        // Read the epoch first: a connection installed after this moves it, and the wait
        // below then returns at once.
        let epoch = lane.epoch();
        // 1. Write what was held for peers that are connected now, oldest first.
        held.retain_mut(|h| !write_held(shared, h));
        // 2. At shutdown, give up on absent peers once the timeout has passed.
        if shared
            .shutdown_deadline()
            .is_some_and(|d| Instant::now() >= d)
        {
            for h in held.drain(..) {
                report_failed(
                    shared,
                    &h.peer.name.to_string(),
                    &h.peer,
                    h.messages,
                    "node shut down before the peer was reachable",
                );
            }
            fail_queued(shared, lane, &mut batch);
            goodbye(shared, members);
            return;
        }
        // 3. Too much held for absent peers: take nothing more until a connection changes
        //    (the lane fills up and its senders block: backpressure, not loss).
        if held.iter().map(|h| h.bytes.len()).sum::<usize>() >= lane.capacity {
            lane.wait_epoch(epoch, Duration::from_millis(50));
            continue;
        }
        // 4. Wait for the bundler's go, then write the batch.
        match lane.next_batch(bundler.as_mut(), epoch, &mut batch) {
            Next::Reconnect => {}
            Next::Drained => {
                if held.is_empty() {
                    goodbye(shared, members);
                    return;
                }
                lane.wait_epoch(epoch, Duration::from_millis(20));
            }
            Next::Batch(reason) => {
                for run in batch.runs() {
                    let bytes = &batch.buf[run.range.clone()];
                    if run.dest == ALL {
                        for p in shared.all_peers() {
                            write_run(shared, &p, bytes, &run, reason, &mut held);
                        }
                    } else if let Some(p) = shared.peer_by_id(run.dest) {
                        write_run(shared, &p, bytes, &run, reason, &mut held);
                    }
                }
            }
        }
    }
}

/// Write one run to `peer` with one call, or hold it if the peer is not connected (or
/// already has held data, which must go first).
fn write_run(
    shared: &Shared,
    peer: &Arc<Peer>,
    bytes: &[u8],
    run: &Run,
    reason: FlushReason,
    held: &mut Vec<Held>,
) {
    if let Some(h) = held.iter_mut().find(|h| Arc::ptr_eq(&h.peer, peer)) {
        h.bytes.extend_from_slice(bytes);
        h.messages += run.messages;
        h.frames += run.frames;
        return;
    }
    let conn = peer.current().filter(|c| !c.is_closed());
    let Some(conn) = conn else {
        held.push(Held {
            peer: peer.clone(),
            bytes: bytes.to_vec(),
            messages: run.messages,
            frames: run.frames,
        });
        return;
    };
    if write_counted(shared, peer, &conn, bytes, run.messages, run.frames) {
        let s = &peer.stats;
        s.flushes[reason_index(reason)].fetch_add(1, Relaxed);
    }
}

/// Try to write held bytes; true if they are gone (written, or reported failed).
fn write_held(shared: &Shared, h: &mut Held) -> bool {
    let Some(conn) = h.peer.current().filter(|c| !c.is_closed()) else {
        return false;
    };
    write_counted(shared, &h.peer, &conn, &h.bytes, h.messages, h.frames);
    true
}

/// One write call; counts it, or reports its messages failed and closes the connection.
fn write_counted(
    shared: &Shared,
    peer: &Peer,
    conn: &Conn,
    bytes: &[u8],
    messages: u64,
    frames: u64,
) -> bool {
    match (&conn.stream).write_all(bytes) {
        Ok(()) => {
            let s = &peer.stats;
            s.messages_sent.fetch_add(messages, Relaxed);
            s.bytes_sent.fetch_add(bytes.len() as u64, Relaxed);
            s.frames_sent.fetch_add(frames, Relaxed);
            if messages > 0 {
                s.record_write(messages);
            }
            true
        }
        Err(e) => {
            if !conn.is_closed() {
                warn!(node = %shared.name, peer = %peer.name, error = %e, messages, "write failed; connection closed");
            }
            conn.close();
            report_failed(
                shared,
                &peer.name.to_string(),
                peer,
                messages,
                &e.to_string(),
            );
            false
        }
    }
}

fn report_failed(shared: &Shared, name: &str, peer: &Peer, count: u64, reason: &str) {
    if count == 0 {
        return;
    }
    peer.stats.send_failed.fetch_add(count, Relaxed);
    warn!(node = %shared.name, peer = name, messages = count, reason, "messages not sent");
    shared.emit(Event::SendFailed {
        peer: name.to_string(),
        count,
        reason: reason.to_string(),
    });
}

/// At shutdown: report everything still queued in the lane as failed.
fn fail_queued(shared: &Shared, lane: &Lane, batch: &mut Batch) {
    lane.take_all(batch);
    for run in batch.runs() {
        let targets = if run.dest == ALL {
            shared.all_peers()
        } else {
            shared.peer_by_id(run.dest).into_iter().collect()
        };
        for p in targets {
            report_failed(
                shared,
                &p.name.to_string(),
                &p,
                run.messages,
                "node shut down before the peer was reachable",
            );
        }
    }
}

/// Tell the lane's connected peers that nothing more comes, and stop sending.
fn goodbye(shared: &Shared, members: LaneMembers) {
    let targets = match members {
        LaneMembers::One(id) => shared.peer_by_id(id).into_iter().collect(),
        LaneMembers::All => shared.all_peers(),
    };
    let mut out = Vec::new();
    Frame::Goodbye.encode(&mut out);
    for p in targets {
        if let Some(c) = p.current() {
            let _ = (&c.stream).write_all(&out);
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
    }
}
