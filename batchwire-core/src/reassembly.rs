//! Reassembly of messages sent in pieces (FRAGMENT frames), per peer.
//!
//! Pieces arrive in sequence (the session has already dropped duplicates), each message's
//! in order, possibly interleaved with other traffic. A message's pieces go into one buffer
//! that grows as they come (never past the message's announced length, and never more than
//! [`LOOKAHEAD`] or the bytes received so far, whichever is more, ahead of the data: a
//! length a peer merely announced is not allocated); the whole payload is handed out,
//! without a copy, when the last piece is in.
//!
//! A piece after the first can be read **straight into that buffer** ([`Reassembly::direct_room`],
//! then [`Reassembly::add_direct`]): a reader that has a FRAGMENT frame's fields but not
//! yet its data ([`crate::frame::fragment_head`]) reads the data there instead of into its
//! receive buffer, so the payload is not copied on the way in. Bytes past what was received
//! are such a read in progress; every other change to the message drops them first. Memory is bounded: at most [`MAX_PARTIAL`] messages in pieces
//! per peer, each at most the node's `max_payload`, and every byte counts against the
//! destination mailbox's credit as it arrives.
//!
//! A message whose destination does not exist, or that is larger than this node accepts, is
//! followed to its end without keeping its data (the pieces still have to add up), then
//! reported undeliverable.
//!
//! Reassembly state survives connection breaks (the sender resends only pieces not
//! received). It is dropped for messages the sender gave up ([`Reassembly::discard_below`],
//! from RESUME's `keep`) and when the peer restarts ([`Reassembly::clear`]).

use bytes::Bytes;

use crate::codec::Name;
use crate::frame::{Fragment, FragmentHead, fragment_charge};
use crate::session::ConnId;

/// Most messages in pieces at once, per peer (a batchwire sender has one at a time).
pub const MAX_PARTIAL: usize = 4;

/// How far a message's buffer may grow ahead of its data, at least: with 64 KiB pieces a
/// message of up to 1 MiB gets its whole buffer with its first piece, so it is never
/// reallocated (and copied) as it grows.
pub const LOOKAHEAD: usize = 1 << 20;

/// Pieces that do not add up: a protocol violation (the connection is closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReassemblyError {
    #[error("protocol violation: more than {MAX_PARTIAL} messages in pieces at once")]
    TooMany,
    #[error("protocol violation: a piece of message {id}, which was never started")]
    Unknown { id: u64 },
    #[error(
        "protocol violation: a piece of message {id} at offset {got}, expected {expected} (or a different destination, sender or length)"
    )]
    OutOfOrder { id: u64, expected: u64, got: u64 },
    #[error("protocol violation: message {id} started twice")]
    Duplicate { id: u64 },
    /// Not the peer's doing: a newer connection to the peer took over the piece this one
    /// was reading in place (see [`Reassembly::direct_room`]).
    #[error("a piece of message {id} read in place was taken over by a newer connection")]
    TakenOver { id: u64 },
}

#[derive(Debug)]
struct Partial {
    id: u64,
    to: Name,
    from: Name,
    total: u64,
    received: u64,
    /// The data so far (empty if the message is not kept); past `received`, a direct read
    /// in progress, by the connection `direct_by`.
    buf: Vec<u8>,
    direct_by: Option<ConnId>,
    keep: bool,
    /// Credit charged so far.
    charged: u64,
}

impl Partial {
    /// A message starting with piece `f`, nothing of it received yet.
    fn start(f: &Fragment, keep: bool, direct_by: Option<ConnId>) -> Partial {
        Partial {
            id: f.id,
            to: f.to.detached(),
            from: f.from.detached(),
            total: f.total,
            received: 0,
            buf: Vec::new(),
            direct_by,
            keep,
            charged: 0,
        }
    }
}

/// What a piece did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// More pieces to come.
    Partial,
    /// The last piece: the whole message (its payload is empty if it was not kept), and
    /// what all its pieces charged.
    Complete {
        to: Name,
        from: Name,
        payload: Bytes,
        kept: bool,
        charged: u64,
    },
}

/// A message given up before its end: what it charged, and whether it was kept (charged
/// to its mailbox as held) or not (already given back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abandoned {
    pub to: Name,
    pub charged: u64,
    pub kept: bool,
}

/// The messages in pieces from one peer.
#[derive(Debug, Default)]
pub struct Reassembly {
    partial: Vec<Partial>,
    /// The peer's latest RESUME said it goes on with no message in pieces below this id:
    /// pieces of those that still arrive (resent from its window) are dropped.
    floor: u64,
}

impl Reassembly {
    /// Messages in pieces now.
    pub fn len(&self) -> usize {
        self.partial.len()
    }

    pub fn is_empty(&self) -> bool {
        self.partial.is_empty()
    }

    /// Bytes held in reassembly buffers.
    pub fn bytes(&self) -> usize {
        self.partial.iter().map(|p| p.buf.len()).sum()
    }

    /// Bytes the kept messages in pieces will hold when whole (their announced lengths):
    /// what a node-wide bound on reassembly memory counts.
    pub fn committed(&self) -> u64 {
        self.partial
            .iter()
            .filter(|p| p.keep)
            .map(|p| p.total)
            .sum()
    }

    /// Whether the message that piece `f` belongs to is being kept: for a first piece, the
    /// caller decides (`keep_new`: its mailbox exists and it is not too large).
    pub fn keeps(&self, f: &Fragment, keep_new: impl FnOnce() -> bool) -> bool {
        match self.partial.iter().find(|p| p.id == f.id) {
            Some(p) => p.keep,
            None => f.id >= self.floor && f.is_first() && keep_new(),
        }
    }

    /// Add a piece (not a duplicate: the session skipped those). `keep`: whether to keep
    /// the data, for a first piece (later pieces follow the first).
    pub fn add(&mut self, f: &Fragment, keep: bool) -> Result<Added, ReassemblyError> {
        self.add_piece(f, Data::Here(&f.data), keep)
    }

    /// Room for piece `h`'s data straight in its message's buffer, for a reader of
    /// connection `by`: the buffer and how many bytes of the piece are still to come, to be
    /// appended (at most that many). `read`: how many the caller appended already (0
    /// starts the read, dropping any other in progress). A first piece starts its message
    /// (uncommitted until [`Reassembly::add_direct`]) if `keep_new()` says it is kept.
    /// `None` if the piece cannot go there: a message in one piece, a message not kept,
    /// not the next piece of a message being reassembled, or no room for another message
    /// (the caller then reads the frame whole and [`Reassembly::add`] says what is wrong,
    /// if anything), or, with `read` above 0, the message changed meanwhile (another
    /// connection of the peer took over: the caller's is stale).
    pub fn direct_room(
        &mut self,
        h: &FragmentHead,
        read: usize,
        by: ConnId,
        keep_new: impl FnOnce() -> bool,
    ) -> Option<(&mut Vec<u8>, usize)> {
        let f = &h.piece;
        if read > h.data_len || (f.is_first() && h.is_last()) {
            return None;
        }
        let found = self.partial.iter().position(|p| p.id == f.id);
        let i = match found {
            None if f.is_first() && read == 0 => {
                if f.id < self.floor || self.partial.len() >= MAX_PARTIAL || !keep_new() {
                    return None;
                }
                self.partial.push(Partial::start(f, true, Some(by)));
                self.partial.len() - 1
            }
            None => return None,
            Some(i) => i,
        };
        let p = &mut self.partial[i];
        if !(p.keep
            && p.received == f.offset
            && p.total == f.total
            && p.to == f.to
            && p.from == f.from)
        {
            return None;
        }
        let start = p.received as usize;
        if read == 0 {
            // A newer connection's read is never taken over by an older one (a stale
            // connection still reading what the newer one was sent again).
            if p.direct_by.is_some_and(|other| other > by) {
                return None;
            }
            p.buf.truncate(start);
            p.direct_by = Some(by);
        } else if p.direct_by != Some(by) || p.buf.len() != start + read {
            return None;
        }
        grow(&mut p.buf, start + h.data_len, p.total);
        Some((&mut p.buf, h.data_len - read))
    }

    /// Connection `by` will not commit the piece it was reading in place into the message
    /// of `f` (it ended, or the session skipped or refused the piece): drop what it read,
    /// and the message's entry if its read started it (nothing of it is committed).
    pub fn drop_direct(&mut self, f: &Fragment, by: ConnId) {
        let Some(i) = self
            .partial
            .iter()
            .position(|p| p.id == f.id && p.direct_by == Some(by))
        else {
            return;
        };
        let p = &mut self.partial[i];
        if p.received == 0 {
            self.partial.swap_remove(i);
        } else {
            p.buf.truncate(p.received as usize);
            p.direct_by = None;
        }
    }

    /// Add piece `h`, whose data connection `by` read into its message's buffer
    /// ([`Reassembly::direct_room`]).
    pub fn add_direct(&mut self, h: &FragmentHead, by: ConnId) -> Result<Added, ReassemblyError> {
        self.add_piece(&h.piece, Data::InPlace(h.data_len, by), true)
    }

    fn add_piece(
        &mut self,
        f: &Fragment,
        data: Data,
        keep: bool,
    ) -> Result<Added, ReassemblyError> {
        let len = match data {
            Data::Here(b) => b.len(),
            Data::InPlace(n, _) => n,
        };
        let charge = fragment_charge(f.offset, len, &f.to, &f.from);
        let is_last = f.offset + len as u64 == f.total;
        if f.id < self.floor && !self.partial.iter().any(|p| p.id == f.id) {
            // A piece of a message the peer gave up: dropped (`keeps` said so).
            return Ok(Added::Partial);
        }
        let started = self.partial.iter().position(|p| p.id == f.id);
        let i = if let Some(i) = started.filter(|_| f.is_first()) {
            // Only a start read in place and not committed (nothing received) may be
            // there: this piece is that start, read in place or come again whole.
            let p = &self.partial[i];
            if p.received != 0 || p.total != f.total || p.to != f.to || p.from != f.from {
                return Err(ReassemblyError::Duplicate { id: f.id });
            }
            i
        } else if f.is_first() {
            if let Data::InPlace(..) = data {
                return Err(ReassemblyError::Unknown { id: f.id });
            }
            if is_last {
                let payload = match data {
                    Data::Here(b) if keep => b.clone(),
                    _ => Bytes::new(),
                };
                return Ok(Added::Complete {
                    to: f.to.clone(),
                    from: f.from.clone(),
                    payload,
                    kept: keep,
                    charged: charge,
                });
            }
            if self.partial.len() >= MAX_PARTIAL {
                return Err(ReassemblyError::TooMany);
            }
            self.partial.push(Partial::start(f, keep, None));
            self.partial.len() - 1
        } else {
            let Some(i) = started else {
                return Err(ReassemblyError::Unknown { id: f.id });
            };
            let p = &self.partial[i];
            if p.received != f.offset || p.total != f.total || p.to != f.to || p.from != f.from {
                return Err(ReassemblyError::OutOfOrder {
                    id: f.id,
                    expected: p.received,
                    got: f.offset,
                });
            }
            i
        };
        let p = &mut self.partial[i];
        let start = p.received as usize;
        match data {
            Data::Here(b) => {
                // A direct read that did not finish (its connection ended) is dropped.
                p.buf.truncate(start);
                p.direct_by = None;
                if p.keep {
                    grow(&mut p.buf, start + b.len(), p.total);
                    p.buf.extend_from_slice(b);
                }
            }
            Data::InPlace(n, by) => {
                if p.direct_by != Some(by) {
                    // Another connection's read (or none): left as it is.
                    return Err(ReassemblyError::TakenOver { id: f.id });
                }
                p.direct_by = None;
                if !p.keep || p.buf.len() != start + n {
                    // Not what `direct_room` handed out: the caller's mistake, not the
                    // peer's; nothing is committed.
                    p.buf.truncate(start);
                    return Err(ReassemblyError::OutOfOrder {
                        id: f.id,
                        expected: p.received,
                        got: f.offset,
                    });
                }
            }
        }
        p.received += len as u64;
        p.charged += charge;
        if !is_last {
            return Ok(Added::Partial);
        }
        let p = self.partial.swap_remove(i);
        Ok(Added::Complete {
            to: p.to,
            from: p.from,
            payload: Bytes::from(p.buf),
            kept: p.keep,
            charged: p.charged,
        })
    }

    /// The sender goes on with no message whose first piece is below `keep`: drop those.
    pub fn discard_below(&mut self, keep: u64) -> Vec<Abandoned> {
        self.floor = self.floor.max(keep);
        let mut out = Vec::new();
        self.partial.retain(|p| {
            if p.id < keep {
                out.push(Abandoned {
                    to: p.to.clone(),
                    charged: p.charged,
                    kept: p.keep,
                });
                false
            } else {
                true
            }
        });
        out
    }

    /// The peer restarted: nothing it had in pieces will continue.
    pub fn clear(&mut self) -> Vec<Abandoned> {
        let out = self.discard_below(u64::MAX);
        // A new incarnation numbers from 0 again.
        self.floor = 0;
        out
    }
}

/// A piece's data: in the frame read, or already in its message's buffer.
#[derive(Clone, Copy)]
enum Data<'a> {
    Here(&'a Bytes),
    /// This many bytes, read by this connection.
    InPlace(usize, ConnId),
}

/// Make room in a message's buffer for `need` bytes (at most `total`): doubling, and at
/// least [`LOOKAHEAD`] ahead, never past the message's length.
fn grow(buf: &mut Vec<u8>, need: usize, total: u64) {
    if need <= buf.capacity() {
        return;
    }
    let total = usize::try_from(total).unwrap_or(usize::MAX);
    let want = (buf.capacity() * 2)
        .max(need.saturating_add(LOOKAHEAD))
        .min(total)
        .max(need);
    buf.reserve_exact(want - buf.len());
}

#[cfg(test)]
mod tests;
