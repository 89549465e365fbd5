//! A session's connections: connect, resume, reset, disconnect, parking.

use super::*;

impl Session {
    /// A new connection authenticated the peer as `incarnation`. Returns the connection's
    /// id and the RESUME to send on it first. A new incarnation means the peer restarted:
    /// what was pending for the old one is failed, numbering starts again both ways, and
    /// the old incarnation's connection, if it is still current, is dropped (a
    /// [`SessionEvent::Close`]): nothing numbered anew is written on it, and nothing read
    /// on it counts against the new numbering.
    pub fn handle_connect(&mut self, now: Instant, incarnation: u64) -> (ConnId, Resume) {
        if self.incarnation.is_some_and(|i| i != incarnation) {
            self.start_over(FailReason::Restarted);
            if let Some(c) = self.current.take() {
                self.events.push_back(SessionEvent::Close { conn: c.id });
                self.disconnected_since = now;
            }
            self.events
                .push_back(SessionEvent::Restarted { incarnation });
        }
        self.incarnation = Some(incarnation);
        self.parked = false;
        let id = ConnId::new(self.next_conn);
        self.next_conn += 1;
        let resume = Resume {
            next: self.recv.next(),
            base: self.send.base(),
            keep: self.keep(),
        };
        (id, resume)
    }

    /// The peer's RESUME on connection `id`: drop what it has, resend the rest, and make
    /// `id` the current connection. A RESUME claiming more than was sent is a violation
    /// (nothing changes).
    pub fn handle_resume(
        &mut self,
        now: Instant,
        id: ConnId,
        theirs: Resume,
    ) -> Result<Resumed, SeqError> {
        let before = self.send.messages();
        let base = self.send.base();
        if let Err(e) = self.send.rewind(theirs.next) {
            self.unresumable += 1;
            return Err(e);
        }
        self.unresumable = 0;
        self.recv.resume(theirs.base);
        let replaced = self.current.replace(Current {
            id,
            last_heard: now,
            last_sent: now,
        });
        self.heartbeat_due = false;
        if self.state != PeerState::Up {
            self.state = PeerState::Up;
            // Reached: a connection that authenticated the peer and was then refused
            // (its table full, say) did not stop the clock (see `require_reach`).
            self.wanted = None;
            self.events.push_back(SessionEvent::Up {
                incarnation: self.incarnation.unwrap_or(0),
            });
        }
        Ok(Resumed {
            replaced: replaced.map(|c| c.id),
            // Written before and not had by the peer: what goes out again (messages held
            // while no connection was up go out for the first time).
            resent: if before > 0 {
                self.send.sent().saturating_sub(self.send.base())
            } else {
                0
            },
            acked: self.send.base() - base,
            keep: theirs.keep,
        })
    }

    /// The session cannot be resumed: a RESUME (`handle_resume`'s error) claimed more than
    /// was sent, so the two ends' numbering disagrees (a peer that logged in under this
    /// one's name and incarnation sent messages, or a bug). Refusing every RESUME would
    /// cut the link for good; instead the session starts over as if the peer had
    /// restarted: what was pending is failed (reported to its senders), numbering starts
    /// again both ways, and the current connection, if any, is dropped. The IO layer tells
    /// the peer (REFUSE with [`crate::frame::RefuseCode::Reset`]), which resets its end
    /// too; until it does, its RESUMEs fail here again and are answered the same way.
    pub fn handle_reset(&mut self, now: Instant) {
        let _ = now;
        self.start_over(FailReason::Reset);
        if let Some(c) = self.current.take() {
            self.events.push_back(SessionEvent::Close { conn: c.id });
            self.disconnected_since = now;
        }
        self.resets += 1;
        self.unresumable = 0;
        self.events.push_back(SessionEvent::Reset);
    }

    /// Whether the peer's RESUMEs could not be honoured [`RESET_AFTER`] times in a row (no
    /// successful resume in between): the numbering really disagrees, and the session
    /// should be reset ([`Session::handle_reset`]). One or two may be a forger's values
    /// on connections of its own, which only close those connections.
    pub fn is_unresumable(&self) -> bool {
        self.unresumable >= RESET_AFTER
    }

    /// Sessions reset so far ([`Session::handle_reset`]).
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Fail what is pending and number from 0 again both ways.
    pub(super) fn start_over(&mut self, reason: FailReason) {
        self.wanted = None;
        let messages = self.send.take_failed(true);
        self.push_failed(messages, reason);
        self.recv.reset();
        self.recv_epoch += 1;
        self.unacked_messages = 0;
        self.unacked_bytes = 0;
        self.in_pieces = None;
    }

    /// Connection `id` ended. Unsequenced, what it had not written is failed.
    pub fn handle_disconnect(&mut self, now: Instant, id: ConnId) {
        if self.current.is_some_and(|c| c.id == id) {
            self.current = None;
            self.disconnected_since = now;
            self.heartbeat_due = false;
            if !self.cfg.reliable {
                let messages = self.send.take_failed(false);
                self.push_failed(messages, FailReason::ConnectionLost);
            }
        }
    }

    /// Not connected, and nothing is pending either way: nothing held for the peer, nothing
    /// delivered from it unacknowledged, no delivery under way. Connections may then be closed
    /// for idleness (see [`Session::park`]).
    pub fn is_quiet(&self) -> bool {
        self.send.messages() == 0
            && self.unacked_messages == 0
            && !self.ack_due
            && !self.delivering
            && self.in_pieces.is_none()
    }

    /// Call after [`Session::handle_disconnect`] when connections are made only while there
    /// is traffic and a membership judges whether the peer lives: if the session
    /// [is quiet](Session::is_quiet), the peer is not held unreachable while not connected
    /// (no connection is wanted). The first message held afterwards starts the clock
    /// again: a connection must come within `peer_timeout` of it. Returns whether it parked.
    pub fn park(&mut self) -> bool {
        if self.current.is_some() || self.state != PeerState::Up || !self.is_quiet() {
            return false;
        }
        self.parked = true;
        true
    }

    /// Parked (see [`Session::park`]).
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    /// Whether what is held for a peer that was never up (or is back from down, still
    /// connecting) is handed back ([`FailReason::Unreached`]) when no connection reaches
    /// it within `within` of the first of it: for peers a membership says live, whose
    /// connections may fail (a full peer table, a certificate that does not match, a
    /// blocked port), so that what was sent to them is not held for good. The peer is not
    /// declared down (it may be only slow to reach, and is dialled on): what is sent next
    /// is held again, with a clock of its own. `None` (configured peers, which may simply
    /// not have started yet): held until it comes.
    pub fn require_reach(&mut self, within: Option<std::time::Duration>) {
        self.reach = within;
        if within.is_none() {
            self.wanted = None;
        }
    }

    pub(super) fn is_current(&self, id: ConnId) -> bool {
        self.current.is_some_and(|c| c.id == id)
    }
}
