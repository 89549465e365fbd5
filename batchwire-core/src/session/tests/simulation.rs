//! Two sessions over a simulated connection, on a fake clock.

use super::*;

// ---- a two-session simulation -----------------------------------------------------------

/// One side of a simulated connection: its session, the application's messages still to
/// send, and what it received.
struct Side {
    s: Session,
    id: ConnId,
    to_send: std::ops::Range<u64>,
    got: Vec<u64>,
    /// Bytes read from the wire and not yet a whole frame.
    buf: BytesMut,
    /// The application does not consume: the reader waits (and reads nothing).
    paused: bool,
    events: Vec<SessionEvent>,
}

/// A TCP connection's buffers: at most `cap` bytes in flight each way.
struct Wire {
    bytes: Vec<u8>,
    cap: usize,
}

impl Side {
    fn new(cfg: SessionConfig, t0: Instant, n: u64) -> Side {
        Side {
            s: Session::new(cfg, t0),
            id: ConnId::new(0),
            to_send: 0..n,
            got: Vec::new(),
            buf: BytesMut::new(),
            paused: false,
            events: Vec::new(),
        }
    }

    /// The writer: control first, then what the window holds, then more from the
    /// application while the window has room; only as much as the wire takes.
    fn write(&mut self, now: Instant, w: &mut Wire) {
        if w.bytes.len() >= w.cap {
            return; // blocked in write(): nothing goes out, control included
        }
        while let Some(f) = self.s.poll_control(now, self.id) {
            f.encode(&mut w.bytes);
            self.s.note_sent(now, self.id);
        }
        if !self.s.window_full() && !self.to_send.is_empty() {
            let n = (self.to_send.end - self.to_send.start).min(20);
            let start = self.to_send.start;
            hold(&mut self.s, start..start + n);
            self.to_send.start += n;
        }
        let u = self.s.unwritten(self.id);
        let g = u.generation;
        // Whole chunks (all the slices of one) until the wire is full.
        let segments = u.segments();
        let mut written = None;
        for (i, (c, end)) in segments.iter().enumerate() {
            let continues = i > 0 && segments[i - 1].1 == *end;
            if w.bytes.len() >= w.cap && !continues {
                break;
            }
            w.bytes.extend_from_slice(c);
            written = Some(*end);
        }
        if let Some(end) = written {
            self.s.mark_written(now, self.id, g, end);
        }
    }

    /// The reader: everything on the wire, unless the application does not consume.
    fn read(&mut self, now: Instant, w: &mut Wire) {
        if self.paused || w.bytes.is_empty() {
            return;
        }
        self.buf.extend_from_slice(&w.bytes);
        w.bytes.clear();
        self.s.handle_heard(now, self.id);
        while let Some(f) = frame::decode(&mut self.buf, 1 << 20).unwrap() {
            match f {
                Frame::Messages(l) => {
                    let d = self
                        .s
                        .begin_delivery(self.id, l.first_seq, l.len() as u32)
                        .unwrap()
                        .unwrap();
                    for m in l.skip(d.skip).iter() {
                        self.got
                            .push(u64::from_le_bytes(m.payload[..8].try_into().unwrap()));
                    }
                    self.s.end_delivery(now, d, d.end, l.body().len());
                }
                Frame::Ack(n) => {
                    self.s.handle_ack(now, self.id, n).unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        self.events
            .extend(std::iter::from_fn(|| self.s.poll_event()));
    }
}

/// Run `a` and `b` against each other for `span` of simulated time in 1 ms steps;
/// `pause_b` says when b's application does not consume.
fn simulate(
    a: &mut Side,
    b: &mut Side,
    span: Duration,
    cap: usize,
    pause_b: impl Fn(Duration) -> bool,
) {
    let t0 = Instant::now();
    let (ia, ib) = connect(&mut a.s, &mut b.s, t0);
    (a.id, b.id) = (ia, ib);
    let (mut ab, mut ba) = (
        Wire {
            bytes: Vec::new(),
            cap,
        },
        Wire {
            bytes: Vec::new(),
            cap,
        },
    );
    let mut now = t0;
    while now < t0 + span {
        now += MS;
        let paused = pause_b(now - t0);
        if paused != b.paused {
            b.paused = paused;
            b.s.set_paused(now, paused);
        }
        a.tick(now);
        b.tick(now);
        a.write(now, &mut ab);
        b.write(now, &mut ba);
        b.read(now, &mut ab);
        a.read(now, &mut ba);
    }
}

#[test]
fn duplex_saturation_with_a_small_window_delivers_everything_and_declares_nobody_down() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.unacked_bytes = 1024;
    let n = 20_000;
    let (mut a, mut b) = (Side::new(c.clone(), t0, n), Side::new(c, t0, n));
    simulate(&mut a, &mut b, Duration::from_secs(20), 4096, |_| false);
    let want: Vec<u64> = (0..n).collect();
    assert_eq!(b.got, want, "a -> b");
    assert_eq!(a.got, want, "b -> a");
    for side in [&a, &b] {
        assert!(
            !side
                .events
                .iter()
                .any(|e| matches!(e, SessionEvent::Down { .. } | SessionEvent::Failed { .. })),
            "{:?}",
            side.events
        );
    }
}

#[test]
fn a_consumer_that_stops_for_three_timeouts_is_alive_and_then_gets_everything() {
    let t0 = Instant::now();
    let c = cfg();
    let n = 5_000;
    let (mut a, mut b) = (Side::new(c.clone(), t0, n), Side::new(c.clone(), t0, 0));
    let stop = 3 * c.peer_timeout;
    // b's application stops consuming from 100 ms to 100 ms + 3 x peer_timeout.
    simulate(&mut a, &mut b, Duration::from_secs(6), 4096, |t| {
        t >= 100 * MS && t < 100 * MS + stop
    });
    assert!(!a.events.iter().any(is_down), "{:?}", a.events);
    assert!(!b.events.iter().any(is_down), "{:?}", b.events);
    assert_eq!(b.got, (0..n).collect::<Vec<_>>());
}

#[test]
fn a_peer_that_stops_reading_and_talking_is_declared_down_others_are_not() {
    // One node (x) with two peers: y stops entirely (never reads, never heartbeats), z is
    // fine. x declares y down after the timeout and keeps z up: sessions share nothing.
    let t0 = Instant::now();
    let c = cfg();
    let (mut xy, mut y) = (Side::new(c.clone(), t0, 1000), Side::new(c.clone(), t0, 0));
    let (mut xz, mut z) = (Side::new(c.clone(), t0, 1000), Side::new(c.clone(), t0, 0));
    let (ia, ib) = connect(&mut xy.s, &mut y.s, t0);
    (xy.id, y.id) = (ia, ib);
    let (ia, ib) = connect(&mut xz.s, &mut z.s, t0);
    (xz.id, z.id) = (ia, ib);
    let mut wires: Vec<Wire> = (0..4)
        .map(|_| Wire {
            bytes: Vec::new(),
            cap: 4096,
        })
        .collect();
    let mut now = t0;
    while now < t0 + Duration::from_secs(3) {
        now += MS;
        xy.tick(now);
        xz.tick(now);
        z.tick(now);
        let [xy_w, yx_w, xz_w, zx_w] = &mut wires[..] else {
            unreachable!()
        };
        let _ = yx_w; // y is gone: it writes nothing and reads nothing
        xy.write(now, xy_w);
        xz.write(now, xz_w);
        z.write(now, zx_w);
        z.read(now, xz_w);
        xz.read(now, zx_w);
    }
    assert!(xy.events.iter().any(is_down));
    assert!(!xz.events.iter().any(is_down), "{:?}", xz.events);
    assert_eq!(z.got, (0..1000).collect::<Vec<_>>());
}

#[test]
fn bulk_gets_the_stream_budget_once_it_has_had_the_connection_to_itself() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.bulk_inflight = 1000;
    c.bulk_stream = 4000;
    let mut s = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let payload = Bytes::from(vec![7u8; 100 * 500]);
    let (mut offset, mut msg, mut held) = (0, None, 0u64);
    // Hold the next piece of 500 bytes of one large message.
    let mut piece = |s: &mut Session, held: &mut u64| {
        let p = Piece {
            serial: 1,
            to: Name::from_static("to"),
            from: Name::from_static("from"),
            payload: payload.clone(),
            offset,
            len: 500,
            id: msg,
        };
        msg = Some(s.hold_piece(&p).unwrap());
        offset += 500;
        *held += 1;
    };
    // Write and acknowledge everything held.
    let ack = |s: &mut Session, held: u64| {
        let u = s.unwritten(id);
        if let Some(end) = u.ends.last() {
            s.mark_written(t0, id, u.generation, *end);
        }
        s.handle_ack(t0, id, held).unwrap();
        assert_eq!(s.bulk_bytes(), 0);
    };
    // At first the small budget: two pieces fill it.
    piece(&mut s, &mut held);
    assert!(s.bulk_room());
    piece(&mut s, &mut held);
    assert!(!s.bulk_room(), "1000 bytes in flight, budget 1000");
    ack(&mut s, held);
    // 4000 bytes of pieces with no ordinary message between them: the stream budget.
    for _ in 0..6 {
        assert_eq!(s.bulk_budget(), 1000);
        piece(&mut s, &mut held);
        ack(&mut s, held);
    }
    assert_eq!(s.bulk_budget(), 4000);
    for i in 0..8 {
        assert!(s.bulk_room(), "{i} pieces in flight, budget 4000");
        piece(&mut s, &mut held);
    }
    assert!(!s.bulk_room(), "4000 bytes in flight");
    // An ordinary message: the small budget at once, for what is held next.
    hold(&mut s, 0..1);
    held += 1;
    assert_eq!(s.bulk_budget(), 1000);
    assert!(!s.bulk_room());
    ack(&mut s, held);
    assert!(s.bulk_room());
    piece(&mut s, &mut held);
    piece(&mut s, &mut held);
    assert!(!s.bulk_room(), "1000 bytes in flight, budget 1000 again");
    // A stream budget at most the small one is the small one.
    let mut c = cfg();
    c.bulk_inflight = 1000;
    c.bulk_stream = 10;
    let s = Session::new(c, t0);
    assert_eq!(s.bulk_budget(), 1000);
}

/// The poisoned-link attack: an impostor logged in under a's name and incarnation made b
/// take 5 messages a never sent. a cannot honour b's RESUME ("everything below 5 arrived",
/// but a sent 3): instead of refusing it forever, both ends reset (a's pending messages
/// fail, reported), and the next connection numbers from 0 both ways.
#[test]
fn a_session_that_cannot_be_resumed_is_reset_on_both_ends_and_goes_on() {
    let t0 = Instant::now();
    let mut a = Session::new(cfg(), t0);
    let mut b = Session::new(cfg(), t0);
    let (_, ib) = connect(&mut a, &mut b, t0);
    hold(&mut a, 0..3);
    let d = b.begin_delivery(ib, 0, 5).unwrap().unwrap();
    b.end_delivery(t0 + MS, d, 5, 50);
    events(&mut a);
    events(&mut b);
    // Reconnect: b's RESUME claims 5 arrived.
    let t1 = t0 + 2 * MS;
    let (ia, ra) = a.handle_connect(t1, 2);
    let (ib, rb) = b.handle_connect(t1, 1);
    assert_eq!(rb.next, 5);
    b.handle_resume(t1, ib, ra).unwrap();
    assert!(a.handle_resume(t1, ia, rb).is_err());
    // Once or twice may be a forger's value on a connection of its own; the third time
    // in a row, the numbering really disagrees.
    assert!(!a.is_unresumable());
    for _ in 0..2 {
        let (ia, _) = a.handle_connect(t1, 2);
        assert!(a.handle_resume(t1, ia, rb).is_err());
    }
    assert!(a.is_unresumable());
    a.handle_reset(t1);
    assert!(!a.is_unresumable());
    let ev = events(&mut a);
    assert!(
        ev.iter().any(|e| matches!(e, SessionEvent::Failed { messages, reason: FailReason::Reset } if messages.len() == 3)),
        "{ev:?}"
    );
    assert!(ev.contains(&SessionEvent::Reset));
    assert_eq!(a.resets(), 1);
    // b learns it (REFUSE Reset) and resets too: b's current connection goes with it.
    b.handle_reset(t1);
    let ev = events(&mut b);
    assert!(ev.contains(&SessionEvent::Reset), "{ev:?}");
    assert!(ev.contains(&SessionEvent::Close { conn: ib }), "{ev:?}");
    // The next connection resumes from 0 both ways, and a's new messages arrive.
    let t2 = t1 + MS;
    let (ia, ra) = a.handle_connect(t2, 2);
    let (ib, rb) = b.handle_connect(t2, 1);
    assert_eq!((ra.next, rb.next), (0, 0));
    a.handle_resume(t2, ia, rb).unwrap();
    b.handle_resume(t2, ib, ra).unwrap();
    hold(&mut a, 0..2);
    let d = b.begin_delivery(ib, 0, 2).unwrap().unwrap();
    assert_eq!(d.skip, 0, "nothing taken for a duplicate");
}
