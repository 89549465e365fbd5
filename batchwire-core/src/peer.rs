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

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use crate::bulk::{BulkQueue, ORDINARY_WEIGHT};
use crate::bundler::{Bundler, Decision, FlushReason, Natural};
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

    /// Bytes off the current connection. Every whole frame is acted on: messages and
    /// completed pieces become deliveries ([`Peer::poll_delivery`]) for the mailboxes
    /// `exists` says this node has (the others' credit goes back at once), ACKs release
    /// the window, CREDIT and SYNC move the send credit.
    pub fn handle_read(
        &mut self,
        now: Instant,
        bytes: &[u8],
        exists: impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        if bytes.is_empty() || self.goodbye {
            return Ok(());
        }
        self.buf.extend_from_slice(bytes);
        self.s.handle_heard(now, self.id);
        let r = self.read_frames(now, &exists);
        self.after_session();
        r
    }

    fn read_frames(
        &mut self,
        now: Instant,
        exists: &impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        while let Some(f) =
            frame::decode(&mut self.buf, self.cfg.max_frame).map_err(PeerError::Frame)?
        {
            match f {
                Frame::Messages(l) => {
                    let Some(d) = self
                        .s
                        .begin_delivery(self.id, l.first_seq, l.len() as u32)
                        .map_err(PeerError::Sequence)?
                    else {
                        continue;
                    };
                    for m in l.skip(d.skip).iter() {
                        let c = message_len(&m.to, &m.from, m.payload.len()) as u64;
                        self.deliver(m.to, m.from, m.payload, c, exists)?;
                    }
                    self.s.end_delivery(now, d, d.end, l.body().len());
                }
                Frame::Fragment(fr) => {
                    let Some(d) = self
                        .s
                        .begin_delivery(self.id, fr.seq, 1)
                        .map_err(PeerError::Sequence)?
                    else {
                        continue;
                    };
                    if d.skip == 0 {
                        let keep = self.reasm.keeps(&fr, || exists(&fr.to));
                        if keep {
                            self.rcredit
                                .charge(&fr.to, fr.charge())
                                .map_err(PeerError::Credit)?;
                        } else {
                            self.rcredit.dropped(&fr.to, fr.charge());
                        }
                        match self.reasm.add(&fr, keep).map_err(PeerError::Reassembly)? {
                            Added::Complete {
                                to,
                                from,
                                payload,
                                kept: true,
                                charged,
                            } => {
                                // Charged piece by piece already.
                                self.deliveries.push_back(Delivery {
                                    to,
                                    from,
                                    payload,
                                    charge: charged,
                                });
                            }
                            Added::Complete { to, from, .. } => self.notice(to, from, 1),
                            _ => {}
                        }
                    }
                    self.s.end_delivery(now, d, d.end, fr.data.len());
                }
                Frame::Ack(a) => {
                    self.s
                        .handle_ack(now, self.id, a)
                        .map_err(PeerError::Sequence)?;
                }
                Frame::Credit(c) => {
                    for (name, b) in c.grants {
                        self.credit.grant(name.as_bytes(), b);
                    }
                }
                Frame::Sync(sy) => self.apply_sync(sy),
                Frame::Undeliverable(u) => {
                    if self.reported.len() < REPORTS_KEPT {
                        self.reported.push_back(u);
                    } else {
                        self.reports_dropped += 1;
                    }
                }
                Frame::Goodbye => {
                    // It acknowledges nothing more: down (left), what it did not
                    // acknowledge failed.
                    self.s.handle_goodbye(now, self.id);
                    self.goodbye = true;
                    self.buf.clear();
                    return Ok(());
                }
                Frame::Refuse(r) if r.code == RefuseCode::Reset => {
                    self.s.handle_reset(now);
                    let gone = self.reasm.clear();
                    self.abandon(gone);
                    return Err(PeerError::Reset(r.reason));
                }
                Frame::Refuse(r) => return Err(PeerError::Refused(r.code, r.reason)),
                other => return Err(PeerError::Unexpected(other.kind_name())),
            }
        }
        Ok(())
    }

    /// A whole message: charged to its mailbox's credit if this node has that mailbox
    /// (the peer respected the credit, so it fits), else its credit goes back.
    fn deliver(
        &mut self,
        to: Name,
        from: Name,
        payload: Bytes,
        charge: u64,
        exists: &impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        if exists(&to) {
            self.rcredit
                .charge(&to, charge)
                .map_err(PeerError::Credit)?;
            self.deliveries.push_back(Delivery {
                to,
                from,
                payload,
                charge,
            });
        } else {
            self.rcredit.dropped(&to, charge);
            self.notice(to, from, 1);
        }
        Ok(())
    }

    /// `count` messages from the peer's `from` found no mailbox `to` here: tell the peer
    /// (bounded: `NOTICE_PAIRS` pairs, the rest summed).
    fn notice(&mut self, to: Name, from: Name, count: u32) {
        match self
            .notices
            .iter()
            .position(|(t, f, _)| *t == to && *f == from)
        {
            Some(i) => self.notices[i].2 = self.notices[i].2.saturating_add(count),
            None if self.notices.len() < NOTICE_PAIRS => self.notices.push((to, from, count)),
            None => self.notice_summary = self.notice_summary.saturating_add(count),
        }
    }

    /// The peer's SYNC: recount each mailbox's charge as held there, plus in flight from
    /// `next` on, plus still queued here. (The peer's figures may be anything: sums
    /// saturate.)
    fn apply_sync(&mut self, sy: frame::Sync) {
        let mut totals: NameMap<u64> = NameMap::default();
        let mut add = |to: &Name, b: u64| {
            let e = totals.entry(to.clone()).or_default();
            *e = e.saturating_add(b);
        };
        for (name, h) in &sy.held {
            add(name, *h);
        }
        self.s.charges_from(sy.next, &mut add);
        self.outbox.charges(0, &mut add);
        self.bulk.charges(&mut add);
        self.credit.sync(sy.window, sy.max_payload, &totals);
    }

    /// The application took a delivery out of `mailbox`: its credit goes back to the peer
    /// (in a CREDIT frame, at the next [`Peer::poll_transmit`]).
    pub fn handle_taken(&mut self, mailbox: &[u8], charge: u64) {
        self.rcredit.release(mailbox, charge);
    }

    /// Time passed: acknowledgement delays, heartbeats, the failure detector.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        self.after_session();
    }

    /// The current connection ended (the session stays; what was written and not
    /// acknowledged goes again on the next one).
    pub fn handle_disconnect(&mut self, now: Instant) {
        self.s.handle_disconnect(now, self.id);
        self.after_session();
    }

    /// This node is shutting down: what is queued still goes out; what is still queued or
    /// unacknowledged at `deadline` is handed back. Then [`Peer::poll_close`] says goodbye.
    pub fn begin_close(&mut self, deadline: Instant) {
        self.closing = Some(deadline);
        self.s.begin_close(deadline);
    }

    /// Hand back everything queued for the peer (it cannot be sent), giving up a message
    /// that was in pieces: the next RESUME tells the peer to drop what it has of it.
    /// Returns the messages, and whether one of them was in pieces.
    pub fn fail_queued(&mut self) -> (Vec<Message>, bool) {
        let mut batch = Batch::default();
        self.outbox.take(usize::MAX, usize::MAX, &mut batch, None);
        self.taken = self.pushed;
        let (bulk, in_pieces) = self.bulk.take_failed();
        if in_pieces {
            self.s.give_up_pieces();
        }
        let mut msgs = batch.decode_messages();
        msgs.extend(bulk);
        (msgs, in_pieces)
    }

    /// Act on what the session said: a restart or a reset drops what was reassembled; a
    /// peer found down has its queue handed back. Events are kept for `poll_event`.
    fn after_session(&mut self) {
        while let Some(e) = self.s.poll_event() {
            match &e {
                SessionEvent::Restarted { .. } | SessionEvent::Reset => {
                    let gone = self.reasm.clear();
                    self.abandon(gone);
                }
                SessionEvent::Down { reason } => {
                    let gone = self.reasm.clear();
                    self.abandon(gone);
                    let (messages, _) = self.fail_queued();
                    let reason = FailReason::Down(*reason);
                    self.events.push_back(e);
                    if !messages.is_empty() {
                        self.events
                            .push_back(SessionEvent::Failed { messages, reason });
                    }
                    continue;
                }
                _ => {}
            }
            self.events.push_back(e);
        }
    }

    /// Drop what was reassembled of messages the peer gave up, giving their credit back.
    fn abandon(&mut self, gone: Vec<Abandoned>) {
        for a in gone {
            if a.kept {
                self.rcredit.release(a.to.as_bytes(), a.charged);
            }
        }
    }

    // ---- outputs ----------------------------------------------------------------------

    /// The writer's round, onto `out` while it holds less than `room` bytes: control first
    /// (acknowledgements, heartbeats), then this node's SYNC and credit grants, then the
    /// next ordinary batch (unless the window is full), then pieces while the session has
    /// bulk room, then what the window holds that the connection has not had yet.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>, room: usize) {
        if out.len() >= room {
            return;
        }
        while let Some(f) = self.s.poll_control(now, self.id) {
            f.encode(out);
        }
        if let Some(sy) = self.sync_out.take() {
            Frame::Sync(sy).encode(out);
        }
        while let Some(g) = self.rcredit.take_grants() {
            Frame::Credit(g).encode(out);
        }
        for _ in 0..NOTICES_PER_WRITE {
            let (to, from, count) = match self.notices.pop() {
                Some(n) => n,
                None if self.notice_summary > 0 => {
                    let c = std::mem::take(&mut self.notice_summary);
                    (Name::from_static(""), Name::from_static(""), c)
                }
                None => break,
            };
            Frame::Undeliverable(Undeliverable { count, to, from }).encode(out);
        }
        let piece = self.cfg.piece_bytes;
        self.bundle_at = None;
        if !self.s.window_full() && !self.outbox.is_empty() {
            match self.bundler.poll(self.outbox.level(), now) {
                Decision::Flush {
                    max_messages,
                    max_bytes,
                    reason,
                } => {
                    // While a piece waits, ordinary bytes are capped (bulk's weight).
                    let max_bytes = if self.bulk.ready(self.taken) {
                        max_bytes.min(ORDINARY_WEIGHT * piece)
                    } else {
                        max_bytes
                    };
                    let at = self.bundler.needs_enqueue_time().then_some(now);
                    self.outbox
                        .take(max_messages, max_bytes, &mut self.batch, at);
                    self.taken += self.batch.messages();
                    self.s.hold(&self.batch.message_frames());
                    self.flushes[flush_index(reason)] += 1;
                }
                Decision::Wait { until } => self.bundle_at = until,
            }
        }
        while self.s.bulk_room() {
            let Some(p) = self.bulk.peek(piece, self.taken) else {
                break;
            };
            match self.s.hold_piece(&p) {
                Ok(id) => {
                    self.bulk.advance(p.serial, id);
                }
                Err(PieceRefused::Restart) => self.bulk.restart(p.serial),
                Err(PieceRefused::Failed(_)) => {
                    self.bulk.unreserve(p.serial);
                    break;
                }
            }
        }
        self.bulk_high = self.bulk_high.max(self.s.bulk_bytes());
        let u = self.s.unwritten(self.id);
        let segments = u.segments();
        let mut written = 0;
        for (i, (c, end)) in segments.iter().enumerate() {
            // A piece is two slices (its head, then its data) with the same end: never
            // stop between them (a writer goes on with the rest of a partial write).
            let continues = i > 0 && *end == segments[i - 1].1;
            if out.len() >= room && !continues {
                break;
            }
            out.extend_from_slice(c);
            written += 1;
        }
        if written > 0 {
            self.s
                .mark_written(now, self.id, u.generation, segments[written - 1].1);
        } else {
            self.s.note_sent(now, self.id);
        }
        self.after_session();
    }

    /// Shutting down ([`Peer::begin_close`]): once everything queued was written and
    /// acknowledged, or the deadline passed (what was left is handed back in a `Failed`
    /// event), the goodbye onto `out`: a final acknowledgement, then GOODBYE. Once;
    /// returns whether it was written.
    pub fn poll_close(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        let Some(deadline) = self.closing else {
            return false;
        };
        let queued = |p: &Peer| !p.outbox.is_empty() || !p.bulk.is_empty();
        if queued(self) && now >= deadline {
            let (messages, _) = self.fail_queued();
            if !messages.is_empty() {
                self.events.push_back(SessionEvent::Failed {
                    messages,
                    reason: FailReason::ShutDown,
                });
            }
        }
        let said = match self.s.poll_close(now, self.id, queued(self)) {
            Some(frames) => {
                for f in frames {
                    f.encode(out);
                }
                true
            }
            None => false,
        };
        self.after_session();
        said
    }

    /// The next whole message for one of this node's mailboxes.
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        self.deliveries.pop_front()
    }

    /// The next report from the peer of messages it could not deliver (no such mailbox,
    /// or too large); a mailbox named "" sums what it did not report one by one.
    pub fn poll_reported(&mut self) -> Option<Undeliverable> {
        self.reported.pop_front()
    }

    /// Reports from the peer that were not kept (more than were polled in time).
    pub fn reports_dropped(&self) -> u64 {
        self.reports_dropped
    }

    /// The next event (peer up, restarted, down, messages failed, a connection to close).
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// When [`Peer::handle_timeout`] (the session's timers) or [`Peer::poll_transmit`]
    /// (the bundler's) is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.s.poll_timeout(), self.bundle_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn flush_index(r: FlushReason) -> usize {
    match r {
        FlushReason::Drained => 0,
        FlushReason::SizeReached => 1,
        FlushReason::Timer => 2,
        FlushReason::Single => 3,
    }
}

#[cfg(test)]
mod tests;
