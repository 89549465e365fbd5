//! Reading: one read from the socket (`read_once`), and a large piece's data read in place,
//! straight into the buffer its message is reassembled in.

use super::*;

impl Reader<'_> {
    /// With the read turn, after every whole frame was taken: if what is left is a piece
    /// with its fields read and much of its data to come, of a message being reassembled
    /// here, move what came of its data into the message's buffer; the reads go on there
    /// (`read_in_place`) until the piece is whole.
    pub(super) fn begin_in_place(&self, side: &mut ReadSide) -> Result<(), LinkError> {
        if !self.leadable() {
            return Ok(());
        }
        let buf = side.ring.buf();
        let Some(head) = frame::fragment_head(buf, self.max_frame)? else {
            // The start of a piece whose fields are not all in: read them, not its data.
            if frame::starts_fragment(buf) {
                side.next_read = Some(HEAD_READ);
            }
            return Ok(());
        };
        // Everything in the buffer is this frame (it is the first not yet taken).
        let read = buf.len() - head.head_len;
        // If it cannot go in place, read up to its end and the next frame's fields only.
        let rest = head.data_len - read;
        side.next_read = Some(rest + HEAD_READ);
        // Only the current connection starts reads in place (a replaced one still
        // reading would only be refused its pieces).
        if rest < IN_PLACE_MIN || !self.peer.session(|s, _| s.current() == Some(self.conn.id)) {
            return Ok(());
        }
        let mut r = self.peer.lock_reassembly();
        let keep_new = || self.keeps_new(&head.piece);
        let Some((dst, _)) = r.direct_room(&head, 0, self.conn.id, keep_new) else {
            return Ok(());
        };
        side.next_read = None;
        dst.extend_from_slice(&buf[head.head_len..]);
        drop(r);
        buf.clear();
        side.piece = Some(InPlace { head, read });
        Ok(())
    }

    /// With the read turn: read more of the piece being read in place, waiting for bytes
    /// if `wait` (for the socket, with no lock held); then, if it is whole, act on it.
    /// One read takes the rest of the piece into its message's buffer and up to
    /// [`HEAD_READ`] bytes after it into the ring (the next frame's fields), so a stream of
    /// pieces costs one read per piece. Returns false if there were none (only without
    /// `wait`).
    pub(super) fn read_in_place(&self, side: &mut ReadSide, wait: bool) -> Result<bool, LinkError> {
        let mut waited = false;
        let (n, left) = loop {
            let Some(p) = side.piece.as_mut() else {
                return Ok(true);
            };
            let got = {
                let mut r = self.peer.lock_reassembly();
                // The message moved on without this connection: a newer one took over.
                let room = r.direct_room(&p.head, p.read, self.conn.id, || false);
                let Some((dst, left)) = room else {
                    return Err(LinkError::Replaced);
                };
                let next = side.ring.room(HEAD_READ);
                recv_pair(&self.conn.link, (dst, left), (next, HEAD_READ)).map(|n| (n, left))
            };
            match got {
                Ok((0, _)) => return Err(LinkError::Eof),
                Ok(r) => break r,
                // Most often the bytes are there; otherwise wait (without any lock).
                Err(e) if e.kind() == ErrorKind::WouldBlock && wait && !waited => {
                    self.wait_readable(None, None)?;
                    waited = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(wait),
                Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(true),
                Err(e) => return Err(e.into()),
            }
        };
        let in_place = n.min(left);
        side.drained = n < left + HEAD_READ;
        side.idle_said = false;
        let stats = &self.peer.stats;
        stats.bytes_received.fetch_add(n as u64, Relaxed);
        stats.reads.fetch_add(1, Relaxed);
        stats
            .piece_bytes_in_place
            .fetch_add(in_place as u64, Relaxed);
        self.peer
            .session(|s, now| s.handle_heard(now, self.conn.id));
        let p = side.piece.as_mut().expect("the piece being read");
        p.read += in_place;
        if in_place == left {
            let InPlace { head, .. } = side.piece.take().expect("the piece being read");
            self.peer.stats.frames_received.fetch_add(1, Relaxed);
            self.piece(&head.piece, Some(&head))?;
        }
        Ok(true)
    }

    /// With the read turn: if the last read took all there was, about to wait, so
    /// acknowledge now if a sender may be waiting for it (the session decides); once per
    /// read.
    pub(super) fn say_idle(&self, side: &mut ReadSide) {
        if side.drained && !side.idle_said {
            side.idle_said = true;
            self.peer.session(|s, _| s.handle_idle(self.conn.id));
        }
    }

    /// With the read turn: read once, waiting for bytes if `wait`. Returns false if there
    /// were none (only without `wait`).
    pub(super) fn read_once(&self, side: &mut ReadSide, wait: bool) -> Result<bool, LinkError> {
        if side.piece.is_some() {
            return self.read_in_place(side, wait);
        }
        let look = std::mem::take(&mut side.look);
        // On a plain link, near a buffer's end, only the rest of the frame begun there
        // (`RecvRing::read_size`). Not over TLS: its reads take ciphertext, record by
        // record, and a small read there would only split them into more system calls.
        let read_bytes = self.read_size();
        let (want, shrunk) = match side.next_read.take() {
            Some(n) => (n.min(read_bytes), false),
            None if self.leadable() => {
                let n = side.ring.read_size(read_bytes);
                (n, n < read_bytes)
            }
            None => (read_bytes, false),
        };
        let n = match self.conn.link.read_append(side.ring.room(want), want, wait) {
            Ok(0) => return Err(LinkError::Eof),
            Ok(n) => n,
            // A look after a read cut short found the socket empty: it was drained after
            // all (the caller goes round, says so, and reads as it would have).
            Err(e) if e.kind() == ErrorKind::WouldBlock && look => {
                side.drained = true;
                return Ok(true);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && !wait => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e.into()),
        };
        // A read cut short to a frame's end that got all it asked for cannot tell whether
        // more is waiting. Counted as drained, it would make an idle acknowledgement at
        // every buffer's end of a stream, slowing the stream; counted as not, a stream
        // that stopped exactly there would hold its acknowledgement back behind a
        // blocking read. So the next read looks first, without waiting.
        // Over TLS too: a read that filled all it asked for cannot tell either.
        side.drained = n < want;
        side.look = (shrunk || self.conn.link.is_tls()) && n == want;
        side.idle_said = false;
        self.peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
        self.peer.stats.reads.fetch_add(1, Relaxed);
        self.peer
            .session(|s, now| s.handle_heard(now, self.conn.id));
        Ok(true)
    }
}
