//! Inputs from the network: MEMBER bodies (SWIM packets, leave notices, state asks and
//! answers), each checked (size, sender, rate) before SWIM sees it, with the updates SWIM
//! already holds taken out first (old news); and two inputs from the node: a connection
//! lost for good, and leaving.

use super::*;

impl Membership {
    /// The transport lost its connection to `name` and could not open a new one: suspect
    /// it now rather than at its next probe (it refutes if it is alive).
    pub fn handle_unreachable(&mut self, now: Instant, name: &[u8]) {
        let m = self
            .foca
            .iter_members()
            .find(|m| m.id().name.as_bytes() == name && m.state() == State::Alive)
            .map(|m| Member::new(m.id().clone(), m.incarnation(), State::Suspect));
        if let Some(m) = m {
            // One deadline per member, for this suspicion: an older one is for an
            // incarnation the member has since refuted (it was alive to suspect again).
            let deadline = now + self.cfg.suspicion_timeout;
            let entry = (deadline, m.id().clone(), m.incarnation());
            if let Some(h) = self.hinted.iter_mut().find(|h| h.1 == *m.id()) {
                *h = entry;
            } else if self.hinted.len() < self.cfg.max_members {
                self.hinted.push(entry);
            }
            let r = self
                .foca
                .apply_many(std::iter::once(m), true, &mut self.out);
            self.result(r);
            self.after(now, true);
        }
    }

    /// Leave gracefully: a leave notice to every live member, then SWIM's own leave
    /// (this node declares itself down and gossips it). Afterwards this node sends nothing
    /// more on its own.
    pub fn handle_leave(&mut self, now: Instant) {
        if self.left_cluster {
            return;
        }
        self.left_cluster = true;
        let live: Vec<MemberId> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        // The notice names the leaving boot: replayed after this node restarted (a
        // recording, or one held back on the way), it does not apply to the new one.
        let mut notice = vec![TAG_LEAVE];
        notice.extend_from_slice(&self.me().started.to_le_bytes());
        let notice = Bytes::from(notice);
        for id in live {
            self.out.sends.push_back(Send {
                to: id,
                body: notice.clone(),
                kind: Kind::Other,
            });
        }
        let r = self.foca.leave_cluster(&mut self.out);
        self.result(r);
        self.after(now, true);
        self.timers.clear();
        self.hinted.clear();
        self.held.clear();
        self.rejoin_at = None;
    }

    /// A MEMBER body from `from` (its datagram opened with the cluster key and was sealed
    /// by `from`).
    pub fn handle_frame(
        &mut self,
        now: Instant,
        from: &Name,
        body: &[u8],
    ) -> Result<(), MemberError> {
        let r = self.frame_in(now, from, body);
        // After a refused body too: SWIM may have taken part of it (see `after_walk`).
        self.after_walk(now, *r.as_ref().unwrap_or(&Walk::Not));
        r.map(|_| ())
    }

    /// MEMBER bodies read together (a socket's backlog), as `handle_frame` each, except
    /// that SWIM's member list is compared with the view once, after the last, and only
    /// for the members the packets named (`Walk::Named`). A walk of every member after
    /// each packet, at a thousand members joining (nearly every packet has news then),
    /// was most of a node's work. A body that breaks the rules goes to `refused` with
    /// the reason, and the others are taken.
    pub fn handle_frames<'a>(
        &mut self,
        now: Instant,
        frames: impl IntoIterator<Item = (&'a Name, &'a [u8])>,
        mut refused: impl FnMut(&'a Name, MemberError),
    ) {
        let (mut walk, mut any) = (Walk::Not, false);
        for (from, body) in frames {
            any = true;
            match self.frame_in(now, from, body) {
                Ok(w) => walk = walk.max(w),
                Err(e) => refused(from, e),
            }
        }
        // After refused bodies too: SWIM may have taken part of one (see `after_walk`).
        if any {
            self.after_walk(now, walk);
        }
    }

    /// One MEMBER body into SWIM; returns how much of SWIM's list may have changed (with
    /// `Walk::Named`, the members it named are noted, see `name_dirty`).
    pub(super) fn frame_in(
        &mut self,
        now: Instant,
        from: &Name,
        body: &[u8],
    ) -> Result<Walk, MemberError> {
        let Some((&tag, packet)) = body.split_first() else {
            return Err(MemberError::Empty);
        };
        if packet.len() > MAX_PACKET {
            return Err(MemberError::TooLarge {
                len: packet.len(),
                max: MAX_PACKET,
            });
        }
        if !self.admit(now, from) {
            self.counters.rate_limited += 1;
            return Ok(Walk::Not);
        }
        self.counters.packets_in += 1;
        self.counters.bytes_in += body.len() as u64;
        // How much of SWIM's member list may have changed (see `after_walk`).
        let walk;
        match tag {
            TAG_SWIM => {
                // The sender field must be the connection's peer: no member speaks for
                // another.
                let mut body = packet;
                let header: foca::Header<MemberId> = PostcardCodec
                    .decode_header(&mut body)
                    .map_err(|e| MemberError::Malformed(e.to_string()))?;
                if header.src.name != *from {
                    return Err(MemberError::Impersonation {
                        peer: from.clone(),
                        claimed: header.src.name,
                    });
                }
                // SWIM's list is full and does not know the sender: dropped before SWIM
                // would take it in (see `swim_takes`).
                if !self.swim_takes(&header.src.name, &mut Adding::default(), false) {
                    self.counters.swim_full += 1;
                    return Ok(Walk::Not);
                }
                // A packet from the member itself is direct evidence that it is alive.
                self.note_heard(now, from, header.src.started);
                let (fresh, named) = self.without_old_news(packet, &header, body);
                // "You are down": foca renews this node's identity.
                walk = if matches!(header.message, foca::Message::TurnUndead) {
                    self.dirty_all = true;
                    Walk::All
                } else {
                    named
                };
                let packet = fresh.as_deref().unwrap_or(packet);
                match self.foca.handle_data(packet, &mut self.out) {
                    Ok(()) => {}
                    Err(foca::Error::MalformedPacket | foca::Error::Decode(_)) => {
                        return Err(MemberError::Malformed(
                            "SWIM packet does not decode".to_string(),
                        ));
                    }
                    Err(_) => self.counters.ignored += 1,
                }
            }
            TAG_LEAVE => {
                let Ok(started) = <[u8; 8]>::try_from(packet).map(u64::from_le_bytes) else {
                    return Err(MemberError::Malformed(
                        "leave notice without its 8-byte boot".to_string(),
                    ));
                };
                // Among every member SWIM lists, down ones too: the leaver's own "I am
                // down" (foca's leave) may come first, by another member's gossip or in
                // this batch, and the notice still says it left (it was reported
                // suspect meanwhile, being heard from directly, then never left).
                // Only for the boot that left: a notice of an earlier boot (held back, or
                // replayed after the member restarted) says nothing of the one running now.
                let known = self
                    .foca
                    .member_by_addr(from)
                    .filter(|m| m.id().started == started)
                    .map(|m| (m.id().clone(), m.state()));
                walk = Walk::Named;
                self.name_dirty(from);
                if let Some((id, state)) = known {
                    if self.left.len() >= self.cfg.max_members {
                        self.left.clear();
                    }
                    self.left.insert(from.detached(), (id.started, id.bump));
                    if state != State::Down {
                        let r = self.foca.apply_many(
                            std::iter::once(Member::down(id)),
                            true,
                            &mut self.out,
                        );
                        self.result(r);
                    }
                }
            }
            TAG_STATE_ASK => {
                let (digest, filter) = sync::read_ask(packet)?;
                self.handle_state_ask(now, from, digest, filter)?;
                walk = Walk::Not;
            }
            TAG_STATE => {
                walk = if self.handle_state(packet)? {
                    Walk::Named
                } else {
                    Walk::Not
                }
            }
            other => return Err(MemberError::UnknownTag(other)),
        }
        Ok(walk)
    }

    /// Record that `name` (a member of the view, whose process started at `started`) was
    /// heard from directly at `now`.
    pub(super) fn note_heard(&mut self, now: Instant, name: &Name, started: u64) {
        if let Some(h) = self.heard.get_mut(name) {
            *h = (started, now);
        } else if self.view.contains_key(name) {
            self.heard.insert(name.detached(), (started, now));
        }
    }

    /// Whether a packet from `from` fits its rate (a bucket of `frames_per_second`,
    /// refilled continuously). The table is bounded: past twice the view's bound it starts
    /// over.
    pub(super) fn admit(&mut self, now: Instant, from: &Name) -> bool {
        let rate = self.cfg.frames_per_second as f64;
        if self.buckets.len() > self.cfg.max_members.saturating_mul(2)
            && !self.buckets.contains_key(from)
        {
            self.buckets.clear();
        }
        let b = self.buckets.entry(from.detached()).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + dt * rate).min(rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// `packet` (`header`, then `body`) without the updates that repeat what SWIM holds
    /// (see `swim`), or `None` when it has none (or does not decode: foca then says why).
    /// Such an update is a no-op in foca: a member's state only moves forward (a higher
    /// incarnation, alive to suspect to down, or a newer identity that wins), so what it
    /// held once it never takes back. Updates about this node are always left in.
    ///
    /// Also says how much of SWIM's member list the packet may change: nothing when every
    /// update was old news and its sender is live here under the same id and incarnation
    /// (foca takes a packet's sender as alive; a down sender is looked at again, as what
    /// is reported of it depends on when it was last heard); else the members it names
    /// (noted with `name_dirty`: its sender, its updates that are news), or all of it if
    /// it does not decode.
    pub(super) fn without_old_news(
        &mut self,
        packet: &[u8],
        header: &foca::Header<MemberId>,
        body: &[u8],
    ) -> (Option<Vec<u8>>, Walk) {
        let src_known = self.swim.get(&header.src.name).is_some_and(|h| {
            h.state != State::Down && h.is(&header.src, header.src_incarnation, h.state)
        });
        // Only these carry updates (an announce has no body; a broadcast carries none).
        let updates = !matches!(
            header.message,
            foca::Message::Announce | foca::Message::Broadcast
        );
        if !src_known {
            self.name_dirty(&header.src.name);
        }
        if !updates || body.len() < 2 {
            return match (src_known && body.is_empty(), body.is_empty()) {
                (true, _) => (None, Walk::Not),
                (false, true) => (None, Walk::Named),
                // A body foca reads otherwise (or not at all).
                (false, false) => {
                    self.dirty_all = true;
                    (None, Walk::All)
                }
            };
        }
        let count = u16::from_be_bytes([body[0], body[1]]);
        let mut rest = &body[2..];
        // The count is the sender's word: room for what a packet can hold at most.
        let mut kept: Vec<&[u8]> = Vec::with_capacity(usize::from(count).min(MAX_PACKET / 16));
        let mut old = 0;
        // Members SWIM would take in from this packet that it does not list yet (the
        // sender first), and updates about further ones dropped because its list is full.
        let mut adding = Adding::default();
        // (Taken: `frame_in` looked before.)
        self.swim_takes(&header.src.name, &mut adding, false);
        let mut full = 0;
        for _ in 0..count {
            let before = rest;
            let Ok(m): Result<Member<MemberId>, _> = PostcardCodec.decode_member(&mut rest) else {
                // foca may take some of it before it finds out: all of the list is
                // looked at, even if it then refuses the packet.
                self.dirty_all = true;
                return (None, Walk::All);
            };
            if self.is_old_news(&m) {
                old += 1;
            } else if !self.swim_takes(&m.id().name, &mut adding, m.state() == State::Down) {
                full += 1;
            } else {
                kept.push(&before[..before.len() - rest.len()]);
                self.name_dirty(&m.id().name);
                if self.fed.len() < self.cfg.max_members.saturating_mul(2) {
                    let (id, inc, state) = (m.id().clone(), m.incarnation(), m.state());
                    self.fed
                        .insert(id.name.detached(), Held::of(&id, inc, state));
                }
            }
        }
        let news = if !kept.is_empty() || !src_known {
            Walk::Named
        } else {
            Walk::Not
        };
        if old == 0 && full == 0 {
            return (None, news);
        }
        self.counters.old_news += old;
        self.counters.swim_full += full;
        let mut out = Vec::with_capacity(packet.len());
        out.extend_from_slice(&packet[..packet.len() - body.len()]);
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        for k in kept {
            out.extend_from_slice(k);
        }
        out.extend_from_slice(rest);
        (Some(out), news)
    }

    /// Whether SWIM may take in `name` (as `down`, or live) with `adding` others it does
    /// not list on their way in (`name` is counted among them if so): it lists it already
    /// (or it is this node), or it lists fewer than twice
    /// `max_members` live members (alive or suspect) with them, and fewer than four times
    /// `max_members` in all (down ones too, until forgotten). SWIM itself has no such
    /// bound: a member that went bad could gossip invented members (or send under
    /// invented names) without end, each a member SWIM keeps and probes. Down members
    /// count only toward the larger bound, so members that restarted under new names,
    /// listed as down for `forget_down_after`, do not keep newcomers out.
    pub(super) fn swim_takes(&self, name: &Name, adding: &mut Adding, down: bool) -> bool {
        if *name == self.foca.identity().name || self.foca.member_by_addr(name).is_some() {
            return true;
        }
        let live_cap = self.cfg.max_members.saturating_mul(2);
        let room = self.foca.iter_membership_state().len() + adding.all
            < live_cap.saturating_mul(2)
            && (down || self.foca.num_members() + adding.live < live_cap);
        if room {
            adding.all += 1;
            adding.live += usize::from(!down);
        }
        room
    }

    /// Whether `m` is exactly what SWIM holds of that member, or an update SWIM was
    /// given since the list was last compared (never so for this node). Applied again,
    /// SWIM would find it no newer than what it holds: a no-op.
    pub(super) fn is_old_news(&self, m: &Member<MemberId>) -> bool {
        let same = |h: &Held| h.is(m.id(), m.incarnation(), m.state());
        m.id().name != self.foca.identity().name
            && (self.swim.get(&m.id().name).is_some_and(same)
                || self.fed.get(&m.id().name).is_some_and(same))
    }
}

/// Members a packet or answer would add to SWIM's list, as it is looked through: all of
/// them, and the live ones (see `Membership::swim_takes`).
#[derive(Clone, Copy, Default)]
pub(super) struct Adding {
    live: usize,
    all: usize,
}
