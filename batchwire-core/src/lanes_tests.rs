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

#[test]
fn small_messages_go_between_the_pieces_of_a_large_one() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 20, &[], t0);
    let mut b = Node::new(2, 1 << 20, &["big", "small"], t0);
    let (mut ab, mut ba) = wires(8 << 10);
    connect(&mut a, &mut b, t0);
    let big = payload(0, 256 << 10);
    assert!(a.send("big", "bulk", big.clone(), false));
    let (mut now, mut k) = (t0, 0u64);
    let (mut small_done, mut big_done) = (Vec::new(), None);
    // One small message per step; each arrives in the step it was sent, while the big one
    // goes on in pieces and arrives after many of them.
    while big_done.is_none() && now < t0 + Duration::from_secs(10) {
        now += MS;
        assert!(a.send("small", "ping", payload(k, 32), false));
        k += 1;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
        small_done.extend(counters(&b.consume("small", 100), "ping"));
        if let Some((_, p)) = b.consume("big", 1).pop() {
            big_done = Some(k);
            assert_eq!(p, big, "reassembled whole");
        }
    }
    let k_big = big_done.expect("the large message arrived");
    assert!(k_big > 50, "it took many steps: {k_big}");
    assert_eq!(
        small_done,
        (0..k).collect::<Vec<_>>(),
        "no step waited for it"
    );
    assert!(
        a.bulk_high <= cfg().bulk_inflight + PIECE + 128,
        "bulk held at once: {}",
        a.bulk_high
    );
}

#[test]
fn bulk_alone_gets_the_stream_budget_until_an_ordinary_message_comes() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 20, &[], t0);
    let mut b = Node::new(2, 1 << 20, &["big", "small"], t0);
    let (mut ab, mut ba) = wires(8 << 10);
    connect(&mut a, &mut b, t0);
    let big = payload(0, 256 << 10);
    let mut now = t0;
    // Run until the large message is in (bounded in steps).
    let mut finish = |a: &mut Node, b: &mut Node, now: &mut Instant, small: bool| {
        let mut k = 0;
        loop {
            assert!(
                *now < t0 + Duration::from_secs(20),
                "the large message arrived"
            );
            *now += MS;
            if small {
                assert!(a.send("small", "ping", payload(k, 32), false));
                k += 1;
            }
            step(a, b, &mut ab, &mut ba, *now);
            b.consume("small", 100);
            if let Some((_, p)) = b.consume("big", 1).pop() {
                assert_eq!(p, big, "reassembled whole");
                return;
            }
        }
    };
    // Alone: past the small budget, within the stream budget.
    assert!(a.send("big", "bulk", big.clone(), false));
    finish(&mut a, &mut b, &mut now, false);
    let (small, stream) = (cfg().bulk_inflight, cfg().bulk_stream);
    assert!(
        a.bulk_high > small + PIECE + 128 && a.bulk_high <= stream + PIECE + 128,
        "bulk held at once: {} (budgets {small} and {stream})",
        a.bulk_high
    );
    // With a small message in every step: the small budget from the first one on.
    a.bulk_high = 0;
    assert!(a.send("big", "bulk", big.clone(), false));
    finish(&mut a, &mut b, &mut now, true);
    assert!(
        a.bulk_high <= small + PIECE + 128,
        "bulk held at once: {}",
        a.bulk_high
    );
}

#[test]
fn a_pair_keeps_its_order_whatever_the_sizes_and_classes() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 20, &[], t0);
    let mut b = Node::new(2, 1 << 20, &["m"], t0);
    let (mut ab, mut ba) = wires(16 << 10);
    connect(&mut a, &mut b, t0);
    let mut rng = Rng(7);
    let (mut now, mut sent, mut got) = (t0, [0u64; 2], Vec::new());
    while now < t0 + Duration::from_secs(5) {
        now += MS;
        for _ in 0..rng.below(6) {
            let pair = rng.below(2) as usize;
            let len = [16, 900, 3000, 10_000][rng.below(4) as usize];
            let from = ["s0", "s1"][pair];
            if a.send("m", from, payload(sent[pair], len), rng.chance(20)) {
                sent[pair] += 1;
            }
        }
        step(&mut a, &mut b, &mut ab, &mut ba, now);
        got.extend(b.consume("m", usize::MAX));
    }
    for (pair, from) in ["s0", "s1"].iter().enumerate() {
        let c = counters(&got, from);
        assert!(
            c.len() as u64 > sent[pair] / 2,
            "most of {} arrived",
            sent[pair]
        );
        assert_eq!(
            c,
            (0..c.len() as u64).collect::<Vec<_>>(),
            "{from}: in order"
        );
    }
}

#[test]
fn exactly_once_in_order_across_random_breaks_with_pieces() {
    for seed in 1..=6 {
        let t0 = Instant::now();
        let mut a = Node::new(1, 64 << 10, &[], t0);
        let mut b = Node::new(2, 64 << 10, &["x", "y"], t0);
        let (mut ab, mut ba) = wires(8 << 10);
        connect(&mut a, &mut b, t0);
        let mut rng = Rng(seed);
        let mut sent = [0u64; 2];
        let mut got: Vec<(String, Bytes)> = Vec::new();
        let mut now = t0;
        let mut breaks = 0;
        for t in 0..4000 {
            now += MS;
            if t < 3000 {
                for _ in 0..rng.below(4) {
                    let pair = rng.below(2) as usize;
                    let len = [8, 200, 1500, 6000][rng.below(4) as usize];
                    let (to, from) = [("x", "sx"), ("y", "sy")][pair];
                    if a.send(to, from, payload(sent[pair], len), rng.chance(10)) {
                        sent[pair] += 1;
                    }
                }
            }
            step(&mut a, &mut b, &mut ab, &mut ba, now);
            for m in ["x", "y"] {
                got.extend(b.consume(m, rng.below(40) as usize));
            }
            if t < 3000 && rng.chance(2) {
                // The connection breaks somewhere in the middle of a frame.
                breaks += 1;
                ab.bytes
                    .truncate(rng.below(ab.bytes.len() as u64 + 1) as usize);
                ba.bytes
                    .truncate(rng.below(ba.bytes.len() as u64 + 1) as usize);
                b.read(now, &mut ab);
                a.read(now, &mut ba);
                ab.bytes.clear();
                ba.bytes.clear();
                connect(&mut a, &mut b, now);
            }
        }
        for m in ["x", "y"] {
            got.extend(b.consume(m, usize::MAX));
        }
        assert!(breaks > 20, "seed {seed}: {breaks} breaks");
        assert_eq!(
            counters(&got, "sx"),
            (0..sent[0]).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(
            counters(&got, "sy"),
            (0..sent[1]).collect::<Vec<_>>(),
            "seed {seed}"
        );
        // Everything taken and one more SYNC: nothing stays charged, nothing was mismatched.
        connect(&mut a, &mut b, now);
        let (mut ab, mut ba) = wires(8 << 10);
        step(&mut a, &mut b, &mut ab, &mut ba, now + MS);
        step(&mut a, &mut b, &mut ab, &mut ba, now + 2 * MS);
        assert_eq!(a.credit.outstanding(b"x") + a.credit.outstanding(b"y"), 0);
        assert_eq!(a.credit.mismatched(), 0, "seed {seed}");
        let bad =
            |e: &SessionEvent| matches!(e, SessionEvent::Down { .. } | SessionEvent::Failed { .. });
        assert!(!a.events.iter().any(bad) && !b.events.iter().any(bad));
    }
}

#[test]
fn an_unread_mailbox_holds_back_only_its_senders() {
    let t0 = Instant::now();
    const W: u64 = 16 << 10;
    let mut a = Node::new(1, W, &[], t0);
    let mut b = Node::new(2, W, &["unread", "read"], t0);
    let (mut ab, mut ba) = wires(16 << 10);
    connect(&mut a, &mut b, t0);
    let (mut now, mut refused, mut k) = (t0, 0, 0u64);
    let mut got = Vec::new();
    for _ in 0..2000 {
        now += MS;
        for _ in 0..10 {
            if !a.send("unread", "u", payload(0, 100), false) {
                refused += 1;
            }
            assert!(
                a.send("read", "r", payload(k, 100), false),
                "never held back"
            );
            k += 1;
        }
        step(&mut a, &mut b, &mut ab, &mut ba, now);
        got.extend(b.consume("read", usize::MAX));
        let held = b.rcredit.held(b"unread");
        assert!(held < W + 200, "the unread mailbox holds {held}");
    }
    assert!(
        refused > 15_000,
        "senders to the unread mailbox were held back"
    );
    assert_eq!(
        counters(&got, "r").len() as u64,
        k,
        "the read mailbox got all"
    );
}

#[test]
fn bulk_progresses_under_a_flood_of_ordinary_messages() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 30, &[], t0);
    let mut b = Node::new(2, 1 << 30, &["flood", "big"], t0);
    // The wire takes 8 KiB per step; ordinary messages offer 20 KiB per step.
    let (mut ab, mut ba) = wires(8 << 10);
    connect(&mut a, &mut b, t0);
    assert!(a.send("big", "bulk", payload(0, 64 << 10), false));
    let mut now = t0;
    let (mut done, mut offered, mut arrived) = (None, 0, 0);
    for t in 0..3000 {
        now += MS;
        for _ in 0..200 {
            offered += a.send("flood", "f", payload(0, 100), false) as usize;
        }
        step(&mut a, &mut b, &mut ab, &mut ba, now);
        arrived += b.consume("flood", usize::MAX).len();
        if !b.consume("big", 1).is_empty() {
            done = Some(t);
            break;
        }
    }
    let t = done.expect("the bulk message starved");
    assert!(
        offered > arrived + 1000,
        "still flooded at step {t}: {offered} offered, {arrived} arrived"
    );
}

#[test]
fn a_peer_that_restarts_mid_message_gets_the_whole_message_once() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 20, &[], t0);
    let mut b = Node::new(2, 1 << 20, &["big"], t0);
    let (mut ab, mut ba) = wires(4 << 10);
    connect(&mut a, &mut b, t0);
    let big = payload(9, 40 << 10);
    assert!(a.send("big", "s", big.clone(), false));
    let mut now = t0;
    for _ in 0..5 {
        now += MS;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
    }
    assert!(!b.reasm.is_empty(), "in pieces when b restarts");
    // b restarts: a new incarnation, with nothing of the message.
    b = Node::new(3, 1 << 20, &["big"], now);
    let (mut ab, mut ba) = wires(4 << 10);
    connect(&mut a, &mut b, now);
    let mut got = Vec::new();
    for _ in 0..1000 {
        now += MS;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
        got.extend(b.consume("big", usize::MAX));
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, big);
    assert!(b.reasm.is_empty());
}

#[test]
fn a_message_given_up_in_pieces_is_dropped_by_the_receiver_and_its_credit_comes_back() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 1 << 20, &[], t0);
    let mut b = Node::new(2, 1 << 20, &["big"], t0);
    let (mut ab, mut ba) = wires(4 << 10);
    connect(&mut a, &mut b, t0);
    assert!(a.send("big", "s", payload(1, 40 << 10), false));
    let mut now = t0;
    for _ in 0..5 {
        now += MS;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
    }
    assert!(!b.reasm.is_empty());
    // a gives the message up (its peer was declared down: what is queued is handed back).
    a.s.handle_disconnect(now, a.id);
    let (failed, in_pieces) = a.bulk.take_failed();
    assert_eq!((failed.len(), in_pieces), (1, true));
    a.s.give_up_pieces();
    connect(&mut a, &mut b, now);
    assert!(b.reasm.is_empty(), "RESUME's keep dropped it");
    let (mut ab, mut ba) = wires(4 << 10);
    for _ in 0..50 {
        now += MS;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
    }
    assert_eq!(b.rcredit.held(b"big"), 0);
    assert_eq!(
        a.credit.outstanding(b"big"),
        0,
        "the SYNC gave the charge back"
    );
}

/// A break after every piece of a message was numbered but before all of them arrived:
/// the receiver keeps what it reassembled (the sender's RESUME says it goes on with that
/// message) and the rest, resent, completes it once.
#[test]
fn a_message_numbered_whole_but_cut_by_a_break_completes_after_the_resume() {
    let t0 = Instant::now();
    let mut a = Node::new(1, 64 << 10, &[], t0);
    let mut b = Node::new(2, 64 << 10, &["x"], t0);
    let (mut ab, mut ba) = wires(64 << 10);
    connect(&mut a, &mut b, t0);
    let mut now = t0 + MS;
    step(&mut a, &mut b, &mut ab, &mut ba, now);
    // Three pieces, all within the bulk budget: all numbered in one round.
    assert!(a.send("x", "s", payload(7, 3 * PIECE - 100), true));
    now += MS;
    a.write(now, &mut ab);
    assert!(a.s.bulk_bytes() > 2 * PIECE, "every piece numbered");
    // Only what comes up to the first piece gets there.
    let mut buf = BytesMut::from(&ab.bytes[..]);
    loop {
        let f = frame::decode(&mut buf, MAX_FRAME_LEN).unwrap().unwrap();
        if matches!(f, Frame::Fragment(_)) {
            break;
        }
    }
    let cut = ab.bytes.len() - buf.len();
    ab.bytes.truncate(cut);
    b.read(now, &mut ab);
    assert_eq!(b.reasm.len(), 1, "the first piece is being reassembled");
    ab.bytes.clear();
    ba.bytes.clear();
    connect(&mut a, &mut b, now);
    assert_eq!(b.reasm.len(), 1, "kept across the break");
    for _ in 0..10 {
        now += MS;
        step(&mut a, &mut b, &mut ab, &mut ba, now);
    }
    let got = b.consume("x", usize::MAX);
    assert_eq!(counters(&got, "s"), vec![7]);
    assert_eq!(got[0].1.len(), 3 * PIECE - 100);
}
