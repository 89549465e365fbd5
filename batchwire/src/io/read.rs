//! A connection's reader: frames off the socket into the session and the mailboxes.
//!
//! Messages are delivered a run at a time (consecutive messages for one mailbox: one lock,
//! at most one wake-up). When a mailbox is full the reader waits for room without holding
//! anything another thread needs: the session knows it is paused (so the peer's silence
//! meanwhile is not held against it), the writer goes on sending acknowledgements and
//! heartbeats, and the wait gives up within a recheck if this connection is replaced or
//! closed. What was delivered is committed to the session; the rest comes again on the next
//! connection and is delivered then, exactly once.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, MessageList};
use batchwire_core::handshake::HandshakeError;
use bytes::BytesMut;
use tracing::warn;

use crate::address::Address;
use crate::event::Event;
use crate::io::conn::{Conn, LinkError};
use crate::io::events::Events;
use crate::io::mailbox::{MailboxQueue, Mailboxes, Refused, Wait};
use crate::io::peer::Peer;

/// What a reader uses.
pub(crate) struct Reader<'a> {
    pub peer: &'a Peer,
    pub conn: &'a Conn,
    pub mailboxes: &'a Mailboxes,
    pub events: &'a Events,
    pub max_frame: usize,
    pub read_bytes: usize,
}

impl Reader<'_> {
    /// Read frames and act on them until the peer says goodbye (`Ok`) or something breaks.
    pub fn run(&self, mut buf: BytesMut) -> Result<(), LinkError> {
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut drained = false;
        loop {
            while let Some(frame) = frame::decode(&mut buf, self.max_frame)? {
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
            let n = read_more(&self.conn.link, &mut buf, self.read_bytes)?;
            if n == 0 {
                return Err(LinkError::Eof);
            }
            drained = n < self.read_bytes;
            self.peer.stats.bytes_received.fetch_add(n as u64, Relaxed);
            self.peer
                .session(|s, now| s.handle_heard(now, self.conn.id));
        }
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
            Frame::Ack(next) => {
                let acked = peer.session(|s, now| s.handle_ack(now, id, next))?;
                peer.stats.acked.fetch_add(acked, Relaxed);
            }
            Frame::Undeliverable(u) => {
                peer.stats
                    .undeliverable_reported
                    .fetch_add(u.count as u64, Relaxed);
                warn!(peer = %peer.name, mailbox = %u.to, from = %u.from, count = u.count, "peer reports messages undeliverable: no such mailbox (\"\" sums more names than it reports one by one)");
                self.events.emit(Event::Undeliverable {
                    to: Address {
                        node: peer.name.clone(),
                        mailbox: u.to,
                    },
                    from: u.from.to_string(),
                    count: u.count as u64,
                });
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
            if cache.as_ref().is_none_or(|mb| mb.name.as_bytes() != to) {
                *cache = self.mailboxes.get(to);
            }
            let data = list.body().slice(range);
            let len = data.len();
            let pushed = match cache.as_ref() {
                Some(mb) => self.push(mb, data.clone(), count),
                None => Err(Refused::Closed),
            };
            match pushed {
                Ok(()) => {}
                Err(Refused::GaveUp) => {
                    result = Err(LinkError::Replaced);
                    break;
                }
                // No such mailbox (or it was dropped meanwhile): counted and reported.
                Err(_) => {
                    *cache = None;
                    self.undeliverable(to, data);
                }
            }
            upto += count as u64;
            bytes += len;
        }
        peer.session(|s, now| s.end_delivery(now, d, upto, bytes));
        result
    }

    /// Push a run; when the mailbox is full, wait for room as a paused reader.
    fn push(&self, mb: &MailboxQueue, data: bytes::Bytes, count: u32) -> Result<(), Refused> {
        match mb.push_run(&self.peer.name, data.clone(), count, Wait::No) {
            Err(Refused::Full) => {}
            other => return other,
        }
        self.peer.session(|s, now| s.set_paused(now, true));
        let conn = self.conn;
        let r = mb.push_run(
            &self.peer.name,
            data,
            count,
            Wait::Until(&|| conn.is_closed()),
        );
        self.peer.session(|s, now| s.set_paused(now, false));
        r
    }

    /// Report a run of messages for mailbox `to`, which does not exist: once per stretch
    /// of consecutive messages from one sender (the peer's notices are summed and bounded).
    fn undeliverable(&self, to: &[u8], mut data: bytes::Bytes) {
        // Validated with the frame: UTF-8, at most 255 bytes.
        let to = Name::new(std::str::from_utf8(to).unwrap_or("")).unwrap_or(Name::from_static(""));
        let mut stretch: Option<(Name, u32)> = None;
        let report = |from: &Name, n: u32| {
            self.mailboxes.note_missing(&to, &self.peer.name, n);
            self.peer.report_undeliverable(&to, from, n);
        };
        while let Some((from, _, _)) = frame::next_message(&mut data) {
            match &mut stretch {
                Some((f, n)) if *f == from => *n += 1,
                _ => {
                    if let Some((f, n)) = stretch.replace((from, 1)) {
                        report(&f, n);
                    }
                }
            }
        }
        if let Some((f, n)) = stretch {
            report(&f, n);
        }
    }
}

/// Read once into the spare room at the end of `buf`, making room for `want` bytes.
pub(crate) fn read_more(
    link: &crate::io::link::Link,
    buf: &mut BytesMut,
    want: usize,
) -> std::io::Result<usize> {
    let len = buf.len();
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
    use batchwire_core::session::{PeerState, SessionConfig};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    #[test]
    fn a_reader_waiting_for_a_full_mailbox_is_paused_and_gives_up_when_replaced() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        let timeout = Duration::from_millis(300);
        let peer = testing::peer(SessionConfig {
            peer_timeout: timeout,
            heartbeat_interval: Duration::from_millis(100),
            ..SessionConfig::default()
        });
        let conn = testing::connect(&peer, Link::Plain(ours));
        let mailboxes = Mailboxes::default();
        let name = Name::from_static("inbox");
        let mb = mailboxes.get_or_insert(&name, || {
            MailboxQueue::new(name.clone(), 10, IdleStrategy::default())
        });
        // Two frames of one message each: the first fills the mailbox, the second waits.
        let mut out = Vec::new();
        for seq in 0..2u64 {
            let mut list = MessageList::from_messages(&[Message {
                to: name.clone(),
                from: Name::from_static("x"),
                payload: bytes::Bytes::from(vec![seq as u8; 50]),
            }]);
            list.first_seq = seq;
            Frame::Messages(list).encode(&mut out);
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
                max_frame: 1 << 20,
                read_bytes: 1 << 16,
            }
            .run(BytesMut::new())
        });
        // Long past the peer's timeout, and nothing heard: not down, the reader is paused.
        std::thread::sleep(3 * timeout);
        peer.session(|s, now| s.handle_timeout(now));
        assert_eq!(peer.state(), PeerState::Up);
        // The connection is replaced: the reader gives up within its recheck, and what it
        // delivered (the first message) counts.
        let t0 = Instant::now();
        conn.close();
        let r = reader.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(matches!(r, Err(LinkError::Replaced)), "{r:?}");
        assert_eq!(mb.len(), 1);
        let (id2, resume) = peer.session(|s, now| s.handle_connect(now, 1));
        assert_eq!(
            resume.next, 1,
            "the first message was delivered, the second will come again"
        );
        let _ = id2;
    }
}
