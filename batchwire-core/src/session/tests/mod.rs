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

/// A new incarnation's connection is authenticated while the old incarnation's is still
/// current (its end not noticed yet): the old one is dropped at once. Kept current, it
/// took messages numbered anew, and an old ACK read on it released them undelivered.
#[test]
fn a_new_incarnation_drops_the_old_ones_connection() {
    let t0 = Instant::now();
    let mut s = Session::new(cfg(), t0);
    let mut peer = Session::new(cfg(), t0);
    let (id1, _) = connect(&mut s, &mut peer, t0);
    hold(&mut s, 0..2);
    let _ = events(&mut s);
    let (_id2, _) = s.handle_connect(t0 + MS, 99);
    assert_eq!(s.current(), None);
    assert!(events(&mut s).contains(&SessionEvent::Close { conn: id1 }));
    hold(&mut s, 0..3);
    assert_eq!(
        s.unwritten(id1).messages,
        0,
        "nothing new goes on the old connection"
    );
    // An old acknowledgement read on it releases nothing of the new numbering.
    let _ = s.handle_ack(t0 + MS, id1, 3);
    assert_eq!(s.window_messages(), 3);
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
    // Nothing follows the goodbye: a heartbeat or acknowledgement due later is not
    // written (the writer shut the connection's write side after it).
    s.handle_timeout(t0 + 500 * MS);
    assert_eq!(
        s.poll_control(t0 + 500 * MS, id),
        None,
        "control after goodbye"
    );
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

mod liveness;
mod mutants;
mod simulation;
