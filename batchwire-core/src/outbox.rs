//! The outbox: messages waiting to be written, already encoded as MESSAGES frames.
//!
//! A sender encodes its message straight into the outbox's buffer (so the writer only has to
//! write bytes, and nothing per message crosses threads but the bytes themselves). Each
//! frame is tagged with its destination; a new frame starts whenever the destination
//! changes or the open frame is full. Frames are therefore exactly JGRP-1540's "message
//! lists": runs of consecutive messages to the same destination.
//!
//! `take` hands the writer whole frames (all of them, or up to a byte / message limit).
//! Pure data structure: no locks, no clock (times are passed in).
//!
//! **Large payloads go by reference.** A payload of at least the outbox's
//! [`by_reference`](Outbox::by_reference) size is not copied: only its message's names and
//! length are encoded, and the payload (a cheap clone of the caller's [`Bytes`]) is kept
//! beside the buffer with the offset where it goes on the wire. The frame's length counts
//! it. Whoever writes the frames splices them back in (a vectored write: see
//! [`Batch::refs`]), so the payload is copied once, by the kernel into the socket.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use super::bundler::QueueLevel;
use super::codec::Name;
use super::frame::{self as wire, Frame, LIST_OVERHEAD, ListWriter, message_len};

/// Where a frame goes: a peer's index, or every member ([`ALL`], JGroups' null destination).
pub type Dest = u32;
/// The "every member" destination.
pub const ALL: Dest = u32::MAX;

/// One encoded frame in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    pub dest: Dest,
    pub start: usize,
    pub end: usize,
    /// Messages in the frame (0 for a control frame).
    pub messages: u32,
    /// Bytes of its payloads sent by reference: not in the buffer between `start` and
    /// `end`, they go on the wire in between (see [`Batch::refs`]).
    pub external: u32,
}

impl FrameMeta {
    /// Bytes of the frame in the buffer.
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    /// Bytes of the frame on the wire: in the buffer, and sent by reference.
    pub fn wire_len(&self) -> usize {
        self.len() + self.external as usize
    }
}

/// A payload sent by reference (see the module documentation): it goes on the wire just
/// before the byte at `at` of its batch's buffer (or at its end). It belongs to the frame
/// with `start < at <= end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByRef {
    pub at: usize,
    pub payload: Bytes,
}

/// What `take` moved out: a buffer and the frames in it, in order.
#[derive(Debug, Default)]
pub struct Batch {
    pub buf: Vec<u8>,
    pub frames: Vec<FrameMeta>,
    /// The frames' payloads sent by reference, in order of `at`: on the wire, each goes in
    /// before the byte at its offset of `buf`.
    pub refs: Vec<ByRef>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.frames.clear();
        self.refs.clear();
    }
    pub fn messages(&self) -> u64 {
        self.frames.iter().map(|f| f.messages as u64).sum()
    }
    /// Bytes on the wire: the buffer's and the payloads sent by reference.
    pub fn wire_len(&self) -> usize {
        self.buf.len() + self.refs.iter().map(|r| r.payload.len()).sum::<usize>()
    }
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
    /// Its MESSAGES frames with their message counts (see [`message_frames`]). Only for a
    /// batch with no payload sent by reference (the frames are then whole in `buf`).
    pub fn message_frames(&self) -> Vec<(&[u8], u32)> {
        debug_assert!(self.refs.is_empty(), "frames with payloads by reference");
        message_frames(&self.buf, &self.frames)
    }

    /// The messages of its MESSAGES frames: what is handed back when the batch cannot be
    /// sent. Payloads in the buffer are copied; those sent by reference are the callers'
    /// own. Not for the fast path.
    pub fn decode_messages(&self) -> Vec<wire::Message> {
        let mut out = Vec::new();
        let mut refs = &self.refs[..];
        for f in self.frames.iter().filter(|f| f.messages > 0) {
            let n = walk_messages(&self.buf, (f.start, f.end), refs, |m| {
                out.push(wire::Message {
                    to: Name::copied(&self.buf[m.to.clone()]),
                    from: Name::copied(&self.buf[m.from.clone()]),
                    payload: match m.by_ref {
                        Some(r) => r.payload.clone(),
                        None => Bytes::copy_from_slice(&self.buf[m.payload.clone()]),
                    },
                })
            });
            refs = &refs[n..];
        }
        out
    }
    /// Groups of consecutive frames with the same destination: each group is one write
    /// (per destination peer, for the null destination).
    pub fn groups(&self) -> impl Iterator<Item = &[FrameMeta]> + '_ {
        groups(&self.frames)
    }
}

/// The MESSAGES frames among `frames` (control frames left out), as slices of `buf` with
/// their message counts: what a send window holds. Only for frames with no payload sent
/// by reference (`FrameMeta::external` 0): otherwise they are not whole in `buf`.
pub fn message_frames<'a>(buf: &'a [u8], frames: &[FrameMeta]) -> Vec<(&'a [u8], u32)> {
    debug_assert!(
        frames.iter().all(|f| f.external == 0),
        "payloads by reference"
    );
    frames
        .iter()
        .filter(|f| f.messages > 0)
        .map(|f| (&buf[f.start..f.end], f.messages))
        .collect()
}

/// Messages numbered `nums` (the payload is the number, 8 bytes) in one batch: a fixture
/// of the tests that drive windows and sessions.
#[cfg(test)]
pub(crate) fn numbered(nums: std::ops::Range<u64>) -> Batch {
    // Frames of 1 KiB: a batch of a few dozen messages spans several.
    let mut ob = Outbox::new(1 << 10);
    let (to, from) = (Name::from_static("m"), Name::from_static("s"));
    for i in nums {
        ob.push_message(0, &to, &from, &i.to_le_bytes(), None);
    }
    let mut b = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut b, None);
    b
}

/// The bytes of a frame on the wire: `part` (its bytes in the buffer, which start at offset
/// `start`) with the payloads of `refs` that belong to it spliced in. Returns them and the
/// refs that follow (those past the frame). Copies: the tests' view of the wire.
#[cfg(test)]
pub(crate) fn spliced<'a>(part: &[u8], start: usize, refs: &'a [ByRef]) -> (Vec<u8>, &'a [ByRef]) {
    let end = start + part.len();
    let n = refs.iter().take_while(|r| r.at <= end).count();
    let (mine, rest) = refs.split_at(n);
    let mut out =
        Vec::with_capacity(part.len() + mine.iter().map(|r| r.payload.len()).sum::<usize>());
    let mut from = start;
    for r in mine {
        let at = r.at.clamp(from, end);
        out.extend_from_slice(&part[from - start..at - start]);
        out.extend_from_slice(&r.payload);
        from = at;
    }
    out.extend_from_slice(&part[from - start..]);
    (out, rest)
}

/// One message of a MESSAGES frame encoded here, where it lies: its names and payload as
/// ranges of the buffer, or its payload by reference.
pub(crate) struct MessageAt<'a> {
    /// Its number in the frame.
    pub index: u32,
    pub to: std::ops::Range<usize>,
    pub from: std::ops::Range<usize>,
    /// The payload in the buffer (empty if it is sent by reference).
    pub payload: std::ops::Range<usize>,
    pub by_ref: Option<&'a ByRef>,
}

impl MessageAt<'_> {
    pub fn payload_len(&self) -> usize {
        self.by_ref.map_or(self.payload.len(), |r| r.payload.len())
    }
    /// Its charge against credit ([`message_len`]).
    pub fn charge(&self) -> u64 {
        (crate::header::MESSAGE_OVERHEAD + self.to.len() + self.from.len() + self.payload_len())
            as u64
    }
}

/// Walk the messages of the MESSAGES frame at `start..end` of `buf`, encoded here, whose
/// payloads sent by reference are the first of `refs` (by offset): `f` for each, nothing
/// copied. Returns how many of `refs` the frame holds. (The bytes were encoded by this
/// node; a walk that would leave the frame stops.)
pub(crate) fn walk_messages<'a>(
    buf: &[u8],
    (start, end): (usize, usize),
    refs: &'a [ByRef],
    mut f: impl FnMut(MessageAt<'a>),
) -> usize {
    let frame = buf.get(start..end).unwrap_or_default();
    let count = wire::list_count(frame).unwrap_or(0);
    let (mut p, mut taken) = (start + LIST_OVERHEAD, 0);
    let name_at = |p: usize| -> Option<std::ops::Range<usize>> {
        let len = *buf.get(p)? as usize;
        Some(p + 1..p + 1 + len)
    };
    for index in 0..count {
        let Some(to) = name_at(p) else { break };
        let Some(from) = name_at(to.end) else { break };
        let Some(len) = buf.get(from.end..from.end + 4) else {
            break;
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        p = from.end + 4;
        let by_ref = refs.get(taken).filter(|r| r.at == p);
        let payload = if by_ref.is_some() {
            taken += 1;
            p..p
        } else {
            p..p + len
        };
        p = payload.end;
        if p > end {
            break;
        }
        f(MessageAt {
            index,
            to,
            from,
            payload,
            by_ref,
        });
    }
    taken
}

/// Split frames into groups of consecutive frames with the same destination.
pub fn groups(frames: &[FrameMeta]) -> impl Iterator<Item = &[FrameMeta]> + '_ {
    frames.chunk_by(|a, b| a.dest == b.dest)
}

struct Open {
    dest: Dest,
    writer: ListWriter,
    start: usize,
    /// Bytes of its payloads sent by reference.
    external: usize,
}

/// Encoded messages waiting for the writer.
pub struct Outbox {
    buf: Vec<u8>,
    /// Bytes of `buf` before this offset were already taken.
    head: usize,
    frames: VecDeque<FrameMeta>,
    open: Option<Open>,
    /// A frame is closed once it holds this many bytes (0: one message per frame).
    frame_bytes: usize,
    messages: usize,
    /// Control frames queued (they count as messages for the bundler, so they go out).
    controls: usize,
    oldest: Option<Instant>,
    /// Payloads at least this long are sent by reference ([`Outbox::push_bytes`]).
    by_ref_from: usize,
    /// Payloads sent by reference, in order, at offsets of `buf`.
    refs: VecDeque<ByRef>,
    /// Their bytes.
    ref_bytes: usize,
}

impl Outbox {
    pub fn new(frame_bytes: usize) -> Self {
        Outbox {
            buf: Vec::new(),
            head: 0,
            frames: VecDeque::new(),
            open: None,
            frame_bytes,
            messages: 0,
            controls: 0,
            oldest: None,
            by_ref_from: usize::MAX,
            refs: VecDeque::new(),
            ref_bytes: 0,
        }
    }

    /// Send payloads of at least `bytes` by reference rather than copying them (see the
    /// module documentation); `usize::MAX` (the default): never.
    pub fn by_reference(mut self, bytes: usize) -> Self {
        self.by_ref_from = bytes.max(1);
        self
    }

    /// Let go of its buffers if nothing is queued (the peer is gone for good): a queue
    /// that once held a burst keeps the capacity for the next.
    pub fn release_buffers(&mut self) {
        if self.is_empty() && self.messages == 0 && self.controls == 0 && self.open.is_none() {
            *self = Outbox {
                by_ref_from: self.by_ref_from,
                ..Outbox::new(self.frame_bytes)
            };
        }
    }

    /// Capacity of its buffer.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes waiting (payloads sent by reference included).
    pub fn bytes(&self) -> usize {
        self.buf.len() - self.head + self.ref_bytes
    }

    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Control frames queued.
    pub fn controls(&self) -> usize {
        self.controls
    }

    pub fn is_empty(&self) -> bool {
        self.bytes() == 0
    }

    /// The level the bundler sees; queued control frames count as messages.
    pub fn level(&self) -> QueueLevel {
        QueueLevel {
            messages: self.messages + self.controls,
            bytes: self.bytes(),
            oldest: self.oldest,
        }
    }

    /// Encode one message for `dest`. `now` is recorded as the oldest time when the outbox
    /// was empty (pass `None` if no bundler needs it).
    #[inline]
    pub fn push_message(
        &mut self,
        dest: Dest,
        to: &Name,
        from: &Name,
        payload: &[u8],
        now: Option<Instant>,
    ) {
        if self.is_empty() {
            self.oldest = now;
        }
        let len = message_len(to, from, payload.len());
        self.open_for(dest, len, len);
        if let Some(o) = self.open.as_mut() {
            o.writer.push(&mut self.buf, to, from, payload);
        }
        self.messages += 1;
    }

    /// [`Outbox::push_message`], but a payload of at least the
    /// [`by_reference`](Outbox::by_reference) size is not copied: a clone of `payload` is
    /// kept until the frame is taken.
    #[inline]
    pub fn push_bytes(
        &mut self,
        dest: Dest,
        to: &Name,
        from: &Name,
        payload: &Bytes,
        now: Option<Instant>,
    ) {
        if payload.len() < self.by_ref_from {
            return self.push_message(dest, to, from, payload, now);
        }
        if self.is_empty() {
            self.oldest = now;
        }
        let len = message_len(to, from, payload.len());
        self.open_for(dest, len, len - payload.len());
        if let Some(o) = self.open.as_mut() {
            o.writer.push_head(&mut self.buf, to, from, payload.len());
            o.external += payload.len();
        }
        self.refs.push_back(ByRef {
            at: self.buf.len(),
            payload: payload.clone(),
        });
        self.ref_bytes += payload.len();
        self.messages += 1;
    }

    /// Keep the open frame if it is for `dest` and a message of `len` bytes fits in it;
    /// else open a new one (with room in the buffer for `in_buf` bytes of the message).
    #[inline]
    fn open_for(&mut self, dest: Dest, len: usize, in_buf: usize) {
        let reuse = match &self.open {
            Some(o) => {
                o.dest == dest && (o.writer.len(&self.buf) + o.external + len <= self.frame_bytes)
            }
            None => false,
        };
        if !reuse {
            self.close_open();
            self.buf.reserve(LIST_OVERHEAD + in_buf);
            let start = self.buf.len();
            self.open = Some(Open {
                dest,
                writer: ListWriter::start(&mut self.buf),
                start,
                external: 0,
            });
        }
    }

    /// Queue a control frame (e.g. an undeliverable notice) for `dest`, after what is queued.
    pub fn push_frame(&mut self, dest: Dest, frame: &Frame) {
        self.close_open();
        self.controls += 1;
        let start = self.buf.len();
        frame.encode(&mut self.buf);
        self.frames.push_back(FrameMeta {
            dest,
            start,
            end: self.buf.len(),
            messages: 0,
            external: 0,
        });
    }

    fn close_open(&mut self) {
        if let Some(o) = self.open.take() {
            let messages = o.writer.count();
            o.writer.finish_with(&mut self.buf, o.external);
            self.frames.push_back(FrameMeta {
                dest: o.dest,
                start: o.start,
                end: self.buf.len(),
                messages,
                external: o.external as u32,
            });
        }
    }

    /// Call `f(mailbox, charge)` for every message queued for `dest` (or for every
    /// member): what they charge against credit (a recount: see `credit`).
    pub fn charges(&mut self, dest: Dest, mut f: impl FnMut(&Name, u64)) {
        self.close_open();
        self.refs.make_contiguous();
        let mut rest = self.refs.as_slices().0;
        for fm in &self.frames {
            if fm.messages == 0 {
                continue;
            }
            let mine = rest.iter().take_while(|r| r.at <= fm.end).count();
            let (refs, after) = rest.split_at(mine);
            rest = after;
            if fm.dest != dest && fm.dest != ALL {
                continue;
            }
            walk_messages(&self.buf, (fm.start, fm.end), refs, |m| {
                f(&Name::copied(&self.buf[m.to.clone()]), m.charge())
            });
        }
    }

    /// Move whole frames into `out` (which is cleared first): every frame if the limits
    /// allow, else frames from the front while both limits hold (always at least one).
    /// `now` becomes the oldest time of what stays, if anything stays.
    pub fn take(
        &mut self,
        max_messages: usize,
        max_bytes: usize,
        out: &mut Batch,
        now: Option<Instant>,
    ) {
        out.clear();
        self.close_open();
        if self.messages <= max_messages && self.bytes() <= max_bytes {
            // Everything: swap buffers, so neither side allocates in steady state.
            std::mem::swap(&mut self.buf, &mut out.buf);
            let head = self.head;
            out.frames.extend(self.frames.drain(..).map(|mut f| {
                f.start -= head;
                f.end -= head;
                f
            }));
            if head > 0 {
                out.buf.drain(..head);
            }
            out.refs.extend(self.refs.drain(..).map(|mut r| {
                r.at -= head;
                r
            }));
            self.ref_bytes = 0;
            self.buf.clear();
            self.head = 0;
            self.messages = 0;
            self.controls = 0;
            self.oldest = None;
            return;
        }
        let (mut msgs, mut bytes) = (0usize, 0usize);
        while let Some(&f) = self.frames.front() {
            let m = f.messages as usize;
            if !out.frames.is_empty()
                && (msgs + m > max_messages || bytes + f.wire_len() > max_bytes)
            {
                break;
            }
            self.frames.pop_front();
            let start = out.buf.len();
            out.buf.extend_from_slice(&self.buf[f.start..f.end]);
            out.frames.push(FrameMeta {
                start,
                end: out.buf.len(),
                ..f
            });
            while self.refs.front().is_some_and(|r| r.at <= f.end) {
                if let Some(mut r) = self.refs.pop_front() {
                    self.ref_bytes -= r.payload.len();
                    r.at = r.at - f.start + start;
                    out.refs.push(r);
                }
            }
            msgs += m;
            bytes += f.wire_len();
            self.head = f.end;
            if m == 0 {
                self.controls -= 1;
            }
        }
        self.messages -= msgs;
        if self.frames.is_empty() {
            self.buf.clear();
            self.head = 0;
            self.oldest = None;
        } else {
            self.oldest = now.or(self.oldest);
        }
    }
}

#[cfg(test)]
mod tests;
