//! The writer of a lane: takes batches from the lane's outbox as the bundler decides and
//! writes each destination's frames to its current connection, through the peer's send
//! window (which numbers them and keeps them until acknowledged) when `reliable` is on.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tracing::{debug, warn};

use crate::io::detector::{fail_window, report_failed};
use crate::io::node::{Conn, LaneMembers, Peer, PeerState, Shared};
use crate::io::queue::{Lane, Next};
use crate::stats::reason_index;
use batchwire_core::bundler::FlushReason;
use batchwire_core::frame::{self, Frame, Message, set_first_seq};
use batchwire_core::outbox::{self, ALL, Batch, FrameMeta};

/// The peers a lane serves, now.
fn members(shared: &Shared, m: LaneMembers) -> Vec<Arc<Peer>> {
    match m {
        LaneMembers::One(id) => shared.peer_by_id(id).into_iter().collect(),
        LaneMembers::All => shared.all_peers(),
    }
}

/// For the node's lifetime: wait for the bundler's go, take a batch, write it.
pub(crate) fn run_writer(shared: &Arc<Shared>, lane: &Arc<Lane>, m: LaneMembers) {
    let mut bundler = shared.config.bundler.build();
    let mut batch = Batch::default();
    let reliable = shared.config.reliable;
    loop {
        // Read the epoch first: a connection installed (or an acknowledgement that makes
        // room) after this moves it, and the waits below return at once.
        let epoch = lane.epoch();
        let peers = members(shared, m);
        // 1. Give every connected peer what its connection has not had yet: after a
        //    reconnect, everything unacknowledged, oldest first.
        for p in &peers {
            flush_window(shared, p);
        }
        // 2. At shutdown, give up once the timeout has passed.
        if shared
            .shutdown_deadline()
            .is_some_and(|d| Instant::now() >= d)
        {
            for p in &peers {
                fail_window(
                    shared,
                    p,
                    false,
                    "node shut down before the peer acknowledged",
                );
            }
            fail_queued(shared, lane, &mut batch);
            goodbye(&peers);
            return;
        }
        // 3. A full send window: take nothing more until acknowledgements make room (the
        //    lane fills up and its senders block: backpressure, not loss).
        let limit = shared.config.unacked_bytes;
        if peers
            .iter()
            .any(|p| p.send.lock().unwrap_or_else(|e| e.into_inner()).bytes() >= limit)
        {
            lane.wait_epoch(epoch, Duration::from_millis(20));
            continue;
        }
        // 4. Wait for the bundler's go, then write the batch.
        match lane.next_batch(bundler.as_mut(), epoch, &mut batch) {
            Next::Reconnect => {}
            Next::Drained => {
                // Shutting down and the lane is empty: done once every peer has
                // acknowledged everything (or is gone).
                let pending = reliable
                    && peers.iter().any(|p| {
                        p.state() != PeerState::Down
                            && p.send.lock().unwrap_or_else(|e| e.into_inner()).messages() > 0
                    });
                if !pending {
                    goodbye(&peers);
                    return;
                }
                lane.wait_epoch(epoch, Duration::from_millis(5));
            }
            Next::Batch(reason) => write_batch(shared, &mut batch, reason),
        }
    }
}

/// Write every group of consecutive frames with one destination to that destination (all
/// peers for the null destination).
fn write_batch(shared: &Shared, batch: &mut Batch, reason: FlushReason) {
    let Batch { buf, frames } = batch;
    for group in outbox::groups(frames) {
        let dest = group[0].dest;
        if dest == ALL {
            for p in shared.all_peers() {
                send_group(shared, &p, buf, group, reason);
            }
        } else if let Some(p) = shared.peer_by_id(dest) {
            send_group(shared, &p, buf, group, reason);
        }
    }
}

fn send_group(
    shared: &Shared,
    peer: &Arc<Peer>,
    buf: &mut [u8],
    group: &[FrameMeta],
    reason: FlushReason,
) {
    let data: Vec<&FrameMeta> = group.iter().filter(|f| f.messages > 0).collect();
    if peer.state() == PeerState::Down {
        let msgs = decode_frames(data.iter().map(|f| &buf[f.start..f.end]));
        report_failed(shared, peer, msgs, "the peer is down");
        return;
    }
    let conn = peer.current().filter(|c| !c.is_closed());
    // Control frames (acknowledgements, undeliverable notices) concern this connection
    // only: written directly, never held or resent.
    if let Some(c) = &conn {
        for f in group.iter().filter(|f| f.messages == 0) {
            if let Err(e) = c.link.write_all(&buf[f.start..f.end]) {
                debug!(node = %shared.name, peer = %peer.name, error = %e, "control frame not written");
                c.close();
            }
        }
    }
    if data.is_empty() {
        return;
    }
    let messages: u64 = data.iter().map(|f| f.messages as u64).sum();
    peer.stats.flushes[reason_index(reason)].fetch_add(1, Relaxed);
    if shared.config.reliable {
        // Hold (numbered, until acknowledged), then write what the connection lacks.
        let frames: Vec<(&[u8], u32)> = data
            .iter()
            .map(|f| (&buf[f.start..f.end], f.messages))
            .collect();
        let (chunks, generation) = {
            let mut w = peer.send.lock().unwrap_or_else(|e| e.into_inner());
            w.hold(&frames);
            w.unwritten()
        };
        peer.stats.messages_sent.fetch_add(messages, Relaxed);
        if let Some(c) = conn {
            write_chunks(shared, peer, &c, &chunks, generation, messages);
        }
        return;
    }
    // Unsequenced baseline: number the frames in place and write them; nothing is kept.
    {
        let mut w = peer.send.lock().unwrap_or_else(|e| e.into_inner());
        for f in &data {
            set_first_seq(&mut buf[f.start..f.end], w.next_seq());
            w.skip(f.messages as u64);
        }
    }
    let Some(c) = conn else {
        let msgs = decode_frames(data.iter().map(|f| &buf[f.start..f.end]));
        report_failed(
            shared,
            peer,
            msgs,
            "no connection (reliable delivery is off)",
        );
        return;
    };
    peer.stats.messages_sent.fetch_add(messages, Relaxed);
    let slices: Vec<&[u8]> = data.iter().map(|f| &buf[f.start..f.end]).collect();
    match c.link.write_all_vectored(&slices) {
        Ok(bytes) => count_write(shared, peer, bytes, messages, data.len() as u64),
        Err(e) => {
            warn!(node = %shared.name, peer = %peer.name, error = %e, messages, "write failed; connection closed (reliable delivery is off: these may be lost)");
            c.close();
        }
    }
}

/// Write the chunks the current connection lacks (one vectored write), and record it.
fn write_chunks(
    shared: &Shared,
    peer: &Peer,
    conn: &Conn,
    chunks: &[Bytes],
    generation: u64,
    messages: u64,
) {
    if chunks.is_empty() {
        return;
    }
    let slices: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
    match conn.link.write_all_vectored(&slices) {
        Ok(bytes) => {
            peer.send
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .mark_written(generation, chunks.len());
            count_write(shared, peer, bytes, messages, chunks.len() as u64);
        }
        Err(e) => {
            // Nothing is lost: the chunks stay held and go out again on the next
            // connection, where the receiver skips whatever had arrived.
            if !conn.is_closed() {
                warn!(node = %shared.name, peer = %peer.name, error = %e, "write failed; connection closed, will resend on reconnect");
            }
            conn.close();
        }
    }
}

fn count_write(shared: &Shared, peer: &Peer, bytes: usize, messages: u64, frames: u64) {
    let s = &peer.stats;
    s.bytes_sent.fetch_add(bytes as u64, Relaxed);
    s.frames_sent.fetch_add(frames, Relaxed);
    s.record_write(messages);
    peer.last_write.store(shared.now_ms(), Relaxed);
}

/// Give a connected peer everything its connection has not had (after a reconnect, or
/// what was held while it was away).
fn flush_window(shared: &Shared, peer: &Arc<Peer>) {
    let Some(conn) = peer.current().filter(|c| !c.is_closed()) else {
        return;
    };
    let (chunks, generation) = {
        let w = peer.send.lock().unwrap_or_else(|e| e.into_inner());
        if !w.has_unwritten() {
            return;
        }
        w.unwritten()
    };
    write_chunks(shared, peer, &conn, &chunks, generation, 0);
}

/// The messages of encoded MESSAGES frames (for failure reports).
pub(crate) fn decode_frames<'a>(frames: impl Iterator<Item = &'a [u8]>) -> Vec<Message> {
    let mut out = Vec::new();
    for f in frames {
        let mut b = BytesMut::from(f);
        if let Ok(Some(Frame::Messages(l))) = frame::decode(&mut b, usize::MAX) {
            out.extend(l.iter());
        }
    }
    out
}

/// At shutdown: report everything still queued in the lane as failed.
fn fail_queued(shared: &Shared, lane: &Lane, batch: &mut Batch) {
    lane.take_all(batch);
    let frames = std::mem::take(&mut batch.frames);
    for f in frames.iter().filter(|f| f.messages > 0) {
        let targets = if f.dest == ALL {
            shared.all_peers()
        } else {
            shared.peer_by_id(f.dest).into_iter().collect()
        };
        for p in targets {
            let msgs = decode_frames(std::iter::once(&batch.buf[f.start..f.end]));
            report_failed(
                shared,
                &p,
                msgs,
                "node shut down before the peer was reachable",
            );
        }
    }
}

/// The receive window's next sequence number, if its lock can be had within `d`.
fn recv_next_within(p: &Peer, d: Duration) -> Option<u64> {
    let deadline = Instant::now() + d;
    loop {
        if let Ok(rw) = p.recv.try_lock() {
            return Some(rw.next());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Tell the connected peers that nothing more comes, and stop sending. A final
/// acknowledgement goes first, so the peer does not hand back as failed what we received.
fn goodbye(peers: &[Arc<Peer>]) {
    let mut out = Vec::new();
    for p in peers {
        if let Some(c) = p.current() {
            out.clear();
            // Never wait long for the receive lock here: a reader may hold it while it
            // waits for room in a mailbox that nobody reads any more.
            if let Some(next) = recv_next_within(p, Duration::from_millis(50)) {
                Frame::Ack(next).encode(&mut out);
            }
            Frame::Goodbye.encode(&mut out);
            let _ = c.link.write_all(&out);
            let _ = c.link.shutdown(std::net::Shutdown::Write);
        }
    }
}
