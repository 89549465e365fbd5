//! The machine's own rules, beyond what the two-node simulation (`lanes_tests`) plays:
//! a peer found down hands back its queue in the same input, and what a peer sends that
//! breaks the protocol is an error naming why, never a panic.

use std::time::Duration;

use super::*;
use crate::frame::{Hello, MessageList};

const MS: Duration = Duration::from_millis(1);

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn cfg() -> PeerConfig {
    PeerConfig {
        session: SessionConfig {
            unacked_bytes: 64 << 10,
            heartbeat_interval: 100 * MS,
            peer_timeout: 500 * MS,
            bulk_inflight: 4 << 10,
            ..SessionConfig::default()
        },
        piece_bytes: 1024,
        frame_bytes: 4 << 10,
        mailbox_bytes: 1 << 20,
        max_payload: 1 << 20,
        max_frame: 64 << 10,
    }
}

/// `a` connected to a peer that answers its RESUME and then says nothing.
fn connected(t0: Instant) -> Peer {
    let mut a = Peer::new(cfg(), t0);
    a.handle_connect(t0, 7);
    a.handle_resume(t0, Resume::FRESH).unwrap();
    while a.poll_event().is_some() {}
    a
}

#[test]
fn a_peer_found_down_hands_back_its_queue_and_gives_up_pieces_in_that_input() {
    let t0 = Instant::now();
    let mut a = connected(t0);
    a.send(t0, &n("m"), &n("s"), Bytes::from(vec![1u8; 10]), false)
        .unwrap();
    a.send(
        t0,
        &n("big"),
        &n("s"),
        Bytes::from(vec![2u8; 20 << 10]),
        false,
    )
    .unwrap();
    // The first pieces are numbered (the window's bulk room is 4 KiB), the rest stay.
    let mut out = Vec::new();
    a.poll_transmit(t0, &mut out, usize::MAX);
    assert!(a.s.bulk_bytes() > 0, "pieces numbered");
    // One more ordinary message, queued behind.
    a.send(t0, &n("m"), &n("s"), Bytes::from(vec![3u8; 10]), false)
        .unwrap();
    // Silence: down at the peer timeout.
    let mut now = t0;
    let mut events = Vec::new();
    while now < t0 + Duration::from_secs(2) && !events.iter().any(is_down) {
        now += 10 * MS;
        a.handle_timeout(now);
        events.extend(std::iter::from_fn(|| a.poll_event()));
    }
    let down = events.iter().position(is_down).expect("declared down");
    // The Failed event that follows holds what was still queued: the message in pieces
    // and the ordinary one behind it (the first was written: the session fails it
    // itself, as unacknowledged).
    let failed: Vec<Vec<u8>> = events[down..]
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Failed { messages, .. } => Some(messages.clone()),
            _ => None,
        })
        .flatten()
        .map(|m| m.payload.to_vec())
        .collect();
    assert!(
        failed.contains(&vec![2u8; 20 << 10]),
        "the message in pieces"
    );
    assert!(failed.contains(&vec![3u8; 10]), "the queued ordinary one");
    // Nothing is left queued, and nothing more is numbered.
    let (rest, in_pieces) = a.fail_queued();
    assert_eq!((rest.len(), in_pieces), (0, false));
    let bulk = a.s.bulk_bytes();
    a.poll_transmit(now, &mut out, usize::MAX);
    assert_eq!(a.s.bulk_bytes(), bulk);
}

/// A HELLO frame, which has no place after the handshake.
fn hello() -> Vec<u8> {
    let mut b = Vec::new();
    Frame::Hello(Hello {
        version: 1,
        incarnation: 1,
        nonce: [0; 16],
        name: n("x"),
    })
    .encode(&mut b);
    b
}

fn is_down(e: &SessionEvent) -> bool {
    matches!(e, SessionEvent::Down { .. })
}

#[test]
fn what_breaks_the_protocol_is_an_error_naming_why() {
    let t0 = Instant::now();
    // Garbage: not a frame.
    let mut a = connected(t0);
    let e = a.handle_read(t0, &[0xff; 64], |_| true).unwrap_err();
    assert!(matches!(e, PeerError::Frame(_)), "{e}");
    assert!(e.to_string().starts_with("bad frame"));
    // A handshake frame after the handshake.
    let mut a = connected(t0);
    let e = a.handle_read(t0, &hello(), |_| true).unwrap_err();
    assert_eq!(e, PeerError::Unexpected("HELLO"));
    // Messages numbered beyond what could have been sent yet.
    let mut a = connected(t0);
    let m = Message {
        to: n("m"),
        from: n("s"),
        payload: Bytes::from_static(b"x"),
    };
    let mut list = MessageList::from_messages(&[m]);
    list.first_seq = 1000;
    let mut b = Vec::new();
    Frame::Messages(list).encode(&mut b);
    let e = a.handle_read(t0, &b, |_| true).unwrap_err();
    assert!(matches!(e, PeerError::Sequence(_)), "{e}");
    // An acknowledgement of what was never sent.
    let mut a = connected(t0);
    let mut b = Vec::new();
    Frame::Ack(5).encode(&mut b);
    let e = a.handle_read(t0, &b, |_| true).unwrap_err();
    assert!(matches!(e, PeerError::Sequence(_)), "{e}");
}

#[test]
fn messages_for_a_missing_mailbox_give_their_credit_back_and_others_are_delivered() {
    let t0 = Instant::now();
    let mut a = connected(t0);
    let msgs = [
        Message {
            to: n("here"),
            from: n("s"),
            payload: Bytes::from_static(b"one"),
        },
        Message {
            to: n("gone"),
            from: n("s"),
            payload: Bytes::from_static(b"two"),
        },
    ];
    let mut b = Vec::new();
    Frame::Messages(MessageList::from_messages(&msgs)).encode(&mut b);
    a.handle_read(t0, &b, |m| m.as_str() == "here").unwrap();
    let d = a.poll_delivery().expect("one delivery");
    assert_eq!((d.to.as_str(), &d.payload[..]), ("here", &b"one"[..]));
    assert!(a.poll_delivery().is_none());
    assert_eq!(a.recv_credit().held(b"here"), d.charge);
    assert_eq!(a.recv_credit().held(b"gone"), 0);
    // Taken by the application: the charge goes back, in a CREDIT frame.
    a.handle_taken(b"here", d.charge);
    assert_eq!(a.recv_credit().held(b"here"), 0);
    let mut out = Vec::new();
    a.poll_transmit(t0 + MS, &mut out, usize::MAX);
    let mut buf = BytesMut::from(&out[..]);
    let mut credits = 0;
    while let Some(f) = frame::decode(&mut buf, 64 << 10).unwrap() {
        credits += matches!(f, Frame::Credit(_)) as u32;
    }
    assert!(credits >= 1, "the credit went back");
}

/// A SYNC's figures come from the peer and may be anything: huge ones saturate the
/// recount (found by the `peer` fuzz target: the sum overflowed) and leave this side
/// unable to send to that mailbox, not with credit that wrapped around.
#[test]
fn a_forged_sync_saturates_and_wraps_no_credit_around() {
    let t0 = Instant::now();
    let mut a = connected(t0);
    a.send(t0, &n("m"), &n("s"), Bytes::from_static(b"queued"), false)
        .unwrap();
    let mut b = Vec::new();
    Frame::Sync(frame::Sync {
        next: 0,
        window: 1 << 20,
        max_payload: 1 << 20,
        held: vec![(n("m"), u64::MAX), (n("m"), u64::MAX)],
    })
    .encode(&mut b);
    a.handle_read(t0, &b, |_| true).unwrap();
    assert_eq!(
        a.send(t0, &n("m"), &n("s"), Bytes::from_static(b"more"), false),
        Err(SendRefused::Credit)
    );
}

/// Messages written by the machine, decoded (their payloads, in order).
fn written(out: &[u8]) -> Vec<Vec<u8>> {
    let mut buf = BytesMut::from(out);
    let mut got = Vec::new();
    while let Some(f) = frame::decode(&mut buf, 64 << 10).unwrap() {
        if let Frame::Messages(l) = f {
            got.extend(l.iter().map(|m| m.payload.to_vec()));
        }
    }
    got
}

/// The ordinary queue goes out as its bundler says: `natural` everything at once, `none`
/// one message a round, `linger` at its timer, which `poll_timeout` reports.
#[test]
fn the_bundler_decides_when_and_how_much_of_the_ordinary_queue_goes_out() {
    use crate::bundler::{BundlerConfig, BundlerKind};
    let t0 = Instant::now();
    let with = |kind| {
        let b = BundlerConfig {
            kind,
            max_size: 64 << 10,
            max_delay: 5 * MS,
        }
        .build();
        let mut a = Peer::with_bundler(cfg(), b, t0);
        a.handle_connect(t0, 7);
        a.handle_resume(t0, Resume::FRESH).unwrap();
        for k in 0..3u8 {
            a.send(t0, &n("m"), &n("s"), Bytes::from(vec![k; 8]), false)
                .unwrap();
        }
        a
    };
    // natural: one round takes all three.
    let mut a = with(BundlerKind::Natural);
    let mut out = Vec::new();
    a.poll_transmit(t0, &mut out, usize::MAX);
    assert_eq!(written(&out).len(), 3);
    assert_eq!(a.flushes(), [1, 0, 0, 0]);
    // none: one a round.
    let mut a = with(BundlerKind::None);
    for round in 1..=3 {
        let mut out = Vec::new();
        a.poll_transmit(t0, &mut out, usize::MAX);
        assert_eq!(written(&out), vec![vec![round as u8 - 1; 8]]);
    }
    assert_eq!(a.flushes(), [0, 0, 0, 3]);
    // linger: nothing before its timer, which poll_timeout names; all three at it.
    let mut a = with(BundlerKind::Linger);
    let mut out = Vec::new();
    a.poll_transmit(t0 + MS, &mut out, usize::MAX);
    assert!(written(&out).is_empty(), "held for company");
    assert_eq!(a.poll_timeout(), Some(t0 + 5 * MS));
    let mut out = Vec::new();
    a.poll_transmit(t0 + 5 * MS, &mut out, usize::MAX);
    assert_eq!(written(&out).len(), 3);
    assert_eq!(a.flushes(), [0, 0, 1, 0]);
    assert!(a.poll_timeout().is_none_or(|t| t > t0 + 5 * MS));
}

/// Messages for mailboxes this node does not have are told to the peer, by (mailbox,
/// sender) pair, at most `NOTICE_PAIRS` pairs apart and the rest summed under "", at most
/// `NOTICES_PER_WRITE` a round; what the peer reports back is kept for the application,
/// bounded too.
#[test]
fn undeliverable_notices_go_back_bounded_and_the_peers_reports_are_kept_bounded() {
    let t0 = Instant::now();
    let mut a = connected(t0);
    // 80 pairs, the first one three times.
    let mut msgs = Vec::new();
    for k in 0..80 {
        msgs.push(Message {
            to: n(&format!("gone-{k}")),
            from: n("s"),
            payload: Bytes::from_static(b"?"),
        });
    }
    msgs.push(msgs[0].clone());
    msgs.push(msgs[0].clone());
    let mut b = Vec::new();
    Frame::Messages(MessageList::from_messages(&msgs)).encode(&mut b);
    a.handle_read(t0, &b, |_| false).unwrap();
    assert!(a.poll_delivery().is_none());
    let mut told: Vec<(String, u32)> = Vec::new();
    for round in 0..10 {
        let mut out = Vec::new();
        a.poll_transmit(t0 + round * MS, &mut out, usize::MAX);
        let mut buf = BytesMut::from(&out[..]);
        let mut this_round = 0;
        while let Some(f) = frame::decode(&mut buf, 64 << 10).unwrap() {
            if let Frame::Undeliverable(u) = f {
                told.push((u.to.to_string(), u.count));
                this_round += 1;
            }
        }
        assert!(this_round <= NOTICES_PER_WRITE);
    }
    assert_eq!(
        told.iter().map(|t| t.1).sum::<u32>(),
        82,
        "every message told"
    );
    assert_eq!(told.len(), NOTICE_PAIRS + 1, "64 pairs and one sum");
    assert!(told.contains(&("gone-0".to_string(), 3)));
    assert!(
        told.contains(&(String::new(), 16)),
        "the 16 pairs beyond, summed"
    );
    // The peer's reports: kept up to REPORTS_KEPT, the rest counted.
    let mut b = Vec::new();
    for _ in 0..REPORTS_KEPT + 5 {
        Frame::Undeliverable(Undeliverable {
            count: 1,
            to: n("x"),
            from: n("y"),
        })
        .encode(&mut b);
    }
    a.handle_read(t0, &b, |_| true).unwrap();
    assert_eq!(
        std::iter::from_fn(|| a.poll_reported()).count(),
        REPORTS_KEPT
    );
    assert_eq!(a.reports_dropped(), 5);
}

/// GOODBYE: the peer is down (it left) and what follows on that connection is not read.
/// REFUSE with Reset: this end resets too, and the connection is to be closed.
#[test]
fn a_goodbye_ends_the_connection_and_a_reset_resets_this_end() {
    let t0 = Instant::now();
    let mut a = connected(t0);
    let mut b = Vec::new();
    Frame::Goodbye.encode(&mut b);
    b.extend(hello());
    a.handle_read(t0, &b, |_| true).unwrap();
    let events: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
    assert!(
        events.iter().any(|e| matches!(
            e,
            SessionEvent::Down {
                reason: crate::session::DownReason::Left
            }
        )),
        "{events:?}"
    );
    // What comes after on that connection, even what breaks the protocol, is not read.
    assert!(
        a.handle_read(t0, &hello(), |_| true).is_ok(),
        "nothing more read"
    );

    let mut a = connected(t0);
    a.send(t0, &n("m"), &n("s"), Bytes::from_static(b"pending"), false)
        .unwrap();
    let mut out = Vec::new();
    a.poll_transmit(t0, &mut out, usize::MAX);
    let mut b = Vec::new();
    Frame::Refuse(frame::Refuse {
        code: RefuseCode::Reset,
        reason: "cannot resume".into(),
    })
    .encode(&mut b);
    let e = a.handle_read(t0, &b, |_| true).unwrap_err();
    assert_eq!(e, PeerError::Reset("cannot resume".into()));
    let events: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SessionEvent::Failed { .. })),
        "what was pending failed: {events:?}"
    );
}

/// Shutting down: the goodbye (a final ACK, then GOODBYE) goes once what was sent is
/// acknowledged, once only; past the deadline, what is still queued is handed back first.
#[test]
fn the_goodbye_waits_for_acknowledgements_or_the_deadline() {
    let t0 = Instant::now();
    let goodbye = |out: &[u8]| {
        let mut buf = BytesMut::from(out);
        let mut kinds = Vec::new();
        while let Some(f) = frame::decode(&mut buf, 64 << 10).unwrap() {
            kinds.push(f.kind_name());
        }
        kinds
    };
    // Written, then acknowledged: the goodbye follows the acknowledgement.
    let mut a = connected(t0);
    a.send(t0, &n("m"), &n("s"), Bytes::from_static(b"last"), false)
        .unwrap();
    let mut out = Vec::new();
    a.poll_transmit(t0, &mut out, usize::MAX);
    a.begin_close(t0 + Duration::from_secs(1));
    let mut out = Vec::new();
    assert!(!a.poll_close(t0 + MS, &mut out), "not before the ACK");
    let mut ack = Vec::new();
    Frame::Ack(1).encode(&mut ack);
    a.handle_read(t0 + MS, &ack, |_| true).unwrap();
    assert!(a.poll_close(t0 + 2 * MS, &mut out));
    assert_eq!(goodbye(&out), vec!["ACK", "GOODBYE"]);
    let mut again = Vec::new();
    assert!(!a.poll_close(t0 + 3 * MS, &mut again), "once");
    // Nothing follows the goodbye: a heartbeat, credit or a notice due after it is not
    // written (the write side is shut after the goodbye).
    let later = t0 + Duration::from_secs(2);
    a.handle_timeout(later);
    a.notices.push((n("x"), n("y"), 1));
    a.sync_out = Some(a.rcredit.snapshot(a.s.recv_next(), 1 << 20));
    let mut after = Vec::new();
    a.poll_transmit(later, &mut after, usize::MAX);
    assert!(after.is_empty(), "after the goodbye: {:?}", goodbye(&after));
    // Never written, and the deadline passes: handed back, then the goodbye.
    let mut a = connected(t0);
    a.send(t0, &n("m"), &n("s"), Bytes::from_static(b"stuck"), false)
        .unwrap();
    a.begin_close(t0 + 10 * MS);
    let mut out = Vec::new();
    assert!(a.poll_close(t0 + 20 * MS, &mut out));
    assert_eq!(goodbye(&out), vec!["ACK", "GOODBYE"]);
    let failed: Vec<_> = std::iter::from_fn(|| a.poll_event())
        .filter_map(|e| match e {
            SessionEvent::Failed { messages, reason } => Some((messages.len(), reason)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![(1, FailReason::ShutDown)]);
}
