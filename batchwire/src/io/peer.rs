//! A peer's handles: its session (the protocol state, locked once per batch and never
//! across a wait), its lane, its current connection, its receive-side credit (`Flow`) and
//! reassembly, and the counters.
//!
//! Every call into the session goes through [`Peer::session`], which afterwards acts on what
//! the session says: events are reported (a peer down also fails what is still queued for
//! it), a connection the session gave up on is closed, the writer is poked when control
//! became due or the window opened, and the ticker is told of an earlier deadline. So the
//! rules stay in the session and the routing stays here, in one place.

mod budget;
pub(crate) use budget::{ReassemblyBudget, ReassemblyGuard};

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::codec::Name;
use batchwire_core::frame::{Frame, Message, Undeliverable};
use batchwire_core::outbox::Dest;
use batchwire_core::reassembly::{Abandoned, Reassembly};
use batchwire_core::session::{DownReason, FailReason, PeerState, Session, SessionEvent};
use tracing::{info, warn};

use crate::address::Address;
use crate::event::{Event, FailedMessage};
use crate::io::calls::Calls;
use crate::io::conn::Conn;
use crate::io::events::Events;
use crate::io::flow::Flow;
use crate::io::lane::Lane;
use crate::io::timer::Timer;
use crate::io::wakers::{Ticket, Wakers};
use crate::stats::PeerCounters;

/// What every peer's dispatch needs: the node's name (for logs), the event bus, the
/// ticker's alarm, the watch on connections coming and going, and the requests in flight
/// (failed when their peer goes down; completed by replies).
pub(crate) struct PeerCtx {
    pub node: Name,
    pub events: Events,
    pub timer: Timer,
    pub conns: ConnWatch,
    pub calls: Arc<Calls>,
    /// The node-wide bound on messages in pieces.
    pub reassembly: ReassemblyBudget,
    /// How a peer's writer is started and a connection asked for (see [`demand`]).
    pub hooks: OnceLock<demand::Hooks>,
}

mod conns;
pub(crate) mod control;
mod demand;
mod dispatch;
mod schedule;
pub(crate) use demand::Hooks;

/// Connections coming and going, for whoever waits for them (`wait_for_peers`, the
/// shutdown's last goodbyes).
#[derive(Default)]
pub(crate) struct ConnWatch {
    lock: Mutex<()>,
    cv: Condvar,
}

impl ConnWatch {
    fn changed(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// Wait until `cond()` holds (re-checked whenever a connection comes or goes) or
    /// `deadline` passes. Returns whether it holds.
    pub fn wait_until(&self, deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if cond() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

thread_local! {
    /// This thread holds some peer's `dispatching` lock (see [`Peer::session`]).
    static DISPATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The `dispatching` lock, held while a session turn's events are acted on.
struct Dispatching<'a> {
    _guard: MutexGuard<'a, ()>,
}

impl Drop for Dispatching<'_> {
    fn drop(&mut self) {
        DISPATCHING.set(false);
    }
}

/// One peer.
///
/// Its locks, in the order they are taken (the whole node's order is in
/// `docs/architecture.md`, "Lock order"): the read turn (a connection's) or `write_turn`;
/// then `delivery`, `session`, `dispatching`, the connection watch, `reassembly`; then the
/// mailboxes, the flow, the lane. `conn`, `room_lock` and `notices` are leaves. What runs
/// under `dispatching` never takes `session` (checked in debug builds).
pub(crate) struct Peer {
    /// The destination tag of this peer's frames in a shared lane.
    pub id: Dest,
    pub name: Name,
    ctx: Arc<PeerCtx>,
    session: Mutex<Session>,
    /// Messages for this peer (ordinary ones with per-peer bundlers, bulk ones always), its
    /// credit toward the peer's mailboxes, and its writer's wake-ups.
    pub lane: Arc<Lane>,
    /// The credit of the peer's messages in this node's mailboxes.
    pub flow: Arc<Flow>,
    /// The peer's messages in pieces (its readers, one at a time: the delivery turn).
    /// Messages in pieces, and what they committed of the node's budget when last counted.
    reassembly: Mutex<(Reassembly, u64)>,
    conn: Mutex<Option<Arc<Conn>>>,
    /// Held by whoever writes to the peer's connections: its writer thread, or a sender
    /// writing through (which only tries it). Writes never interleave, and what the session
    /// hands out as unwritten goes out in order.
    write_turn: Mutex<()>,
    /// Held by the reader delivering a frame, so two readers of this peer (a replaced
    /// connection's and its successor's) never interleave their deliveries.
    delivery: Mutex<()>,
    /// Taken before the session lock is released and held while its events are acted on,
    /// so events reach the application in the order the session produced them.
    dispatching: Mutex<()>,
    /// The session's state, for the send path (no lock per message).
    state: AtomicU8,
    /// The session's window is full (transfer-queue senders wait on `room` meanwhile).
    window_full: AtomicBool,
    /// The session has room for another piece (the writer reads it every round).
    bulk_room: AtomicBool,
    room: Condvar,
    /// Guards `room`, and holds the tasks waiting for room (async sends).
    room_lock: Mutex<Wakers>,
    notices: Mutex<Notices>,
    /// Whether `notices` holds any (read by the writer every round without the lock).
    has_notices: AtomicBool,
    /// A configured (static) peer: never removed from the registry.
    pub pinned: AtomicBool,
    /// Removed from the registry (see `Peers::remove_forgotten`): lookups skip it, its
    /// lane refuses messages, its writer has ended.
    removed: AtomicBool,
    pub stats: PeerCounters,
    /// This peer, for starting its writer.
    me: Weak<Peer>,
    /// Its writer and connection on demand.
    demand: demand::Demand,
    /// Mirror of the session: control is due, or the window holds what the connection has
    /// not had, or it is closing (a writer is wanted: see `demand::writer_wanted`).
    write_due: AtomicBool,
    /// The earliest deadline of this peer's session the ticker's schedule holds (in the
    /// timer's nanoseconds; `u64::MAX`: none): a later one is not scheduled again (the
    /// ticker reschedules from the session when the earlier one comes).
    scheduled: AtomicU64,
}

/// Undeliverable notices for this peer, summed per (destination, sender) pair until the
/// writer sends them. At most `NOTICE_PAIRS` pairs are kept apart; the counts of any
/// further pairs go into one summary notice (destination "", which no mailbox can have),
/// so a peer that sends to a million made-up names costs this node a fixed amount of memory.
#[derive(Default)]
struct Notices {
    pairs: Vec<(Name, Name, u32)>,
    summary: u32,
}

/// Distinct (destination, sender) pairs of undeliverable notices kept per peer.
const NOTICE_PAIRS: usize = 64;
/// Notices written at once (the rest go with the next write).
const NOTICES_PER_WRITE: usize = 16;

fn state_code(s: PeerState) -> u8 {
    match s {
        PeerState::Connecting => 0,
        PeerState::Up => 1,
        PeerState::Down => 2,
    }
}

impl Peer {
    pub fn new(
        id: Dest,
        name: Name,
        ctx: Arc<PeerCtx>,
        session: Session,
        lane: Arc<Lane>,
        flow: Arc<Flow>,
    ) -> Arc<Peer> {
        Arc::new_cyclic(|me: &std::sync::Weak<Peer>| {
            let w = me.clone();
            lane.set_on_poke(Box::new(move || {
                if let Some(p) = w.upgrade() {
                    p.writer_wanted();
                }
            }));
            Peer {
                id,
                name,
                ctx,
                session: Mutex::new(session),
                lane,
                flow,
                reassembly: Mutex::new((Reassembly::default(), 0)),
                conn: Mutex::new(None),
                write_turn: Mutex::new(()),
                delivery: Mutex::new(()),
                dispatching: Mutex::new(()),
                state: AtomicU8::new(0),
                window_full: AtomicBool::new(false),
                bulk_room: AtomicBool::new(true),
                room: Condvar::new(),
                room_lock: Mutex::new(Wakers::default()),
                notices: Mutex::new(Notices::default()),
                has_notices: AtomicBool::new(false),
                pinned: AtomicBool::new(false),
                removed: AtomicBool::new(false),
                stats: PeerCounters::default(),
                me: me.clone(),
                demand: Default::default(),
                scheduled: AtomicU64::new(u64::MAX),
                write_due: AtomicBool::new(false),
            }
        })
    }

    /// The write turn (the writer thread, for one round of writing).
    pub fn write_turn(&self) -> MutexGuard<'_, ()> {
        self.write_turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The write turn if no one has it (a sender writing through never waits for it).
    pub fn try_write_turn(&self) -> Option<MutexGuard<'_, ()>> {
        match self.write_turn.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Run `f` on the session (with the time), then act on what it says. Never call it
    /// while waiting for anything.
    pub fn session<R>(&self, f: impl FnOnce(&mut Session, Instant) -> R) -> R {
        // The lock order: the session, then `dispatching`, never the other way round (one
        // thread dispatching a turn's events while another holds the session and waits for
        // `dispatching` would wait for each other). Checked where tests run.
        debug_assert!(
            !DISPATCHING.get(),
            "Peer::session called while dispatching a session's events"
        );
        let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let due = |s: &Session| s.current().is_some_and(|c| s.control_due(c));
        let (due_before, full_before, empty_before, delivering_before, bulk_before) = (
            due(&s),
            s.window_full(),
            s.window_messages() == 0,
            s.delivering(),
            s.bulk_room(),
        );
        let now = Instant::now();
        let r = f(&mut s, now);
        let events: Vec<SessionEvent> = std::iter::from_fn(|| s.poll_event()).collect();
        // A turn with events waits here for an earlier turn's dispatch to end, before it
        // changes anything others see (the lane, the mirrors): so a peer back up is seen
        // up only after an earlier Down was acted on in full (its calls failed), never
        // while that is still going on.
        let _order = (!events.is_empty()).then(|| {
            let g = self.dispatching.lock().unwrap_or_else(|p| p.into_inner());
            DISPATCHING.set(true);
            Dispatching { _guard: g }
        });
        // Declared down: what is queued for it can only go to it. Taken in this turn (the
        // lane refusing new messages first), so a message in pieces among it is given up
        // on the session still held: what runs while `dispatching` is held never takes
        // the session (that order, session then dispatching, is this function's).
        let mut failed_on_down = Vec::new();
        if events
            .iter()
            .any(|e| matches!(e, SessionEvent::Down { .. }))
        {
            self.lane.set_down(true);
            let (msgs, in_pieces) = self.lane.take_failed();
            if in_pieces {
                s.give_up_pieces();
            }
            failed_on_down = msgs;
        }
        // Up again (after any Down of this turn): sends are taken from now on, in this
        // turn too, so that a sender that saw the peer connected (the state mirror below)
        // is not refused as down by a lane that has not heard yet.
        if events.iter().rev().find_map(|e| match e {
            SessionEvent::Up { .. } => Some(true),
            SessionEvent::Down { .. } => Some(false),
            _ => None,
        }) == Some(true)
        {
            self.lane.set_down(false);
        }
        let deadline = s.poll_timeout();
        let (due_after, full_after, empty_after, bulk_after) = (
            due(&s),
            s.window_full(),
            s.window_messages() == 0,
            s.bulk_room(),
        );
        // A writer waiting to say goodbye waits for a delivery in progress to end.
        let delivered = delivering_before && !s.delivering() && s.is_closing();
        // The mirrors are written under the lock, so they follow the session's order.
        // (Only written under the session lock: a load and a store, no read-modify-write
        // per turn.)
        let code = state_code(s.state());
        let changed = self.state.load(Ordering::Relaxed) != code;
        if changed {
            self.state.store(code, Ordering::Release);
        }
        let came_up = changed && s.state() == PeerState::Up;
        let write_due =
            due_after || s.is_closing() || s.current().is_some_and(|c| s.has_unwritten(c));
        self.write_due.store(write_due, Ordering::Release);
        self.window_full.store(full_after, Ordering::Release);
        self.bulk_room.store(bulk_after, Ordering::Release);
        drop(s);
        // Waiters for connected peers count only those up (`Runtime::connected_peers`): the
        // connection was installed in this turn, before the mirror said so.
        if came_up {
            self.ctx.conns.changed();
        }
        if full_before && !full_after {
            self.wake_senders();
        }
        // Control newly due wakes the writer unless this thread leads the connection and
        // writes it itself (see `control`).
        let others = (full_before && !full_after)
            || (empty_after && !empty_before)
            || (bulk_after && !bulk_before)
            || delivered;
        if others || (due_after && !due_before && !control::defer(self)) {
            self.lane.poke();
        }
        if let Some(t) = deadline {
            self.schedule(t);
        }
        for e in events {
            self.dispatch(e, &mut failed_on_down);
        }
        r
    }

    /// Hand back everything queued in this peer's lane as failed. Not while dispatching
    /// (it takes the session).
    pub fn fail_queued(&self, reason: FailReason) {
        let (msgs, in_pieces) = self.lane.take_failed();
        if in_pieces {
            self.session(|s, _| s.give_up_pieces());
        }
        self.report_failed(msgs, reason);
    }

    /// The peer's messages in pieces (the caller has the delivery turn).
    /// Whether the peer was removed from the registry.
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Remove it if it holds nothing: no live connection, nothing queued, nothing
    /// unacknowledged, nothing in pieces, not pinned. Its lane then refuses messages and
    /// its writer ends. Returns whether it was removed.
    pub fn remove_if_idle(&self) -> bool {
        if self.pinned.load(Ordering::Acquire)
            || self.current().is_some_and(|c| !c.is_closed())
            || self.lane.queued() > 0
            || !self.lock_reassembly().is_empty()
        {
            return false;
        }
        // One decision under the session lock (every hold into the window takes it) and
        // the lane's (every send and every take): the window is empty, and the lane holds
        // nothing and has nothing on its way into the window (a sender's write-through
        // batch, the writer's batch or piece), so it closes with nothing that could still
        // be held. Deciding in steps let a message taken out of the lane meanwhile be held
        // in the window of a removed peer, which nothing writes or fails.
        let removed = self.session(|s, _| {
            let idle =
                s.window_bytes() == 0 && s.window_messages() == 0 && self.lane.close_if_at_rest();
            if idle {
                self.removed.store(true, Ordering::Release);
                // The registry's lock-free index may keep the peer (see `peers::Index`):
                // what it held for reuse goes now.
                s.release_buffers();
            }
            idle
        });
        if removed {
            self.lane.poke();
        }
        removed
    }

    /// Whether what is taken for the window may be held there: not if the peer is down
    /// (or said goodbye), nor once it was removed (nothing would write it). Call with the
    /// session lock: the removal is decided under it.
    pub fn holdable(&self, s: &Session) -> Result<(), FailReason> {
        if self.is_removed() {
            return Err(FailReason::Down(DownReason::Membership));
        }
        s.holdable()
    }

    /// Whether the node's reassembly budget has room for a message of `total` bytes.
    pub fn reassembly_has_room(&self, total: u64) -> bool {
        self.ctx.reassembly.has_room(total)
    }

    /// Bytes of messages in pieces committed node-wide.
    pub fn reassembly_committed(&self) -> u64 {
        self.ctx.reassembly.used()
    }

    pub fn lock_reassembly(&self) -> ReassemblyGuard<'_> {
        ReassemblyGuard {
            g: self.reassembly.lock().unwrap_or_else(|p| p.into_inner()),
            budget: &self.ctx.reassembly,
        }
    }

    /// Messages the peer gave up in pieces: what they charged goes back to it.
    pub fn abandon(&self, gone: Vec<Abandoned>) {
        for a in gone {
            if a.kept {
                self.flow.release(a.to.as_bytes(), a.charged);
            }
        }
    }

    /// Count, log and report messages that will never be delivered, with their payloads.
    pub fn report_failed(&self, msgs: Vec<Message>, reason: FailReason) {
        if msgs.is_empty() {
            return;
        }
        let count = msgs.len() as u64;
        self.stats.send_failed.fetch_add(count, Ordering::Relaxed);
        warn_limited!(node = %self.ctx.node, peer = %self.name, messages = count, %reason, "messages handed back as failed");
        let messages = msgs
            .into_iter()
            .map(|m| FailedMessage {
                to: Address::from_names(self.name.clone(), m.to),
                from: m.from.to_string(),
                payload: m.payload,
            })
            .collect();
        self.ctx.events.emit(Event::SendFailed {
            peer: self.name.to_string(),
            count,
            reason,
            messages,
        });
    }

    /// Where the peer stands (no lock).
    pub fn state(&self) -> PeerState {
        match self.state.load(Ordering::Acquire) {
            1 => PeerState::Up,
            2 => PeerState::Down,
            _ => PeerState::Connecting,
        }
    }

    /// Whether the send window is full (no lock).
    pub fn window_full(&self) -> bool {
        self.window_full.load(Ordering::Acquire)
    }

    /// Whether the session has room for another piece (no lock).
    pub fn bulk_room(&self) -> bool {
        self.bulk_room.load(Ordering::Acquire)
    }

    /// Transfer-queue: wait until the window has room, the peer is down or `stop()` says
    /// so. Returns whether there is room (and the peer is not down).
    pub fn wait_room(&self, stop: &dyn Fn() -> bool) -> bool {
        let mut g = self.room_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.state() == PeerState::Down || stop() {
                return false;
            }
            if !self.window_full() {
                return true;
            }
            g = self
                .room
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn wake_senders(&self) {
        let mut g = self.room_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.room.notify_all();
        g.wake_all();
    }

    /// The node's requests in flight (replies from this peer complete them).
    pub fn calls(&self) -> &Calls {
        &self.ctx.calls
    }

    /// Transfer-queue: wake `w` when the window may have room (or the peer went down).
    pub fn register_room(&self, w: &Waker, ticket: &mut Ticket) {
        self.room_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(w, ticket);
    }
}

/// Fixtures of the io layer's tests: a peer of its own (no node around it), connected
/// over a link the test holds the other end of.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::io::link::Link;
    use batchwire_core::frame::Resume;
    use batchwire_core::session::SessionConfig;

    /// A peer "p" of a node "me", with a session of `cfg`.
    pub fn peer(cfg: SessionConfig) -> Arc<Peer> {
        let ctx = Arc::new(PeerCtx {
            node: Name::from_static("me"),
            events: Events::new(64),
            timer: Timer::new(),
            conns: ConnWatch::default(),
            calls: Arc::new(Calls::new(16, 0)),
            reassembly: ReassemblyBudget::new(u64::MAX),
            hooks: OnceLock::new(),
        });
        let lane = crate::io::lane::test_lane();
        let flow = Arc::new(Flow::new(1 << 20, 1 << 20, lane.clone()));
        let session = Session::new(cfg, Instant::now());
        Peer::new(0, Name::from_static("p"), ctx, session, lane, flow)
    }

    /// Give `peer` the hooks a node gives its peers (how writers start).
    pub fn set_hooks(peer: &Peer, hooks: super::Hooks) {
        assert!(peer.ctx.hooks.set(hooks).is_ok(), "hooks set once");
    }

    /// Connect `peer`'s session (both RESUMEs from scratch) over `link` and make it the
    /// current connection.
    pub fn connect(peer: &Peer, link: Link) -> Arc<Conn> {
        let id = peer.session(|s, now| {
            let (id, _) = s.handle_connect(now, 1);
            s.handle_resume(now, id, Resume::FRESH).unwrap();
            id
        });
        let conn = Arc::new(Conn::new(id, Arc::new(link)));
        peer.install(conn.clone());
        conn
    }
}

#[cfg(test)]
mod tests;
