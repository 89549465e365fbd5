//! Reassembly of messages sent in pieces (FRAGMENT frames), per peer.
//!
//! Pieces arrive in sequence (the session has already dropped duplicates), each message's
//! in order, possibly interleaved with other traffic. A message's pieces are copied into one
//! buffer that grows as they come (never more than the message's announced length, and never
//! allocated ahead for a length a peer merely announced); the whole payload is handed out
//! when the last piece is in. Memory is bounded: at most [`MAX_PARTIAL`] messages in pieces
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
use crate::frame::Fragment;

/// Most messages in pieces at once, per peer (a batchwire sender has one at a time).
pub const MAX_PARTIAL: usize = 4;

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
}

#[derive(Debug)]
struct Partial {
    id: u64,
    to: Name,
    from: Name,
    total: u64,
    received: u64,
    /// The data so far (empty if the message is not kept).
    buf: Vec<u8>,
    keep: bool,
    /// Credit charged so far.
    charged: u64,
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
        let charge = f.charge();
        if f.id < self.floor && !self.partial.iter().any(|p| p.id == f.id) {
            // A piece of a message the peer gave up: dropped (`keeps` said so).
            return Ok(Added::Partial);
        }
        let i = if f.is_first() {
            if self.partial.iter().any(|p| p.id == f.id) {
                return Err(ReassemblyError::Duplicate { id: f.id });
            }
            if f.is_last() {
                return Ok(Added::Complete {
                    to: f.to.clone(),
                    from: f.from.clone(),
                    payload: if keep { f.data.clone() } else { Bytes::new() },
                    kept: keep,
                    charged: charge,
                });
            }
            if self.partial.len() >= MAX_PARTIAL {
                return Err(ReassemblyError::TooMany);
            }
            self.partial.push(Partial {
                id: f.id,
                to: f.to.detached(),
                from: f.from.detached(),
                total: f.total,
                received: 0,
                buf: Vec::new(),
                keep,
                charged: 0,
            });
            self.partial.len() - 1
        } else {
            let Some(i) = self.partial.iter().position(|p| p.id == f.id) else {
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
        if p.keep {
            // Grow with what arrived (doubling, capped at the message's length): never ahead
            // of the data for a length a peer only announced.
            let need = p.buf.len() + f.data.len();
            if need > p.buf.capacity() {
                let want = (p.buf.capacity() * 2).max(need).min(p.total as usize);
                p.buf.reserve_exact(want - p.buf.len());
            }
            p.buf.extend_from_slice(&f.data);
        }
        p.received += f.data.len() as u64;
        p.charged += charge;
        if !f.is_last() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::message_len;

    fn n(s: &str) -> Name {
        Name::new(s).unwrap()
    }

    /// The pieces of a `total`-byte message with id `id`, `size` bytes each.
    fn pieces(id: u64, total: usize, size: usize) -> Vec<Fragment> {
        let data: Vec<u8> = (0..total).map(|i| i as u8).collect();
        let data = Bytes::from(data);
        (0..total.div_ceil(size).max(1))
            .map(|k| {
                let off = k * size;
                let end = (off + size).min(total);
                Fragment {
                    seq: id + k as u64,
                    id,
                    total: total as u64,
                    offset: off as u64,
                    to: n("inbox"),
                    from: n("big"),
                    data: data.slice(off..end),
                }
            })
            .collect()
    }

    #[test]
    fn pieces_make_the_message_and_charge_it_once() {
        let mut r = Reassembly::default();
        let ps = pieces(10, 1000, 300);
        for p in &ps[..3] {
            assert_eq!(r.add(p, true).unwrap(), Added::Partial);
        }
        assert_eq!(r.bytes(), 900);
        let Added::Complete {
            payload, charged, ..
        } = r.add(&ps[3], true).unwrap()
        else {
            panic!()
        };
        assert_eq!(payload.len(), 1000);
        assert!(payload.iter().enumerate().all(|(i, b)| *b == i as u8));
        assert_eq!(charged as usize, message_len(&n("inbox"), &n("big"), 1000));
        assert!(r.is_empty());
    }

    #[test]
    fn interleaved_messages_reassemble_apart_up_to_the_bound() {
        let mut r = Reassembly::default();
        let a = pieces(0, 20, 10);
        let b = pieces(100, 20, 10);
        r.add(&a[0], true).unwrap();
        r.add(&b[0], true).unwrap();
        assert!(matches!(
            r.add(&a[1], true).unwrap(),
            Added::Complete { .. }
        ));
        assert!(matches!(
            r.add(&b[1], true).unwrap(),
            Added::Complete { .. }
        ));
        for k in 0..MAX_PARTIAL as u64 {
            r.add(&pieces(1000 + 10 * k, 20, 10)[0], true).unwrap();
        }
        assert_eq!(
            r.add(&pieces(5000, 20, 10)[0], true),
            Err(ReassemblyError::TooMany)
        );
    }

    #[test]
    fn pieces_that_do_not_follow_on_are_violations() {
        let mut r = Reassembly::default();
        let ps = pieces(0, 30, 10);
        assert_eq!(r.add(&ps[1], true), Err(ReassemblyError::Unknown { id: 0 }));
        r.add(&ps[0], true).unwrap();
        assert!(matches!(
            r.add(&ps[2], true),
            Err(ReassemblyError::OutOfOrder { .. })
        ));
        assert_eq!(
            r.add(&ps[0], true),
            Err(ReassemblyError::Duplicate { id: 0 })
        );
        let mut other = ps[1].clone();
        other.to = n("elsewhere");
        assert!(r.add(&other, true).is_err());
    }

    #[test]
    fn a_message_not_kept_is_followed_without_its_data() {
        let mut r = Reassembly::default();
        let ps = pieces(0, 30, 10);
        assert!(!r.keeps(&ps[0], || false));
        r.add(&ps[0], false).unwrap();
        assert!(!r.keeps(&ps[1], || true), "later pieces follow the first");
        r.add(&ps[1], false).unwrap();
        assert_eq!(r.bytes(), 0);
        let Added::Complete { payload, kept, .. } = r.add(&ps[2], false).unwrap() else {
            panic!()
        };
        assert!(payload.is_empty() && !kept);
    }

    #[test]
    fn given_up_messages_are_dropped_with_what_they_charged() {
        let mut r = Reassembly::default();
        r.add(&pieces(5, 30, 10)[0], true).unwrap();
        r.add(&pieces(9, 30, 10)[0], false).unwrap();
        assert!(r.discard_below(5).is_empty());
        let gone = r.discard_below(9);
        assert_eq!(gone.len(), 1);
        assert!(gone[0].kept && gone[0].charged > 10);
        assert_eq!(r.clear().len(), 1);
        assert!(r.is_empty());
    }

    #[test]
    fn a_buffer_never_grows_past_the_announced_length_or_ahead_of_the_data() {
        let mut r = Reassembly::default();
        let mut first = pieces(0, 100, 10)[0].clone();
        first.total = 1 << 40;
        r.add(&first, true).unwrap();
        assert!(r.partial[0].buf.capacity() < 1 << 20);
        let mut r = Reassembly::default();
        for p in pieces(0, 1000, 7) {
            r.add(&p, true).unwrap();
            if let Some(p) = r.partial.first() {
                assert!(p.buf.capacity() <= 1000);
            }
        }
    }

    #[test]
    fn pieces_of_a_message_given_up_are_dropped_until_a_restart() {
        let mut r = Reassembly::default();
        let ps = pieces(10, 300, 100);
        assert_eq!(r.add(&ps[0], true).unwrap(), Added::Partial);
        // The peer goes on without message 10: what we have is dropped, and so are its
        // pieces that were still on their way (resent from its window), first or not.
        let gone = r.discard_below(20);
        assert_eq!(gone.len(), 1);
        assert!(!r.keeps(&ps[1], || true));
        assert_eq!(r.add(&ps[1], false).unwrap(), Added::Partial);
        assert!(!r.keeps(&ps[0], || true), "not started again");
        assert_eq!(r.add(&ps[0], false).unwrap(), Added::Partial);
        assert!(r.is_empty());
        // A RESUME with a lower keep does not lower the floor.
        r.discard_below(5);
        assert!(!r.keeps(&ps[0], || true));
        // A new incarnation numbers from 0: its message 10 is a new one.
        r.clear();
        assert!(r.keeps(&ps[0], || true));
        for p in &ps[..2] {
            assert_eq!(r.add(p, true).unwrap(), Added::Partial);
        }
        assert!(matches!(
            r.add(&ps[2], true).unwrap(),
            Added::Complete { kept: true, .. }
        ));
    }
}
