//! What a peer costs only while there is traffic: its writer thread and, with connections on
//! demand ([`crate::config::NodeConfig::idle_close`]), its connection.
//!
//! - **The writer** runs while the peer has a connection or something queued: it is started
//!   when a connection is up (`Setup::run`, after RESUME) or a message is queued with none
//!   running, and ends when neither holds (see `write::run_writer`). Both sides of that hand-off store their flag
//!   and then look at the other's state (the lane under its lock), so one of them always
//!   sees the other: a message is never left queued with no writer.
//! - **The connection**, on demand: a send to a peer with no connection asks the node's
//!   dialers for one (once, until that dialer ends); the dialer dials while the peer has
//!   something pending or was asked for, and ends when a connection came (the peer may
//!   also have dialled us) or nothing is pending any more. A connection with no data either
//!   way for `idle_close` and nothing pending is closed by the writer, and both sessions
//!   park: neither end holds the other unreachable, and a later send dials again and
//!   resumes the same session (exactly once, in order).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use batchwire_core::codec::Name;
use tracing::warn;

use batchwire_core::session::PeerState;

use super::Peer;
use crate::io::conn::Conn;

/// Asks the node's dialers for a connection to the named peer.
pub(crate) type DialHook = Box<dyn Fn(&Name) + Send + Sync>;

/// How the node starts a peer's writer and asks for a connection (set once the node's
/// parts exist; a peer without them, in unit tests, has neither).
pub(crate) struct Hooks {
    pub spawn_writer: Box<dyn Fn(Arc<Peer>) -> std::io::Result<()> + Send + Sync>,
    /// Connections on demand: ask the dialers for a connection to this peer. `None`: every
    /// member is dialled when it joins (the mesh).
    pub dial: Option<DialHook>,
}

/// A peer's flags for the above. Read by every send (`after_push`) and written rarely: on
/// a cache line of their own, away from the counters the writer bumps every batch.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Demand {
    writer_running: AtomicBool,
    /// A live connection is installed (mirror of `Peer::conn`, for the send path).
    connected: AtomicBool,
    /// A connection was asked for and the dialer asked has not ended.
    dialing: AtomicBool,
    /// A connection was asked for with nothing to send yet (`Node::wait_for_peers`, a
    /// send refused while the peer was down): dial once even so. Cleared once connected.
    asked: AtomicBool,
}

impl Peer {
    /// After something was queued for this peer (the send path): its writer runs, and a
    /// connection is on its way. Two atomic loads when both hold.
    #[inline]
    pub fn after_push(&self) {
        if !self.demand.writer_running.load(SeqCst) {
            self.ensure_writer();
        }
        if !self.demand.connected.load(SeqCst) {
            // Refused because the peer is down: dial once anyway, to learn it is back.
            self.want_connection(self.state() == PeerState::Down);
        }
    }

    /// After the sender wrote a message through itself: no writer is started for it (what
    /// the socket did not take pokes one), but a connection is on its way.
    #[inline]
    pub fn after_push_through(&self) {
        if !self.demand.connected.load(SeqCst) {
            self.want_connection(self.state() == PeerState::Down);
        }
    }

    /// Start the writer unless it runs.
    pub fn ensure_writer(&self) {
        let d = &self.demand;
        if d.writer_running
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
        {
            return;
        }
        let (Some(h), Some(me)) = (self.ctx.hooks.get(), self.me.upgrade()) else {
            d.writer_running.store(false, SeqCst);
            return;
        };
        if let Err(e) = (h.spawn_writer)(me) {
            d.writer_running.store(false, SeqCst);
            warn!(node = %self.ctx.node, peer = %self.name, error = %e, "cannot start the peer's writer; will try again with the next message");
        } else {
            self.stats
                .writer_starts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The lane was poked (see `Lane::set_on_poke`): start the writer unless it runs, if
    /// there is something for it: queued, or (with a connection) control or data the
    /// session says is due, a carry, notices, credit. (A poke for room in the window, with
    /// nothing to write, starts none: a request and its reply would each start a thread.)
    pub(super) fn writer_wanted(&self) {
        if self.demand.writer_running.load(SeqCst) {
            return;
        }
        let wanted = !self.lane.is_at_rest()
            || (self.is_connected()
                && (self.write_due.load(std::sync::atomic::Ordering::Acquire)
                    || self.has_notices()
                    || self.flow.has_output()
                    || self
                        .current()
                        .is_some_and(|c| c.has_carry() || c.link.tls_pending())));
        if wanted {
            self.ensure_writer();
        }
    }

    /// Whether nothing is left to write on `c`, a connection written without waiting (a
    /// writer may rest: see `write::run_writer`): nothing queued or being written through,
    /// no carry, no TLS records waiting, no control, credit or notice due, nothing in the
    /// window that `c` has not had.
    pub fn nothing_to_write(&self, c: &Conn) -> bool {
        c.link.writes_without_waiting()
            && !c.has_carry()
            && !c.link.tls_pending()
            && self.lane.is_at_rest()
            && !self.has_notices()
            && !self.flow.has_output()
            && self
                .session(|s, _| !s.control_due(c.id) && !s.has_unwritten(c.id) && !s.is_closing())
    }

    /// The writer found nothing to do (no connection, nothing queued): it ends unless
    /// something came meanwhile (then it goes on and this returns false).
    pub fn writer_may_end(&self, has_work: impl Fn() -> bool) -> bool {
        let d = &self.demand;
        // Senders may write a lone message through from now on (this writer holds no
        // batch here). Said before the flag goes down, so a writer started after it says
        // the opposite last (never an ending writer after a running one: a sender writing
        // through beside a writer with a batch in hand could number after it).
        self.lane.set_writer_absent(true);
        d.writer_running.store(false, SeqCst);
        if !has_work() {
            return true;
        }
        // Something came: go on, unless another writer was started for it meanwhile.
        if d.writer_running
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
        {
            return true;
        }
        self.lane.set_writer_absent(false);
        false
    }

    pub(super) fn set_connected(&self, up: bool) {
        self.demand.connected.store(up, SeqCst);
        if up {
            self.demand.asked.store(false, SeqCst);
        }
    }

    /// Whether a live connection is installed (no lock).
    pub fn is_connected(&self) -> bool {
        self.demand.connected.load(SeqCst)
    }

    /// Ask for a connection (connections on demand; otherwise the mesh's dialers make
    /// them anyway). `asked`: even with nothing to send.
    pub fn want_connection(&self, asked: bool) {
        let d = &self.demand;
        if asked {
            d.asked.store(true, SeqCst);
        }
        let Some(dial) = self.ctx.hooks.get().and_then(|h| h.dial.as_ref()) else {
            return;
        };
        if d.dialing.swap(true, SeqCst) {
            return;
        }
        dial(&self.name);
    }

    /// No dialer could be started (the peer's address is not known yet, or no thread): a
    /// later want tries again.
    pub fn dial_unavailable(&self) {
        self.demand.dialing.store(false, SeqCst);
    }

    /// The dialer asked for ends (or could not start): a later want starts another. Returns
    /// whether a connection is still wanted (the caller then asks again).
    pub fn dial_ended(&self) -> bool {
        self.demand.dialing.store(false, SeqCst);
        !self.is_connected() && self.wants_connection()
    }

    /// Whether this peer needs a connection: something queued, held unacknowledged or
    /// owed either way (notices, acknowledgements, credit), or one was asked for.
    pub fn wants_connection(&self) -> bool {
        self.demand.asked.load(SeqCst) || !self.is_quiet()
    }

    /// Nothing queued, held unacknowledged or owed either way: a connection may close (see
    /// the module documentation).
    pub fn is_quiet(&self) -> bool {
        self.lane.queued() == 0
            && !self.has_notices()
            && self.flow.is_quiet()
            && self.lane.credit_settled()
            && self.session(|s, _| s.is_quiet())
    }

    /// The membership says the peer is back: if its session held it down, sends are taken
    /// again (see `Session::handle_member_back`).
    pub fn member_back(&self, incarnation: u64) {
        if self.state() == PeerState::Down && self.session(|s, _| s.handle_member_back(incarnation))
        {
            self.lane.set_down(false);
        }
    }

    /// A connection ended with connections on demand: park the session if the peer is
    /// quiet (nobody holds it unreachable meanwhile), else ask for a connection back.
    /// Returns whether it parked.
    pub fn park_or_redial(&self) -> bool {
        if self.is_quiet() && self.session(|s, _| s.park()) {
            return true;
        }
        if self.state() != PeerState::Down && !self.is_connected() {
            self.want_connection(false);
        }
        false
    }
}
