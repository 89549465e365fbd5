//! The no-head-of-line rules end to end, without IO: two nodes, each with an ordinary
//! outbox, a bulk queue and credit toward the other, a session, reassembly, credit accounts
//! and mailboxes, over a simulated connection that holds a bounded number of bytes and can
//! break, driven by a fake clock in 1 ms steps. Each node's writer and reader take the same
//! steps, in the same order, as the IO layer's (`batchwire`'s `io::write` and `io::read`):
//! control and credit first, then the ordinary batch, then pieces while there is bulk room.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::bulk::{BulkQueue, ORDINARY_WEIGHT};
use crate::codec::{Name, NameMap};
use crate::credit::{RecvCredit, SendCredit};
use crate::frame::{self, Frame, MAX_FRAME_LEN, message_len};
use crate::outbox::{Batch, Outbox};
use crate::reassembly::{Added, Reassembly};
use crate::session::{ConnId, PieceRefused, Session, SessionConfig, SessionEvent};
use crate::testutil::Rng;

const MS: Duration = Duration::from_millis(1);
/// The fragment size of these runs.
const PIECE: usize = 1024;
const MAX_PAYLOAD: u64 = 1 << 20;

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn cfg() -> SessionConfig {
    SessionConfig {
        unacked_bytes: 64 << 10,
        ack_every: 32,
        ack_every_bytes: 8 << 10,
        ack_delay: 2 * MS,
        heartbeat_interval: 100 * MS,
        peer_timeout: Duration::from_secs(60),
        bulk_inflight: 4 << 10,
        bulk_stream: 16 << 10,
        ..SessionConfig::default()
    }
}

/// A payload of `len` bytes that says which message it is: its pair's counter first.
fn payload(k: u64, len: usize) -> Bytes {
    let mut v = vec![(k % 251) as u8; len.max(8)];
    v[..8].copy_from_slice(&k.to_le_bytes());
    Bytes::from(v)
}

fn counter(p: &[u8]) -> u64 {
    u64::from_le_bytes(p[..8].try_into().unwrap())
}

/// One direction's bytes in flight: a writer blocks at `cap`, a reader takes at most `cap`
/// per step (the link's rate).
struct Wire {
    bytes: Vec<u8>,
    cap: usize,
}

struct Node {
    incarnation: u64,
    s: Session,
    id: ConnId,
    // Sending to the other node.
    outbox: Outbox,
    bulk: BulkQueue,
    credit: SendCredit,
    /// Ordinary messages queued, and taken for writing, ever.
    pushed: u64,
    taken: u64,
    batch: Batch,
    // Receiving from it.
    rcredit: RecvCredit,
    reasm: Reassembly,
    boxes: BTreeMap<String, VecDeque<(String, Bytes, u64)>>,
    buf: BytesMut,
    sync_out: Option<frame::Sync>,
    events: Vec<SessionEvent>,
    /// Most bytes of pieces held at once.
    bulk_high: usize,
}

impl Node {
    fn new(incarnation: u64, window: u64, mailboxes: &[&str], t0: Instant) -> Node {
        Node {
            incarnation,
            s: Session::new(cfg(), t0),
            id: ConnId::new(0),
            outbox: Outbox::new(4 << 10),
            bulk: BulkQueue::default(),
            credit: SendCredit::default(),
            pushed: 0,
            taken: 0,
            batch: Batch::default(),
            rcredit: RecvCredit::new(window, MAX_PAYLOAD),
            reasm: Reassembly::default(),
            boxes: mailboxes
                .iter()
                .map(|m| (m.to_string(), VecDeque::new()))
                .collect(),
            buf: BytesMut::new(),
            sync_out: None,
            events: Vec::new(),
            bulk_high: 0,
        }
    }

    /// `send` / `try_send`: charge the credit, then queue in the lane the message belongs to.
    fn send(&mut self, to: &str, from: &str, p: Bytes, bulk: bool) -> bool {
        let (to, from) = (n(to), n(from));
        let charge = message_len(&to, &from, p.len()) as u64;
        if !self.credit.try_charge(&to, charge) {
            return false;
        }
        if bulk || p.len() > PIECE || self.bulk.has_pair(&to, &from) {
            self.bulk.push(&to, &from, p, self.pushed);
        } else {
            self.outbox.push_message(0, &to, &from, &p, None);
            self.pushed += 1;
        }
        true
    }

    /// The writer's round: control and credit, the ordinary batch, pieces while there is
    /// bulk room, then as much of the window as the wire takes.
    fn write(&mut self, now: Instant, w: &mut Wire) {
        if w.bytes.len() >= w.cap {
            return;
        }
        while let Some(f) = self.s.poll_control(now, self.id) {
            f.encode(&mut w.bytes);
        }
        if let Some(sy) = self.sync_out.take() {
            Frame::Sync(sy).encode(&mut w.bytes);
        }
        while let Some(g) = self.rcredit.take_grants() {
            Frame::Credit(g).encode(&mut w.bytes);
        }
        if !self.s.window_full() && !self.outbox.is_empty() {
            let max = if self.bulk.ready(self.taken) {
                ORDINARY_WEIGHT * PIECE
            } else {
                usize::MAX
            };
            self.outbox.take(usize::MAX, max, &mut self.batch, None);
            self.taken += self.batch.messages();
            self.s.hold(&self.batch.message_frames());
        }
        while self.s.bulk_room() {
            let Some(p) = self.bulk.peek(PIECE, self.taken) else {
                break;
            };
            match self.s.hold_piece(&p) {
                Ok(id) => {
                    self.bulk.advance(p.serial, id);
                }
                Err(PieceRefused::Restart) => self.bulk.restart(p.serial),
                Err(PieceRefused::Failed(_)) => {
                    self.bulk.unreserve(p.serial);
                    break;
                }
            }
        }
        self.bulk_high = self.bulk_high.max(self.s.bulk_bytes());
        let u = self.s.unwritten(self.id);
        let segments = u.segments();
        let mut written = 0;
        for (i, (c, end)) in segments.iter().enumerate() {
            // A piece is two slices (its head, then its data) with the same end: never
            // stop between them (a writer goes on with the rest of a partial write).
            let continues = i > 0 && *end == segments[i - 1].1;
            if w.bytes.len() >= w.cap && !continues {
                break;
            }
            w.bytes.extend_from_slice(c);
            written += 1;
        }
        if written > 0 {
            self.s
                .mark_written(now, self.id, u.generation, segments[written - 1].1);
        } else {
            self.s.note_sent(now, self.id);
        }
    }

    /// Hand a whole message to its mailbox (charging it), or give its credit back.
    fn deliver(&mut self, to: &Name, from: &Name, p: Bytes, charge: u64) {
        match self.boxes.get_mut(to.as_str()) {
            Some(q) => {
                self.rcredit.charge(to, charge).expect("within credit");
                q.push_back((from.to_string(), p, charge));
            }
            None => {
                self.rcredit.dropped(to, charge);
            }
        }
    }

    /// The reader: what the link delivers this step, every whole frame in it.
    fn read(&mut self, now: Instant, w: &mut Wire) {
        if w.bytes.is_empty() {
            return;
        }
        let k = w.bytes.len().min(w.cap);
        self.buf.extend_from_slice(&w.bytes[..k]);
        w.bytes.drain(..k);
        self.s.handle_heard(now, self.id);
        while let Some(f) = frame::decode(&mut self.buf, MAX_FRAME_LEN).unwrap() {
            match f {
                Frame::Messages(l) => {
                    let Some(d) = self
                        .s
                        .begin_delivery(self.id, l.first_seq, l.len() as u32)
                        .unwrap()
                    else {
                        continue;
                    };
                    for m in l.skip(d.skip).iter() {
                        let c = message_len(&m.to, &m.from, m.payload.len()) as u64;
                        self.deliver(&m.to, &m.from, m.payload, c);
                    }
                    self.s.end_delivery(now, d, d.end, l.body().len());
                }
                Frame::Fragment(fr) => {
                    let Some(d) = self.s.begin_delivery(self.id, fr.seq, 1).unwrap() else {
                        continue;
                    };
                    if d.skip == 0 {
                        let keep = self
                            .reasm
                            .keeps(&fr, || self.boxes.contains_key(fr.to.as_str()));
                        if keep {
                            self.rcredit.charge(&fr.to, fr.charge()).unwrap();
                        } else {
                            self.rcredit.dropped(&fr.to, fr.charge());
                        }
                        if let Added::Complete {
                            to,
                            from,
                            payload,
                            kept: true,
                            charged,
                        } = self.reasm.add(&fr, keep).unwrap()
                        {
                            // Charged piece by piece already.
                            let q = self.boxes.get_mut(to.as_str()).unwrap();
                            q.push_back((from.to_string(), payload, charged));
                        }
                    }
                    self.s.end_delivery(now, d, d.end, fr.data.len());
                }
                Frame::Ack(a) => {
                    self.s.handle_ack(now, self.id, a).unwrap();
                }
                Frame::Credit(c) => {
                    for (name, b) in c.grants {
                        self.credit.grant(name.as_bytes(), b);
                    }
                }
                Frame::Sync(sy) => self.apply_sync(sy),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The peer's SYNC: recount each mailbox's charge as held there, plus in flight from
    /// `next` on, plus still queued.
    fn apply_sync(&mut self, sy: frame::Sync) {
        let mut totals: NameMap<u64> = NameMap::default();
        let mut add = |to: &Name, b: u64| *totals.entry(to.clone()).or_default() += b;
        for (name, h) in &sy.held {
            add(name, *h);
        }
        self.s.charges_from(sy.next, &mut add);
        self.outbox.charges(0, &mut add);
        self.bulk.charges(&mut add);
        self.credit.sync(sy.window, sy.max_payload, &totals);
    }

    /// The application takes up to `k` messages from `mailbox`.
    fn consume(&mut self, mailbox: &str, k: usize) -> Vec<(String, Bytes)> {
        let mut out = Vec::new();
        let q = self.boxes.get_mut(mailbox).unwrap();
        for _ in 0..k {
            let Some((from, p, charge)) = q.pop_front() else {
                break;
            };
            self.rcredit.release(mailbox.as_bytes(), charge);
            out.push((from, p));
        }
        out
    }

    fn tick(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        self.events
            .extend(std::iter::from_fn(|| self.s.poll_event()));
    }

    /// Drop what was reassembled of messages the peer gave up, giving their credit back.
    fn abandon(&mut self, gone: Vec<crate::reassembly::Abandoned>) {
        for a in gone {
            if a.kept {
                self.rcredit.release(a.to.as_bytes(), a.charged);
            }
        }
    }
}

/// A new connection: both handshakes, both RESUMEs, then each side's SYNC goes first.
fn connect(a: &mut Node, b: &mut Node, now: Instant) {
    let (ia, ra) = a.s.handle_connect(now, b.incarnation);
    let (ib, rb) = b.s.handle_connect(now, a.incarnation);
    for x in [&mut *a, &mut *b] {
        x.events.extend(std::iter::from_fn(|| x.s.poll_event()));
        if x.events
            .iter()
            .any(|e| matches!(e, SessionEvent::Restarted { .. }))
        {
            let gone = x.reasm.clear();
            x.abandon(gone);
            x.events.clear();
        }
    }
    let keep = a.s.handle_resume(now, ia, rb).unwrap().keep;
    let gone = a.reasm.discard_below(keep);
    a.abandon(gone);
    let keep = b.s.handle_resume(now, ib, ra).unwrap().keep;
    let gone = b.reasm.discard_below(keep);
    b.abandon(gone);
    (a.id, b.id) = (ia, ib);
    for x in [a, b] {
        x.buf.clear();
        x.sync_out = Some(x.rcredit.snapshot(x.s.recv_next(), MAX_PAYLOAD));
    }
}

fn wires(cap: usize) -> (Wire, Wire) {
    let w = || Wire {
        bytes: Vec::new(),
        cap,
    };
    (w(), w())
}

/// One step of both nodes.
fn step(a: &mut Node, b: &mut Node, ab: &mut Wire, ba: &mut Wire, now: Instant) {
    a.tick(now);
    b.tick(now);
    a.write(now, ab);
    b.write(now, ba);
    b.read(now, ab);
    a.read(now, ba);
}

/// Messages of one pair in the order they arrived: their counters.
fn counters(got: &[(String, Bytes)], from: &str) -> Vec<u64> {
    got.iter()
        .filter(|(f, _)| f.starts_with(from))
        .map(|(_, p)| counter(p))
        .collect()
}

mod scenarios;
