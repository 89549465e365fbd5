//! Mailboxes claimed and released; peers and members waited for; stats.

use super::*;

impl Runtime {
    /// This node's incarnation (its start time in microseconds).
    pub fn incarnation(&self) -> u64 {
        self.setup.incarnation
    }

    /// The queue of mailbox `name`, new or declared; fails if a handle owns it already.
    pub fn claim_mailbox(&self, name: &str) -> Result<Arc<MailboxQueue>, Error> {
        let n = node_name(name)?;
        if call::is_reserved(n.as_bytes()) {
            return Err(Error::InvalidName(name.into(), RESERVED_NAME));
        }
        let q = self.mailboxes.get_or_insert(&n, || {
            MailboxQueue::new(n.clone(), self.config.mailbox_bytes, self.idle)
        });
        if q.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::MailboxExists(name.into()));
        }
        Ok(q)
    }

    /// A mailbox handle was dropped.
    pub fn release_mailbox(&self, q: &Arc<MailboxQueue>) {
        let dropped = self.mailboxes.remove(q);
        if dropped.is_empty() || self.shutdown.is_shutting_down() {
            return;
        }
        let left: u64 = dropped.iter().map(|d| u64::from(d.2)).sum();
        warn!(node = %self.name, mailbox = %q.name, left, "mailbox dropped with unreceived messages; their senders are told they were undeliverable");
        // Each sending node hears of it as of messages that found no mailbox: an
        // `Undeliverable` event there, and a request among them fails at once rather than
        // at its timeout. (Messages sent from this node were the application's own.)
        for (node, from, count) in dropped {
            if node != self.name
                && let Some(p) = self.peers.get(node.as_bytes())
            {
                p.report_undeliverable(&q.name, &from, count);
            }
        }
    }

    /// Wait until every named peer is connected, up to `timeout`.
    /// With connections on demand, waiting for a peer asks for a connection to it (and
    /// the idle close ends it later if nothing is sent).
    pub fn wait_for_peers(&self, names: &[&str], timeout: Duration) -> bool {
        let deadline = crate::io::deadline_after(timeout);
        loop {
            if self.config.on_demand() {
                for n in names {
                    let p = self
                        .peers
                        .get(n.as_bytes())
                        .or_else(|| Name::new(n).and_then(|name| self.member_peer(&name)));
                    if let Some(p) = p
                        && !p.is_connected()
                    {
                        p.want_connection(true);
                    }
                }
            }
            // A member learnt meanwhile is asked for at the next look.
            let look = (Instant::now() + Duration::from_millis(100)).min(deadline);
            let up = self.ctx.conns.wait_until(look, || {
                let up = self.connected_peers();
                names.iter().all(|n| up.iter().any(|u| u == n))
            });
            if up || Instant::now() >= deadline {
                return up;
            }
        }
    }

    /// Names of the peers with a live connection whose session is up (a send to one is
    /// taken: the connection's RESUME is done).
    pub fn connected_peers(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .peers
            .all()
            .iter()
            .filter(|p| p.current().is_some_and(|c| !c.is_closed()) && p.state() == PeerState::Up)
            .map(|p| p.name.to_string())
            .collect();
        v.sort();
        v
    }

    /// Close every connection now, as a network failure would. Returns how many.
    pub fn break_connections(&self) -> usize {
        let mut n = 0;
        for p in self.peers.all() {
            if let Some(c) = p.current() {
                c.close();
                n += 1;
            }
        }
        n
    }

    /// Threads running now.
    pub fn threads(&self) -> usize {
        self.threads.running() + self.writers.running()
    }

    pub fn stats(&self) -> NodeStats {
        let mut peers: Vec<PeerStats> = self
            .peers
            .all()
            .iter()
            .map(|p| {
                let connected = p.current().is_some_and(|c| !c.is_closed());
                let mut s = p.stats.snapshot(p.name.to_string(), connected);
                s.queue_high_water = p.lane.high_water.load(Ordering::Relaxed);
                s.blocked_us = p.lane.blocked_ns.load(Ordering::Relaxed) / 1000;
                s.queued = p.lane.queued() as u64;
                s.credit_stalls = p.lane.credit_stalls.load(Ordering::Relaxed);
                s.credit_mismatched = p.lane.credit_mismatched();
                s.unacked_bytes = p.session(|s, _| s.window_bytes()) as u64;
                s
            })
            .collect();
        if let Some(l) = &self.shared_lane {
            // One queue for all: its figures go to every peer.
            for s in &mut peers {
                s.queue_high_water = l.high_water.load(Ordering::Relaxed);
                s.blocked_us += l.blocked_ns.load(Ordering::Relaxed) / 1000;
                s.queued += l.queued() as u64;
            }
        }
        peers.sort_by(|a, b| a.peer.cmp(&b.peer));
        let sent = peers.iter().map(|p| p.bytes_sent).sum();
        self.node_stats(peers, sent)
    }

    /// `stats` without the peers' counters (`peers` empty, `bytes_sent` their sum): a
    /// load a peer, where `stats` builds each peer's whole snapshot.
    pub fn stats_brief(&self) -> NodeStats {
        let sent = self
            .peers
            .all()
            .iter()
            .map(|p| p.stats.bytes_sent.load(Ordering::Relaxed))
            .sum();
        self.node_stats(Vec::new(), sent)
    }

    /// The node's own counters around `peers`.
    pub(super) fn node_stats(&self, peers: Vec<PeerStats>, bytes_sent: u64) -> NodeStats {
        NodeStats {
            node: self.name.to_string(),
            peers,
            bytes_sent,
            undeliverable: self.mailboxes.missing(),
            local_messages: self.local_messages.load(Ordering::Relaxed),
            handshakes: self
                .setup
                .security
                .snapshot(self.setup.pending_handshakes() as u64),
            events_dropped: self.events.dropped(),
            membership: self.membership_stats(),
            requests: self.request_stats(),
            reassembly_bytes: self.ctx.reassembly.used(),
        }
    }

    pub(super) fn request_stats(&self) -> RequestStats {
        let c = &self.ctx.calls.counters;
        RequestStats {
            pending: self.ctx.calls.pending() as u64,
            sent: c.sent.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            late_replies: c.late_replies.load(Ordering::Relaxed),
            stray_replies: c.stray_replies.load(Ordering::Relaxed),
        }
    }

    pub(super) fn membership_stats(&self) -> MembershipStats {
        let s = &self.member_stats;
        MembershipStats {
            packets_in: s.packets_in.load(Ordering::Relaxed),
            bytes_in: s.bytes_in.load(Ordering::Relaxed),
            packets_out: s.packets_out.load(Ordering::Relaxed),
            probes_out: s.probes_out.load(Ordering::Relaxed),
            gossip_out: s.gossip_out.load(Ordering::Relaxed),
            state_out: s.state_out.load(Ordering::Relaxed),
            bytes_out: s.bytes_out.load(Ordering::Relaxed),
            rate_limited: s.rate_limited.load(Ordering::Relaxed),
            violations: s.violations.load(Ordering::Relaxed),
            inputs_dropped: self.members.as_ref().map_or(0, |m| m.dropped()),
            members_refused: s.members_refused.load(Ordering::Relaxed),
            swim_full: s.swim_full.load(Ordering::Relaxed),
            datagrams_refused: s.refused.load(Ordering::Relaxed),
            send_errors: s.send_errors.load(Ordering::Relaxed),
        }
    }

    /// The membership view (empty with membership off).
    pub fn members(&self) -> Vec<crate::event::Member> {
        self.members
            .as_ref()
            .map(|m| m.view().to_vec())
            .unwrap_or_default()
    }

    /// Wait until `cond` holds for the view, up to `timeout` (polls every 10 ms).
    pub fn wait_for_members(
        &self,
        timeout: Duration,
        cond: impl Fn(&[crate::event::Member]) -> bool,
    ) -> bool {
        let deadline = crate::io::deadline_after(timeout);
        loop {
            if cond(&self.members()) {
                return true;
            }
            if Instant::now() >= deadline || !self.shutdown.sleep(Duration::from_millis(10)) {
                return false;
            }
        }
    }
}
