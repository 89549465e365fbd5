//! A connection's reader: frames off the socket into the session and the mailboxes.
//!
//! Messages are delivered a run at a time (consecutive messages for one mailbox: one lock,
//! at most one wake-up), and **never wait for a consumer**: each is charged to its
//! mailbox's credit for this peer (see `batchwire_core::credit`), which the sender
//! respected, so it fits. A peer that sends past its credit broke the protocol. Pieces of
//! large messages are reassembled (each charged as it arrives) and delivered whole. On
//! plain TCP a piece whose fields have arrived but not yet (at least [`IN_PLACE_MIN`]
//! bytes of) its data is read **in place**: the rest of its data goes from the socket
//! straight into its message's reassembly buffer (`Reassembly::direct_room`), not through
//! the receive buffer, so a large message is not copied on the way in (only what arrived
//! with a piece's fields is).
//!
//! The reader also applies what the peer says about credit toward *its* mailboxes: CREDIT
//! grants and SYNC recounts go to this peer's lane, where senders wait for them. And it
//! takes this side's SYNC snapshots: when the connection starts (so the first thing the
//! writer sends is where credit stands) and whenever the accounts ask for one, always
//! between two frames with the delivery turn, so that the snapshot covers exactly the
//! messages below its sequence number. What was delivered is committed to the session;
//! the rest comes again on the next connection and is delivered then, exactly once.
//!
//! On plain TCP the reader thread is not the only one that reads: what it reads into and
//! how far it got sit behind the connection's read turn (`Conn::read_turn`), and an
//! application thread waiting for a reply or a message may take the turn and read the
//! connection itself ("leading", [`Reader::lead`]); everything above holds for whichever
//! thread has the turn. While threads try to lead, the reader thread waits for the socket
//! without the turn (otherwise in `recv(2)` with it, see `read_until_end`), and it alone
//! tears the connection down, whoever found that it ended.

use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::call;
use batchwire_core::codec::{Name, NameMap};
use batchwire_core::frame::{self, Fragment, FragmentHead, Frame, MessageList, Sync};
use batchwire_core::handshake::HandshakeError;
use batchwire_core::reassembly::{Added, ReassemblyError};
use bytes::{Bytes, BytesMut};

use crate::address::Address;
use crate::error::Error;
use crate::event::Event;
use crate::io::conn::{Conn, InPlace, LinkError, ReadSide, RecvRing};
use crate::io::envelope::Envelope;
use crate::io::events::Events;
use crate::io::flow::Held;
use crate::io::lane::Lane;
use crate::io::mailbox::{MailboxQueue, Mailboxes};
use crate::io::peer::Peer;

/// How long a caller that leads waits for its socket before it looks whether its call
/// ended some other way (see [`Reader::lead`]); then twice as long each time, up to
/// `LEAD_RECHECK_MAX`.
const LEAD_RECHECK: Duration = Duration::from_millis(5);
const LEAD_RECHECK_MAX: Duration = Duration::from_millis(80);

/// Reads by the reader thread with no one trying to lead, after which it waits for the
/// socket in `recv(2)`, with the turn (see `read_until_end`).
const QUIET_READS: u32 = 64;

/// How often in a row the reader thread finds a caller leading before it queues for the
/// read turn (see `read_until_end`).
const LOOKS: u32 = 4;

/// A piece with at least this many bytes of data still to come is read in place (below
/// it, the copy costs less than the extra read).
const IN_PLACE_MIN: usize = 8 << 10;

/// A read into the receive buffer that ends a piece asks for this much more: the next
/// frame's fields (most likely the next piece's), not its data, so that the data can go
/// in place. (Reads of `read_bytes` end anywhere in a piece, so the next piece's fields
/// came with most of its data and it could not.)
const HEAD_READ: usize = 512;

/// What a reader uses.
pub(crate) struct Reader<'a> {
    pub peer: &'a Peer,
    pub conn: &'a Conn,
    pub mailboxes: &'a Mailboxes,
    pub events: &'a Events,
    /// With transfer-queue: the shared lane (part of a SYNC recount).
    pub shared: Option<&'a Lane>,
    pub max_frame: usize,
    pub max_payload: u64,
    pub read_bytes: usize,
}

impl Reader<'_> {
    /// Read frames and act on them until the peer says goodbye (`Ok`) or something breaks.
    pub fn run(&self, buf: BytesMut) -> Result<(), LinkError> {
        // Where credit stands, as of what was delivered before this connection: the first
        // thing this side says on it (after RESUME).
        self.snapshot();
        *self.conn.read_turn() = Some(ReadSide {
            ring: RecvRing::new(buf, self.read_bytes),
            // Nothing read yet: the first read looks without waiting (see below).
            drained: true,
            idle_said: true,
            ended: None,
            piece: None,
            next_read: None,
            look: false,
        });
        let r = self.read_until_end();
        // No caller leads a connection whose reader stopped.
        *self.conn.read_turn() = None;
        r
    }

    /// The reader thread's loop: with the read turn, act on what was read and read more.
    /// If a thread tried to lead within its last [`QUIET_READS`] reads
    /// (`Conn::lead_tries`), and the last read took all there was, it looks without
    /// waiting and, if nothing is there, waits for the socket **without the turn**, so that
    /// a thread waiting for a reply or a message may take it meanwhile (see
    /// [`Reader::lead`]). Otherwise (a stream, or no one leads, or TLS) it waits in
    /// `recv(2)` with the turn: one system call per wait rather than three, which would
    /// slow a stream down. A thread that then tries to lead finds the turn taken (its wait
    /// goes as before, with a hand-off), and the reader thread leaves the turn free from
    /// its next read on. A thread that leads returns the turn once it has what it waited
    /// for, and leaves in `ended` how the connection ended if it found out.
    fn read_until_end(&self) -> Result<(), LinkError> {
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut missed = 0;
        // Lead tries seen, and reads since they last moved.
        let (mut seen, mut quiet) = (0u32, 0u32);
        loop {
            let mut turn = match self.conn.try_read_turn() {
                Some(t) => t,
                // A thread leads. Woken by the same bytes as it was, this thread looks
                // again instead of queueing for the turn: the leader reads them at once,
                // so the socket is soon empty and this thread sleeps in `poll` without
                // having to be woken when the leader is done (that wake-up preempted the
                // leader just as it had its reply). Past a few looks (the leader is busy
                // reading a stream), it queues for the turn.
                None if missed < LOOKS => {
                    missed += 1;
                    std::thread::yield_now();
                    self.wait_readable(None, None)?;
                    continue;
                }
                None => self.conn.read_turn(),
            };
            missed = 0;
            let Some(side) = turn.as_mut() else {
                return Err(LinkError::Eof);
            };
            let step = (|| {
                if let Some(end) = side.ended.take() {
                    return Err(end);
                }
                if self.act(side, &mut cache).map_err(Err)? {
                    return Err(Ok(()));
                }
                let tries = self.conn.lead_tries.load(Relaxed);
                if tries != seen {
                    (seen, quiet) = (tries, 0);
                }
                let wait =
                    (!side.drained || !self.leadable() || quiet >= QUIET_READS) && !side.look;
                self.read_once(side, wait).map_err(Err)
            })();
            match step {
                Ok(true) => quiet = quiet.saturating_add(1),
                Ok(false) => {
                    drop(turn);
                    self.wait_readable(None, None)?;
                }
                // The end, found here or by a leader: no one leads from now on (cleared
                // with the turn still held, so no thread slips in before `run` does).
                Err(end) => {
                    // A piece being read in place will not be committed on this
                    // connection: its bytes go now, not when the piece comes again.
                    let piece = turn.as_mut().and_then(|side| side.piece.take());
                    self.drop_in_place(piece.as_ref().map(|p| &p.head));
                    *turn = None;
                    return end;
                }
            }
        }
    }

    /// With the read turn: act on every whole frame read. Returns true on GOODBYE.
    fn act(
        &self,
        side: &mut ReadSide,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<bool, LinkError> {
        let buf = side.ring.buf();
        while let Some(frame) = frame::decode(buf, self.max_frame)? {
            self.peer.stats.frames_received.fetch_add(1, Relaxed);
            if self.handle(frame, cache)? {
                return Ok(true);
            }
        }
        if side.piece.is_none() {
            self.begin_in_place(side)?;
        }
        self.say_idle(side);
        Ok(false)
    }

    /// With the read turn, after every whole frame was taken: if what is left is a piece
    /// with its fields read and much of its data to come, of a message being reassembled
    /// here, move what came of its data into the message's buffer; the reads go on there
    /// (`read_in_place`) until the piece is whole.
    fn begin_in_place(&self, side: &mut ReadSide) -> Result<(), LinkError> {
        if !self.leadable() {
            return Ok(());
        }
        let buf = side.ring.buf();
        let Some(head) = frame::fragment_head(buf, self.max_frame)? else {
            // The start of a piece whose fields are not all in: read them, not its data.
            if frame::starts_fragment(buf) {
                side.next_read = Some(HEAD_READ);
            }
            return Ok(());
        };
        // Everything in the buffer is this frame (it is the first not yet taken).
        let read = buf.len() - head.head_len;
        // If it cannot go in place, read up to its end and the next frame's fields only.
        let rest = head.data_len - read;
        side.next_read = Some(rest + HEAD_READ);
        // Only the current connection starts reads in place (a replaced one still
        // reading would only be refused its pieces).
        if rest < IN_PLACE_MIN || !self.peer.session(|s, _| s.current() == Some(self.conn.id)) {
            return Ok(());
        }
        let mut r = self.peer.lock_reassembly();
        let keep_new = || self.keeps_new(&head.piece);
        let Some((dst, _)) = r.direct_room(&head, 0, self.conn.id, keep_new) else {
            return Ok(());
        };
        side.next_read = None;
        dst.extend_from_slice(&buf[head.head_len..]);
        drop(r);
        buf.clear();
        side.piece = Some(InPlace { head, read });
        Ok(())
    }

    /// With the read turn: read more of the piece being read in place, waiting for bytes
    /// if `wait` (for the socket, with no lock held); then, if it is whole, act on it.
    /// One read takes the rest of the piece into its message's buffer and up to
    /// [`HEAD_READ`] bytes after it into the ring (the next frame's fields), so a stream of
    /// pieces costs one read per piece. Returns false if there were none (only without
    /// `wait`).
    fn read_in_place(&self, side: &mut ReadSide, wait: bool) -> Result<bool, LinkError> {
        let mut waited = false;
        let (n, left) = loop {
            let Some(p) = side.piece.as_mut() else {
                return Ok(true);
            };
            let got = {
                let mut r = self.peer.lock_reassembly();
                // The message moved on without this connection: a newer one took over.
                let room = r.direct_room(&p.head, p.read, self.conn.id, || false);
                let Some((dst, left)) = room else {
                    return Err(LinkError::Replaced);
                };
                let next = side.ring.room(HEAD_READ);
                recv_pair(&self.conn.link, (dst, left), (next, HEAD_READ)).map(|n| (n, left))
            };
            match got {
                Ok((0, _)) => return Err(LinkError::Eof),
                Ok(r) => break r,
                // Most often the bytes are there; otherwise wait (without any lock).
                Err(e) if e.kind() == ErrorKind::WouldBlock && wait && !waited => {
                    self.wait_readable(None, None)?;
                    waited = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(wait),
                Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(true),
                Err(e) => return Err(e.into()),
            }
        };
        let in_place = n.min(left);
        side.drained = n < left + HEAD_READ;
        side.idle_said = false;
        let stats = &self.peer.stats;
        stats.bytes_received.fetch_add(n as u64, Relaxed);
        stats
            .piece_bytes_in_place
            .fetch_add(in_place as u64, Relaxed);
        self.peer
            .session(|s, now| s.handle_heard(now, self.conn.id));
        let p = side.piece.as_mut().expect("the piece being read");
        p.read += in_place;
        if in_place == left {
            let InPlace { head, .. } = side.piece.take().expect("the piece being read");
            self.peer.stats.frames_received.fetch_add(1, Relaxed);
            self.piece(&head.piece, Some(&head))?;
        }
        Ok(true)
    }

    /// With the read turn: if the last read took all there was, about to wait, so
    /// acknowledge now if a sender may be waiting for it (the session decides); once per
    /// read.
    fn say_idle(&self, side: &mut ReadSide) {
        if side.drained && !side.idle_said {
            side.idle_said = true;
            self.peer.session(|s, _| s.handle_idle(self.conn.id));
        }
    }

    /// With the read turn: read once, waiting for bytes if `wait`. Returns false if there
    /// were none (only without `wait`).
    fn read_once(&self, side: &mut ReadSide, wait: bool) -> Result<bool, LinkError> {
        if side.piece.is_some() {
            return self.read_in_place(side, wait);
        }
        let look = std::mem::take(&mut side.look);
        // On a plain link, near a buffer's end, only the rest of the frame begun there
        // (`RecvRing::read_size`). Not over TLS: its reads take ciphertext, record by
        // record, and a small read there would only split them into more system calls.
        let (want, shrunk) = match side.next_read.take() {
            Some(n) => (n.min(self.read_bytes), false),
            None if self.leadable() => {
                let n = side.ring.read_size(self.read_bytes);
                (n, n < self.read_bytes)
            }
            None => (self.read_bytes, false),
        };
        let n = match self.conn.link.read_append(side.ring.room(want), want, wait) {
            Ok(0) => return Err(LinkError::Eof),
            Ok(n) => n,
            // A look after a read cut short found the socket empty: it was drained after
            // all (the caller goes round, says so, and reads as it would have).
            Err(e) if e.kind() == ErrorKind::WouldBlock && look => {
                side.drained = true;
                return Ok(true);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && !wait => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e.into()),
        };
        // A read cut short to a frame's end that got all it asked for cannot tell whether
        // more is waiting. Counted as drained, it would make an idle acknowledgement at
        // every buffer's end of a stream, slowing the stream; counted as not, a stream
        // that stopped exactly there would hold its acknowledgement back behind a
        // blocking read. So the next read looks first, without waiting.
        // Over TLS too: a read that filled all it asked for cannot tell either.
        side.drained = n < want;
        side.look = (shrunk || self.conn.link.is_tls()) && n == want;
        side.idle_said = false;
        self.peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
        self.peer
            .session(|s, now| s.handle_heard(now, self.conn.id));
        Ok(true)
    }

    /// Whether callers may lead this connection: plain TCP (a TLS link's reads go through
    /// rustls, whose state its reader thread keeps to itself).
    fn leadable(&self) -> bool {
        #[cfg(unix)]
        return self.conn.link.plain_fd().is_some();
        #[cfg(not(unix))]
        return false;
    }

    /// Wait until the socket has something to read (or has ended, or failed), or `wake`
    /// is readable, at most `limit` if given. Only for a leadable link. Returns whether
    /// `wake` is readable.
    fn wait_readable(&self, limit: Option<Duration>, wake: Option<i32>) -> std::io::Result<bool> {
        #[cfg(unix)]
        if let Some(fd) = self.conn.link.plain_fd() {
            let ms = limit.map_or(-1, |d| d.as_micros().div_ceil(1000).min(60_000) as i32);
            // The socket is the link's, open while `self.conn` is borrowed, and `wake` is
            // open while its owner waits here.
            return match crate::sys::poll_readable([fd, wake.unwrap_or(-1)], ms) {
                Ok([_, woken]) => Ok(wake.is_some() && woken),
                Err(e) if e.kind() == ErrorKind::Interrupted => Ok(false),
                Err(e) => Err(e),
            };
        }
        let _ = (limit, wake);
        Ok(false)
    }

    /// **Leading**: an application thread that waits for something that will most likely
    /// come on this connection reads the connection itself while it waits, if no one holds
    /// the read turn, instead of being woken by the reader thread once that has read it: a
    /// caller waiting for its reply (`Runtime::request`), or a receiver waiting for a
    /// message in its mailbox (`MailboxQueue::lead`; `wake`, a file descriptor that a push
    /// to the mailbox makes readable, wakes it for messages that come another way). On a
    /// machine with idle CPUs each hand-off costs a wake-up of a sleeping CPU, about half
    /// a loopback round trip, and an rpc call had two of them.
    ///
    /// The thread acts on everything it reads exactly as the reader thread would (every
    /// frame, for every mailbox and every waiting caller), never waits for a consumer
    /// (delivery does not), and keeps the turn until `done()`, `until`, or the connection
    /// ends. A caller waits for the socket at most [`LEAD_RECHECK`] at a time, so that a
    /// call ended some other way (the peer declared down, shutdown) is seen soon; a
    /// receiver is woken for all that through `wake`. The reader thread meanwhile looks at
    /// the socket a few times ([`LOOKS`]), then waits for the turn, and takes back what
    /// the thread leaves: how the connection ended, if it did (the thread shuts the
    /// socket's read side so the reader thread wakes to report it), and any part of a
    /// frame read.
    ///
    /// Returns whether it held the turn and waited with it: false, at once, if the turn
    /// was taken, the connection ended or is not plain TCP (a TLS link's reads go through
    /// rustls, which its reader keeps).
    pub fn lead(
        &self,
        done: &dyn Fn() -> bool,
        until: Instant,
        wake: Option<&Arc<OwnedFd>>,
    ) -> bool {
        if !self.leadable() {
            return false;
        }
        // Even if the turn is taken: the reader thread then leaves it free next time.
        self.conn.lead_tries.fetch_add(1, Relaxed);
        let Some(mut turn) = self.conn.try_read_turn() else {
            return false;
        };
        let Some(side) = turn.as_mut() else {
            return false;
        };
        // A receiver leading can be asked for the turn (see `Runtime::request`).
        struct Leading<'a>(&'a Conn, bool);
        impl Drop for Leading<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.set_lead_wake(None);
                }
            }
        }
        let _leading = Leading(self.conn, wake.is_some());
        if wake.is_some() {
            self.conn.set_lead_wake(wake.cloned());
        }
        let wake_fd = wake.map(|w| std::os::fd::AsRawFd::as_raw_fd(&**w));
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut recheck = LEAD_RECHECK;
        let end = loop {
            if side.ended.is_some() || self.conn.is_closed() {
                // Nothing to lead: a receiver parks instead (the next connection's reader
                // wakes it), rather than come back here until the reader tears down.
                return false;
            }
            match self.act(side, &mut cache) {
                Ok(false) => {}
                Ok(true) => break Ok(()),
                Err(e) => break Err(e),
            }
            let now = Instant::now();
            if done() || now >= until {
                return true;
            }
            match self.read_once(side, false) {
                Ok(true) => {
                    self.peer.stats.reads_led.fetch_add(1, Relaxed);
                }
                Ok(false) => {
                    // The socket is empty now: acknowledge if a sender may be waiting for
                    // it, as the reader thread does before it waits.
                    side.drained = true;
                    self.say_idle(side);
                    // A receiver is woken through `wake` for everything else it waits for
                    // (a push, its mailbox closing, a call asking for the turn): it sleeps
                    // until `until`, using no CPU while idle. A caller looks again after
                    // LEAD_RECHECK, then twice as long each time, up to LEAD_RECHECK_MAX.
                    let limit = match wake {
                        Some(_) => until - now,
                        None => (until - now).min(recheck),
                    };
                    recheck = (recheck * 2).min(LEAD_RECHECK_MAX);
                    match self.wait_readable(Some(limit), wake_fd) {
                        // Empty the eventfd before `done()` is asked again: left readable,
                        // every poll would return at once (a push another receiver of the
                        // mailbox took, a late request for the turn). Whoever signals
                        // changed what `done()` reads first, so nothing is missed.
                        Ok(true) => {
                            if let Some(w) = wake {
                                crate::io::mailbox::drain(w);
                            }
                        }
                        Ok(false) => {}
                        Err(e) => break Err(e.into()),
                    }
                }
                Err(e) => break Err(e),
            }
        };
        side.ended = Some(end);
        let _ = self.conn.link.shutdown(std::net::Shutdown::Read);
        true
    }

    /// Take a SYNC snapshot between two deliveries.
    fn snapshot(&self) {
        let _turn = self.peer.delivery_turn();
        self.take_snapshot();
    }

    /// After a delivery (with the turn): a snapshot if the accounts asked for one.
    fn snapshot_if_asked(&self) {
        if self.peer.flow.wants_sync() {
            self.take_snapshot();
        }
    }

    /// The snapshot, as of what the session received, in the same session turn (see
    /// `Flow::snapshot`).
    fn take_snapshot(&self) {
        let peer = self.peer;
        peer.session(|s, _| peer.flow.snapshot(s.recv_next()));
        peer.flow.wake_writer();
    }

    /// Act on one frame. Returns true on GOODBYE.
    fn handle(
        &self,
        frame: Frame,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<bool, LinkError> {
        let (peer, id) = (self.peer, self.conn.id);
        match frame {
            Frame::Messages(list) => self.deliver(list, cache)?,
            Frame::Fragment(f) => self.piece(&f, None)?,
            Frame::Ack(next) => {
                let acked = peer.session(|s, now| s.handle_ack(now, id, next))?;
                peer.stats.acked.fetch_add(acked, Relaxed);
            }
            Frame::Credit(c) => {
                // Grants written on a connection that was replaced are stale: the SYNC on
                // its successor recounts them.
                if peer.session(|s, _| s.current() == Some(id)) {
                    peer.lane.grant(&c.grants);
                }
            }
            Frame::Sync(sy) => self.recount(sy),
            Frame::Undeliverable(u) => {
                peer.stats
                    .undeliverable_reported
                    .fetch_add(u.count as u64, Relaxed);
                warn_limited!(peer = %peer.name, mailbox = %u.to, from = %u.from, count = u.count, "peer reports messages undeliverable: no such mailbox, or too large (\"\" sums more names than it reports one by one)");
                // A request that found no mailbox fails now, not at its timeout.
                if let Some((id, _)) = call::parse(u.from.as_bytes()) {
                    let to = format!("{}@{}", u.to, peer.name);
                    peer.calls()
                        .fail_from(id, &peer.name, Error::Undeliverable { to });
                }
                self.events.emit(Event::Undeliverable {
                    to: Address::from_names(peer.name.clone(), u.to),
                    from: u.from.to_string(),
                    count: u.count as u64,
                });
            }
            Frame::Goodbye => {
                peer.session(|s, now| s.handle_goodbye(now, id));
                return Ok(true);
            }
            // The peer could not resume the session and reset its end: so do we.
            Frame::Refuse(r) if r.code == frame::RefuseCode::Reset => {
                let _turn = peer.delivery_turn();
                peer.session(|s, now| s.handle_reset(now));
                return Err(LinkError::SessionReset(format!(
                    "the peer says: {}",
                    r.reason
                )));
            }
            Frame::Refuse(r) => {
                return Err(HandshakeError::Refused {
                    peer: Some(peer.name.clone()),
                    code: r.code,
                    reason: r.reason,
                }
                .into());
            }
            // Membership travels on its own datagrams, never on a data connection.
            other @ (Frame::Hello(_) | Frame::Auth(_) | Frame::Resume(_) | Frame::Member(_)) => {
                return Err(LinkError::Unexpected(other.kind_name()));
            }
        }
        Ok(false)
    }

    /// The peer's SYNC: recount each of its mailboxes' charges as held there, plus what
    /// this node has in flight from the SYNC's `next` on, plus what is still queued (the
    /// window, then the lane, counted again if the writer moved anything between them).
    fn recount(&self, sy: Sync) {
        let peer = self.peer;
        let mut held: NameMap<u64> = NameMap::default();
        for (name, b) in &sy.held {
            let e = held.entry(name.detached()).or_default();
            *e = e.saturating_add(*b);
        }
        if let Some(shared) = self.shared {
            shared.charges_for(peer.id, &mut held);
        }
        // The window's part and the lane's part must not miss (or count twice) a message
        // the writer moves from one to the other meanwhile: count again if it did. A move
        // takes microseconds; after many tries the recount goes ahead (off by one batch at
        // most, which the flow-control limit's slack absorbs and the next SYNC corrects).
        for tries in 0.. {
            let moves = peer.lane.moves();
            if moves % 2 == 1 && tries < 1000 {
                std::thread::yield_now();
                continue;
            }
            let mut totals = held.clone();
            peer.session(|s, _| {
                s.charges_from(sy.next, |to, b| {
                    let e = totals.entry(to.clone()).or_default();
                    *e = e.saturating_add(b);
                })
            });
            let check = (tries < 1000).then_some(moves);
            if peer
                .lane
                .sync_credit(check, peer.id, sy.window, sy.max_payload, &mut totals)
            {
                return;
            }
        }
    }

    /// Deliver a frame's messages, in runs, and commit how far it got.
    fn deliver(
        &self,
        list: MessageList,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<(), LinkError> {
        let (peer, conn) = (self.peer, self.conn);
        let _turn = peer.delivery_turn();
        let Some(d) =
            peer.session(|s, _| s.begin_delivery(conn.id, list.first_seq, list.len() as u32))?
        else {
            // Replaced: its successor resends from where the session stands.
            return Err(LinkError::Replaced);
        };
        let list = if d.skip == 0 { list } else { list.skip(d.skip) };
        peer.stats
            .messages_received
            .fetch_add(list.len() as u64, Relaxed);
        let (mut upto, mut bytes) = (d.first + d.skip as u64, 0usize);
        let mut result = Ok(());
        for (to, range, count) in list.runs() {
            if call::is_reply_inbox(to) {
                let data = list.body().slice(range);
                let len = data.len();
                if let Err(e) = self.replies(data) {
                    result = Err(e);
                    break;
                }
                upto += count as u64;
                bytes += len;
                continue;
            }
            let data = list.body().slice(range);
            let len = data.len();
            match self.push_run(cache, to, &data, count) {
                Ok(Pushed::Queued) => {}
                // No such mailbox: counted, reported, and its credit given back.
                Ok(Pushed::NoMailbox) => self.undeliverable(to, data, true),
                // Dropped meanwhile (its credit already given back).
                Ok(Pushed::Closed) => self.undeliverable(to, data, false),
                // Past its credit: a violation, and nothing of this run is delivered.
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            upto += count as u64;
            bytes += len;
        }
        peer.session(|s, now| s.end_delivery(now, d, upto, bytes));
        self.snapshot_if_asked();
        result
    }

    /// Queue a run of `count` messages for mailbox `to`, charging its credit once. `cache`
    /// is the queue the last run went to: looked up again if it is another mailbox's, or if
    /// it refuses the run because it was dropped meanwhile (a mailbox opened again under
    /// the same name since then takes the run, with the same credit: at most two tries).
    fn push_run(
        &self,
        cache: &mut Option<Arc<MailboxQueue>>,
        to: &[u8],
        data: &Bytes,
        count: u32,
    ) -> Result<Pushed, LinkError> {
        let peer = self.peer;
        let len = data.len() as u64;
        // The run's credit once charged: a refused push hands it back.
        let mut held: Option<Held> = None;
        for retry in [false, true] {
            if retry || cache.as_ref().is_none_or(|mb| mb.name.as_bytes() != to) {
                *cache = self.mailboxes.get(to);
            }
            let Some(mb) = cache.as_ref() else {
                // Dropping `held` (if charged) gives its credit back.
                return Ok(match held {
                    None => Pushed::NoMailbox,
                    Some(_) => Pushed::Closed,
                });
            };
            let h = match held.take() {
                Some(h) => h,
                None => {
                    peer.flow.charge(&mb.name, len)?;
                    Held::new(peer.flow.clone(), mb.name.clone(), len)
                }
            };
            match mb.push_run(&peer.name, data.clone(), count, h) {
                Ok(()) => return Ok(Pushed::Queued),
                Err(h) => {
                    held = Some(h);
                    *cache = None;
                }
            }
        }
        Ok(Pushed::Closed)
    }

    /// A run of replies to this node's requests: each completes its call (if still
    /// waiting) at once, one table lock for the run, and its credit goes straight back.
    fn replies(&self, mut data: Bytes) -> Result<(), LinkError> {
        let peer = self.peer;
        let inbox = Name::from_static(call::REPLY_INBOX);
        let len = data.len() as u64;
        peer.flow.charge(&inbox, len)?;
        let run = std::iter::from_fn(|| frame::next_message(&mut data).map(|(f, p, _)| (f, p)));
        peer.calls().replies_from_wire(&peer.name, run);
        peer.flow.release(inbox.as_bytes(), len);
        Ok(())
    }

    /// A piece of a large message: reassemble it (charging it to its mailbox as it comes)
    /// and deliver the message whole once its last piece is in. `in_place`: its data is
    /// not in `f` but already in its message's buffer (read there with these fields).
    fn piece(&self, f: &Fragment, in_place: Option<&FragmentHead>) -> Result<(), LinkError> {
        let (peer, conn) = (self.peer, self.conn);
        let _turn = peer.delivery_turn();
        let begun = peer.session(|s, _| s.begin_delivery(conn.id, f.seq, 1));
        let d = match begun {
            Ok(Some(d)) => d,
            Ok(None) => {
                self.drop_in_place(in_place);
                return Err(LinkError::Replaced);
            }
            Err(e) => {
                self.drop_in_place(in_place);
                return Err(e.into());
            }
        };
        peer.stats.fragments_received.fetch_add(1, Relaxed);
        let result = if d.skip == 0 {
            self.add_piece(f, in_place)
        } else {
            Ok(())
        };
        if d.skip != 0 || result.is_err() {
            self.drop_in_place(in_place);
        }
        // A piece that does not add up is not committed (nothing of it was kept).
        let upto = if result.is_ok() { d.end } else { d.first };
        let len = in_place.map_or(f.data.len(), |h| h.data_len);
        peer.session(|s, now| s.end_delivery(now, d, upto, len));
        self.snapshot_if_asked();
        result
    }

    /// A piece read in place (`in_place`) that this connection will not commit: what it
    /// read is dropped, and its message's entry if the read started it.
    fn drop_in_place(&self, in_place: Option<&FragmentHead>) {
        if let Some(h) = in_place {
            self.peer
                .lock_reassembly()
                .drop_direct(&h.piece, self.conn.id);
        }
    }

    /// Whether a message starting with piece `f` is kept: not larger than this node
    /// accepts, for a mailbox here (or a reply to a call), and with room in the node's
    /// reassembly budget.
    fn keeps_new(&self, f: &Fragment) -> bool {
        self.wanted(f) && self.peer.reassembly_has_room(f.total)
    }

    /// Whether a message starting with piece `f` would be kept if there were room.
    fn wanted(&self, f: &Fragment) -> bool {
        f.total <= self.max_payload
            && (call::is_reply_inbox(f.to.as_bytes())
                || self.mailboxes.get(f.to.as_bytes()).is_some())
    }

    fn add_piece(&self, f: &Fragment, in_place: Option<&FragmentHead>) -> Result<(), LinkError> {
        let peer = self.peer;
        let mut r = peer.lock_reassembly();
        let too_large = f.total > self.max_payload;
        let keep = r.keeps(f, || self.keeps_new(f));
        if !keep && f.is_first() && r.keeps(f, || true) && self.wanted(f) {
            peer.stats.reassembly_refused.fetch_add(1, Relaxed);
            warn_limited!(peer = %peer.name, mailbox = %f.to, bytes = f.total, committed = peer.reassembly_committed(), "no room for another message in pieces (the node's reassembly_bytes): its data is not kept, and it is reported to the sender as undeliverable at its end");
        }
        let charge = in_place.map_or_else(|| f.charge(), |h| h.charge());
        if keep {
            peer.flow.charge(&f.to, charge)?;
        }
        let added = match in_place {
            Some(h) => r.add_direct(h, self.conn.id),
            None => r.add(f, keep),
        };
        let added = match added {
            Ok(a) => a,
            Err(e) => {
                if keep {
                    peer.flow.uncharge(&f.to, charge);
                }
                return Err(match e {
                    // This connection is stale, the peer did nothing wrong.
                    ReassemblyError::TakenOver { .. } => LinkError::Replaced,
                    e => e.into(),
                });
            }
        };
        drop(r);
        if !keep {
            peer.flow.dropped(&f.to, charge);
        }
        let Added::Complete {
            to,
            from,
            payload,
            kept,
            charged,
        } = added
        else {
            return Ok(());
        };
        if !kept {
            if too_large {
                warn_limited!(peer = %peer.name, mailbox = %to, bytes = f.total, max = self.max_payload, "message larger than this node's max_payload dropped; reported to the sender as undeliverable");
            }
            self.report_missing(&to, &from, 1);
            peer.stats.messages_received.fetch_add(1, Relaxed);
            return Ok(());
        }
        peer.stats.messages_received.fetch_add(1, Relaxed);
        let held = Held::new(peer.flow.clone(), to.clone(), charged);
        if call::is_reply_inbox(to.as_bytes()) {
            drop(held);
            peer.calls()
                .replies_from_wire(&peer.name, std::iter::once((from, payload)));
            return Ok(());
        }
        let e = Envelope::new(
            Address::from_names(peer.name.clone(), from.clone()),
            payload,
        );
        let pushed = match self.mailboxes.get(to.as_bytes()) {
            Some(mb) => mb.push_remote(e, held).is_ok(),
            // Dropped while the pieces came: its credit goes back with `held`.
            None => false,
        };
        if !pushed {
            self.report_missing(&to, &from, 1);
        }
        Ok(())
    }

    /// Count and report `count` messages from the peer's mailbox `from` that found no
    /// mailbox `to` here.
    fn report_missing(&self, to: &Name, from: &Name, count: u32) {
        self.mailboxes.note_missing(to, &self.peer.name, count);
        self.peer.report_undeliverable(to, from, count);
    }

    /// Report a run of messages for mailbox `to`, which does not exist: once per stretch
    /// of consecutive messages from one sender (the peer's notices are summed and bounded).
    /// With `credit`, their credit goes back to the peer too.
    fn undeliverable(&self, to: &[u8], mut data: Bytes, credit: bool) {
        // Validated with the frame: UTF-8, at most 255 bytes.
        let to = Name::new(std::str::from_utf8(to).unwrap_or("")).unwrap_or(Name::from_static(""));
        if credit {
            self.peer.flow.dropped(&to, data.len() as u64);
        }
        let mut stretch: Option<(Name, u32)> = None;
        while let Some((from, _, _)) = frame::next_message(&mut data) {
            match &mut stretch {
                Some((f, n)) if *f == from => *n += 1,
                _ => {
                    if let Some((f, n)) = stretch.replace((from, 1)) {
                        self.report_missing(&to, &f, n);
                    }
                }
            }
        }
        if let Some((f, n)) = stretch {
            self.report_missing(&to, &f, n);
        }
    }
}

/// What became of a run [`Reader::push_run`] was given.
enum Pushed {
    Queued,
    /// No mailbox of that name: its credit is still to be given back.
    NoMailbox,
    /// Its mailbox was dropped while the run was pushed, and none of that name is open
    /// now: its credit was given back (once) before this returned.
    Closed,
}

/// One read from a plain link's socket, without waiting (`WouldBlock` if nothing is
/// there): at most `first.1` bytes into `first.0`'s spare capacity, then at most `then.1`
/// into `then.0`'s (each has room for them). Returns how many in all; the first buffer
/// is filled first.
fn recv_pair(
    link: &crate::io::link::Link,
    first: (&mut Vec<u8>, usize),
    then: (&mut BytesMut, usize),
) -> std::io::Result<usize> {
    #[cfg(unix)]
    if let Some(fd) = link.plain_fd() {
        // The fd is the link's socket, open while `link` is borrowed.
        return crate::sys::recv_pair(fd, first, then);
    }
    let _ = (link, first, then);
    Err(ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests;
