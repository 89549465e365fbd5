//! Control before data, against real nodes: the three failures of the connection layer v2
//! issue, each as a test that would have caught it. Every loop is bounded in count and time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use batchwire::{Address, BundlerKind, Error, Event, Node, NodeConfig};
use common::*;

const T: Duration = Duration::from_secs(60);

fn seq(p: &[u8]) -> u64 {
    u64::from_le_bytes(p[..8].try_into().unwrap())
}

/// Events that say something went wrong with a peer.
fn bad(events: &std::sync::mpsc::Receiver<Event>) -> Vec<Event> {
    events
        .try_iter()
        .filter(|e| matches!(e, Event::PeerDown { .. } | Event::SendFailed { .. }))
        .collect()
}

/// Both nodes stream to each other at full rate through a 64 KiB send window, so each
/// window is full most of the time and each side's acknowledgements must get past its own
/// full window. Nobody is declared down, nothing fails, everything arrives once in order.
#[test]
fn duplex_saturation_with_a_small_window() {
    const N: u64 = 2_000_000;
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| {
            c.mailbox("inbox")
                .unacked_bytes(64 << 10)
                .peer_timeout(Duration::from_millis(1500))
                .heartbeat_interval(Duration::from_millis(100))
        })
        .collect();
    let nodes = start(cfgs);
    let events: Vec<_> = nodes.iter().map(|n| n.events()).collect();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (i, node) in nodes.iter().enumerate() {
            let other = if i == 0 { "b" } else { "a" };
            s.spawn(move || {
                let to = Address::new(other, "inbox").unwrap();
                for k in 0..N {
                    node.send(&to, k.to_le_bytes().to_vec()).unwrap();
                }
            });
            s.spawn(move || {
                let inbox = node.mailbox("inbox").unwrap();
                let (mut next, mut batch) = (0, Vec::new());
                while next < N {
                    inbox
                        .recv_batch_into(&mut batch, 4096, T)
                        .unwrap_or_else(|e| panic!("{} stalled at {next}: {e}", node.name()));
                    for e in batch.drain(..) {
                        assert_eq!(seq(&e.payload), next, "lost, duplicated or reordered");
                        next += 1;
                    }
                }
            });
        }
    });
    eprintln!(
        "2 x {N} messages through 64 KiB windows in {:?}",
        t0.elapsed()
    );
    for (n, ev) in nodes.iter().zip(&events) {
        assert!(bad(ev).is_empty(), "{}: {:?}", n.name(), bad(ev));
        // The last acknowledgements may still be on their way (they are delayed and
        // batched): wait for them, bounded.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut st = n.stats();
        while st.peers[0].acked < N - 4096 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            st = n.stats();
        }
        assert_eq!(st.peers[0].send_failed, 0);
        assert!(st.peers[0].acked >= N - 4096, "{:?}", st.peers[0]);
    }
}

/// A mailbox nobody reads for 3 x peer_timeout while its sender keeps sending: the reader
/// waits for room without keeping the heartbeats from flowing, so neither side declares the
/// other down; the sender is held back (Full); then everything arrives.
#[test]
fn an_unread_mailbox_for_three_timeouts_is_not_a_dead_peer() {
    let timeout = Duration::from_millis(600);
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| {
            c.mailbox("inbox")
                .mailbox_bytes(64 << 10)
                .send_queue_bytes(64 << 10)
                .unacked_bytes(256 << 10)
                .peer_timeout(timeout)
                .heartbeat_interval(Duration::from_millis(100))
        })
        .collect();
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let (ea, eb) = (a.events(), b.events());
    let to = Address::new("b", "inbox").unwrap();
    let (mut sent, mut full) = (0u64, 0u64);
    // Nobody reads b's inbox for 3 x peer_timeout; a keeps offering messages.
    let stop = Instant::now() + 3 * timeout;
    while Instant::now() < stop {
        match a.try_send(&to, sent.to_le_bytes().to_vec()) {
            Ok(()) => sent += 1,
            Err(Error::Full { .. }) => {
                full += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("send failed: {e}"),
        }
    }
    assert!(full > 100, "the sender was never held back ({sent} sent)");
    assert!(bad(&ea).is_empty(), "a: {:?}", bad(&ea));
    assert!(bad(&eb).is_empty(), "b: {:?}", bad(&eb));
    assert_eq!(a.connected_peers(), ["b"]);
    // The consumer comes back: everything arrives, once, in order.
    let inbox = b.mailbox("inbox").unwrap();
    for i in 0..sent {
        let e = inbox.recv_timeout(Duration::from_secs(20)).expect("lost");
        assert_eq!(seq(&e.payload), i);
    }
    assert!(inbox.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(bad(&ea).is_empty() && bad(&eb).is_empty());
}

/// Transfer-queue (one queue, one bundler for every peer): one peer never acknowledges
/// (its window fills), one never reads (its socket fills); the third peer keeps receiving
/// data and heartbeats all along, and neither side of that pair declares the other down.
#[test]
fn transfer_queue_one_stuck_peer_does_not_stall_the_others() {
    let addrs = free_addrs(2);
    let (b_addr, c_addr) = (addrs[0], addrs[1]);
    let timeout = Duration::from_secs(10);
    let hb = Duration::from_millis(100);
    // a1 and a2 dial b (their names sort first); b dials c.
    let b = Node::start(
        NodeConfig::new("b", b_addr, SECRET)
            .bundler(BundlerKind::TransferQueue)
            .peer("a1", "127.0.0.1:9".parse().unwrap())
            .peer("a2", "127.0.0.1:9".parse().unwrap())
            .peer("c", c_addr)
            .unacked_bytes(64 << 10)
            .peer_timeout(timeout)
            .heartbeat_interval(hb),
    )
    .unwrap();
    let c = Node::start(
        NodeConfig::new("c", c_addr, SECRET)
            .peer("b", b_addr)
            .mailbox("inbox")
            .peer_timeout(Duration::from_millis(800))
            .heartbeat_interval(hb),
    )
    .unwrap();
    assert!(b.wait_for_peers(&["c"], T));
    let never_acks = raw_peer(b_addr, "a1", "b");
    let never_reads = raw_peer(b_addr, "a2", "b");
    assert!(b.wait_for_peers(&["a1", "a2", "c"], T));
    let (eb, ec) = (b.events(), c.events());
    // a1 reads everything but never acknowledges: drain its socket in the background.
    let drained = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (mut s, drained, stop) = (
            never_acks.try_clone().unwrap(),
            drained.clone(),
            stop.clone(),
        );
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut chunk = vec![0u8; 1 << 16];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(n) = s.read(&mut chunk) {
                    drained.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        })
    };
    let inbox = c.mailbox("inbox").unwrap();
    let payload = vec![7u8; 1000];
    let (to_a1, to_a2, to_c) = (
        Address::new("a1", "x").unwrap(),
        Address::new("a2", "x").unwrap(),
        Address::new("c", "inbox").unwrap(),
    );
    let (mut got, mut next) = (0u64, 0u64);
    // Counted once a1's window is full (a1 is stuck): c must go on receiving after that.
    let mut stuck_at: Option<u64> = None;
    let t0 = Instant::now();
    while stuck_at.is_none_or(|s| got - s < 10_000) && t0.elapsed() < Duration::from_secs(30) {
        // Offer the stuck peers as much as they take (they soon take nothing).
        for _ in 0..8 {
            let _ = b.try_send(&to_a1, payload.clone());
            let _ = b.try_send(&to_a2, payload.clone());
        }
        // The third peer gets a steady stream.
        for _ in 0..50 {
            match b.try_send(&to_c, next.to_le_bytes().to_vec()) {
                Ok(()) => next += 1,
                Err(Error::Full { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        while let Ok(e) = inbox.try_recv() {
            assert_eq!(seq(&e.payload), got);
            got += 1;
        }
        if stuck_at.is_none() && b.stats().peer("a1").unwrap().unacked_bytes >= 64 << 10 {
            stuck_at = Some(got);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    eprintln!(
        "c received {got} messages in {:?} ({:?} before a1 was stuck); a1 drained {} B",
        t0.elapsed(),
        stuck_at,
        drained.load(Ordering::Relaxed)
    );
    let stuck_at = stuck_at.expect("a1's window never filled");
    assert!(
        got - stuck_at >= 10_000,
        "c received only {} messages after a1 was stuck (30 s)",
        got - stuck_at
    );
    let sb = b.stats();
    let (a1, a2) = (sb.peer("a1").unwrap(), sb.peer("a2").unwrap());
    assert!(a1.unacked_bytes >= 64 << 10, "a1's window is full: {a1:?}");
    assert!(a2.unacked_bytes > 0, "a2 took something: {a2:?}");
    // c heard b's heartbeats and data throughout (its timeout is 800 ms), and b did not
    // declare c down.
    assert!(!ec.try_iter().any(|e| matches!(e, Event::PeerDown { .. })));
    assert!(
        !eb.try_iter()
            .any(|e| matches!(e, Event::PeerDown { ref peer, .. } if peer == "c"))
    );
    drop(never_reads);
}

/// Threads of this test process whose names start with one of `prefixes` (Linux names
/// are cut to 15 bytes).
fn threads_named(prefixes: &[&str]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| prefixes.iter().any(|p| c.starts_with(p)))
        .collect()
}

/// An idle peer costs no thread: after `thread_linger` with nothing either way its writer
/// and its connection's reader end (and the dialer that made it), while the connection
/// stays up: the ticker writes the heartbeats, and the node's one thread for resting
/// connections reads them. Both nodes stay up through four peer timeouts with no thread
/// started for a heartbeat; a lone message starts no writer either way; the next sends
/// arrive once, in order; and when the connection ends (the peer restarts) the dialer
/// starts again and reconnects.
#[test]
fn an_idle_peer_costs_no_thread_and_stays_up() {
    idle_peer_costs_no_thread(["ia", "ib"], |c| c);
}

/// The same over mutual TLS: the ticker encrypts and writes the heartbeats without
/// waiting, and the thread for resting connections decrypts what comes.
#[test]
fn an_idle_tls_peer_costs_no_thread_and_stays_up() {
    let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/certs/idle");
    idle_peer_costs_no_thread(["ta", "tb"], move |c| {
        let files = batchwire::TlsFiles::in_dir(&certs, c.name());
        c.tls(files)
    });
}

fn idle_peer_costs_no_thread(names: [&str; 2], with: impl Fn(NodeConfig) -> NodeConfig) {
    let cfgs: Vec<NodeConfig> = mesh(&names)
        .into_iter()
        .map(|c| {
            with(c)
                .mailbox("inbox")
                .heartbeat_interval(Duration::from_millis(100))
                .peer_timeout(Duration::from_millis(800))
                .thread_linger(Duration::from_millis(300))
        })
        .collect();
    let b_cfg = cfgs[1].clone();
    let mut nodes = start(cfgs);
    let events: Vec<_> = nodes.iter().map(|n| n.events()).collect();
    let (to_a, to_b) = (
        Address::new(names[0], "inbox").unwrap(),
        Address::new(names[1], "inbox").unwrap(),
    );
    let in_a = nodes[0].mailbox("inbox").unwrap();
    let in_b = nodes[1].mailbox("inbox").unwrap();
    nodes[0].send(&to_b, 0u64.to_le_bytes().to_vec()).unwrap();
    nodes[1].send(&to_a, 0u64.to_le_bytes().to_vec()).unwrap();
    assert_eq!(seq(&in_b.recv_timeout(T).unwrap().payload), 0);
    assert_eq!(seq(&in_a.recv_timeout(T).unwrap().payload), 0);

    // Per peer: writers, inbound readers, readers started again, dialers.
    let per_peer: Vec<String> = ["bw-write-", "bw-in-", "bw-read-", "bw-dial-"]
        .iter()
        .flat_map(|t| names.map(|n| format!("{t}{n}")))
        .collect();
    let per_peer: Vec<&str> = per_peer.iter().map(|s| s.as_str()).collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !threads_named(&per_peer).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(threads_named(&per_peer), Vec::<String>::new(), "all rest");
    let rest = names.map(|n| format!("bw-rest-{n}"));
    let mut resting = threads_named(&[&rest[0], &rest[1]]);
    resting.sort();
    assert_eq!(resting, rest);

    let quiet_until = Instant::now() + Duration::from_millis(3200);
    while Instant::now() < quiet_until {
        let t = threads_named(&per_peer);
        assert!(t.is_empty(), "a thread started while idle: {t:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(bad(&events[0]).is_empty(), "{:?}", bad(&events[0]));
    assert!(bad(&events[1]).is_empty(), "{:?}", bad(&events[1]));
    assert_eq!(nodes[0].connected_peers(), [names[1]]);
    assert_eq!(nodes[1].connected_peers(), [names[0]]);

    // A lone message starts no thread: its sender writes it, the resting thread reads it,
    // the ticker writes its acknowledgement.
    let starts = |n: &Node, p: &str| {
        let st = n.stats();
        st.peers.iter().find(|x| x.peer == p).unwrap().writer_starts
    };
    let before = [starts(&nodes[0], names[1]), starts(&nodes[1], names[0])];
    nodes[0].send(&to_b, 1u64.to_le_bytes().to_vec()).unwrap();
    assert_eq!(seq(&in_b.recv_timeout(T).unwrap().payload), 1);
    std::thread::sleep(Duration::from_millis(100));
    let after = [starts(&nodes[0], names[1]), starts(&nodes[1], names[0])];
    assert_eq!(before, after, "writers started for a lone message");

    for i in 2..=1000u64 {
        nodes[0].send(&to_b, i.to_le_bytes().to_vec()).unwrap();
    }
    for i in 2..=1000u64 {
        assert_eq!(seq(&in_b.recv_timeout(T).unwrap().payload), i);
    }
    assert!(
        in_b.recv_timeout(Duration::from_millis(50)).is_err(),
        "once"
    );

    // The connection ends with the peer; the first dials again (its dialer had ended).
    drop(in_b);
    nodes.pop().unwrap().shutdown();
    let b = Node::start(b_cfg).unwrap();
    assert!(
        nodes[0].wait_for_peers(&[names[1]], T),
        "{} reconnects: {:?}",
        names[0],
        nodes[0].connected_peers()
    );
    let in_b = b.mailbox("inbox").unwrap();
    nodes[0].send(&to_b, 7u64.to_le_bytes().to_vec()).unwrap();
    assert_eq!(seq(&in_b.recv_timeout(T).unwrap().payload), 7);
}

/// A mailbox dropped with messages in it gives their credit back at once, though the
/// connection's reader still knows the mailbox as the last it delivered to and keeps
/// reading (the other node's traffic keeps it busy): the sender, stopped by that credit,
/// goes on to the mailbox opened again under the name, and is told the dropped messages
/// were undeliverable.
#[test]
fn a_dropped_mailbox_gives_its_credit_back_while_its_connection_stays_busy() {
    let cfgs: Vec<NodeConfig> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.mailbox("back").mailbox_bytes(64 << 10))
        .collect();
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let events = a.events();
    let to = Address::new("b", "svc").unwrap();
    let svc = b.mailbox("svc").unwrap();
    // Until the credit is used up (nothing reads "svc").
    let mut sent = 0;
    for _ in 0..1000 {
        match a.try_send(&to, vec![7u8; 1000]) {
            Ok(()) => sent += 1,
            Err(Error::Full { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        (10..1000).contains(&sent),
        "{sent} sent before the credit ran out"
    );
    let deadline = Instant::now() + T;
    while svc.len() < sent {
        assert!(Instant::now() < deadline, "{} of {sent} arrived", svc.len());
        std::thread::sleep(Duration::from_millis(5));
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // b keeps talking to a on the same connection, so its reader never rests.
        s.spawn(|| {
            let back = Address::new("a", "back").unwrap();
            while !stop.load(Ordering::Relaxed) {
                b.send(&back, "ping").unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        drop(svc);
        let svc = b.mailbox("svc").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let taken = loop {
            match a.try_send(&to, "after") {
                Ok(()) => break true,
                Err(Error::Full { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => break false,
            }
        };
        stop.store(true, Ordering::Relaxed);
        assert!(taken, "the dropped mailbox's credit never came back");
        assert_eq!(svc.recv_timeout(T).unwrap().payload, "after".as_bytes());
    });
    let mut told = 0;
    let deadline = Instant::now() + T;
    while told < sent {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Undeliverable { to: t, count, .. }) => {
                assert_eq!(t, to);
                told += count as usize;
            }
            Ok(_) => {}
            Err(_) => panic!("told of {told} of the {sent} dropped messages"),
        }
    }
    assert_eq!(told, sent);
}
