//! A connection's reader: frames off the socket into the session and the mailboxes.
//!
//! Messages are delivered a run at a time (consecutive messages for one mailbox: one lock,
//! at most one wake-up), and **never wait for a consumer**: each is charged to its
//! mailbox's credit for this peer (see `batchwire_core::credit`), which the sender
//! respected, so it fits. A peer that sends past its credit broke the protocol. Pieces of
//! large messages are reassembled (each charged as it arrives) and delivered whole.
//!
//! The reader also applies what the peer says about credit toward *its* mailboxes: CREDIT
//! grants and SYNC recounts go to this peer's lane, where senders wait for them. And it
//! takes this side's SYNC snapshots: when the connection starts (so the first thing the
//! writer sends is where credit stands) and whenever the accounts ask for one, always
//! between two frames with the delivery turn, so that the snapshot covers exactly the
//! messages below its sequence number. What was delivered is committed to the session;
//! the rest comes again on the next connection and is delivered then, exactly once.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use batchwire_core::call;
use batchwire_core::codec::{Name, NameMap};
use batchwire_core::frame::{self, Fragment, Frame, MessageList, Sync};
use batchwire_core::handshake::HandshakeError;
use batchwire_core::reassembly::Added;
use bytes::{Bytes, BytesMut};
use tracing::warn;

use crate::address::Address;
use crate::error::Error;
use crate::event::Event;
use crate::io::conn::{Conn, LinkError};
use crate::io::events::Events;
use crate::io::flow::Held;
use crate::io::lane::Lane;
use crate::io::mailbox::{Envelope, MailboxQueue, Mailboxes};
use crate::io::members::Members;
use crate::io::peer::Peer;

/// What a reader uses.
pub(crate) struct Reader<'a> {
    pub peer: &'a Peer,
    pub conn: &'a Conn,
    pub mailboxes: &'a Mailboxes,
    pub events: &'a Events,
    /// With transfer-queue: the shared lane (part of a SYNC recount).
    pub shared: Option<&'a Lane>,
    pub max_frame: usize,
    pub max_payload: u64,
    pub read_bytes: usize,
    pub members: Option<&'a Members>,
}

impl Reader<'_> {
    /// Read frames and act on them until the peer says goodbye (`Ok`) or something breaks.
    pub fn run(&self, buf: BytesMut) -> Result<(), LinkError> {
        // Where credit stands, as of what was delivered before this connection: the first
        // thing this side says on it (after RESUME).
        self.snapshot();
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut drained = false;
        let mut ring = RecvRing::new(buf, self.read_bytes);
        loop {
            let buf = ring.buf();
            while let Some(frame) = frame::decode(buf, self.max_frame)? {
                self.peer.stats.frames_received.fetch_add(1, Relaxed);
                if self.handle(frame, &mut cache)? {
                    return Ok(());
                }
            }
            // The last read took all there was: about to wait, so acknowledge now if a
            // sender may be waiting for it (the session decides).
            if drained {
                self.peer.session(|s, _| s.handle_idle(self.conn.id));
            }
            let n = read_more(&self.conn.link, ring.room(), self.read_bytes)?;
            if n == 0 {
                return Err(LinkError::Eof);
            }
            drained = n < self.read_bytes;
            self.peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
            self.peer
                .session(|s, now| s.handle_heard(now, self.conn.id));
        }
    }

    /// Take a SYNC snapshot between two deliveries.
    fn snapshot(&self) {
        let _turn = self.peer.delivery_turn();
        self.take_snapshot();
    }

    /// After a delivery (with the turn): a snapshot if the accounts asked for one.
    fn snapshot_if_asked(&self) {
        if self.peer.flow.wants_sync() {
            self.take_snapshot();
        }
    }

    /// The snapshot, as of what the session received, in the same session turn (see
    /// `Flow::snapshot`).
    fn take_snapshot(&self) {
        let peer = self.peer;
        peer.session(|s, _| peer.flow.snapshot(s.recv_next()));
        peer.flow.wake_writer();
    }

    /// Act on one frame. Returns true on GOODBYE.
    fn handle(
        &self,
        frame: Frame,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<bool, LinkError> {
        let (peer, id) = (self.peer, self.conn.id);
        match frame {
            Frame::Messages(list) => self.deliver(list, cache)?,
            Frame::Fragment(f) => self.piece(f)?,
            Frame::Ack(next) => {
                let acked = peer.session(|s, now| s.handle_ack(now, id, next))?;
                peer.stats.acked.fetch_add(acked, Relaxed);
            }
            Frame::Credit(c) => {
                // Grants written on a connection that was replaced are stale: the SYNC on
                // its successor recounts them.
                if peer.session(|s, _| s.current() == Some(id)) {
                    peer.lane.grant(&c.grants);
                }
            }
            Frame::Sync(sy) => self.recount(sy),
            Frame::Undeliverable(u) => {
                peer.stats
                    .undeliverable_reported
                    .fetch_add(u.count as u64, Relaxed);
                warn!(peer = %peer.name, mailbox = %u.to, from = %u.from, count = u.count, "peer reports messages undeliverable: no such mailbox, or too large (\"\" sums more names than it reports one by one)");
                // A request that found no mailbox fails now, not at its timeout.
                if let Some((id, _)) = call::parse(u.from.as_bytes()) {
                    let to = format!("{}@{}", u.to, peer.name);
                    peer.calls()
                        .fail_from(id, &peer.name, Error::Undeliverable { to });
                }
                self.events.emit(Event::Undeliverable {
                    to: Address {
                        node: peer.name.clone(),
                        mailbox: u.to,
                    },
                    from: u.from.to_string(),
                    count: u.count as u64,
                });
            }
            // Membership packets go to the membership thread, which checks them (the
            // sender named inside must be this peer); without membership they are ignored.
            Frame::Member(body) => {
                if let Some(m) = self.members {
                    m.frame(&peer.name, body);
                }
            }
            Frame::Goodbye => {
                peer.session(|s, now| s.handle_goodbye(now, id));
                return Ok(true);
            }
            Frame::Refuse(r) => {
                return Err(HandshakeError::Refused {
                    peer: Some(peer.name.clone()),
                    code: r.code,
                    reason: r.reason,
                }
                .into());
            }
            other @ (Frame::Hello(_) | Frame::Auth(_) | Frame::Resume(_)) => {
                return Err(LinkError::Unexpected(other.kind_name()));
            }
        }
        Ok(false)
    }

    /// The peer's SYNC: recount each of its mailboxes' charges as held there, plus what
    /// this node has in flight from the SYNC's `next` on, plus what is still queued (the
    /// window, then the lane, counted again if the writer moved anything between them).
    fn recount(&self, sy: Sync) {
        let peer = self.peer;
        let mut held: NameMap<u64> = NameMap::default();
        for (name, b) in &sy.held {
            let e = held.entry(name.detached()).or_default();
            *e = e.saturating_add(*b);
        }
        if let Some(shared) = self.shared {
            shared.charges_for(peer.id, &mut held);
        }
        // The window's part and the lane's part must not miss (or count twice) a message
        // the writer moves from one to the other meanwhile: count again if it did. A move
        // takes microseconds; after many tries the recount goes ahead (off by one batch at
        // most, which the flow-control limit's slack absorbs and the next SYNC corrects).
        for tries in 0.. {
            let moves = peer.lane.moves();
            if moves % 2 == 1 && tries < 1000 {
                std::thread::yield_now();
                continue;
            }
            let mut totals = held.clone();
            peer.session(|s, _| {
                s.charges_from(sy.next, |to, b| {
                    let e = totals.entry(to.clone()).or_default();
                    *e = e.saturating_add(b);
                })
            });
            let check = (tries < 1000).then_some(moves);
            if peer
                .lane
                .sync_credit(check, peer.id, sy.window, sy.max_payload, &mut totals)
            {
                return;
            }
        }
    }

    /// Deliver a frame's messages, in runs, and commit how far it got.
    fn deliver(
        &self,
        list: MessageList,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<(), LinkError> {
        let (peer, conn) = (self.peer, self.conn);
        let _turn = peer.delivery_turn();
        let Some(d) =
            peer.session(|s, _| s.begin_delivery(conn.id, list.first_seq, list.len() as u32))?
        else {
            // Replaced: its successor resends from where the session stands.
            return Err(LinkError::Replaced);
        };
        let list = if d.skip == 0 { list } else { list.skip(d.skip) };
        peer.stats
            .messages_received
            .fetch_add(list.len() as u64, Relaxed);
        let (mut upto, mut bytes) = (d.first + d.skip as u64, 0usize);
        let mut result = Ok(());
        for (to, range, count) in list.runs() {
            if call::is_reply_inbox(to) {
                let data = list.body().slice(range);
                let len = data.len();
                if let Err(e) = self.replies(data) {
                    result = Err(e);
                    break;
                }
                upto += count as u64;
                bytes += len;
                continue;
            }
            if cache.as_ref().is_none_or(|mb| mb.name.as_bytes() != to) {
                *cache = self.mailboxes.get(to);
            }
            let data = list.body().slice(range);
            let len = data.len();
            match cache.as_ref() {
                Some(mb) => {
                    // Past its credit: a violation, and nothing of this run is delivered.
                    if let Err(e) = peer.flow.charge(&mb.name, len as u64) {
                        result = Err(e.into());
                        break;
                    }
                    let held = Held::new(peer.flow.clone(), mb.name.clone(), len as u64);
                    if mb.push_run(&peer.name, data.clone(), count, held).is_err() {
                        // Dropped meanwhile (its credit went back with the refused run).
                        *cache = None;
                        self.undeliverable(to, data, false);
                    }
                }
                // No such mailbox: counted, reported, and its credit given back.
                None => self.undeliverable(to, data, true),
            }
            upto += count as u64;
            bytes += len;
        }
        peer.session(|s, now| s.end_delivery(now, d, upto, bytes));
        self.snapshot_if_asked();
        result
    }

    /// A run of replies to this node's requests: each completes its call (if still
    /// waiting) at once, one table lock for the run, and its credit goes straight back.
    fn replies(&self, mut data: Bytes) -> Result<(), LinkError> {
        let peer = self.peer;
        let inbox = Name::from_static(call::REPLY_INBOX);
        let len = data.len() as u64;
        peer.flow.charge(&inbox, len)?;
        let run = std::iter::from_fn(|| frame::next_message(&mut data).map(|(f, p, _)| (f, p)));
        peer.calls().replies_from_wire(&peer.name, run);
        peer.flow.release(inbox.as_bytes(), len);
        Ok(())
    }

    /// A piece of a large message: reassemble it (charging it to its mailbox as it comes)
    /// and deliver the message whole once its last piece is in.
    fn piece(&self, f: Fragment) -> Result<(), LinkError> {
        let (peer, conn) = (self.peer, self.conn);
        let _turn = peer.delivery_turn();
        let Some(d) = peer.session(|s, _| s.begin_delivery(conn.id, f.seq, 1))? else {
            return Err(LinkError::Replaced);
        };
        peer.stats.fragments_received.fetch_add(1, Relaxed);
        let result = if d.skip == 0 {
            self.add_piece(&f)
        } else {
            Ok(())
        };
        // A piece that does not add up is not committed (nothing of it was kept).
        let upto = if result.is_ok() { d.end } else { d.first };
        peer.session(|s, now| s.end_delivery(now, d, upto, f.data.len()));
        self.snapshot_if_asked();
        result
    }

    fn add_piece(&self, f: &Fragment) -> Result<(), LinkError> {
        let peer = self.peer;
        let mut r = peer.lock_reassembly();
        let too_large = f.total > self.max_payload;
        let keep = r.keeps(f, || {
            !too_large
                && (call::is_reply_inbox(f.to.as_bytes())
                    || self.mailboxes.get(f.to.as_bytes()).is_some())
        });
        let charge = f.charge();
        if keep {
            peer.flow.charge(&f.to, charge)?;
        }
        let added = match r.add(f, keep) {
            Ok(a) => a,
            Err(e) => {
                if keep {
                    peer.flow.uncharge(&f.to, charge);
                }
                return Err(e.into());
            }
        };
        drop(r);
        if !keep {
            peer.flow.dropped(&f.to, charge);
        }
        let Added::Complete {
            to,
            from,
            payload,
            kept,
            charged,
        } = added
        else {
            return Ok(());
        };
        if !kept {
            if too_large {
                warn!(peer = %peer.name, mailbox = %to, bytes = f.total, max = self.max_payload, "message larger than this node's max_payload dropped; reported to the sender as undeliverable");
            }
            self.report_missing(&to, &from, 1);
            peer.stats.messages_received.fetch_add(1, Relaxed);
            return Ok(());
        }
        peer.stats.messages_received.fetch_add(1, Relaxed);
        let held = Held::new(peer.flow.clone(), to.clone(), charged);
        if call::is_reply_inbox(to.as_bytes()) {
            drop(held);
            peer.calls()
                .replies_from_wire(&peer.name, std::iter::once((from, payload)));
            return Ok(());
        }
        let e = Envelope::new(
            Address {
                node: peer.name.clone(),
                mailbox: from.clone(),
            },
            payload,
        );
        let pushed = match self.mailboxes.get(to.as_bytes()) {
            Some(mb) => mb.push_remote(e, held).is_ok(),
            // Dropped while the pieces came: its credit goes back with `held`.
            None => false,
        };
        if !pushed {
            self.report_missing(&to, &from, 1);
        }
        Ok(())
    }

    /// Count and report `count` messages from the peer's mailbox `from` that found no
    /// mailbox `to` here.
    fn report_missing(&self, to: &Name, from: &Name, count: u32) {
        self.mailboxes.note_missing(to, &self.peer.name, count);
        self.peer.report_undeliverable(to, from, count);
    }

    /// Report a run of messages for mailbox `to`, which does not exist: once per stretch
    /// of consecutive messages from one sender (the peer's notices are summed and bounded).
    /// With `credit`, their credit goes back to the peer too.
    fn undeliverable(&self, to: &[u8], mut data: Bytes, credit: bool) {
        // Validated with the frame: UTF-8, at most 255 bytes.
        let to = Name::new(std::str::from_utf8(to).unwrap_or("")).unwrap_or(Name::from_static(""));
        if credit {
            self.peer.flow.dropped(&to, data.len() as u64);
        }
        let mut stretch: Option<(Name, u32)> = None;
        while let Some((from, _, _)) = frame::next_message(&mut data) {
            match &mut stretch {
                Some((f, n)) if *f == from => *n += 1,
                _ => {
                    if let Some((f, n)) = stretch.replace((from, 1)) {
                        self.report_missing(&to, &f, n);
                    }
                }
            }
        }
        if let Some((f, n)) = stretch {
            self.report_missing(&to, &f, n);
        }
    }
}

/// Read once into the spare room at the end of `buf`, making room for `want` bytes.
///
/// On a plain TCP link the kernel writes straight into the buffer's spare capacity: the
/// bytes are not zeroed first. (Zeroing `want` bytes before every read cost a pass over
/// 64 KiB per read, whatever arrived: 113 of the receiving process's 673 instructions per
/// 100 B message under callgrind.) TLS reads through rustls into initialized memory.
/// A reader's receive buffers. Frames are split off the current buffer and their messages
/// handed out as slices of it, so a buffer is free again only once the application has
/// dropped every message cut from it. Letting `BytesMut::reserve` allocate a new one
/// whenever the current one is still shared (nearly always, at speed) cost a fresh block
/// from the allocator per read, which it took from and gave back to the kernel: page faults
/// and `madvise` were a tenth of the reader's time at 10 KB messages. Instead the reader
/// keeps up to [`RETIRED`] full buffers and takes one back once its messages are gone.
/// Memory: at most `RETIRED + 1` blocks of `4 x read_bytes` (at most 1 MiB, or one read if
/// that is larger) per connection, plus blocks the application still holds messages of
/// (those it frees itself).
struct RecvRing {
    cur: BytesMut,
    retired: std::collections::VecDeque<BytesMut>,
    block: usize,
    want: usize,
}

/// Full receive buffers kept per connection to be reused.
const RETIRED: usize = 4;

impl RecvRing {
    fn new(mut cur: BytesMut, want: usize) -> Self {
        // Four reads per block, but no block over 1 MiB beyond one read (a large
        // `read_bytes` must not multiply the memory a connection keeps).
        let block = want.saturating_mul(4).min(want.max(1 << 20));
        if cur.capacity() - cur.len() < want {
            cur.reserve(block);
        }
        RecvRing {
            cur,
            retired: Default::default(),
            block,
            want,
        }
    }

    /// The bytes read and not yet decoded.
    fn buf(&mut self) -> &mut BytesMut {
        &mut self.cur
    }

    /// The current buffer, with room for `want` more bytes: if it has none and its
    /// messages are still held, the unread tail (at most part of one frame) moves to a
    /// retired buffer whose messages are all dropped, or to a new one.
    fn room(&mut self) -> &mut BytesMut {
        // Room left, or every message cut from the buffer is gone (light load): in place,
        // so an idle connection keeps touching the same few pages.
        if self.cur.capacity() - self.cur.len() >= self.want || self.cur.try_reclaim(self.want) {
            return &mut self.cur;
        }
        let need = self.cur.len() + self.want;
        let reuse = (0..self.retired.len()).find(|&i| self.retired[i].try_reclaim(need));
        let mut next = match reuse {
            Some(i) => self.retired.remove(i).unwrap_or_default(),
            None => BytesMut::with_capacity(need.max(self.block)),
        };
        next.extend_from_slice(&self.cur);
        let mut old = std::mem::replace(&mut self.cur, next);
        old.clear();
        if self.retired.len() == RETIRED {
            self.retired.pop_front();
        }
        self.retired.push_back(old);
        &mut self.cur
    }
}

pub(crate) fn read_more(
    link: &crate::io::link::Link,
    buf: &mut BytesMut,
    want: usize,
) -> std::io::Result<usize> {
    let len = buf.len();
    #[cfg(unix)]
    if let Some(fd) = link.plain_fd() {
        buf.reserve(want);
        let spare = buf.spare_capacity_mut();
        let n = spare.len().min(want);
        // SAFETY: recv(2) writes at most `n` bytes through a raw pointer into the spare
        // capacity (no reference to uninitialized memory is made) and returns how many it
        // wrote; exactly those are then counted as initialized by `set_len`. The fd is the
        // link's socket, open for as long as `link` is borrowed.
        let r = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), n, 0) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let r = r as usize;
        // SAFETY: the first `r` bytes of the spare capacity were written by recv above.
        unsafe { buf.set_len(len + r) };
        return Ok(r);
    }
    buf.resize(len + want, 0);
    let r = link.read(&mut buf[len..]);
    buf.truncate(len + *r.as_ref().unwrap_or(&0));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::link::Link;
    use crate::io::peer::testing;
    use batchwire_core::frame::Message;
    use batchwire_core::idle::IdleStrategy;
    use batchwire_core::session::SessionConfig;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    #[test]
    fn a_receive_buffer_is_taken_back_once_its_messages_are_dropped_and_a_tail_moves_along() {
        // Reads of 1000 bytes into blocks of 4000.
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        ring.room().extend_from_slice(&[7u8; 3500]);
        let first = ring.buf().as_ptr();
        // A message the application keeps; 500 bytes of a frame left unread.
        let kept = ring.buf().split_to(3000).freeze();
        // No room for another read: the tail moves to a new buffer (the first is shared).
        let b = ring.room();
        assert_ne!(b.as_ptr(), first);
        assert_eq!(&b[..], &[7u8; 500][..], "the unread tail moved along");
        assert_eq!(ring.retired.len(), 1);
        // Fill the second buffer too, while the application still holds `kept`...
        ring.buf().extend_from_slice(&[8u8; 3000]);
        let second = ring.buf().split_to(3400).freeze();
        let _ = ring.room();
        assert!(
            ring.buf().as_ptr() != first,
            "not taken back while a message lives"
        );
        assert_eq!(&ring.buf()[..], &[8u8; 100][..]);
        // ...then it drops both. The current buffer's messages are gone too (light load):
        // it is reused in place, the tail moved to its front.
        drop((kept, second));
        let third = ring.buf().as_ptr();
        ring.buf().extend_from_slice(&[9u8; 3500]);
        drop(ring.buf().split_to(3550));
        let b = ring.room();
        assert_eq!(b.as_ptr(), third, "reused in place");
        assert_eq!(&b[..], &[9u8; 50][..]);
        // Under load (a message of the current buffer still held) the next change takes
        // the oldest retired buffer back instead of allocating.
        ring.buf().extend_from_slice(&[3u8; 3000]);
        let held = ring.buf().split_to(3040).freeze();
        let b = ring.room();
        assert_eq!(b.as_ptr(), first, "the oldest retired buffer is reused");
        assert_eq!(&b[..], &[3u8; 10][..]);
        assert_eq!(ring.retired.len(), 2);
        assert_eq!(ring.retired[1].as_ptr(), unsafe { third.add(3040) });
        drop(held);
        // Kept: at most RETIRED full buffers.
        for _ in 0..20 {
            let b = ring.room();
            b.extend_from_slice(&[1u8; 3990]);
            let _keep_shared = b.split_to(3990).freeze();
        }
        assert!(ring.retired.len() <= RETIRED);
    }

    /// Decode the frames the writer would send for the flow.
    fn flow_output(peer: &Peer) -> Vec<Frame> {
        let mut out = Vec::new();
        peer.flow.take_output(&mut out);
        let mut b = BytesMut::from(&out[..]);
        std::iter::from_fn(|| frame::decode(&mut b, 1 << 20).unwrap()).collect()
    }

    #[test]
    fn a_reader_never_waits_for_a_full_mailbox_and_credit_goes_back_as_it_is_read() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        let peer = testing::peer(SessionConfig::default());
        let conn = testing::connect(&peer, Link::Plain(ours));
        let mailboxes = Mailboxes::default();
        let name = Name::from_static("inbox");
        let mb = mailboxes.get_or_insert(&name, || {
            MailboxQueue::new(name.clone(), 10, IdleStrategy::default())
        });
        // Three frames of one message each, and one piece of a message in two pieces:
        // the mailbox is full after the first, and all of it is handed over at once.
        let mut out = Vec::new();
        for seq in 0..3u64 {
            let mut list = MessageList::from_messages(&[Message {
                to: name.clone(),
                from: Name::from_static("x"),
                payload: Bytes::from(vec![seq as u8; 50]),
            }]);
            list.first_seq = seq;
            Frame::Messages(list).encode(&mut out);
        }
        let big = Bytes::from(vec![7u8; 100]);
        for (seq, off) in [(3u64, 0usize), (4, 60)] {
            let end = (off + 60).min(100);
            Frame::Fragment(Fragment {
                seq,
                id: 3,
                total: 100,
                offset: off as u64,
                to: name.clone(),
                from: Name::from_static("big"),
                data: big.slice(off..end),
            })
            .encode(&mut out);
        }
        theirs.write_all(&out).unwrap();
        let events = Events::new(16);
        let (p, c, m) = (peer.clone(), conn.clone(), mailboxes.clone());
        let reader = std::thread::spawn(move || {
            Reader {
                peer: &p,
                conn: &c,
                mailboxes: &m,
                events: &events,
                shared: None,
                max_frame: 1 << 20,
                max_payload: 1 << 20,
                read_bytes: 1 << 16,
                members: None,
            }
            .run(BytesMut::new())
        });
        let t0 = Instant::now();
        while mb.len() < 4 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            mb.len(),
            4,
            "all handed over without waiting for the consumer"
        );
        let charged = 3 * (6 + 5 + 1 + 50) + (6 + 5 + 3 + 100);
        assert_eq!(peer.flow.held(b"inbox"), charged);
        // The writer's first word on the connection: where credit stood (nothing held).
        let first = flow_output(&peer);
        assert!(
            matches!(&first[..], [Frame::Sync(s)] if s.next == 0 && s.held.is_empty()),
            "{first:?}"
        );
        // The application takes everything: its credit is owed back, and goes as a grant.
        let mut got = Vec::new();
        mb.take(&mut got, 10, None).unwrap();
        assert_eq!(got[3].payload, big, "the pieces, whole");
        assert_eq!(peer.flow.held(b"inbox"), 0);
        let grants = flow_output(&peer);
        assert!(
            matches!(&grants[..], [Frame::Credit(c)] if c.grants == [(name.clone(), charged)]),
            "{grants:?}"
        );
        conn.close();
        assert!(reader.join().unwrap().is_err());
        let (_, resume) = peer.session(|s, now| s.handle_connect(now, 1));
        assert_eq!(resume.next, 5, "every message and piece was committed");
    }
}
