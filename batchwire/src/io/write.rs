//! A peer's writer thread, which writes to the peer's connections; and write-through, by
//! which a sender writes a lone message itself when the writer is parked (see
//! [`write_through`]). Whoever writes holds the peer's write turn.
//!
//! Each round it writes, in one vectored write, **control first** (the acknowledgement or
//! heartbeat the session says is due, undeliverable notices, credit: a SYNC and grants)
//! and then what the send window holds that this connection has not had yet. Then it takes
//! the next **ordinary** batch from the lane as the bundler decides, unless the window is
//! full, and then numbers **pieces** of bulk messages while the session has bulk room (the
//! lane caps the ordinary batch while a piece waits: see `batchwire_core::bulk`). So a full
//! window stops data, never control; bulk never holds up more than `bulk_inflight` bytes
//! of ordinary messages, nor they bulk; and nothing waits behind another peer, which has
//! its own writer.
//!
//! It sleeps on its lane, which anyone who has something for it pokes: a control frame
//! became due, the window opened, the connection changed, the node is shutting down. A
//! write that blocks (the peer is not reading) returns every `write_check` so the writer
//! can look up; whether the peer is still alive is the failure detector's call.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::bundler::{BundlerConfig, FlushReason};
use batchwire_core::frame::Message;
use batchwire_core::outbox::Batch;
use batchwire_core::session::{FailReason, PeerState, PieceRefused};
use bytes::Bytes;
use tracing::debug;

use crate::io::conn::Conn;
use crate::io::lane::{Next, decode_frames};
use crate::io::peer::Peer;
use crate::io::shutdown::Shutdown;

/// What a writer needs besides its peer.
pub(crate) struct WriterCfg {
    /// The bundler that drains the peer's own lane; `None` with transfer-queue (the
    /// bundler thread fills the window from the shared lane).
    pub bundler: Option<BundlerConfig>,
    /// Transfer-queue: set once the shared lane is drained at shutdown.
    pub shared_done: Option<Arc<AtomicBool>>,
    /// Connections on demand: close one that carried no message either way for this long
    /// with nothing pending (see `peer::demand`).
    pub idle_close: Option<Duration>,
    /// How long a writer with nothing to write waits before it ends (`thread_linger`).
    pub linger: Duration,
}

/// How long an idle writer sleeps before looking up anyway (it is woken for everything
/// it has to do; this only bounds the wait).
const IDLE: Duration = Duration::from_secs(60);
/// After the shutdown deadline, how long a write to a peer that does not read may go on.
const GRACE: Duration = Duration::from_secs(1);

/// While the peer has a connection or something queued (see `peer::demand`): write what
/// is due, take more, sleep until poked.
///
/// **Resting**: on a connection (plain TCP or TLS, on Unix) that is not closed for
/// idleness (static peers, the mesh), a writer that found nothing to write for
/// `cfg.linger` ends, connection or not: an idle peer costs no writer thread. Its heartbeats and delayed acknowledgements
/// are written by the ticker that makes them due (without waiting, see `tick.rs`), and
/// any poke of the lane starts a writer again (`Lane::set_on_poke`), as does a send.
pub(crate) fn run_writer(peer: Arc<Peer>, cfg: WriterCfg, shutdown: Shutdown) {
    // A writer runs: senders no longer write lone messages through as to an absent one
    // (see `Lane::push_direct`). Said absent again as it ends (`Peer::writer_may_end`,
    // before its running flag goes down).
    peer.lane.set_writer_absent(false);
    writer_loop(peer, cfg, shutdown);
}

fn writer_loop(peer: Arc<Peer>, cfg: WriterCfg, shutdown: Shutdown) {
    let mut bundler = cfg.bundler.as_ref().map(|b| b.build());
    let mut batch = Batch::default();
    let mut control = Vec::new();
    let mut closing = false;
    let mut idle = Idle::default();
    loop {
        // Removed from the registry with nothing to send: done.
        if peer.is_removed() {
            peer.writer_may_end(|| false);
            return;
        }
        // Read the epoch first: a poke after this makes the waits below return at once.
        let epoch = peer.lane.epoch();
        let conn = peer.current().filter(|c| !c.is_closed());
        // No connection and nothing to take: end (started again with the next connection
        // or message).
        let has_work =
            || peer.is_connected() || peer.lane.queued() > 0 || shutdown.deadline().is_some();
        if conn.is_none() && !has_work() && peer.writer_may_end(has_work) {
            return;
        }
        if let Some(c) = &conn {
            let _turn = peer.write_turn();
            write_pending(&peer, c, Some(&shutdown), &mut control, Mode::Wait);
            if let Some(after) = cfg.idle_close
                && shutdown.deadline().is_none()
                && idle.is_over(&peer, after)
            {
                c.close_idle();
                debug!(peer = %peer.name, idle_ms = after.as_millis() as u64, "no message either way: connection closed (the session stays)");
            }
        }
        if let Some(deadline) = shutdown.deadline() {
            if !closing {
                peer.session(|s, _| s.begin_close(deadline));
                closing = true;
            }
            let done = {
                let _turn = peer.write_turn();
                close_step(&peer, conn.as_deref(), &cfg, deadline)
            };
            if done {
                return;
            }
            // Still flushing: with nothing to take, wait for acknowledgements (a poke),
            // a reconnect, or the deadline.
            if bundler.is_none() || peer.lane.is_empty() || peer.window_full() {
                if !move_pieces(&peer) {
                    wait(&peer, epoch, Some(deadline), None);
                }
                continue;
            }
        }
        // May this writer rest once nothing comes for a while (see above)? With connections
        // closed for idleness it stays, and looks at the idle time at least that often (the
        // ticker writes the heartbeats that used to wake it).
        let rests = conn
            .as_ref()
            .is_some_and(|c| cfg.idle_close.is_none() && c.link.writes_without_waiting());
        let linger = match cfg.idle_close {
            Some(after) if conn.is_some() => {
                Some(after.clamp(Duration::from_millis(1), cfg.linger))
            }
            _ => rests.then_some(cfg.linger),
        };
        let idle = match bundler.as_mut() {
            Some(b) if !peer.window_full() => {
                match peer
                    .lane
                    .next_batch(b.as_mut(), epoch, &mut batch, peer.bulk_room(), linger)
                {
                    Next::Batch(reason) => {
                        hold(&peer, &mut batch, reason);
                        peer.lane.end_move();
                        false
                    }
                    Next::Idle => true,
                    // Poked, a piece to move, or closed and empty (shutting down: the
                    // branch above goes on).
                    Next::Wake | Next::Drained => false,
                }
            }
            // The ordinary window is full, or transfer-queue (the bundler thread fills it):
            // only pieces to move, or wait for a poke.
            _ if peer.bulk_room() && peer.lane.bulk_ready() => false,
            _ => !wait(&peer, epoch, None, linger),
        };
        // Rest: nothing to write on the connection, checked again after the flag is down
        // (a poke meanwhile either sees the flag down and starts a writer, or made work
        // this check sees).
        if idle
            && rests
            && let Some(c) = &conn
            && shutdown.deadline().is_none()
            && peer.nothing_to_write(c)
            && peer.writer_may_end(|| {
                shutdown.deadline().is_some() || c.is_closed() || !peer.nothing_to_write(c)
            })
        {
            debug!(peer = %peer.name, "writer rests (nothing to write)");
            return;
        }
        move_pieces(&peer);
    }
}

/// How long a connection carried no message either way.
#[derive(Default)]
struct Idle {
    /// Messages and pieces sent and received when last looked at, and since when they
    /// have not moved (the first round that found them unchanged: a writer that streams
    /// reads no clock for this; an idle one wakes at least every heartbeat).
    seen: u64,
    since: Option<Instant>,
}

impl Idle {
    /// Whether nothing moved for `after` and nothing is pending (nothing queued, held
    /// unacknowledged or owed either way).
    fn is_over(&mut self, peer: &Peer, after: Duration) -> bool {
        let st = &peer.stats;
        let seen = [
            &st.messages_sent,
            &st.messages_received,
            &st.fragments_sent,
            &st.fragments_received,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .sum();
        if seen != self.seen {
            (self.seen, self.since) = (seen, None);
            return false;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        now >= since + after && peer.is_quiet()
    }
}

/// Number pieces of bulk messages into the window while the session has bulk room.
/// Returns whether any were.
fn move_pieces(peer: &Peer) -> bool {
    let mut moved = false;
    while peer.bulk_room() {
        let Some(p) = peer.lane.next_piece() else {
            break;
        };
        match peer.session(|s, _| s.hold_piece(&p)) {
            Ok(id) => {
                moved = true;
                peer.lane.advance_piece(p.serial, id);
                peer.stats.fragments_sent.fetch_add(1, Relaxed);
                if p.is_last() {
                    peer.stats.messages_sent.fetch_add(1, Relaxed);
                }
            }
            // The peer restarted since the message's first piece: all of it goes again.
            Err(PieceRefused::Restart) => peer.lane.restart_piece(p.serial),
            // Down, or the goodbye was said: the message stays queued and is handed back
            // from there, unless it was taken meanwhile on its way here.
            Err(PieceRefused::Failed(why)) => {
                let queued = peer.lane.unreserve_piece(p.serial);
                peer.lane.end_move();
                if !queued {
                    let m = Message {
                        to: p.to,
                        from: p.from,
                        payload: p.payload,
                    };
                    peer.report_failed(vec![m], why);
                }
                break;
            }
        }
        peer.lane.end_move();
    }
    moved
}

/// Sleep until poked, or until the shutdown deadline if there is one (else `linger`, if
/// given). Returns whether it was poked.
fn wait(peer: &Peer, epoch: u64, deadline: Option<Instant>, linger: Option<Duration>) -> bool {
    let d = match deadline {
        Some(t) => t
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
        None => linger.unwrap_or(IDLE),
    };
    peer.lane.wait_epoch(epoch, d)
}

/// Number a batch and hold it in the window (it is written next round; a large batch's
/// buffer moves there uncopied, and the batch gets a free one back), or hand it back if
/// the peer is down.
fn hold(peer: &Peer, batch: &mut Batch, reason: FlushReason) {
    if batch.frames.is_empty() {
        return;
    }
    let held = peer.session(|s, _| peer.holdable(s).map(|()| s.hold_batch(batch)));
    match held {
        Ok(n) => count_held(peer, n, reason),
        Err(why) => peer.report_failed(batch.decode_messages(), why),
    }
}

fn count_held(peer: &Peer, n: u64, reason: FlushReason) {
    peer.stats.messages_sent.fetch_add(n, Relaxed);
    peer.stats.flushes[reason.index()].fetch_add(1, Relaxed);
}

/// Number `frames` into `peer`'s window, or hand them back if it is down (the bundler
/// thread's path too, which then tells the lane they were taken).
pub(crate) fn hold_frames(peer: &Peer, frames: &[(&[u8], u32)], reason: FlushReason) {
    if frames.is_empty() {
        return;
    }
    let held = peer.session(|s, _| peer.holdable(s).map(|()| s.hold(frames)));
    match held {
        Ok(n) => count_held(peer, n, reason),
        Err(why) => peer.report_failed(decode_frames(frames.iter().map(|f| f.0)), why),
    }
    // Held with no connection (transfer-queue): one is wanted.
    peer.after_push();
}

/// Write-through ([`crate::io::lane::Pushed::Direct`]): the sender found the writer
/// parked and the lane quiet, and took the batch itself. Hold it in the window, then, if
/// no one else is writing, write it (with any control
/// frame due) without waiting: what the socket does not take at once is left on the
/// connection for the writer, which is poked. Otherwise the writer writes it.
pub(crate) fn write_through(peer: &Peer, shutdown: &Shutdown) {
    let mut batch = peer.lane.take_direct();
    hold(peer, &mut batch, FlushReason::Drained);
    peer.lane.end_move();
    peer.lane.finish_direct(batch);
    write_now_or_poke(peer, Some(shutdown));
}

/// Control made due by a thread that leads the peer's connection (an acknowledgement,
/// mostly: see `Peer::session`): if no one is writing,
/// the thread writes it itself without waiting, with anything else due (what the socket
/// does not take at once is left for the writer, which is poked); otherwise the writer is
/// poked. It saves the writer's wake-up, and the leader being preempted by it, for every
/// acknowledgement of a stream its receiver reads.
pub(crate) fn write_control_through(peer: &Peer) {
    // Shutting down, the writer says the last word (a final acknowledgement, GOODBYE,
    // then it shuts the socket's write side): nothing is written past it.
    if peer.session(|s, _| s.is_closing()) {
        peer.lane.poke();
        return;
    }
    write_now_or_poke(peer, None);
}

/// What is due on the peer's connection, written by the calling thread without waiting
/// if no one else is writing (on Unix); otherwise the writer is poked to write it.
fn write_now_or_poke(peer: &Peer, shutdown: Option<&Shutdown>) {
    let wrote = peer
        .current()
        .filter(|c| !c.is_closed() && c.link.writes_without_waiting())
        .is_some_and(|c| {
            let Some(_turn) = peer.try_write_turn() else {
                return false;
            };
            write_pending(peer, &c, shutdown, &mut Vec::new(), Mode::NoWait)
        });
    if !wrote {
        peer.lane.poke();
    }
}

/// How `write_pending` writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Everything, waiting for the socket as long as the connection lives (the writer).
    Wait,
    /// What the socket takes now; the rest is the connection's carry (write-through).
    NoWait,
}

/// One vectored write of what is due on `c`: control frames, then unwritten data. Call
/// with the write turn. Returns false if it could not write at all (without waiting: the
/// connection has a carry left to write first, or cannot be written without waiting).
fn write_pending(
    peer: &Peer,
    c: &Conn,
    shutdown: Option<&Shutdown>,
    control: &mut Vec<u8>,
    mode: Mode,
) -> bool {
    let mut go_on = || !c.is_closed() && !shutdown.is_some_and(past_grace);
    if mode == Mode::NoWait && (c.has_carry() || !c.link.writes_without_waiting()) {
        return false;
    }
    if let Err(e) = write_carry(c, &mut go_on) {
        fail_write(peer, c, &e);
        return true;
    }
    // (Without waiting, the write below sends what waits first, if the socket takes it.)
    if mode == Mode::Wait
        && c.link.tls_pending()
        && let Err(e) = c.link.flush_tls(&mut go_on)
    {
        fail_write(peer, c, &e);
        return true;
    }
    control.clear();
    let u = peer.session(|s, now| {
        // The goodbye was the last thing written (the write side is shut after it): no
        // heartbeat, credit or notice follows it, whoever finds one due.
        if s.said_goodbye() {
            return None;
        }
        // The SYNC and grants go before the ACKs, taken in the same session turn: an ACK
        // beyond a SYNC's snapshot never overtakes it (see `Flow::snapshot`). Only on the
        // current connection: a SYNC snapshot for a successor, taken by a writer still
        // holding the replaced one, was lost with it (and the successor's credit never
        // recounted).
        if s.current() == Some(c.id) {
            peer.flow.take_output(c.id, control);
        }
        while let Some(f) = s.poll_control(now, c.id) {
            f.encode(control);
        }
        Some(s.unwritten(c.id))
    });
    let Some(u) = u else {
        return true;
    };
    let notices = peer.take_notices(control);
    if control.is_empty() && u.is_empty() {
        return true;
    }
    let mut bufs: Vec<&[u8]> = Vec::with_capacity(u.slices_bound() + 1);
    if !control.is_empty() {
        bufs.push(control);
    }
    u.slices(&mut bufs);
    let written = match mode {
        Mode::Wait => c.link.write_vectored(&bufs, &mut go_on),
        Mode::NoWait => match c.link.try_write_vectored(&bufs) {
            Some(Ok(n)) => {
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                if n < total {
                    // The socket is full: the rest goes first next time, by the writer
                    // (the control bytes copied, the data as slices of the window's
                    // chunks). It counts as written here; the window keeps it until
                    // acknowledged, like anything written.
                    c.set_carry(rest_after(control, &u.chunks(), n));
                    peer.lane.poke();
                } else if c.link.tls_pending() {
                    // TLS records the socket did not take: the writer sends them.
                    peer.lane.poke();
                }
                Ok(total)
            }
            Some(Err(e)) => Err(e),
            None => unreachable!("checked above: writes_without_waiting"),
        },
    };
    match written {
        Ok(bytes) => {
            peer.session(|s, now| match u.ends.last() {
                None => s.note_sent(now, c.id),
                Some(end) => s.mark_written(now, c.id, u.generation, *end),
            });
            let st = &peer.stats;
            st.bytes_sent.fetch_add(bytes as u64, Relaxed);
            if !u.is_empty() {
                st.frames_sent.fetch_add(u.frames, Relaxed);
                st.record_write(u.messages);
                if mode == Mode::NoWait {
                    st.writes_through.fetch_add(1, Relaxed);
                }
            }
        }
        Err(e) => {
            fail_write(peer, c, &e);
            peer.restore_notices(notices);
        }
    }
    if peer.has_notices() {
        peer.lane.poke();
    }
    true
}

/// What follows the first `n` bytes of `control` then `chunks`: the rest of the control
/// bytes copied (they are few and reused), the chunks sliced.
fn rest_after(control: &[u8], chunks: &[Bytes], mut n: usize) -> Vec<Bytes> {
    let mut rest = Vec::new();
    if n < control.len() {
        rest.push(Bytes::copy_from_slice(&control[n..]));
    }
    n = n.saturating_sub(control.len());
    for c in chunks {
        if n < c.len() {
            rest.push(c.slice(n..));
        }
        n = n.saturating_sub(c.len());
    }
    rest
}

/// Write what a write-through left on `c` (nothing if it left nothing).
fn write_carry(c: &Conn, go_on: &mut dyn FnMut() -> bool) -> std::io::Result<()> {
    let rest = c.take_carry();
    if rest.is_empty() {
        return Ok(());
    }
    let bufs: Vec<&[u8]> = rest.iter().map(|b| &b[..]).collect();
    c.link.write_vectored(&bufs, go_on).map(|_| ())
}

/// A write failed: close the connection. Nothing is lost: what was held stays held and
/// goes out again on the next connection, where the receiver skips what had arrived.
fn fail_write(peer: &Peer, c: &Conn, e: &std::io::Error) {
    if !c.is_closed() {
        warn_limited!(peer = %peer.name, error = %e, "write failed; connection closed, will resend on reconnect");
    } else {
        debug!(peer = %peer.name, error = %e, "write to a closed connection");
    }
    c.close();
}

fn past_grace(shutdown: &Shutdown) -> bool {
    shutdown
        .deadline()
        .is_some_and(|d| Instant::now() >= d + GRACE)
}

/// Shutting down: once the lane is closed and everything in it (and, with transfer-queue,
/// in the shared queue) is held, wait for the acknowledgements (or the deadline), then say
/// goodbye. Returns true when the writer is done.
fn close_step(peer: &Peer, conn: Option<&Conn>, cfg: &WriterCfg, deadline: Instant) -> bool {
    let now = Instant::now();
    // The bundler thread drains the shared queue promptly (it touches no socket): wait for
    // it even past the deadline, or what it still holds for this peer would go unreported.
    if cfg.shared_done.as_ref().is_some_and(|d| !d.load(Relaxed)) {
        return false;
    }
    // Until the lane is closed a sender may still add to it; until it is empty there is
    // more to hold.
    let drained = peer.lane.is_drained();
    if !drained && now < deadline {
        return false;
    }
    if !drained {
        // The deadline passed with messages still queued (the window was full): hand
        // them back.
        peer.fail_queued(FailReason::ShutDown);
    }
    match conn {
        Some(c) => {
            let Some(frames) = peer.session(|s, now| s.poll_close(now, c.id, false)) else {
                return false;
            };
            let mut out = Vec::new();
            for f in frames {
                f.encode(&mut out);
            }
            // The goodbye only after all that was written before it: behind a carry cut
            // short it would be read as the rest of a frame.
            if write_carry(c, &mut || false).is_ok() {
                let _ = c.link.write_vectored(&[&out], &mut || false);
            }
            let _ = c.link.shutdown(std::net::Shutdown::Write);
            true
        }
        None => {
            let closed = peer.session(|s, now| {
                s.handle_timeout(now);
                s.is_closed() || s.state() == PeerState::Down
            });
            if closed || now >= deadline {
                peer.session(|s, _| s.abandon());
                return true;
            }
            false
        }
    }
}

#[cfg(test)]
mod tests;
