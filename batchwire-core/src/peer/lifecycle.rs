//! The application taking deliveries, time, disconnects, shutting down, and what the
//! session's events mean here.

use super::*;

impl Peer {
    /// The application took a delivery out of `mailbox`: its credit goes back to the peer
    /// (in a CREDIT frame, at the next [`Peer::poll_transmit`]).
    pub fn handle_taken(&mut self, mailbox: &[u8], charge: u64) {
        self.rcredit.release(mailbox, charge);
    }

    /// Time passed: acknowledgement delays, heartbeats, the failure detector.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        self.after_session();
    }

    /// The current connection ended (the session stays; what was written and not
    /// acknowledged goes again on the next one).
    pub fn handle_disconnect(&mut self, now: Instant) {
        self.s.handle_disconnect(now, self.id);
        self.after_session();
    }

    /// This node is shutting down: what is queued still goes out; what is still queued or
    /// unacknowledged at `deadline` is handed back. Then [`Peer::poll_close`] says goodbye.
    pub fn begin_close(&mut self, deadline: Instant) {
        self.closing = Some(deadline);
        self.s.begin_close(deadline);
    }

    /// Hand back everything queued for the peer (it cannot be sent), giving up a message
    /// that was in pieces: the next RESUME tells the peer to drop what it has of it.
    /// Returns the messages, and whether one of them was in pieces.
    pub fn fail_queued(&mut self) -> (Vec<Message>, bool) {
        let mut batch = Batch::default();
        self.outbox.take(usize::MAX, usize::MAX, &mut batch, None);
        self.taken = self.pushed;
        let (bulk, in_pieces) = self.bulk.take_failed();
        if in_pieces {
            self.s.give_up_pieces();
        }
        let mut msgs = batch.decode_messages();
        msgs.extend(bulk);
        (msgs, in_pieces)
    }

    /// Act on what the session said: a restart or a reset drops what was reassembled; a
    /// peer found down has its queue handed back. Events are kept for `poll_event`.
    pub(super) fn after_session(&mut self) {
        while let Some(e) = self.s.poll_event() {
            match &e {
                SessionEvent::Restarted { .. } | SessionEvent::Reset => {
                    let gone = self.reasm.clear();
                    self.abandon(gone);
                }
                SessionEvent::Down { reason } => {
                    let gone = self.reasm.clear();
                    self.abandon(gone);
                    let (messages, _) = self.fail_queued();
                    let reason = FailReason::Down(*reason);
                    self.events.push_back(e);
                    if !messages.is_empty() {
                        self.events
                            .push_back(SessionEvent::Failed { messages, reason });
                    }
                    continue;
                }
                _ => {}
            }
            self.events.push_back(e);
        }
    }

    /// Drop what was reassembled of messages the peer gave up, giving their credit back.
    pub(super) fn abandon(&mut self, gone: Vec<Abandoned>) {
        for a in gone {
            if a.kept {
                self.rcredit.release(a.to.as_bytes(), a.charged);
            }
        }
    }
}
