//! The lane's send credit toward the peer's mailboxes: charged per send, given back by
//! CREDIT, recounted by SYNC.

use super::*;

impl Lane {
    /// Transfer-queue: charge this peer's credit for an ordinary message that goes through
    /// the shared lane (waiting for credit with `block`). Returns the charge. It counts as
    /// queued toward the peer until the bundler reports it taken ([`Lane::note_taken`]).
    pub fn charge(&self, m: &Outgoing, block: bool) -> Result<u64, PushError> {
        let g = self.lock();
        self.charge_locked(g, m, block)
    }

    pub(super) fn charge_locked<'a>(
        &'a self,
        g: MutexGuard<'a, Inner>,
        m: &Outgoing,
        block: bool,
    ) -> Result<u64, PushError> {
        if let Some(max) = g.credit.peer_max_payload()
            && m.payload.len() as u64 > max
        {
            return Err(PushError::TooLarge(max));
        }
        let mut g = self.wait_for(g, block, (Wants::Credit, m.to), |g| {
            if g.credit.admits(m.to.as_bytes()) {
                Ok(())
            } else {
                Err(true)
            }
        })?;
        let charge = message_len(m.to, m.from, m.payload.len()) as u64;
        g.credit.try_charge(m.to, charge);
        g.pushed += 1;
        Ok(charge)
    }

    /// Transfer-queue: like [`Lane::charge`], unless `m` goes to this lane's bulk queue
    /// (behind a bulk message of its pair): then `None`, nothing charged. One lock for
    /// both questions (the sender's path takes it once per message).
    pub fn charge_unless_bulk(&self, m: &Outgoing, block: bool) -> Result<Option<u64>, PushError> {
        let g = self.lock();
        if self.is_bulk(&g, m) {
            return Ok(None);
        }
        self.charge_locked(g, m, block).map(Some)
    }

    /// Whether `m` goes to the bulk queue whatever is queued: sent as bulk, or too large
    /// for one piece (no lock).
    pub fn bulk_by_itself(&self, m: &Outgoing) -> bool {
        m.bulk || m.payload.len() > self.piece_bytes
    }

    /// Transfer-queue: a charged message was not queued after all.
    pub fn refund(&self, to: &Name, bytes: u64) {
        let mut g = self.lock();
        g.credit.grant(to.as_bytes(), bytes);
        g.pushed -= 1;
        self.room_freed(&mut g);
    }

    /// Transfer-queue: the bundler numbered (or failed) `n` ordinary messages for the peer.
    pub fn note_taken(&self, n: u64) {
        let mut g = self.lock();
        g.taken += n;
        if g.bulk.ready(g.taken) {
            self.bump(&mut g);
            self.not_empty.notify_all();
        }
    }

    /// The peer gave credit back, in a CREDIT that came on connection `on`. Grants on a
    /// connection older than the one whose SYNC was recounted last are ignored: the peer
    /// took them before that SYNC's snapshot, which already left them out. (Checked here,
    /// under the lock the recount takes: a reader that checked its connection was current
    /// could apply them just after a successor's recount.)
    ///
    /// Returns the bytes given back beyond what was charged (clamped and counted in
    /// [`Lane::credit_mismatched`]): zero unless the peer misbehaves.
    pub fn grant(&self, on: ConnId, grants: &[(Name, u64)]) -> u64 {
        let mut g = self.lock();
        if g.synced_on.is_some_and(|s| on < s) {
            return 0;
        }
        let before = g.credit.mismatched();
        for (name, bytes) in grants {
            g.credit.grant(name.as_bytes(), *bytes);
        }
        self.room_freed(&mut g);
        g.credit.mismatched() - before
    }

    /// The peer's SYNC, which came on connection `on`: add what this lane still has
    /// queued to `totals` (each mailbox's charge held at the peer and in flight, which the
    /// caller summed), and make that the credit's account. `dest` is the peer's tag in the outbox.
    /// Returns false (and does nothing) if the writer moved anything since `moves` was
    /// read ([`Lane::moves`]): the caller counts the window again. A SYNC on a connection
    /// older than the last recount's is stale: ignored (returns true).
    pub fn sync_credit(
        &self,
        on: ConnId,
        moves: Option<u64>,
        dest: Dest,
        window: u64,
        max_payload: u64,
        totals: &mut NameMap<u64>,
    ) -> bool {
        let mut g = self.lock();
        if g.synced_on.is_some_and(|s| on < s) {
            return true;
        }
        if moves.is_some_and(|m| m != self.moves()) {
            return false;
        }
        g.synced_on = Some(on);
        let Inner { outbox, bulk, .. } = &mut *g;
        // `totals` holds the peer's figures: they may be anything.
        let mut add = |to: &Name, b: u64| {
            let e = totals.entry(to.clone()).or_default();
            *e = e.saturating_add(b);
        };
        outbox.charges(dest, &mut add);
        bulk.charges(&mut add);
        g.credit.sync(window, max_payload, totals);
        self.room_freed(&mut g);
        true
    }

    /// The shared lane's part of a SYNC recount: what it has queued for `dest`.
    pub fn charges_for(&self, dest: Dest, totals: &mut NameMap<u64>) {
        self.lock().outbox.charges(dest, |to, b| {
            let e = totals.entry(to.clone()).or_default();
            *e = e.saturating_add(b);
        });
    }

    /// Grants for more than was charged, clamped (zero unless the peer misbehaves).
    /// Whether every charge toward the peer's mailboxes was given back.
    pub fn credit_settled(&self) -> bool {
        self.lock().credit.is_settled()
    }

    pub fn credit_mismatched(&self) -> u64 {
        self.lock().credit.mismatched()
    }

    /// The credit window the peer announced (or the initial one).
    #[cfg(test)]
    pub fn credit_window(&self) -> u64 {
        self.lock().credit.window()
    }
}
