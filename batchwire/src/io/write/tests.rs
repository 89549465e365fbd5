use super::*;
use crate::io::link::Link;
use crate::io::peer::testing;
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame};
use batchwire_core::outbox::Outbox;
use batchwire_core::session::SessionConfig;
use bytes::BytesMut;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// A peer whose session is connected over a real loopback socket; returns the peer
/// and the other end of the socket.
fn connected_peer(cfg: SessionConfig) -> (Arc<Peer>, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (theirs, _) = l.accept().unwrap();
    ours.set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let peer = testing::peer(cfg);
    testing::connect(&peer, Link::Plain(ours));
    (peer, theirs)
}

/// Frames read from `s` until `want` says stop or 10 s pass.
fn read_until(s: &mut TcpStream, mut want: impl FnMut(&Frame) -> bool) -> Vec<Frame> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let (mut buf, mut got) = (BytesMut::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        while let Some(f) = frame::decode(&mut buf, 1 << 20).unwrap() {
            let stop = want(&f);
            got.push(f);
            if stop {
                return got;
            }
        }
        let mut chunk = [0u8; 4096];
        if let Ok(n) = s.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    panic!("not found in {got:?}")
}

/// The peer's writer thread, with the default bundler.
fn spawn_writer(peer: &Arc<Peer>, shutdown: &Shutdown) -> std::thread::JoinHandle<()> {
    let (p, sd) = (peer.clone(), shutdown.clone());
    let cfg = WriterCfg {
        bundler: Some(BundlerConfig::default()),
        shared_done: None,
        idle_close: None,
        linger: Duration::from_secs(2),
    };
    std::thread::spawn(move || run_writer(p, cfg, sd))
}

/// A batch of `n` messages of 1 KiB numbered from `first` (the number in the payload).
fn numbered_batch(first: u64, n: u64) -> Batch {
    let mut ob = Outbox::new(1 << 16);
    for i in first..first + n {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(1024, 0);
        ob.push_message(0, &Name::from_static("m"), &Name::from_static(""), &p, None);
    }
    let mut b = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut b, None);
    b
}

#[test]
fn the_rest_of_a_partial_write_is_exactly_the_bytes_after_it() {
    let chunks = [Bytes::from_static(b"defg"), Bytes::from_static(b"hi")];
    for n in 0..=9 {
        let rest: Vec<u8> = rest_after(b"abc", &chunks, n).concat();
        assert_eq!(rest, &b"abcdefghi"[n..], "after {n} bytes");
    }
    // The chunks are sliced, not copied.
    let rest = rest_after(b"abc", &chunks, 4);
    assert_eq!(rest[0].as_ptr(), chunks[0][1..].as_ptr());
}

#[test]
fn what_a_write_through_leaves_over_goes_first_and_nothing_is_lost_or_doubled() {
    let cfg = SessionConfig {
        unacked_bytes: 1 << 30,
        ..SessionConfig::default()
    };
    let (peer, mut theirs) = connected_peer(cfg);
    let c = peer.current().unwrap();
    let shutdown = Shutdown::default();
    // The other end does not read: write through until the socket takes only part.
    let mut sent = 0u64;
    while !c.has_carry() && sent < 1_000_000 {
        let mut b = numbered_batch(sent, 64);
        hold(&peer, &mut b, FlushReason::Drained);
        sent += 64;
        let _turn = peer.try_write_turn().unwrap();
        assert!(write_pending(
            &peer,
            &c,
            Some(&shutdown),
            &mut Vec::new(),
            Mode::NoWait
        ));
    }
    assert!(c.has_carry(), "the socket never filled");
    assert!(peer.stats.writes_through.load(Relaxed) > 0);
    // With a carry waiting, a sender does not write (it would jump the queue)...
    let mut b = numbered_batch(sent, 64);
    hold(&peer, &mut b, FlushReason::Drained);
    sent += 64;
    assert!(!write_pending(
        &peer,
        &c,
        Some(&shutdown),
        &mut Vec::new(),
        Mode::NoWait
    ));
    // ...the writer does: the carry first, then the rest, all of it exactly once.
    let writer = spawn_writer(&peer, &shutdown);
    let mut got = Vec::new();
    read_until(&mut theirs, |f| {
        if let Frame::Messages(l) = f {
            for m in l.iter() {
                got.push(u64::from_le_bytes(m.payload[..8].try_into().unwrap()));
            }
        }
        got.len() as u64 >= sent
    });
    assert_eq!(got, (0..sent).collect::<Vec<_>>());
    shutdown.drain(Instant::now());
    peer.lane.close();
    writer.join().unwrap();
}

#[test]
fn a_due_ack_goes_out_although_the_window_is_full_and_goodbye_comes_last() {
    let cfg = SessionConfig {
        unacked_bytes: 100,
        ack_every: 10,
        ..SessionConfig::default()
    };
    let (peer, mut theirs) = connected_peer(cfg);
    // Fill the window: 20 messages, never acknowledged.
    let mut ob = Outbox::new(1 << 12);
    for i in 0..20u64 {
        ob.push_message(
            0,
            &Name::from_static("m"),
            &Name::from_static(""),
            &i.to_le_bytes(),
            None,
        );
    }
    let mut b = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut b, None);
    hold(&peer, &mut b, FlushReason::Drained);
    assert!(peer.window_full());
    let shutdown = Shutdown::default();
    let writer = spawn_writer(&peer, &shutdown);
    read_until(&mut theirs, |f| matches!(f, Frame::Messages(_)));
    // Ten messages arrive from the peer: an acknowledgement is due, window or not.
    let id = peer.current().unwrap().id;
    peer.session(|s, now| {
        let d = s.begin_delivery(id, 0, 10).unwrap().unwrap();
        s.end_delivery(now, d, 10, 200)
    });
    read_until(&mut theirs, |f| *f == Frame::Ack(10));
    assert!(peer.window_full(), "control did not wait for the window");
    // Shutting down with the window still unacknowledged: failed at the deadline, then
    // the goodbye, and the writer ends.
    shutdown.drain(Instant::now() + Duration::from_millis(200));
    peer.lane.close();
    let end = read_until(&mut theirs, |f| *f == Frame::Goodbye);
    assert!(
        matches!(end[end.len() - 2], Frame::Ack(_)),
        "a final ack before goodbye: {end:?}"
    );
    writer.join().unwrap();
    assert_eq!(peer.stats.send_failed.load(Relaxed), 20);
}

/// A writer still holding a replaced connection leaves the SYNC (and grants) for the
/// current one: taken for the replaced one, the SYNC its successor must begin with was
/// lost with it, and the peer's credit for this node was never recounted.
#[test]
fn a_sync_is_written_only_on_the_current_connection() {
    let (peer, _theirs1) = connected_peer(SessionConfig::default());
    let old = peer.current().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut theirs2, _) = l.accept().unwrap();
    let new = testing::connect(&peer, Link::Plain(ours));
    assert_ne!(old.id, new.id);
    peer.flow.snapshot(new.id, 0);
    peer.flow.wake_writer();
    let _turn = peer.try_write_turn().unwrap();
    write_pending(&peer, &old, None, &mut Vec::new(), Mode::Wait);
    write_pending(&peer, &new, None, &mut Vec::new(), Mode::Wait);
    let got = read_until(&mut theirs2, |f| matches!(f, Frame::Sync(_)));
    assert!(matches!(got[0], Frame::Sync(_)), "{got:?}");
}

/// A SYNC its reader took for a connection that was replaced before the writer wrote it is
/// not written on the successor: it says where credit stood before what was delivered on
/// the old connection since, which the peer's window no longer holds after the
/// successor's RESUME (its recount would leave that out). Grants still go; the
/// successor's own SYNC follows.
#[test]
fn a_sync_taken_for_a_replaced_connection_is_not_written_on_its_successor() {
    let (peer, _theirs1) = connected_peer(SessionConfig::default());
    let old = peer.current().unwrap();
    peer.flow.snapshot(old.id, 0);
    peer.flow.wake_writer();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut theirs2, _) = l.accept().unwrap();
    let new = testing::connect(&peer, Link::Plain(ours));
    let _turn = peer.try_write_turn().unwrap();
    write_pending(&peer, &new, None, &mut Vec::new(), Mode::Wait);
    peer.flow.snapshot(new.id, 7);
    peer.flow.wake_writer();
    write_pending(&peer, &new, None, &mut Vec::new(), Mode::Wait);
    let got = read_until(&mut theirs2, |f| matches!(f, Frame::Sync(_)));
    assert!(
        matches!(&got[..], [Frame::Sync(s)] if s.next == 7),
        "only the successor's own SYNC: {got:?}"
    );
}

/// A snapshot belongs to the connection current when it was taken, whichever reader asked
/// for it: the replaced connection's reader taking one after the successor's RESUME (its
/// start raced the successor's) must not leave the successor without a SYNC.
#[test]
fn a_snapshot_taken_after_a_replacement_goes_on_the_successor() {
    let (peer, _theirs1) = connected_peer(SessionConfig::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut theirs2, _) = l.accept().unwrap();
    let new = testing::connect(&peer, Link::Plain(ours));
    peer.snapshot_credit();
    let _turn = peer.try_write_turn().unwrap();
    write_pending(&peer, &new, None, &mut Vec::new(), Mode::Wait);
    let got = read_until(&mut theirs2, |f| matches!(f, Frame::Sync(_)));
    assert!(matches!(got[0], Frame::Sync(_)), "{got:?}");
}

/// Writers started the way the node starts them (the peer's hooks), kept to be looked at.
fn writers_on_demand(peer: &Arc<Peer>, shutdown: &Shutdown) -> Arc<Mutex<Vec<JoinHandle<()>>>> {
    let started: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
    let (s, sd) = (started.clone(), shutdown.clone());
    let hooks = crate::io::peer::Hooks {
        spawn_writer: Box::new(move |p| {
            let cfg = WriterCfg {
                bundler: Some(BundlerConfig::default()),
                shared_done: None,
                idle_close: None,
                linger: Duration::from_millis(200),
            };
            let sd = sd.clone();
            s.lock()
                .unwrap()
                .push(std::thread::spawn(move || run_writer(p, cfg, sd)));
            Ok(())
        }),
        dial: None,
    };
    testing::set_hooks(peer, hooks);
    started
}

/// Resting (`run_writer`): a writer with nothing to write ends after its linger while its
/// connection stays up; the ticker writes the heartbeat itself without starting one; a
/// poke with something to write starts one again (one with nothing, none), and what is
/// queued goes out.
#[test]
fn a_quiet_writer_rests_the_ticker_writes_heartbeats_and_a_poke_brings_it_back() {
    let cfg = SessionConfig {
        heartbeat_interval: Duration::from_millis(50),
        peer_timeout: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let (peer, mut theirs) = connected_peer(cfg);
    let shutdown = Shutdown::default();
    let started = writers_on_demand(&peer, &shutdown);
    peer.ensure_writer();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !started.lock().unwrap()[0].is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(started.lock().unwrap()[0].is_finished(), "the writer rests");
    assert!(peer.is_connected(), "the connection stays");

    // A heartbeat falls due: the ticker writes it, and no writer starts for it.
    std::thread::sleep(Duration::from_millis(60));
    crate::io::tick::tick(&peer);
    let got = read_until(&mut theirs, |f| matches!(f, Frame::Ack(_)));
    assert!(matches!(got[..], [Frame::Ack(_)]), "{got:?}");
    assert_eq!(
        started.lock().unwrap().len(),
        1,
        "no writer for a heartbeat"
    );

    // A poke with nothing to write (room in the window, say) starts none; one with
    // something queued starts one, and it writes it.
    peer.lane.poke();
    assert_eq!(
        started.lock().unwrap().len(),
        1,
        "nothing to write, no writer"
    );
    let payload = Bytes::from(7u64.to_le_bytes().to_vec());
    peer.lane
        .push(
            crate::io::lane::Outgoing {
                dest: 0,
                to: &Name::from_static("inbox"),
                from: &Name::from_static("f"),
                payload: &payload,
                bulk: false,
            },
            true,
        )
        .unwrap();
    peer.lane.poke();
    assert_eq!(started.lock().unwrap().len(), 2, "a poke starts a writer");
    let got = read_until(&mut theirs, |f| matches!(f, Frame::Messages(_)));
    assert!(matches!(got.last(), Some(Frame::Messages(_))), "{got:?}");
    shutdown.drain(Instant::now());
    peer.lane.close();
    for h in std::mem::take(&mut *started.lock().unwrap()) {
        h.join().unwrap();
    }
}
