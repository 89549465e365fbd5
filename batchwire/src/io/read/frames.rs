//! What each frame does: sessions, credit, deliveries to mailboxes, replies, pieces,
//! undeliverable notices.

use super::*;

impl Reader<'_> {
    /// Act on one frame. Returns true on GOODBYE.
    pub(super) fn handle(
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
                // its successor recounts them (the lane checks again, atomically with
                // that recount).
                if peer.session(|s, _| s.current() == Some(id)) {
                    let excess = peer.lane.grant(id, &c.grants);
                    if excess > 0 {
                        warn_limited!(peer = %peer.name, bytes = excess, "peer gave back more credit than this node charged to its mailboxes: clamped (counted in credit_mismatched)");
                    }
                }
            }
            // A SYNC on a replaced connection, or behind what the window holds, is stale
            // (see `recount`).
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
    /// A stale SYNC is ignored: one on a connection no longer current, or as of a message
    /// the window no longer holds (its receiver took it for an earlier connection; the
    /// RESUME since took out what came after it). Counted, it would leave that out, and
    /// the peer's grants for it would exceed the charge.
    pub(super) fn recount(&self, sy: Sync) {
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
            let current = peer.session(|s, _| {
                s.charges_from(self.conn.id, sy.next, |to, b| {
                    let e = totals.entry(to.clone()).or_default();
                    *e = e.saturating_add(b);
                })
            });
            if !current {
                tracing::debug!(peer = %peer.name, next = sy.next, "stale SYNC ignored (its connection was replaced, or the window moved past it)");
                return;
            }
            let check = (tries < 1000).then_some(moves);
            if peer.lane.sync_credit(
                self.conn.id,
                check,
                peer.id,
                sy.window,
                sy.max_payload,
                &mut totals,
            ) {
                return;
            }
        }
    }

    /// Deliver a frame's messages, in runs, and commit how far it got.
    pub(super) fn deliver(
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
    pub(super) fn push_run(
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
    pub(super) fn replies(&self, mut data: Bytes) -> Result<(), LinkError> {
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
    pub(super) fn piece(
        &self,
        f: &Fragment,
        in_place: Option<&FragmentHead>,
    ) -> Result<(), LinkError> {
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
    pub(super) fn drop_in_place(&self, in_place: Option<&FragmentHead>) {
        if let Some(h) = in_place {
            self.peer
                .lock_reassembly()
                .drop_direct(&h.piece, self.conn.id);
        }
    }

    /// Whether a message starting with piece `f` is kept: not larger than this node
    /// accepts, for a mailbox here (or a reply to a call), and with room in the node's
    /// reassembly budget.
    pub(super) fn keeps_new(&self, f: &Fragment) -> bool {
        self.wanted(f) && self.peer.reassembly_has_room(f.total)
    }

    /// Whether a message starting with piece `f` would be kept if there were room.
    pub(super) fn wanted(&self, f: &Fragment) -> bool {
        f.total <= self.max_payload
            && (call::is_reply_inbox(f.to.as_bytes())
                || self.mailboxes.get(f.to.as_bytes()).is_some())
    }

    pub(super) fn add_piece(
        &self,
        f: &Fragment,
        in_place: Option<&FragmentHead>,
    ) -> Result<(), LinkError> {
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
    pub(super) fn report_missing(&self, to: &Name, from: &Name, count: u32) {
        self.mailboxes.note_missing(to, &self.peer.name, count);
        self.peer.report_undeliverable(to, from, count);
    }

    /// Report a run of messages for mailbox `to`, which does not exist: once per stretch
    /// of consecutive messages from one sender (the peer's notices are summed and bounded).
    /// With `credit`, their credit goes back to the peer too.
    pub(super) fn undeliverable(&self, to: &[u8], mut data: Bytes, credit: bool) {
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
