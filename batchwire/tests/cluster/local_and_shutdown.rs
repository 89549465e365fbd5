//! Local delivery, wrong secrets, typed values, async receive, shutdown, IPv6, send_all alone.

use super::*;

/// Local delivery remembers, per thread, the mailbox it delivered to last (no table lookup
/// per message). It must still find a mailbox opened again under the same name, keep two
/// nodes of one process apart (each has its own "inbox"), and report a send after the
/// mailbox is gone as undeliverable, not hand it to the dropped queue (which may still be
/// alive, and closed).
#[test]
fn local_delivery_follows_a_mailbox_opened_again_and_keeps_nodes_apart() {
    let nodes = start(mesh(&["a", "b"]));
    let (to_a, to_b) = (
        Address::new("a", "inbox").unwrap(),
        Address::new("b", "inbox").unwrap(),
    );
    for round in 0u8..4 {
        let (in_a, in_b) = (
            nodes[0].mailbox("inbox").unwrap(),
            nodes[1].mailbox("inbox").unwrap(),
        );
        // a's connection reader keeps the queue of its last run: the dropped one stays
        // alive, so next round this thread's remembered queue is still there, but closed.
        nodes[1].send(&to_a, vec![3, round]).unwrap();
        assert_eq!(&in_a.recv_timeout(T).unwrap().payload[..], [3, round]);
        for i in 0u8..3 {
            // Alternating between the nodes, from this one thread.
            nodes[0].send(&to_a, vec![0, round, i]).unwrap();
            nodes[1].send(&to_b, vec![1, round, i]).unwrap();
        }
        nodes[0].send_all("inbox", vec![2, round]).unwrap();
        for i in 0u8..3 {
            assert_eq!(&in_a.recv_timeout(T).unwrap().payload[..], [0, round, i]);
            assert_eq!(&in_b.recv_timeout(T).unwrap().payload[..], [1, round, i]);
        }
        // send_all reached a's own inbox and b's (over the connection).
        assert_eq!(&in_a.recv_timeout(T).unwrap().payload[..], [2, round]);
        assert_eq!(&in_b.recv_timeout(T).unwrap().payload[..], [2, round]);
        assert!(in_a.try_recv().is_err() && in_b.try_recv().is_err());
        drop((in_a, in_b));
    }
    assert_eq!(nodes[0].stats().undeliverable, 0);
    // Gone: undeliverable, counted once, whatever this thread remembered.
    let events = nodes[0].events();
    nodes[0].send(&to_a, &b"nobody"[..]).unwrap();
    assert_eq!(nodes[0].stats().undeliverable, 1);
    assert!(
        wait_event(
            &events,
            T,
            |e| matches!(e, Event::Undeliverable { to, .. } if *to == to_a)
        )
        .is_some()
    );
    // And the next one opened gets what comes after.
    let in_a = nodes[0].mailbox("inbox").unwrap();
    nodes[0].send(&to_a, &b"back"[..]).unwrap();
    assert_eq!(&in_a.recv_timeout(T).unwrap().payload[..], b"back");
}

#[test]
fn wrong_secret_is_refused_on_both_sides_and_others_keep_working() {
    let mut cfgs = mesh(&["a", "b"]);
    let b_addr = cfgs[1].listen();
    let mut intruder = NodeConfig::new("0-intruder", free_addrs(1)[0], "not-the-secret");
    intruder = intruder.peer("b", b_addr);
    let b = Node::start(cfgs.remove(1)).unwrap();
    let b_events = b.events();
    let x = Node::start(intruder).unwrap();
    let x_events = x.events();
    let ev = wait_event(&x_events, T, |e| matches!(e, Event::HandshakeFailed { .. }))
        .expect("intruder saw no refusal");
    let Event::HandshakeFailed { peer, reason, .. } = ev else {
        unreachable!()
    };
    assert_eq!(peer.as_deref(), Some("b"));
    assert!(reason.contains("secret"), "{reason}");
    let ev = wait_event(&b_events, T, |e| matches!(e, Event::HandshakeFailed { .. }))
        .expect("b saw no refusal");
    let Event::HandshakeFailed { peer, reason, .. } = ev else {
        unreachable!()
    };
    assert_eq!(peer.as_deref(), Some("0-intruder"));
    assert!(reason.contains("secret"), "{reason}");
    assert!(x.connected_peers().is_empty());
    // The legitimate node still gets in.
    let a = Node::start(cfgs.remove(0)).unwrap();
    assert!(a.wait_for_peers(&["b"], T));
}

#[test]
fn local_sends_typed_values_and_errors() {
    let nodes = start(mesh(&["a", "b"]));
    let me = nodes[0].mailbox("me").unwrap();
    // Local delivery.
    nodes[0].send(&me.address(), &b"self"[..]).unwrap();
    assert_eq!(&me.recv_timeout(T).unwrap().payload[..], b"self");
    // Typed layer over postcard.
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Order {
        id: u32,
        item: String,
    }
    let inbox = nodes[1].mailbox("orders").unwrap();
    let o = Order {
        id: 7,
        item: "tea".into(),
    };
    me.send_value(&inbox.address(), &o).unwrap();
    let e = inbox.recv_timeout(T).unwrap();
    assert_eq!(e.value::<Order>().unwrap(), o);
    assert_eq!(e.from, me.address());
    // Errors.
    assert!(matches!(
        nodes[0].send(&Address::new("zz", "x").unwrap(), &b""[..]),
        Err(Error::UnknownNode(n)) if n == "zz"
    ));
    let big = vec![0u8; (64 << 20) + 1];
    assert!(matches!(
        nodes[0].send(&inbox.address(), big),
        Err(Error::PayloadTooLarge { max, .. }) if max == 64 << 20
    ));
    assert!(matches!(
        nodes[0].mailbox("me"),
        Err(Error::MailboxExists(_))
    ));
    assert!(Address::new("", "x").is_err());
}

#[test]
fn recv_async_works_on_a_tokio_runtime() {
    let nodes = start(mesh(&["a", "b"]));
    let inbox = nodes[1].mailbox("async").unwrap();
    let to = inbox.address();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        // One runtime thread: if recv_async blocked it, the timer below could not fire.
        nodes[0].send(&to, &b"ping"[..]).unwrap();
        let first = tokio::time::timeout(T, inbox.recv_async())
            .await
            .unwrap()
            .unwrap();
        // Nothing else is coming: the future must stay pending without blocking the thread.
        let none = tokio::time::timeout(Duration::from_millis(50), inbox.recv_async()).await;
        (first, none.is_err())
    });
    assert_eq!(&got.0.payload[..], b"ping");
    assert!(got.1);
}

#[test]
fn shutdown_flushes_queued_messages() {
    let mut nodes = start(mesh(&["a", "b"]));
    let inbox = nodes[1].mailbox("inbox").unwrap();
    let to = inbox.address();
    let events = nodes[0].events();
    const N: u64 = 50_000;
    std::thread::scope(|s| {
        // b consumes while a shuts down: shutdown waits until b acknowledged everything.
        let reader = s.spawn(|| {
            for i in 0..N {
                let e = inbox
                    .recv_timeout(T)
                    .expect("queued message lost at shutdown");
                assert_eq!(seq(&e.payload), i);
            }
        });
        for i in 0..N {
            nodes[0].send(&to, payload(i, 100)).unwrap();
        }
        let a = nodes.remove(0);
        a.shutdown();
        reader.join().unwrap();
    });
    let failed = events
        .try_iter()
        .find(|e| matches!(e, Event::SendFailed { .. }));
    assert!(failed.is_none(), "{failed:?}");
}

/// A peer that never reads its socket never acknowledges: at shutdown (after
/// `shutdown_timeout`) everything it did not acknowledge is handed back, with its payload.
#[test]
fn shutdown_hands_back_what_a_stalled_receiver_never_acknowledged() {
    let b_addr = free_addrs(1)[0];
    let b = Node::start(
        NodeConfig::new("b", b_addr, SECRET)
            .peer("a", "127.0.0.1:9".parse().unwrap())
            .shutdown_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let never_reads = raw_peer(b_addr, "a", "b");
    assert!(b.wait_for_peers(&["a"], T));
    let events = b.events();
    // It never gives credit (no SYNC): 64 KiB per mailbox, so spread over 32 of them.
    let (mut sent, mut i) = (0u64, 0u64);
    let mut full = 0;
    while full < 32 && i < 1_000_000 {
        let to = Address::new("a", &format!("inbox{}", i % 32)).unwrap();
        match b.try_send(&to, payload(i, 100)) {
            Ok(()) => {
                sent += 1;
                full = 0;
            }
            Err(Error::Full { .. }) => full += 1,
            Err(e) => panic!("{e}"),
        }
        i += 1;
    }
    assert!(sent > 10_000, "sent {sent}");
    b.shutdown();
    let failed: u64 = events
        .try_iter()
        .filter_map(|e| match e {
            Event::SendFailed {
                count, messages, ..
            } => {
                assert_eq!(
                    count as usize,
                    messages.len(),
                    "every failed message is handed back"
                );
                Some(count)
            }
            _ => None,
        })
        .sum();
    assert_eq!(failed, sent, "nothing was acknowledged");
    drop(never_reads);
}

#[test]
fn declared_mailboxes_keep_what_arrives_before_they_are_claimed() {
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.mailbox("early"))
        .collect();
    let nodes = start(cfgs);
    nodes[0]
        .send(&Address::new("b", "early").unwrap(), &b"first"[..])
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mb = nodes[1].mailbox("early").unwrap();
    assert_eq!(&mb.recv_timeout(T).unwrap().payload[..], b"first");
    assert_eq!(nodes[1].stats().undeliverable, 0);
    assert!(matches!(
        nodes[1].mailbox("early"),
        Err(Error::MailboxExists(_))
    ));
}

/// IPv6: nodes listen and dial on `[::1]` (one of them on the unspecified `[::]`), messages
/// small and in pieces go both ways, and both shut down promptly (the shutdown wakes its
/// acceptor through the listener's own address family).
#[test]
fn nodes_talk_over_ipv6_and_shut_down_promptly() {
    use std::net::TcpListener;
    let free = || {
        TcpListener::bind("[::1]:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let at = |host: &str, port: u16| format!("[{host}]:{port}").parse().unwrap();
    // A port found free may be taken by another test's node before this one binds it (a
    // wildcard listener clashes with any address): pick again, a bounded number of times.
    let mut tries = 0;
    let (a, b) = loop {
        tries += 1;
        let (pa, pb) = (free(), free());
        let peer_b: batchwire::PeerSpec = format!("b=[::1]:{pb}").parse().unwrap();
        let a = Node::start(
            NodeConfig::new("a", at("::", pa), SECRET).peer(peer_b.name.clone(), peer_b.addr),
        );
        let b = a.as_ref().ok().map(|_| {
            Node::start(NodeConfig::new("b", at("::1", pb), SECRET).peer("a", at("::1", pa)))
        });
        match (a, b) {
            (Ok(a), Some(Ok(b))) => break (a, b),
            (Err(batchwire::Error::Listen { .. }), _)
            | (_, Some(Err(batchwire::Error::Listen { .. })))
                if tries < 5 => {}
            (a, b) => panic!("cannot start: {:?} {:?}", a.err(), b.and_then(|b| b.err())),
        }
    };
    assert!(a.wait_for_peers(&["b"], T), "{:?}", a.connected_peers());
    assert!(b.wait_for_peers(&["a"], T));
    // Membership over IPv6 datagrams (static peers become members): each sees the other
    // alive, and datagrams went both ways.
    let alive = |n: &Node, who: &str| {
        n.wait_for_members(T, |v| {
            v.iter()
                .any(|m| m.name == who && m.state == batchwire::MemberState::Alive)
        })
    };
    assert!(
        alive(&a, "b") && alive(&b, "a"),
        "{:?} {:?}",
        a.members(),
        b.members()
    );
    for n in [&a, &b] {
        let m = n.stats().membership;
        assert!(m.packets_in > 0 && m.packets_out > 0, "{m:?}");
        assert_eq!(m.datagrams_refused, 0, "{m:?}");
    }
    let (ma, mb) = (a.mailbox("in").unwrap(), b.mailbox("in").unwrap());
    let big = vec![7u8; 300_000];
    for k in 0..100u8 {
        ma.send(&mb.address(), vec![k]).unwrap();
        mb.send(&ma.address(), vec![k]).unwrap();
    }
    ma.send(&mb.address(), big.clone()).unwrap();
    for k in 0..100u8 {
        assert_eq!(&mb.recv_timeout(T).unwrap().payload[..], &[k]);
        assert_eq!(&ma.recv_timeout(T).unwrap().payload[..], &[k]);
    }
    assert_eq!(mb.recv_timeout(T).unwrap().payload.len(), big.len());
    assert!(a.stats().peers[0].fragments_sent > 0);
    let t0 = Instant::now();
    drop((ma, mb));
    a.shutdown();
    b.shutdown();
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        t0.elapsed()
    );
}

/// A node alone (no peers known yet) sends to all: itself only, with every bundler (the
/// transfer-queue path once indexed the first peer of an empty list).
#[test]
fn send_all_with_no_peers_reaches_this_node_only() {
    for kind in BundlerKind::ALL {
        let addr = common::free_addrs(1)[0];
        let node = Node::start(NodeConfig::new("alone", addr, SECRET).bundler(*kind)).unwrap();
        let inbox = node.mailbox("all").unwrap();
        node.send_all("all", &b"me"[..]).unwrap();
        node.send_others("all", &b"nobody"[..]).unwrap();
        let e = inbox.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&e.payload[..], b"me", "{kind:?}");
        assert!(
            inbox.recv_timeout(Duration::from_millis(100)).is_err(),
            "{kind:?}"
        );
        node.shutdown();
    }
}

/// A peer that restarts takes sends the moment this node sees it connected again: its
/// lane stops refusing them (as down, since it said goodbye) in the same session turn
/// that brings it up, not later when the event is handed out (a send in between was
/// refused with `PeerDown`, 1 run in 10 of a TLS test).
#[test]
fn a_restarted_peer_takes_sends_as_soon_as_it_is_seen_connected() {
    let cfgs: Vec<NodeConfig> = mesh(&["ra", "rb"])
        .into_iter()
        .map(|c| c.mailbox("inbox"))
        .collect();
    let b_cfg = cfgs[1].clone();
    let mut nodes = start(cfgs);
    let mut b = nodes.pop().unwrap();
    let a = nodes.pop().unwrap();
    let to_b = Address::new("rb", "inbox").unwrap();
    let seen = |a: &Node| a.connected_peers().iter().any(|p| p == "rb");
    for round in 0..8u64 {
        b.shutdown();
        let deadline = Instant::now() + T;
        while seen(&a) {
            assert!(
                Instant::now() < deadline,
                "round {round}: rb still connected"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        b = Node::start(b_cfg.clone()).unwrap();
        let inbox = b.mailbox("inbox").unwrap();
        while !seen(&a) {
            assert!(Instant::now() < deadline, "round {round}: rb not back");
            std::thread::yield_now();
        }
        a.send(&to_b, round.to_le_bytes().to_vec())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(seq(&inbox.recv_timeout(T).unwrap().payload), round);
    }
}
