//! Frames: the units of the batchwire wire protocol, parsed check-then-parse.
//!
//! ```text
//! frame   = len:u32 kind:u8 body          len counts kind + body, little-endian
//! HELLO   (1) = "BWIR" version:u16 incarnation:u64 nonce:[16] name
//! AUTH    (2) = proof:[32]                HMAC-SHA256, see `handshake`
//! REFUSE  (3) = code:u8 reason_len:u16 reason:utf8
//! MESSAGES(4) = count:u32 first_seq:u64 { to:name from:name payload_len:u32 payload }*count
//! UNDELIV (5) = count:u32 to:name from:name
//! GOODBYE (6) = (empty)                   orderly close: no more frames follow
//! ACK     (7) = next:u64                  every message below `next` was received
//! RESUME  (8) = next:u64 base:u64         first frame after the handshake: received below
//!                                         `next`; the sender keeps nothing below `base`
//! name    = len:u8 utf8
//! ```
//!
//! The HELLO layout is frozen across protocol versions so that a node can always read a
//! peer's version and refuse it with a clear reason.
//!
//! Decoding is split like mini-redis' `Frame::check` / `Frame::parse`: [`check`] looks only at
//! the header and says whether a whole frame is buffered ("incomplete" is `Ok(None)`, not an
//! error), refusing a length above the limit *before* anything is allocated for it; then
//! [`decode`] splits the frame off the buffer and parses it.

use bytes::{Bytes, BytesMut};

use super::codec::{Codec, DecodeError, Name, Reader};

/// The four bytes every HELLO starts with.
pub const MAGIC: [u8; 4] = *b"BWIR";
/// The protocol version this build speaks.
/// Version 2: role-bound handshake proofs (the acceptor proves only after the dialler).
pub const PROTOCOL_VERSION: u16 = 2;
/// Bytes before the body: the length and the kind.
pub const HEADER_LEN: usize = 5;
/// Bytes a MESSAGES frame adds around its messages (header, count, first sequence number).
pub const LIST_OVERHEAD: usize = HEADER_LEN + 4 + 8;
/// Where a MESSAGES frame's first sequence number sits, from the frame's start.
const SEQ_OFFSET: usize = HEADER_LEN + 4;
/// Bytes each message adds around its names and payload (two name lengths, payload length).
pub const MESSAGE_OVERHEAD: usize = 1 + 1 + 4;
/// Longest reason text carried in a REFUSE frame.
pub const MAX_REASON_LEN: usize = 1024;

const KIND_HELLO: u8 = 1;
const KIND_AUTH: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_MESSAGES: u8 = 4;
const KIND_UNDELIVERABLE: u8 = 5;
const KIND_GOODBYE: u8 = 6;
const KIND_ACK: u8 = 7;
const KIND_RESUME: u8 = 8;

/// Why a buffer does not hold a valid frame. Any of these closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("frame length 0 (a frame has at least a kind byte)")]
    Empty,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("malformed {kind} frame: {source}")]
    Malformed {
        kind: &'static str,
        #[source]
        source: DecodeError,
    },
}

/// One frame of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    Auth(Auth),
    Refuse(Refuse),
    Messages(MessageList),
    Undeliverable(Undeliverable),
    Goodbye,
    /// Every message below this sequence number was received.
    Ack(u64),
    Resume(Resume),
}

/// The first frame after a handshake, each way: where the two sides' streams stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The next sequence number the sender of this frame expects from its peer.
    pub next: u64,
    /// The oldest sequence number the sender of this frame still holds for its peer;
    /// anything below it that the peer has not received was given up (reported failed).
    pub base: u64,
}

impl Frame {
    /// The frame's name, for logs and errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "HELLO",
            Frame::Auth(_) => "AUTH",
            Frame::Refuse(_) => "REFUSE",
            Frame::Messages(_) => "MESSAGES",
            Frame::Undeliverable(_) => "UNDELIVERABLE",
            Frame::Goodbye => "GOODBYE",
            Frame::Ack(_) => "ACK",
            Frame::Resume(_) => "RESUME",
        }
    }

    /// Append the whole frame (header included) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = begin(out, self.kind());
        match self {
            Frame::Hello(h) => h.encode(out),
            Frame::Auth(a) => a.encode(out),
            Frame::Refuse(r) => r.encode(out),
            Frame::Messages(m) => m.encode(out),
            Frame::Undeliverable(u) => u.encode(out),
            Frame::Goodbye => {}
            Frame::Ack(n) => out.extend_from_slice(&n.to_le_bytes()),
            Frame::Resume(r) => {
                out.extend_from_slice(&r.next.to_le_bytes());
                out.extend_from_slice(&r.base.to_le_bytes());
            }
        }
        finish(out, start);
    }

    fn kind(&self) -> u8 {
        match self {
            Frame::Hello(_) => KIND_HELLO,
            Frame::Auth(_) => KIND_AUTH,
            Frame::Refuse(_) => KIND_REFUSE,
            Frame::Messages(_) => KIND_MESSAGES,
            Frame::Undeliverable(_) => KIND_UNDELIVERABLE,
            Frame::Goodbye => KIND_GOODBYE,
            Frame::Ack(_) => KIND_ACK,
            Frame::Resume(_) => KIND_RESUME,
        }
    }

    fn parse(kind: u8, body: Bytes) -> Result<Frame, FrameError> {
        let mut r = Reader::new(body);
        let (name, res) = match kind {
            KIND_HELLO => ("HELLO", Hello::read(&mut r).map(Frame::Hello)),
            KIND_AUTH => ("AUTH", Auth::read(&mut r).map(Frame::Auth)),
            KIND_REFUSE => ("REFUSE", Refuse::read(&mut r).map(Frame::Refuse)),
            KIND_MESSAGES => ("MESSAGES", MessageList::read(&mut r).map(Frame::Messages)),
            KIND_UNDELIVERABLE => (
                "UNDELIVERABLE",
                Undeliverable::read(&mut r).map(Frame::Undeliverable),
            ),
            KIND_GOODBYE => ("GOODBYE", Ok(Frame::Goodbye)),
            KIND_ACK => ("ACK", r.u64("next").map(Frame::Ack)),
            KIND_RESUME => (
                "RESUME",
                r.u64("next").and_then(|next| {
                    Ok(Frame::Resume(Resume {
                        next,
                        base: r.u64("base")?,
                    }))
                }),
            ),
            other => return Err(FrameError::UnknownKind(other)),
        };
        let frame = res.and_then(|f| r.expect_empty().map(|_| f));
        frame.map_err(|source| FrameError::Malformed { kind: name, source })
    }
}

/// Write a frame header with a placeholder length; returns where the frame starts.
fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, kind]);
    start
}

/// Patch the length of the frame that starts at `start`.
fn finish(out: &mut [u8], start: usize) {
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Is a whole frame at the front of `buf`? `Ok(Some(n))`: yes, `n` bytes long.
/// `Ok(None)`: not yet (incomplete is not an error). `Err`: the header is invalid, and the
/// length is refused before anything is allocated for it.
pub fn check(buf: &[u8], max_frame_len: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max_frame_len {
        return Err(FrameError::TooLarge {
            len,
            max: max_frame_len,
        });
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    Ok(Some(4 + len))
}

/// Take one frame off the front of `buf` if a whole one is there.
pub fn decode(buf: &mut BytesMut, max_frame_len: usize) -> Result<Option<Frame>, FrameError> {
    let Some(n) = check(buf, max_frame_len)? else {
        return Ok(None);
    };
    let mut frame = buf.split_to(n).freeze();
    let header = frame.split_to(HEADER_LEN);
    Frame::parse(header[4], frame).map(Some)
}

/// The first frame of each side of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub incarnation: u64,
    pub nonce: [u8; 16],
    pub name: Name,
}

impl Codec for Hello {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        self.name.encode(out);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let magic: [u8; 4] = r.array("magic")?;
        if magic != MAGIC {
            return Err(DecodeError::Invalid {
                what: "magic",
                detail: format!("{magic:02x?} is not a batchwire hello (expected \"BWIR\")"),
            });
        }
        Ok(Hello {
            version: r.u16("version")?,
            incarnation: r.u64("incarnation")?,
            nonce: r.array("nonce")?,
            name: r.name("node name")?,
        })
    }
}

/// Proof that the sender knows the cluster secret (see `handshake`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub proof: [u8; 32],
}

impl Codec for Auth {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.proof);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Auth {
            proof: r.array("proof")?,
        })
    }
}

/// Why a handshake was refused; sent to the peer just before closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseCode {
    /// Another protocol version.
    Version,
    /// The proof of the cluster secret did not verify.
    Secret,
    /// The wrong node, or a name that is not allowed.
    Name,
    /// A malformed or unexpected frame, or a protocol value that does not add up.
    Protocol,
    /// An inbound connection from a node that this node dials itself.
    Direction,
    /// A code this build does not know.
    Other(u8),
}

impl RefuseCode {
    fn to_u8(self) -> u8 {
        match self {
            RefuseCode::Version => 1,
            RefuseCode::Secret => 2,
            RefuseCode::Name => 3,
            RefuseCode::Protocol => 4,
            RefuseCode::Direction => 5,
            RefuseCode::Other(c) => c,
        }
    }
    fn from_u8(c: u8) -> Self {
        match c {
            1 => RefuseCode::Version,
            2 => RefuseCode::Secret,
            3 => RefuseCode::Name,
            4 => RefuseCode::Protocol,
            5 => RefuseCode::Direction,
            c => RefuseCode::Other(c),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refuse {
    pub code: RefuseCode,
    pub reason: String,
}

impl Codec for Refuse {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut end = self.reason.len().min(MAX_REASON_LEN);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        out.push(self.code.to_u8());
        out.extend_from_slice(&(end as u16).to_le_bytes());
        out.extend_from_slice(&self.reason.as_bytes()[..end]);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let code = RefuseCode::from_u8(r.u8("code")?);
        let len = r.u16("reason length")? as usize;
        if len > MAX_REASON_LEN {
            return Err(DecodeError::Invalid {
                what: "reason length",
                detail: format!("{len} > {MAX_REASON_LEN}"),
            });
        }
        let b = r.take(len, "reason")?;
        let reason =
            String::from_utf8(b.to_vec()).map_err(|_| DecodeError::NotUtf8 { what: "reason" })?;
        Ok(Refuse { code, reason })
    }
}

/// "This many messages you sent from mailbox `from` to mailbox `to` found no such mailbox."
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undeliverable {
    pub count: u32,
    pub to: Name,
    pub from: Name,
}

impl Codec for Undeliverable {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        self.to.encode(out);
        self.from.encode(out);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Undeliverable {
            count: r.u32("count")?,
            to: r.name("destination mailbox")?,
            from: r.name("sending mailbox")?,
        })
    }
}

/// One message as carried in a MESSAGES frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The destination mailbox on the receiving node.
    pub to: Name,
    /// The sending mailbox on the sending node.
    pub from: Name,
    pub payload: Bytes,
}

/// Append one message (no frame header) to `out`.
#[inline]
pub fn encode_message(out: &mut Vec<u8>, to: &Name, from: &Name, payload: &[u8]) {
    to.encode(out);
    from.encode(out);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Encoded size of one message inside a MESSAGES frame.
#[inline]
pub fn message_len(to: &Name, from: &Name, payload_len: usize) -> usize {
    MESSAGE_OVERHEAD + to.len() + from.len() + payload_len
}

/// Builds one MESSAGES frame in place at the end of a buffer: `start`, then `push` each
/// message, then `finish` patches the length and count. Nothing is allocated per message.
pub struct ListWriter {
    start: usize,
    count: u32,
}

impl ListWriter {
    /// Start a frame; its first sequence number is 0 until [`set_first_seq`] patches it.
    pub fn start(out: &mut Vec<u8>) -> Self {
        let start = begin(out, KIND_MESSAGES);
        out.extend_from_slice(&[0; 12]);
        ListWriter { start, count: 0 }
    }

    #[inline]
    pub fn push(&mut self, out: &mut Vec<u8>, to: &Name, from: &Name, payload: &[u8]) {
        encode_message(out, to, from, payload);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes written so far for this frame, header included.
    pub fn len(&self, out: &[u8]) -> usize {
        out.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn finish(self, out: &mut [u8]) {
        let c = self.start + HEADER_LEN;
        out[c..c + 4].copy_from_slice(&self.count.to_le_bytes());
        finish(out, self.start);
    }
}

/// Set the first sequence number of the encoded MESSAGES frame that starts `frame`.
pub fn set_first_seq(frame: &mut [u8], seq: u64) {
    frame[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_le_bytes());
}

/// A validated MESSAGES frame: the messages are still in the receive buffer and are handed
/// out as slices of it by [`MessageList::iter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageList {
    count: u32,
    /// Sequence number of the first message (per sending node and connection direction).
    pub first_seq: u64,
    /// The messages, after the count and sequence number.
    body: Bytes,
}

impl MessageList {
    /// Build a list from messages (tests and cold paths; the writer uses [`ListWriter`]).
    pub fn from_messages<'a>(msgs: impl IntoIterator<Item = &'a Message>) -> Self {
        let mut body = Vec::new();
        let mut count = 0;
        for m in msgs {
            encode_message(&mut body, &m.to, &m.from, &m.payload);
            count += 1;
        }
        MessageList {
            count,
            first_seq: 0,
            body: body.into(),
        }
    }

    /// The same list without its first `n` messages (already received before a resend).
    pub fn skip(&self, n: u32) -> MessageList {
        let n = n.min(self.count);
        let mut pos = 0;
        for _ in 0..n {
            // Validated when the list was read.
            pos = message_span(&self.body, pos)
                .map(|s| s.end)
                .unwrap_or(self.body.len());
        }
        MessageList {
            count: self.count - n,
            first_seq: self.first_seq + n as u64,
            body: self.body.slice(pos..),
        }
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn iter(&self) -> MessageIter {
        MessageIter {
            r: Reader::new(self.body.clone()),
            left: self.count,
        }
    }
}

impl Codec for MessageList {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.first_seq.to_le_bytes());
        out.extend_from_slice(&self.body);
    }
    /// Checks every message (lengths and UTF-8 of names) so that iteration cannot fail.
    /// The check borrows the bytes: no reference counts are touched per message.
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let count = r.u32("count")?;
        let first_seq = r.u64("first sequence number")?;
        let body = r.take(r.remaining(), "messages")?;
        let mut pos = 0;
        let mut prev = None;
        for _ in 0..count {
            let s = check_message(&body, pos, prev.as_ref())?;
            pos = s.end;
            prev = Some(s);
        }
        if pos != body.len() {
            return Err(DecodeError::TrailingBytes(body.len() - pos));
        }
        Ok(MessageList {
            count,
            first_seq,
            body,
        })
    }
}

/// Where one message's parts lie in a message-list body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageSpan {
    pub to: (usize, usize),
    pub from: (usize, usize),
    pub payload: (usize, usize),
    pub end: usize,
}

fn name_span(b: &[u8], pos: usize, what: &'static str) -> Result<(usize, usize), DecodeError> {
    let len = *b.get(pos).ok_or(DecodeError::Truncated { what })? as usize;
    if b.len() < pos + 1 + len {
        return Err(DecodeError::Truncated { what });
    }
    Ok((pos + 1, pos + 1 + len))
}

/// Where the message at `pos` of a message-list body lies, checking lengths only.
pub fn message_span(b: &[u8], pos: usize) -> Result<MessageSpan, DecodeError> {
    let to = name_span(b, pos, "destination mailbox")?;
    let from = name_span(b, to.1, "sending mailbox")?;
    let l = b.get(from.1..from.1 + 4).ok_or(DecodeError::Truncated {
        what: "payload length",
    })?;
    let len = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
    let start = from.1 + 4;
    let end = start
        .checked_add(len)
        .filter(|e| *e <= b.len())
        .ok_or(DecodeError::Truncated { what: "payload" })?;
    Ok(MessageSpan {
        to,
        from,
        payload: (start, end),
        end,
    })
}

/// Check the message at `pos` of a message-list body (lengths, and that both names are
/// UTF-8) and say where its parts are. `prev` is the previous message's span: a name with
/// the same bytes as the previous message's was already checked (the common case, one
/// sender streaming to one mailbox) and is not checked again.
pub fn check_message(
    b: &[u8],
    pos: usize,
    prev: Option<&MessageSpan>,
) -> Result<MessageSpan, DecodeError> {
    let s = message_span(b, pos)?;
    let same = |x: (usize, usize), y: Option<(usize, usize)>| {
        y.is_some_and(|y| b[x.0..x.1] == b[y.0..y.1])
    };
    if !same(s.to, prev.map(|p| p.to)) && std::str::from_utf8(&b[s.to.0..s.to.1]).is_err() {
        return Err(DecodeError::NotUtf8 {
            what: "destination mailbox",
        });
    }
    if !same(s.from, prev.map(|p| p.from)) && std::str::from_utf8(&b[s.from.0..s.from.1]).is_err() {
        return Err(DecodeError::NotUtf8 {
            what: "sending mailbox",
        });
    }
    Ok(s)
}

impl MessageList {
    /// The encoded messages (after the count).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Runs of consecutive messages to the same mailbox: (mailbox name bytes, byte range in
    /// [`MessageList::body`], message count). Borrows; touches no reference counts.
    pub fn runs(&self) -> impl Iterator<Item = (&[u8], std::ops::Range<usize>, u32)> + '_ {
        let b = &self.body[..];
        let mut pos = 0;
        let mut left = self.count;
        let mut pending: Option<MessageSpan> = None;
        std::iter::from_fn(move || {
            let first = match pending.take() {
                Some(s) => s,
                None => {
                    if left == 0 {
                        return None;
                    }
                    left -= 1;
                    // Validated when the list was read.
                    let s = message_span(b, pos).ok()?;
                    pos = s.end;
                    s
                }
            };
            let to = &b[first.to.0..first.to.1];
            let start = first.to.0 - 1;
            let (mut end, mut n) = (first.end, 1u32);
            while left > 0 {
                let s = message_span(b, pos).ok()?;
                left -= 1;
                pos = s.end;
                if b[s.to.0..s.to.1] != *to {
                    pending = Some(s);
                    break;
                }
                end = s.end;
                n += 1;
            }
            Some((to, start..end, n))
        })
    }
}

/// Take the next message off the front of validated message bytes (a run handed out by
/// [`MessageList::runs`]): its sending mailbox and payload, as slices of `data`. `None` if
/// `data` is empty or (never, for validated bytes) malformed.
pub fn next_message(data: &mut Bytes) -> Option<(Name, Bytes, usize)> {
    let s = message_span(data, 0).ok()?;
    let from = Name::from_validated(data.slice(s.from.0..s.from.1));
    let payload = data.slice(s.payload.0..s.payload.1);
    bytes::Buf::advance(data, s.end);
    Some((from, payload, s.end))
}

fn read_message(r: &mut Reader) -> Result<Message, DecodeError> {
    let to = r.name("destination mailbox")?;
    let from = r.name("sending mailbox")?;
    let len = r.u32("payload length")? as usize;
    let payload = r.take(len, "payload")?;
    Ok(Message { to, from, payload })
}

/// Iterator over a validated [`MessageList`].
pub struct MessageIter {
    r: Reader,
    left: u32,
}

impl Iterator for MessageIter {
    type Item = Message;
    fn next(&mut self) -> Option<Message> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated in `MessageList::read`, so this cannot fail.
        read_message(&mut self.r).ok()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 1 << 20;

    fn n(s: &str) -> Name {
        Name::new(s).unwrap()
    }

    fn sample_frames() -> Vec<Frame> {
        let msgs = [
            Message {
                to: n("inbox"),
                from: n("client"),
                payload: Bytes::from_static(b"hello"),
            },
            Message {
                to: n("x"),
                from: n(""),
                payload: Bytes::new(),
            },
        ];
        vec![
            Frame::Hello(Hello {
                version: PROTOCOL_VERSION,
                incarnation: 42,
                nonce: [7; 16],
                name: n("node-a"),
            }),
            Frame::Auth(Auth { proof: [9; 32] }),
            Frame::Refuse(Refuse {
                code: RefuseCode::Secret,
                reason: "wrong cluster secret".into(),
            }),
            Frame::Messages(MessageList::from_messages(&msgs)),
            Frame::Undeliverable(Undeliverable {
                count: 3,
                to: n("nobody"),
                from: n("me"),
            }),
            Frame::Goodbye,
            Frame::Ack(77),
            Frame::Resume(Resume { next: 5, base: 3 }),
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in sample_frames() {
            let mut v = Vec::new();
            f.encode(&mut v);
            let mut buf = BytesMut::from(&v[..]);
            assert_eq!(decode(&mut buf, MAX).unwrap(), Some(f));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn every_truncation_is_incomplete_not_an_error() {
        for f in sample_frames() {
            let mut v = Vec::new();
            f.encode(&mut v);
            for cut in 0..v.len() {
                let mut buf = BytesMut::from(&v[..cut]);
                assert_eq!(decode(&mut buf, MAX), Ok(None), "{f:?} cut at {cut}");
                assert_eq!(buf.len(), cut, "an incomplete frame consumes nothing");
            }
        }
    }

    #[test]
    fn huge_length_is_refused_from_the_header_alone() {
        let buf = [0xff, 0xff, 0xff, 0x7f];
        assert_eq!(
            check(&buf, MAX),
            Err(FrameError::TooLarge {
                len: 0x7fff_ffff,
                max: MAX
            })
        );
        assert_eq!(check(&[0, 0, 0, 0], MAX), Err(FrameError::Empty));
    }

    #[test]
    fn garbled_frames_are_typed_errors() {
        // Unknown kind.
        assert_eq!(
            decode(&mut BytesMut::from(&[1, 0, 0, 0, 99][..]), MAX),
            Err(FrameError::UnknownKind(99))
        );
        // Hello with the wrong magic.
        let mut v = Vec::new();
        Frame::Hello(Hello {
            version: 1,
            incarnation: 1,
            nonce: [0; 16],
            name: n("a"),
        })
        .encode(&mut v);
        v[5] = b'X';
        assert!(matches!(
            decode(&mut BytesMut::from(&v[..]), MAX),
            Err(FrameError::Malformed { kind: "HELLO", .. })
        ));
        // A message list whose count promises more messages than it holds.
        let mut v = Vec::new();
        Frame::Messages(MessageList::from_messages(&[])).encode(&mut v);
        v[5] = 1;
        assert!(matches!(
            decode(&mut BytesMut::from(&v[..]), MAX),
            Err(FrameError::Malformed {
                kind: "MESSAGES",
                ..
            })
        ));
    }

    #[test]
    fn list_writer_matches_from_messages() {
        let m = Message {
            to: n("to"),
            from: n("from"),
            payload: Bytes::from_static(b"abc"),
        };
        let mut v = Vec::new();
        let mut w = ListWriter::start(&mut v);
        w.push(&mut v, &m.to, &m.from, &m.payload);
        w.push(&mut v, &m.to, &m.from, &m.payload);
        assert_eq!(
            w.len(&v),
            LIST_OVERHEAD + 2 * message_len(&m.to, &m.from, 3)
        );
        w.finish(&mut v);
        let mut expect = Vec::new();
        Frame::Messages(MessageList::from_messages([&m, &m])).encode(&mut expect);
        assert_eq!(v, expect);
    }

    fn arb_name() -> impl Strategy<Value = Name> {
        "[a-z0-9/_-]{0,20}".prop_map(|s| Name::new(&s).unwrap())
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        (
            arb_name(),
            arb_name(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(to, from, p)| Message {
                to,
                from,
                payload: p.into(),
            })
    }

    proptest! {
        #[test]
        fn message_lists_round_trip(msgs in proptest::collection::vec(arb_message(), 0..40)) {
            let mut v = Vec::new();
            Frame::Messages(MessageList::from_messages(&msgs)).encode(&mut v);
            let mut buf = BytesMut::from(&v[..]);
            let Some(Frame::Messages(list)) = decode(&mut buf, MAX).unwrap() else {
                panic!("not a message list")
            };
            prop_assert_eq!(list.iter().collect::<Vec<_>>(), msgs);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut buf = BytesMut::from(&bytes[..]);
            // Decode until error or incomplete; every outcome is fine but a panic.
            for _ in 0..512 {
                match decode(&mut buf, 4096) {
                    Ok(Some(Frame::Messages(l))) => { let _ = l.iter().count(); }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }

        #[test]
        fn random_bodies_behind_valid_headers_never_panic(
            kind in 0u8..8, body in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let mut v = ((body.len() + 1) as u32).to_le_bytes().to_vec();
            v.push(kind);
            v.extend_from_slice(&body);
            let _ = decode(&mut BytesMut::from(&v[..]), 4096);
        }
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;
    use bytes::BytesMut;

    fn msg(to: &str, from: &str, p: &[u8]) -> Message {
        Message {
            to: Name::new(to).unwrap(),
            from: Name::new(from).unwrap(),
            payload: Bytes::copy_from_slice(p),
        }
    }

    #[test]
    fn runs_group_consecutive_messages_by_mailbox_and_next_message_walks_a_run() {
        let msgs = [
            msg("a", "x", b"1"),
            msg("a", "y", b"2"),
            msg("b", "x", b"3"),
            msg("a", "x", b"4"),
        ];
        let list = MessageList::from_messages(&msgs);
        let runs: Vec<_> = list.runs().map(|(to, r, n)| (to.to_vec(), r, n)).collect();
        assert_eq!(runs.len(), 3);
        assert_eq!((runs[0].0.as_slice(), runs[0].2), (&b"a"[..], 2));
        assert_eq!((runs[1].0.as_slice(), runs[1].2), (&b"b"[..], 1));
        assert_eq!((runs[2].0.as_slice(), runs[2].2), (&b"a"[..], 1));
        assert_eq!(runs[2].1.end, list.body().len());
        let mut data = list.body().slice(runs[0].1.clone());
        let (from, payload, _) = next_message(&mut data).unwrap();
        assert_eq!((from.as_str(), &payload[..]), ("x", &b"1"[..]));
        let (from, payload, _) = next_message(&mut data).unwrap();
        assert_eq!((from.as_str(), &payload[..]), ("y", &b"2"[..]));
        assert!(next_message(&mut data).is_none());
    }

    #[test]
    fn skip_drops_leading_messages_and_advances_the_sequence() {
        let mut list = MessageList::from_messages(&[
            msg("a", "x", b"1"),
            msg("a", "x", b"2"),
            msg("b", "y", b"3"),
        ]);
        list.first_seq = 10;
        let rest = list.skip(2);
        assert_eq!(rest.first_seq, 12);
        let got: Vec<_> = rest.iter().map(|m| m.payload.to_vec()).collect();
        assert_eq!(got, [b"3".to_vec()]);
        assert!(list.skip(3).is_empty() && list.skip(9).is_empty());
        let mut v = vec![0u8; 0];
        let mut w = ListWriter::start(&mut v);
        w.push(
            &mut v,
            &Name::from_static("a"),
            &Name::from_static(""),
            b"z",
        );
        w.finish(&mut v);
        set_first_seq(&mut v, 99);
        let Ok(Some(Frame::Messages(l))) = decode(&mut BytesMut::from(&v[..]), 1 << 20) else {
            panic!()
        };
        assert_eq!(l.first_seq, 99);
    }

    #[test]
    fn a_bad_name_after_a_good_one_is_still_caught() {
        let list = MessageList::from_messages(&[msg("a", "x", b"1"), msg("bb", "x", b"2")]);
        let mut v = Vec::new();
        Frame::Messages(list).encode(&mut v);
        // The second message's destination "bb" becomes invalid UTF-8.
        let at = v.iter().rposition(|b| *b == b'b').unwrap();
        v[at] = 0xff;
        let err = decode(&mut BytesMut::from(&v[..]), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    #[test]
    fn an_empty_list_has_no_runs() {
        assert_eq!(MessageList::from_messages(&[]).runs().count(), 0);
    }
}
