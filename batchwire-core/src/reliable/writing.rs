//! What the connection has not had yet, and marking it written.

use super::*;

impl SendWindow {
    /// What is not yet written on the current connection (cheap clones), with the
    /// generation to pass back to [`SendWindow::mark_written`]. It counts as sent from
    /// now on: the peer may acknowledge it before the write returns.
    pub fn unwritten(&mut self) -> Unwritten {
        if let Some(c) = self.chunks.back()
            && self.cursor < self.chunks.len()
        {
            self.sent = self.sent.max(c.end_seq);
        }
        let mut u = Unwritten {
            generation: self.generation,
            ..Unwritten::default()
        };
        for c in self.chunks.iter().skip(self.cursor) {
            u.messages += c.end_seq - c.first_seq;
            u.frames += match c.piece {
                Some(_) => 1,
                None => frame_count(&c.data, c.refs()),
            };
            u.parts.push(Part {
                data: c.data.clone(),
                refs: c.refs.clone(),
                piece: c.piece.as_ref().filter(|p| p.len > 0).map(HeldPiece::data),
            });
            u.ends.push(c.end_seq);
        }
        u
    }

    /// Whether anything is held that the current connection has not been given.
    pub fn has_unwritten(&self) -> bool {
        self.cursor < self.chunks.len()
    }

    /// Every message below `end` was written on the connection of `generation`. (By
    /// sequence number, not by a count of chunks: an acknowledgement may drop a chunk while
    /// the write that carries it is still in progress.)
    pub fn mark_written(&mut self, generation: u64, end: u64) {
        if generation != self.generation {
            return;
        }
        while self
            .chunks
            .get(self.cursor)
            .is_some_and(|c| c.end_seq <= end)
        {
            self.cursor += 1;
        }
    }
}
