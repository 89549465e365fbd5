//! Acknowledgements, resumes and failures: what leaves the send window.

use super::*;

impl SendWindow {
    /// The peer acknowledged every message below `next`: drop the chunks it covers.
    /// Returns the bytes freed. An acknowledgement below what was already acknowledged is
    /// stale (acks and heartbeats may pass each other) and changes nothing; one above what
    /// was written is a protocol violation.
    pub fn ack(&mut self, next: u64) -> Result<usize, SeqError> {
        if next > self.sent {
            return Err(SeqError::AckBeyondSent {
                ack: next,
                sent: self.sent,
            });
        }
        Ok(self.drop_below(next))
    }

    pub(super) fn drop_below(&mut self, next: u64) -> usize {
        let mut freed = 0;
        while let Some(c) = self.chunks.front() {
            if c.end_seq > next {
                break;
            }
            freed += c.wire_len();
            if c.piece.is_some() {
                self.bulk_bytes -= c.wire_len();
            }
            if let Some(c) = self.chunks.pop_front() {
                self.recycle(c.data);
            }
            self.cursor = self.cursor.saturating_sub(1);
        }
        self.bytes -= freed;
        freed
    }

    /// Keep an acknowledged chunk's buffer for a later batch, if it is the last handle on
    /// it (the writer's clones are gone long before the ack). Over a bound, the smallest
    /// buffers go first: a large one serves a batch of any size (and only a buffer at least
    /// as large as a batch lets it move in uncopied), a small one only small batches. Were
    /// every place filled with small ones, large batches would find no buffer to move into
    /// and be copied, into freshly allocated pages.
    pub(super) fn recycle(&mut self, data: Bytes) {
        if !data.is_unique() {
            return;
        }
        // No copy: the handle is unique and (unless trimmed) starts its buffer.
        let mut v = Vec::from(data);
        // One larger than the bound is never kept (it would only push the others out).
        if v.capacity() > FREE_BYTES {
            return;
        }
        v.clear();
        self.free_bytes += v.capacity();
        self.free.push(v);
        while self.free.len() > FREE_BUFFERS || self.free_bytes > FREE_BYTES {
            let Some((i, _)) = (self.free.iter().enumerate()).min_by_key(|(_, b)| b.capacity())
            else {
                break;
            };
            self.free_bytes -= self.free.swap_remove(i).capacity();
        }
    }

    /// Drop what was written (the unsequenced mode keeps nothing once it is on the wire).
    /// Returns the bytes freed.
    pub fn release_written(&mut self) -> usize {
        match self.chunks.get(self.cursor.wrapping_sub(1)) {
            Some(c) if self.cursor > 0 => {
                let end = c.end_seq;
                self.drop_below(end)
            }
            _ => 0,
        }
    }

    /// A new connection whose peer has every message below `peer_next`: drop those, and
    /// start writing from the oldest held chunk again.
    /// A `peer_next` above what was sent is a protocol violation (nothing changes).
    pub fn rewind(&mut self, peer_next: u64) -> Result<(), SeqError> {
        if peer_next > self.sent {
            return Err(SeqError::ResumeBeyondSent {
                next: peer_next,
                sent: self.sent,
            });
        }
        self.drop_below(peer_next);
        self.trim_front(peer_next);
        self.cursor = 0;
        self.generation += 1;
        Ok(())
    }

    /// Drop the whole frames at the front of the oldest chunk that the peer already has
    /// (every message in them below `peer_next`), so that after a break only the rest is
    /// written again. A chunk is one writer batch, often megabytes: written again from its
    /// start after every break, a link that breaks before it carries one batch (a slow
    /// link that breaks often) would make no progress.
    pub(super) fn trim_front(&mut self, peer_next: u64) {
        let Some(c) = self.chunks.front_mut() else {
            return;
        };
        if c.piece.is_some() || c.first_seq >= peer_next {
            return;
        }
        let (mut off, mut first, mut refs, mut wire) = (0usize, c.first_seq, 0usize, 0usize);
        while let Some((end, n, len)) = frame_at(&c.data, off, &c.refs()[refs..]) {
            let count = frame::list_count(&c.data[off..end]).unwrap_or(u32::MAX) as u64;
            if first.saturating_add(count) > peer_next || end >= c.data.len() {
                break;
            }
            off = end;
            first += count;
            refs += n;
            wire += len;
        }
        if off > 0 {
            c.data = c.data.slice(off..);
            // After a break only: the rest of the references, moved to the new start.
            let rest = c.refs()[refs..].iter().map(|r| ByRef {
                at: r.at - off,
                payload: r.payload.clone(),
            });
            c.refs = shared(rest.collect());
            c.first_seq = first;
            self.bytes -= wire;
        }
    }

    /// Forget everything held (the peer restarted or was declared down) and return those
    /// messages so they can be handed back. Sequence numbers continue unless `restart`. A
    /// message in pieces is handed back here if its last piece is held; otherwise the rest
    /// of it is still queued, and it is handed back from there.
    pub fn take_failed(&mut self, restart: bool) -> Vec<Message> {
        let mut out = Vec::new();
        for c in self.chunks.drain(..) {
            if let Some(p) = c.piece {
                if p.is_last() {
                    out.push(Message {
                        to: p.to,
                        from: p.from,
                        payload: p.payload,
                    });
                }
                continue;
            }
            // The payloads handed back are slices of the chunk, or the callers' own.
            c.each_message(|_, m| {
                out.push(Message {
                    to: Name::from_validated(&c.data, m.to.clone()),
                    from: Name::from_validated(&c.data, m.from.clone()),
                    payload: match m.by_ref {
                        Some(r) => r.payload.clone(),
                        None => c.data.slice(m.payload.clone()),
                    },
                })
            });
        }
        self.bytes = 0;
        self.bulk_bytes = 0;
        self.cursor = 0;
        self.generation += 1;
        if restart {
            self.next_seq = 0;
            self.sent = 0;
        }
        out
    }
}
