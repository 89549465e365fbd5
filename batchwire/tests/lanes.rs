//! No head-of-line blocking, against real nodes on loopback: large messages in pieces, flow
//! control per mailbox, lanes by class. Every loop is bounded in count and time; no test
//! asserts a speed (the `hol` benchmark measures).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use batchwire::{Address, BundlerKind, Bytes, Class, Error, Event, RecvError};
use common::*;

const T: Duration = Duration::from_secs(60);

/// A payload of `len` bytes that says which message it is (its first 8 bytes) and is
/// checkable throughout.
fn payload(k: u64, len: usize) -> Bytes {
    let mut v: Vec<u8> = (0..len.max(8)).map(|i| (i as u64 ^ k) as u8).collect();
    v[..8].copy_from_slice(&k.to_le_bytes());
    Bytes::from(v)
}

fn check(p: &[u8]) -> u64 {
    let k = u64::from_le_bytes(p[..8].try_into().unwrap());
    assert!(
        p[8..]
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((i + 8) as u64 ^ k) as u8),
        "message {k}: payload corrupted"
    );
    k
}

/// Nodes "a" and "b", set up by `tweak`, that reconnect within milliseconds (for
/// [`break_until`]).
fn breakable_pair(
    tweak: impl Fn(batchwire::NodeConfig) -> batchwire::NodeConfig,
) -> Vec<batchwire::Node> {
    let cfgs = mesh(&["a", "b"])
        .into_iter()
        .map(|c| tweak(c).reconnect(Duration::from_millis(5), Duration::from_millis(20)))
        .collect();
    start(cfgs)
}

/// Break `a`'s connections every 7 ms until `stop`, counting the breaks; bounded in time
/// too, so a failing receiver does not leave it running.
fn break_until(a: &batchwire::Node, stop: &AtomicBool, breaks: &AtomicU64) {
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(7));
        breaks.fetch_add(a.break_connections() as u64, Ordering::Relaxed);
    }
}

fn bad_events(rx: &std::sync::mpsc::Receiver<Event>) -> Vec<Event> {
    rx.try_iter()
        .filter(|e| {
            matches!(
                e,
                Event::PeerDown { .. } | Event::SendFailed { .. } | Event::Disconnected { .. }
            )
        })
        .collect()
}

/// Every bundler: a pair's messages of every size and class arrive whole, once, in order,
/// and small messages from another sender keep arriving while a large one is in pieces:
/// some are delivered after the large message's first piece was received and before its
/// last (a writer that holds small messages behind a large one delivers none there).
#[test]
fn large_and_small_messages_arrive_whole_in_order_and_interleaved() {
    for kind in [
        BundlerKind::Natural,
        BundlerKind::TransferQueue,
        BundlerKind::Linger,
        BundlerKind::None,
    ] {
        let cfgs: Vec<_> = mesh(&["a", "b"])
            .into_iter()
            .map(|c| c.bundler(kind))
            .collect();
        let nodes = start(cfgs);
        let (a, b) = (&nodes[0], &nodes[1]);
        let events = [a.events(), b.events()];
        let big_box = b.mailbox("big").unwrap();
        let small_box = b.mailbox("small").unwrap();
        let bulk_sender = a.mailbox("bulk-sender").unwrap();
        let pinger = a.mailbox("pinger").unwrap();
        // The pair (bulk-sender, big): sizes and classes mixed; its order must hold.
        // The 8 MiB message is the first in pieces: 128 of 64 KiB.
        const BIG_PIECES: u64 = 128;
        let sizes = [10usize, 8 << 20, 100, 70_000, 5, 200_000, 1];
        let done = AtomicBool::new(false);
        let smalls_during = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for (k, len) in sizes.iter().enumerate() {
                    let class = if k % 3 == 2 {
                        Class::Bulk
                    } else {
                        Class::Ordinary
                    };
                    bulk_sender
                        .send_with(&big_box.address(), payload(k as u64, *len), class)
                        .unwrap();
                }
            });
            // Small messages from another mailbox, all along.
            s.spawn(|| {
                let mut k = 0;
                while !done.load(Ordering::Relaxed) && k < 200_000 {
                    pinger.send(&small_box.address(), payload(k, 16)).unwrap();
                    k += 1;
                    if k % 64 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
            s.spawn(|| {
                let mut next = 0;
                while !done.load(Ordering::Relaxed) {
                    match small_box.recv_timeout(Duration::from_millis(50)) {
                        Ok(e) => {
                            assert_eq!(check(&e.payload), next, "small: lost or reordered");
                            next += 1;
                            // Read after the delivery, so a piece counted here may have
                            // come after the message: that can only hide interleaving.
                            let pieces = b.stats().peers[0].fragments_received;
                            if (1..BIG_PIECES).contains(&pieces) {
                                smalls_during.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(RecvError::Timeout) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            for (k, len) in sizes.iter().enumerate() {
                let e = big_box
                    .recv_timeout(T)
                    .unwrap_or_else(|e| panic!("{kind}: message {k} ({len} B): {e}"));
                assert_eq!(e.payload.len(), (*len).max(8), "{kind}: whole");
                assert_eq!(check(&e.payload), k as u64, "{kind}: in order");
                assert_eq!(e.from, bulk_sender.address());
            }
            done.store(true, Ordering::Relaxed);
        });
        assert!(
            smalls_during.load(Ordering::Relaxed) > 0,
            "{kind}: no small message arrived while the 8 MiB one was in pieces"
        );
        let st = a.stats();
        assert!(
            st.peers[0].fragments_sent >= BIG_PIECES + 2 + 4,
            "{kind}: {:?}",
            st.peers[0]
        );
        assert_eq!(
            b.stats().peers[0].fragments_received,
            st.peers[0].fragments_sent
        );
        for ev in &events {
            assert!(bad_events(ev).is_empty(), "{kind}: {:?}", bad_events(ev));
        }
    }
}

/// A mailbox nobody reads holds back only its own senders: `try_send` to it answers `Full`
/// once its credit is used up, while another mailbox on the same node keeps receiving over
/// the same connection; memory stays within the credit; when the consumer comes back,
/// everything arrives, once, in order.
#[test]
fn an_unread_mailbox_holds_back_only_its_senders() {
    const W: usize = 256 << 10;
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.mailbox_bytes(W))
        .collect();
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let events = [a.events(), b.events()];
    let unread = b.mailbox("unread").unwrap();
    let read = b.mailbox("read").unwrap();
    let (mut to_unread, mut full) = (0u64, 0u64);
    let mut to_read = 0u64;
    let mut got = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        match a.try_send(&unread.address(), payload(to_unread, 1000)) {
            Ok(()) => to_unread += 1,
            Err(Error::Full { payload: p, .. }) => {
                assert_eq!(check(&p), to_unread, "the refused payload comes back");
                full += 1;
            }
            Err(e) => panic!("{e}"),
        }
        // The same thread reads `read`, so it must not wait for that mailbox's credit.
        for _ in 0..20 {
            match a.try_send(&read.address(), payload(to_read, 100)) {
                Ok(()) => to_read += 1,
                Err(Error::Full { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        while let Ok(e) = read.try_recv() {
            assert_eq!(check(&e.payload), got);
            got += 1;
        }
    }
    while got < to_read {
        let e = read.recv_timeout(T).expect("the read mailbox stalled");
        assert_eq!(check(&e.payload), got);
        got += 1;
    }
    assert!(
        full > 100,
        "senders to the unread mailbox were held back ({full})"
    );
    // Within the credit (plus one message).
    assert!(
        (to_unread as usize) * 1010 <= W + 1100,
        "{to_unread} messages accepted for the unread mailbox"
    );
    assert_eq!(
        unread.len() as u64,
        to_unread,
        "all of them arrived and wait there"
    );
    assert!(a.stats().peers[0].credit_stalls > 0);
    for k in 0..to_unread {
        assert_eq!(check(&unread.recv_timeout(T).unwrap().payload), k);
    }
    // Its credit came back: the sender may go on.
    let deadline = Instant::now() + T;
    while a
        .try_send(&unread.address(), payload(to_unread, 1000))
        .is_err()
    {
        assert!(Instant::now() < deadline, "credit never came back");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(check(&unread.recv_timeout(T).unwrap().payload), to_unread);
    for ev in &events {
        assert!(bad_events(ev).is_empty(), "{:?}", bad_events(ev));
    }
}

/// Connections break every few milliseconds while messages below and far above the
/// fragment size stream: each arrives once, whole, in order.
#[test]
fn pieces_survive_connection_breaks_exactly_once() {
    let nodes = breakable_pair(|c| c.fragment_bytes(16 << 10));
    let (a, b) = (&nodes[0], &nodes[1]);
    let inbox = b.mailbox("inbox").unwrap();
    let bev = b.events();
    let stop = AtomicBool::new(false);
    let breaks = AtomicU64::new(0);
    const N: u64 = 600;
    let len = |k: u64| [10usize, 50_000, 300, 200_000][k as usize % 4];
    std::thread::scope(|s| {
        s.spawn(|| break_until(a, &stop, &breaks));
        s.spawn(|| {
            for k in 0..N {
                a.send(&inbox.address(), payload(k, len(k))).unwrap();
            }
        });
        for k in 0..N {
            let e = inbox.recv_timeout(T).unwrap_or_else(|e| {
                stop.store(true, Ordering::Relaxed);
                let evs: Vec<_> = bev.try_iter().take(5).collect();
                panic!(
                    "message {k}: {e}\n{:#?}\n{:#?}\n{evs:#?}",
                    a.stats(),
                    b.stats()
                )
            });
            assert_eq!(check(&e.payload), k, "lost, duplicated or reordered");
            assert_eq!(e.payload.len(), len(k));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        inbox.recv_timeout(Duration::from_millis(300)).is_err(),
        "a duplicate"
    );
    assert!(
        breaks.load(Ordering::Relaxed) > 5,
        "too few breaks to mean anything"
    );
    let st = a.stats();
    assert_eq!(st.peers[0].send_failed, 0);
    assert_eq!(st.peers[0].credit_mismatched, 0);
}

/// One 256 MiB message (configured `max_payload`) arrives whole; past `max_payload` the
/// sender is told at once.
#[test]
fn a_256_mib_message_arrives_whole_and_a_larger_one_is_refused() {
    const BIG: usize = 256 << 20;
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.max_payload(BIG))
        .collect();
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let inbox = b.mailbox("inbox").unwrap();
    let big = payload(1, BIG);
    a.send(&inbox.address(), big.clone()).unwrap();
    // It is more than the mailbox's credit: the next message to that mailbox waits until it
    // has been read.
    assert!(matches!(
        a.try_send(&inbox.address(), payload(2, 10)),
        Err(Error::Full { .. })
    ));
    let e = inbox.recv_timeout(T).unwrap();
    assert_eq!(e.payload.len(), BIG);
    assert!(e.payload == big, "corrupted");
    a.send(&inbox.address(), payload(2, 10)).unwrap();
    assert_eq!(check(&inbox.recv_timeout(T).unwrap().payload), 2);
    assert!(matches!(
        a.send(&inbox.address(), vec![0u8; BIG + 1]),
        Err(Error::PayloadTooLarge { len, max }) if len == BIG + 1 && max == BIG
    ));
}

/// A peer that accepts less than this node may send is respected once it said so: the
/// sender is told at once, with the peer's limit.
#[test]
fn the_peers_max_payload_is_respected() {
    let mut cfgs = mesh(&["a", "b"]);
    cfgs[1] = cfgs[1].clone().max_payload(100_000);
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let inbox = b.mailbox("inbox").unwrap();
    // The peer's SYNC (its first word on the connection) carries its limit.
    let deadline = Instant::now() + T;
    loop {
        match a.send(&inbox.address(), vec![0u8; 100_001]) {
            Err(Error::PayloadTooLarge { max, .. }) => {
                assert_eq!(max, 100_000);
                break;
            }
            Ok(()) => {
                // Sent before the SYNC arrived: dropped by b and reported undeliverable.
                assert!(Instant::now() < deadline);
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
    a.send(&inbox.address(), payload(3, 100_000)).unwrap();
    let e = inbox.recv_timeout(T).unwrap();
    assert_eq!(check(&e.payload), 3);
}

/// Transfer-queue with pieces: `send_all` of small and large messages reaches every
/// member, in order.
#[test]
fn transfer_queue_send_all_with_large_messages() {
    let cfgs: Vec<_> = mesh(&["a", "b", "c"])
        .into_iter()
        .map(|c| c.bundler(BundlerKind::TransferQueue))
        .collect();
    let nodes = start(cfgs);
    let boxes: Vec<_> = nodes.iter().map(|n| n.mailbox("all").unwrap()).collect();
    let sizes = [10usize, 500_000, 20, 100_000, 5];
    for (k, len) in sizes.iter().enumerate() {
        nodes[0].send_all("all", payload(k as u64, *len)).unwrap();
    }
    for (i, mb) in boxes.iter().enumerate() {
        for (k, len) in sizes.iter().enumerate() {
            let e = mb
                .recv_timeout(T)
                .unwrap_or_else(|e| panic!("node {i}, message {k}: {e}"));
            assert_eq!(check(&e.payload), k as u64, "node {i}");
            assert_eq!(e.payload.len(), (*len).max(8));
        }
    }
}

/// A mailbox dropped while a large message is on its way to it: the message is reported
/// undeliverable, its credit comes back, and the sender goes on.
#[test]
fn a_large_message_to_a_dropped_mailbox_is_reported_and_its_credit_returns() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let events = a.events();
    let to = Address::new("b", "gone").unwrap();
    a.send(&to, payload(0, 5 << 20)).unwrap();
    let ev = wait_event(&events, T, |e| matches!(e, Event::Undeliverable { .. }));
    assert!(ev.is_some(), "the sender heard of it");
    // Credit came back: many more (together far over the 16 MiB credit) go without
    // waiting forever, and each is reported.
    for k in 1..=8 {
        a.send(&to, payload(k, 5 << 20)).unwrap();
    }
    let mut reported = match ev {
        Some(Event::Undeliverable { count, .. }) => count,
        _ => 0,
    };
    let deadline = Instant::now() + T;
    while reported < 9 {
        let left = deadline.saturating_duration_since(Instant::now());
        match wait_event(&events, left, |e| matches!(e, Event::Undeliverable { .. })) {
            Some(Event::Undeliverable { count, .. }) => reported += count,
            _ => panic!("{reported} of 9 reported undeliverable"),
        }
    }
    assert_eq!(reported, 9);
    // Only now does the mailbox exist (one created earlier could get the messages still
    // on their way).
    let inbox = b.mailbox("gone").unwrap();
    a.send(&to, payload(99, 10)).unwrap();
    let e = inbox.recv_timeout(T).unwrap();
    assert_eq!(check(&e.payload), 99);
}

/// Many threads blocked on two mailboxes' credit (small budgets, slow readers) while the
/// sender's connections break every few milliseconds: blocked senders are woken as credit
/// comes back (one at a time for one mailbox, all while they wait for different ones), and
/// every message arrives once, in order per sending thread.
#[test]
fn many_senders_blocked_on_credit_survive_connection_breaks() {
    let nodes = breakable_pair(|c| c.mailbox_bytes(32 << 10));
    let (a, b) = (&nodes[0], &nodes[1]);
    let boxes = [b.mailbox("one").unwrap(), b.mailbox("two").unwrap()];
    const THREADS: u64 = 24;
    const EACH: u64 = 200;
    // Threads 0..18 send to "one", 18..24 to "two".
    let target = |t: u64| usize::from(t >= 18);
    let msg = |t: u64, k: u64| {
        let mut v = vec![0u8; 300];
        v[..8].copy_from_slice(&t.to_le_bytes());
        v[8..16].copy_from_slice(&k.to_le_bytes());
        Bytes::from(v)
    };
    let stop = AtomicBool::new(false);
    let breaks = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| break_until(a, &stop, &breaks));
        for t in 0..THREADS {
            let to = boxes[target(t)].address();
            s.spawn(move || {
                for k in 0..EACH {
                    a.send(&to, msg(t, k)).unwrap();
                }
            });
        }
        let readers: Vec<_> = (0..2)
            .map(|i| {
                let mb = &boxes[i];
                let stop = &stop;
                s.spawn(move || {
                    let senders = (0..THREADS).filter(|t| target(*t) == i).count() as u64;
                    let mut next = vec![0u64; THREADS as usize];
                    for n in 0..senders * EACH {
                        let e = mb.recv_timeout(T).unwrap_or_else(|e| {
                            stop.store(true, Ordering::Relaxed);
                            panic!("mailbox {i}, message {n}: {e}")
                        });
                        let t = u64::from_le_bytes(e.payload[..8].try_into().unwrap());
                        let k = u64::from_le_bytes(e.payload[8..16].try_into().unwrap());
                        assert_eq!(target(t), i, "to the wrong mailbox");
                        assert_eq!(
                            k, next[t as usize],
                            "thread {t}: lost, duplicated or reordered"
                        );
                        next[t as usize] += 1;
                        // Slow readers: the 32 KiB budgets run out and senders block.
                        if n % 64 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    for mb in &boxes {
        assert!(
            mb.recv_timeout(Duration::from_millis(200)).is_err(),
            "a duplicate"
        );
    }
    assert!(
        breaks.load(Ordering::Relaxed) > 3,
        "too few breaks to mean anything"
    );
    let st = a.stats();
    assert!(
        st.peers[0].credit_stalls > 0,
        "no sender ever waited for credit"
    );
    assert_eq!(st.peers[0].send_failed, 0);
}

/// Node "b", without membership, with a static peer "a" at an address where nothing
/// listens (a raw connection plays a: [`raw_peer_a`]).
fn node_b_with_peer_a(
    tweak: impl FnOnce(batchwire::NodeConfig) -> batchwire::NodeConfig,
) -> batchwire::Node {
    let [addr, nowhere] = free_addrs(2)[..] else {
        unreachable!()
    };
    let cfg = batchwire::NodeConfig::new("b", addr, SECRET)
        .without_membership()
        .peer("a", nowhere);
    batchwire::Node::start(tweak(cfg)).unwrap()
}

/// Log in to `b` by hand as "a" (incarnation 7), resume from scratch, and wait until `b`
/// has it up.
fn raw_peer_a(b: &batchwire::Node) -> raw::Raw {
    use batchwire_core::frame::{Frame, Resume};
    let mut r = raw::login(b.local_addr(), "a", "b", 7);
    let _ = r.recv(T); // b's RESUME
    r.send(&Frame::Resume(Resume::FRESH));
    assert!(b.wait_for_peers(&["a"], T));
    r
}

/// A peer declared down while a large message to it is in pieces (some numbered into the
/// window, the rest still queued): the message is reported failed, and the node goes on.
/// The peer here logs in by hand and then neither reads nor answers. Declaring it down takes
/// the message out of the lane and tells the session to drop its pieces while the session
/// turn that found the peer down still holds the session: done from the events' dispatch,
/// it took the session under `dispatching`, the reverse of every other turn's order (and a
/// debug assertion now stops any such call).
#[test]
fn a_peer_declared_down_while_a_message_to_it_is_in_pieces_gets_it_reported() {
    let b = node_b_with_peer_a(|c| {
        c.heartbeat_interval(Duration::from_millis(200))
            .peer_timeout(Duration::from_secs(3))
    });
    let events = b.events();
    // Made before a logs in: a is declared down 3 s after that, and filling 64 MiB took
    // longer than that in a debug build on a loaded machine.
    let big = payload(1, 64 << 20);
    let r = raw_peer_a(&b);
    let to = Address::new("a", "in").unwrap();
    if let Err(e) = b.send(&to, big) {
        let evs: Vec<_> = events.try_iter().collect();
        panic!("{e}: {evs:?}");
    }
    // Some pieces are numbered (the first goes into the window at once, the window's bulk
    // room is far below 64 MiB), then nothing is acknowledged: a is declared down.
    let down = wait_event(&events, T, |e| matches!(e, Event::PeerDown { .. }));
    assert!(down.is_some(), "a was not declared down");
    let failed = wait_event(
        &events,
        T,
        |e| matches!(e, Event::SendFailed { peer, .. } if peer == "a"),
    );
    match failed {
        Some(Event::SendFailed { count, .. }) => assert_eq!(count, 1),
        other => panic!("the message in pieces was not reported: {other:?}"),
    }
    // The node still works: its sessions take turns, and it shuts down in time.
    let t0 = Instant::now();
    b.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(30));
    drop(r);
}

/// A member that went bad gives back far more credit than it was charged, for a mailbox
/// it was sent to and for one it never was: the grants are clamped (never below zero,
/// never more room than the window), counted in `credit_mismatched`, and the node goes on
/// sending to it within its window.
#[test]
fn forged_grants_beyond_the_charge_are_clamped_and_counted() {
    use batchwire_core::codec::Name;
    use batchwire_core::frame::{Credit, Frame};
    let b = node_b_with_peer_a(|c| c);
    let mut r = raw_peer_a(&b);
    let to = Address::new("a", "in").unwrap();
    b.send(&to, payload(1, 1000)).unwrap();
    r.send(&Frame::Credit(Credit {
        grants: vec![
            (Name::new("in").unwrap(), u64::MAX),
            (Name::new("never").unwrap(), 1 << 40),
        ],
    }));
    let deadline = Instant::now() + T;
    while b.stats().peers[0].credit_mismatched == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = b.stats();
    assert!(
        st.peers[0].credit_mismatched >= 1 << 40,
        "{}",
        st.peers[0].credit_mismatched
    );
    // Still bound by the window: a raw peer that never reads or gives back real credit
    // gets at most about a window's worth before sends to that mailbox are full.
    let mut sent = 1u64;
    while sent < 10_000 && b.try_send(&to, payload(sent, 1000)).is_ok() {
        sent += 1;
    }
    assert!(sent < 10_000, "the window no longer holds anything back");
    assert_eq!(st.peers[0].send_failed, 0);
}
