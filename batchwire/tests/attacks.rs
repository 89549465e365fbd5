//! The attacks of issue 9, each played against real nodes on 127.0.0.1 (the one that
//! needs a node process of its own, connection churn, is in batchwire-cli/tests/churn.rs) by a client with a
//! socket (and, for the forged values, with the secret, as a compromised or buggy peer
//! would have it). Every test is bounded in time.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchwire::{Address, Event, HandshakeFailure, Node, NodeConfig};
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, MessageList, Resume};
use bytes::BytesMut;
use common::raw::*;
use common::*;

const T: Duration = Duration::from_secs(10);

fn failures(events: &std::sync::mpsc::Receiver<Event>, wait: Duration) -> Vec<Event> {
    let deadline = Instant::now() + wait;
    let mut v = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match events.recv_timeout(left) {
            Ok(e @ Event::HandshakeFailed { .. }) => v.push(e),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    v
}

fn echo_works(a: &Node, to: &str) {
    let mb = a.mailbox("probe").unwrap();
    mb.send(&Address::new(to, "inbox").unwrap(), &b"ping"[..])
        .unwrap();
    drop(mb);
}

/// Attack 1: use node a to sign the answer to node b's challenge. Both refuse, a before it
/// proves anything, and b keeps its real connection to a.
#[test]
fn relay_and_reflection_are_refused_on_both_sides() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let (a_events, b_events) = (a.events(), b.events());
    let inbox = b.mailbox("inbox").unwrap();

    // 1. Dial b claiming to be "a", and read b's challenge.
    let mut to_b = Raw::connect(b.local_addr());
    to_b.send(&hello("a", 7, [1; 16]));
    let Some(Frame::Hello(b_hello)) = to_b.recv(T) else {
        panic!("b sent no HELLO")
    };
    assert_eq!(
        to_b.recv(Duration::from_millis(300)),
        None,
        "b proves nothing to an unproven dialler"
    );

    // 2. Dial a claiming to be "b" with b's nonce: a dials b itself, so it refuses at once.
    let mut to_a = Raw::connect(a.local_addr());
    to_a.send(&hello("b", b_hello.incarnation, b_hello.nonce));
    let mut got = Vec::new();
    while let Some(f) = to_a.recv(T) {
        got.push(f);
    }
    assert!(
        matches!(&got[..], [Frame::Hello(_), Frame::Refuse(r)] if r.reason.contains("sorts first")),
        "a must answer with its HELLO and a refusal, and no proof: {got:?}"
    );

    // 3. Claiming a name a does not dial, a still waits for the dialler's proof.
    let mut to_a = Raw::connect(a.local_addr());
    to_a.send(&hello("c", b_hello.incarnation, b_hello.nonce));
    assert!(matches!(to_a.recv(T), Some(Frame::Hello(_))));
    assert_eq!(
        to_a.recv(Duration::from_millis(500)),
        None,
        "no AUTH from the acceptor first"
    );
    drop(to_a);

    // 4. The best the attacker has for b: a made-up proof. Refused, naming "a".
    to_b.send(&Frame::Auth(batchwire_core::frame::Auth { proof: [0; 32] }));
    let mut refused = false;
    while let Some(f) = to_b.recv(T) {
        refused |= matches!(f, Frame::Refuse(ref r) if r.reason.contains("secret"));
    }
    assert!(refused, "b refuses with a reason");

    let bf = failures(&b_events, Duration::from_secs(2));
    assert!(
        bf.iter().any(|e| matches!(e, Event::HandshakeFailed { peer: Some(p), kind: HandshakeFailure::Secret, addr, .. } if p == "a" && addr.ip().is_loopback())),
        "{bf:?}"
    );
    let af = failures(&a_events, Duration::from_millis(200));
    assert!(
        af.iter().any(|e| matches!(e, Event::HandshakeFailed { peer: Some(p), kind: HandshakeFailure::Direction, .. } if p == "b")),
        "{af:?}"
    );
    assert_eq!(b.stats().handshakes.failed(HandshakeFailure::Secret), 1);
    assert_eq!(a.stats().handshakes.failed(HandshakeFailure::Direction), 1);
    // The real connection was never replaced, and still carries messages.
    assert_eq!(b.stats().peers[0].connects, 1);
    echo_works(a, "b");
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"ping");
}

/// Attack 2: a peer with the secret (compromised, or buggy) sends acknowledgements and
/// RESUME values for messages that were never sent, and a frame past a gap. Each closes
/// its connection as a counted protocol violation; nothing is skipped, and the real
/// stream from a arrives complete, once and in order.
#[test]
fn forged_acks_and_resumes_close_the_connection_and_skip_nothing() {
    let nodes = start_with_inbox(&["a", "b"]);
    let (a, b) = (&nodes[0], &nodes[1]);
    let inbox = b.mailbox("inbox").unwrap();
    let a_inc = incarnation_of(a.local_addr());
    const N: u64 = 100_000;
    let to = Address::new("b", "inbox").unwrap();
    let forged: [&dyn Fn(&mut Raw); 4] = [
        &|r| {
            r.send(&Frame::Resume(Resume {
                next: u64::MAX,
                base: 0,
                keep: 0,
            }))
        },
        &|r| {
            r.send(&Frame::Resume(Resume {
                next: 1 << 40,
                base: 0,
                keep: 0,
            }))
        },
        &|r| {
            r.send(&Frame::Resume(Resume {
                next: 0,
                base: u64::MAX,
                keep: 0,
            }));
            r.send(&Frame::Ack(u64::MAX));
        },
        &|r| {
            r.send(&Frame::Resume(Resume::FRESH));
            let mut list = MessageList::from_messages(&[]);
            list.first_seq = u64::MAX - 1;
            r.send(&Frame::Messages(list));
        },
    ];
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..N {
                a.send(&to, i.to_le_bytes().to_vec()).unwrap();
            }
        });
        for (i, attack) in forged.iter().enumerate() {
            let before = b.stats().peers[0].protocol_violations;
            // The real a may win the race to reconnect; try a few times.
            let mut closed_as_violation = false;
            for _ in 0..5 {
                let mut r = login(b.local_addr(), "a", "b", a_inc);
                attack(&mut r);
                assert!(r.closed_within(T), "attack {i}: b kept the connection open");
                if b.stats().peers[0].protocol_violations > before {
                    closed_as_violation = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                closed_as_violation,
                "attack {i} was not counted as a violation"
            );
        }
        let mut next = 0;
        while next < N {
            let e = inbox.recv_timeout(T).expect("the real stream stalled");
            assert_eq!(u64::from_le_bytes(e.payload[..8].try_into().unwrap()), next);
            next += 1;
        }
    });
    assert!(
        inbox.recv_timeout(Duration::from_millis(200)).is_err(),
        "a duplicate"
    );
    assert_eq!(a.stats().peers[0].send_failed, 0);
    assert!(b.stats().peers[0].protocol_violations >= 4);
}

/// Attack 4: a client that sends one byte now and then is cut at the handshake deadline,
/// over plaintext and over TLS alike.
#[test]
fn slow_loris_is_cut_at_the_deadline_with_and_without_tls() {
    let certs = test_certs("main");
    for tls in [false, true] {
        let mut cfg = NodeConfig::new("b", free_addrs(1)[0], SECRET)
            .handshake_timeout(Duration::from_millis(1000));
        if tls {
            cfg = cfg.tls(batchwire::TlsFiles::in_dir(&certs, "b"));
        }
        let b = Node::start(cfg).unwrap();
        let events = b.events();
        let mut s = TcpStream::connect(b.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        // A HELLO (or a TLS record) that never quite arrives: one byte every 200 ms.
        let mut trickle: Vec<u8> = if tls {
            vec![0x16, 0x03, 0x01, 0x02, 0x00]
        } else {
            let mut v = Vec::new();
            hello("loris", 1, [0; 16]).encode(&mut v);
            v
        };
        trickle.resize(64, 0);
        let t0 = Instant::now();
        let mut cut = None;
        for byte in trickle {
            if s.write_all(&[byte]).is_err() {
                cut = Some(t0.elapsed());
                break;
            }
            let mut sink = [0u8; 512];
            match s.read(&mut sink) {
                Ok(0) => {
                    cut = Some(t0.elapsed());
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    cut = Some(t0.elapsed());
                    break;
                }
                _ => {}
            }
            if t0.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
        let cut = cut.unwrap_or_else(|| panic!("tls {tls}: still open after 8 s"));
        assert!(
            cut >= Duration::from_millis(900) && cut < Duration::from_millis(2500),
            "tls {tls}: cut after {cut:?}"
        );
        let f = failures(&events, Duration::from_secs(2));
        assert!(
            f.iter().any(|e| matches!(
                e,
                Event::HandshakeFailed {
                    kind: HandshakeFailure::Timeout,
                    ..
                }
            )),
            "tls {tls}: {f:?}"
        );
        assert_eq!(b.stats().handshakes.failed(HandshakeFailure::Timeout), 1);
    }
}

/// The acceptor sets up every inbound connection on one event loop: 30 clients (from 30
/// addresses) trickling a HELLO a byte every 50 ms hold up no other handshake. A peer that
/// logs in whole, and one that sends its handshake a byte at a time, both get the node's
/// RESUME (the connection's own thread has taken over from the loop) while they trickle.
#[test]
fn trickling_clients_hold_up_no_other_handshake() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let cfg =
        NodeConfig::new("b", free_addrs(1)[0], SECRET).handshake_timeout(Duration::from_secs(5));
    let b = Node::start(cfg).unwrap();
    let addr = b.local_addr();
    let stop = AtomicBool::new(false);
    let (whole, trickled) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut loris: Vec<(TcpStream, Vec<u8>)> = (0..30)
                .filter_map(|i| {
                    let st = connect_from(&format!("127.0.3.{}", 1 + i), addr).ok()?;
                    let mut v = Vec::new();
                    hello("loris", 1, [0; 16]).encode(&mut v);
                    Some((st, v))
                })
                .collect();
            assert_eq!(loris.len(), 30);
            let deadline = Instant::now() + T;
            while !stop.load(Relaxed) && Instant::now() < deadline {
                for (st, v) in &mut loris {
                    if !v.is_empty() {
                        let _ = st.write_all(&v[..1]);
                        v.remove(0);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let mut r = login(addr, "a1", "b", 7);
        let whole = matches!(r.recv(T), Some(Frame::Resume(_))).then(|| t0.elapsed());
        let t1 = Instant::now();
        let mut r = login_trickled(addr, "a2", "b", 9, Some(Duration::from_millis(1)));
        let trickled = matches!(r.recv(T), Some(Frame::Resume(_))).then(|| t1.elapsed());
        // The trickling clients were all still in their handshakes meanwhile.
        let h = b.stats().handshakes;
        stop.store(true, Relaxed);
        assert_eq!(h.pending, 30, "{h:?}");
        (whole, trickled)
    });
    assert!(
        whole.is_some_and(|t| t < Duration::from_secs(1)),
        "{whole:?}"
    );
    assert!(
        trickled.is_some_and(|t| t < Duration::from_secs(3)),
        "{trickled:?}"
    );
}

/// A client socket from `ip` (any loopback address works on Linux).
/// Attack 5 (the handshake cap): 300 silent connections from one address hold at most
/// `max_handshakes_per_address` places; the rest are closed at once and counted, and a real
/// peer (from another address) connects and delivers while they sit there.
#[test]
fn a_flood_of_handshakes_does_not_keep_a_real_peer_out() {
    let mut cfgs = mesh(&["a", "b"]);
    cfgs[1] = cfgs[1]
        .clone()
        .handshake_timeout(Duration::from_secs(20))
        .max_handshakes(16)
        .max_handshakes_per_address(8);
    let b_addr = cfgs[1].listen();
    let b = Node::start(cfgs.pop().unwrap()).unwrap();
    let inbox = b.mailbox("inbox").unwrap();
    let flood: Vec<TcpStream> = (0..300)
        .filter_map(|_| connect_from("127.0.0.2", b_addr).ok())
        .collect();
    assert!(
        flood.len() >= 250,
        "only {} connections opened",
        flood.len()
    );
    // The ones beyond the cap were closed at once.
    let deadline = Instant::now() + T;
    while b.stats().handshakes.busy < 250 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        b.stats().handshakes.busy >= 250,
        "{:?}",
        b.stats().handshakes
    );
    assert!(b.threads() <= 8 + 8, "threads: {}", b.threads());
    // A real peer gets in while the flood holds its places.
    let a = Node::start(cfgs.pop().unwrap()).unwrap();
    assert!(a.wait_for_peers(&["b"], T), "the real peer was kept out");
    a.send(&Address::new("b", "inbox").unwrap(), &b"through"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"through");
    drop(flood);
}

/// Queues that network input fills are bounded: a peer with the secret that sends messages
/// to 100,000 made-up mailbox names and never reads gets a bounded number of notices.
#[test]
fn undeliverable_floods_cost_bounded_memory() {
    let b = Node::start(NodeConfig::new("b", free_addrs(1)[0], SECRET)).unwrap();
    let mut r = login(b.local_addr(), "a", "b", 99);
    let _ = r.recv(T); // b's RESUME
    r.send(&Frame::Resume(Resume::FRESH));
    let mut seq = 0;
    for chunk in 0..100 {
        let msgs: Vec<_> = (0..1000)
            .map(|i| batchwire_core::frame::Message {
                to: Name::new(&format!("nobody-{chunk}-{i}")).unwrap(),
                from: Name::new("x").unwrap(),
                payload: bytes::Bytes::from_static(b"?"),
            })
            .collect();
        let mut list = MessageList::from_messages(&msgs);
        list.first_seq = seq;
        seq += 1000;
        r.send(&Frame::Messages(list));
    }
    // Everything is counted...
    let deadline = Instant::now() + T;
    while b.stats().undeliverable < 100_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = b.stats();
    assert_eq!(st.undeliverable, 100_000);
    // ...but what waits for the peer (which does not read) is bounded.
    let queued = st.peers.iter().find(|p| p.peer == "a").unwrap().queued;
    assert!(
        queued < 300,
        "{queued} frames queued for a peer that does not read"
    );
    // Reading now, the notices add up to what was sent (the excess in one summary).
    let mut counted = 0u64;
    let deadline = Instant::now() + T;
    while counted < 100_000 && Instant::now() < deadline {
        if let Some(Frame::Undeliverable(u)) = r.recv(Duration::from_secs(1)) {
            counted += u.count as u64;
        }
    }
    assert_eq!(counted, 100_000);
}

/// A peer with the secret that ignores flow control and floods a mailbox nobody reads: the
/// connection closes as a protocol violation naming the mailbox and the limit, the mailbox
/// holds no more than the limit, and the node goes on.
#[test]
fn a_peer_that_ignores_credit_is_cut_off_at_the_limit() {
    use batchwire_core::messages::Message;
    const W: usize = 64 << 10;
    const MAX: usize = 64 << 10;
    let b_addr = free_addrs(1)[0];
    let b = Node::start(
        NodeConfig::new("b", b_addr, SECRET)
            .peer("a", "127.0.0.1:9".parse().unwrap())
            .mailbox("inbox")
            .mailbox_bytes(W)
            .max_payload(MAX),
    )
    .unwrap();
    let events = b.events();
    let inbox = b.mailbox("inbox").unwrap();
    let mut raw = raw_peer(b_addr, "a", "b");
    assert!(b.wait_for_peers(&["a"], T));
    // 2*W + max_payload + 1 MiB is what a mailbox may hold from a peer before its SYNC
    // recount catches up; send twice that, 100 messages of 1000 B per frame.
    let limit = 2 * W + MAX + (1 << 20);
    let msgs: Vec<Message> = (0..100)
        .map(|_| Message {
            to: Name::new("inbox").unwrap(),
            from: Name::new("flood").unwrap(),
            payload: vec![7u8; 1000].into(),
        })
        .collect();
    let mut seq = 0u64;
    let mut out = Vec::new();
    while (seq as usize) * 1000 < 2 * limit {
        let mut list = MessageList::from_messages(&msgs);
        list.first_seq = seq;
        seq += 100;
        out.clear();
        Frame::Messages(list).encode(&mut out);
        if raw.write_all(&out).is_err() {
            break; // closed already
        }
    }
    let ev = wait_event(
        &events,
        T,
        |e| matches!(e, Event::Disconnected { peer, reason: batchwire::CloseReason::Protocol(_) } if peer == "a"),
    );
    let Some(Event::Disconnected { reason, .. }) = ev else {
        panic!("the flood was not cut off as a protocol violation");
    };
    let why = reason.to_string();
    assert!(
        why.contains("inbox") && why.contains(&limit.to_string()),
        "the reason names the mailbox and the limit: {why}"
    );
    assert!(b.stats().peers[0].protocol_violations >= 1);
    assert!(
        inbox.len() * 1000 <= limit,
        "{} messages held, beyond the limit",
        inbox.len()
    );
    // The node goes on: what it holds can be read, and the peer may log in again.
    while inbox.try_recv().is_ok() {}
    drop(raw);
    let _again = raw_peer(b_addr, "a", "b");
    assert!(b.wait_for_peers(&["a"], T));
}

/// A member that guesses another request's call id (ids are sequential) and forges its
/// reply: the reply is counted as stray and dropped; the caller gets the real answer from
/// the node it asked.
#[test]
fn a_forged_reply_from_another_member_never_reaches_the_caller() {
    use batchwire_core::call;
    use batchwire_core::messages::Message;
    let [a_addr, b_addr] = free_addrs(2)[..] else {
        unreachable!()
    };
    // "0x" sorts before "a": it dials a, as the tie-break says.
    let a = Arc::new(
        Node::start(
            NodeConfig::new("a", a_addr, SECRET)
                .peer("b", b_addr)
                .peer("0x", "127.0.0.1:9".parse().unwrap()),
        )
        .unwrap(),
    );
    let b = Node::start(NodeConfig::new("b", b_addr, SECRET).peer("a", a_addr)).unwrap();
    let svc = b.mailbox("svc").unwrap();
    let mut raw = raw_peer(a_addr, "0x", "a");
    assert!(a.wait_for_peers(&["b", "0x"], T));

    // The attacker is asked something itself, and learns the id counter from it.
    let asker = {
        let a = a.clone();
        std::thread::spawn(move || {
            a.request(
                &Address::new("0x", "q").unwrap(),
                "?",
                Duration::from_secs(3),
            )
        })
    };
    let mut buf = BytesMut::new();
    let deadline = Instant::now() + T;
    let seen = 'read: loop {
        assert!(Instant::now() < deadline, "no request reached the attacker");
        while let Some(f) = frame::decode(&mut buf, 1 << 20).unwrap() {
            if let Frame::Messages(list) = f
                && let Some(m) = list.iter().next()
            {
                break 'read call::parse(m.from.as_bytes()).expect("a call tag").0;
            }
        }
        let mut chunk = [0u8; 4096];
        let n = raw.read(&mut chunk).unwrap();
        assert!(n > 0, "a closed the attacker's connection");
        buf.extend_from_slice(&chunk[..n]);
    };
    // The next request goes to b, which answers after a while; the attacker answers first
    // with the next id.
    let caller = {
        let a = a.clone();
        std::thread::spawn(move || {
            a.request(
                &Address::new("b", "svc").unwrap(),
                "real?",
                Duration::from_secs(10),
            )
        })
    };
    let req = svc.recv_timeout(T).unwrap();
    let forged = Message {
        to: Name::new(call::REPLY_INBOX).unwrap(),
        from: call::reply_sender(seen.wrapping_add(1)),
        payload: bytes::Bytes::from_static(b"forged"),
    };
    let mut out = Vec::new();
    Frame::Messages(MessageList::from_messages([&forged])).encode(&mut out);
    raw.write_all(&out).unwrap();
    let t0 = Instant::now();
    while a.stats().requests.stray_replies == 0 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(a.stats().requests.stray_replies, 1, "the forgery was seen");
    req.reply("real").unwrap();
    let r = caller.join().unwrap().unwrap();
    assert_eq!(&r.payload[..], b"real");
    assert_eq!(r.from.to_string(), "svc@b");
    drop(raw);
    let _ = asker.join().unwrap();
    assert_eq!(a.stats().requests.answered, 1);
}
