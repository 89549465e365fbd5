//! Pieces of bulk messages in the send window.

use super::*;

impl SendWindow {
    /// Hold one piece as a FRAGMENT frame with the next sequence number. Its id is its own
    /// sequence number if it is a first piece, else `p.id` (the caller checked it). The data
    /// is not copied: the frame's header is written here and the data is a slice of the
    /// payload. Returns the piece's sequence number.
    pub fn hold_piece(&mut self, p: &Piece) -> u64 {
        let seq = self.next_seq;
        let id = if p.is_first() {
            seq
        } else {
            p.id.unwrap_or(seq)
        };
        let mut head = Vec::with_capacity(frame::FRAGMENT_OVERHEAD + p.to.len() + p.from.len());
        encode_fragment_head(
            &mut head,
            seq,
            id,
            p.payload.len() as u64,
            p.offset as u64,
            &p.to,
            &p.from,
            p.len,
        );
        let c = Chunk {
            data: Bytes::from(head),
            first_seq: seq,
            end_seq: seq + 1,
            piece: Some(HeldPiece {
                id,
                to: p.to.clone(),
                from: p.from.clone(),
                payload: p.payload.clone(),
                offset: p.offset,
                len: p.len,
            }),
            refs: None,
        };
        self.bytes += c.wire_len();
        self.bulk_bytes += c.wire_len();
        self.chunks.push_back(c);
        self.next_seq += 1;
        seq
    }

    /// The id of the oldest message with a piece held here (not yet acknowledged) that
    /// will be completed: its last piece is held too, or it is `continuing` (still being
    /// numbered). The peer must keep what it reassembled of it, since the rest may be
    /// resent. (A message given up before its last piece was numbered is not counted.)
    pub fn oldest_piece_id(&self, continuing: Option<u64>) -> Option<u64> {
        let mut candidate: Option<u64> = None;
        for p in self.chunks.iter().filter_map(|c| c.piece.as_ref()) {
            if candidate != Some(p.id) {
                candidate = Some(p.id);
                if continuing == Some(p.id) {
                    return candidate;
                }
            }
            if p.is_last() {
                return candidate;
            }
        }
        None
    }
}
