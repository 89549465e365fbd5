//! Routing sends: to a peer's lane (or the shared one), to every member, to this node's own
//! mailboxes.

use super::*;

impl Runtime {
    /// Send `payload` to `to` from our mailbox `from`, in `class`; with `block`, wait for
    /// room and credit.
    pub fn send(
        &self,
        from: &Name,
        to: &Address,
        payload: Bytes,
        class: Class,
        block: bool,
    ) -> Result<(), Error> {
        self.check(&payload)?;
        let bulk = class == Class::Bulk;
        // Try without blocking; only a sender that must wait takes a reference and waits
        // outside the lookup.
        let first = |peer: &Arc<Peer>| -> Result<Option<Arc<Peer>>, Error> {
            if peer.state() == PeerState::Down {
                // On demand: dial once anyway, to learn it is back.
                peer.want_connection(true);
                return Err(Error::PeerDown(to.node.to_string()));
            }
            let m = Outgoing {
                dest: peer.id,
                to: &to.mailbox,
                from,
                payload: &payload,
                bulk,
            };
            match self.push_to(peer, m, false) {
                Ok(()) => Ok(None),
                Err(PushError::Full) if block => Ok(Some(peer.clone())),
                Err(PushError::Down) => Err(Error::PeerDown(to.node.to_string())),
                Err(e) => Err(self.push_error(e, to, payload.clone())),
            }
        };
        // The peer this thread sent to last, if this address names it (no hashing, and no
        // comparison with this node's own name: only a name past that check is
        // remembered), else the lookup, which remembers it.
        let waiting = match self.peers.last_found(to.node.as_bytes()) {
            Some(peer) => first(peer)?,
            None => {
                if to.node == self.name {
                    return self.deliver_local(from, &to.mailbox, payload, block);
                }
                let found = self
                    .peers
                    .with_remembered(to.node.as_bytes(), true, |peer| peer.map(first));
                match found {
                    Some(r) => r?,
                    // A live member that nothing was sent to yet: its peer now.
                    None => match self.member_peer(&to.node) {
                        Some(peer) => first(&peer)?,
                        None => return Err(Error::UnknownNode(to.node.to_string())),
                    },
                }
            }
        };
        let Some(peer) = waiting else {
            return Ok(());
        };
        let m = Outgoing {
            dest: peer.id,
            to: &to.mailbox,
            from,
            payload: &payload,
            bulk,
        };
        self.push_to(&peer, m, true).map_err(|e| match e {
            PushError::Down => Error::PeerDown(to.node.to_string()),
            PushError::Closed if !self.shutdown.is_shutting_down() => {
                Error::PeerDown(to.node.to_string())
            }
            e => self.push_error(e, to, payload.clone()),
        })
    }

    /// With connections on demand, the peer of member `name` if it is live in the view:
    /// made now if nothing was sent to it yet. A member costs no peer (no lane, window,
    /// session or queues) until something is sent to it or it connects: at a thousand
    /// members joining at once, making one per member as each joined was half of what a
    /// node did (1000 node processes converged in 28-31 s without it, 55 s with it,
    /// alternating on 2 vCPUs). Its dialer knows its address from the join.
    pub(super) fn member_peer(&self, name: &Name) -> Option<Arc<Peer>> {
        let members = self.members.as_ref()?;
        if !self.config.on_demand() || !members.is_live(name.as_str()) {
            return None;
        }
        match self.peers.get_or_insert_learnt(name) {
            Err(crate::io::peers::AddError::Full(_)) => {
                self.setup.make_room();
                self.peers.get_or_insert_learnt(name).ok()
            }
            r => r.ok(),
        }
    }

    /// With connections on demand, a peer for every live member (what `send_all` and
    /// `send_others` reach): made once per change of the view.
    pub(super) fn member_peers(&self) {
        let Some(members) = self.members.as_ref().filter(|_| self.config.on_demand()) else {
            return;
        };
        let g = members.generation() + 1;
        if self.member_peers_for.load(Ordering::Acquire) == g {
            return;
        }
        for name in members.live_names() {
            if self.peers.get(name.as_bytes()).is_none() {
                let _ = self.peers.get_or_insert_learnt(&name);
            }
        }
        self.member_peers_for.store(g, Ordering::Release);
    }

    /// Queue `m` toward `peer`: in its own lane, or (transfer-queue, ordinary) in the shared
    /// one after charging the peer's credit. With `block`, wait for room and credit.
    pub(super) fn push_to(&self, peer: &Peer, m: Outgoing, block: bool) -> Result<(), PushError> {
        let r = self.push_inner(peer, m, block);
        match r {
            // Written through (or held for the next connection): a writer is started by
            // what is left over, if anything (see `write::write_through`).
            Ok(true) => peer.after_push_through(),
            // The lane is closed (the node shuts down, or the peer was removed): nothing
            // came, and no writer or dialer is to start for it (one started after the
            // shutdown joined the writers would outlive it).
            Err(PushError::Closed) => {}
            // Its writer runs and a connection is on its way (see `peer::demand`).
            _ => peer.after_push(),
        }
        r.map(|_| ())
    }

    /// Returns whether the sender wrote the message through itself.
    pub(super) fn push_inner(
        &self,
        peer: &Peer,
        m: Outgoing,
        block: bool,
    ) -> Result<bool, PushError> {
        let Some(shared) = self
            .shared_lane
            .as_ref()
            .filter(|_| !peer.lane.bulk_by_itself(&m))
        else {
            // The writer is parked and the lane was quiet: write it from here (no thread
            // hand-off when there is nothing to bundle).
            let may_write = || !peer.window_full() && !crate::io::mailbox::serving_backlog();
            if peer.lane.push_direct(m, block, may_write)? == Pushed::Direct {
                crate::io::write::write_through(peer, &self.shutdown);
                return Ok(true);
            }
            return Ok(false);
        };
        // Transfer-queue: the sender waits at the door of a peer whose window is full, so
        // the shared queue never holds what only that peer could take.
        if peer.window_full() {
            if !block {
                return Err(PushError::Full);
            }
            if !peer.wait_room(&|| self.shutdown.is_shutting_down()) {
                return Err(PushError::Closed);
            }
        }
        // Behind a bulk message of its pair, it waits in the peer's bulk queue.
        let Some(charge) = peer.lane.charge_unless_bulk(&m, block)? else {
            return peer.lane.push(m, block).map(|()| false);
        };
        shared
            .push(m, block)
            .inspect_err(|_| peer.lane.refund(m.to, charge))
            .map(|()| false)
    }

    /// Send to mailbox `mailbox` on every peer (and this node if `include_self`).
    pub fn send_all(
        &self,
        from: &Name,
        mailbox: &str,
        payload: Bytes,
        include_self: bool,
    ) -> Result<(), Error> {
        let mb = all_to(mailbox)
            .ok_or_else(|| Error::InvalidName(mailbox.into(), "longer than 255 bytes"))?;
        self.check(&payload)?;
        if include_self {
            self.deliver_local(from, &mb, payload.clone(), true)?;
        }
        self.member_peers();
        let to = |node: &Name| Address::from_names(node.clone(), mb.clone());
        let m = |p: &Peer| Outgoing {
            dest: p.id,
            to: &mb,
            from,
            payload: &payload,
            bulk: false,
        };
        if let Some(lane) = &self.shared_lane {
            let peers = self.peers.all();
            if peers.is_empty() {
                return Ok(());
            }
            if !peers.iter().any(|p| p.lane.routes_to_bulk(&m(p))) {
                return self.send_all_shared(lane, &peers, m(&peers[0]), &mb, &payload);
            }
        }
        let sent = self.peers.for_each(|p| {
            if p.state() == PeerState::Down {
                return ControlFlow::Continue(());
            }
            match self.push_to(p, m(p), true) {
                // Went down meanwhile: like the peers skipped above.
                Ok(()) | Err(PushError::Down) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(self.push_error(e, &to(&p.name), payload.clone())),
            }
        });
        match sent {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(e) => Err(e),
        }
    }

    /// Transfer-queue: one message to the null destination, written to every member
    /// (JGroups' dest == null), after charging every peer's credit; it waits for every peer
    /// whose window is full.
    pub(super) fn send_all_shared(
        &self,
        lane: &Lane,
        peers: &[Arc<Peer>],
        m: Outgoing,
        mb: &Name,
        payload: &Bytes,
    ) -> Result<(), Error> {
        let stopping = || self.shutdown.is_shutting_down();
        let shut = || Error::ShutDown {
            payload: Some(payload.clone()),
        };
        let mut charged = Vec::with_capacity(peers.len());
        let refund = |charged: &[(&Arc<Peer>, u64)]| {
            for (p, c) in charged {
                p.lane.refund(mb, *c);
            }
        };
        for p in peers {
            if p.window_full() && !p.wait_room(&stopping) && stopping() {
                refund(&charged);
                return Err(shut());
            }
            match p.lane.charge(&Outgoing { dest: p.id, ..m }, true) {
                Ok(c) => charged.push((p, c)),
                Err(e) => {
                    refund(&charged);
                    let to = Address::from_names(p.name.clone(), mb.clone());
                    return Err(self.push_error(e, &to, payload.clone()));
                }
            }
        }
        lane.push(Outgoing { dest: ALL, ..m }, true)
            .map_err(|e| {
                refund(&charged);
                let to = Address::from_names(self.name.clone(), mb.clone());
                self.push_error(e, &to, payload.clone())
            })
            .map(|()| peers.iter().for_each(|p| p.after_push()))
    }

    pub(super) fn check(&self, payload: &Bytes) -> Result<(), Error> {
        if payload.len() > self.config.max_payload {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if self.shutdown.is_shutting_down() {
            return Err(Error::ShutDown {
                payload: Some(payload.clone()),
            });
        }
        Ok(())
    }

    pub(super) fn push_error(&self, e: PushError, to: &Address, payload: Bytes) -> Error {
        match e {
            PushError::Full => Error::Full {
                to: to.to_string(),
                payload,
            },
            PushError::Closed => Error::ShutDown {
                payload: Some(payload),
            },
            PushError::Down => Error::PeerDown(to.node.to_string()),
            PushError::TooLarge(max) => Error::PayloadTooLarge {
                len: payload.len(),
                max: max as usize,
            },
        }
    }

    pub(super) fn deliver_local(
        &self,
        from: &Name,
        to: &Name,
        payload: Bytes,
        block: bool,
    ) -> Result<(), Error> {
        if call::is_reply_inbox(to.as_bytes()) {
            self.ctx
                .calls
                .replies_from_wire(&self.name, std::iter::once((from.clone(), payload)));
            return Ok(());
        }
        let missing = |count| {
            if let Some((id, _)) = call::parse(from.as_bytes()) {
                let to = format!("{to}@{}", self.name);
                self.ctx
                    .calls
                    .fail_from(id, &self.name, Error::Undeliverable { to });
            }
            self.mailboxes.note_missing(to, &self.name, count);
            self.events.emit(Event::Undeliverable {
                to: Address::from_names(self.name.clone(), to.clone()),
                from: from.to_string(),
                count: count as u64,
            });
        };
        let mut mb = self.mailboxes.get_local(to.as_bytes());
        let mut e = Envelope::new(
            Address::from_names(self.name.clone(), from.clone()),
            payload,
        );
        for again in [false, true] {
            let Some(q) = mb.take() else { break };
            match q.push_one(e, block) {
                Ok(()) => {
                    self.local_messages.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err((e, _)) if self.shutdown.is_shutting_down() => {
                    return Err(Error::ShutDown {
                        payload: Some(e.payload),
                    });
                }
                Err((e, Refused::Full)) => {
                    return Err(Error::Full {
                        to: format!("{to}@{}", self.name),
                        payload: e.payload,
                    });
                }
                // Dropped since this thread last delivered to it, or while it waited for
                // room: a mailbox opened again under the name takes it (the table is
                // asked once more), else it has none.
                Err((back, Refused::Closed)) => {
                    e = back;
                    mb = (!again)
                        .then(|| self.mailboxes.get_again(to.as_bytes()))
                        .flatten()
                        .filter(|fresh| !Arc::ptr_eq(fresh, &q));
                }
            }
        }
        missing(1);
        Ok(())
    }
}
