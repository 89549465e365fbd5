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

use std::collections::VecDeque;
use std::time::Instant;

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
}

impl FrameMeta {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// What `take` moved out: a buffer and the frames in it, in order.
#[derive(Debug, Default)]
pub struct Batch {
    pub buf: Vec<u8>,
    pub frames: Vec<FrameMeta>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.frames.clear();
    }
    pub fn messages(&self) -> u64 {
        self.frames.iter().map(|f| f.messages as u64).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
    /// Its MESSAGES frames with their message counts (see [`message_frames`]).
    pub fn message_frames(&self) -> Vec<(&[u8], u32)> {
        message_frames(&self.buf, &self.frames)
    }
    /// Groups of consecutive frames with the same destination: each group is one write
    /// (per destination peer, for the null destination).
    pub fn groups(&self) -> impl Iterator<Item = &[FrameMeta]> + '_ {
        groups(&self.frames)
    }
}

/// The MESSAGES frames among `frames` (control frames left out), as slices of `buf` with
/// their message counts: what a send window holds.
pub fn message_frames<'a>(buf: &'a [u8], frames: &[FrameMeta]) -> Vec<(&'a [u8], u32)> {
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

/// Split frames into groups of consecutive frames with the same destination.
pub fn groups(frames: &[FrameMeta]) -> impl Iterator<Item = &[FrameMeta]> + '_ {
    frames.chunk_by(|a, b| a.dest == b.dest)
}

struct Open {
    dest: Dest,
    writer: ListWriter,
    start: usize,
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
        }
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> usize {
        self.buf.len() - self.head
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
        let reuse = match &self.open {
            Some(o) => o.dest == dest && (o.writer.len(&self.buf) + len <= self.frame_bytes),
            None => false,
        };
        if !reuse {
            self.close_open();
            self.buf.reserve(LIST_OVERHEAD + len);
            let start = self.buf.len();
            self.open = Some(Open {
                dest,
                writer: ListWriter::start(&mut self.buf),
                start,
            });
        }
        if let Some(o) = self.open.as_mut() {
            o.writer.push(&mut self.buf, to, from, payload);
        }
        self.messages += 1;
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
        });
    }

    fn close_open(&mut self) {
        if let Some(o) = self.open.take() {
            let messages = o.writer.count();
            o.writer.finish(&mut self.buf);
            self.frames.push_back(FrameMeta {
                dest: o.dest,
                start: o.start,
                end: self.buf.len(),
                messages,
            });
        }
    }

    /// Call `f(mailbox, charge)` for every message queued for `dest` (or for every
    /// member): what they charge against credit (a recount: see `credit`).
    pub fn charges(&mut self, dest: Dest, mut f: impl FnMut(&Name, u64)) {
        self.close_open();
        for fm in &self.frames {
            if fm.messages == 0 || (fm.dest != dest && fm.dest != ALL) {
                continue;
            }
            let mut b = bytes::BytesMut::from(&self.buf[fm.start..fm.end]);
            if let Ok(Some(Frame::Messages(l))) = wire::decode(&mut b, usize::MAX) {
                for m in l.iter() {
                    f(&m.to, message_len(&m.to, &m.from, m.payload.len()) as u64);
                }
            }
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
            if !out.frames.is_empty() && (msgs + m > max_messages || bytes + f.len() > max_bytes) {
                break;
            }
            self.frames.pop_front();
            let start = out.buf.len();
            out.buf.extend_from_slice(&self.buf[f.start..f.end]);
            out.frames.push(FrameMeta {
                dest: f.dest,
                start,
                end: out.buf.len(),
                messages: f.messages,
            });
            msgs += m;
            bytes += f.len();
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
mod tests {
    use super::*;
    use crate::frame::{self as fr, Frame};
    use bytes::BytesMut;

    const A: Dest = 0;
    const B: Dest = 1;

    fn push(o: &mut Outbox, dest: Dest, tag: u8) {
        let to = Name::from_static("mb");
        let from = Name::from_static("s");
        o.push_message(dest, &to, &from, &[tag; 3], None);
    }

    /// Decode the frames of a batch into (dest, payload tags).
    fn lists(b: &Batch) -> Vec<(Dest, Vec<u8>)> {
        b.frames
            .iter()
            .map(|f| {
                let mut buf = BytesMut::from(&b.buf[f.start..f.end]);
                let Some(Frame::Messages(l)) = fr::decode(&mut buf, 1 << 20).unwrap() else {
                    panic!("not a message list")
                };
                assert_eq!(l.len() as u32, f.messages);
                (f.dest, l.iter().map(|m| m.payload[0]).collect())
            })
            .collect()
    }

    #[test]
    fn the_seed_example_groups_runs_into_message_lists() {
        // JGRP-1540: destinations A, null, null, B, B, null, A, null, null, null.
        let seq = [A, ALL, ALL, B, B, ALL, A, ALL, ALL, ALL];
        let mut o = Outbox::new(64 << 10);
        for (i, d) in seq.iter().enumerate() {
            push(&mut o, *d, i as u8);
        }
        let mut b = Batch::default();
        o.take(usize::MAX, usize::MAX, &mut b, None);
        // "First we send a message list consisting of 1 message to A, next a list of 2 to the
        // cluster, then a batch of 2 messages to B, 1 to the cluster, 1 to A and 3 to the
        // cluster."
        assert_eq!(
            lists(&b),
            [
                (A, vec![0]),
                (ALL, vec![1, 2]),
                (B, vec![3, 4]),
                (ALL, vec![5]),
                (A, vec![6]),
                (ALL, vec![7, 8, 9]),
            ]
        );
        assert_eq!(b.groups().count(), 6);
        assert!(o.is_empty());
    }

    #[test]
    fn frames_close_at_the_size_limit_and_runs_merge_them_into_one_write() {
        let mut o = Outbox::new(
            LIST_OVERHEAD + 2 * message_len(&Name::from_static("mb"), &Name::from_static("s"), 3),
        );
        for i in 0..5 {
            push(&mut o, A, i);
        }
        let mut b = Batch::default();
        o.take(usize::MAX, usize::MAX, &mut b, None);
        assert_eq!(lists(&b), [(A, vec![0, 1]), (A, vec![2, 3]), (A, vec![4])]);
        let groups: Vec<_> = b.groups().collect();
        assert_eq!(groups.len(), 1, "one destination: one write");
        let g = groups[0];
        assert_eq!((g.len(), g[0].start, g[2].end), (3, 0, b.buf.len()));
        assert!(g.windows(2).all(|w| w[0].end == w[1].start), "contiguous");
    }

    #[test]
    fn zero_frame_bytes_means_one_message_per_frame_and_partial_takes_keep_order() {
        let mut o = Outbox::new(0);
        for i in 0..4 {
            push(&mut o, A, i);
        }
        assert_eq!(o.messages(), 4);
        let mut b = Batch::default();
        o.take(1, usize::MAX, &mut b, None);
        assert_eq!(lists(&b), [(A, vec![0])]);
        o.take(2, usize::MAX, &mut b, None);
        assert_eq!(lists(&b), [(A, vec![1]), (A, vec![2])]);
        push(&mut o, A, 9);
        o.take(usize::MAX, usize::MAX, &mut b, None);
        assert_eq!(lists(&b), [(A, vec![3]), (A, vec![9])]);
        assert!(o.is_empty() && o.messages() == 0);
    }

    #[test]
    fn byte_limited_take_takes_at_least_one_frame() {
        let mut o = Outbox::new(0);
        push(&mut o, A, 1);
        push(&mut o, A, 2);
        let mut b = Batch::default();
        o.take(usize::MAX, 1, &mut b, None);
        assert_eq!(lists(&b), [(A, vec![1])]);
        assert_eq!(o.messages(), 1);
    }

    #[test]
    fn control_frames_keep_their_place() {
        let mut o = Outbox::new(64 << 10);
        push(&mut o, A, 1);
        o.push_frame(A, &Frame::Goodbye);
        push(&mut o, A, 2);
        let mut b = Batch::default();
        assert_eq!(
            o.level().messages,
            3,
            "the control frame counts for the bundler"
        );
        o.take(usize::MAX, usize::MAX, &mut b, None);
        assert_eq!(b.frames.len(), 3);
        assert_eq!(b.frames[1].messages, 0);
        assert_eq!(b.messages(), 2);
    }

    #[test]
    fn oldest_time_is_set_on_first_push_and_cleared_when_emptied() {
        let t0 = Instant::now();
        let mut o = Outbox::new(64 << 10);
        let (to, from) = (Name::from_static("m"), Name::from_static(""));
        o.push_message(A, &to, &from, b"x", Some(t0));
        o.push_message(
            A,
            &to,
            &from,
            b"y",
            Some(t0 + std::time::Duration::from_secs(1)),
        );
        assert_eq!(o.level().oldest, Some(t0));
        let mut b = Batch::default();
        o.take(usize::MAX, usize::MAX, &mut b, None);
        assert_eq!(o.level().oldest, None);
    }
}
