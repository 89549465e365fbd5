//! Raw TCP clients that speak the protocol badly: each gets a clear refusal or a closed
//! connection, and the node keeps serving its real peers.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use batchwire::{Address, Event};
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, Hello, PROTOCOL_VERSION, RefuseCode};
use bytes::BytesMut;
use common::*;

const T: Duration = Duration::from_secs(10);

/// Read frames until the server closes; return them.
fn read_all_frames(s: &mut TcpStream) -> Vec<Frame> {
    s.set_read_timeout(Some(T)).unwrap();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Ok(Some(f)) = frame::decode(&mut buf, 1 << 20) {
            frames.push(f);
        }
    }
    frames
}

/// A node "b" with a real peer "a", and a check that they still talk afterwards.
fn with_cluster(f: impl FnOnce(std::net::SocketAddr, &std::sync::mpsc::Receiver<Event>)) {
    let nodes = start(mesh(&["a", "b"]));
    let events = nodes[1].events();
    f(nodes[1].local_addr(), &events);
    let inbox = nodes[1].mailbox("inbox").unwrap();
    nodes[0]
        .send(&Address::new("b", "inbox").unwrap(), &b"still fine"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"still fine");
    assert_eq!(nodes[0].connected_peers(), ["b"]);
}

#[test]
fn wrong_protocol_version_gets_a_refusal_naming_both_versions() {
    with_cluster(|addr, events| {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut out = Vec::new();
        Frame::Hello(Hello {
            version: 99,
            incarnation: 1,
            nonce: [0; 16],
            name: Name::new("future-node").unwrap(),
        })
        .encode(&mut out);
        s.write_all(&out).unwrap();
        let frames = read_all_frames(&mut s);
        let refuse = frames.iter().find_map(|f| match f {
            Frame::Refuse(r) => Some(r.clone()),
            _ => None,
        });
        let r = refuse.expect("no REFUSE frame");
        assert_eq!(r.code, RefuseCode::Version);
        assert!(
            r.reason.contains(&format!("version {PROTOCOL_VERSION}"))
                && r.reason.contains("version 99"),
            "{}",
            r.reason
        );
        let ev = wait_event(events, T, |e| matches!(e, Event::HandshakeFailed { .. })).unwrap();
        let Event::HandshakeFailed { peer, reason, .. } = ev else {
            unreachable!()
        };
        assert_eq!(peer.as_deref(), Some("future-node"));
        assert!(reason.contains("version"), "{reason}");
    });
}

#[test]
fn garbage_instead_of_a_hello_is_refused() {
    with_cluster(|addr, events| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let frames = read_all_frames(&mut s);
        assert!(
            frames
                .iter()
                .any(|f| matches!(f, Frame::Refuse(r) if r.code == RefuseCode::Protocol)),
            "{frames:?}"
        );
        let ev = wait_event(events, T, |e| matches!(e, Event::HandshakeFailed { .. })).unwrap();
        let Event::HandshakeFailed { reason, .. } = ev else {
            unreachable!()
        };
        assert!(reason.contains("frame"), "{reason}");
    });
}

#[test]
fn huge_length_prefix_is_refused_without_allocating() {
    with_cluster(|addr, events| {
        let mut s = TcpStream::connect(addr).unwrap();
        // Claims a 4 GiB frame; the node must refuse from the header alone: its HELLO,
        // then a REFUSE saying why, then it closes (before our read timeout).
        s.write_all(&[0xff, 0xff, 0xff, 0xff, 1]).unwrap();
        let t0 = std::time::Instant::now();
        let frames = read_all_frames(&mut s);
        assert!(t0.elapsed() < T, "the node never closed the connection");
        assert!(
            matches!(frames.first(), Some(Frame::Hello(_))),
            "{frames:?}"
        );
        match frames.get(1) {
            Some(Frame::Refuse(r)) => {
                assert_eq!(r.code, RefuseCode::Protocol);
                assert!(r.reason.contains("exceeds the maximum"), "{}", r.reason);
            }
            other => panic!("no refusal: {other:?} (all: {frames:?})"),
        }
        assert_eq!(frames.len(), 2, "{frames:?}");
        let ev = wait_event(events, T, |e| matches!(e, Event::HandshakeFailed { .. })).unwrap();
        let Event::HandshakeFailed { reason, .. } = ev else {
            unreachable!()
        };
        assert!(reason.contains("exceeds the maximum"), "{reason}");
    });
}

#[test]
fn silent_client_times_out_in_the_handshake() {
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.handshake_timeout(Duration::from_millis(300)))
        .collect();
    let nodes = start(cfgs);
    let events = nodes[1].events();
    let mut s = TcpStream::connect(nodes[1].local_addr()).unwrap();
    let t0 = std::time::Instant::now();
    // The node says HELLO and, 300 ms later, closes: not before (the exact deadline is
    // the handshake machine's fake-clock test), and long before our 10 s.
    let frames = read_all_frames(&mut s);
    let cut = t0.elapsed();
    assert!(matches!(frames[..], [Frame::Hello(_)]), "{frames:?}");
    assert!(
        cut >= Duration::from_millis(300) && cut < Duration::from_secs(5),
        "cut after {cut:?}"
    );
    let ev = wait_event(&events, T, |e| matches!(e, Event::HandshakeFailed { .. })).unwrap();
    let Event::HandshakeFailed { reason, kind, .. } = ev else {
        unreachable!()
    };
    assert_eq!(kind, batchwire::HandshakeFailure::Timeout);
    assert_eq!(reason, "handshake failed: timed out after 300ms");
}

/// A stranger failing handshakes as fast as it can connect gets every failure counted, but
/// at most 64 `HandshakeFailed` events a second reach a subscriber: its bounded queue
/// keeps room for the events that matter.
#[test]
fn a_flood_of_failed_handshakes_is_counted_but_does_not_flood_the_events() {
    let nodes = start(mesh(&["a", "b"]));
    let b = &nodes[1];
    let events = b.events();
    const FLOOD: u64 = 1000;
    let t0 = std::time::Instant::now();
    for _ in 0..FLOOD {
        let mut s = TcpStream::connect(b.local_addr()).unwrap();
        // A frame header claiming 4 GiB: refused from its header.
        let _ = s.write_all(&[0xff; 8]);
        let _ = read_all_frames(&mut s);
    }
    let deadline = std::time::Instant::now() + T;
    while b.stats().handshakes.failed_total() < FLOOD {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            b.stats().handshakes
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = t0.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    let got = events
        .try_iter()
        .filter(|e| matches!(e, Event::HandshakeFailed { .. }))
        .count() as u64;
    assert!(got > 0, "no event at all");
    assert!(
        got <= 64 * (took.as_secs() + 2),
        "{got} events for {FLOOD} failures in {took:?}"
    );
}
