//! A peer's connections (installed, replaced, waited for), its delivery turn, and the
//! undeliverable notices it owes.

use super::*;

impl Peer {
    /// The current connection.
    pub fn current(&self) -> Option<Arc<Conn>> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Make `conn` the current connection; returns the one it replaces.
    pub fn install(&self, conn: Arc<Conn>) -> Option<Arc<Conn>> {
        let old = self
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(conn);
        self.set_connected(true);
        // Installed in a session turn: the caller starts the writer after it (a thread
        // start is no work for a session lock).
        self.lane.nudge();
        self.ctx.conns.changed();
        old
    }

    /// Take the snapshot for a SYNC as of what the session received, in the same session
    /// turn (see `Flow::snapshot`), for the connection current then (none: nothing to
    /// take; the next connection's reader takes one), and wake the writer. Whichever
    /// connection's reader asks: one taken after a successor's RESUME is right for the
    /// successor, and one taken before it is never written there.
    pub fn snapshot_credit(&self) {
        self.session(|s, _| {
            if let Some(on) = s.current() {
                self.flow.snapshot(on, s.recv_next());
            }
        });
        self.flow.wake_writer();
    }

    /// Whether the current connection is live, canonical (see `Conn::canonical`) and to
    /// the peer's `incarnation`.
    pub fn has_live_canonical(&self, incarnation: u64) -> bool {
        self.current_is_live_canonical()
            && self.session(|s, _| s.incarnation()) == Some(incarnation)
    }

    /// Whether the current connection is live and canonical (no session lock taken: for
    /// use inside `Peer::session`).
    pub fn current_is_live_canonical(&self) -> bool {
        self.current()
            .is_some_and(|c| c.canonical && !c.is_closed())
    }

    /// Forget `conn` if it is still the current connection.
    pub fn uninstall(&self, conn: &Arc<Conn>) {
        let mut g = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *g = None;
            self.set_connected(false);
        }
        drop(g);
        self.lane.poke();
        self.ctx.conns.changed();
    }

    /// The turn to deliver: only one reader of this peer delivers at a time. While waiting
    /// for it the reader does not listen, so silence is not counted meanwhile.
    pub fn delivery_turn(&self) -> MutexGuard<'_, ()> {
        if let Ok(g) = self.delivery.try_lock() {
            return g;
        }
        self.session(|s, now| s.set_paused(now, true));
        let g = self.delivery.lock().unwrap_or_else(|p| p.into_inner());
        self.session(|s, now| s.set_paused(now, false));
        g
    }

    /// Tell the peer that `count` messages from its mailbox `from` to our mailbox `to`
    /// found no such mailbox: summed with earlier notices, sent with the next write.
    pub fn report_undeliverable(&self, to: &Name, from: &Name, count: u32) {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        match n.pairs.iter().position(|(t, f, _)| t == to && f == from) {
            Some(i) => n.pairs[i].2 = n.pairs[i].2.saturating_add(count),
            None if n.pairs.len() < NOTICE_PAIRS => n.pairs.push((to.clone(), from.clone(), count)),
            None => n.summary = n.summary.saturating_add(count),
        }
        self.has_notices.store(true, Ordering::Release);
        drop(n);
        self.lane.poke();
    }

    /// Encode up to `NOTICES_PER_WRITE` waiting notices into `out` (the writer's control
    /// path). Returns them, to put back with [`Peer::restore_notices`] if the write fails.
    pub fn take_notices(&self, out: &mut Vec<u8>) -> Vec<(Name, Name, u32)> {
        let mut taken = Vec::new();
        if !self.has_notices() {
            return taken;
        }
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        let empty = Name::from_static("");
        for _ in 0..NOTICES_PER_WRITE {
            let (to, from, count) = match n.pairs.pop() {
                Some(p) => p,
                None if n.summary > 0 => {
                    let c = std::mem::take(&mut n.summary);
                    (empty.clone(), empty.clone(), c)
                }
                None => break,
            };
            Frame::Undeliverable(Undeliverable {
                count,
                to: to.clone(),
                from: from.clone(),
            })
            .encode(out);
            taken.push((to, from, count));
        }
        self.has_notices
            .store(!n.pairs.is_empty() || n.summary > 0, Ordering::Release);
        taken
    }

    /// Notices whose write failed: counted again, for the next connection.
    pub fn restore_notices(&self, notices: Vec<(Name, Name, u32)>) {
        for (to, from, count) in notices {
            self.report_undeliverable(&to, &from, count);
        }
    }

    /// Whether notices wait (no lock).
    pub fn has_notices(&self) -> bool {
        self.has_notices.load(Ordering::Acquire)
    }

    /// The membership declared this peer's `incarnation` down (or it left).
    pub fn declare_down(&self, incarnation: u64) -> bool {
        self.session(|s, now| s.handle_declared_down(now, incarnation))
    }
}
