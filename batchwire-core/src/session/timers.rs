//! Timers and outputs: acknowledgement delays, heartbeats, the failure detector,
//! control frames, shutdown.

use super::*;

impl Session {
    /// Time passed: delayed acknowledgements, heartbeats, the failure detector, and the
    /// shutdown deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.ack_deadline.is_some_and(|t| now >= t) {
            self.ack_deadline = None;
            self.ack_due = true;
        }
        let hb = self.cfg.heartbeat_interval;
        let timeout = self.cfg.peer_timeout;
        if let Some(c) = self.current {
            if now >= c.last_sent + hb {
                self.heartbeat_due = true;
            }
            if self.state == PeerState::Up
                && self.paused == 0
                && now >= c.last_heard + timeout
                && self.closing.is_none()
            {
                self.current = None;
                self.disconnected_since = now;
                self.events.push_back(SessionEvent::Close { conn: c.id });
                self.declare_down(DownReason::Silent { after: timeout });
            }
        } else if self.parked {
            // Something was held since it parked: a connection is wanted from now on.
            if self.send.messages() > 0 {
                self.parked = false;
                self.disconnected_since = now;
            }
        } else if self.state == PeerState::Up
            && now >= self.disconnected_since + timeout
            && self.closing.is_none()
        {
            self.declare_down(DownReason::Unreachable { after: timeout });
        } else if let Some(within) = self
            .reach
            .filter(|_| self.state == PeerState::Connecting && self.closing.is_none())
        {
            // Never reached: the clock runs from the first message held (see
            // `require_reach`), and stops when nothing is.
            match self.wanted {
                _ if self.send.messages() == 0 => self.wanted = None,
                None => self.wanted = Some(now),
                Some(t) if now >= t + within => {
                    self.wanted = None;
                    let messages = self.send.take_failed(false);
                    self.push_failed(messages, FailReason::Unreached { after: within });
                }
                Some(_) => {}
            }
        }
        if self.closing.is_some_and(|t| now >= t) && self.send.messages() > 0 {
            let messages = self.send.take_failed(false);
            self.push_failed(messages, FailReason::ShutDown);
        }
    }

    /// The cluster membership declared the peer's `incarnation` down (or it left): close
    /// its connection and declare it down now. Returns whether it did. A newer
    /// incarnation, already connected, is left alone; so is a peer heard on its current
    /// connection within `peer_timeout` (direct evidence comes before what the cluster
    /// says: if it really is gone, this session's own detector finds it).
    pub fn handle_declared_down(&mut self, now: Instant, incarnation: u64) -> bool {
        if self.incarnation.is_some_and(|i| i != incarnation) || self.closing.is_some() {
            return false;
        }
        if self
            .current
            .is_some_and(|c| now < c.last_heard + self.cfg.peer_timeout)
        {
            return false;
        }
        if let Some(c) = self.current.take() {
            self.disconnected_since = now;
            self.events.push_back(SessionEvent::Close { conn: c.id });
        }
        self.declare_down(DownReason::Membership);
        true
    }

    /// The cluster membership says the peer is back (it joined again, perhaps as a new
    /// incarnation) while this session holds it down: sends are taken again and wait for a
    /// connection as for a peer never connected (with connections on demand the first one
    /// dials). If it is not back after all, the membership declares it down again.
    /// Returns whether it was down.
    /// `incarnation` is the one the membership reports: a new one starts the session over
    /// now (as a connection to it would), so what is sent from now on is for it.
    pub fn handle_member_back(&mut self, incarnation: u64) -> bool {
        if self.state != PeerState::Down || self.closing.is_some() {
            return false;
        }
        if self.incarnation.is_some_and(|i| i != incarnation) {
            self.start_over(FailReason::Restarted);
            self.events
                .push_back(SessionEvent::Restarted { incarnation });
        }
        self.incarnation = Some(incarnation);
        self.state = PeerState::Connecting;
        self.down_reason = None;
        true
    }

    /// The peer's incarnation if its current connection was heard within `peer_timeout`
    /// (a live node holds the name: another incarnation claiming it is refused).
    pub fn live_incarnation(&self, now: Instant) -> Option<u64> {
        self.current
            .filter(|c| now < c.last_heard + self.cfg.peer_timeout)
            .and(self.incarnation)
    }

    /// When [`Session::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.peer_timeout;
        let mut t = self.ack_deadline;
        let mut at = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        match self.current {
            Some(c) => {
                if !self.heartbeat_due {
                    at(c.last_sent + self.cfg.heartbeat_interval);
                }
                if self.state == PeerState::Up && self.paused == 0 && self.closing.is_none() {
                    at(c.last_heard + timeout);
                }
            }
            // Parked with something held since: due now (the clock starts again).
            None if self.parked && self.send.messages() > 0 => at(self.disconnected_since),
            None if self.parked => {}
            None if self.state == PeerState::Up && self.closing.is_none() => {
                at(self.disconnected_since + timeout)
            }
            // Never reached, something held: due now to start the clock, then at its end.
            None if self.state == PeerState::Connecting
                && self.reach.is_some()
                && self.closing.is_none()
                && self.send.messages() > 0 =>
            {
                let within = self.reach.unwrap_or(timeout);
                at(self.wanted.map_or(self.disconnected_since, |t| t + within))
            }
            None => {}
        }
        if let Some(deadline) = self.closing.filter(|_| self.send.messages() > 0) {
            at(deadline);
        }
        t
    }

    /// The next control frame for connection `id`: an acknowledgement (which is also the
    /// heartbeat) when one is due. Due whatever the send window holds; never after the
    /// goodbye ([`Session::poll_close`]), which is the last thing written. The frame counts as
    /// sent at `now` (the caller writes it next), so the heartbeat clock restarts here.
    pub fn poll_control(&mut self, now: Instant, id: ConnId) -> Option<Frame> {
        if !self.is_current(id) || self.said_goodbye || !(self.ack_due || self.heartbeat_due) {
            return None;
        }
        self.note_sent(now, id);
        self.ack_due = false;
        self.heartbeat_due = false;
        self.ack_deadline = None;
        self.unacked_messages = 0;
        self.unacked_bytes = 0;
        Some(Frame::Ack(self.recv.next()))
    }

    /// Whether [`Session::poll_control`] has something for connection `id`.
    pub fn control_due(&self, id: ConnId) -> bool {
        self.is_current(id) && (self.ack_due || self.heartbeat_due)
    }

    /// The next event to act on.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// This node is shutting down: unacknowledged messages are given up at `deadline`.
    pub fn begin_close(&mut self, deadline: Instant) {
        self.closing = Some(deadline);
    }

    /// Shutting down, with nothing more `queued` to hold: once the peer has acknowledged
    /// everything (or the deadline passed and the rest was failed), the goodbye for
    /// connection `id`: a final acknowledgement, so the peer does not fail what arrived,
    /// then GOODBYE. Given once.
    pub fn poll_close(&mut self, now: Instant, id: ConnId, queued: bool) -> Option<[Frame; 2]> {
        self.handle_timeout(now);
        if self.closing.is_none() || self.said_goodbye || queued || !self.is_current(id) {
            return None;
        }
        let before_deadline = self.closing.is_some_and(|t| now < t);
        if self.cfg.reliable && self.send.messages() > 0 {
            return None;
        }
        // The final acknowledgement must cover a delivery in progress (unless time is up).
        if self.delivering && before_deadline {
            return None;
        }
        self.said_goodbye = true;
        Some([Frame::Ack(self.recv.next()), Frame::Goodbye])
    }

    /// Whether this session has nothing left to do at shutdown: it said goodbye, or the
    /// peer is not connected and nothing is held for it.
    pub fn is_closed(&self) -> bool {
        self.said_goodbye || (self.current.is_none() && self.send.messages() == 0)
    }

    /// Shutting down without a connection: fail whatever is held (there is nobody to say
    /// goodbye to).
    pub fn abandon(&mut self) {
        let messages = self.send.take_failed(false);
        self.push_failed(messages, FailReason::ShutDown);
    }

    // ---- internals ----------------------------------------------------------------------

    pub(super) fn declare_down(&mut self, reason: DownReason) {
        if self.state == PeerState::Down {
            return;
        }
        self.state = PeerState::Down;
        self.parked = false;
        self.wanted = None;
        self.down_reason = Some(reason);
        // The rest of a message in pieces is handed back from the queue.
        self.in_pieces = None;
        self.events.push_back(SessionEvent::Down { reason });
        let messages = self.send.take_failed(false);
        self.push_failed(messages, FailReason::Down(reason));
    }

    pub(super) fn push_failed(&mut self, messages: Vec<Message>, reason: FailReason) {
        if !messages.is_empty() {
            self.events
                .push_back(SessionEvent::Failed { messages, reason });
        }
    }
}
