//! Liveness: silence, pauses, parking, the cluster's verdict.

use super::*;

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

/// A peer that must be reached (a member, not a configured peer) and never is: nothing
/// happens while nothing is held for it; once something is, it is handed back `within`
/// later (not declared down: what is sent next is held again, with a clock of its own,
/// and delivered once a connection comes); a connection in time stops the clock, one
/// refused before RESUME does not.
#[test]
fn what_is_held_for_a_member_never_reached_is_handed_back_in_time() {
    let t0 = Instant::now();
    let within = 900 * MS;
    let mut s = Session::new(cfg(), t0);
    s.require_reach(Some(within));
    s.handle_timeout(t0 + 10 * 600 * MS);
    assert_eq!(s.poll_timeout(), None, "nothing held: no clock");
    let held = t0 + 10 * 600 * MS;
    hold(&mut s, 0..3);
    // Due at once (the clock starts), then at its end.
    assert!(s.poll_timeout().is_some_and(|t| t <= held));
    s.handle_timeout(held);
    assert_eq!(s.poll_timeout(), Some(held + within));
    // A connection that authenticated the peer and was then refused (before RESUME) does
    // not stop the clock.
    let (id, _) = s.handle_connect(held + 300 * MS, 2);
    s.handle_disconnect(held + 301 * MS, id);
    s.handle_timeout(held + within - MS);
    assert!(events(&mut s).is_empty());
    s.handle_timeout(held + within);
    let ev = events(&mut s);
    assert!(
        matches!(
            &ev[..],
            [SessionEvent::Failed { messages, reason: FailReason::Unreached { .. } }] if messages.len() == 3
        ),
        "{ev:?}"
    );
    assert_eq!(s.state(), PeerState::Connecting, "not declared down");
    assert_eq!(s.poll_timeout(), None, "nothing held now");
    // Held again, and a connection comes in time: resumed past what was handed back, the
    // new message goes out as the first the peer gets.
    hold(&mut s, 3..4);
    s.handle_timeout(held + 2 * within);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, held + 2 * within + MS);
    assert_eq!(s.state(), PeerState::Up);
    assert_eq!(s.window_messages(), 1);
    let u = s.unwritten(id);
    assert_eq!(
        u.chunks().len(),
        1,
        "the message held after the verdict goes out"
    );
    // Not required (a configured peer): held for good.
    let mut s = Session::new(cfg(), t0);
    hold(&mut s, 0..1);
    s.handle_timeout(t0);
    s.handle_timeout(t0 + 10 * 600 * MS);
    assert_eq!((s.state(), s.window_messages()), (PeerState::Connecting, 1));
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
