//! One peer's protocol state as a sans-IO state machine: sequencing, acknowledgements,
//! RESUME reconciliation, liveness (heartbeats and the failure detector) and the goodbye
//! sequence. Every input takes `now`; outputs are pulled.
//!
//! The methods come in four groups, in the manner of quinn-proto's `Connection`:
//! - **getters**: [`Session::state`], [`Session::window_full`], [`Session::current`], ...
//! - **inputs**, `handle_*`: a connection authenticated the peer ([`Session::handle_connect`]),
//!   its RESUME arrived ([`Session::handle_resume`]), the connection ended, an ACK or GOODBYE
//!   arrived, bytes were heard, a frame of messages is being delivered
//!   ([`Session::begin_delivery`] / [`Session::end_delivery`]), the local consumer paused the
//!   reader ([`Session::set_paused`]), time passed ([`Session::handle_timeout`]);
//! - **the send path**: [`Session::hold`] numbers a batch and keeps it until acknowledged,
//!   [`Session::unwritten`] / [`Session::mark_written`] feed the connection;
//! - **outputs**, `poll_*`: control frames for the connection ([`Session::poll_control`]:
//!   acknowledgements and heartbeats, never behind data), events ([`Session::poll_event`]),
//!   the next deadline ([`Session::poll_timeout`]) and the goodbye ([`Session::poll_close`]).
//!
//! The order to call them: after any input, drain `poll_event` (and act on `Close`), and
//! give the writer a chance to `poll_control`; after any input that may move a deadline,
//! re-read `poll_timeout`.
//!
//! Rules kept here:
//! - **Control before data.** An acknowledgement or heartbeat is due whatever the state of
//!   the send window: a full window stops data, never control.
//! - **Liveness is not progress.** The peer is declared down only if nothing was heard from
//!   it for `peer_timeout` while this node was listening. While the local consumer is full
//!   and the reader waits for it ([`Session::set_paused`]), silence is not counted.
//! - **Values from the peer are checked.** Acknowledgements and RESUME values beyond what was
//!   sent, gaps and overflows are [`SeqError`]s: the caller closes the connection, and
//!   nothing in the windows changes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::bulk::Piece;
use crate::codec::Name;
use crate::frame::{Frame, Message, Resume};

/// RESUMEs in a row that could not be honoured before the session is reset (see
/// [`Session::is_unresumable`]).
pub const RESET_AFTER: u32 = 3;

mod events;
use crate::reliable::{RecvWindow, SendWindow, SeqError, Unwritten};
pub use events::{ConnId, DownReason, FailReason, SessionEvent};

/// Bytes delivered since the last acknowledgement above which a reader that has drained
/// its socket acknowledges at once ([`Session::handle_idle`]). Below it (a request now and
/// then) the acknowledgement waits for `ack_delay`, as TCP's delayed ACK does.
pub const IDLE_ACK_BYTES: usize = 16 << 10;

/// The session's knobs (a node's configuration passes them on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Keep what was written until acknowledged and resend after a break. Off, written
    /// data is dropped at once (the unsequenced baseline).
    pub reliable: bool,
    /// Most bytes held for the peer (written and unacknowledged, or not yet written).
    pub unacked_bytes: usize,
    /// Acknowledge after this many messages delivered...
    pub ack_every: u64,
    /// ...or this many bytes...
    pub ack_every_bytes: usize,
    /// ...or this long after the first unacknowledged delivery.
    pub ack_delay: Duration,
    /// Send a heartbeat when nothing was written for this long.
    pub heartbeat_interval: Duration,
    /// Declare the peer down when nothing was heard for this long (while listening), or
    /// when it was unreachable for this long.
    pub peer_timeout: Duration,
    /// Most bytes of pieces (the bulk lane) held unacknowledged while ordinary messages
    /// flow: they never wait behind more bulk data than this.
    pub bulk_inflight: usize,
    /// Most bytes of pieces held unacknowledged once bulk has the connection to itself:
    /// after this many bytes of pieces were held with no ordinary message held between
    /// them. The first ordinary message held brings the budget back to `bulk_inflight`.
    /// At most `bulk_inflight` means one budget.
    pub bulk_stream: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            reliable: true,
            unacked_bytes: 16 << 20,
            ack_every: 4096,
            ack_every_bytes: 1 << 20,
            ack_delay: Duration::from_millis(5),
            heartbeat_interval: Duration::from_millis(500),
            peer_timeout: Duration::from_secs(3),
            bulk_inflight: 128 << 10,
            bulk_stream: 2 << 20,
        }
    }
}

/// Where the peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Never connected yet: what is sent waits for the first connection.
    Connecting,
    /// Connected, or briefly disconnected and not yet declared down.
    Up,
    /// Declared down: what was pending was handed back; sends fail until it is back.
    Down,
}

/// What a successful RESUME did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resumed {
    /// The connection this one replaces (close it).
    pub replaced: Option<ConnId>,
    /// Messages that will be written again.
    pub resent: u64,
    /// Messages the RESUME acknowledged (the peer had them; they are released now, as an
    /// ACK would have released them).
    pub acked: u64,
    /// The peer goes on with no message in pieces whose id is below this: drop what was
    /// reassembled of those.
    pub keep: u64,
}

/// Why [`Session::hold_piece`] did not number a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceRefused {
    /// Nothing more is held for the peer (down, or the goodbye was said): leave the message
    /// queued; it is handed back from there with this reason.
    Failed(FailReason),
    /// The peer restarted since the message's first piece: send it again from the start.
    Restart,
}

/// A frame of messages being delivered: what to skip, and where it ends. Hand it back to
/// [`Session::end_delivery`] with how far delivery got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    epoch: u64,
    /// The frame's first sequence number.
    pub first: u64,
    /// Leading messages delivered before: skip them.
    pub skip: u32,
    /// One past the frame's last sequence number.
    pub end: u64,
}

#[derive(Debug, Clone, Copy)]
struct Current {
    id: ConnId,
    last_heard: Instant,
    last_sent: Instant,
}

/// One peer's protocol state. See the module documentation.
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    state: PeerState,
    incarnation: Option<u64>,
    send: SendWindow,
    recv: RecvWindow,
    /// Bumped when the peer's numbering restarts: a delivery begun before is void.
    recv_epoch: u64,
    /// Times the session was reset ([`Session::handle_reset`]).
    resets: u64,
    /// RESUMEs from the peer that could not be honoured since the last one that could.
    unresumable: u32,
    next_conn: u64,
    current: Option<Current>,
    /// When the last connection ended (or the session began), while not connected.
    disconnected_since: Instant,
    /// Disconnected with nothing pending either way (see [`Session::park`]): not
    /// unreachable, only not connected, until something is held for the peer.
    parked: bool,
    /// Readers waiting for a local consumer (silence is not counted meanwhile).
    paused: u32,
    unacked_messages: u64,
    unacked_bytes: usize,
    /// Bytes of pieces held since the last ordinary message was (see
    /// [`Session::bulk_room`]).
    bulk_alone: usize,
    ack_deadline: Option<Instant>,
    ack_due: bool,
    heartbeat_due: bool,
    /// Shutting down: give up on unacknowledged messages at this time.
    closing: Option<Instant>,
    said_goodbye: bool,
    /// A delivery is between `begin_delivery` and `end_delivery`.
    delivering: bool,
    /// The id of the message whose pieces are being numbered (its last is not yet).
    in_pieces: Option<u64>,
    down_reason: Option<DownReason>,
    events: VecDeque<SessionEvent>,
}

impl Session {
    /// A session for a peer not connected yet.
    pub fn new(cfg: SessionConfig, now: Instant) -> Session {
        Session {
            cfg,
            state: PeerState::Connecting,
            incarnation: None,
            send: SendWindow::default(),
            recv: RecvWindow::default(),
            recv_epoch: 0,
            resets: 0,
            unresumable: 0,
            next_conn: 1,
            current: None,
            disconnected_since: now,
            parked: false,
            paused: 0,
            unacked_messages: 0,
            unacked_bytes: 0,
            bulk_alone: 0,
            ack_deadline: None,
            ack_due: false,
            heartbeat_due: false,
            closing: None,
            said_goodbye: false,
            delivering: false,
            in_pieces: None,
            down_reason: None,
            events: VecDeque::new(),
        }
    }

    // ---- getters ----------------------------------------------------------------------

    /// Where the peer stands.
    pub fn state(&self) -> PeerState {
        self.state
    }

    /// The peer's incarnation when last connected.
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// The current connection (after its RESUME).
    pub fn current(&self) -> Option<ConnId> {
        self.current.map(|c| c.id)
    }

    /// Bytes held for the peer.
    pub fn window_bytes(&self) -> usize {
        self.send.bytes()
    }

    /// Messages held for the peer.
    pub fn window_messages(&self) -> u64 {
        self.send.messages()
    }

    /// Whether the send window is full for ordinary messages: take no more of them until
    /// acknowledgements come. (Pieces have a budget of their own, see `bulk_room`.)
    pub fn window_full(&self) -> bool {
        self.send.bytes() - self.send.bulk_bytes() >= self.cfg.unacked_bytes
    }

    /// Whether another piece may be held: the bulk bytes held are below the bulk budget.
    /// That budget is the bulk lane's own, beside the ordinary window, so a flood of
    /// ordinary messages cannot starve bulk (it keeps `bulk_inflight` in flight per
    /// acknowledgement round trip), and ordinary messages never queue behind more than
    /// `bulk_inflight` bytes of pieces. Once `bulk_stream` bytes of pieces went with no
    /// ordinary message between them, nothing is waiting behind bulk: the budget is
    /// `bulk_stream` until the next ordinary message is held (a small budget stopped a
    /// stream of large messages for an acknowledgement round trip every 128 KiB: 0.2-0.4
    /// GB/s against 1.3 GB/s with 1 MiB on loopback).
    pub fn bulk_room(&self) -> bool {
        self.send.bulk_bytes() < self.bulk_budget()
    }

    /// The bulk budget now (see [`Session::bulk_room`]).
    pub fn bulk_budget(&self) -> usize {
        let stream = self.cfg.bulk_stream.max(self.cfg.bulk_inflight);
        if self.bulk_alone >= stream {
            stream
        } else {
            self.cfg.bulk_inflight
        }
    }

    /// Bytes of pieces held (see [`Session::bulk_room`]).
    pub fn bulk_bytes(&self) -> usize {
        self.send.bulk_bytes()
    }

    /// The next sequence number expected from the peer.
    pub fn recv_next(&self) -> u64 {
        self.recv.next()
    }

    /// Call `f(mailbox, charge)` for every message (and piece) held from sequence number
    /// `from` on (a credit recount: see `credit`).
    pub fn charges_from(&self, from: u64, f: impl FnMut(&Name, u64)) {
        self.send.charges_from(from, f)
    }

    /// Whether a delivery is in progress (between `begin_delivery` and `end_delivery`).
    pub fn delivering(&self) -> bool {
        self.delivering
    }

    /// Whether this node is shutting down (see [`Session::begin_close`]).
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// Why the peer was last declared down.
    pub fn down_reason(&self) -> Option<DownReason> {
        self.down_reason
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    // ---- connection lifecycle ---------------------------------------------------------

    /// A new connection authenticated the peer as `incarnation`. Returns the connection's
    /// id and the RESUME to send on it first. A new incarnation means the peer restarted:
    /// what was pending for the old one is failed and numbering starts again both ways.
    pub fn handle_connect(&mut self, now: Instant, incarnation: u64) -> (ConnId, Resume) {
        let _ = now;
        if self.incarnation.is_some_and(|i| i != incarnation) {
            self.start_over(FailReason::Restarted);
            self.events
                .push_back(SessionEvent::Restarted { incarnation });
        }
        self.incarnation = Some(incarnation);
        self.parked = false;
        let id = ConnId::new(self.next_conn);
        self.next_conn += 1;
        let resume = Resume {
            next: self.recv.next(),
            base: self.send.base(),
            keep: self.keep(),
        };
        (id, resume)
    }

    /// The peer's RESUME on connection `id`: drop what it has, resend the rest, and make
    /// `id` the current connection. A RESUME claiming more than was sent is a violation
    /// (nothing changes).
    pub fn handle_resume(
        &mut self,
        now: Instant,
        id: ConnId,
        theirs: Resume,
    ) -> Result<Resumed, SeqError> {
        let before = self.send.messages();
        let base = self.send.base();
        if let Err(e) = self.send.rewind(theirs.next) {
            self.unresumable += 1;
            return Err(e);
        }
        self.unresumable = 0;
        self.recv.resume(theirs.base);
        let replaced = self.current.replace(Current {
            id,
            last_heard: now,
            last_sent: now,
        });
        self.heartbeat_due = false;
        if self.state != PeerState::Up {
            self.state = PeerState::Up;
            self.events.push_back(SessionEvent::Up {
                incarnation: self.incarnation.unwrap_or(0),
            });
        }
        Ok(Resumed {
            replaced: replaced.map(|c| c.id),
            // Written before and not had by the peer: what goes out again (messages held
            // while no connection was up go out for the first time).
            resent: if before > 0 {
                self.send.sent().saturating_sub(self.send.base())
            } else {
                0
            },
            acked: self.send.base() - base,
            keep: theirs.keep,
        })
    }

    /// The session cannot be resumed: a RESUME (`handle_resume`'s error) claimed more than
    /// was sent, so the two ends' numbering disagrees (a peer that logged in under this
    /// one's name and incarnation sent messages, or a bug). Refusing every RESUME would
    /// cut the link for good; instead the session starts over as if the peer had
    /// restarted: what was pending is failed (reported to its senders), numbering starts
    /// again both ways, and the current connection, if any, is dropped. The IO layer tells
    /// the peer (REFUSE with [`crate::frame::RefuseCode::Reset`]), which resets its end
    /// too; until it does, its RESUMEs fail here again and are answered the same way.
    pub fn handle_reset(&mut self, now: Instant) {
        let _ = now;
        self.start_over(FailReason::Reset);
        if let Some(c) = self.current.take() {
            self.events.push_back(SessionEvent::Close { conn: c.id });
            self.disconnected_since = now;
        }
        self.resets += 1;
        self.unresumable = 0;
        self.events.push_back(SessionEvent::Reset);
    }

    /// Whether the peer's RESUMEs could not be honoured [`RESET_AFTER`] times in a row (no
    /// successful resume in between): the numbering really disagrees, and the session
    /// should be reset ([`Session::handle_reset`]). One or two may be a forger's values
    /// on connections of its own, which only close those connections.
    pub fn is_unresumable(&self) -> bool {
        self.unresumable >= RESET_AFTER
    }

    /// Sessions reset so far ([`Session::handle_reset`]).
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Fail what is pending and number from 0 again both ways.
    fn start_over(&mut self, reason: FailReason) {
        let messages = self.send.take_failed(true);
        self.push_failed(messages, reason);
        self.recv.reset();
        self.recv_epoch += 1;
        self.unacked_messages = 0;
        self.unacked_bytes = 0;
        self.in_pieces = None;
    }

    /// Connection `id` ended. Unsequenced, what it had not written is failed.
    pub fn handle_disconnect(&mut self, now: Instant, id: ConnId) {
        if self.current.is_some_and(|c| c.id == id) {
            self.current = None;
            self.disconnected_since = now;
            self.heartbeat_due = false;
            if !self.cfg.reliable {
                let messages = self.send.take_failed(false);
                self.push_failed(messages, FailReason::ConnectionLost);
            }
        }
    }

    /// Not connected, and nothing is pending either way: nothing held for the peer, nothing
    /// delivered from it unacknowledged, no delivery under way. Connections may then be closed
    /// for idleness (see [`Session::park`]).
    pub fn is_quiet(&self) -> bool {
        self.send.messages() == 0
            && self.unacked_messages == 0
            && !self.ack_due
            && !self.delivering
            && self.in_pieces.is_none()
    }

    /// Call after [`Session::handle_disconnect`] when connections are made only while there
    /// is traffic and a membership judges whether the peer lives: if the session
    /// [is quiet](Session::is_quiet), the peer is not held unreachable while not connected
    /// (no connection is wanted). The first message held afterwards starts the clock
    /// again: a connection must come within `peer_timeout` of it. Returns whether it parked.
    pub fn park(&mut self) -> bool {
        if self.current.is_some() || self.state != PeerState::Up || !self.is_quiet() {
            return false;
        }
        self.parked = true;
        true
    }

    /// Parked (see [`Session::park`]).
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    fn is_current(&self, id: ConnId) -> bool {
        self.current.is_some_and(|c| c.id == id)
    }

    // ---- frames from the peer ---------------------------------------------------------

    /// Bytes arrived on connection `id`: the peer is alive.
    pub fn handle_heard(&mut self, now: Instant, id: ConnId) {
        if let Some(c) = self.current.as_mut().filter(|c| c.id == id) {
            c.last_heard = now;
        }
    }

    /// The peer acknowledged every message below `next`. Returns how many messages that
    /// freed; one above what was sent is a violation (nothing changes). Ignored on a
    /// connection that is no longer current.
    pub fn handle_ack(&mut self, now: Instant, id: ConnId, next: u64) -> Result<u64, SeqError> {
        if !self.is_current(id) {
            return Ok(0);
        }
        self.handle_heard(now, id);
        if next > self.send.sent() {
            return Err(SeqError::AckBeyondSent {
                ack: next,
                sent: self.send.sent(),
            });
        }
        if !self.cfg.reliable {
            return Ok(0);
        }
        let base = self.send.base();
        self.send.ack(next)?;
        Ok(self.send.base() - base)
    }

    /// The peer said goodbye on connection `id`: it will acknowledge nothing more, so it
    /// is declared down and what it did not acknowledge is failed.
    pub fn handle_goodbye(&mut self, now: Instant, id: ConnId) {
        if self.is_current(id) {
            self.current = None;
            self.disconnected_since = now;
            self.declare_down(DownReason::Left);
        }
    }

    /// A MESSAGES frame numbered `first .. first + count` arrived on connection `id`.
    /// `Ok(None)`: the connection is no longer current, deliver nothing (its successor
    /// resends). Otherwise deliver from `skip` on and call [`Session::end_delivery`]. Only
    /// one delivery of a peer may be in progress at a time (the caller serializes them).
    pub fn begin_delivery(
        &mut self,
        id: ConnId,
        first: u64,
        count: u32,
    ) -> Result<Option<Delivery>, SeqError> {
        // After the goodbye nothing more is delivered: the peer fails what it did not see
        // acknowledged in it.
        if !self.is_current(id) || self.said_goodbye {
            return Ok(None);
        }
        let skip = self.recv.check(first, count)?;
        self.delivering = true;
        Ok(Some(Delivery {
            epoch: self.recv_epoch,
            first,
            skip,
            end: first + count as u64,
        }))
    }

    /// Messages of `d` were delivered up to (not including) sequence number `upto`,
    /// carrying `bytes` bytes. Returns whether an acknowledgement became due now (wake the
    /// writer); otherwise one may be due at the new [`Session::poll_timeout`].
    pub fn end_delivery(&mut self, now: Instant, d: Delivery, upto: u64, bytes: usize) -> bool {
        self.delivering = false;
        if d.epoch != self.recv_epoch {
            return false;
        }
        let before = self.recv.next();
        self.recv.commit(d.first, upto.min(d.end));
        let delivered = self.recv.next().saturating_sub(before.max(d.first));
        if delivered == 0 || !self.cfg.reliable {
            return false;
        }
        self.unacked_messages += delivered;
        self.unacked_bytes += bytes;
        if self.unacked_messages >= self.cfg.ack_every
            || self.unacked_bytes >= self.cfg.ack_every_bytes
        {
            self.ack_due = true;
            self.ack_deadline = None;
            return true;
        }
        if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.cfg.ack_delay);
        }
        false
    }

    /// The reader of connection `id` has taken everything that had arrived and is about to
    /// wait for more. If at least [`IDLE_ACK_BYTES`] were delivered since the last
    /// acknowledgement, one is due now rather than after `ack_delay`: a sender whose window
    /// is full is waiting for exactly that. Returns whether an acknowledgement became due.
    pub fn handle_idle(&mut self, id: ConnId) -> bool {
        if !self.is_current(id) || !self.cfg.reliable || self.ack_due {
            return false;
        }
        if self.unacked_bytes >= IDLE_ACK_BYTES {
            self.ack_due = true;
            self.ack_deadline = None;
            return true;
        }
        false
    }

    /// A reader of this peer starts (`true`) or stops (`false`) waiting for a local consumer
    /// (a full mailbox). Meanwhile silence from the peer is not held against it.
    pub fn set_paused(&mut self, now: Instant, paused: bool) {
        if paused {
            self.paused += 1;
        } else {
            self.paused = self.paused.saturating_sub(1);
            if let Some(c) = self.current.as_mut() {
                c.last_heard = c.last_heard.max(now);
            }
        }
    }

    // ---- the send path ----------------------------------------------------------------

    /// Whether [`Session::hold`] may take more: not once the peer is down (the reason) or
    /// the goodbye was said (this node shut down).
    pub fn holdable(&self) -> Result<(), FailReason> {
        match (self.state, self.down_reason) {
            (PeerState::Down, Some(r)) => Err(FailReason::Down(r)),
            _ if self.said_goodbye => Err(FailReason::ShutDown),
            _ => Ok(()),
        }
    }

    /// Number encoded MESSAGES frames (each with its message count) and hold them until
    /// acknowledged (or, unsequenced, until written). Returns the message count.
    pub fn hold(&mut self, frames: &[(&[u8], u32)]) -> u64 {
        self.bulk_alone = 0;
        self.send.hold(frames)
    }

    /// [`Session::hold`] for a bundler's batch: a large one's buffer moves into the window
    /// instead of being copied, and the batch gets a free one back (see
    /// [`SendWindow::hold_batch`]).
    pub fn hold_batch(&mut self, batch: &mut crate::outbox::Batch) -> u64 {
        self.bulk_alone = 0;
        self.send.hold_batch(batch)
    }

    /// Number one piece of a message in pieces and hold it (see `bulk`). Returns the
    /// message's id. A later piece is numbered only if its message's first piece was
    /// numbered for this incarnation of the peer (else [`PieceRefused::Restart`]).
    pub fn hold_piece(&mut self, p: &Piece) -> Result<u64, PieceRefused> {
        self.holdable().map_err(PieceRefused::Failed)?;
        if !p.is_first() && (p.id.is_none() || self.in_pieces != p.id) {
            return Err(PieceRefused::Restart);
        }
        let seq = self.send.hold_piece(p);
        self.bulk_alone = self.bulk_alone.saturating_add(p.len);
        let id = if p.is_first() {
            seq
        } else {
            p.id.unwrap_or(seq)
        };
        self.in_pieces = (!p.is_last()).then_some(id);
        Ok(id)
    }

    /// The lowest id of a message in pieces this side will complete: the one being
    /// numbered, or one whose pieces (its last among them) are in the window, to be resent
    /// after a break. Below it, every message was acknowledged whole or given up; the peer
    /// drops what it has of those, and their pieces that still come.
    fn keep(&self) -> u64 {
        let numbering = self.in_pieces.unwrap_or(self.send.next_seq());
        self.send
            .oldest_piece_id(self.in_pieces)
            .map_or(numbering, |id| id.min(numbering))
    }

    /// The message in pieces was handed back before its last piece (its queue was emptied):
    /// the next RESUME tells the peer to drop what it has of it.
    pub fn give_up_pieces(&mut self) {
        self.in_pieces = None;
    }

    /// What the current connection has not been given yet, oldest first, with the
    /// generation to pass to [`Session::mark_written`]. Nothing before the RESUME.
    pub fn unwritten(&mut self, id: ConnId) -> Unwritten {
        if !self.is_current(id) || !self.send.has_unwritten() {
            return Unwritten {
                generation: self.send.generation(),
                ..Unwritten::default()
            };
        }
        self.send.unwritten()
    }

    /// What [`Session::unwritten`] of generation `generation` gave, up to (not including)
    /// sequence number `end`, was written on connection `id`.
    pub fn mark_written(&mut self, now: Instant, id: ConnId, generation: u64, end: u64) {
        if !self.is_current(id) {
            return;
        }
        self.send.mark_written(generation, end);
        if !self.cfg.reliable {
            self.send.release_written();
        }
        self.note_sent(now, id);
    }

    /// Bytes (of any kind) were written on connection `id`.
    pub fn note_sent(&mut self, now: Instant, id: ConnId) {
        if let Some(c) = self.current.as_mut().filter(|c| c.id == id) {
            c.last_sent = c.last_sent.max(now);
        }
    }

    // ---- timers -----------------------------------------------------------------------

    /// Time passed: delayed acknowledgements, heartbeats, the failure detector, and the
    /// shutdown deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.ack_deadline.is_some_and(|t| now >= t) {
            self.ack_deadline = None;
            self.ack_due = true;
        }
        let hb = self.cfg.heartbeat_interval;
        let timeout = self.cfg.peer_timeout;
        if let Some(c) = self.current {
            if now >= c.last_sent + hb {
                self.heartbeat_due = true;
            }
            if self.state == PeerState::Up
                && self.paused == 0
                && now >= c.last_heard + timeout
                && self.closing.is_none()
            {
                self.current = None;
                self.disconnected_since = now;
                self.events.push_back(SessionEvent::Close { conn: c.id });
                self.declare_down(DownReason::Silent { after: timeout });
            }
        } else if self.parked {
            // Something was held since it parked: a connection is wanted from now on.
            if self.send.messages() > 0 {
                self.parked = false;
                self.disconnected_since = now;
            }
        } else if self.state == PeerState::Up
            && now >= self.disconnected_since + timeout
            && self.closing.is_none()
        {
            self.declare_down(DownReason::Unreachable { after: timeout });
        }
        if self.closing.is_some_and(|t| now >= t) && self.send.messages() > 0 {
            let messages = self.send.take_failed(false);
            self.push_failed(messages, FailReason::ShutDown);
        }
    }

    /// The cluster membership declared the peer's `incarnation` down (or it left): close
    /// its connection and declare it down now. Returns whether it did. A newer
    /// incarnation, already connected, is left alone; so is a peer heard on its current
    /// connection within `peer_timeout` (direct evidence comes before what the cluster
    /// says: if it really is gone, this session's own detector finds it).
    pub fn handle_declared_down(&mut self, now: Instant, incarnation: u64) -> bool {
        if self.incarnation.is_some_and(|i| i != incarnation) || self.closing.is_some() {
            return false;
        }
        if self
            .current
            .is_some_and(|c| now < c.last_heard + self.cfg.peer_timeout)
        {
            return false;
        }
        if let Some(c) = self.current.take() {
            self.disconnected_since = now;
            self.events.push_back(SessionEvent::Close { conn: c.id });
        }
        self.declare_down(DownReason::Membership);
        true
    }

    /// The cluster membership says the peer is back (it joined again, perhaps as a new
    /// incarnation) while this session holds it down: sends are taken again and wait for a
    /// connection as for a peer never connected (with connections on demand the first one
    /// dials). If it is not back after all, the membership declares it down again.
    /// Returns whether it was down.
    /// `incarnation` is the one the membership reports: a new one starts the session over
    /// now (as a connection to it would), so what is sent from now on is for it.
    pub fn handle_member_back(&mut self, incarnation: u64) -> bool {
        if self.state != PeerState::Down || self.closing.is_some() {
            return false;
        }
        if self.incarnation.is_some_and(|i| i != incarnation) {
            self.start_over(FailReason::Restarted);
            self.events
                .push_back(SessionEvent::Restarted { incarnation });
        }
        self.incarnation = Some(incarnation);
        self.state = PeerState::Connecting;
        self.down_reason = None;
        true
    }

    /// The peer's incarnation if its current connection was heard within `peer_timeout`
    /// (a live node holds the name: another incarnation claiming it is refused).
    pub fn live_incarnation(&self, now: Instant) -> Option<u64> {
        self.current
            .filter(|c| now < c.last_heard + self.cfg.peer_timeout)
            .and(self.incarnation)
    }

    /// When [`Session::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.peer_timeout;
        let mut t = self.ack_deadline;
        let mut at = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        match self.current {
            Some(c) => {
                if !self.heartbeat_due {
                    at(c.last_sent + self.cfg.heartbeat_interval);
                }
                if self.state == PeerState::Up && self.paused == 0 && self.closing.is_none() {
                    at(c.last_heard + timeout);
                }
            }
            // Parked with something held since: due now (the clock starts again).
            None if self.parked && self.send.messages() > 0 => at(self.disconnected_since),
            None if self.parked => {}
            None if self.state == PeerState::Up && self.closing.is_none() => {
                at(self.disconnected_since + timeout)
            }
            None => {}
        }
        if let Some(deadline) = self.closing.filter(|_| self.send.messages() > 0) {
            at(deadline);
        }
        t
    }

    // ---- outputs ----------------------------------------------------------------------

    /// The next control frame for connection `id`: an acknowledgement (which is also the
    /// heartbeat) when one is due. Due whatever the send window holds. The frame counts as
    /// sent at `now` (the caller writes it next), so the heartbeat clock restarts here.
    pub fn poll_control(&mut self, now: Instant, id: ConnId) -> Option<Frame> {
        if !self.is_current(id) || !(self.ack_due || self.heartbeat_due) {
            return None;
        }
        self.note_sent(now, id);
        self.ack_due = false;
        self.heartbeat_due = false;
        self.ack_deadline = None;
        self.unacked_messages = 0;
        self.unacked_bytes = 0;
        Some(Frame::Ack(self.recv.next()))
    }

    /// Whether [`Session::poll_control`] has something for connection `id`.
    pub fn control_due(&self, id: ConnId) -> bool {
        self.is_current(id) && (self.ack_due || self.heartbeat_due)
    }

    /// The next event to act on.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    // ---- shutdown ---------------------------------------------------------------------

    /// This node is shutting down: unacknowledged messages are given up at `deadline`.
    pub fn begin_close(&mut self, deadline: Instant) {
        self.closing = Some(deadline);
    }

    /// Shutting down, with nothing more `queued` to hold: once the peer has acknowledged
    /// everything (or the deadline passed and the rest was failed), the goodbye for
    /// connection `id`: a final acknowledgement, so the peer does not fail what arrived,
    /// then GOODBYE. Given once.
    pub fn poll_close(&mut self, now: Instant, id: ConnId, queued: bool) -> Option<[Frame; 2]> {
        self.handle_timeout(now);
        if self.closing.is_none() || self.said_goodbye || queued || !self.is_current(id) {
            return None;
        }
        let before_deadline = self.closing.is_some_and(|t| now < t);
        if self.cfg.reliable && self.send.messages() > 0 {
            return None;
        }
        // The final acknowledgement must cover a delivery in progress (unless time is up).
        if self.delivering && before_deadline {
            return None;
        }
        self.said_goodbye = true;
        Some([Frame::Ack(self.recv.next()), Frame::Goodbye])
    }

    /// Whether this session has nothing left to do at shutdown: it said goodbye, or the
    /// peer is not connected and nothing is held for it.
    pub fn is_closed(&self) -> bool {
        self.said_goodbye || (self.current.is_none() && self.send.messages() == 0)
    }

    /// Shutting down without a connection: fail whatever is held (there is nobody to say
    /// goodbye to).
    pub fn abandon(&mut self) {
        let messages = self.send.take_failed(false);
        self.push_failed(messages, FailReason::ShutDown);
    }

    // ---- internals ----------------------------------------------------------------------

    fn declare_down(&mut self, reason: DownReason) {
        if self.state == PeerState::Down {
            return;
        }
        self.state = PeerState::Down;
        self.parked = false;
        self.down_reason = Some(reason);
        // The rest of a message in pieces is handed back from the queue.
        self.in_pieces = None;
        self.events.push_back(SessionEvent::Down { reason });
        let messages = self.send.take_failed(false);
        self.push_failed(messages, FailReason::Down(reason));
    }

    fn push_failed(&mut self, messages: Vec<Message>, reason: FailReason) {
        if !messages.is_empty() {
            self.events
                .push_back(SessionEvent::Failed { messages, reason });
        }
    }
}

#[cfg(test)]
mod tests;
