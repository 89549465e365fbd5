//! Connections on demand (`NodeConfig::idle_close`): between members, a connection is made
//! on the first send (by either end), closed once idle, and the session survives the close:
//! what is sent next resumes it exactly once and in order. A member nobody talks to costs
//! no connection and no thread.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batchwire::{Address, CloseReason, Event, Member, Node, NodeConfig};
use common::*;

const T: Duration = Duration::from_secs(20);
const IDLE: Duration = Duration::from_millis(400);

fn node(name: &str, seed: Option<SocketAddr>) -> Node {
    let mut c =
        NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET).idle_close(Some(IDLE));
    if let Some(s) = seed {
        c = c.join(s);
    }
    Node::start(c).unwrap()
}

fn to(node: &str, mailbox: &str) -> Address {
    Address::new(node, mailbox).unwrap()
}

fn live(v: &[Member]) -> usize {
    v.iter().filter(|m| m.state.is_live()).count()
}

/// Wait (bounded) until `n` has no connection.
fn idles_out(n: &Node) -> bool {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if n.connected_peers().is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn peer_stat(n: &Node, peer: &str) -> batchwire::PeerStats {
    n.stats()
        .peers
        .into_iter()
        .find(|p| p.peer == peer)
        .unwrap_or_else(|| panic!("{}: no peer {peer}", n.name()))
}

/// Receive `count` messages on `mb`, checking they are `first..first+count` in order.
fn expect_seq(mb: &batchwire::Mailbox, first: u64, count: u64) {
    for i in first..first + count {
        let e = mb
            .recv_timeout(T)
            .unwrap_or_else(|e| panic!("message {i}: {e:?}"));
        let got = u64::from_le_bytes(e.payload[..8].try_into().unwrap());
        assert_eq!(got, i, "in order, once");
    }
    assert!(
        mb.recv_timeout(Duration::from_millis(50)).is_err(),
        "nothing more"
    );
}

#[test]
fn connections_come_with_traffic_and_go_when_idle_and_the_session_survives() {
    let a = node("a", None);
    let b = node("b", Some(a.local_addr()));
    let c = node("c", Some(a.local_addr()));
    for n in [&a, &b, &c] {
        assert!(n.wait_for_members(T, |v| live(v) == 2), "{}", n.name());
    }
    // The joins' connections idle out; then no member has a connection or a writer.
    for n in [&a, &b, &c] {
        assert!(idles_out(n), "{}: {:?}", n.name(), n.connected_peers());
    }
    let resting = a.threads();
    let ev_a = a.events();
    let inbox = b.mailbox("inbox").unwrap();
    let from_a = a.mailbox("out").unwrap();

    // The first send dials; 1000 messages arrive in order.
    for i in 0..1000u64 {
        from_a
            .send(&to("b", "inbox"), i.to_le_bytes().to_vec())
            .unwrap();
    }
    expect_seq(&inbox, 0, 1000);
    assert!(
        a.threads() > resting,
        "a writer and a reader while it flows"
    );
    // Idle: closed, by one end or the other; the threads go with it.
    assert!(idles_out(&a) && idles_out(&b));
    let deadline = Instant::now() + T;
    while a.threads() > resting && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.threads(), resting, "no thread for an idle member");
    // Again, from either end: the same session goes on (numbering continues, nothing
    // resent, the peer never down or restarted).
    for i in 1000..2000u64 {
        from_a
            .send(&to("b", "inbox"), i.to_le_bytes().to_vec())
            .unwrap();
    }
    expect_seq(&inbox, 1000, 1000);
    let back = a.mailbox("back").unwrap();
    let from_b = b.mailbox("out").unwrap();
    assert!(idles_out(&a) && idles_out(&b));
    for i in 0..100u64 {
        from_b
            .send(&to("a", "back"), i.to_le_bytes().to_vec())
            .unwrap();
    }
    expect_seq(&back, 0, 100);
    let ab = peer_stat(&a, "b");
    assert_eq!(ab.messages_sent, 2000);
    assert_eq!(ab.resent, 0, "nothing written twice");
    assert!(ab.connects >= 3, "a connection per burst: {}", ab.connects);
    let mut idle_closes = 0;
    while let Ok(e) = ev_a.recv_timeout(Duration::from_millis(100)) {
        match e {
            Event::PeerDown { .. } => panic!("a declared a peer down: {e:?}"),
            Event::PeerUp { ref peer, .. } if peer == "b" => {
                panic!("the session with b started over: {e:?}")
            }
            Event::Disconnected {
                reason: CloseReason::Idle,
                ..
            } => idle_closes += 1,
            Event::Disconnected { ref reason, .. } => panic!("a connection ended: {reason}"),
            _ => {}
        }
    }
    assert!(idle_closes >= 2, "{idle_closes} idle closes");
    // c was never talked to: b holds nothing for it (no peer: no lane, window or queue,
    // and no connection), and a only the join's.
    let b_peers: Vec<String> = b.stats().peers.into_iter().map(|p| p.peer).collect();
    assert!(
        !b_peers.contains(&"c".to_string()),
        "b and c never talked: {b_peers:?}"
    );
    // The first send to a member makes its peer, which dials: it arrives.
    let c_in = c.mailbox("from-b").unwrap();
    b.send(&to("c", "from-b"), &b"first"[..]).unwrap();
    assert_eq!(&c_in.recv_timeout(T).unwrap().payload[..], b"first");
    assert_eq!(peer_stat(&b, "c").messages_sent, 1);
    // send_others reaches every member, connected or not.
    let cin = c.mailbox("all").unwrap();
    let bin = b.mailbox("all").unwrap();
    a.send_others("all", &b"hello"[..]).unwrap();
    for mb in [&bin, &cin] {
        assert_eq!(&mb.recv_timeout(T).unwrap().payload[..], b"hello");
    }
    // From a member that holds no peer for some of them yet (b had none for c before the
    // send above made it; d joins now and nobody sent to it): every member gets it.
    let d = node("d", Some(a.local_addr()));
    for n in [&a, &b, &c, &d] {
        assert!(n.wait_for_members(T, |v| live(v) == 3), "{}", n.name());
    }
    let din = d.mailbox("all").unwrap();
    let ain = a.mailbox("all").unwrap();
    b.send_others("all", &b"from b"[..]).unwrap();
    for mb in [&ain, &cin, &din] {
        assert_eq!(&mb.recv_timeout(T).unwrap().payload[..], b"from b");
    }
    // Requests across a closed connection.
    assert!(idles_out(&a));
    let server = b.mailbox("echo").unwrap();
    let h = std::thread::spawn(move || {
        let e = server.recv_timeout(T).unwrap();
        e.reply(e.payload.clone()).unwrap();
    });
    let r = a.request(&to("b", "echo"), &b"ping"[..], T).unwrap();
    assert_eq!(&r.payload[..], b"ping");
    h.join().unwrap();
}

#[test]
fn sends_that_race_the_idle_close_are_delivered_once_in_order() {
    // Sends come about one idle time apart, so some land as a connection is being closed
    // for idleness, by either end.
    let a = node("a", None);
    let b = node("b", Some(a.local_addr()));
    for n in [&a, &b] {
        assert!(n.wait_for_members(T, |v| live(v) == 1));
    }
    let inbox = b.mailbox("inbox").unwrap();
    let from_a = a.mailbox("out").unwrap();
    let back = a.mailbox("back").unwrap();
    let from_b = b.mailbox("out").unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let rounds = 24u64;
    for i in 0..rounds {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // 0.8 ..= 1.2 idle times.
        let gap = IDLE.mul_f64(0.8 + (rng % 400) as f64 / 1000.0);
        std::thread::sleep(gap);
        from_a
            .send(&to("b", "inbox"), i.to_le_bytes().to_vec())
            .unwrap();
        if i % 3 == 0 {
            from_b
                .send(&to("a", "back"), (i / 3).to_le_bytes().to_vec())
                .unwrap();
        }
    }
    expect_seq(&inbox, 0, rounds);
    expect_seq(&back, 0, rounds.div_ceil(3));
    assert_eq!(peer_stat(&a, "b").send_failed, 0);
    assert_eq!(peer_stat(&b, "a").send_failed, 0);
}

#[test]
fn the_full_mesh_dials_every_member_when_it_joins_and_keeps_it() {
    let mesh = |name: &str, seed: Option<SocketAddr>| {
        let mut c = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET).idle_close(None);
        if let Some(s) = seed {
            c = c.join(s);
        }
        Node::start(c).unwrap()
    };
    let a = mesh("a", None);
    let b = mesh("b", Some(a.local_addr()));
    let c = mesh("c", Some(a.local_addr()));
    // Nobody sends anything: every member is connected to every other all the same.
    for (n, others) in [(&a, ["b", "c"]), (&b, ["a", "c"]), (&c, ["a", "b"])] {
        assert!(n.wait_for_members(T, |v| live(v) == 2));
        let deadline = Instant::now() + T;
        while n.connected_peers() != others && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(n.connected_peers(), others, "{}", n.name());
    }
    // And stays so (no idle close).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(a.connected_peers(), ["b", "c"]);
    assert_eq!(peer_stat(&b, "c").connects, 1, "b-c dialled once, by b");
}

#[test]
fn a_member_that_left_and_came_back_is_sent_to_without_a_failure() {
    // b joins through c, so a learns of it only from the membership (no connection).
    let a = node("a", None);
    let c = node("c", Some(a.local_addr()));
    let b = node("b", Some(c.local_addr()));
    assert!(a.wait_for_members(T, |v| live(v) == 2));
    let out = a.mailbox("out").unwrap();
    // a talked to b once: b's session at a is up.
    let inbox = b.mailbox("inbox").unwrap();
    out.send(&to("b", "inbox"), 0u64.to_le_bytes().to_vec())
        .unwrap();
    expect_seq(&inbox, 0, 1);
    let b_addr = b.local_addr();
    drop(inbox);
    drop(b);
    assert!(a.wait_for_members(T, |v| live(v) == 1), "b left");
    assert!(out.send(&to("b", "inbox"), vec![0]).is_err(), "b is down");
    // b again, same name and address, a new incarnation, through c.
    let cfg = NodeConfig::new("b", b_addr, SECRET)
        .idle_close(Some(IDLE))
        .join(c.local_addr());
    let b = Node::start(cfg).unwrap();
    assert!(a.wait_for_members(T, |v| live(v) == 2), "b is back");
    let inbox = b.mailbox("inbox").unwrap();
    // Not refused as down: it is queued, dialled, delivered.
    for i in 0..10u64 {
        out.send(&to("b", "inbox"), i.to_le_bytes().to_vec())
            .unwrap();
    }
    expect_seq(&inbox, 0, 10);
}

/// Traffic at scale: 64 nodes in one process, each sending to 8 others chosen at random
/// (seeded) and one node sending to everyone with `send_others`, in two bursts with an idle
/// close between them: connections open with the first burst, close while idle, open again
/// with the second. Every receiver gets each sender's messages exactly once, in order.
#[test]
fn sixty_four_members_each_talking_to_eight_get_everything_once_in_order() {
    const N: usize = 64;
    const PER_BURST: u64 = 50;
    let first = node("s00", None);
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for i in 1..N {
        nodes.push(node(&format!("s{i:02}"), Some(seed)));
    }
    for n in &nodes {
        assert!(
            n.wait_for_members(Duration::from_secs(60), |v| live(v) == N - 1),
            "{} sees {} members",
            n.name(),
            live(&n.members())
        );
    }
    let inboxes: Vec<_> = nodes.iter().map(|n| n.mailbox("inbox").unwrap()).collect();
    let outs: Vec<_> = nodes.iter().map(|n| n.mailbox("out").unwrap()).collect();
    // Each node's 8 targets, from a seeded xorshift.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let targets: Vec<Vec<usize>> = (0..N)
        .map(|i| {
            let mut t = Vec::new();
            while t.len() < 8 {
                let j = (next() % N as u64) as usize;
                if j != i && !t.contains(&j) {
                    t.push(j);
                }
            }
            t
        })
        .collect();
    // What each receiver expects from each sender: a count (messages are numbered per
    // sender and receiver; the broadcast is numbered on its own, tagged).
    let burst = |round: u64| {
        for (i, t) in targets.iter().enumerate() {
            for &j in t {
                for k in 0..PER_BURST {
                    let seq = round * PER_BURST + k;
                    let mut p = vec![0u8];
                    p.extend_from_slice(&seq.to_le_bytes());
                    outs[i].send(&to(&format!("s{j:02}"), "inbox"), p).unwrap();
                }
            }
        }
        for k in 0..PER_BURST {
            let seq = round * PER_BURST + k;
            let mut p = vec![1u8];
            p.extend_from_slice(&seq.to_le_bytes());
            nodes[0].send_others("inbox", p).unwrap();
        }
    };
    let expected: Vec<usize> = (0..N)
        .map(|j| {
            let direct = targets.iter().filter(|t| t.contains(&j)).count();
            direct * PER_BURST as usize + if j == 0 { 0 } else { PER_BURST as usize }
        })
        .collect();
    // Per receiver: (sender, broadcast?) -> next sequence number expected.
    let mut next_seq: Vec<std::collections::HashMap<(String, u8), u64>> =
        vec![Default::default(); N];
    let mut take = |round: u64| {
        for (j, mb) in inboxes.iter().enumerate() {
            for _ in 0..expected[j] {
                let e = mb
                    .recv_timeout(T)
                    .unwrap_or_else(|e| panic!("s{j:02}, round {round}: {e:?}"));
                let kind = e.payload[0];
                let seq = u64::from_le_bytes(e.payload[1..9].try_into().unwrap());
                let from = e.from.node().to_string();
                let want = next_seq[j].entry((from.clone(), kind)).or_insert(0);
                assert_eq!(
                    seq, *want,
                    "s{j:02} from {from} (kind {kind}): once, in order"
                );
                *want += 1;
            }
        }
    };
    burst(0);
    take(0);
    let connected: usize = nodes.iter().map(|n| n.connected_peers().len()).sum();
    assert!(connected > 0);
    // Idle: every connection closes.
    for n in &nodes {
        assert!(idles_out(n), "{}: {:?}", n.name(), n.connected_peers());
    }
    burst(1);
    take(1);
    for (j, mb) in inboxes.iter().enumerate() {
        assert!(
            mb.recv_timeout(Duration::from_millis(20)).is_err(),
            "s{j:02}: a message more"
        );
    }
    // Every count complete: two bursts from every sender that had this receiver.
    for (j, m) in next_seq.iter().enumerate() {
        assert!(m.values().all(|&v| v == 2 * PER_BURST), "s{j:02}: {m:?}");
    }
    let failed: u64 = nodes
        .iter()
        .flat_map(|n| n.stats().peers)
        .map(|p| p.send_failed)
        .sum();
    assert_eq!(failed, 0);
}

/// A member the membership says is alive, but whose data connections all fail (here its
/// peer table is full, so it refuses every new node): what is sent to it is handed back as
/// failed (unreached) once a whole first connection's time passed (the longer of
/// `peer_timeout` and `handshake_timeout`, and `reconnect_max`), not held for good; it is
/// not declared down, so what is sent next is held again.
#[test]
fn what_is_sent_to_a_member_that_cannot_be_reached_is_handed_back() {
    let a = node("a", None);
    let b = Node::start(
        NodeConfig::new("b", "127.0.0.1:0".parse().unwrap(), SECRET)
            .idle_close(Some(IDLE))
            .max_peers(1)
            .join(a.local_addr()),
    )
    .unwrap();
    let c = Node::start(
        NodeConfig::new("c", "127.0.0.1:0".parse().unwrap(), SECRET)
            .idle_close(Some(IDLE))
            .heartbeat_interval(Duration::from_millis(100))
            .peer_timeout(Duration::from_millis(800))
            .handshake_timeout(Duration::from_secs(1))
            .reconnect(Duration::from_millis(50), Duration::from_millis(500))
            .join(a.local_addr()),
    )
    .unwrap();
    let _svc = b.mailbox("svc").unwrap();
    for n in [&a, &b, &c] {
        assert!(n.wait_for_members(T, |v| live(v) == 2), "{}", n.name());
    }
    let events = c.events();
    let t0 = Instant::now();
    c.send(&to("b", "svc"), 7u64.to_le_bytes().to_vec())
        .unwrap();
    let failed = wait_event(&events, T, |e| matches!(e, Event::SendFailed { .. }));
    let took = t0.elapsed();
    match failed {
        Some(Event::SendFailed {
            peer,
            count,
            reason,
            ..
        }) => {
            assert_eq!((peer.as_str(), count), ("b", 1));
            assert!(
                matches!(reason, batchwire::FailReason::Unreached { .. }),
                "{reason:?}"
            );
        }
        other => panic!(
            "not handed back: {other:?}; c: {:?}; b: {:?} {:?}",
            c.stats().peers.iter().find(|p| p.peer == "b"),
            b.stats().handshakes,
            b.connected_peers()
        ),
    }
    assert!(took >= Duration::from_millis(1400), "failed after {took:?}");
    // Not declared down: a later send is taken and held again.
    c.send(&to("b", "svc"), 8u64.to_le_bytes().to_vec())
        .unwrap();
    // The membership still says b is alive: only its connections fail.
    assert!(
        c.members()
            .iter()
            .any(|m| m.name == "b" && m.state.is_live())
    );
}
