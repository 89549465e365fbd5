//! A lane: the outbound queues toward one peer (or, with `transfer-queue`, the one ordinary
//! queue every peer shares), bounded in bytes, and the condvars its senders and its consumer
//! wait on.
//!
//! A peer's own lane holds, each under the same lock:
//! - the **ordinary** queue: an [`Outbox`] of encoded MESSAGES frames, drained a batch at a
//!   time as the bundler decides;
//! - the **bulk** queue ([`BulkQueue`]): messages sent in pieces (larger than the fragment
//!   size, sent with `Class::Bulk`, or behind another of their pair), never copied;
//! - the **credit** toward the peer's mailboxes ([`SendCredit`]): a send to a mailbox whose
//!   credit is used up waits (or `try_send` answers `Full`), and no other send does.
//!
//! Its writer thread waits on it for data and for a `poke` (a control frame is due, the
//! window has room, the connection changed, the node is shutting down). Only messages go
//! through a lane: control frames never queue behind data.
//!
//! The hot path (`push` of an ordinary message) takes one mutex, checks the mailbox's
//! credit, encodes the message into the outbox and, only when the writer is parked and has
//! a reason to wake, notifies it: no syscall, allocation (the buffer is reused) or clock
//! read per message (the clock is read only when the bundler needs enqueue times and the
//! outbox was empty, or when the writer is parked: then, without company, the sender
//! takes the message to write it itself, see [`Pushed::Direct`]).

mod consumer;
mod credit;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use batchwire_core::bulk::{BulkQueue, ORDINARY_WEIGHT, Piece};
use batchwire_core::bundler::{Bundler, Decision, FlushReason};
use batchwire_core::codec::{Name, NameMap};
use batchwire_core::credit::SendCredit;
use batchwire_core::frame::{self, Frame, Message, message_len};
use batchwire_core::idle::{self, IdleStep, IdleStrategy};
use batchwire_core::outbox::{Batch, Dest, Outbox};
use batchwire_core::session::ConnId;
use bytes::{Bytes, BytesMut};

use crate::config::NodeConfig;
use crate::io::wakers::{Relay, Ticket, Wakers};

/// Why `push` did not queue a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The lane (or the mailbox's credit) is at capacity and the caller asked not to block.
    Full,
    /// The node is shutting down.
    Closed,
    /// The peer is declared down (senders waiting for room or credit give up).
    Down,
    /// The peer accepts payloads up to this size (it said so in its SYNC).
    TooLarge(u64),
}

/// What the writer should do after `next_batch`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The batch holds frames to write.
    Batch(FlushReason),
    /// The node is shutting down and the lane is empty.
    Drained,
    /// The writer was poked (control due, window room, connection changed, a piece to
    /// move); the batch is empty.
    Wake,
    /// Nothing came for the writer's `linger` (see `write::run_writer`: it may end).
    Idle,
}

/// What `push_direct` did with a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued for the writer (woken if it has to be).
    Queued,
    /// Taken for the caller to write itself ([`crate::io::write::write_through`]): the
    /// writer was parked, the lane quiet (no wake-up for [`WRITE_THROUGH_GAP`]), the
    /// writer's last two takes were single messages (no company to bundle), this is not a
    /// probe wake (every [`THROUGH_PROBE`]th), and the bundler writes what comes at once.
    /// The caller must call `write_through` before it sends anything else.
    Direct,
}

/// A push that wakes a parked writer at most this soon after the last one is left to the
/// writer: a stream keeps waking it this often, and it bundles what queues meanwhile,
/// while an occasional message (a request, a reply) is written by its sender at once. A
/// loopback write takes several microseconds, so well below this gap write-through would
/// turn a stream into one write per message, and a gap of only a few writes still costs
/// many concurrent callers (the commit that chose it has the measurements).
const WRITE_THROUGH_GAP: Duration = Duration::from_micros(50);

/// A message to queue.
#[derive(Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    pub dest: Dest,
    pub to: &'a Name,
    pub from: &'a Name,
    pub payload: &'a Bytes,
    /// Sent with the bulk class.
    pub bulk: bool,
}

struct Inner {
    outbox: Outbox,
    bulk: BulkQueue,
    credit: SendCredit,
    /// The connection whose SYNC last recounted `credit`: grants and SYNCs that came on
    /// an earlier one are stale (the recount already left out what they give back).
    synced_on: Option<ConnId>,
    /// Ordinary messages queued toward the peer, and numbered (or failed), ever: a bulk
    /// message waits until every ordinary one queued before it was taken.
    pushed: u64,
    taken: u64,
    closed: bool,
    /// The peer is declared down: sends are refused (until it is back up).
    down: bool,
    writer_waiting: bool,
    /// No writer runs (it rests, or none started yet): like a parked one, a sender may
    /// write a lone message through (a hint: a writer starting meanwhile is harmless, the
    /// two take turns as with a parked one).
    writer_absent: bool,
    /// Senders waiting for room or credit (blocking sends), woken one at a time while they
    /// wait for the same thing.
    senders: Relay<WaitKey>,
    /// Tasks waiting for room or credit (async sends), woken with `not_full`.
    room: Wakers,
    /// Bumped whenever the consumer must look up (`poke`, `close`, a bulk message); mirrored
    /// in `Lane::epoch` for lock-free reads.
    epoch: u64,
    /// Write-through: a sender took a batch (into `direct`) and has not held it in the
    /// window yet; the writer takes nothing meanwhile (order).
    direct_busy: bool,
    direct: Batch,
    /// When a push last woke the parked writer or wrote through.
    last_wake: Option<Instant>,
    /// Whether senders may write through: the writer's last two takes each held a single
    /// message with nothing left behind (nothing else queued while it woke), and no
    /// sender found another one writing through. With many senders a woken writer finds
    /// several messages and bundles them; writing each through instead would have the
    /// senders take turns at whole writes of one message each. `probe` counts wake-ups
    /// since the writer last took: every [`THROUGH_PROBE`]th goes to the writer, to look
    /// again.
    through_ok: bool,
    /// The writer's previous take held a single message.
    single_take: bool,
    /// The writer's previous take was two or more small messages: it yields once before
    /// it parks (see `batchwire_core::idle::small_take`).
    yield_next: bool,
    probe: u32,
}

/// What a blocked sender waits for. Senders with equal keys wait for the same condition
/// (room in the same queue, and credit in the same mailbox), so if one of them cannot go
/// on, none can: they are woken one at a time ([`Relay`]).
#[derive(PartialEq)]
struct WaitKey {
    wants: Wants,
    to: Name,
}

#[derive(PartialEq, Clone, Copy)]
enum Wants {
    /// Room in the ordinary queue, and the mailbox's credit (unless the lane charges none).
    Ordinary,
    /// Room in the bulk queue, and the mailbox's credit.
    Bulk,
    /// The mailbox's credit only (transfer-queue's charge).
    Credit,
}

/// While senders write through, every this many-th wake-up goes to the writer instead (to
/// see whether messages queue up meanwhile, i.e. whether there is company to bundle).
/// Rarely: each probe costs its message a hand-off to the writer (with every 4th, a
/// quarter of requests and replies would wait for a writer's wake-up); company is seen
/// anyway from the writer's takes whenever messages come closer than `WRITE_THROUGH_GAP`,
/// and from two senders writing through at once.
const THROUGH_PROBE: u32 = 64;

pub(crate) struct Lane {
    inner: Mutex<Inner>,
    /// The writer waits here for messages.
    not_empty: Condvar,
    /// Senders wait here for room or credit.
    not_full: Condvar,
    /// Bytes each queue (ordinary, bulk) admits while below.
    pub capacity: usize,
    /// Messages larger than this go in pieces of this size.
    piece_bytes: usize,
    /// Whether sends through this lane charge its credit (not the shared transfer-queue
    /// lane: its senders charge their peer's lane).
    charges_credit: bool,
    track_time: bool,
    wake_bytes: usize,
    /// The bundler writes what comes at once when idle: senders may write through.
    write_through: bool,
    idle: IdleStrategy,
    /// Most bytes ever queued.
    pub high_water: AtomicU64,
    /// Nanoseconds senders spent blocked on a full lane or used-up credit.
    pub blocked_ns: AtomicU64,
    /// Sends that found a mailbox's credit used up (and waited, or were refused).
    pub credit_stalls: AtomicU64,
    /// Odd while the writer (or a sender writing through) moves something from this lane
    /// into the send window (taken here, not yet held there), bumped under the lock when it
    /// takes and after it is done ([`Lane::end_move`]): a SYNC recount that reads both must
    /// not fall between, nor a peer's removal (`Lane::close_if_at_rest`). Kept by a peer's
    /// own lane (`charges_credit`); the shared transfer-queue lane, whose peers are never
    /// removed, keeps none.
    moves: AtomicU64,
    /// `Inner::epoch`, readable without the lock senders contend for (written under it).
    epoch: AtomicU64,
    /// Called after every poke, without the lock: the peer starts its writer if none runs
    /// (a writer may end while its connection is up and quiet, see `peer::demand`).
    on_poke: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// How a lane is made.
pub(crate) struct LaneCfg {
    pub capacity: usize,
    pub frame_bytes: usize,
    pub piece_bytes: usize,
    /// Payloads at least this long are not copied (see `Outbox::by_reference`).
    pub by_reference: usize,
    pub charges_credit: bool,
    pub idle: IdleStrategy,
}

impl Lane {
    pub fn new(cfg: LaneCfg, bundler: &dyn Bundler) -> Self {
        Lane {
            inner: Mutex::new(Inner {
                outbox: Outbox::new(bundler.frame_bytes(cfg.frame_bytes))
                    .by_reference(cfg.by_reference),
                bulk: BulkQueue::default(),
                credit: SendCredit::default(),
                synced_on: None,
                pushed: 0,
                taken: 0,
                closed: false,
                down: false,
                writer_waiting: false,
                writer_absent: true,
                senders: Relay::default(),
                room: Wakers::default(),
                epoch: 0,
                direct_busy: false,
                direct: Batch::default(),
                last_wake: None,
                through_ok: true,
                single_take: true,
                yield_next: false,
                probe: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity: cfg.capacity,
            piece_bytes: cfg.piece_bytes.max(1),
            charges_credit: cfg.charges_credit,
            track_time: bundler.needs_enqueue_time(),
            wake_bytes: bundler.wake_bytes(),
            write_through: bundler.writes_when_idle() && cfg.charges_credit,
            idle: cfg.idle,
            high_water: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
            credit_stalls: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            on_poke: std::sync::OnceLock::new(),
        }
    }

    /// What to call after every poke (set once, by the peer that owns the lane).
    pub fn set_on_poke(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_poke.set(f);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave `Inner` in a state that is worse
        // than losing the node, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self, g: &mut Inner) {
        g.epoch += 1;
        self.epoch.store(g.epoch, Ordering::Release);
    }

    /// Whether a message goes to the bulk queue: sent as bulk, too large for one piece, or
    /// behind a bulk message of its pair (so a pair's order holds across classes).
    fn is_bulk(&self, g: &Inner, m: &Outgoing) -> bool {
        m.bulk
            || m.payload.len() > self.piece_bytes
            || (!g.bulk.is_empty() && g.bulk.has_pair(m.to, m.from))
    }

    /// Whether `m` would go to the bulk queue (the transfer-queue sender's question: bulk
    /// goes to the peer's own lane, not the shared one).
    pub fn routes_to_bulk(&self, m: &Outgoing) -> bool {
        let g = self.lock();
        self.is_bulk(&g, m)
    }

    /// Wait (with `block`) until `ready(g)` holds; counts credit stalls and blocked time.
    /// The common case (open, up, ready) is checked here, inline; the rest out of line.
    #[inline]
    fn wait_for<'a>(
        &'a self,
        g: MutexGuard<'a, Inner>,
        block: bool,
        (wants, to): (Wants, &Name),
        ready: impl Fn(&Inner) -> Result<(), bool>,
    ) -> Result<MutexGuard<'a, Inner>, PushError> {
        if !g.closed && !g.down && ready(&g).is_ok() {
            return Ok(g);
        }
        self.wait_for_slow(g, block, (wants, to), &ready)
    }

    #[cold]
    #[inline(never)]
    fn wait_for_slow<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        block: bool,
        (wants, to): (Wants, &Name),
        ready: &dyn Fn(&Inner) -> Result<(), bool>,
    ) -> Result<MutexGuard<'a, Inner>, PushError> {
        let mut start = None;
        loop {
            if g.closed {
                return Err(PushError::Closed);
            }
            if g.down {
                return Err(PushError::Down);
            }
            let credit_short = match ready(&g) {
                Ok(()) => break,
                Err(credit_short) => credit_short,
            };
            if start.is_none() && credit_short {
                self.credit_stalls.fetch_add(1, Ordering::Relaxed);
            }
            if !block {
                return Err(PushError::Full);
            }
            start.get_or_insert_with(Instant::now);
            g.senders.park(WaitKey {
                wants,
                to: to.clone(),
            });
            g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            g.senders.woke();
        }
        if let Some(t) = start {
            // It waited and got through: the next sender waiting for the same may, too.
            g.senders.pass_on(&self.not_full);
            self.blocked_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(g)
    }

    /// Room or credit may have appeared: wake the senders waiting for it, threads and tasks.
    fn room_freed(&self, g: &mut Inner) {
        g.senders.notify(&self.not_full);
        g.room.wake_all();
    }

    /// Wake `w` at the next change that may make room or credit (an async send that found
    /// none registers, then tries once more).
    pub fn register_room(&self, w: &Waker, ticket: &mut Ticket) {
        self.lock().room.register(w, ticket);
    }

    /// Queue a message. It is admitted while its queue (ordinary or bulk) holds fewer than
    /// `capacity` bytes, so one message larger than the capacity still goes through, and
    /// (unless the lane is the shared one) while its mailbox's credit is not used up. With
    /// `block`, waits for both; otherwise returns `Full`.
    #[inline]
    pub fn push(&self, m: Outgoing, block: bool) -> Result<(), PushError> {
        self.push_direct(m, block, || false).map(|_| ())
    }

    /// [`Lane::push`], and if `may_write()` agrees (asked only when the writer is parked
    /// and the lane quiet, not per message) the message may be handed back to the caller
    /// to write itself ([`Pushed::Direct`]) rather than waking the parked writer.
    #[inline]
    pub fn push_direct(
        &self,
        m: Outgoing,
        block: bool,
        may_write: impl FnOnce() -> bool,
    ) -> Result<Pushed, PushError> {
        let g = self.lock();
        if let Some(max) = g.credit.peer_max_payload()
            && m.payload.len() as u64 > max
        {
            return Err(PushError::TooLarge(max));
        }
        let bulk = self.is_bulk(&g, &m);
        let credit = self.charges_credit;
        // The mailbox's credit slot, found once under the lock and charged under it.
        let slot = std::cell::Cell::new(None);
        let wants = if bulk { Wants::Bulk } else { Wants::Ordinary };
        let mut g = self.wait_for(g, block, (wants, m.to), |g| {
            let room = if bulk {
                g.bulk.bytes() < self.capacity
            } else {
                g.outbox.bytes() < self.capacity
            };
            if credit {
                let (admits, at) = g.credit.admits_at(m.to.as_bytes());
                if !admits {
                    return Err(true);
                }
                slot.set(at);
            }
            if room { Ok(()) } else { Err(false) }
        })?;
        if credit {
            let charge = message_len(m.to, m.from, m.payload.len()) as u64;
            g.credit.charge_at(slot.get(), m.to, charge);
        }
        if bulk {
            let mark = g.pushed;
            g.bulk.push(m.to, m.from, m.payload.clone(), mark);
            self.bump(&mut g);
            if g.writer_waiting {
                self.not_empty.notify_all();
            }
            return Ok(Pushed::Queued);
        }
        let was_empty = g.outbox.is_empty();
        let now = (was_empty && self.track_time).then(Instant::now);
        g.outbox.push_bytes(m.dest, m.to, m.from, m.payload, now);
        g.pushed += 1;
        let bytes = g.outbox.bytes();
        if bytes as u64 > self.high_water.load(Ordering::Relaxed) {
            self.high_water.store(bytes as u64, Ordering::Relaxed);
        }
        let idle_writer = g.writer_waiting || g.writer_absent;
        if idle_writer && (was_empty || bytes >= self.wake_bytes) {
            // Only here, once per wake-up of the writer, is the clock read.
            if self.write_through && was_empty {
                let now = Instant::now();
                let quiet = g
                    .last_wake
                    .is_none_or(|t| now.duration_since(t) >= WRITE_THROUGH_GAP);
                g.last_wake = Some(now);
                if g.direct_busy {
                    // Another sender is writing through right now: company.
                    g.through_ok = false;
                }
                g.probe = g.probe.saturating_add(1);
                if quiet && g.through_ok && g.probe < THROUGH_PROBE && may_write() {
                    let Inner { outbox, direct, .. } = &mut *g;
                    outbox.take(usize::MAX, usize::MAX, direct, None);
                    g.taken += g.direct.messages();
                    g.direct_busy = true;
                    self.begin_move();
                    return Ok(Pushed::Direct);
                }
            }
            self.not_empty.notify_one();
        }
        Ok(Pushed::Queued)
    }

    /// Write-through: the batch `push_direct` took (see [`Pushed::Direct`]).
    pub fn take_direct(&self) -> Batch {
        std::mem::take(&mut self.lock().direct)
    }

    /// Write-through: the batch is held in the window (`batch` is its emptied buffer, kept
    /// for the next time); the writer may take again.
    pub fn finish_direct(&self, batch: Batch) {
        let mut g = self.lock();
        // A lane closed meanwhile (its peer removed, which let go of its buffers once this
        // batch was held or handed back) keeps no buffer for a next time.
        if !g.closed {
            g.direct = batch;
        }
        g.direct_busy = false;
        // Only if something queued meanwhile (a parked writer that found the lane busy
        // waits for this): waking it for nothing would put its run between this sender
        // and its write, which is most of what writing through saves.
        if g.writer_waiting && !g.outbox.is_empty() {
            self.not_empty.notify_one();
        }
    }
}

/// The messages of encoded MESSAGES frames (for failure reports of the transfer-queue
/// bundler's frames, which hold no payload by reference).
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

/// A lane of its own (1 MiB queues, 64 KiB frames and pieces), for the io layer's tests.
/// How a (validated) configuration makes a lane: a peer's own (which charges credit
/// toward its mailboxes), or the shared transfer-queue one (`charges_credit` false, which
/// copies every payload: its batches are split among the peers' windows).
impl LaneCfg {
    pub(crate) fn new(cfg: &NodeConfig, charges_credit: bool) -> LaneCfg {
        LaneCfg {
            capacity: cfg.send_queue_bytes,
            frame_bytes: cfg.frame_bytes,
            piece_bytes: cfg.fragment_bytes,
            // Ordinary messages with payloads at least this long are not copied into the
            // lane's outbox but written from the caller's buffer (see
            // `batchwire_core::outbox`).
            by_reference: if charges_credit {
                cfg.by_reference_bytes
            } else {
                usize::MAX
            },
            charges_credit,
            idle: crate::io::idle_strategy(cfg),
        }
    }
}

#[cfg(test)]
pub(crate) fn test_lane() -> std::sync::Arc<Lane> {
    let b = batchwire_core::bundler::BundlerConfig::default().build();
    std::sync::Arc::new(Lane::new(
        LaneCfg {
            capacity: 1 << 20,
            frame_bytes: 1 << 16,
            piece_bytes: 1 << 16,
            by_reference: 8 << 10,
            charges_credit: true,
            idle: IdleStrategy::default(),
        },
        b.as_ref(),
    ))
}

#[cfg(test)]
mod tests;
