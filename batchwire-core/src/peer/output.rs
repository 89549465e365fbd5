//! Outputs: the writer's round (control first), the goodbye, deliveries, reports, events,
//! the next deadline.

use super::*;

impl Peer {
    /// The writer's round, onto `out` while it holds less than `room` bytes: control first
    /// (acknowledgements, heartbeats), then this node's SYNC and credit grants, then the
    /// next ordinary batch (unless the window is full), then pieces while the session has
    /// bulk room, then what the window holds that the connection has not had yet.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>, room: usize) {
        // The goodbye is the last thing written (the write side is shut after it): nothing
        // after it, nor a bundler's deadline to come back for.
        if self.s.said_goodbye() {
            self.bundle_at = None;
            return;
        }
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
                    self.flushes[reason.index()] += 1;
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
