//! The node's ticker: delayed acknowledgements, heartbeats on idle connections, and the
//! failure detector that declares silent peers down and hands their pending messages back.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tracing::warn;

use crate::io::node::{Address, Event, FailedMessage, Peer, PeerState, Shared};
use crate::io::writer::decode_frames;
use batchwire_core::frame::{Frame, Message};
use batchwire_core::outbox::Batch;

/// Run until the node's writers are done (so acknowledgements keep flowing while a
/// shutdown flushes).
pub(crate) fn run_ticker(shared: &Arc<Shared>) {
    let cfg = &shared.config;
    let tick = cfg
        .ack_delay
        .min(cfg.heartbeat_interval / 4)
        .min(Duration::from_millis(10))
        .max(Duration::from_millis(1));
    let hb = cfg.heartbeat_interval.as_millis() as u64;
    let timeout = cfg.peer_timeout.as_millis() as u64;
    while !shared.ticker_should_stop() {
        std::thread::sleep(tick);
        let now = shared.now_ms();
        for p in shared.all_peers() {
            let conn = p.current().filter(|c| !c.is_closed());
            if let Some(c) = &conn {
                // Undeliverable notices that found the lane full last time.
                p.flush_notices();
                // The receive window is locked while a reader delivers a frame, and a
                // reader can wait there for a full mailbox: never block on it here. A peer
                // we are not reading from because our own mailbox is full is not silent.
                let (due, next, delivering) = match p.recv.try_lock() {
                    Ok(mut rw) => {
                        let due = if cfg.reliable { rw.ack_due() } else { None };
                        (due, Some(rw.next()), false)
                    }
                    Err(_) => (None, None, true),
                };
                // Acknowledge what arrived since the last acknowledgement (the reader
                // acknowledges on its own every `ack_every` messages).
                if let Some(n) = due {
                    p.lane.push_frame(p.id, &Frame::Ack(n));
                }
                // Keep an idle connection visibly alive.
                if let Some(next) = next {
                    if now.saturating_sub(p.last_write.load(Relaxed)) >= hb {
                        p.last_write.store(now, Relaxed);
                        p.lane.push_frame(p.id, &Frame::Ack(next));
                    }
                }
                if !delivering
                    && p.state() == PeerState::Up
                    && now.saturating_sub(p.last_read.load(Relaxed)) > timeout
                    && !shared.is_shutting_down()
                {
                    let reason = format!("silent for more than {:?}", cfg.peer_timeout);
                    c.close();
                    declare_down(shared, &p, &reason);
                }
            } else if p.state() == PeerState::Up
                && now.saturating_sub(p.disconnected_at.load(Relaxed)) > timeout
                && !shared.is_shutting_down()
            {
                let reason = format!("unreachable for more than {:?}", cfg.peer_timeout);
                declare_down(shared, &p, &reason);
            }
        }
    }
}

/// Declare `peer` down: sends to it fail fast from now on, and everything pending for it
/// (unacknowledged, or still queued) is handed back to the application as failed.
pub(crate) fn declare_down(shared: &Shared, peer: &Arc<Peer>, reason: &str) {
    if peer.set_state(PeerState::Down) == PeerState::Down {
        return;
    }
    warn!(node = %shared.name, peer = %peer.name, reason, "peer declared down");
    shared.emit(Event::PeerDown {
        peer: peer.name.to_string(),
        reason: reason.to_string(),
    });
    fail_window(shared, peer, false, reason);
    if !shared.config.bundler.kind.shared_queue() {
        // Its own lane: what is queued there can only go to it. (With one lane for all
        // peers, the writer fails this peer's messages as it meets them.)
        let mut b = Batch::default();
        peer.lane.take_all(&mut b);
        let msgs = decode_frames(
            b.frames
                .iter()
                .filter(|f| f.messages > 0)
                .map(|f| &b.buf[f.start..f.end]),
        );
        report_failed(shared, peer, msgs, reason);
    }
}

/// Hand back everything held in `peer`'s send window. `restart`: the peer is a new
/// incarnation, so numbering starts again.
pub(crate) fn fail_window(shared: &Shared, peer: &Peer, restart: bool, reason: &str) {
    let msgs = peer
        .send
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_failed(restart);
    report_failed(shared, peer, msgs, reason);
}

/// Count, log and report messages that will never be delivered, with their payloads.
pub(crate) fn report_failed(shared: &Shared, peer: &Peer, msgs: Vec<Message>, reason: &str) {
    if msgs.is_empty() {
        return;
    }
    let count = msgs.len() as u64;
    peer.stats.send_failed.fetch_add(count, Relaxed);
    warn!(node = %shared.name, peer = %peer.name, messages = count, reason, "messages handed back as failed");
    let messages = msgs
        .into_iter()
        .map(|m| FailedMessage {
            to: Address {
                node: peer.name.clone(),
                mailbox: m.to,
            },
            from: m.from.to_string(),
            payload: m.payload,
        })
        .collect();
    shared.emit(Event::SendFailed {
        peer: peer.name.to_string(),
        count,
        reason: reason.to_string(),
        messages,
    });
}
