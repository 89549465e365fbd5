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
//! RESUME  (8) = next:u64 base:u64 keep:u64  first frame after the handshake: received below
//!                                         `next`; the sender keeps nothing below `base`;
//!                                         it goes on with no fragmented message whose first
//!                                         fragment is numbered below `keep`
//! FRAGMENT(9) = seq:u64 id:u64 total:u64 offset:u64 to:name from:name data
//!                                         a piece of one message (bulk, or too large for one
//!                                         frame): one sequence number each; `id` is the
//!                                         sequence number of the message's first piece;
//!                                         the pieces of a message are sent in order
//! CREDIT (10) = count:u16 { mailbox:name bytes:u64 }*count
//!                                         the application took this many bytes of your
//!                                         messages out of these mailboxes: send that much more
//! SYNC   (11) = next:u64 window:u64 max_payload:u64 count:u16 { mailbox:name held:u64 }*count
//!                                         where credit stands, as of message `next`: your
//!                                         messages below it hold `held` bytes in each listed
//!                                         mailbox (0 in the others); each mailbox takes up to
//!                                         `window` bytes from you; payloads up to `max_payload`
//! name    = len:u8 utf8
//! ```
//!
//! A message's *charge* against its mailbox's credit is its encoded size in a MESSAGES
//! frame ([`message_len`]); a fragmented message charges the same in total, split over its
//! pieces ([`Fragment::charge`]: each piece its data, the first also the names and lengths).
//!
//! The HELLO layout is frozen across protocol versions so that a node can always read a
//! peer's version and refuse it with a clear reason.
//!
//! Decoding is split like mini-redis' `Frame::check` / `Frame::parse`: [`check`] looks only at
//! the header and says whether a whole frame is buffered ("incomplete" is `Ok(None)`, not an
//! error), refusing a length above the limit *before* anything is allocated for it; then
//! [`decode`] splits the frame off the buffer and parses it.
//!
//! Message lists (the MESSAGES body) live in [`crate::messages`]; they are re-exported here.

mod fragment;
pub use fragment::{
    Fragment, FragmentHead, encode_fragment_head, fragment_charge, fragment_head, starts_fragment,
};

use bytes::{Bytes, BytesMut};

use crate::codec::{Codec, DecodeError, Name, Reader};
pub use crate::header::{
    FRAGMENT_OVERHEAD, HEADER_LEN, LIST_OVERHEAD, MAGIC, MAX_FRAME_LEN, MAX_REASON_LEN,
    MESSAGE_OVERHEAD, PROTOCOL_VERSION,
};
use crate::header::{
    KIND_ACK, KIND_AUTH, KIND_CREDIT, KIND_FRAGMENT, KIND_GOODBYE, KIND_HELLO, KIND_MEMBER,
    KIND_MESSAGES, KIND_REFUSE, KIND_RESUME, KIND_SYNC, KIND_UNDELIVERABLE, begin, finish,
};
pub use crate::messages::{
    ListWriter, Message, MessageIter, MessageList, MessageSpan, check_message, encode_message,
    list_count, message_len, message_span, next_message, set_first_seq,
};

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
    Fragment(Fragment),
    Credit(Credit),
    Sync(Sync),
    /// A membership packet (see [`crate::membership`]): opaque here, at most
    /// [`MAX_MEMBER_LEN`] bytes, checked by the membership layer.
    Member(Bytes),
}

/// The longest MEMBER frame body: a SWIM packet (at most 1400 bytes) and its tag. (No
/// longer sent on connections: membership travels on datagrams, `membership::datagram`.)
pub const MAX_MEMBER_LEN: usize = 2048;

/// The first frame after a handshake, each way: where the two sides' streams stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The next sequence number the sender of this frame expects from its peer.
    pub next: u64,
    /// The oldest sequence number the sender of this frame still holds for its peer;
    /// anything below it that the peer has not received was given up (reported failed).
    pub base: u64,
    /// The sender of this frame goes on with no fragmented message whose first piece is
    /// numbered below this: the peer drops what it reassembled of those.
    pub keep: u64,
}

impl Resume {
    /// A RESUME from scratch: nothing received, nothing held, nothing in pieces.
    pub const FRESH: Resume = Resume {
        next: 0,
        base: 0,
        keep: 0,
    };
}

/// Credit given back: the application took this many bytes out of each mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Credit {
    pub grants: Vec<(Name, u64)>,
}

/// Most entries in one CREDIT or SYNC frame.
pub const MAX_CREDIT_ENTRIES: usize = 1024;

fn encode_entries(out: &mut Vec<u8>, entries: &[(Name, u64)]) {
    let n = entries.len().min(MAX_CREDIT_ENTRIES);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for (name, v) in &entries[..n] {
        name.encode(out);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn read_entries(r: &mut Reader) -> Result<Vec<(Name, u64)>, DecodeError> {
    let n = r.u16("entry count")? as usize;
    if n > MAX_CREDIT_ENTRIES {
        return Err(DecodeError::Invalid {
            what: "entry count",
            detail: format!("{n} > {MAX_CREDIT_ENTRIES}"),
        });
    }
    // Each entry takes at least 9 bytes, so `n` is bounded by the frame before anything
    // is kept for it; entries are pushed as they are read.
    let mut v = Vec::new();
    for _ in 0..n {
        let name = r.name("mailbox")?;
        v.push((name, r.u64("bytes")?));
    }
    Ok(v)
}

impl Codec for Credit {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_entries(out, &self.grants);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Credit {
            grants: read_entries(r)?,
        })
    }
}

/// Where credit stands (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sync {
    /// The snapshot covers the messages below this sequence number.
    pub next: u64,
    /// Bytes each mailbox takes from the peer at once.
    pub window: u64,
    /// The largest payload this node accepts.
    pub max_payload: u64,
    /// Bytes of the peer's messages (below `next`) held per mailbox; others hold none.
    pub held: Vec<(Name, u64)>,
}

impl Codec for Sync {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&self.window.to_le_bytes());
        out.extend_from_slice(&self.max_payload.to_le_bytes());
        encode_entries(out, &self.held);
    }
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Sync {
            next: r.u64("next")?,
            window: r.u64("window")?,
            max_payload: r.u64("max payload")?,
            held: read_entries(r)?,
        })
    }
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
            Frame::Fragment(_) => "FRAGMENT",
            Frame::Credit(_) => "CREDIT",
            Frame::Sync(_) => "SYNC",
            Frame::Member(_) => "MEMBER",
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
                out.extend_from_slice(&r.keep.to_le_bytes());
            }
            Frame::Fragment(f) => f.encode(out),
            Frame::Credit(c) => c.encode(out),
            Frame::Sync(s) => s.encode(out),
            Frame::Member(b) => out.extend_from_slice(b),
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
            Frame::Fragment(_) => KIND_FRAGMENT,
            Frame::Credit(_) => KIND_CREDIT,
            Frame::Sync(_) => KIND_SYNC,
            Frame::Member(_) => KIND_MEMBER,
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
                        keep: r.u64("keep")?,
                    }))
                }),
            ),
            KIND_FRAGMENT => ("FRAGMENT", Fragment::read(&mut r).map(Frame::Fragment)),
            KIND_CREDIT => ("CREDIT", Credit::read(&mut r).map(Frame::Credit)),
            KIND_SYNC => ("SYNC", Sync::read(&mut r).map(Frame::Sync)),
            KIND_MEMBER => ("MEMBER", read_member(&mut r).map(Frame::Member)),
            other => return Err(FrameError::UnknownKind(other)),
        };
        let frame = res.and_then(|f| r.expect_empty().map(|_| f));
        frame.map_err(|source| FrameError::Malformed { kind: name, source })
    }
}

/// A MEMBER body: at least its tag byte, at most [`MAX_MEMBER_LEN`] bytes.
fn read_member(r: &mut Reader) -> Result<Bytes, DecodeError> {
    let n = r.remaining();
    if n == 0 || n > MAX_MEMBER_LEN {
        return Err(DecodeError::Invalid {
            what: "member packet length",
            detail: format!("{n} bytes (1 to {MAX_MEMBER_LEN})"),
        });
    }
    r.take(n, "member packet")
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
    /// The session could not be resumed (the two ends' numbering disagrees): the sender
    /// reset its end (failing what was pending) and asks the receiver to do the same.
    Reset,
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
            RefuseCode::Reset => 6,
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
            6 => RefuseCode::Reset,
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
#[cfg(test)]
mod tests;
