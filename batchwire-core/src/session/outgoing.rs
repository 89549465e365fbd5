//! The send path: holding batches and pieces in the window, writing them.

use super::*;

impl Session {
    /// Whether [`Session::hold`] may take more: not once the peer is down (the reason) or
    /// the goodbye was said (this node shut down).
    pub fn holdable(&self) -> Result<(), FailReason> {
        match (self.state, self.down_reason) {
            (PeerState::Down, Some(r)) => Err(FailReason::Down(r)),
            _ if self.said_goodbye => Err(FailReason::ShutDown),
            _ => Ok(()),
        }
    }

    /// Number encoded MESSAGES frames (each with its message count) and hold them until
    /// acknowledged (or, unsequenced, until written). Returns the message count.
    pub fn hold(&mut self, frames: &[(&[u8], u32)]) -> u64 {
        self.bulk_alone = 0;
        self.send.hold(frames)
    }

    /// [`Session::hold`] for a bundler's batch: a large one's buffer moves into the window
    /// instead of being copied, and the batch gets a free one back (see
    /// [`SendWindow::hold_batch`]).
    pub fn hold_batch(&mut self, batch: &mut crate::outbox::Batch) -> u64 {
        self.bulk_alone = 0;
        self.send.hold_batch(batch)
    }

    /// Number one piece of a message in pieces and hold it (see `bulk`). Returns the
    /// message's id. A later piece is numbered only if its message's first piece was
    /// numbered for this incarnation of the peer (else [`PieceRefused::Restart`]).
    pub fn hold_piece(&mut self, p: &Piece) -> Result<u64, PieceRefused> {
        self.holdable().map_err(PieceRefused::Failed)?;
        if !p.is_first() && (p.id.is_none() || self.in_pieces != p.id) {
            return Err(PieceRefused::Restart);
        }
        let seq = self.send.hold_piece(p);
        self.bulk_alone = self.bulk_alone.saturating_add(p.len);
        let id = if p.is_first() {
            seq
        } else {
            p.id.unwrap_or(seq)
        };
        self.in_pieces = (!p.is_last()).then_some(id);
        Ok(id)
    }

    /// The lowest id of a message in pieces this side will complete: the one being
    /// numbered, or one whose pieces (its last among them) are in the window, to be resent
    /// after a break. Below it, every message was acknowledged whole or given up; the peer
    /// drops what it has of those, and their pieces that still come.
    pub(super) fn keep(&self) -> u64 {
        let numbering = self.in_pieces.unwrap_or(self.send.next_seq());
        self.send
            .oldest_piece_id(self.in_pieces)
            .map_or(numbering, |id| id.min(numbering))
    }

    /// The message in pieces was handed back before its last piece (its queue was emptied):
    /// the next RESUME tells the peer to drop what it has of it.
    pub fn give_up_pieces(&mut self) {
        self.in_pieces = None;
    }

    /// What the current connection has not been given yet, oldest first, with the
    /// generation to pass to [`Session::mark_written`]. Nothing before the RESUME.
    pub fn unwritten(&mut self, id: ConnId) -> Unwritten {
        if !self.is_current(id) || !self.send.has_unwritten() {
            return Unwritten {
                generation: self.send.generation(),
                ..Unwritten::default()
            };
        }
        self.send.unwritten()
    }

    /// Whether [`Session::unwritten`] has anything for connection `id`.
    pub fn has_unwritten(&self, id: ConnId) -> bool {
        self.is_current(id) && self.send.has_unwritten()
    }

    /// What [`Session::unwritten`] of generation `generation` gave, up to (not including)
    /// sequence number `end`, was written on connection `id`.
    pub fn mark_written(&mut self, now: Instant, id: ConnId, generation: u64, end: u64) {
        if !self.is_current(id) {
            return;
        }
        self.send.mark_written(generation, end);
        if !self.cfg.reliable {
            self.send.release_written();
        }
        self.note_sent(now, id);
    }

    /// Bytes (of any kind) were written on connection `id`.
    pub fn note_sent(&mut self, now: Instant, id: ConnId) {
        if let Some(c) = self.current.as_mut().filter(|c| c.id == id) {
            c.last_sent = c.last_sent.max(now);
        }
    }
}
