//! Fake-clock tests of every session rule, and a two-session simulation over bounded
//! "wires" (each direction a byte buffer of limited size, as a TCP connection's buffers
//! are) that plays the three failures of the connection layer v2 issue.

use super::*;
use crate::frame;
use bytes::{Bytes, BytesMut};

const MS: Duration = Duration::from_millis(1);

fn cfg() -> SessionConfig {
    SessionConfig {
        reliable: true,
        unacked_bytes: 1 << 20,
        ack_every: 64,
        ack_every_bytes: 1 << 20,
        ack_delay: 5 * MS,
        heartbeat_interval: 100 * MS,
        peer_timeout: 600 * MS,
        bulk_inflight: 4096,
        bulk_stream: 4096,
    }
}

/// Encode messages numbered `nums` (payload = the number) and hold them.
fn hold(s: &mut Session, nums: std::ops::Range<u64>) {
    s.hold(&crate::outbox::numbered(nums).message_frames());
}

/// Connect two sessions directly (both RESUMEs applied). Returns (a's id, b's id).
fn connect(a: &mut Session, b: &mut Session, now: Instant) -> (ConnId, ConnId) {
    let (ia, ra) = a.handle_connect(now, 2);
    let (ib, rb) = b.handle_connect(now, 1);
    a.handle_resume(now, ia, rb).unwrap();
    b.handle_resume(now, ib, ra).unwrap();
    (ia, ib)
}

fn events(s: &mut Session) -> Vec<SessionEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn is_down(e: &SessionEvent) -> bool {
    matches!(e, SessionEvent::Down { .. })
}

#[test]
fn a_full_send_window_still_lets_acknowledgements_and_heartbeats_out() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.unacked_bytes = 100;
    let mut s = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..50);
    assert!(s.window_full());
    // Something arrived from the peer: the acknowledgement is due regardless.
    let d = s.begin_delivery(id, 0, 64).unwrap().unwrap();
    assert!(
        s.end_delivery(t0, d, 64, 64 * 20),
        "64 messages: ack at once"
    );
    assert_eq!(s.poll_control(t0, id), Some(Frame::Ack(64)));
    // And with nothing to acknowledge, a heartbeat after the interval.
    s.handle_timeout(t0 + 100 * MS);
    assert_eq!(s.poll_control(t0 + 100 * MS, id), Some(Frame::Ack(64)));
    assert!(s.window_full(), "still full: control does not wait for it");
}

#[test]
fn a_heartbeat_handed_out_restarts_the_heartbeat_clock() {
    // The ticker may run between the writer taking the heartbeat and writing it: it must
    // not make another one due.
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let mut sent = 0;
    let mut now = t0;
    while now < t0 + Duration::from_secs(10) {
        if s.poll_timeout().is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
        if s.poll_control(now, id).is_some() {
            sent += 1;
            // A ticker round before the write completes and is noted.
            s.handle_timeout(now + MS);
        }
        s.handle_heard(now, id);
        now += MS;
    }
    assert_eq!(
        sent, 99,
        "one heartbeat per 100 ms interval in 10 s, no doubles"
    );
}

#[test]
fn acknowledgements_come_after_ack_every_or_after_the_delay() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let d = s.begin_delivery(id, 0, 10).unwrap().unwrap();
    assert!(!s.end_delivery(t0, d, 10, 100), "10 < 64: not yet");
    assert_eq!(s.poll_control(t0, id), None);
    assert_eq!(s.poll_timeout(), Some(t0 + 5 * MS));
    s.handle_timeout(t0 + 5 * MS);
    assert_eq!(s.poll_control(t0, id), Some(Frame::Ack(10)));
    assert_eq!(s.poll_control(t0, id), None, "given once");
}

#[test]
fn a_drained_reader_acknowledges_at_once_after_enough_bytes() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let d = s.begin_delivery(id, 0, 1).unwrap().unwrap();
    s.end_delivery(t0, d, 1, 100);
    assert!(
        !s.handle_idle(id),
        "100 B: a request now and then waits for the delay"
    );
    let d = s.begin_delivery(id, 1, 10).unwrap().unwrap();
    s.end_delivery(t0, d, 11, IDLE_ACK_BYTES);
    assert!(
        s.handle_idle(id),
        "a window's worth: the sender may be waiting"
    );
    assert_eq!(s.poll_control(t0, id), Some(Frame::Ack(11)));
    assert!(!s.handle_idle(id), "nothing new since");
}

#[test]
fn a_silent_peer_is_declared_down_and_its_messages_handed_back() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert!(matches!(
        events(&mut s)[..],
        [SessionEvent::Up { incarnation: 2 }]
    ));
    hold(&mut s, 0..5);
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    s.handle_heard(t0 + 100 * MS, id);
    s.handle_timeout(t0 + 699 * MS);
    assert!(events(&mut s).is_empty(), "heard 599 ms ago: not yet");
    assert_eq!(s.poll_timeout(), Some(t0 + 700 * MS));
    s.handle_timeout(t0 + 700 * MS);
    let ev = events(&mut s);
    assert!(
        matches!(ev[0], SessionEvent::Close { conn } if conn == id),
        "{ev:?}"
    );
    assert!(matches!(
        ev[1],
        SessionEvent::Down {
            reason: DownReason::Silent { .. }
        }
    ));
    let SessionEvent::Failed { messages, reason } = &ev[2] else {
        panic!("{ev:?}")
    };
    assert_eq!(messages.len(), 5);
    assert!(matches!(
        reason,
        FailReason::Down(DownReason::Silent { .. })
    ));
    assert_eq!(s.state(), PeerState::Down);
    assert_eq!(s.current(), None);
}

#[test]
fn a_paused_reader_does_not_count_silence_and_unpausing_restarts_the_clock() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    connect(&mut s, &mut peer, t0);
    s.set_paused(t0 + 10 * MS, true);
    s.handle_timeout(t0 + 3 * 600 * MS);
    assert!(!events(&mut s).iter().any(is_down));
    let resumed = t0 + 3 * 600 * MS;
    s.set_paused(resumed, false);
    s.handle_timeout(resumed + 599 * MS);
    assert!(!events(&mut s).iter().any(is_down));
    s.handle_timeout(resumed + 600 * MS);
    assert!(events(&mut s).iter().any(is_down));
}

#[test]
fn an_unreachable_peer_is_declared_down_a_never_connected_one_is_not() {
    let t0 = Instant::now();
    let mut never = Session::new(cfg(), t0);
    never.handle_timeout(t0 + 10 * 600 * MS);
    assert_eq!(never.state(), PeerState::Connecting);
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    s.handle_disconnect(t0 + 50 * MS, id);
    s.handle_timeout(t0 + 649 * MS);
    assert_eq!(s.state(), PeerState::Up);
    s.handle_timeout(t0 + 650 * MS);
    assert_eq!(s.state(), PeerState::Down);
    assert!(matches!(
        events(&mut s).last(),
        Some(SessionEvent::Down {
            reason: DownReason::Unreachable { .. }
        })
    ));
    // It comes back: up again.
    let (id2, _) = s.handle_connect(t0 + 900 * MS, 2);
    s.handle_resume(t0 + 900 * MS, id2, Resume::FRESH).unwrap();
    assert_eq!(s.state(), PeerState::Up);
}

#[test]
fn a_parked_session_is_not_unreachable_until_something_is_held_for_it() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, pid) = connect(&mut s, &mut peer, t0);
    // Something unacknowledged: it may not park (the connection is wanted back).
    hold(&mut s, 0..3);
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    s.handle_disconnect(t0, id);
    assert!(!s.is_quiet() && !s.park() && !s.is_parked());
    let (id, _) = s.handle_connect(t0, 2);
    // The peer's RESUME says it has all three.
    let r = s
        .handle_resume(
            t0,
            id,
            Resume {
                next: 3,
                ..Resume::FRESH
            },
        )
        .unwrap();
    assert_eq!(r.acked, 3);
    let _ = pid;
    // Connected: it may not park.
    assert!(s.is_quiet() && !s.park());
    s.handle_disconnect(t0 + 10 * MS, id);
    assert!(s.park() && s.is_parked());
    // Far past peer_timeout: still up, no deadline pending for it.
    assert_eq!(s.poll_timeout(), None);
    s.handle_timeout(t0 + 100 * 600 * MS);
    assert_eq!(s.state(), PeerState::Up);
    assert!(events(&mut s).iter().all(|e| !is_down(e)));
    // Something held: due at once, and the clock starts again from that timeout.
    let t1 = t0 + 200 * 600 * MS;
    hold(&mut s, 3..4);
    assert!(s.poll_timeout().is_some_and(|t| t <= t1));
    s.handle_timeout(t1);
    assert!(!s.is_parked());
    assert_eq!(s.poll_timeout(), Some(t1 + 600 * MS));
    s.handle_timeout(t1 + 599 * MS);
    assert_eq!(s.state(), PeerState::Up);
    s.handle_timeout(t1 + 600 * MS);
    assert_eq!(s.state(), PeerState::Down);
    assert!(matches!(
        events(&mut s).last(),
        Some(SessionEvent::Failed { .. })
    ));
    assert!(!s.is_parked());
}

#[test]
fn a_session_with_deliveries_unacknowledged_does_not_park_and_a_connect_unparks() {
    let t0 = Instant::now();
    let mut a = Session::new(cfg(), t0);
    let mut b = Session::new(cfg(), t0);
    let (ia, ib) = connect(&mut a, &mut b, t0);
    // b delivers one message from a and has not acknowledged it.
    hold(&mut a, 0..1);
    let d = b.begin_delivery(ib, 0, 1).unwrap().unwrap();
    assert!(!b.is_quiet(), "a delivery under way");
    b.end_delivery(t0, d, d.end, 8);
    b.handle_disconnect(t0, ib);
    assert!(
        !b.is_quiet() && !b.park(),
        "a delivered message not acknowledged"
    );
    // A parked session reconnecting is not parked any more.
    a.handle_disconnect(t0, ia);
    assert!(!a.park(), "a's message is not acknowledged either");
    let mut c = Session::new(cfg(), t0);
    let mut d2 = Session::new(cfg(), t0);
    let (ic, _) = connect(&mut c, &mut d2, t0);
    c.handle_disconnect(t0, ic);
    assert!(c.park());
    let _ = c.handle_connect(t0, 1);
    assert!(!c.is_parked());
}

#[test]
fn a_member_back_in_the_cluster_takes_sends_again_until_it_connects() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert!(!s.handle_member_back(2), "not down: nothing to do");
    s.handle_disconnect(t0, id);
    assert!(s.handle_declared_down(t0, 2));
    assert_eq!(s.holdable(), Err(FailReason::Down(DownReason::Membership)));
    events(&mut s);
    assert!(s.handle_member_back(9));
    assert_eq!(s.state(), PeerState::Connecting);
    assert!(matches!(
        events(&mut s)[..],
        [SessionEvent::Restarted { incarnation: 9 }]
    ));
    assert_eq!(s.holdable(), Ok(()));
    // Waits for a connection as a never-connected peer does: no timer declares it down.
    hold(&mut s, 0..2);
    s.handle_timeout(t0 + 100 * 600 * MS);
    assert_eq!(s.state(), PeerState::Connecting);
    // The restarted peer connects: nothing held for it fails (it is the incarnation they
    // were sent to), fresh numbering, up.
    let (id, _) = s.handle_connect(t0, 9);
    assert!(events(&mut s).is_empty());
    s.handle_resume(t0, id, Resume::FRESH).unwrap();
    assert_eq!(s.state(), PeerState::Up);
    assert_eq!(s.window_messages(), 2, "still held, to be written");
    // Shutting down: it stays down.
    s.handle_disconnect(t0, id);
    s.handle_declared_down(t0, 9);
    s.begin_close(t0 + 1000 * MS);
    assert!(!s.handle_member_back(10));
    assert_eq!(s.state(), PeerState::Down);
}

#[test]
fn a_peer_whose_connections_keep_coming_back_is_never_declared_down() {
    // peer_timeout is 600 ms: connections that live 150 ms and come back 50 ms later, for
    // 10 s, never leave the peer unreachable or silent for that long.
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (mut ia, mut ib) = connect(&mut s, &mut peer, t0);
    events(&mut s);
    let mut t = t0;
    for _ in 0..50 {
        for _ in 0..3 {
            t += 50 * MS;
            s.handle_heard(t, ia);
            s.handle_timeout(t);
        }
        s.handle_disconnect(t, ia);
        peer.handle_disconnect(t, ib);
        t += 50 * MS;
        s.handle_timeout(t);
        (ia, ib) = connect(&mut s, &mut peer, t);
    }
    assert_eq!(s.state(), PeerState::Up);
    let downs: Vec<_> = events(&mut s)
        .into_iter()
        .filter(|e| matches!(e, SessionEvent::Down { .. } | SessionEvent::Failed { .. }))
        .collect();
    assert!(downs.is_empty(), "{downs:?}");
    // Once it stops coming back, it is declared down after peer_timeout.
    s.handle_disconnect(t, ia);
    s.handle_timeout(t + 599 * MS);
    assert_eq!(s.state(), PeerState::Up);
    s.handle_timeout(t + 600 * MS);
    assert_eq!(s.state(), PeerState::Down);
}

#[test]
fn the_clusters_verdict_waits_for_what_the_session_hears_itself() {
    // Membership declares the peer down while its connection is up and it was heard from
    // within peer_timeout (a refutation lost with a broken connection, a member that the
    // others cannot reach): the session keeps it. Once the connection is gone, or it is
    // silent for peer_timeout, the verdict is applied at once.
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    events(&mut s);
    hold(&mut s, 0..3);
    s.handle_heard(t0 + 100 * MS, id);
    assert!(
        !s.handle_declared_down(t0 + 699 * MS, 2),
        "heard 599 ms ago"
    );
    assert_eq!(s.state(), PeerState::Up);
    assert!(events(&mut s).is_empty());
    // Another incarnation's verdict never applies.
    s.handle_disconnect(t0 + 200 * MS, id);
    assert!(!s.handle_declared_down(t0 + 200 * MS, 9));
    assert_eq!(s.state(), PeerState::Up);
    // No connection: the verdict applies, and what was pending is handed back.
    assert!(s.handle_declared_down(t0 + 200 * MS, 2));
    assert_eq!(s.state(), PeerState::Down);
    let ev = events(&mut s);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            SessionEvent::Down {
                reason: DownReason::Membership
            }
        )),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| matches!(e, SessionEvent::Failed { messages, .. } if messages.len() == 3)),
        "{ev:?}"
    );
    // Connected but silent for peer_timeout: applies too.
    let mut s = Session::new(cfg(), t0);
    let (_, _) = connect(&mut s, &mut Session::new(cfg(), t0), t0);
    assert!(s.handle_declared_down(t0 + 600 * MS, 2));
    assert_eq!(s.state(), PeerState::Down);
}

#[test]
fn a_restarted_peer_gets_fresh_numbering_and_what_was_pending_fails() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..7);
    let d = s.begin_delivery(id, 0, 3).unwrap().unwrap();
    // The old incarnation restarts before the delivery ends.
    let (id2, r) = s.handle_connect(t0 + MS, 99);
    assert_eq!(r, Resume::FRESH);
    s.end_delivery(t0 + MS, d, 3, 30);
    let ev = events(&mut s);
    assert!(
        ev.iter().any(|e| matches!(e, SessionEvent::Failed { messages, reason: FailReason::Restarted } if messages.len() == 7))
    );
    assert!(ev.contains(&SessionEvent::Restarted { incarnation: 99 }));
    s.handle_resume(t0 + MS, id2, Resume::FRESH).unwrap();
    // The void delivery moved nothing: the new stream starts at 0.
    let d = s.begin_delivery(id2, 0, 1).unwrap().unwrap();
    assert_eq!(d.skip, 0);
}

#[test]
fn forged_values_are_violations_and_change_nothing() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    hold(&mut s, 0..3);
    let (id, _) = s.handle_connect(t0, 5);
    assert_eq!(
        s.handle_resume(
            t0,
            id,
            Resume {
                next: 1,
                base: 0,
                keep: 0
            }
        ),
        Err(SeqError::ResumeBeyondSent { next: 1, sent: 0 }),
        "nothing was ever written"
    );
    assert_eq!((s.current(), s.state()), (None, PeerState::Connecting));
    s.handle_resume(
        t0,
        id,
        Resume {
            next: 0,
            base: u64::MAX,
            keep: 0,
        },
    )
    .unwrap();
    assert_eq!(
        s.handle_ack(t0, id, 1),
        Err(SeqError::AckBeyondSent { ack: 1, sent: 0 })
    );
    s.unwritten(id);
    assert_eq!(
        s.handle_ack(t0, id, 4),
        Err(SeqError::AckBeyondSent { ack: 4, sent: 3 })
    );
    assert_eq!(s.window_messages(), 3);
    // The forged base makes nothing skippable: a real frame at 0 is delivered whole.
    let d = s.begin_delivery(id, 0, 2).unwrap().unwrap();
    assert_eq!(d.skip, 0);
    assert_eq!(
        s.begin_delivery(id, 10, 1),
        Err(SeqError::Gap {
            expected: 0,
            got: 10
        })
    );
    assert!(matches!(
        s.begin_delivery(id, u64::MAX, 2),
        Err(SeqError::Overflow { .. })
    ));
}

#[test]
fn frames_of_a_replaced_connection_are_ignored_but_its_deliveries_count() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    hold(&mut s, 0..4);
    let (old, _) = connect(&mut s, &mut peer, t0);
    let d = s.begin_delivery(old, 0, 10).unwrap().unwrap();
    // A new connection resumes while the old reader is still delivering.
    let (new, r) = s.handle_connect(t0 + MS, 2);
    assert_eq!(r.next, 0, "the delivery in progress is not counted yet");
    let res = s.handle_resume(t0 + MS, new, Resume::FRESH).unwrap();
    assert_eq!(res.replaced, Some(old));
    assert_eq!(s.handle_ack(t0 + MS, old, 4), Ok(0), "ignored: not current");
    assert_eq!(s.window_messages(), 4);
    assert_eq!(s.begin_delivery(old, 10, 1), Ok(None));
    // The old reader got 6 of its 10 in before it stopped: they count.
    s.end_delivery(t0 + MS, d, 6, 60);
    // The peer resends from 0 on the new connection: the first 6 are skipped.
    let d = s.begin_delivery(new, 0, 10).unwrap().unwrap();
    assert_eq!(d.skip, 6);
}

#[test]
fn unsequenced_sessions_keep_nothing_once_written() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.reliable = false;
    let mut s = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..5);
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    assert_eq!(s.window_messages(), 0);
    hold(&mut s, 5..8);
    s.handle_disconnect(t0, id);
    assert!(matches!(
        &events(&mut s)[..],
        [SessionEvent::Up { .. }, SessionEvent::Failed { messages, reason: FailReason::ConnectionLost }] if messages.len() == 3
    ));
}

#[test]
fn goodbye_waits_for_acknowledgements_or_the_deadline() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..3);
    s.unwritten(id);
    s.begin_close(t0 + 1000 * MS);
    assert_eq!(s.poll_close(t0, id, false), None, "3 unacknowledged");
    assert_eq!(
        s.poll_timeout(),
        Some(t0 + 100 * MS),
        "the heartbeat comes first"
    );
    assert_eq!(s.handle_ack(t0, id, 2), Ok(0), "the chunk holds all three");
    assert_eq!(s.poll_close(t0, id, false), None);
    s.handle_ack(t0, id, 3).unwrap();
    assert_eq!(s.poll_close(t0, id, true), None, "still queued in the lane");
    assert_eq!(
        s.poll_close(t0, id, false),
        Some([Frame::Ack(0), Frame::Goodbye])
    );
    assert_eq!(s.poll_close(t0, id, false), None, "given once");
    assert!(s.is_closed());
    // With a peer that never acknowledges: failed at the deadline, then goodbye.
    let mut s = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..3);
    s.unwritten(id);
    s.begin_close(t0 + 1000 * MS);
    s.handle_heard(t0 + 900 * MS, id);
    assert_eq!(s.poll_close(t0 + 999 * MS, id, false), None);
    assert!(s.poll_close(t0 + 1000 * MS, id, false).is_some());
    assert!(events(&mut s).iter().any(|e| matches!(
        e,
        SessionEvent::Failed {
            reason: FailReason::ShutDown,
            ..
        }
    )));
}

#[test]
fn the_goodbye_covers_a_delivery_in_progress_and_nothing_is_delivered_after_it() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    s.begin_close(t0 + 1000 * MS);
    // A reader is in the middle of delivering five messages: the final acknowledgement
    // must include them, so the goodbye waits for the delivery to end...
    let d = s.begin_delivery(id, 0, 5).unwrap().unwrap();
    assert!(s.delivering());
    assert_eq!(s.poll_close(t0, id, false), None);
    s.end_delivery(t0, d, 5, 50);
    assert_eq!(
        s.poll_close(t0, id, false),
        Some([Frame::Ack(5), Frame::Goodbye])
    );
    // ...and what arrives after the goodbye is not delivered (the peer fails it).
    assert_eq!(s.begin_delivery(id, 5, 3), Ok(None));
    assert_eq!(
        s.holdable(),
        Err(FailReason::ShutDown),
        "and nothing more is held"
    );
    // A delivery stuck past the deadline (a full mailbox) does not hold the goodbye up.
    let mut s = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    s.begin_close(t0 + 1000 * MS);
    let _stuck = s.begin_delivery(id, 0, 5).unwrap().unwrap();
    s.handle_heard(t0 + 900 * MS, id);
    assert_eq!(s.poll_close(t0 + 999 * MS, id, false), None);
    assert!(s.poll_close(t0 + 1000 * MS, id, false).is_some());
}

#[test]
fn after_handle_timeout_the_next_deadline_is_in_the_future() {
    // Whatever happened, a ticker that sleeps until `poll_timeout` never spins.
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let mut now = t0;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut seq = 0;
    for _ in 0..5000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        now += Duration::from_micros(rng % 50_000);
        match rng % 7 {
            0 => hold(&mut s, seq..seq + 3),
            1 => {
                let d = s.begin_delivery(id, seq, 2).unwrap();
                if let Some(d) = d {
                    s.end_delivery(now, d, d.end, 20);
                    seq = d.end;
                }
            }
            2 => {
                let _ = s.poll_control(now, id);
            }
            3 => s.handle_heard(now, id),
            4 => s.set_paused(now, rng.is_multiple_of(2)),
            _ => {}
        }
        s.handle_timeout(now);
        if let Some(t) = s.poll_timeout() {
            assert!(t > now, "deadline {:?} not after now", t - t0);
        }
        events(&mut s);
    }
}

// ---- a two-session simulation -----------------------------------------------------------

/// One side of a simulated connection: its session, the application's messages still to
/// send, and what it received.
struct Side {
    s: Session,
    id: ConnId,
    to_send: std::ops::Range<u64>,
    got: Vec<u64>,
    /// Bytes read from the wire and not yet a whole frame.
    buf: BytesMut,
    /// The application does not consume: the reader waits (and reads nothing).
    paused: bool,
    events: Vec<SessionEvent>,
}

/// A TCP connection's buffers: at most `cap` bytes in flight each way.
struct Wire {
    bytes: Vec<u8>,
    cap: usize,
}

impl Side {
    fn new(cfg: SessionConfig, t0: Instant, n: u64) -> Side {
        Side {
            s: Session::new(cfg, t0),
            id: ConnId::new(0),
            to_send: 0..n,
            got: Vec::new(),
            buf: BytesMut::new(),
            paused: false,
            events: Vec::new(),
        }
    }

    /// The writer: control first, then what the window holds, then more from the
    /// application while the window has room; only as much as the wire takes.
    fn write(&mut self, now: Instant, w: &mut Wire) {
        if w.bytes.len() >= w.cap {
            return; // blocked in write(): nothing goes out, control included
        }
        while let Some(f) = self.s.poll_control(now, self.id) {
            f.encode(&mut w.bytes);
            self.s.note_sent(now, self.id);
        }
        if !self.s.window_full() && !self.to_send.is_empty() {
            let n = (self.to_send.end - self.to_send.start).min(20);
            let start = self.to_send.start;
            hold(&mut self.s, start..start + n);
            self.to_send.start += n;
        }
        let u = self.s.unwritten(self.id);
        let g = u.generation;
        // Whole chunks (all the slices of one) until the wire is full.
        let segments = u.segments();
        let mut written = None;
        for (i, (c, end)) in segments.iter().enumerate() {
            let continues = i > 0 && segments[i - 1].1 == *end;
            if w.bytes.len() >= w.cap && !continues {
                break;
            }
            w.bytes.extend_from_slice(c);
            written = Some(*end);
        }
        if let Some(end) = written {
            self.s.mark_written(now, self.id, g, end);
        }
    }

    /// The reader: everything on the wire, unless the application does not consume.
    fn read(&mut self, now: Instant, w: &mut Wire) {
        if self.paused || w.bytes.is_empty() {
            return;
        }
        self.buf.extend_from_slice(&w.bytes);
        w.bytes.clear();
        self.s.handle_heard(now, self.id);
        while let Some(f) = frame::decode(&mut self.buf, 1 << 20).unwrap() {
            match f {
                Frame::Messages(l) => {
                    let d = self
                        .s
                        .begin_delivery(self.id, l.first_seq, l.len() as u32)
                        .unwrap()
                        .unwrap();
                    for m in l.skip(d.skip).iter() {
                        self.got
                            .push(u64::from_le_bytes(m.payload[..8].try_into().unwrap()));
                    }
                    self.s.end_delivery(now, d, d.end, l.body().len());
                }
                Frame::Ack(n) => {
                    self.s.handle_ack(now, self.id, n).unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        self.s.handle_timeout(now);
        self.events
            .extend(std::iter::from_fn(|| self.s.poll_event()));
    }
}

/// Run `a` and `b` against each other for `span` of simulated time in 1 ms steps;
/// `pause_b` says when b's application does not consume.
fn simulate(
    a: &mut Side,
    b: &mut Side,
    span: Duration,
    cap: usize,
    pause_b: impl Fn(Duration) -> bool,
) {
    let t0 = Instant::now();
    let (ia, ib) = connect(&mut a.s, &mut b.s, t0);
    (a.id, b.id) = (ia, ib);
    let (mut ab, mut ba) = (
        Wire {
            bytes: Vec::new(),
            cap,
        },
        Wire {
            bytes: Vec::new(),
            cap,
        },
    );
    let mut now = t0;
    while now < t0 + span {
        now += MS;
        let paused = pause_b(now - t0);
        if paused != b.paused {
            b.paused = paused;
            b.s.set_paused(now, paused);
        }
        a.tick(now);
        b.tick(now);
        a.write(now, &mut ab);
        b.write(now, &mut ba);
        b.read(now, &mut ab);
        a.read(now, &mut ba);
    }
}

#[test]
fn duplex_saturation_with_a_small_window_delivers_everything_and_declares_nobody_down() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.unacked_bytes = 1024;
    let n = 20_000;
    let (mut a, mut b) = (Side::new(c.clone(), t0, n), Side::new(c, t0, n));
    simulate(&mut a, &mut b, Duration::from_secs(20), 4096, |_| false);
    let want: Vec<u64> = (0..n).collect();
    assert_eq!(b.got, want, "a -> b");
    assert_eq!(a.got, want, "b -> a");
    for side in [&a, &b] {
        assert!(
            !side
                .events
                .iter()
                .any(|e| matches!(e, SessionEvent::Down { .. } | SessionEvent::Failed { .. })),
            "{:?}",
            side.events
        );
    }
}

#[test]
fn a_consumer_that_stops_for_three_timeouts_is_alive_and_then_gets_everything() {
    let t0 = Instant::now();
    let c = cfg();
    let n = 5_000;
    let (mut a, mut b) = (Side::new(c.clone(), t0, n), Side::new(c.clone(), t0, 0));
    let stop = 3 * c.peer_timeout;
    // b's application stops consuming from 100 ms to 100 ms + 3 x peer_timeout.
    simulate(&mut a, &mut b, Duration::from_secs(6), 4096, |t| {
        t >= 100 * MS && t < 100 * MS + stop
    });
    assert!(!a.events.iter().any(is_down), "{:?}", a.events);
    assert!(!b.events.iter().any(is_down), "{:?}", b.events);
    assert_eq!(b.got, (0..n).collect::<Vec<_>>());
}

#[test]
fn a_peer_that_stops_reading_and_talking_is_declared_down_others_are_not() {
    // One node (x) with two peers: y stops entirely (never reads, never heartbeats), z is
    // fine. x declares y down after the timeout and keeps z up: sessions share nothing.
    let t0 = Instant::now();
    let c = cfg();
    let (mut xy, mut y) = (Side::new(c.clone(), t0, 1000), Side::new(c.clone(), t0, 0));
    let (mut xz, mut z) = (Side::new(c.clone(), t0, 1000), Side::new(c.clone(), t0, 0));
    let (ia, ib) = connect(&mut xy.s, &mut y.s, t0);
    (xy.id, y.id) = (ia, ib);
    let (ia, ib) = connect(&mut xz.s, &mut z.s, t0);
    (xz.id, z.id) = (ia, ib);
    let mut wires: Vec<Wire> = (0..4)
        .map(|_| Wire {
            bytes: Vec::new(),
            cap: 4096,
        })
        .collect();
    let mut now = t0;
    while now < t0 + Duration::from_secs(3) {
        now += MS;
        xy.tick(now);
        xz.tick(now);
        z.tick(now);
        let [xy_w, yx_w, xz_w, zx_w] = &mut wires[..] else {
            unreachable!()
        };
        let _ = yx_w; // y is gone: it writes nothing and reads nothing
        xy.write(now, xy_w);
        xz.write(now, xz_w);
        z.write(now, zx_w);
        z.read(now, xz_w);
        xz.read(now, zx_w);
    }
    assert!(xy.events.iter().any(is_down));
    assert!(!xz.events.iter().any(is_down), "{:?}", xz.events);
    assert_eq!(z.got, (0..1000).collect::<Vec<_>>());
}

#[test]
fn bulk_gets_the_stream_budget_once_it_has_had_the_connection_to_itself() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.bulk_inflight = 1000;
    c.bulk_stream = 4000;
    let mut s = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let payload = Bytes::from(vec![7u8; 100 * 500]);
    let (mut offset, mut msg, mut held) = (0, None, 0u64);
    // Hold the next piece of 500 bytes of one large message.
    let mut piece = |s: &mut Session, held: &mut u64| {
        let p = Piece {
            serial: 1,
            to: Name::from_static("to"),
            from: Name::from_static("from"),
            payload: payload.clone(),
            offset,
            len: 500,
            id: msg,
        };
        msg = Some(s.hold_piece(&p).unwrap());
        offset += 500;
        *held += 1;
    };
    // Write and acknowledge everything held.
    let ack = |s: &mut Session, held: u64| {
        let u = s.unwritten(id);
        if let Some(end) = u.ends.last() {
            s.mark_written(t0, id, u.generation, *end);
        }
        s.handle_ack(t0, id, held).unwrap();
        assert_eq!(s.bulk_bytes(), 0);
    };
    // At first the small budget: two pieces fill it.
    piece(&mut s, &mut held);
    assert!(s.bulk_room());
    piece(&mut s, &mut held);
    assert!(!s.bulk_room(), "1000 bytes in flight, budget 1000");
    ack(&mut s, held);
    // 4000 bytes of pieces with no ordinary message between them: the stream budget.
    for _ in 0..6 {
        assert_eq!(s.bulk_budget(), 1000);
        piece(&mut s, &mut held);
        ack(&mut s, held);
    }
    assert_eq!(s.bulk_budget(), 4000);
    for i in 0..8 {
        assert!(s.bulk_room(), "{i} pieces in flight, budget 4000");
        piece(&mut s, &mut held);
    }
    assert!(!s.bulk_room(), "4000 bytes in flight");
    // An ordinary message: the small budget at once, for what is held next.
    hold(&mut s, 0..1);
    held += 1;
    assert_eq!(s.bulk_budget(), 1000);
    assert!(!s.bulk_room());
    ack(&mut s, held);
    assert!(s.bulk_room());
    piece(&mut s, &mut held);
    piece(&mut s, &mut held);
    assert!(!s.bulk_room(), "1000 bytes in flight, budget 1000 again");
    // A stream budget at most the small one is the small one.
    let mut c = cfg();
    c.bulk_inflight = 1000;
    c.bulk_stream = 10;
    let s = Session::new(c, t0);
    assert_eq!(s.bulk_budget(), 1000);
}

/// The poisoned-link attack: an impostor logged in under a's name and incarnation made b
/// take 5 messages a never sent. a cannot honour b's RESUME ("everything below 5 arrived",
/// but a sent 3): instead of refusing it forever, both ends reset (a's pending messages
/// fail, reported), and the next connection numbers from 0 both ways.
#[test]
fn a_session_that_cannot_be_resumed_is_reset_on_both_ends_and_goes_on() {
    let t0 = Instant::now();
    let mut a = Session::new(cfg(), t0);
    let mut b = Session::new(cfg(), t0);
    let (_, ib) = connect(&mut a, &mut b, t0);
    hold(&mut a, 0..3);
    let d = b.begin_delivery(ib, 0, 5).unwrap().unwrap();
    b.end_delivery(t0 + MS, d, 5, 50);
    events(&mut a);
    events(&mut b);
    // Reconnect: b's RESUME claims 5 arrived.
    let t1 = t0 + 2 * MS;
    let (ia, ra) = a.handle_connect(t1, 2);
    let (ib, rb) = b.handle_connect(t1, 1);
    assert_eq!(rb.next, 5);
    b.handle_resume(t1, ib, ra).unwrap();
    assert!(a.handle_resume(t1, ia, rb).is_err());
    // Once or twice may be a forger's value on a connection of its own; the third time
    // in a row, the numbering really disagrees.
    assert!(!a.is_unresumable());
    for _ in 0..2 {
        let (ia, _) = a.handle_connect(t1, 2);
        assert!(a.handle_resume(t1, ia, rb).is_err());
    }
    assert!(a.is_unresumable());
    a.handle_reset(t1);
    assert!(!a.is_unresumable());
    let ev = events(&mut a);
    assert!(
        ev.iter().any(|e| matches!(e, SessionEvent::Failed { messages, reason: FailReason::Reset } if messages.len() == 3)),
        "{ev:?}"
    );
    assert!(ev.contains(&SessionEvent::Reset));
    assert_eq!(a.resets(), 1);
    // b learns it (REFUSE Reset) and resets too: b's current connection goes with it.
    b.handle_reset(t1);
    let ev = events(&mut b);
    assert!(ev.contains(&SessionEvent::Reset), "{ev:?}");
    assert!(ev.contains(&SessionEvent::Close { conn: ib }), "{ev:?}");
    // The next connection resumes from 0 both ways, and a's new messages arrive.
    let t2 = t1 + MS;
    let (ia, ra) = a.handle_connect(t2, 2);
    let (ib, rb) = b.handle_connect(t2, 1);
    assert_eq!((ra.next, rb.next), (0, 0));
    a.handle_resume(t2, ia, rb).unwrap();
    b.handle_resume(t2, ib, ra).unwrap();
    hold(&mut a, 0..2);
    let d = b.begin_delivery(ib, 0, 2).unwrap().unwrap();
    assert_eq!(d.skip, 0, "nothing taken for a duplicate");
}

// ---- found by cargo-mutants: rules the tests above did not pin ----

/// What the session says of itself: the peer's incarnation, the current connection, the
/// window, the next number expected, a delivery in progress, closing, why it went down,
/// its configuration, resets; each before and after the input that changes it.
#[test]
fn the_session_reports_its_state_as_it_changes() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    assert_eq!(
        (s.incarnation(), s.current(), s.recv_next()),
        (None, None, 0)
    );
    assert_eq!(
        (s.window_bytes(), s.resets(), s.down_reason()),
        (0, 0, None)
    );
    assert!(!s.is_closing() && !s.delivering());
    assert_eq!(s.config().unacked_bytes, 1 << 20);
    assert_eq!(s.config().ack_every, 64);
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert_eq!((s.incarnation(), s.current()), (Some(2), Some(id)));
    // Three frames of one message each (a frame is freed whole).
    for k in 0..3 {
        hold(&mut s, k..k + 1);
    }
    let held = s.window_bytes();
    assert!(held > 3, "{held}");
    assert_eq!(s.window_messages(), 3);
    // Acknowledging two of three frees two, and their bytes.
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    assert_eq!(s.handle_ack(t0, id, 2).unwrap(), 2);
    assert!(s.window_bytes() > 0 && s.window_bytes() < held);
    assert_eq!(s.handle_ack(t0, id, 3).unwrap(), 1);
    assert_eq!(s.window_bytes(), 0);
    // A delivery in progress, then the next number expected.
    let d = s.begin_delivery(id, 0, 5).unwrap().unwrap();
    assert!(s.delivering());
    s.end_delivery(t0, d, 5, 50);
    assert!(!s.delivering());
    assert_eq!(s.recv_next(), 5);
    // The peer says goodbye: down, because it left; no current connection.
    s.handle_goodbye(t0, id);
    assert_eq!(s.down_reason(), Some(DownReason::Left));
    assert_eq!(s.current(), None);
    assert!(events(&mut s).iter().any(|e| matches!(
        e,
        SessionEvent::Down {
            reason: DownReason::Left
        }
    )));
    s.begin_close(t0 + MS);
    assert!(s.is_closing());
    // Resets are counted one by one.
    let mut r = Session::new(cfg(), t0);
    r.handle_reset(t0);
    r.handle_reset(t0);
    assert_eq!(r.resets(), 2);
}

/// A RESUME after a break says how many messages go again: all that were held and not
/// acknowledged; none on a first connection.
#[test]
fn a_resume_counts_the_messages_written_again() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (ia, ra) = s.handle_connect(t0, 2);
    let (ib, rb) = peer.handle_connect(t0, 1);
    assert_eq!(s.handle_resume(t0, ia, rb).unwrap().resent, 0);
    peer.handle_resume(t0, ib, ra).unwrap();
    // Two batches (messages are released a batch at a time).
    hold(&mut s, 0..2);
    hold(&mut s, 2..3);
    let u = s.unwritten(ia);
    s.mark_written(t0, ia, u.generation, *u.ends.last().unwrap());
    s.handle_disconnect(t0, ia);
    peer.handle_disconnect(t0, ib);
    let (ia, _) = s.handle_connect(t0, 2);
    let (_, rb) = peer.handle_connect(t0, 1);
    let r = s.handle_resume(t0, ia, rb).unwrap();
    assert_eq!(r.resent, 3, "the peer had none of them");
    assert_eq!(r.acked, 0);
    // Written again; the peer took the first batch, and its next RESUME (before any ACK)
    // acknowledges it: two counted as acknowledged, one written again.
    let u = s.unwritten(ia);
    s.mark_written(t0, ia, u.generation, *u.ends.last().unwrap());
    s.handle_disconnect(t0, ia);
    let (ia, _) = s.handle_connect(t0, 2);
    let r = s
        .handle_resume(
            t0,
            ia,
            Resume {
                next: 2,
                ..Resume::FRESH
            },
        )
        .unwrap();
    assert_eq!((r.acked, r.resent), (2, 1));
    assert_eq!(s.send.base(), 2);
    // Held while not connected and never written: not counted as written again.
    hold(&mut s, 3..5);
    s.handle_disconnect(t0, ia);
    let (ia, _) = s.handle_connect(t0, 2);
    let r = s
        .handle_resume(
            t0,
            ia,
            Resume {
                next: 3,
                ..Resume::FRESH
            },
        )
        .unwrap();
    assert_eq!((r.acked, r.resent), (1, 0));
}

/// Pieces have their own budget: bulk bytes never make the ordinary window full, and the
/// budget is a strict bound (exactly at it, no more room).
#[test]
fn pieces_count_against_their_budget_only_and_it_is_strict() {
    let t0 = Instant::now();
    let piece = |s: &mut Session, offset: usize, id: Option<u64>| {
        let p = Piece {
            serial: 1,
            to: Name::from_static("to"),
            from: Name::from_static("from"),
            payload: Bytes::from(vec![7u8; 10_000]),
            offset,
            len: 500,
            id,
        };
        s.hold_piece(&p).unwrap()
    };
    // One piece's charge, measured.
    let mut probe = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    connect(&mut probe, &mut peer, t0);
    piece(&mut probe, 0, None);
    let k = probe.bulk_bytes();
    assert!(k >= 500, "{k}");
    // A window smaller than the pieces held, a bulk budget of exactly two pieces.
    let mut c = cfg();
    c.unacked_bytes = 10;
    c.bulk_inflight = 2 * k;
    c.bulk_stream = 2 * k;
    let mut s = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    connect(&mut s, &mut peer, t0);
    let id = piece(&mut s, 0, None);
    assert!(s.bulk_room());
    piece(&mut s, 500, Some(id));
    assert_eq!(s.bulk_bytes(), 2 * k);
    assert!(!s.bulk_room(), "at the budget: no more");
    assert!(
        !s.window_full(),
        "{} bulk bytes held: the ordinary window is still empty",
        s.bulk_bytes()
    );
    hold(&mut s, 0..1);
    assert!(
        s.window_full(),
        "one ordinary message fills a window of 10 B"
    );
}

/// A delivery that delivered nothing (all duplicates) sets no acknowledgement timer, and an
/// unsequenced session never acknowledges, however much it delivers.
#[test]
fn nothing_delivered_or_nothing_sequenced_owes_no_acknowledgement() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let before = s.poll_timeout();
    let d = s.begin_delivery(id, 0, 5).unwrap().unwrap();
    assert!(!s.end_delivery(t0, d, 0, 0), "none delivered");
    assert_eq!(
        s.poll_timeout(),
        before,
        "no acknowledgement timer for nothing"
    );
    let mut c = cfg();
    c.reliable = false;
    let mut u = Session::new(c, t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut u, &mut peer, t0);
    let d = u.begin_delivery(id, 0, 100).unwrap().unwrap();
    assert!(
        !u.end_delivery(t0, d, 100, IDLE_ACK_BYTES),
        "unsequenced: no ack"
    );
    assert!(!u.handle_idle(id));
    assert_eq!(u.poll_control(t0, id), None);
}

/// A drained reader's early acknowledgement is for the current connection only, and only
/// once: not when one is already due, not on a replaced connection.
#[test]
fn the_idle_acknowledgement_is_for_the_current_connection_once() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (old, _) = connect(&mut s, &mut peer, t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let d = s.begin_delivery(id, 0, 10).unwrap().unwrap();
    s.end_delivery(t0, d, 10, IDLE_ACK_BYTES);
    assert!(!s.handle_idle(old), "a replaced connection owes nothing");
    assert!(s.handle_idle(id));
    assert!(!s.handle_idle(id), "already due");
}

/// Holding: refused with the reason once the peer is down; a batch's count is its
/// messages'. Shutdown: a node with nothing held is closed once nobody is connected, a
/// held message keeps it open, `abandon` fails what is held, and a passed deadline with
/// nothing held fails nothing.
#[test]
fn holding_refusals_counts_and_shutdown_edges() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    assert_eq!(s.holdable(), Ok(()));
    assert!(s.is_closed(), "never connected, nothing held");
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert!(!s.is_closed(), "connected");
    let mut batch = crate::outbox::numbered(0..5);
    assert_eq!(s.hold_batch(&mut batch), 5);
    // Silent past the timeout: down, and holding is refused with why.
    s.handle_timeout(t0 + 600 * MS);
    let why = s.down_reason().unwrap();
    assert_eq!(s.holdable(), Err(FailReason::Down(why)));
    let failed: u64 = events(&mut s)
        .iter()
        .map(|e| match e {
            SessionEvent::Failed { messages, .. } => messages.len() as u64,
            _ => 0,
        })
        .sum();
    assert_eq!(
        (failed, s.window_messages()),
        (5, 0),
        "down: the five failed"
    );
    assert!(s.is_closed(), "no connection, nothing held");
    // Held messages without a connection: not closed; abandon fails them.
    let mut t = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (tid, _) = connect(&mut t, &mut peer, t0);
    hold(&mut t, 0..2);
    t.handle_disconnect(t0, tid);
    assert!(!t.is_closed(), "two messages held");
    t.abandon();
    let failed: Vec<_> = events(&mut t)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::Failed { messages, reason } => Some((messages.len(), reason)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(2, FailReason::ShutDown)]);
    assert!(t.is_closed());
    // Closing with nothing held: the deadline passes and nothing is failed.
    let mut u = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    connect(&mut u, &mut peer, t0);
    u.begin_close(t0 + MS);
    assert_eq!(
        u.poll_timeout(),
        Some(t0 + 100 * MS),
        "no close deadline to wait for"
    );
    u.handle_timeout(t0 + 2 * MS);
    assert!(
        !events(&mut u)
            .iter()
            .any(|e| matches!(e, SessionEvent::Failed { .. })),
        "nothing held, nothing failed"
    );
    // With something held, the close deadline is the next timeout.
    hold(&mut u, 0..1);
    assert_eq!(u.poll_timeout(), Some(t0 + MS));
    let _ = id;
}

/// What a connection that is not current gets: nothing to write, but the current
/// generation (so a stale mark is recognised), no control frame.
#[test]
fn a_replaced_connection_gets_nothing_to_write_and_no_control() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (old, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..3);
    let (id, _) = connect(&mut s, &mut peer, t0);
    let cur = s.unwritten(id);
    assert_eq!(cur.messages, 3);
    let stale = s.unwritten(old);
    assert_eq!((stale.messages, stale.ends.len()), (0, 0));
    assert_eq!(stale.generation, cur.generation);
    assert!(cur.generation > 0, "a resume starts a new generation");
    // Control: due on the current connection only, and only when something is due.
    assert!(!s.control_due(id));
    let d = s.begin_delivery(id, 0, 64).unwrap().unwrap();
    s.end_delivery(t0, d, 64, 640);
    assert!(s.control_due(id));
    assert!(!s.control_due(old));
    assert_eq!(s.poll_control(t0, id), Some(Frame::Ack(64)));
    assert!(!s.control_due(id));
    s.handle_timeout(t0 + 100 * MS);
    assert!(s.control_due(id), "a heartbeat is control too");
}

/// The clock, exactly: the next timeout is the heartbeat while one is not yet due, then
/// the peer timeout; without a connection, the unreachability deadline; closing, no
/// failure detection. The live incarnation holds until peer_timeout after the last word,
/// not at it.
#[test]
fn the_next_timeout_and_the_live_incarnation_on_a_fake_clock() {
    let t0 = Instant::now();
    let ns = Duration::from_nanos(1);
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    assert_eq!(s.live_incarnation(t0), None);
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert_eq!(s.poll_timeout(), Some(t0 + 100 * MS), "heartbeat first");
    s.handle_timeout(t0 + 100 * MS);
    assert_eq!(
        s.poll_timeout(),
        Some(t0 + 600 * MS),
        "then the peer timeout"
    );
    assert_eq!(s.live_incarnation(t0), Some(2));
    assert_eq!(s.live_incarnation(t0 + 600 * MS - ns), Some(2));
    assert_eq!(s.live_incarnation(t0 + 600 * MS), None);
    // Heard later: both move.
    s.handle_heard(t0 + 200 * MS, id);
    assert_eq!(s.poll_timeout(), Some(t0 + 800 * MS));
    assert_eq!(s.live_incarnation(t0 + 700 * MS), Some(2));
    // Disconnected: down after peer_timeout without a connection.
    s.handle_disconnect(t0 + 300 * MS, id);
    assert_eq!(s.poll_timeout(), Some(t0 + 900 * MS));
    assert_eq!(s.live_incarnation(t0 + 300 * MS), None);
    // Closing: nobody is declared down any more, nothing else is due.
    s.begin_close(t0 + 10 * 600 * MS);
    assert_eq!(s.poll_timeout(), None);
    // A paused reader's silence is not counted either.
    let mut p = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    connect(&mut p, &mut peer, t0);
    p.handle_timeout(t0 + 100 * MS);
    p.set_paused(t0 + 100 * MS, true);
    assert_eq!(p.poll_timeout(), None, "heartbeat due, paused: no deadline");
}

/// Why a peer went down and why messages failed read as sentences that name the cause
/// (they go into logs and `Error` messages as they are).
#[test]
fn reasons_say_what_happened() {
    let after = Duration::from_secs(3);
    let cases: Vec<(String, &str)> = vec![
        (
            DownReason::Silent { after }.to_string(),
            "silent for more than 3s",
        ),
        (
            DownReason::Unreachable { after }.to_string(),
            "unreachable for more than 3s",
        ),
        (DownReason::Left.to_string(), "the peer shut down"),
        (DownReason::Membership.to_string(), "cluster membership"),
        (
            FailReason::Down(DownReason::Left).to_string(),
            "declared down (the peer shut down)",
        ),
        (FailReason::Restarted.to_string(), "restarted"),
        (FailReason::ShutDown.to_string(), "this node shut down"),
        (FailReason::ConnectionLost.to_string(), "unsequenced"),
        (FailReason::Reset.to_string(), "reset"),
    ];
    for (text, says) in cases {
        assert!(text.contains(says), "{text:?} should say {says:?}");
    }
}

/// Nothing held, nothing to write; something held, something to write.
#[test]
fn unwritten_is_empty_exactly_when_nothing_is_to_be_written() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    assert!(s.unwritten(id).is_empty());
    hold(&mut s, 0..2);
    let u = s.unwritten(id);
    assert!(!u.is_empty());
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    assert!(s.unwritten(id).is_empty());
}
