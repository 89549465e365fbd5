//! Rules found by cargo-mutants that the other tests did not pin.

use super::*;

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

/// A credit recount counts the window only for a SYNC on the current connection whose
/// `next` the window still holds from: after an ACK (or a RESUME) beyond `next` took
/// messages out, counting from `next` would leave them out of the charge (a SYNC its
/// receiver took for the previous connection and wrote on this one did that).
#[test]
fn a_recount_counts_only_for_the_current_connection_and_from_what_the_window_holds() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id, _) = connect(&mut s, &mut peer, t0);
    for k in 0..3 {
        hold(&mut s, k..k + 1);
    }
    let count = |s: &Session, on, from| {
        let mut n = 0;
        s.charges_from(on, from, |_, b| n += b).then_some(n)
    };
    let all = count(&s, id, 0).unwrap();
    assert!(all > 0);
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    assert_eq!(s.handle_ack(t0, id, 1).unwrap(), 1);
    assert_eq!(
        count(&s, id, 0),
        None,
        "the window no longer holds message 0"
    );
    let rest = count(&s, id, 1).unwrap();
    assert!(rest > 0 && rest < all, "{rest} of {all}");
    assert_eq!(count(&s, id, 3), Some(0));
    let (id2, _) = connect(&mut s, &mut peer, t0);
    assert_eq!(count(&s, id, 1), None, "a replaced connection");
    assert_eq!(count(&s, id2, 1), Some(rest));
}

/// Unsequenced, the window keeps nothing once written, so a recount is never stale for
/// that reason (a SYNC ignored there left the sender on the initial window for good).
#[test]
fn an_unsequenced_recount_is_not_stale_for_what_was_written() {
    let t0 = Instant::now();
    let c = SessionConfig {
        reliable: false,
        ..cfg()
    };
    let (mut s, mut peer) = (Session::new(c.clone(), t0), Session::new(c, t0));
    let (id, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..3);
    let u = s.unwritten(id);
    s.mark_written(t0, id, u.generation, *u.ends.last().unwrap());
    assert!(s.charges_from(id, 0, |_, _| {}));
}
