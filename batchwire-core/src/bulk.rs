//! The bulk lane's queue: messages sent in pieces (FRAGMENT frames), after the ordinary
//! messages and interleaved with them, never copied on the way out.
//!
//! A message goes here if it is larger than the fragment size, if it was sent with the bulk
//! class, or if an earlier message of the same (sending mailbox, destination mailbox) pair
//! is still here: so a pair's messages keep their order whatever their classes. A message
//! keeps the caller's `Bytes`; its pieces are slices of it.
//!
//! Scheduling (the caller, a peer's writer, runs it each round, after the ordinary batch):
//! - the head item's next piece is offered ([`BulkQueue::peek`]) only once every ordinary
//!   message queued before the item was taken for writing (its `mark`), so a bulk message
//!   never overtakes an ordinary one of the same pair;
//! - the session numbers it ([`crate::session::Session::hold_piece`]), and then the item
//!   moves on ([`BulkQueue::advance`]), or starts again from its first piece if the peer
//!   restarted meanwhile ([`BulkQueue::restart`]);
//! - pieces go out while the session has bulk room (a budget of unacknowledged bulk bytes of
//!   its own, beside the ordinary window), so ordinary messages and control frames never sit
//!   behind more than that much bulk data;
//! - while a piece is ready, a round takes at most [`ORDINARY_WEIGHT`] pieces' worth of
//!   ordinary bytes before it: weighted round robin, so under any flood of ordinary messages
//!   a piece never waits behind more than that (and the ordinary window) to be written.
//!
//! One message is in pieces at a time; the receiver reassembles it ([`crate::reassembly`]).

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::codec::Name;
use crate::frame::{Message, fragment_charge, message_len};

/// While a piece is ready, the ordinary bytes a writer round takes before it, in pieces'
/// worth.
pub const ORDINARY_WEIGHT: usize = 4;

/// A piece offered for writing: what the session needs to number it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Which item it is from (pass back to `advance` / `restart` / `unreserve`).
    pub serial: u64,
    pub to: Name,
    pub from: Name,
    /// The whole message's payload; the piece is `payload[offset..offset + len]`.
    pub payload: Bytes,
    pub offset: usize,
    pub len: usize,
    /// The message's id (its first piece's sequence number) if a piece of it was numbered.
    pub id: Option<u64>,
}

impl Piece {
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
    pub fn is_last(&self) -> bool {
        self.offset + self.len == self.payload.len()
    }
    /// The piece's data.
    pub fn data(&self) -> Bytes {
        self.payload.slice(self.offset..self.offset + self.len)
    }
    /// Its credit charge.
    pub fn charge(&self) -> u64 {
        fragment_charge(self.offset as u64, self.len, &self.to, &self.from)
    }
}

#[derive(Debug)]
struct Item {
    serial: u64,
    to: Name,
    from: Name,
    payload: Bytes,
    /// Ordinary bytes queued before this item: it waits until that many were taken.
    mark: u64,
    offset: usize,
    id: Option<u64>,
    /// Length of the piece offered and not yet advanced past (0: none).
    reserved: usize,
}

/// Messages waiting to go in pieces, oldest first.
#[derive(Debug, Default)]
pub struct BulkQueue {
    items: VecDeque<Item>,
    /// Payload bytes not yet offered (the lane's bound).
    bytes: usize,
    /// Items per (destination, sender) pair.
    pairs: HashMap<(Name, Name), u32>,
    serial: u64,
}

impl BulkQueue {
    /// Payload bytes waiting (not yet numbered).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether a message of the pair (to, from) is waiting here.
    pub fn has_pair(&self, to: &Name, from: &Name) -> bool {
        !self.pairs.is_empty() && self.pairs.contains_key(&(to.clone(), from.clone()))
    }

    /// Queue a message; `mark` is how many ordinary bytes were queued before it.
    pub fn push(&mut self, to: &Name, from: &Name, payload: Bytes, mark: u64) {
        self.serial += 1;
        self.bytes += payload.len();
        *self.pairs.entry((to.clone(), from.clone())).or_default() += 1;
        self.items.push_back(Item {
            serial: self.serial,
            to: to.clone(),
            from: from.clone(),
            payload,
            mark,
            offset: 0,
            id: None,
            reserved: 0,
        });
    }

    /// Whether the head has a piece to offer once `ordinary_taken` ordinary bytes were taken.
    pub fn ready(&self, ordinary_taken: u64) -> bool {
        self.items
            .front()
            .is_some_and(|i| i.reserved == 0 && ordinary_taken >= i.mark)
    }

    /// Offer the head's next piece of at most `piece_bytes`, if it is [`BulkQueue::ready`].
    /// It stays reserved (offered once) until `advance`, `restart` or `unreserve`.
    pub fn peek(&mut self, piece_bytes: usize, ordinary_taken: u64) -> Option<Piece> {
        if !self.ready(ordinary_taken) {
            return None;
        }
        let i = self.items.front_mut()?;
        let len = (i.payload.len() - i.offset).min(piece_bytes.max(1));
        i.reserved = len;
        self.bytes -= len;
        Some(Piece {
            serial: i.serial,
            to: i.to.clone(),
            from: i.from.clone(),
            payload: i.payload.clone(),
            offset: i.offset,
            len,
            id: i.id,
        })
    }

    fn head(&mut self, serial: u64) -> Option<&mut Item> {
        self.items.front_mut().filter(|i| i.serial == serial)
    }

    /// The piece offered from item `serial` was numbered; the message's id is `id`. Returns
    /// whether that was its last piece (the message leaves the queue).
    pub fn advance(&mut self, serial: u64, id: u64) -> bool {
        let Some(i) = self.head(serial) else {
            return false;
        };
        i.offset += i.reserved;
        i.reserved = 0;
        i.id = Some(id);
        if i.offset < i.payload.len() {
            return false;
        }
        self.pop_head();
        true
    }

    /// The offered piece was not numbered (the peer is down, or the node is stopping): it
    /// will be offered again. Returns false if the item is gone (taken by `take_failed`
    /// while its last piece was on its way): the caller hands the message back itself.
    pub fn unreserve(&mut self, serial: u64) -> bool {
        let Some(i) = self.head(serial) else {
            return false;
        };
        let r = std::mem::take(&mut i.reserved);
        self.bytes += r;
        true
    }

    /// The peer restarted while item `serial` was in pieces: send it again from its first
    /// piece (the new incarnation has none of it).
    pub fn restart(&mut self, serial: u64) {
        if let Some(i) = self.head(serial) {
            let back = i.offset + std::mem::take(&mut i.reserved);
            i.offset = 0;
            i.id = None;
            self.bytes += back;
        }
    }

    fn pop_head(&mut self) {
        if let Some(i) = self.items.pop_front() {
            let key = (i.to, i.from);
            if let Some(c) = self.pairs.get_mut(&key) {
                *c -= 1;
                if *c == 0 {
                    self.pairs.remove(&key);
                }
            }
        }
    }

    /// Everything waiting, as whole messages (to report them failed); the queue is empty
    /// after. A message already partly numbered is among them (it was not delivered), and
    /// the second value says there was one. A message whose last piece is on its way into
    /// the send window (offered, not yet advanced or unreserved) is left out: its fate is
    /// the caller's (see [`BulkQueue::unreserve`]).
    pub fn take_failed(&mut self) -> (Vec<Message>, bool) {
        self.bytes = 0;
        self.pairs.clear();
        let mut in_pieces = false;
        let msgs = self
            .items
            .drain(..)
            .filter(|i| {
                in_pieces |= i.id.is_some();
                i.reserved == 0 || i.offset + i.reserved < i.payload.len()
            })
            .map(|i| Message {
                to: i.to,
                from: i.from,
                payload: i.payload,
            })
            .collect();
        (msgs, in_pieces)
    }

    /// Call `f(mailbox, bytes)` with what each waiting item still charges (its pieces not
    /// yet numbered, the offered one left out: it is on its way into the send window).
    pub fn charges(&self, mut f: impl FnMut(&Name, u64)) {
        for i in &self.items {
            let whole = message_len(&i.to, &i.from, i.payload.len()) as u64;
            let done = if i.offset == 0 && i.reserved == 0 {
                0
            } else {
                let upto = (i.offset + i.reserved) as u64;
                fragment_charge(0, 0, &i.to, &i.from) + upto
            };
            if whole > done {
                f(&i.to, whole - done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::new(s).unwrap()
    }

    /// What the queue holds: items and payload bytes, as pushed and taken.
    #[test]
    fn it_counts_items_and_bytes() {
        let mut q = BulkQueue::default();
        assert!(q.is_empty());
        assert_eq!((q.len(), q.bytes()), (0, 0));
        q.push(&n("to"), &n("from"), Bytes::from(vec![0u8; 300]), 0);
        q.push(&n("to"), &n("from"), Bytes::from(vec![0u8; 500]), 0);
        assert!(!q.is_empty());
        assert_eq!((q.len(), q.bytes()), (2, 800));
    }

    #[test]
    fn pieces_cover_the_message_in_order_and_charge_it_exactly() {
        let mut q = BulkQueue::default();
        let payload = Bytes::from((0..250u8).collect::<Vec<_>>());
        q.push(&n("m"), &n("s"), payload.clone(), 0);
        let mut got = Vec::new();
        let mut charged = 0;
        let mut id = None;
        while let Some(p) = q.peek(100, 0) {
            assert_eq!(p.id, id);
            charged += p.charge();
            got.extend_from_slice(&p.data());
            let last = p.is_last();
            assert_eq!(q.advance(p.serial, 7), last);
            id = Some(7);
        }
        assert_eq!(got, payload);
        assert_eq!(charged as usize, message_len(&n("m"), &n("s"), 250));
        assert!(q.is_empty() && q.bytes() == 0 && !q.has_pair(&n("m"), &n("s")));
    }

    #[test]
    fn an_item_waits_for_the_ordinary_messages_queued_before_it() {
        let mut q = BulkQueue::default();
        q.push(&n("m"), &n("s"), Bytes::from_static(b"abc"), 500);
        assert!(q.peek(10, 499).is_none());
        assert!(q.peek(10, 500).is_some());
    }

    #[test]
    fn an_offered_piece_is_offered_once_until_unreserved() {
        let mut q = BulkQueue::default();
        q.push(&n("m"), &n("s"), Bytes::from(vec![1; 30]), 0);
        let p = q.peek(10, 0).unwrap();
        assert!(q.peek(10, 0).is_none(), "reserved");
        assert_eq!(q.bytes(), 20);
        q.unreserve(p.serial);
        assert_eq!(q.peek(10, 0).unwrap().offset, 0);
    }

    #[test]
    fn a_restart_sends_the_message_again_from_its_first_piece() {
        let mut q = BulkQueue::default();
        q.push(&n("m"), &n("s"), Bytes::from(vec![1; 30]), 0);
        let p = q.peek(10, 0).unwrap();
        q.advance(p.serial, 4);
        let p = q.peek(10, 0).unwrap();
        assert_eq!((p.offset, p.id), (10, Some(4)));
        q.restart(p.serial);
        let p = q.peek(10, 0).unwrap();
        assert_eq!((p.offset, p.id), (0, None));
        assert_eq!(q.bytes(), 20);
    }

    #[test]
    fn charges_count_what_is_not_yet_numbered() {
        let (to, from) = (n("m"), n("s"));
        let mut q = BulkQueue::default();
        q.push(&to, &from, Bytes::from(vec![1; 30]), 0);
        let whole = message_len(&to, &from, 30) as u64;
        let sum = |q: &BulkQueue| {
            let mut s = 0;
            q.charges(|_, b| s += b);
            s
        };
        assert_eq!(sum(&q), whole);
        let p = q.peek(10, 0).unwrap();
        assert_eq!(
            sum(&q),
            whole - p.charge(),
            "the offered piece is on its way"
        );
        q.advance(p.serial, 1);
        let p2 = q.peek(10, 0).unwrap();
        assert_eq!(sum(&q), whole - p.charge() - p2.charge());
        let (failed, in_pieces) = q.take_failed();
        assert_eq!((failed.len(), in_pieces), (1, true));
        assert_eq!(sum(&q), 0);
    }

    #[test]
    fn failed_messages_are_whole_and_one_whose_last_piece_is_on_its_way_is_left_out() {
        let mut q = BulkQueue::default();
        q.push(&n("m"), &n("s"), Bytes::from(vec![1; 30]), 0);
        q.push(&n("m"), &n("s"), Bytes::from(vec![2; 5]), 0);
        let p = q.peek(10, 0).unwrap();
        q.advance(p.serial, 3);
        let p = q.peek(10, 0).unwrap();
        let (msgs, in_pieces) = q.take_failed();
        assert!(in_pieces);
        assert_eq!(
            msgs.len(),
            2,
            "the first is in pieces, its next one is not the last"
        );
        assert_eq!(msgs[0].payload.len(), 30);
        assert!(!q.unreserve(p.serial), "gone");
        assert!(q.is_empty() && q.bytes() == 0);
    }

    #[test]
    fn an_empty_bulk_message_is_one_empty_piece() {
        let mut q = BulkQueue::default();
        q.push(&n("m"), &n("s"), Bytes::new(), 0);
        let p = q.peek(10, 0).unwrap();
        assert!(p.is_first() && p.is_last() && p.len == 0);
        assert!(q.advance(p.serial, 0));
        assert!(q.is_empty());
    }
}
