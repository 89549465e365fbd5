//! Tests of the parent module: each rule alone, then a sender and a receiver together over
//! a link that loses grants, with recounts on "reconnect", checked against a model.

use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

#[test]
fn a_sender_is_held_back_at_the_window_and_one_large_message_passes_alone() {
    let mut c = SendCredit::default();
    assert_eq!(c.window(), INITIAL_WINDOW);
    let (x, y) = (n("x"), n("y"));
    assert!(c.try_charge(&x, INITIAL_WINDOW - 1));
    assert!(
        c.try_charge(&x, 10 * INITIAL_WINDOW),
        "below the window: admitted, whatever its size"
    );
    assert!(!c.try_charge(&x, 1), "at or past the window: held back");
    assert_eq!(c.outstanding(b"x"), 11 * INITIAL_WINDOW - 1);
    assert!(c.try_charge(&y, 1), "another mailbox is not affected");
    assert!(!c.grant(b"x", INITIAL_WINDOW), "still past the window");
    assert!(c.grant(b"x", 9 * INITIAL_WINDOW), "reopened");
    assert!(c.admits(b"x"));
}

/// Settled (what lets a connection close for idleness): nothing charged and not given back
/// on the sender; nothing held, owed or a SYNC due on the receiver.
#[test]
fn accounts_are_settled_only_when_everything_came_back() {
    let mut s = SendCredit::default();
    assert!(s.is_settled());
    assert!(s.try_charge(&n("x"), 100));
    assert!(s.try_charge(&n("y"), 5));
    assert!(!s.is_settled());
    s.grant(b"x", 100);
    assert!(!s.is_settled(), "y still charged");
    s.grant(b"y", 5);
    assert!(s.is_settled());

    let mut r = RecvCredit::new(1 << 16, 1 << 16);
    assert!(r.is_settled());
    r.charge(&n("x"), 100).unwrap();
    assert!(!r.is_settled(), "held");
    r.release(b"x", 100);
    assert!(!r.is_settled(), "owed back");
    while r.take_grants().is_some() {}
    assert!(r.is_settled());
    r.request_sync();
    assert!(!r.is_settled(), "a SYNC due");
    r.snapshot(0, 1 << 16);
    assert!(r.is_settled());
}

#[test]
fn grants_beyond_the_charge_are_clamped_and_counted() {
    let mut c = SendCredit::default();
    c.try_charge(&n("x"), 100);
    c.grant(b"x", 150);
    c.grant(b"nobody", 7);
    assert_eq!(c.outstanding(b"x"), 0);
    assert_eq!(c.mismatched(), 57);
}

#[test]
fn a_sync_sets_the_window_and_recounts_every_mailbox() {
    let mut c = SendCredit::default();
    c.try_charge(&n("x"), INITIAL_WINDOW);
    c.try_charge(&n("y"), 5);
    let mut totals = NameMap::default();
    totals.insert(n("x"), 10);
    totals.insert(n("z"), 3);
    assert!(c.sync(1 << 20, 99, &totals), "x reopened");
    assert_eq!(
        (c.window(), c.peer_max_payload(), c.synced()),
        (1 << 20, Some(99), true)
    );
    assert_eq!(
        (
            c.outstanding(b"x"),
            c.outstanding(b"y"),
            c.outstanding(b"z")
        ),
        (10, 0, 3)
    );
}

#[test]
fn idle_sender_accounts_are_bounded() {
    let mut c = SendCredit::default();
    for i in 0..3 * MAX_IDLE_SLOTS {
        let name = n(&format!("m{i}"));
        assert!(c.try_charge(&name, 1));
        c.grant(name.as_bytes(), 1);
    }
    assert!(c.slots.len() <= MAX_IDLE_SLOTS + 1);
    assert_eq!(c.mismatched(), 0);
}

#[test]
fn the_receiver_owes_what_was_taken_and_says_when_it_is_urgent() {
    let mut r = RecvCredit::new(800, 1000);
    let x = n("x");
    r.charge(&x, 300).unwrap();
    assert_eq!(r.held(b"x"), 300);
    assert!(
        !r.release(b"x", 50),
        "below window / 8: goes with the next write"
    );
    assert!(r.release(b"x", 50), "window / 8 owed: urgent");
    assert_eq!(r.grants_waiting(), (true, true));
    let g = r.take_grants().unwrap();
    assert_eq!(g.grants, [(x.clone(), 100)]);
    assert_eq!(r.grants_waiting(), (false, false));
    assert_eq!(r.held(b"x"), 200);
    assert!(r.take_grants().is_none());
}

#[test]
fn a_peer_past_the_limit_broke_the_protocol_and_nothing_is_charged() {
    let mut r = RecvCredit::new(100, 1000);
    assert_eq!(r.limit(), 200 + 1000 + LIMIT_SLACK);
    r.charge(&n("x"), r.limit()).unwrap();
    let e = r.charge(&n("x"), 1).unwrap_err();
    assert!(e.to_string().contains("\"x\""), "{e}");
    assert_eq!(r.held(b"x"), r.limit());
}

#[test]
fn names_without_a_mailbox_are_bounded_and_overflow_asks_for_a_sync() {
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_STRAY {
        assert!(r.dropped(&n(&format!("gone{i}")), 10));
    }
    assert!(!r.wants_sync());
    assert!(r.dropped(&n("one-more"), 10));
    assert!(r.wants_sync());
    assert_eq!(r.accounts.len(), MAX_STRAY);
    let s = r.snapshot(42, 7);
    assert_eq!((s.next, s.window, s.max_payload), (42, 1 << 20, 7));
    assert!(s.held.is_empty() && r.accounts.is_empty() && !r.wants_sync());
}

#[test]
fn a_snapshot_lists_what_is_held_and_forgives_what_was_owed() {
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    r.charge(&n("a"), 10).unwrap();
    r.charge(&n("b"), 20).unwrap();
    r.release(b"b", 20);
    let s = r.snapshot(5, 0);
    assert_eq!(s.held, [(n("a"), 10)]);
    assert!(
        r.take_grants().is_none(),
        "the snapshot covers what was owed"
    );
}

#[test]
fn grants_come_a_frame_at_a_time() {
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_CREDIT_ENTRIES + 5 {
        let m = n(&format!("m{i}"));
        r.charge(&m, 1).unwrap();
        r.release(m.as_bytes(), 1);
    }
    assert_eq!(r.take_grants().unwrap().grants.len(), MAX_CREDIT_ENTRIES);
    assert_eq!(r.take_grants().unwrap().grants.len(), 5);
    assert!(r.take_grants().is_none());
}

/// One step of the model below.
#[derive(Debug, Clone)]
enum Op {
    /// Send to mailbox `0..3` a message of this many bytes (if admitted).
    Send(usize, u64),
    /// Deliver up to this many messages in flight.
    Deliver(usize),
    /// The application takes up to this many messages from mailbox `0..3`.
    Consume(usize, usize),
    /// Write the receiver's grants; `lose` drops them on the way.
    Grants { lose: bool },
    /// The connection breaks: grants in flight are lost; each side's SYNC follows.
    Reconnect,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..400u64).prop_map(|(m, b)| Op::Send(m, b)),
        3 => (1..20usize).prop_map(Op::Deliver),
        3 => (0..3usize, 1..20usize).prop_map(|(m, k)| Op::Consume(m, k)),
        2 => any::<bool>().prop_map(|lose| Op::Grants { lose }),
        1 => Just(Op::Reconnect),
    ]
}

proptest! {
    /// Whatever is lost on the way, a mailbox never holds more than its window plus one
    /// message, and once everything is delivered and taken and a SYNC went round, nothing
    /// is left charged: no sender stalls for good.
    #[test]
    fn credit_bounds_the_receiver_and_never_stalls_the_sender(ops in prop::collection::vec(op(), 1..300)) {
        const W: u64 = 1000;
        let names = [n("a"), n("b"), n("c")];
        let mut snd = SendCredit::default();
        let mut rcv = RecvCredit::new(W, 400);
        // Messages in flight (seq, mailbox, bytes); the receiver's mailboxes; grants in flight.
        let mut wire: VecDeque<(u64, usize, u64)> = VecDeque::new();
        let mut boxes: Vec<VecDeque<u64>> = vec![VecDeque::new(); 3];
        let mut grants: VecDeque<Credit> = VecDeque::new();
        let (mut seq, mut next) = (0u64, 0u64);
        let sync = |snd: &mut SendCredit, rcv: &mut RecvCredit, wire: &VecDeque<(u64, usize, u64)>, next: u64| {
            let s = rcv.snapshot(next, 400);
            let mut totals: NameMap<u64> = NameMap::default();
            for (name, held) in &s.held {
                *totals.entry(name.clone()).or_default() += held;
            }
            for &(q, m, b) in wire {
                if q >= s.next {
                    *totals.entry(names[m].clone()).or_default() += b;
                }
            }
            snd.sync(s.window, s.max_payload, &totals);
        };
        sync(&mut snd, &mut rcv, &wire, next);
        for op in ops {
            match op {
                Op::Send(m, b) => {
                    if snd.try_charge(&names[m], b) {
                        wire.push_back((seq, m, b));
                        seq += 1;
                    }
                }
                Op::Deliver(k) => {
                    for _ in 0..k {
                        let Some((q, m, b)) = wire.pop_front() else { break };
                        prop_assert_eq!(q, next);
                        rcv.charge(&names[m], b).unwrap();
                        boxes[m].push_back(b);
                        next += 1;
                        prop_assert!(rcv.held(names[m].as_bytes()) < W + 400);
                    }
                }
                Op::Consume(m, k) => {
                    for _ in 0..k {
                        let Some(b) = boxes[m].pop_front() else { break };
                        rcv.release(names[m].as_bytes(), b);
                    }
                }
                Op::Grants { lose } => {
                    while let Some(g) = rcv.take_grants() {
                        if !lose {
                            grants.push_back(g);
                        }
                    }
                    while let Some(g) = grants.pop_front() {
                        for (name, b) in g.grants {
                            snd.grant(name.as_bytes(), b);
                        }
                    }
                }
                Op::Reconnect => {
                    grants.clear();
                    sync(&mut snd, &mut rcv, &wire, next);
                }
            }
            prop_assert_eq!(snd.mismatched(), 0);
        }
        // Drain everything, then one more round of SYNC: nothing stays charged.
        while let Some((_, m, b)) = wire.pop_front() {
            rcv.charge(&names[m], b).unwrap();
            boxes[m].push_back(b);
            next += 1;
        }
        for (m, q) in boxes.iter_mut().enumerate() {
            while let Some(b) = q.pop_front() {
                rcv.release(names[m].as_bytes(), b);
            }
        }
        sync(&mut snd, &mut rcv, &wire, next);
        for name in &names {
            prop_assert_eq!(snd.outstanding(name.as_bytes()), 0);
        }
    }
}

#[test]
fn one_lookup_per_send_charges_the_same_as_two() {
    let (a, b) = (Name::from_static("a"), Name::from_static("b"));
    let mut one = SendCredit::default();
    let mut two = SendCredit::default();
    let w = one.window();
    // Alternate mailboxes, new ones included, until a's window closes.
    for k in 0..64u64 {
        let to = if k % 3 == 0 { &b } else { &a };
        let (ok, at) = one.admits_at(to.as_bytes());
        assert_eq!(ok, two.admits(to.as_bytes()));
        if !ok {
            continue;
        }
        let bytes = w / 20 + k;
        one.charge_at(at, to, bytes);
        assert!(two.try_charge(to, bytes));
        assert_eq!(one.outstanding(b"a"), two.outstanding(b"a"));
        assert_eq!(one.outstanding(b"b"), two.outstanding(b"b"));
    }
    assert!(!one.admits(b"a"), "a's window closed");
}

// ---- found by cargo-mutants: rules the tests above did not pin ----

/// The sender: admitted strictly below the window (at it, held back, on both lookups); a
/// grant that leaves the charge exactly at the window reopens nothing; a SYNC that opens
/// nothing says so; `synced` only after one; pruning idle accounts keeps busy ones.
#[test]
fn the_sender_window_is_strict_and_recounts_report_what_opened() {
    let mut c = SendCredit::default();
    assert!(!c.synced());
    let x = n("x");
    c.try_charge(&x, INITIAL_WINDOW);
    assert!(!c.admits(b"x"), "exactly at the window: held back");
    assert_eq!(c.admits_at(b"x"), (false, Some(c.last)));
    assert_eq!(c.admits_at(b"new"), (true, None));
    assert!(!c.try_charge(&x, 1), "refused at the window");
    c.charge_at(None, &x, INITIAL_WINDOW - 1);
    assert_eq!(c.outstanding(b"x"), 2 * INITIAL_WINDOW - 1);
    assert!(
        !c.grant(b"x", INITIAL_WINDOW - 1),
        "back at the window: still closed"
    );
    assert!(c.grant(b"x", 1), "one below: open");
    // A SYNC that opens nothing returns false; one that opens a closed mailbox true.
    let mut totals = NameMap::default();
    totals.insert(n("x"), 5);
    assert!(!c.sync(INITIAL_WINDOW, 1, &totals), "nothing was closed");
    assert!(c.synced());
    c.try_charge(&x, INITIAL_WINDOW);
    assert!(!c.admits(b"x"));
    let mut totals = NameMap::default();
    totals.insert(n("x"), INITIAL_WINDOW);
    assert!(
        !c.sync(INITIAL_WINDOW, 1, &totals),
        "recounted to the window: still closed"
    );
    totals.insert(n("x"), INITIAL_WINDOW - 1);
    assert!(
        c.sync(INITIAL_WINDOW, 1, &totals),
        "recounted below: opened"
    );
    // Idle accounts pruned; one with bytes outstanding kept, with its charge.
    let mut c = SendCredit::default();
    c.try_charge(&n("busy"), 100);
    for i in 0..2 * MAX_IDLE_SLOTS {
        let name = n(&format!("m{i}"));
        c.try_charge(&name, 1);
        c.grant(name.as_bytes(), 1);
    }
    assert_eq!(c.outstanding(b"busy"), 100);
    assert!(c.slots.len() <= MAX_IDLE_SLOTS + 1);
}

/// The receiver: its window and limit as configured; a charge taken back; a SYNC asked for;
/// a snapshot bounded to one frame's entries; urgency kept while grants remain.
#[test]
fn the_receiver_accounts_limits_and_frames() {
    let r = RecvCredit::new(1000, 50);
    assert_eq!(r.window(), 1000);
    assert_eq!(r.limit(), 2000 + 50 + (1 << 20));
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    let x = n("x");
    r.charge(&x, 300).unwrap();
    r.uncharge(b"x", 100);
    assert_eq!(r.held(b"x"), 200);
    assert!(
        r.take_grants().is_none(),
        "nothing owed for a charge taken back"
    );
    assert!(!r.wants_sync());
    r.request_sync();
    assert!(r.wants_sync());
    // More held mailboxes than one frame lists: the snapshot lists one frame's worth.
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_CREDIT_ENTRIES + 3 {
        r.charge(&n(&format!("h{i}")), 1).unwrap();
    }
    assert_eq!(r.snapshot(0, 0).held.len(), MAX_CREDIT_ENTRIES);
    // Urgent grants for more mailboxes than a frame: still urgent after the first frame.
    let mut r = RecvCredit::new(8, 1 << 20);
    for i in 0..MAX_CREDIT_ENTRIES + 3 {
        let m = n(&format!("u{i}"));
        r.charge(&m, 8).unwrap();
        r.release(m.as_bytes(), 8);
    }
    assert_eq!(r.grants_waiting(), (true, true));
    r.take_grants().unwrap();
    assert_eq!(r.grants_waiting(), (true, true), "the rest is as urgent");
    r.take_grants().unwrap();
    assert_eq!(r.grants_waiting(), (false, false));
}

/// Names without a mailbox are counted as such across tidying: 63 of them, a tidy, and two
/// more reach the bound of 64 (the second asks for a SYNC). Names that turn out to be
/// mailboxes stop counting, and real mailboxes never count.
#[test]
fn stray_names_are_counted_exactly_across_tidying() {
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_STRAY - 1 {
        r.dropped(&n(&format!("gone{i}")), 10);
    }
    r.uncharge(b"nothing", 0); // tidies
    assert_eq!(r.strays, MAX_STRAY - 1);
    r.dropped(&n("one"), 10);
    assert!(!r.wants_sync());
    r.dropped(&n("two"), 10);
    assert!(r.wants_sync(), "the 65th name without a mailbox");
    // Strays that become mailboxes (a charge arrives) stop counting.
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_STRAY {
        r.dropped(&n(&format!("s{i}")), 10);
    }
    for i in 0..MAX_STRAY {
        r.charge(&n(&format!("s{i}")), 1).unwrap();
    }
    assert_eq!(r.strays, 0);
    r.dropped(&n("new"), 10);
    assert!(!r.wants_sync(), "one stray, far below the bound");
    // Real mailboxes holding bytes are not strays, before or after a tidy.
    let mut r = RecvCredit::new(1 << 20, 1 << 20);
    for i in 0..MAX_STRAY {
        r.charge(&n(&format!("real{i}")), 1).unwrap();
    }
    r.uncharge(b"nothing", 0);
    assert_eq!(r.strays, 0);
}
