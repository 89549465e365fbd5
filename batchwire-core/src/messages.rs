//! MESSAGES frames: message lists, written in place by [`ListWriter`] and read (validated
//! once, then handed out as slices of the receive buffer) as [`MessageList`].
//!
//! ```text
//! MESSAGES(4) = count:u32 first_seq:u64 { to:name from:name payload_len:u32 payload }*count
//! ```

use bytes::Bytes;

use crate::codec::{Codec, DecodeError, Name, Reader, bytes_eq};
use crate::header::{HEADER_LEN, KIND_MESSAGES, MESSAGE_OVERHEAD, SEQ_OFFSET, begin, finish_with};

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
    encode_message_head(out, to, from, payload.len());
    out.extend_from_slice(payload);
}

/// Append a message's names and payload length, without the payload.
#[inline(always)]
fn encode_message_head(out: &mut Vec<u8>, to: &Name, from: &Name, payload_len: usize) {
    to.encode(out);
    from.encode(out);
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
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

    /// Push a message whose payload is not written here: its names and length only. The
    /// `payload_len` bytes go on the wire right after (a payload sent by reference: see
    /// `outbox`), and [`ListWriter::finish_with`] counts them.
    #[inline]
    pub fn push_head(&mut self, out: &mut Vec<u8>, to: &Name, from: &Name, payload_len: usize) {
        encode_message_head(out, to, from, payload_len);
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
        self.finish_with(out, 0);
    }

    /// [`ListWriter::finish`] for a frame that also carries `external` bytes of payloads
    /// pushed with [`ListWriter::push_head`].
    pub fn finish_with(self, out: &mut [u8], external: usize) {
        let c = self.start + HEADER_LEN;
        out[c..c + 4].copy_from_slice(&self.count.to_le_bytes());
        finish_with(out, self.start, external);
    }
}

/// The message count of the encoded MESSAGES frame that starts `frame` (checked by the
/// caller), if its header is there.
pub fn list_count(frame: &[u8]) -> Option<u32> {
    let b = frame.get(HEADER_LEN..HEADER_LEN + 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
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
    /// Every message is to the same mailbox (one run: the common case, found while the
    /// list is checked, so that `runs` need not walk it again).
    one_run: bool,
}

/// Whether every message of a checked body is to the same mailbox (cold paths; `read`
/// finds out while it checks).
fn one_mailbox(b: &[u8], count: u32) -> bool {
    let mut pos = 0;
    let mut first: Option<(usize, usize)> = None;
    for _ in 0..count {
        let Ok(s) = message_span(b, pos) else {
            return false;
        };
        match first {
            None => first = Some(s.to),
            Some(f) if !bytes_eq(&b[f.0..f.1], &b[s.to.0..s.to.1]) => return false,
            Some(_) => {}
        }
        pos = s.end;
    }
    true
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
        let one_run = one_mailbox(&body, count);
        MessageList {
            count,
            first_seq: 0,
            body: body.into(),
            one_run,
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
        let body = self.body.slice(pos..);
        let count = self.count - n;
        MessageList {
            count,
            first_seq: self.first_seq + n as u64,
            one_run: self.one_run || one_mailbox(&body, count),
            body,
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
        let mut prev: Option<MessageSpan> = None;
        let mut first_to = None;
        let mut one_run = true;
        // Where the last message's names (both length bytes and both names) began, and how
        // long they are: most messages of a list carry the same two names as the one
        // before, and then one comparison checks both (and `one_run` cannot change).
        let mut names = (0, 0);
        for _ in 0..count {
            if let Some(end) = same_names(&body, pos, names) {
                names.0 = pos;
                pos = end;
                continue;
            }
            let s = check_message(&body, pos, prev.as_ref())?;
            let f = *first_to.get_or_insert(s.to);
            one_run = one_run && bytes_eq(&body[f.0..f.1], &body[s.to.0..s.to.1]);
            names = (pos, s.from.1 - pos);
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
            one_run,
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

/// Where the message at `pos` of a message-list body ends, if its names are byte for byte
/// the `names.1` bytes at `names.0`, those of a message already checked before it (both
/// length bytes and both names: so they are valid, and the same), and its payload fits:
/// then it needs no other check. `None` sends it to [`check_message`], which also names
/// what is wrong, if anything is. (No names yet, `names.1` 0, never matches.)
#[inline]
fn same_names(b: &[u8], pos: usize, names: (usize, usize)) -> Option<usize> {
    let len_at = pos.checked_add(names.1)?;
    if names.1 == 0 || !bytes_eq(b.get(pos..len_at)?, &b[names.0..names.0 + names.1]) {
        return None;
    }
    payload_at(b, len_at).map(|p| p.1)
}

/// Where the payload whose 4-byte length is at `len_at` of `b` lies, if all of it is there
/// (the walks that need no error saying what is missing).
#[inline(always)]
fn payload_at(b: &[u8], len_at: usize) -> Option<(usize, usize)> {
    let l = b.get(len_at..len_at.checked_add(4)?)?;
    let start = len_at + 4;
    let end = start
        .checked_add(u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize)
        .filter(|e| *e <= b.len())?;
    Some((start, end))
}

/// Check the message at `pos` of a message-list body (lengths, and that both names are
/// UTF-8) and say where its parts are. A name is valid at once if it is ASCII (most are:
/// a word-at-a-time test), or if it has the same bytes as the previous message's (`prev`,
/// already checked); only other names get the full UTF-8 check.
pub fn check_message(
    b: &[u8],
    pos: usize,
    prev: Option<&MessageSpan>,
) -> Result<MessageSpan, DecodeError> {
    let s = message_span(b, pos)?;
    let valid = |x: (usize, usize), y: Option<(usize, usize)>| {
        let name = &b[x.0..x.1];
        name.is_ascii()
            || y.is_some_and(|y| name == &b[y.0..y.1])
            || std::str::from_utf8(name).is_ok()
    };
    if !valid(s.to, prev.map(|p| p.to)) {
        return Err(DecodeError::NotUtf8 {
            what: "destination mailbox",
        });
    }
    if !valid(s.from, prev.map(|p| p.from)) {
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
        let one_run = self.one_run;
        std::iter::from_fn(move || {
            if one_run {
                // One mailbox: the whole body at once, without walking it again.
                if left == 0 {
                    return None;
                }
                let n = std::mem::replace(&mut left, 0);
                let s = message_span(b, 0).ok()?;
                return Some((&b[s.to.0..s.to.1], 0..b.len(), n));
            }
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
#[inline(always)]
pub fn next_message(data: &mut Bytes) -> Option<(Name, Bytes, usize)> {
    // `message_span`'s walk without its errors: the bytes were checked when the list was
    // read, so only slicing's own bounds checks remain (a malformed run ends the walk).
    let b = &data[..];
    let from_at = 1 + *b.first()? as usize;
    let len_at = from_at + 1 + *b.get(from_at)? as usize;
    let (start, end) = payload_at(b, len_at)?;
    let from = Name::from_validated(data, from_at + 1..len_at);
    let payload = data.slice(start..end);
    bytes::Buf::advance(data, end);
    Some((from, payload, end))
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
