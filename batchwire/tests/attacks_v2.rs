//! The attacks of the security v2 issue, each played against real nodes on loopback by a
//! client with a socket, or with the secret as a compromised or buggy member would have
//! it (those made with connections alone, holding handshake places and flooding connects,
//! are in `attacks_v2_connects.rs`). Every test is bounded in time.

mod common;

use std::time::{Duration, Instant};

use batchwire::{Address, Event, MembershipConfig, Node, NodeConfig};
use batchwire_core::codec::Name;
use batchwire_core::frame::{Frame, MessageList};
use batchwire_core::membership::MemberId;
use common::raw::*;
use common::*;

const T: Duration = Duration::from_secs(10);

fn member_node(name: &str, seed: Option<std::net::SocketAddr>, m: MembershipConfig) -> Node {
    let mut c = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET)
        .membership(m)
        .max_peers(16);
    if let Some(s) = seed {
        c = c.join(s);
    }
    Node::start(c).unwrap()
}

/// Attack 7: a member with the secret gossips 60 invented members (at an address nobody
/// listens on). The node takes at most `max_members` into its view, counts each one past
/// it once, makes peers (threads, dials) for at most three quarters of `max_peers`, keeps
/// room for a real node that connects (and takes it into the view once the ghosts are
/// found out), and announces nothing more once they are gone.
#[test]
fn invented_members_cannot_grow_the_view_the_peers_or_the_threads() {
    let mut cfg = MembershipConfig::default();
    cfg.max_members = 32;
    // Members down for a second are forgotten (default 10 min); a member is probed every
    // 200 ms (SWIM probes one at a time: the ghosts are found out one by one).
    cfg.forget_down_after = Duration::from_secs(1);
    cfg.probe_period = Duration::from_millis(200);
    cfg.probe_rtt = Duration::from_millis(50);
    cfg.suspicion_timeout = Duration::from_millis(600);
    let a = member_node("a", None, cfg.clone());
    let threads_before = a.threads();
    let events = a.events();
    let a_addr = a.local_addr();
    let a_id = MemberId {
        name: Name::new("a").unwrap(),
        addr: a_addr,
        started: incarnation_of(a_addr),
        bump: 0,
    };
    // The attacker holds the secret and sends, as "m", sealed datagrams with SWIM pings
    // whose piggybacked updates name 60 members nobody runs (at an address nobody
    // listens on), 20 to a packet.
    let nowhere: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let ghost = |i: usize| MemberId {
        name: Name::new(&format!("ghost{i:02}")).unwrap(),
        addr: nowhere,
        started: 1,
        bump: 0,
    };
    let m_id = MemberId {
        name: Name::new("m").unwrap(),
        addr: "127.0.0.1:10".parse().unwrap(),
        started: 1,
        bump: 0,
    };
    let mut m = Datagrams::new("m", 1, SECRET);
    let until = Instant::now() + Duration::from_secs(3);
    let mut probe = 0u8;
    while Instant::now() < until {
        for chunk in (0..60).collect::<Vec<_>>().chunks(20) {
            probe = probe.wrapping_add(1);
            let ghosts: Vec<MemberId> = chunk.iter().map(|&i| ghost(i)).collect();
            m.send(
                a_addr,
                "a",
                a_id.started,
                &swim_ping(&m_id, &a_id, probe, &ghosts),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = a.stats();
    let view = a.members();
    eprintln!(
        "view {} {:?}; peers {}; threads {} (from {threads_before})",
        view.len(),
        s.membership,
        s.peers.len(),
        a.threads()
    );
    assert!(view.len() <= 32, "view of {}: {view:?}", view.len());
    let refused = s.membership.members_refused;
    assert!(
        (60 + 1 - 32..=60).contains(&refused),
        "{refused} members refused (each of the {} past the limit, once)",
        61 - view.len()
    );
    // With connections on demand (the default) a member gets a peer only when something
    // is sent to it or it connects: the ghosts get none (at most three quarters of
    // `max_peers` in any case).
    assert!(s.peers.is_empty(), "{} peers", s.peers.len());
    assert!(
        a.threads() <= threads_before + 2 * 12 + 4,
        "threads {} (from {threads_before})",
        a.threads()
    );
    // The attacker stops. A real node still finds room, and gets a message through.
    drop(m);
    let b = member_node("b", Some(a_addr), cfg);
    let deadline = Instant::now() + T;
    while !a.connected_peers().contains(&"b".to_string()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let inbox = a.mailbox("inbox").unwrap();
    b.send(&Address::new("a", "inbox").unwrap(), &b"real"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"real");
    // Once the ghosts (and the attacker) are down and forgotten, they leave the view, and
    // any peer of theirs is removed: only b is left.
    let deadline = Instant::now() + Duration::from_secs(30);
    let gone =
        || a.members().iter().all(|m| m.name == "b" || m.name == "a") && a.stats().peers.len() <= 1;
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gone(), "left: {:?}", a.members());
    let s = a.stats();
    let names: Vec<&str> = s.peers.iter().map(|p| p.peer.as_str()).collect();
    assert_eq!(names, ["b"], "peers left: {names:?}");
    // The ghosts refused for room were reported as room was made (each once, each then
    // found out like the rest), and a real member is not kept out: b is in the view.
    let deadline = Instant::now() + T;
    let b_live = || {
        a.members()
            .iter()
            .any(|m| m.name == "b" && m.state.is_live())
    };
    while !b_live() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(b_live(), "b not in the view: {:?}", a.members());
    // Nothing keeps announcing the ghosts: none joins in the next second.
    while events.try_recv().is_ok() {}
    std::thread::sleep(Duration::from_secs(1));
    let joined: Vec<String> = events
        .try_iter()
        .filter_map(|e| match e {
            Event::MemberJoined { member } => Some(member.name),
            _ => None,
        })
        .collect();
    assert!(joined.is_empty(), "announced again: {joined:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.threads() > threads_before + 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let names = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| s.contains("-a"))
            .collect()
    };
    assert!(
        a.threads() <= threads_before + 4,
        "threads {} (from {threads_before}): {:?}",
        a.threads(),
        names()
    );
    // And b still gets through.
    b.send(&Address::new("a", "inbox").unwrap(), &b"still"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"still");
}

/// A MEMBER frame body: a SWIM ping (foca's postcard encoding) from `from` to `to` whose
/// piggybacked updates say each of `alive` is alive.
fn swim_ping(from: &MemberId, to: &MemberId, probe: u8, alive: &[MemberId]) -> Vec<u8> {
    fn varint(v: &mut Vec<u8>, mut x: u64) {
        while x >= 0x80 {
            v.push(x as u8 | 0x80);
            x >>= 7;
        }
        v.push(x as u8);
    }
    fn id(v: &mut Vec<u8>, m: &MemberId) {
        varint(v, m.name.as_bytes().len() as u64);
        v.extend_from_slice(m.name.as_bytes());
        let std::net::SocketAddr::V4(a) = m.addr else {
            panic!("IPv4 only here")
        };
        v.push(0); // SocketAddr::V4
        v.extend_from_slice(&a.ip().octets());
        varint(v, u64::from(a.port()));
        varint(v, m.started);
        varint(v, u64::from(m.bump));
    }
    let mut v = vec![0u8]; // TAG_SWIM
    id(&mut v, from);
    v.push(0); // the sender's SWIM incarnation
    id(&mut v, to);
    v.extend_from_slice(&[0, probe & 0x7f]); // Message::Ping(probe)
    v.extend_from_slice(&(alive.len() as u16).to_be_bytes());
    for m in alive {
        id(&mut v, m);
        v.push(0); // its SWIM incarnation
        v.push(0); // State::Alive
    }
    v
}

/// Attack 6: members (with the secret) start 8 MiB messages under three names, send 6 MiB
/// of each and never the rest. The node commits at most `reassembly_bytes` to them (the
/// third is not kept: counted, and reported undeliverable at its end), and once their
/// sessions end (declared down after `peer_timeout`) everything is freed.
#[test]
fn partial_messages_are_bounded_node_wide_and_freed_when_their_session_ends() {
    let cfg = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), SECRET)
        .mailbox("inbox")
        .max_payload(8 << 20)
        .reassembly_bytes(16 << 20)
        .heartbeat_interval(Duration::from_millis(200))
        .peer_timeout(Duration::from_secs(1));
    let a = Node::start(cfg).unwrap();
    let addr = a.local_addr();
    let piece = 512 << 10;
    let mut conns = Vec::new();
    for (i, name) in ["p1", "p2", "p3"].into_iter().enumerate() {
        let mut r = login(addr, name, "a", 1);
        r.send(&Frame::Resume(batchwire_core::frame::Resume::FRESH));
        for k in 0..12u64 {
            r.send(&Frame::Fragment(batchwire_core::frame::Fragment {
                seq: k,
                id: 0,
                total: 8 << 20,
                offset: k * piece,
                to: Name::new("inbox").unwrap(),
                from: Name::new("x").unwrap(),
                data: vec![i as u8; piece as usize].into(),
            }));
        }
        // Taken before the next name starts.
        let deadline = Instant::now() + T;
        let received = |a: &Node| a.stats().peer(name).map_or(0, |p| p.bytes_received);
        while received(&a) < 12 * piece && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        conns.push(r);
    }
    let s = a.stats();
    assert_eq!(s.reassembly_bytes, 16 << 20, "two messages kept");
    assert_eq!(s.peer("p3").unwrap().reassembly_refused, 1, "{s:?}");
    assert_eq!(s.peer("p1").unwrap().reassembly_refused, 0);
    // The members vanish. Their sessions end after peer_timeout: nothing stays pinned.
    drop(conns);
    let deadline = Instant::now() + T;
    while a.stats().reassembly_bytes > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        a.stats().reassembly_bytes,
        0,
        "freed when the sessions ended"
    );
}

/// Attack 8: an impostor logs in to b as "a", with a's incarnation (every HELLO shows it),
/// and injects one message numbered where a's stream is. b now believes a sent one more
/// than a did, so a cannot honour b's RESUME. After a few tries in a row the session is
/// reset on both ends (a's pending messages would be reported failed) and the link
/// carries messages again: it is never cut for good.
#[test]
fn a_poisoned_link_heals_by_resetting_the_session() {
    let nodes = start_with_inbox(&["a", "b"]);
    let (a, b) = (&nodes[0], &nodes[1]);
    let inbox = b.mailbox("inbox").unwrap();
    let to = Address::new("b", "inbox").unwrap();
    for i in 0..3u8 {
        a.send(&to, vec![i]).unwrap();
        assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], [i]);
    }
    let a_inc = incarnation_of(a.local_addr());
    let mut r = login(b.local_addr(), "a", "b", a_inc);
    r.send(&Frame::Resume(batchwire_core::frame::Resume::FRESH));
    let mut list = MessageList::from_messages(&[batchwire_core::frame::Message {
        to: Name::new("inbox").unwrap(),
        from: Name::new("x").unwrap(),
        payload: bytes::Bytes::from_static(b"forged"),
    }]);
    list.first_seq = 3;
    r.send(&Frame::Messages(list));
    let e = inbox.recv_timeout(T).expect("the forged message went in");
    assert_eq!(&e.payload[..], b"forged");
    drop(r);
    // The real a comes back; its messages get through again.
    let deadline = Instant::now() + T;
    let mut through = false;
    let mut k = 0u8;
    while !through && Instant::now() < deadline {
        k = k.wrapping_add(1);
        let _ = a.send(&to, vec![100, k]);
        if let Ok(e) = inbox.recv_timeout(Duration::from_millis(200)) {
            through = e.payload[0] == 100;
        }
    }
    assert!(through, "the link stayed poisoned: {:?}", a.stats().peers);
}

/// Attack 9: a second node started with a name that is taken (a copy-paste mistake, or an
/// impostor with the secret) is refused while the first holds a live connection, with
/// one clear reason on both sides; the real node's session is untouched. Once the real
/// node stops, a restarted one (a new incarnation) gets in.
#[test]
fn a_second_node_with_a_taken_name_is_refused_while_the_first_is_connected() {
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.mailbox("inbox"))
        .collect();
    let a_cfg = cfgs[0].clone();
    let b_addr = cfgs[1].listen();
    let mut nodes = start(cfgs);
    let b_events = nodes[1].events();
    let twin = NodeConfig::new("a", free_addrs(1)[0], SECRET).peer("b", b_addr);
    let twin = Node::start(twin).unwrap();
    let refused = wait_event(
        &b_events,
        T,
        |e| matches!(e, Event::HandshakeFailed { peer: Some(p), kind: batchwire::HandshakeFailure::Name, reason, .. } if p == "a" && reason.contains("already connected")),
    );
    assert!(refused.is_some(), "the twin was not refused");
    std::thread::sleep(Duration::from_millis(500));
    let (a, b) = (&nodes[0], &nodes[1]);
    let s = b.stats();
    let pa = s.peer("a").unwrap();
    assert_eq!(pa.connects, 1, "the real a's connection was never replaced");
    assert!(twin.connected_peers().is_empty());
    let inbox = b.mailbox("inbox").unwrap();
    a.send(&Address::new("b", "inbox").unwrap(), &b"real"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"real");
    drop(inbox);
    // The real a stops (its connection ends with it); a new incarnation gets in.
    drop(twin);
    let old = nodes.remove(0);
    drop(old);
    let a2 = Node::start(a_cfg).unwrap();
    assert!(a2.wait_for_peers(&["b"], T), "the restarted a was kept out");
}

/// Every log line the nodes of this test binary write, for counting.
fn log_lines() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let buf: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        struct W(&'static std::sync::Mutex<Vec<u8>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || W(buf))
            .finish();
        tracing::subscriber::set_global_default(sub).expect("one subscriber");
        buf
    })
}

/// Lines logged so far that contain `what`.
fn lines_with(what: &str) -> usize {
    String::from_utf8_lossy(&log_lines().lock().unwrap())
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// Attacks 3 and 10: a client without the secret fails 1,000 handshakes in a row, and a
/// member with it sends 20,000 UNDELIVERABLE notices. Each is counted, but each call site
/// logs at most a burst of lines per 10 s (then says how many it suppressed), so the logs
/// cannot be made a weapon.
#[test]
fn log_lines_caused_by_the_network_are_rate_limited() {
    log_lines();
    let a = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), SECRET)).unwrap();
    let addr = a.local_addr();
    let before = lines_with("handshake failed");
    for _ in 0..1000 {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        // Not a batchwire frame: the node refuses it at once.
        let _ = s.write_all(&[0xff; 64]);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut sink);
    }
    let deadline = Instant::now() + T;
    while a
        .stats()
        .handshakes
        .failed(batchwire::HandshakeFailure::Protocol)
        < 1000
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        a.stats()
            .handshakes
            .failed(batchwire::HandshakeFailure::Protocol),
        1000,
        "every failure is counted"
    );
    let logged = lines_with("handshake failed") - before;
    // (Other tests in this binary may have used the call site's burst already.)
    assert!(logged <= 10, "{logged} lines for 1,000 failed handshakes");
    // A member floods UNDELIVERABLE notices.
    let before = lines_with("peer reports messages undeliverable");
    let mut r = login(addr, "m", "a", 1);
    r.send(&Frame::Resume(batchwire_core::frame::Resume::FRESH));
    for i in 0..20_000u32 {
        r.send(&Frame::Undeliverable(
            batchwire_core::frame::Undeliverable {
                to: Name::new(&format!("nobody-{i}")).unwrap(),
                from: Name::new("x").unwrap(),
                count: 1,
            },
        ));
    }
    let deadline = Instant::now() + T;
    let reported = |a: &Node| a.stats().peer("m").map_or(0, |p| p.undeliverable_reported);
    while reported(&a) < 20_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(reported(&a), 20_000, "every notice is counted");
    let logged = lines_with("peer reports messages undeliverable") - before;
    assert!(logged <= 10, "{logged} lines for 20,000 notices");
}

/// Nodes that come and go without being members (here short-lived nodes without
/// membership, each under its own name) leave peers behind; when the registry is full, the
/// idle ones of nodes that are not members make room, so a later node still gets in (and
/// so would a member). Before, every connection past `max_peers` was refused for good.
#[test]
fn peers_of_departed_non_members_make_room_when_the_registry_is_full() {
    let a = Node::start(
        NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), SECRET)
            .max_peers(4)
            .mailbox("in"),
    )
    .unwrap();
    let inbox = a.mailbox("in").unwrap();
    let to = batchwire::Address::new("a", "in").unwrap();
    for i in 0..8 {
        let c = Node::start(
            // Names that sort before "a": they dial it.
            NodeConfig::new(format!("0c{i}"), "127.0.0.1:0".parse().unwrap(), SECRET)
                .without_membership()
                .peer("a", a.local_addr()),
        )
        .unwrap();
        assert!(c.wait_for_peers(&["a"], T), "client {i} did not get in");
        c.send(&to, format!("hello {i}")).unwrap();
        let got = inbox.recv_timeout(T).unwrap();
        assert_eq!(&got.payload[..], format!("hello {i}").as_bytes());
        c.shutdown();
    }
    assert!(a.stats().peers.len() <= 4, "{:?}", a.stats().peers.len());
}
