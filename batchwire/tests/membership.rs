//! Cluster membership between real nodes on loopback: joining through one seed, the view
//! and its events, a graceful leave, static peers as members, and the refusals (wrong
//! secret, a certificate naming another node, forged membership packets).
//! Crashes (SIGKILL) are in the CLI's process tests and the netns test.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use batchwire::{Address, Event, Member, MemberState, Node, NodeConfig, TlsFiles};
use batchwire_core::frame::Frame;
use common::raw::Datagrams;
use common::*;

const T: Duration = Duration::from_secs(20);

fn live(v: &[Member]) -> Vec<String> {
    let mut n: Vec<String> = v
        .iter()
        .filter(|m| m.state.is_live())
        .map(|m| m.name.clone())
        .collect();
    n.sort();
    n
}

fn node(name: &str, seed: Option<SocketAddr>) -> Node {
    let mut c = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET);
    if let Some(s) = seed {
        c = c.join(s);
    }
    Node::start(c).unwrap()
}

/// Wait until `n` sees exactly `names` live.
fn sees(n: &Node, names: &[&str]) -> bool {
    n.wait_for_members(T, |v| live(v) == names)
}

#[test]
fn nodes_join_through_one_seed_and_send_to_the_live_view() {
    let a = node("a", None);
    let ev_a = a.events();
    let seed = a.local_addr();
    let b = node("b", Some(seed));
    let c = node("c", Some(seed));
    // "0d" sorts before every other name: it is the one to dial them all, knowing only c.
    let d = node("0d", Some(c.local_addr()));
    assert!(sees(&a, &["0d", "b", "c"]), "a: {:?}", a.members());
    assert!(sees(&b, &["0d", "a", "c"]), "b: {:?}", b.members());
    assert!(sees(&c, &["0d", "a", "b"]), "c: {:?}", c.members());
    assert!(sees(&d, &["a", "b", "c"]), "0d: {:?}", d.members());
    // The view carries what members advertise.
    let vb = a.members().into_iter().find(|m| m.name == "b").unwrap();
    assert_eq!(vb.addr, b.advertised_addr());
    assert_eq!(vb.state, MemberState::Alive);
    // a reported each join once.
    let mut joined = Vec::new();
    while let Ok(e) = ev_a.recv_timeout(Duration::from_millis(100)) {
        if let Event::MemberJoined { member } = e {
            joined.push(member.name);
        }
    }
    joined.sort();
    assert_eq!(joined, ["0d", "b", "c"]);
    // send_others from the newest node reaches everyone it learnt of through the view.
    let inboxes: Vec<_> = [&a, &b, &c]
        .iter()
        .map(|n| n.mailbox("inbox").unwrap())
        .collect();
    d.send_others("inbox", &b"hello"[..]).unwrap();
    for (i, mb) in inboxes.iter().enumerate() {
        let e = mb
            .recv_timeout(T)
            .unwrap_or_else(|e| panic!("inbox {i}: {e:?}"));
        assert_eq!(&e.payload[..], b"hello");
        assert_eq!(e.from.node(), "0d");
    }
    // At rest the membership costs little: the guide's promise is under 1 KB/s sent per
    // node (a probe and its ack each way per second, about 100 B/s). Counted in bytes over
    // 3 s after the join's gossip settled (a second), for every node.
    std::thread::sleep(Duration::from_secs(1));
    let nodes = [&a, &b, &c, &d];
    let before: Vec<_> = nodes.iter().map(|n| n.stats().membership).collect();
    let t0 = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let secs = t0.elapsed().as_secs_f64();
    for (n, before) in nodes.iter().zip(before) {
        let after = n.stats().membership;
        let sent = (after.bytes_out - before.bytes_out) as f64 / secs;
        let heard = (after.bytes_in - before.bytes_in) as f64 / secs;
        eprintln!(
            "membership at rest on {}: sent {sent:.0} B/s, heard {heard:.0} B/s",
            n.name()
        );
        assert!(sent < 1024.0, "{}: {sent:.0} B/s sent at rest", n.name());
        assert!(heard < 1024.0, "{}: {heard:.0} B/s heard at rest", n.name());
        assert_eq!(after.violations, 0);
    }
}

#[test]
fn a_graceful_leave_is_a_leave_not_a_suspicion() {
    let a = node("a", None);
    let b = node("b", Some(a.local_addr()));
    let c = node("c", Some(a.local_addr()));
    assert!(sees(&a, &["b", "c"]) && sees(&b, &["a", "c"]) && sees(&c, &["a", "b"]));
    // b tells the members it is connected to that it leaves; the others learn it by
    // gossip, as a member gone down. Members connect as they need to: make sure b and c
    // are (seen once in CI under load: c had no connection from b yet, and saw b down;
    // and b must know c before it can send to it: once in CI it did not yet, UnknownNode).
    let c_inbox = c.mailbox("inbox").unwrap();
    b.send(&Address::new("c", "inbox").unwrap(), &b"hi"[..])
        .unwrap();
    assert_eq!(&c_inbox.recv_timeout(T).unwrap().payload[..], b"hi");
    let (ev_a, ev_c) = (a.events(), c.events());
    b.shutdown();
    for (n, ev) in [(&a, &ev_a), (&c, &ev_c)] {
        let left = wait_event(ev, T, |e| matches!(e, Event::MemberLeft { .. }));
        match left {
            Some(Event::MemberLeft { member }) => assert_eq!(member.name, "b"),
            other => panic!(
                "{}: no leave: {other:?} {:?}",
                n.name(),
                n.stats().membership
            ),
        }
        assert!(sees(n, &[if n.name() == "a" { "c" } else { "a" }]));
        let v = n.members();
        let vb = v.iter().find(|m| m.name == "b").unwrap();
        assert_eq!(vb.state, MemberState::Left);
    }
    // Nobody suspected it.
    for e in ev_a.try_iter().chain(ev_c.try_iter()) {
        assert!(
            !matches!(&e, Event::MemberSuspected { member } if member.name == "b"),
            "{e:?}"
        );
    }
    // Sends to it fail: at once, or, if a connection from b that raced its leave took the
    // session back up for b's last flush (seen about once in 40 runs at first, more often
    // with the faster wake-ups since), as soon as that connection is gone; and whatever
    // was accepted meanwhile is acknowledged by b or reported failed, not dropped.
    let b_stats = |n: &Node| {
        let s = n.stats();
        let p = s.peers.iter().find(|p| p.peer == "b").cloned().unwrap();
        p.acked + p.send_failed
    };
    let settled0 = b_stats(&a);
    let to = Address::new("b", "inbox").unwrap();
    let deadline = std::time::Instant::now() + T;
    let mut accepted = 0u64;
    loop {
        match a.send(&to, &b"x"[..]) {
            Err(batchwire::Error::PeerDown(_)) => break,
            Ok(()) => accepted += 1,
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never went down on a"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    while b_stats(&a) - settled0 < accepted && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        b_stats(&a) - settled0,
        accepted,
        "sends accepted for b neither acknowledged nor reported failed"
    );
}

#[test]
fn static_peers_are_members_and_a_newcomer_learns_them() {
    let nodes = start(mesh(&["a", "b"]));
    assert!(sees(&nodes[0], &["b"]) && sees(&nodes[1], &["a"]));
    let c = node("c", Some(nodes[1].local_addr()));
    assert!(sees(&c, &["a", "b"]), "c: {:?}", c.members());
    assert!(sees(&nodes[0], &["b", "c"]));
}

#[test]
fn membership_off_keeps_the_static_world() {
    let mut cfgs = mesh(&["a", "b"]);
    cfgs = cfgs.into_iter().map(|c| c.without_membership()).collect();
    let nodes = start(cfgs);
    std::thread::sleep(Duration::from_millis(300));
    assert!(nodes[0].members().is_empty());
    let bad = NodeConfig::new("x", "127.0.0.1:0".parse().unwrap(), SECRET)
        .without_membership()
        .join(nodes[0].local_addr());
    assert!(matches!(Node::start(bad), Err(batchwire::Error::Config(_))));
}

#[test]
fn without_the_secret_a_node_never_appears_in_a_view() {
    let a = node("a", None);
    let ev = a.events();
    let m = Node::start(
        NodeConfig::new(
            "mallory",
            "127.0.0.1:0".parse().unwrap(),
            &b"wrong secret"[..],
        )
        .join(a.local_addr()),
    )
    .unwrap();
    let failed = wait_event(&ev, T, |e| matches!(e, Event::HandshakeFailed { .. }));
    assert!(failed.is_some(), "the seed refused it");
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.members().is_empty(), "{:?}", a.members());
    assert!(m.members().is_empty(), "{:?}", m.members());
}

#[test]
fn joining_over_tls_checks_the_certificates_names() {
    let certs = test_certs("main");
    let cfg = |name: &str, files: &str, seed: Option<SocketAddr>| {
        let mut c = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET)
            .tls(TlsFiles::in_dir(&certs, files));
        if let Some(s) = seed {
            c = c.join(s);
        }
        c
    };
    let a = Node::start(cfg("a", "a", None)).unwrap();
    let b = Node::start(cfg("b", "b", Some(a.local_addr()))).unwrap();
    assert!(sees(&a, &["b"]) && sees(&b, &["a"]));
    // "zz" presenting c's certificate: refused by the seed before it is in any view.
    let ev = a.events();
    let z = Node::start(cfg("zz", "c", Some(a.local_addr()))).unwrap();
    let failed = wait_event(&ev, T, |e| matches!(e, Event::HandshakeFailed { .. }));
    assert!(failed.is_some());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(live(&a.members()), ["b"]);
    assert!(z.members().is_empty());
}

/// Membership travels on its own datagrams: a MEMBER frame on a data connection (even
/// from a peer with the secret) is a protocol violation that closes that connection only.
#[test]
fn a_member_frame_on_a_data_connection_closes_only_that_connection() {
    // A silent raw peer would be cut at peer_timeout anyway: make that far off, so only
    // the violation can close it within the test's wait.
    let a = Node::start(
        NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), SECRET)
            .peer_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let _b = node("b", Some(a.local_addr()));
    assert!(sees(&a, &["b"]));
    let b_connects = || {
        let st = a.stats();
        st.peers.iter().find(|p| p.peer == "b").map(|p| p.connects)
    };
    // b joined over a connection of its own, which (connections on demand, closed after
    // 60 s idle) stays the a-b connection. Count from there.
    let t0 = std::time::Instant::now();
    while b_connects() < Some(1) && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let b_before = b_connects();
    assert_eq!(b_before, Some(1), "the join connection only");
    let ev = a.events();
    let s = raw_peer(a.local_addr(), "m", "a");
    let mut out = Vec::new();
    let mut packet = vec![0u8];
    packet.extend_from_slice(&postcard_header_from("m"));
    Frame::Member(packet.into()).encode(&mut out);
    let mut forger = raw::Raw {
        s,
        buf: Default::default(),
    };
    forger.s.write_all(&out).unwrap();
    assert!(
        forger.closed_within(Duration::from_secs(10)),
        "the connection carrying a MEMBER frame stayed open"
    );
    // Counted as m's violation (as the connection is torn down, just after the close).
    let violations = || a.stats().peer("m").map(|p| p.protocol_violations);
    let t0 = std::time::Instant::now();
    while violations() != Some(1) && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(violations(), Some(1), "counted as m's violation");
    // b's connection was untouched.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(live(&a.members()), ["b"]);
    assert!(a.connected_peers().contains(&"b".to_string()));
    assert_eq!(b_connects(), b_before);
    let lost: Vec<_> = ev
        .try_iter()
        .filter(|e| matches!(e, Event::Disconnected { peer, .. } if peer == "b"))
        .collect();
    assert!(lost.is_empty(), "{lost:?}");
}

/// Datagrams that are not ours, forged (another secret), meant for another member or an
/// earlier boot of this one, replayed or too long are refused and counted before anything
/// in them is believed; a
/// sealed one whose SWIM sender is not its sealer is a violation, dropped. None of it
/// touches the view or b.
#[test]
fn forged_replayed_and_misaddressed_datagrams_are_refused_and_counted() {
    let a = node("a", None);
    let b = node("b", Some(a.local_addr()));
    assert!(sees(&a, &["b"]) && sees(&b, &["a"]));
    let to = a.local_addr();
    let refused = || a.stats().membership.datagrams_refused;
    let violations = || a.stats().membership.violations;
    let wait = |what: &dyn Fn() -> u64, n: u64| {
        let t0 = std::time::Instant::now();
        while what() < n && t0.elapsed() < T {
            std::thread::sleep(Duration::from_millis(10));
        }
        what()
    };
    assert_eq!((refused(), violations()), (0, 0));
    let boot = a.incarnation();
    assert_eq!(
        b.members()
            .iter()
            .find(|m| m.name == "a")
            .map(|m| m.incarnation),
        Some(boot),
        "what members see"
    );
    let mut m = Datagrams::new("m", 1, SECRET);
    // Not a membership datagram at all.
    m.send_raw(to, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(wait(&refused, 1), 1);
    // Sealed with another secret.
    Datagrams::new("m", 1, b"not the secret").send(to, "a", boot, b"\x00hello");
    assert_eq!(wait(&refused, 2), 2);
    // Sealed for another member ("z"), sent to a.
    m.send(to, "z", boot, b"\x00hello");
    assert_eq!(wait(&refused, 3), 3);
    // Too long: more than any membership datagram.
    m.send_raw(to, &[b'B'; 4000]);
    assert_eq!(wait(&refused, 4), 4);
    // Sealed by m, but its SWIM packet says it comes from b: a violation, dropped.
    let mut forged = vec![0u8];
    forged.extend_from_slice(&postcard_header_from("b"));
    let d = m.seal("a", boot, &forged);
    m.send_raw(to, &d);
    assert_eq!(wait(&violations, 1), 1);
    // The same datagram again: a replay, refused before the membership sees it.
    m.send_raw(to, &d);
    assert_eq!(wait(&refused, 5), 5);
    // b's real leave notice, sealed by b for an earlier boot of a (recorded before a
    // restarted, and replayed to it): refused, b stays in the view.
    let mut notice = vec![1u8];
    notice.extend_from_slice(&b.incarnation().to_le_bytes());
    Datagrams::new("b", b.incarnation(), SECRET).send(to, "a", boot - 1, &notice);
    assert_eq!(wait(&refused, 6), 6);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!((refused(), violations()), (6, 1));
    assert_eq!(live(&a.members()), ["b"]);
    assert_eq!(live(&b.members()), ["a"]);
}

/// A SWIM header (foca's postcard encoding) claiming to come from `name`: src, its SWIM
/// incarnation, dst, then a Ping.
fn postcard_header_from(name: &str) -> Vec<u8> {
    let id = |n: &str| {
        let mut v = vec![n.len() as u8];
        v.extend_from_slice(n.as_bytes());
        // SocketAddr V4 127.0.0.1:1, started 1, bump 0.
        v.extend_from_slice(&[0, 127, 0, 0, 1, 1, 1, 0]);
        v
    };
    let mut h = id(name);
    h.push(0); // src incarnation
    h.extend(id("a"));
    h.extend_from_slice(&[0, 1]); // Message::Ping(1)
    h
}

/// Two members, the smallest cluster: the one that shuts down is seen as left by the
/// other, never suspected (its leave notice goes before its goodbye).
#[test]
fn in_a_two_member_cluster_a_shutdown_is_a_leave() {
    let a = node("a", None);
    let b = node("b", Some(a.local_addr()));
    assert!(sees(&a, &["b"]) && sees(&b, &["a"]));
    let ev = a.events();
    b.shutdown();
    let left = wait_event(&ev, T, |e| {
        matches!(
            e,
            Event::MemberLeft { .. } | Event::MemberSuspected { .. } | Event::MemberDown { .. }
        )
    });
    assert!(
        matches!(&left, Some(Event::MemberLeft { member }) if member.name == "b"),
        "{left:?}"
    );
}

/// Seeds that reach a member under addresses it does not advertise (a listens on 0.0.0.0
/// and advertises 127.0.0.1, while the seeds say 127.0.0.2 and 127.0.0.3) are dialled at
/// every refresh; such a join connection closes beside the live canonical one instead of
/// replacing it, so the connection carrying traffic is never cut. (Before, the two join
/// connections replaced each other at every refresh.)
#[test]
fn a_refreshed_seed_never_replaces_a_live_connection() {
    let a = Node::start(NodeConfig::new("a", "0.0.0.0:0".parse().unwrap(), SECRET)).unwrap();
    let port = a.local_addr().port();
    let at = |ip: &str| -> SocketAddr { format!("{ip}:{port}").parse().unwrap() };
    // "0" sorts before "a": its join connections are canonical. The name keeps the
    // joiner refreshing once joined.
    let name: batchwire::Seed = format!("localhost:{port}").parse().unwrap();
    let z = Node::start(
        NodeConfig::new("0", "127.0.0.1:0".parse().unwrap(), SECRET)
            .join(at("127.0.0.2"))
            .join(at("127.0.0.3"))
            .join(name)
            .join_refresh(Duration::from_millis(100)),
    )
    .unwrap();
    assert!(sees(&z, &["a"]) && sees(&a, &["0"]));
    std::thread::sleep(Duration::from_millis(500));
    let ev = z.events();
    let connects = || z.stats().peer("a").map(|p| p.connects);
    let before = connects();
    // Twenty refreshes, each finding a under addresses it does not advertise.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(connects(), before, "the live connection was replaced");
    let lost: Vec<_> = ev
        .try_iter()
        .filter(|e| matches!(e, Event::Disconnected { peer, .. } if peer == "a"))
        .collect();
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(live(&z.members()), ["a"]);
}

/// A joiner dials at most a few seed addresses at once, and a join connection that
/// becomes the canonical one (this node's name sorts first) lasts: its place is released
/// once the connection is up, not when it ends. Ten single-node groups reached through
/// seed names all merge. (Before, the places of lasting join connections stayed taken: past
/// eight, every other address was skipped at every refresh.)
#[test]
fn lasting_join_connections_do_not_stop_later_merges() {
    let groups: Vec<Node> = (0..10)
        .map(|i| {
            Node::start(NodeConfig::new(
                format!("g{i}"),
                "127.0.0.1:0".parse().unwrap(),
                SECRET,
            ))
            .unwrap()
        })
        .collect();
    // "0" sorts before every "g": its join connections are canonical; they never idle out.
    let mut cfg = NodeConfig::new("0", "127.0.0.1:0".parse().unwrap(), SECRET)
        .idle_close(None)
        .join_refresh(Duration::from_millis(200));
    for g in &groups {
        let seed: batchwire::Seed = format!("localhost:{}", g.local_addr().port())
            .parse()
            .unwrap();
        cfg = cfg.join(seed);
    }
    let z = Node::start(cfg).unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("g{i}")).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(
        z.wait_for_members(Duration::from_secs(20), |m| {
            all.iter()
                .all(|n| m.iter().any(|x| x.name == *n && x.state.is_live()))
        }),
        "live: {:?}",
        live(&z.members())
    );
}

/// A seed address that does not answer, as a host that is gone (SYNs dropped): a
/// listener whose queue (of one: a backlog of 0) is full. Keep what it returns alive.
/// `None` if this kernel answers a connect to it all the same.
fn silent_seed() -> Option<(socket2::Socket, SocketAddr, Vec<std::net::TcpStream>)> {
    use socket2::{Domain, Socket, Type};
    let silent = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    silent
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    silent.listen(0).unwrap();
    let addr = silent.local_addr().unwrap().as_socket().unwrap();
    let mut fill = Vec::new();
    while fill.len() < 8 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => fill.push(s),
            Err(_) => break,
        }
    }
    if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
        eprintln!("a full listener still answers connects here: not run");
        return None;
    }
    Some((silent, addr, fill))
}

/// A seed address that does not answer does not hold up the join through the next one:
/// each connect runs on its join connection's thread. (Before, the joiner connected to
/// one address at a time and waited out the handshake timeout, 5 s, on the silent one
/// first.)
#[test]
fn a_silent_seed_does_not_hold_up_the_join_through_the_next() {
    let Some((_silent, silent_addr, _fill)) = silent_seed() else {
        return;
    };
    let a = node("a", None);
    let t0 = std::time::Instant::now();
    let b = Node::start(
        NodeConfig::new("b", "127.0.0.1:0".parse().unwrap(), SECRET)
            .join(silent_addr)
            .join(a.local_addr()),
    )
    .unwrap();
    assert!(
        b.wait_for_members(Duration::from_secs(4), |v| live(v) == ["a"]),
        "b sees {:?} after {:?}",
        live(&b.members()),
        t0.elapsed()
    );
}

/// More silent seed addresses listed first than the joiner makes connects at once (8):
/// the live one after them is still dialled once their connects give up (each round
/// starts after the last address dialled), not crowded out round after round.
#[test]
fn silent_seeds_listed_first_cannot_crowd_out_a_live_one() {
    let silent: Vec<_> = (0..9).filter_map(|_| silent_seed()).collect();
    if silent.len() < 9 {
        return;
    }
    let a = node("a", None);
    let t0 = std::time::Instant::now();
    let mut cfg = NodeConfig::new("b", "127.0.0.1:0".parse().unwrap(), SECRET)
        .handshake_timeout(Duration::from_secs(2));
    for (_, addr, _) in &silent {
        cfg = cfg.join(*addr);
    }
    let b = Node::start(cfg.join(a.local_addr())).unwrap();
    assert!(
        b.wait_for_members(Duration::from_secs(8), |v| live(v) == ["a"]),
        "b sees {:?} after {:?}",
        live(&b.members()),
        t0.elapsed()
    );
}
