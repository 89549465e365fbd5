//! Exactly-once, in-order delivery across connection breaks, as two pure state machines
//! per peer: a [`SendWindow`] (sequence numbers and the frames not yet acknowledged) and a
//! [`RecvWindow`] (what arrived, duplicates to skip, acknowledgements to send).
//!
//! Messages to a peer are numbered 0, 1, 2, ... per incarnation pair (this node's run and
//! the peer's). Each MESSAGES frame carries the number of its first message. The sender
//! keeps every frame it wrote (or could not write yet) until the peer acknowledges it; the
//! receiver acknowledges cumulatively ("everything below n"). After a break, the new
//! connection starts with a RESUME frame each way; the sender drops what the peer already
//! has and writes everything else again, and the receiver skips any message numbered below
//! what it already delivered. So a message is delivered once, in order, across any number of
//! breaks; one that can never be delivered (the peer restarted, or was declared down) is
//! handed back to the application as failed.
//!
//! `SendWindow`'s methods are split by what they do: holding frames here, its buffers
//! (`reliable/buffers.rs`), pieces (`pieces.rs`), writing (`writing.rs`), and what leaves
//! the window (`acks.rs`: acknowledgements, resumes, failures).

mod acks;
mod buffers;
mod pieces;
mod writing;

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::bulk::Piece;
use super::codec::Name;
use super::frame::{self, Message, encode_fragment_head, fragment_charge, set_first_seq};
use super::outbox::{Batch, ByRef, MessageAt, walk_messages};

/// A sequence number or acknowledgement from the peer that does not add up: a protocol
/// violation. The connection is closed; nothing is skipped, discarded or acknowledged
/// because of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeqError {
    /// A frame starts past the next expected message: something in between is missing.
    #[error("protocol violation: sequence gap: expected message {expected}, frame starts at {got}")]
    Gap {
        /// The next sequence number this node expects.
        expected: u64,
        /// Where the frame starts.
        got: u64,
    },
    /// A frame's sequence numbers run past 2^64.
    #[error(
        "protocol violation: a frame of {count} messages starting at {first} overflows the sequence numbers"
    )]
    Overflow {
        /// Where the frame starts.
        first: u64,
        /// Its message count.
        count: u32,
    },
    /// An ACK for messages this node never sent.
    #[error(
        "protocol violation: acknowledgement of everything below {ack}, but only {sent} messages were sent"
    )]
    AckBeyondSent {
        /// The acknowledged number.
        ack: u64,
        /// How many messages were sent.
        sent: u64,
    },
    /// A RESUME claiming to have received messages this node never sent.
    #[error(
        "protocol violation: RESUME claims everything below {next} arrived, but only {sent} messages were sent"
    )]
    ResumeBeyondSent {
        /// The peer's claim.
        next: u64,
        /// How many messages were sent.
        sent: u64,
    },
}

/// Frames written, or waiting to be written, and not yet acknowledged, in one chunk.
#[derive(Debug, Clone)]
struct Chunk {
    /// MESSAGES frames; or, for a piece, its FRAGMENT frame's header and fields.
    data: Bytes,
    first_seq: u64,
    /// One past the last message's sequence number.
    end_seq: u64,
    /// A piece of a message in pieces: its data is written from the caller's payload.
    piece: Option<HeldPiece>,
    /// Payloads sent by reference (see `outbox`): on the wire each goes in before the
    /// byte at its offset of `data`. None for most chunks. Shared with the writes that
    /// carry the chunk ([`Unwritten`]): a write takes one reference count per chunk, not
    /// one per payload.
    refs: Option<Arc<[ByRef]>>,
}

/// Payloads by reference as a chunk keeps them (none: `None`).
fn shared(refs: Vec<ByRef>) -> Option<Arc<[ByRef]>> {
    (!refs.is_empty()).then(|| refs.into())
}

/// A piece in the window: a slice of the whole message's payload, which is kept (shared,
/// not copied) so that the message can be handed back whole if it fails.
#[derive(Debug, Clone)]
struct HeldPiece {
    /// The message's id (its first piece's sequence number).
    id: u64,
    to: Name,
    from: Name,
    payload: Bytes,
    offset: usize,
    len: usize,
}

impl HeldPiece {
    fn data(&self) -> Bytes {
        self.payload.slice(self.offset..self.offset + self.len)
    }
    fn is_last(&self) -> bool {
        self.offset + self.len == self.payload.len()
    }
}

impl Chunk {
    fn refs(&self) -> &[ByRef] {
        self.refs.as_deref().unwrap_or(&[])
    }

    /// Bytes this chunk puts on the wire.
    fn wire_len(&self) -> usize {
        self.data.len()
            + self.piece.as_ref().map_or(0, |p| p.len)
            + self.refs().iter().map(|r| r.payload.len()).sum::<usize>()
    }

    /// Walk the messages of its MESSAGES frames where they lie (nothing copied): `f(seq,
    /// message)`.
    fn each_message<'a>(&'a self, mut f: impl FnMut(u64, MessageAt<'a>)) {
        let (mut off, mut refs, mut seq) = (0, self.refs(), self.first_seq);
        while let Some((end, n, _)) = frame_at(&self.data, off, refs) {
            walk_messages(&self.data, (off, end), &refs[..n], |m| {
                f(seq + m.index as u64, m)
            });
            seq += frame::list_count(&self.data[off..end]).unwrap_or(0) as u64;
            (off, refs) = (end, &refs[n..]);
        }
    }
}

/// The next whole MESSAGES frame of a chunk, which starts at `off` of `data` (`refs` are
/// the chunk's payloads by reference from that frame on): where its bytes in `data` end,
/// how many of `refs` are its own, and its length on the wire. `None` if the frame is
/// not all there.
fn frame_at(data: &[u8], off: usize, refs: &[ByRef]) -> Option<(usize, usize, usize)> {
    let len = header_len(data, off)?;
    // The frame's refs: those that go in before its last wire byte.
    let (mut external, mut n) = (0usize, 0usize);
    while let Some(r) = refs.get(n) {
        if r.at <= off || (r.at - off).checked_add(external)? >= len {
            break;
        }
        external += r.payload.len();
        n += 1;
    }
    let end = off.checked_add(len.checked_sub(external)?)?;
    (end <= data.len()).then_some((end, n, len))
}

/// The length on the wire of the frame whose header starts at `off` of `data` (`len`
/// counts what follows it).
fn header_len(data: &[u8], off: usize) -> Option<usize> {
    let b = data.get(off..off.checked_add(4)?)?;
    let body = u32::from_le_bytes(b.try_into().ok()?) as usize;
    body.checked_add(4)
}

/// What the current connection has not been given yet: the held chunks, shared (one
/// reference count per chunk, none per message), with their slices in wire order for one
/// vectored write ([`Unwritten::slices`]).
#[derive(Debug, Clone, Default)]
pub struct Unwritten {
    /// The chunks, oldest first.
    pub(crate) parts: Vec<Part>,
    /// Where each chunk ends: one past its last message's sequence number.
    pub ends: Vec<u64>,
    /// Messages (and pieces) in them.
    pub messages: u64,
    /// Frames in them.
    pub frames: u64,
    /// Pass back to `mark_written`: a connection change in between makes it stale.
    pub generation: u64,
}

/// One chunk of an [`Unwritten`]: its data, cut where a payload by reference goes in, or a
/// piece's header and then its data.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    data: Bytes,
    refs: Option<Arc<[ByRef]>>,
    piece: Option<Bytes>,
}

impl Part {
    /// Its bytes in wire order, to `f` as ranges of buffers (none copied).
    fn each<'a>(&'a self, f: &mut impl FnMut(&'a Bytes, std::ops::Range<usize>)) {
        let mut from = 0;
        for r in self.refs.as_deref().unwrap_or(&[]) {
            if r.at > from {
                f(&self.data, from..r.at);
            }
            f(&r.payload, 0..r.payload.len());
            from = r.at;
        }
        if from < self.data.len() || (from == 0 && self.refs.is_none()) {
            f(&self.data, from..self.data.len());
        }
        if let Some(p) = &self.piece {
            f(p, 0..p.len());
        }
    }
}

impl Unwritten {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// At least as many as [`Unwritten::slices`] gives (a vector's capacity).
    pub fn slices_bound(&self) -> usize {
        (self.parts.iter())
            .map(|p| 2 + 2 * p.refs.as_deref().map_or(0, <[ByRef]>::len))
            .sum()
    }

    /// Append its bytes to `out` as slices, in wire order (for one vectored write).
    pub fn slices<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        for p in &self.parts {
            p.each(&mut |b, r| out.push(&b[r]));
        }
    }

    /// The same slices as [`Unwritten::slices`], as shared buffers, each with where its
    /// chunk ends (for a writer that writes some chunks and not the rest, as
    /// `peer::Peer::poll_transmit` into a bounded buffer).
    pub fn segments(&self) -> Vec<(Bytes, u64)> {
        let mut out = Vec::new();
        for (p, end) in self.parts.iter().zip(&self.ends) {
            p.each(&mut |b, r| out.push((b.slice(r), *end)));
        }
        out
    }

    /// The same slices as [`Unwritten::slices`], as shared buffers (the rest of a write
    /// that was cut short).
    pub fn chunks(&self) -> Vec<Bytes> {
        let mut out = Vec::new();
        for p in &self.parts {
            p.each(&mut |b, r| out.push(b.slice(r)));
        }
        out
    }

    /// Its bytes on the wire.
    pub fn wire_len(&self) -> usize {
        let mut n = 0;
        for p in &self.parts {
            p.each(&mut |_, r| n += r.len());
        }
        n
    }
}

/// The sending side of one peer's stream.
#[derive(Debug, Default)]
pub struct SendWindow {
    chunks: VecDeque<Chunk>,
    next_seq: u64,
    /// One past the last message ever handed out to be written (on any connection): the
    /// peer cannot have received, so cannot acknowledge, anything at or above it.
    sent: u64,
    /// Chunks before this index are written on the current connection.
    cursor: usize,
    /// Bumped by [`SendWindow::rewind`]; a `mark_written` for an older generation is stale.
    generation: u64,
    bytes: usize,
    /// Of `bytes`, those of pieces (the bulk lane's share).
    bulk_bytes: usize,
    /// Buffers of acknowledged chunks, reused for new ones, so that a batch needs no new
    /// allocation (and the kernel no fresh pages to zero), which is costly for large ones.
    free: Vec<Vec<u8>>,
    /// The capacity of the buffers in `free`, at most [`FREE_BYTES`].
    free_bytes: usize,
    /// Tests: move batches from this size on instead of [`MOVE_BYTES`].
    #[cfg(test)]
    move_from: Option<usize>,
}

/// Most acknowledged buffers kept for reuse, and most bytes of capacity among them (per
/// peer). A batch's buffer goes round: the outbox fills it, the window holds it (no copy,
/// see [`SendWindow::hold_batch`]), and once acknowledged it is handed back to the outbox;
/// a batch of 10 KB messages is a few MiB.
const FREE_BUFFERS: usize = 8;
const FREE_BYTES: usize = 8 << 20;
/// Batches at least this large move into the window uncopied (see `hold_batch`).
const MOVE_BYTES: usize = 256 << 10;

impl SendWindow {
    /// The sequence number the next message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// One past the last message ever handed out to be written, on any connection.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The oldest sequence number still held (= `next_seq` when nothing is held).
    pub fn base(&self) -> u64 {
        self.chunks.front().map_or(self.next_seq, |c| c.first_seq)
    }

    /// Bytes held (written and unacknowledged, or unwritten).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Messages held.
    pub fn messages(&self) -> u64 {
        self.next_seq - self.base()
    }

    /// Bytes of pieces held (written and unacknowledged, or unwritten).
    pub fn bulk_bytes(&self) -> usize {
        self.bulk_bytes
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Hold encoded MESSAGES frames (each with its message count) as one chunk, numbering
    /// their messages. Returns the message count.
    pub fn hold(&mut self, frames: &[(&[u8], u32)]) -> u64 {
        let need: usize = frames.iter().map(|f| f.0.len()).sum();
        let mut data = self.take_fitting(need);
        let first = self.next_seq;
        for (f, n) in frames {
            let start = data.len();
            data.extend_from_slice(f);
            set_first_seq(&mut data[start..], self.next_seq);
            self.next_seq += *n as u64;
        }
        if self.next_seq == first {
            return 0;
        }
        self.push_chunk(Bytes::from(data), first, None);
        self.next_seq - first
    }

    /// [`SendWindow::hold`] for a batch with payloads sent by reference: its MESSAGES
    /// frames are copied (their bytes in the buffer: names, lengths, small payloads) and
    /// the references move with them.
    fn hold_with_refs(&mut self, batch: &mut Batch) -> u64 {
        let need: usize = batch
            .frames
            .iter()
            .filter(|f| f.messages > 0)
            .map(|f| f.len())
            .sum();
        let mut data = self.take_fitting(need);
        let Batch {
            buf,
            frames,
            refs: taken,
        } = batch;
        let mut refs = Vec::with_capacity(taken.len());
        // Drained, not taken: the batch keeps its vector's capacity for the next batch.
        let mut moving = taken.drain(..).peekable();
        let first = self.next_seq;
        for f in frames.iter() {
            let start = data.len();
            // A control frame has no references; a message frame's go with it.
            while let Some(mut r) = moving.next_if(|r| r.at <= f.end) {
                if f.messages > 0 {
                    r.at = r.at - f.start + start;
                    refs.push(r);
                }
            }
            if f.messages == 0 {
                continue;
            }
            data.extend_from_slice(&buf[f.start..f.end]);
            set_first_seq(&mut data[start..], self.next_seq);
            self.next_seq += f.messages as u64;
        }
        frames.clear();
        if self.next_seq == first {
            return 0;
        }
        self.push_chunk(Bytes::from(data), first, shared(refs));
        self.next_seq - first
    }

    /// Hold a batch as one chunk, numbering its messages, **without copying it** when it
    /// is at least `MOVE_BYTES` of nothing but MESSAGES frames back to back (a bundler's
    /// batch under load): the batch's buffer moves into the window and `batch` gets the
    /// smallest acknowledged chunk's buffer at least as large to fill next, or a new one
    /// as large as the one it gave. Otherwise its MESSAGES frames are copied as
    /// [`SendWindow::hold`] does. Returns the message count.
    pub fn hold_batch(&mut self, batch: &mut Batch) -> u64 {
        let whole = batch.frames.first().is_some_and(|f| f.start == 0)
            && batch
                .frames
                .last()
                .is_some_and(|f| f.end == batch.buf.len())
            && batch.frames.iter().all(|f| f.messages > 0)
            && batch.frames.windows(2).all(|w| w[0].end == w[1].start);
        // Only a large batch moves: a small one is cheap to copy, and an outbox left with a
        // small buffer grows it again by doubling (copies and fresh pages), which costs
        // more than copying a small batch. The outbox gets a buffer at least as large as
        // the batch: a free one, or else a new one. (Were a free one required, large
        // batches would often be copied: while the window holds every buffer no
        // acknowledged one is free, and the copy would go into a new buffer anyway.)
        #[cfg(test)]
        let move_bytes = self.move_from.unwrap_or(MOVE_BYTES);
        #[cfg(not(test))]
        let move_bytes = MOVE_BYTES;
        if !whole || batch.buf.len() < move_bytes {
            if !batch.refs.is_empty() {
                return self.hold_with_refs(batch);
            }
            return self.hold(&batch.message_frames());
        }
        let first = self.next_seq;
        for f in &batch.frames {
            set_first_seq(&mut batch.buf[f.start..f.end], self.next_seq);
            self.next_seq += f.messages as u64;
        }
        let replacement = self.take_free(batch.buf.len(), batch.buf.capacity());
        let data = std::mem::replace(&mut batch.buf, replacement);
        batch.frames.clear();
        // Collected straight into the shared slice (drained: the batch keeps its vector).
        let refs = (!batch.refs.is_empty()).then(|| batch.refs.drain(..).collect());
        self.push_chunk(Bytes::from(data), first, refs);
        self.next_seq - first
    }
}

impl SendWindow {
    /// Call `f(mailbox, charge)` for every message (and piece) held from sequence number
    /// `from` on: what the peer has not received of them (a credit recount).
    pub fn charges_from(&self, from: u64, mut f: impl FnMut(&Name, u64)) {
        for c in self.chunks.iter().filter(|c| c.end_seq > from) {
            if let Some(p) = &c.piece {
                if c.first_seq >= from {
                    f(
                        &p.to,
                        fragment_charge(p.offset as u64, p.len, &p.to, &p.from),
                    );
                }
                continue;
            }
            // Read where they lie: a SYNC after every reconnect recounts the whole window,
            // and decoding a copy of it would copy the whole window at every reconnect.
            c.each_message(|seq, m| {
                if seq >= from {
                    f(&Name::from_validated(&c.data, m.to.clone()), m.charge());
                }
            });
        }
    }
}

/// How many frames a chunk's run of whole frames holds (`refs`: its payloads by
/// reference).
fn frame_count(b: &[u8], refs: &[ByRef]) -> u64 {
    let (mut n, mut off, mut taken) = (0, 0, 0);
    while let Some((end, k, _)) = frame_at(b, off, &refs[taken..]) {
        (off, taken) = (end, taken + k);
        n += 1;
    }
    n
}

/// The receiving side of one peer's stream.
#[derive(Debug, Default, Clone)]
pub struct RecvWindow {
    next: u64,
    acked: u64,
    /// The peer's RESUME said it holds nothing below this, above `next`: it gave up the
    /// messages in between. The jump is taken only when a frame starting exactly there
    /// arrives, so a forged RESUME cannot make this node skip real messages.
    gap: Option<u64>,
}

impl RecvWindow {
    /// The next sequence number expected.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// A frame numbered `first .. first + count` arrived: how many of its leading messages
    /// were delivered before (skip them). Advances past the frame. A frame that starts past
    /// the next expected message is refused, unless the peer announced exactly that gap.
    pub fn accept(&mut self, first: u64, count: u32) -> Result<u32, SeqError> {
        let skip = self.check(first, count)?;
        self.commit(first, first + count as u64);
        Ok(skip)
    }

    /// Like [`RecvWindow::accept`] without advancing: how many leading messages to skip.
    /// Deliver the rest, then [`RecvWindow::commit`] what was delivered.
    pub fn check(&self, first: u64, count: u32) -> Result<u32, SeqError> {
        first
            .checked_add(count as u64)
            .ok_or(SeqError::Overflow { first, count })?;
        if first > self.next {
            if self.gap != Some(first) {
                return Err(SeqError::Gap {
                    expected: self.next,
                    got: first,
                });
            }
            return Ok(0);
        }
        Ok((self.next - first).min(count as u64) as u32)
    }

    /// Every message of a checked frame that starts at `first` is delivered up to (not
    /// including) `upto`; a frame at an announced gap takes the jump even if none was.
    pub fn commit(&mut self, first: u64, upto: u64) {
        if first > self.next && self.gap == Some(first) {
            self.next = first;
            self.gap = None;
        }
        if upto > self.next {
            self.next = upto;
        }
    }

    /// The peer's RESUME says it holds nothing below `base`. Below `next` that changes
    /// nothing; above it, the peer gave up (and reported to its application) what is in
    /// between, and its next frame must start at `base` (see [`RecvWindow::accept`]).
    pub fn resume(&mut self, base: u64) {
        self.gap = (base > self.next).then_some(base);
    }

    /// An acknowledgement to send, if anything arrived since the last one.
    pub fn ack_due(&mut self) -> Option<u64> {
        (self.next > self.acked).then(|| {
            self.acked = self.next;
            self.next
        })
    }

    /// Messages received since the last acknowledgement.
    pub fn unacked(&self) -> u64 {
        self.next - self.acked
    }

    /// The peer restarted: its numbering starts again.
    pub fn reset(&mut self) {
        *self = RecvWindow::default();
    }
}

#[cfg(test)]
mod tests;
