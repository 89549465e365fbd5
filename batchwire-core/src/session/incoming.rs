//! What the peer sends: liveness, acknowledgements, goodbye, deliveries, pausing.

use super::*;

impl Session {
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
}
