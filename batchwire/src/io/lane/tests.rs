use super::*;
use batchwire_core::bundler::{BundlerConfig, BundlerKind};
use std::sync::Arc;

pub(crate) fn cfg(capacity: usize) -> LaneCfg {
    LaneCfg {
        capacity,
        frame_bytes: 64 << 10,
        piece_bytes: 64 << 10,
        by_reference: 8 << 10,
        charges_credit: true,
        idle: IdleStrategy::default(),
    }
}

fn lane(kind: BundlerKind, cap: usize) -> (Lane, Box<dyn Bundler>) {
    let b = BundlerConfig {
        kind,
        ..Default::default()
    }
    .build();
    (Lane::new(cfg(cap), b.as_ref()), b)
}

/// The `n`th connection id a session hands out (1, 2, ...).
fn conn_id(n: u64) -> ConnId {
    use batchwire_core::session::{Session, SessionConfig};
    let now = Instant::now();
    let mut s = Session::new(SessionConfig::default(), now);
    for _ in 1..n {
        let _ = s.handle_connect(now, 1);
    }
    s.handle_connect(now, 1).0
}

/// The peer's SYNC announced a window too large to matter.
fn open_credit(l: &Lane) {
    l.sync_credit(
        conn_id(1),
        None,
        0,
        1 << 40,
        1 << 40,
        &mut NameMap::default(),
    );
}

fn push_to(l: &Lane, to: &'static str, p: Bytes, bulk: bool, block: bool) -> Result<(), PushError> {
    l.push(
        Outgoing {
            dest: 0,
            to: &Name::from_static(to),
            from: &Name::from_static("f"),
            payload: &p,
            bulk,
        },
        block,
    )
}

/// Empty the outbox (as if the writer had taken it; nothing counted).
fn drop_queued(l: &Lane) {
    l.lock()
        .outbox
        .take(usize::MAX, usize::MAX, &mut Batch::default(), None);
}

/// Push message `n` to mailbox "to" as a sender that may write through.
fn push_direct(l: &Lane, n: u8, may_write: bool) -> Pushed {
    let p = Bytes::from(vec![n; 10]);
    l.push_direct(
        Outgoing {
            dest: 0,
            to: &Name::from_static("to"),
            from: &Name::from_static("f"),
            payload: &p,
            bulk: false,
        },
        false,
        || may_write,
    )
    .unwrap()
}

#[test]
fn a_lone_message_for_a_parked_writer_goes_to_its_sender_unless_a_stream_is_on() {
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 20);
    open_credit(&l);
    let park = |l: &Lane, last_wake: Option<Instant>| {
        let mut g = l.lock();
        g.writer_waiting = true;
        g.last_wake = last_wake;
        g.through_ok = true;
        g.probe = 0;
    };
    // No writer at all (none started yet, or it rests): the sender takes it.
    assert_eq!(push_direct(&l, 9, true), Pushed::Direct);
    let b9 = l.take_direct();
    assert_eq!(b9.messages(), 1);
    l.finish_direct(b9);
    // Writer awake: queued, whatever else holds.
    l.set_writer_absent(false);
    assert_eq!(push_direct(&l, 0, true), Pushed::Queued);
    drop_queued(&l);
    // Parked, the lane quiet: the sender takes it, and the writer takes nothing until
    // the sender is done (a later message must not overtake it).
    park(&l, None);
    assert_eq!(push_direct(&l, 1, true), Pushed::Direct);
    let mine = l.take_direct();
    assert_eq!(mine.messages(), 1);
    assert_eq!(push_direct(&l, 2, true), Pushed::Queued, "one at a time");
    l.lock().writer_waiting = false;
    l.poke();
    let epoch = l.epoch();
    let writer = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut got = Batch::default();
            let next = l.next_batch(b.as_mut(), epoch, &mut got, true, None);
            (next, got.messages())
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!w.is_finished(), "the writer waits for the sender's batch");
        l.finish_direct(mine);
        w.join().unwrap()
    });
    assert_eq!(writer, (Next::Batch(FlushReason::Drained), 1));
    // Parked, but woken less than WRITE_THROUGH_GAP ago (a stream): left to the writer.
    // (The wake-up is put a second ahead: the gap is 50 us, and a test thread descheduled
    // between setting it and the push, as on a loaded CI machine, saw the lane quiet.)
    park(&l, Some(Instant::now() + Duration::from_secs(1)));
    assert_eq!(push_direct(&l, 3, true), Pushed::Queued);
    // Parked and quiet, but the window is full (`may_write` false): the writer.
    drop_queued(&l);
    park(&l, None);
    assert_eq!(push_direct(&l, 4, false), Pushed::Queued);
    // A bundler that waits (linger) never hands a message to its sender.
    let (l, _b) = lane(BundlerKind::Linger, 1 << 20);
    open_credit(&l);
    park(&l, None);
    assert_eq!(push_direct(&l, 5, true), Pushed::Queued);
}

#[test]
fn senders_stop_writing_through_when_the_writer_finds_company_and_probe_for_it() {
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 20);
    open_credit(&l);
    let park = |l: &Lane| {
        let mut g = l.lock();
        g.writer_waiting = true;
        g.last_wake = None;
    };
    // The writer takes `n` messages (as woken for them).
    let writer_takes = |l: &Lane, b: &mut Box<dyn Bundler>, n: u8| {
        for i in 0..n {
            push_direct(l, i, false);
        }
        let mut got = Batch::default();
        l.lock().writer_waiting = false;
        let next = l.next_batch(b.as_mut(), l.epoch(), &mut got, true, None);
        assert_eq!(
            (next, got.messages()),
            (Next::Batch(FlushReason::Drained), n as u64)
        );
    };
    // Company: a take of two messages stops write-through...
    writer_takes(&l, &mut b, 2);
    park(&l);
    assert_eq!(push_direct(&l, 0, true), Pushed::Queued);
    drop_queued(&l);
    // ...until the writer has taken single messages twice in a row.
    writer_takes(&l, &mut b, 1);
    writer_takes(&l, &mut b, 1);
    park(&l);
    assert_eq!(push_direct(&l, 1, true), Pushed::Direct);
    l.finish_direct(l.take_direct());
    // While writing through, every THROUGH_PROBE-th wake goes to the writer.
    let mut kinds = Vec::new();
    for i in 0..2 * THROUGH_PROBE as u8 {
        park(&l);
        let k = push_direct(&l, i, true);
        if k == Pushed::Direct {
            l.finish_direct(l.take_direct());
        } else {
            // The writer takes it (and, a single message, keeps write-through on).
            l.lock().writer_waiting = false;
            let mut got = Batch::default();
            l.next_batch(b.as_mut(), l.epoch(), &mut got, true, None);
            assert_eq!(got.messages(), 1);
        }
        kinds.push(k);
    }
    assert_eq!(
        kinds.iter().filter(|k| **k == Pushed::Queued).count(),
        2,
        "{kinds:?}"
    );
}

fn push(l: &Lane, n: u8, block: bool) -> Result<(), PushError> {
    push_to(l, "to", Bytes::from(vec![n; 10]), false, block)
}

#[test]
fn bounded_in_bytes_with_try_push_full() {
    let (l, _) = lane(BundlerKind::Natural, 40);
    // 17 bytes of frame header, then 19 per message: admitted while below 40.
    push(&l, 1, false).unwrap();
    push(&l, 2, false).unwrap();
    assert_eq!(push(&l, 3, false), Err(PushError::Full));
    assert_eq!(l.high_water.load(Ordering::Relaxed), 55);
    assert_eq!(
        l.credit_stalls.load(Ordering::Relaxed),
        0,
        "room, not credit"
    );
}

#[test]
fn used_up_credit_holds_back_only_its_mailbox() {
    let (l, _) = lane(BundlerKind::Natural, 1 << 30);
    let window = l.credit_window();
    let big = Bytes::from(vec![0; 1000]);
    let mut n = 0;
    while push_to(&l, "slow", big.clone(), false, false).is_ok() {
        n += 1;
    }
    assert!(n as u64 >= window / 1024, "{n} admitted");
    assert_eq!(l.credit_stalls.load(Ordering::Relaxed), 1);
    push_to(&l, "other", big.clone(), false, false).unwrap();
    // A grant reopens it, and wakes a sender waiting for it.
    let l = Arc::new(l);
    let l2 = l.clone();
    let t = std::thread::spawn(move || push_to(&l2, "slow", Bytes::from_static(b"x"), false, true));
    std::thread::sleep(Duration::from_millis(20));
    l.grant(conn_id(1), &[(Name::from_static("slow"), window)]);
    assert_eq!(t.join().unwrap(), Ok(()));
}

/// Grants and SYNCs that came on a connection older than the one whose SYNC was
/// recounted last are stale: the peer took those grants before the snapshot that SYNC
/// carried, so applying them after its recount would give the same bytes back twice.
/// (A reader that checked its connection was current, then was preempted while the
/// successor's SYNC was recounted, did just that under load.)
#[test]
fn grants_and_syncs_from_a_replaced_connection_after_a_recount_are_ignored() {
    let (l, _) = lane(BundlerKind::Natural, 1 << 30);
    let (c1, c2) = (conn_id(1), conn_id(2));
    let to = Name::from_static("m");
    let sync = |on, held: u64| {
        let mut totals = NameMap::default();
        totals.insert(to.clone(), held);
        assert!(l.sync_credit(on, None, 0, 1 << 20, 1 << 20, &mut totals));
    };
    let outstanding = || l.lock().credit.outstanding(to.as_bytes());
    sync(c1, 5000);
    // On the current connection before the recount: applied (the recount then sets the
    // figure anew).
    l.grant(c1, &[(to.clone(), 1000)]);
    assert_eq!(outstanding(), 4000);
    sync(c2, 3000);
    assert_eq!(outstanding(), 3000);
    // Late, from the replaced connection: ignored, not subtracted again.
    l.grant(c1, &[(to.clone(), 1000)]);
    sync(c1, 100);
    assert_eq!(outstanding(), 3000);
    assert_eq!(l.credit_mismatched(), 0);
    // On the current one: applied.
    assert_eq!(l.grant(c2, &[(to.clone(), 1000)]), 0);
    assert_eq!(outstanding(), 2000);
    // Beyond the charge: clamped, and the excess said (the reader logs it) and counted.
    assert_eq!(l.grant(c2, &[(to.clone(), 5000)]), 3000);
    assert_eq!((outstanding(), l.credit_mismatched()), (0, 3000));
}

/// Senders blocked on credit, all for one mailbox (woken one at a time, each passing
/// the turn on) or for two (all woken at each change): every one of them gets through
/// as credit comes back. A lost wake-up shows as a sender still blocked after 20 s.
#[test]
fn senders_blocked_on_credit_are_all_woken_as_it_comes_back() {
    for b_senders in [0, 4] {
        let (l, _) = lane(BundlerKind::Natural, 1 << 30);
        let l = Arc::new(l);
        let window = l.credit_window();
        let big = Bytes::from(vec![0; 1000]);
        for to in ["a", "b"] {
            while push_to(&l, to, big.clone(), false, false).is_ok() {}
        }
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let (l, big, done) = (l.clone(), big.clone(), done.clone());
                std::thread::spawn(move || {
                    let to = if i < 16 - b_senders { "a" } else { "b" };
                    for _ in 0..20 {
                        push_to(&l, to, big.clone(), false, true).unwrap();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::SeqCst) < 16 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            // A quarter window back to each mailbox: only some senders can go.
            for to in ["a", "b"] {
                l.grant(conn_id(1), &[(Name::from_static(to), window / 4)]);
            }
        }
        assert_eq!(done.load(Ordering::SeqCst), 16, "senders still blocked");
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn payloads_from_the_reference_size_on_reach_the_batch_uncopied_and_the_rest_are_copied() {
    for by_reference in [8 << 10, usize::MAX] {
        let b = BundlerConfig::default().build();
        let l = Lane::new(
            LaneCfg {
                by_reference,
                ..cfg(1 << 20)
            },
            b.as_ref(),
        );
        open_credit(&l);
        let big = Bytes::from(vec![7u8; 10_000]);
        push_to(&l, "m", Bytes::from_static(b"small"), false, false).unwrap();
        push_to(&l, "m", big.clone(), false, false).unwrap();
        assert!(l.lock().outbox.bytes() > 10_000, "the queue counts it");
        let mut batch = Batch::default();
        let mut b = b;
        l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None);
        assert_eq!(batch.messages(), 2);
        let msgs = batch.decode_messages();
        assert_eq!(msgs[1].payload, big);
        if by_reference == usize::MAX {
            assert!(batch.refs.is_empty(), "copied");
        } else {
            assert_eq!(batch.refs.len(), 1);
            assert_eq!(batch.refs[0].payload.as_ptr(), big.as_ptr(), "not copied");
            assert!(batch.buf.len() < 100, "names and lengths only");
        }
    }
}

#[test]
fn large_and_bulk_messages_go_in_pieces_and_their_pair_follows_them() {
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 30);
    open_credit(&l);
    push_to(&l, "m", Bytes::from(vec![1; 200 << 10]), false, false).unwrap();
    push_to(&l, "m", Bytes::from_static(b"after"), false, false).unwrap();
    push_to(&l, "other", Bytes::from_static(b"ordinary"), false, false).unwrap();
    push_to(&l, "m2", Bytes::from_static(b"small bulk"), true, false).unwrap();
    assert_eq!(l.queued(), 4);
    let mut batch = Batch::default();
    assert_eq!(
        l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None),
        Next::Batch(FlushReason::Drained)
    );
    assert_eq!(batch.messages(), 1, "only the ordinary one");
    let mut pieces = Vec::new();
    while let Some(p) = l.next_piece() {
        pieces.push((p.to.to_string(), p.offset, p.len));
        l.advance_piece(p.serial, 0);
    }
    assert_eq!(
        pieces.len(),
        6,
        "four pieces of 64 KiB and two small: {pieces:?}"
    );
    assert_eq!(
        pieces[4],
        ("m".to_string(), 0, 5),
        "the pair's next message, after"
    );
    assert_eq!(pieces[5].0, "m2");
    assert!(l.is_empty());
}

#[test]
fn while_a_piece_is_ready_a_batch_is_capped_and_a_parked_writer_wakes_for_it() {
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 30);
    open_credit(&l);
    for _ in 0..10_000 {
        push_to(&l, "m", Bytes::from(vec![0; 100]), false, false).unwrap();
    }
    push_to(&l, "m2", Bytes::from(vec![0; 10]), true, false).unwrap();
    let mut batch = Batch::default();
    l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None);
    assert_eq!(
        batch.messages(),
        10_000,
        "the piece waits for what was queued before it"
    );
    assert!(l.bulk_ready());
    for _ in 0..10_000 {
        push_to(&l, "m", Bytes::from(vec![0; 100]), false, false).unwrap();
    }
    l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None);
    assert!(
        batch.buf.len() <= ORDINARY_WEIGHT * (64 << 10) + (64 << 10),
        "capped"
    );
    // Nothing ordinary left to take, a piece ready and room: the writer does not park.
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 30);
    push_to(&l, "m2", Bytes::from(vec![0; 10]), true, false).unwrap();
    assert_eq!(
        l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None),
        Next::Wake
    );
}

#[test]
fn natural_takes_everything_none_takes_one() {
    let (l, mut none) = lane(BundlerKind::None, 1 << 20);
    for i in 0..5 {
        push(&l, i, false).unwrap();
    }
    let mut b = Batch::default();
    assert_eq!(
        l.next_batch(none.as_mut(), 0, &mut b, true, None),
        Next::Batch(FlushReason::Single)
    );
    assert_eq!(b.messages(), 1);
    let mut nat = BundlerConfig::default().build();
    assert_eq!(
        l.next_batch(nat.as_mut(), 0, &mut b, true, None),
        Next::Batch(FlushReason::Drained)
    );
    assert_eq!(b.messages(), 4);
    l.close();
    assert_eq!(
        l.next_batch(nat.as_mut(), 0, &mut b, true, None),
        Next::Wake,
        "closing wakes a consumer waiting on an older epoch"
    );
    assert_eq!(
        l.next_batch(nat.as_mut(), l.epoch(), &mut b, true, None),
        Next::Drained
    );
    assert_eq!(push(&l, 9, true), Err(PushError::Closed));
}

#[test]
fn blocked_sender_resumes_when_writer_drains() {
    let (l, mut b) = lane(BundlerKind::Natural, 20);
    let l = Arc::new(l);
    push(&l, 1, false).unwrap();
    let l2 = l.clone();
    let t = std::thread::spawn(move || push(&l2, 3, true).is_ok());
    std::thread::sleep(Duration::from_millis(20));
    let mut batch = Batch::default();
    l.next_batch(b.as_mut(), 0, &mut batch, true, None);
    assert!(t.join().unwrap());
    assert_eq!(l.queued(), 1);
    assert!(l.blocked_ns.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_parked_writer_wakes_for_a_message_and_for_a_poke() {
    for level in [1, 5] {
        let b = BundlerConfig::default().build();
        let l = Arc::new(Lane::new(
            LaneCfg {
                idle: IdleStrategy::from_level(level).unwrap(),
                ..cfg(1 << 20)
            },
            b.as_ref(),
        ));
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let mut b = BundlerConfig::default().build();
            let mut batch = Batch::default();
            let first = l2.next_batch(b.as_mut(), 0, &mut batch, true, None);
            let second = l2.next_batch(b.as_mut(), 0, &mut batch, true, None);
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(20));
        push(&l, 1, false).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        l.poke();
        assert_eq!(
            t.join().unwrap(),
            (Next::Batch(FlushReason::Drained), Next::Wake),
            "level {level}"
        );
    }
}

#[test]
fn linger_writer_sleeps_until_the_deadline_or_max_size() {
    let bc = BundlerConfig {
        kind: BundlerKind::Linger,
        max_size: 1000,
        max_delay: Duration::from_millis(30),
    };
    let l = Lane::new(cfg(1 << 20), bc.build().as_ref());
    push(&l, 1, false).unwrap();
    let t0 = Instant::now();
    let mut batch = Batch::default();
    assert_eq!(
        l.next_batch(bc.build().as_mut(), 0, &mut batch, true, None),
        Next::Batch(FlushReason::Timer)
    );
    assert!(t0.elapsed() >= Duration::from_millis(25));
    for i in 0..60 {
        push(&l, i, false).unwrap();
    }
    assert_eq!(
        l.next_batch(bc.build().as_mut(), 0, &mut batch, true, None),
        Next::Batch(FlushReason::SizeReached)
    );
    assert_eq!(batch.messages(), 60);
}

/// A lane closed at rest (its peer removed) lets go of its queue's buffer, which a burst
/// grew and the writer's batches kept passing back; one with something queued, or on its
/// way into the window, is not closed at all.
#[test]
fn a_lane_closed_at_rest_lets_go_of_its_buffers() {
    let (l, mut b) = lane(BundlerKind::Natural, 1 << 20);
    l.set_writer_absent(false);
    let mut batch = Batch::default();
    for round in 0..2 {
        for n in 0..100 {
            push_direct(&l, n, false);
        }
        assert!(
            !l.close_if_at_rest(),
            "round {round}: closed with messages queued"
        );
        let next = l.next_batch(b.as_mut(), l.epoch(), &mut batch, true, None);
        assert!(matches!(next, Next::Batch(_)));
        assert!(
            !l.close_if_at_rest(),
            "round {round}: closed with a batch on its way"
        );
        l.end_move();
        batch.clear();
    }
    // The second take swapped the first batch's buffer into the queue.
    assert!(l.lock().outbox.capacity() > 0);
    assert!(l.close_if_at_rest());
    assert_eq!(l.lock().outbox.capacity(), 0);
    assert!(l.lock().closed, "closed");
}
