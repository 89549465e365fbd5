//! The scenarios: sizes and classes mixed, unread mailboxes, breaks, restarts, credit.

use super::*;
use crate::bundler::BundlerKind;
use crate::frame::{self, Frame};
use bytes::BytesMut;

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
        random_breaks(seed, BundlerKind::Natural);
    }
}

/// The same with every bundler draining the machine's ordinary queue (one seed each).
#[test]
fn exactly_once_in_order_across_random_breaks_with_every_bundler() {
    for (seed, kind) in [
        BundlerKind::None,
        BundlerKind::PerDestination,
        BundlerKind::TransferQueue,
        BundlerKind::Linger,
    ]
    .into_iter()
    .enumerate()
    {
        random_breaks(10 + seed as u64, kind);
    }
}

fn random_breaks(seed: u64, kind: BundlerKind) {
    {
        let t0 = Instant::now();
        let mut a = Node::with_bundler(1, 64 << 10, &[], t0, kind);
        let mut b = Node::with_bundler(2, 64 << 10, &["x", "y"], t0, kind);
        let (mut ab, mut ba) = wires(8 << 10);
        connect(&mut a, &mut b, t0);
        let mut rng = Rng(seed);
        let mut sent = [0u64; 2];
        let mut got: Vec<(String, Bytes)> = Vec::new();
        let mut now = t0;
        let mut breaks = 0;
        for t in 0..40_000 {
            // Sending stops at 3000 steps; then until everything arrived (`none` writes one
            // message a step).
            if t > 4000 && got.len() as u64 == sent[0] + sent[1] {
                break;
            }
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
        let kind = format!("{kind:?}");
        assert_eq!(
            counters(&got, "sx"),
            (0..sent[0]).collect::<Vec<_>>(),
            "seed {seed}, {kind}"
        );
        assert_eq!(
            counters(&got, "sy"),
            (0..sent[1]).collect::<Vec<_>>(),
            "seed {seed}, {kind}"
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
    a.m.handle_disconnect(now);
    let (failed, in_pieces) = a.m.fail_queued();
    assert_eq!((failed.len(), in_pieces), (1, true));
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
