//! One peer's whole data path as one sans-IO machine, after quinn-proto's `Connection`:
//! the session (sequencing, acknowledgements, RESUME, liveness, goodbye), the outbound
//! queues by class (ordinary messages in an outbox that a bundler drains, bulk messages
//! in pieces), the send
//! credit toward the peer's mailboxes, the receive credit this node gives it, and the
//! reassembly of what arrives in pieces. This is where IO v3 is going (issue 38): today
//! the core's two-node simulation (`lanes_tests`) drives it, and the IO layer still
//! composes the same parts under its own locks (`batchwire`'s `io/peer`, `lane`, `flow`,
//! `read`, `write`).
//!
//! Inputs take `now`; outputs are pulled. The calling order, per connection:
//! 1. [`Peer::handle_connect`] when a connection authenticated the peer (it returns the
//!    RESUME to send first), then [`Peer::handle_resume`] with the peer's RESUME;
//! 2. then, as often as wanted and in any order: [`Peer::send`] (the application),
//!    [`Peer::poll_transmit`] (the writer: control first, then data),
//!    [`Peer::handle_read`] (the reader: bytes off the connection), [`Peer::poll_delivery`]
//!    and [`Peer::handle_taken`] (a delivery was handed to its mailbox, and later taken
//!    out by the application), [`Peer::handle_timeout`] and [`Peer::poll_transmit`] when
//!    [`Peer::poll_timeout`] says (it holds the session's timers and a timer bundler's);
//! 3. after any input, drain [`Peer::poll_event`];
//! 4. [`Peer::handle_disconnect`] when the connection ends (the session stays);
//! 5. shutting down: [`Peer::begin_close`], then [`Peer::poll_transmit`] and
//!    [`Peer::poll_close`] until it has written the goodbye.
//!
//! What the session decides stays the session's: a peer found down has what is queued for
//! it handed back (a `Failed` event) and a message in pieces given up, in the same input
//! that found it down.
//!
//! This file holds the state, the getters and the first inputs (send, connect, resume);
//! `peer/` the rest: `read.rs` (bytes off the connection), `lifecycle.rs` (taken,
//! timeouts, disconnects, closing, the session's events) and `output.rs`.

mod lifecycle;
mod output;
mod read;

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use crate::bulk::{BulkQueue, ORDINARY_WEIGHT};
use crate::bundler::{Bundler, Decision, Natural};
use crate::codec::{Name, NameMap};
use crate::credit::{FlowError, RecvCredit, SendCredit};
use crate::frame::{
    self, Frame, FrameError, Message, RefuseCode, Resume, Undeliverable, message_len,
};
use crate::outbox::{Batch, Outbox};
use crate::reassembly::{Abandoned, Added, Reassembly, ReassemblyError};
use crate::reliable::SeqError;
use crate::session::{
    ConnId, FailReason, PieceRefused, Resumed, Session, SessionConfig, SessionEvent,
};

/// How a peer machine is set up.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The session's rules (window, acknowledgements, heartbeats, failure detector).
    pub session: SessionConfig,
    /// Messages larger than this go in pieces of at most this size.
    pub piece_bytes: usize,
    /// Most bytes of one MESSAGES frame in the outbox.
    pub frame_bytes: usize,
    /// Credit this node gives the peer toward each of its mailboxes.
    pub mailbox_bytes: u64,
    /// Largest payload this node accepts.
    pub max_payload: u64,
    /// Largest frame read from the peer.
    pub max_frame: usize,
}

/// A whole message for one of this node's mailboxes, charged to the peer's credit there:
/// give the charge back with [`Peer::handle_taken`] once the application took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The mailbox on this node.
    pub to: Name,
    /// The sending mailbox on the peer.
    pub from: Name,
    /// The payload (a slice of what was read, or the reassembled message).
    pub payload: Bytes,
    /// What it counts against the peer's credit toward `to`.
    pub charge: u64,
}

/// Why [`Peer::send`] did not queue a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendRefused {
    /// The destination mailbox's credit is used up: try again once the peer gives some
    /// back.
    Credit,
}

/// What the peer sent that breaks the protocol: the connection is to be closed (the
/// session stays, and resumes on the next one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// A frame that does not decode, or is too large.
    #[error("bad frame: {0}")]
    Frame(FrameError),
    /// A sequence number or acknowledgement outside what was sent.
    #[error("bad sequence number: {0}")]
    Sequence(SeqError),
    /// More than the credit this node gave.
    #[error("past its credit: {0}")]
    Credit(FlowError),
    /// A piece that does not fit the message it continues.
    #[error("bad piece: {0}")]
    Reassembly(ReassemblyError),
    /// A frame that has no place after the handshake (its kind).
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
    /// The peer could not resume the session and reset its end; this end was reset too
    /// (what was pending failed, numbering starts again).
    #[error("the peer reset the session: {0}")]
    Reset(String),
    /// The peer refused the connection.
    #[error("refused by the peer ({0:?}): {1}")]
    Refused(RefuseCode, String),
}

/// Distinct (mailbox, sender) pairs of undeliverable notices kept apart; the counts of
/// any others are summed into one notice naming no mailbox.
const NOTICE_PAIRS: usize = 64;
/// Notices written per round (they go with the control frames).
const NOTICES_PER_WRITE: usize = 16;
/// Notices from the peer kept until polled; more are counted only.
const REPORTS_KEPT: usize = 1024;

/// One peer: everything its traffic needs, owned in one place.
pub struct Peer {
    pub(crate) cfg: PeerConfig,
    pub(crate) s: Session,
    pub(crate) id: ConnId,
    // Sending to the peer.
    pub(crate) outbox: Outbox,
    pub(crate) bulk: BulkQueue,
    pub(crate) credit: SendCredit,
    /// Ordinary messages queued, and taken for writing, ever.
    pub(crate) pushed: u64,
    pub(crate) taken: u64,
    pub(crate) batch: Batch,
    // Receiving from it.
    pub(crate) rcredit: RecvCredit,
    pub(crate) reasm: Reassembly,
    pub(crate) buf: BytesMut,
    pub(crate) sync_out: Option<frame::Sync>,
    deliveries: VecDeque<Delivery>,
    events: VecDeque<SessionEvent>,
    /// Messages this node could not deliver (no such mailbox), to tell the peer, by pair,
    /// and the count of those beyond `NOTICE_PAIRS` pairs.
    notices: Vec<(Name, Name, u32)>,
    notice_summary: u32,
    /// What the peer reported undeliverable, and how many reports were not kept.
    reported: VecDeque<Undeliverable>,
    reports_dropped: u64,
    /// The peer said goodbye on the current connection: what follows on it is not read.
    goodbye: bool,
    /// This node is shutting down: what is still queued at this deadline is handed back.
    closing: Option<Instant>,
    /// Decides when the ordinary queue is written and how much of it at once.
    bundler: Box<dyn Bundler>,
    /// When the bundler asked to be asked again (a timer bundler holding messages).
    bundle_at: Option<Instant>,
    /// Batches taken, by why (`FlushReason`'s order: drained, size, timer, single).
    pub(crate) flushes: [u64; 4],
    /// Most bytes of pieces held in the window at once (a figure for tests).
    pub(crate) bulk_high: usize,
}

impl Peer {
    /// A peer machine with the `natural` bundler (everything queued goes out at once).
    pub fn new(cfg: PeerConfig, now: Instant) -> Peer {
        Peer::with_bundler(cfg, Box::new(Natural), now)
    }

    /// A peer machine whose ordinary queue `bundler` drains.
    pub fn with_bundler(cfg: PeerConfig, bundler: Box<dyn Bundler>, now: Instant) -> Peer {
        Peer {
            s: Session::new(cfg.session.clone(), now),
            id: ConnId::new(0),
            outbox: Outbox::new(bundler.frame_bytes(cfg.frame_bytes)),
            bulk: BulkQueue::default(),
            credit: SendCredit::default(),
            pushed: 0,
            taken: 0,
            batch: Batch::default(),
            rcredit: RecvCredit::new(cfg.mailbox_bytes, cfg.max_payload),
            reasm: Reassembly::default(),
            buf: BytesMut::new(),
            sync_out: None,
            deliveries: VecDeque::new(),
            events: VecDeque::new(),
            notices: Vec::new(),
            notice_summary: 0,
            reported: VecDeque::new(),
            reports_dropped: 0,
            goodbye: false,
            closing: None,
            bundler,
            bundle_at: None,
            flushes: [0; 4],
            bulk_high: 0,
            cfg,
        }
    }

    // ---- getters ----------------------------------------------------------------------

    /// The session (its state, windows, deadlines).
    pub fn session(&self) -> &Session {
        &self.s
    }

    /// The current connection's id.
    pub fn conn(&self) -> ConnId {
        self.id
    }

    /// The credit toward the peer's mailboxes.
    pub fn send_credit(&self) -> &SendCredit {
        &self.credit
    }

    /// The credit given to the peer toward this node's mailboxes.
    pub fn recv_credit(&self) -> &RecvCredit {
        &self.rcredit
    }

    /// Messages in pieces being reassembled.
    pub fn reassembly(&self) -> &Reassembly {
        &self.reasm
    }

    /// Ordinary batches taken so far, by why: everything queued, the size limit, the
    /// bundler's timer, one message each.
    pub fn flushes(&self) -> [u64; 4] {
        self.flushes
    }

    // ---- inputs -----------------------------------------------------------------------

    /// Queue a message (`send` / `try_send`) at `now`: charge the destination mailbox's
    /// credit, then queue it in its class. `bulk`, a payload larger than a piece, or a pair
    /// that has a bulk message queued go in pieces; the rest in the ordinary outbox, for
    /// the bundler to drain.
    pub fn send(
        &mut self,
        now: Instant,
        to: &Name,
        from: &Name,
        payload: Bytes,
        bulk: bool,
    ) -> Result<(), SendRefused> {
        let charge = message_len(to, from, payload.len()) as u64;
        if !self.credit.try_charge(to, charge) {
            return Err(SendRefused::Credit);
        }
        if bulk || payload.len() > self.cfg.piece_bytes || self.bulk.has_pair(to, from) {
            self.bulk.push(to, from, payload, self.pushed);
        } else {
            let at = self.bundler.needs_enqueue_time().then_some(now);
            self.outbox.push_message(0, to, from, &payload, at);
            self.pushed += 1;
        }
        Ok(())
    }

    /// A connection authenticated the peer as `incarnation`: returns the RESUME to send on
    /// it first. A new incarnation (the peer restarted) fails what was pending for the old
    /// one and drops what was reassembled of its messages.
    pub fn handle_connect(&mut self, now: Instant, incarnation: u64) -> Resume {
        let (id, resume) = self.s.handle_connect(now, incarnation);
        self.id = id;
        self.buf.clear();
        self.goodbye = false;
        self.after_session();
        resume
    }

    /// The peer's RESUME arrived on the current connection: both windows line up, what the
    /// peer gave up in pieces is dropped here, and this node's SYNC (its credit as it
    /// stands) goes first on the connection.
    pub fn handle_resume(&mut self, now: Instant, theirs: Resume) -> Result<Resumed, PeerError> {
        let r = self
            .s
            .handle_resume(now, self.id, theirs)
            .map_err(PeerError::Sequence)?;
        let gone = self.reasm.discard_below(r.keep);
        self.abandon(gone);
        self.sync_out = Some(
            self.rcredit
                .snapshot(self.s.recv_next(), self.cfg.max_payload),
        );
        self.after_session();
        Ok(r)
    }
}

#[cfg(test)]
mod tests;
