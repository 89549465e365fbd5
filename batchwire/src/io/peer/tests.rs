use super::*;
use batchwire_core::frame;
use batchwire_core::session::SessionConfig;
use bytes::BytesMut;

#[test]
fn undeliverable_notices_are_summed_and_bounded() {
    let p = testing::peer(SessionConfig::default());
    let from = Name::from_static("x");
    for i in 0..1000 {
        let to = Name::new(&format!("nobody-{i}")).unwrap();
        p.report_undeliverable(&to, &from, 2);
        p.report_undeliverable(&to, &from, 1);
    }
    let mut total = 0u64;
    let mut frames = 0;
    let mut out = Vec::new();
    while p.has_notices() {
        out.clear();
        p.take_notices(&mut out);
        let mut buf = BytesMut::from(&out[..]);
        while let Ok(Some(Frame::Undeliverable(u))) = frame::decode(&mut buf, 1 << 16) {
            total += u.count as u64;
            frames += 1;
        }
    }
    assert_eq!(total, 3000, "every message counted");
    assert_eq!(frames, NOTICE_PAIRS + 1, "64 pairs and one summary");
}

/// Push message `n` to mailbox "to" of `p`'s lane as a sender that may write through.
fn push(p: &Peer, n: u8) -> Result<crate::io::lane::Pushed, crate::io::lane::PushError> {
    let payload = bytes::Bytes::from(vec![n; 10]);
    p.lane.push_direct(
        crate::io::lane::Outgoing {
            dest: 0,
            to: &Name::from_static("to"),
            from: &Name::from_static("f"),
            payload: &payload,
            bulk: false,
        },
        false,
        || true,
    )
}

/// A forgotten member's peer is removed only when nothing of it can still reach the
/// window: not while a sender's write-through batch or the writer's batch is on its way
/// there (taken out of the lane, not yet held), which would then sit in the window of a
/// removed peer, never written nor failed. Once removed, nothing is held any more.
#[test]
fn a_peer_is_removed_only_with_nothing_on_its_way_into_the_window() {
    use crate::io::lane::Pushed;
    let p = testing::peer(SessionConfig::default());
    let window = |p: &Peer| p.session(|s, _| s.window_messages());

    // A sender took the lane's only message to write it through itself.
    assert_eq!(push(&p, 1).unwrap(), Pushed::Direct);
    assert_eq!(p.lane.queued(), 0);
    assert!(
        !p.remove_if_idle(),
        "removed with a write-through on its way"
    );
    assert!(!p.is_removed());
    crate::io::write::write_through(&p, &crate::io::shutdown::Shutdown::default());
    assert_eq!(window(&p), 1, "held, to be written on the next connection");
    assert!(!p.remove_if_idle(), "removed with a message in the window");

    // The writer took a batch and has not held it yet.
    let q = testing::peer(SessionConfig::default());
    q.lane.set_writer_absent(false);
    assert_eq!(push(&q, 2).unwrap(), Pushed::Queued);
    let mut b = batchwire_core::bundler::BundlerConfig::default().build();
    let mut batch = batchwire_core::outbox::Batch::default();
    let next = q
        .lane
        .next_batch(b.as_mut(), q.lane.epoch(), &mut batch, true, None);
    assert!(matches!(next, crate::io::lane::Next::Batch(_)));
    assert_eq!(q.lane.queued(), 0);
    assert!(
        !q.remove_if_idle(),
        "removed with the writer's batch on its way"
    );
    assert!(push(&q, 3).is_ok(), "left open");
    q.lane.end_move();

    // Nothing anywhere: removed (and the buffers its session kept for reuse let go); the
    // lane refuses sends and nothing is held any more.
    let r = testing::peer(SessionConfig::default());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let conn = testing::connect(&r, crate::io::link::Link::Plain(c));
    r.session(|s, now| {
        s.hold(&[(&[0u8; 1000][..], 1)]);
        s.unwritten(conn.id);
        s.handle_ack(now, conn.id, 1).unwrap();
    });
    assert!(
        r.session(|s, _| s.spare_buffer_bytes()) > 0,
        "a buffer kept"
    );
    conn.close();
    assert!(r.remove_if_idle());
    assert_eq!(r.session(|s, _| s.spare_buffer_bytes()), 0);
    assert!(r.is_removed());
    assert!(push(&r, 4).is_err(), "a removed peer's lane refuses sends");
    assert!(r.session(|s, _| r.holdable(s)).is_err());
}

/// After the goodbye nothing more is written on the connection, whoever finds something
/// due (the ticker, a leader, the resting thread): not a notice, credit or heartbeat.
#[test]
fn nothing_is_written_after_the_goodbye() {
    use std::io::Read;
    let p = testing::peer(SessionConfig::default());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut other, _) = l.accept().unwrap();
    let conn = testing::connect(&p, crate::io::link::Link::Plain(c));
    let said = p.session(|s, now| {
        s.begin_close(now);
        s.poll_close(now, conn.id, false).is_some()
    });
    assert!(said, "the goodbye was given");
    p.report_undeliverable(&Name::from_static("x"), &Name::from_static("y"), 1);
    // A thread that checked for the goodbye just before it was given, then writes what is
    // due without waiting (as a sender writing through does).
    crate::io::write::write_through(&p, &crate::io::shutdown::Shutdown::default());
    other
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 256];
    match other.read(&mut buf) {
        Ok(n) => panic!("{n} bytes written after the goodbye"),
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        ),
    }
}
