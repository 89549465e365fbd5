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
//! This file holds the state and the getters; the methods are in `session/`, a file per
//! group: `connection.rs` (connect, resume, reset, disconnect), `incoming.rs` (what the
//! peer sends), `outgoing.rs` (the send path), `timers.rs` (timers, outputs, shutdown).
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

mod connection;
mod events;
mod incoming;
mod outgoing;
mod timers;
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
    /// A peer never reached (or back from down) must be reached within this long of the
    /// first message held for it (see [`Session::require_reach`]); and since when
    /// something was held for it while it was not.
    reach: Option<std::time::Duration>,
    wanted: Option<Instant>,
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
            reach: None,
            wanted: None,
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

    /// Capacity of acknowledged buffers kept for the next batches (at most 8 MiB).
    pub fn spare_buffer_bytes(&self) -> usize {
        self.send.spare_bytes()
    }

    /// Let go of the buffers kept for reuse: the peer is gone for good (removed), though
    /// something may still refer to the session.
    pub fn release_buffers(&mut self) {
        self.send.release_buffers();
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

    /// For a credit recount after a SYNC as of message `from` that came on connection
    /// `on` (see `credit`): call `f(mailbox, charge)` for every message (and piece) held
    /// from `from` on, and return true. Returns false, and calls nothing, if `on` is no
    /// longer current or (reliable) the window no longer holds everything from `from` on
    /// (a RESUME or an ACK beyond `from` took some out): that SYNC is stale, and counting
    /// it would leave out what was taken out.
    pub fn charges_from(&self, on: ConnId, from: u64, f: impl FnMut(&Name, u64)) -> bool {
        // Unsequenced, the window keeps nothing once written: nothing to miss there.
        if !self.is_current(on) || (self.cfg.reliable && from < self.send.base()) {
            return false;
        }
        self.send.charges_from(from, f);
        true
    }

    /// Whether a delivery is in progress (between `begin_delivery` and `end_delivery`).
    pub fn delivering(&self) -> bool {
        self.delivering
    }

    /// Whether this node is shutting down (see [`Session::begin_close`]).
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// Whether the goodbye was given ([`Session::poll_close`]): nothing more is written to
    /// the peer in this session.
    pub fn said_goodbye(&self) -> bool {
        self.said_goodbye
    }

    /// Why the peer was last declared down.
    pub fn down_reason(&self) -> Option<DownReason> {
        self.down_reason
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests;
