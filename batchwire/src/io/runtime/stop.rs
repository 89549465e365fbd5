//! Shutting a node down: drain, goodbye, threads joined.

use super::*;

impl Runtime {
    /// Drain (flush what is queued and say goodbye, up to `shutdown_timeout`), then stop
    /// every thread and join it. Runs once.
    pub fn shutdown(&self) {
        if self.shutdown.is_shutting_down() {
            return;
        }
        info!(node = %self.name, "shutting down");
        // 0. Tell the cluster we leave (before the writers say goodbye), so members
        //    remove this node at once instead of suspecting it.
        if let Some(m) = &self.members {
            m.leave(Duration::from_millis(500));
        }
        // 1. Drain: no new sends; each writer flushes its lane, waits for its peer's
        //    acknowledgements (or the deadline) and says goodbye. Connections that break
        //    meanwhile may come back (dialers and the acceptor still run).
        self.shutdown
            .drain(Instant::now() + self.config.shutdown_timeout);
        // Writers run only while their peer has a connection or something queued: a peer
        // holding something unacknowledged or queued needs one now to flush or hand it back.
        for p in self.peers.all() {
            if p.is_connected() || !p.is_quiet() {
                p.ensure_writer();
            }
        }
        if let Some(l) = &self.shared_lane {
            l.close();
        }
        for p in self.peers.all() {
            p.lane.close();
        }
        self.writers.join_all();
        // 2. Stop: wake the ticker, the dialers and the acceptor (with a connection of its
        //    own).
        self.shutdown.stop();
        self.timer.wake();
        // Connections still resting get their readers back (which see the sweep below).
        if let Some(r) = &self.setup.resting {
            r.stop();
        }
        // Requests still waiting fail now (their replies can no longer come).
        self.ctx.calls.stop();
        // The membership thread by a datagram from its own socket (`DatagramWaker`).
        if let Some(m) = &self.members {
            m.wake();
        }
        let wake = crate::io::reachable(self.local_addr);
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        // 3. Give peers a moment to answer our goodbye by closing; then close the rest.
        let peers = self.peers.all();
        self.ctx
            .conns
            .wait_until(Instant::now() + Duration::from_millis(500), || {
                peers.iter().all(|p| p.current().is_none())
            });
        self.mailboxes.close_all();
        for p in self.peers.all() {
            if let Some(c) = p.current() {
                c.close();
            }
        }
        self.threads.join_all();
        // Writers of peers that connected during the drain.
        self.writers.join_all();
        self.events.close();
        info!(node = %self.name, "shut down");
    }
}
