//! Leading: callers and receivers that read the connection themselves, the reader thread
//! standing aside for them, and the control they make due.

use super::*;

#[test]
fn a_caller_that_leads_reads_for_everyone_until_its_answer_then_the_reader_goes_on() {
    let mut rig = Rig::new();
    let ahead = Duration::from_secs(10);
    // Messages 0 and 1 come while a caller leads, waiting for two in the inbox.
    let mut theirs = rig.theirs.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for seq in 0..2u64 {
            std::thread::sleep(Duration::from_millis(30));
            theirs.write_all(&inbox_frame(seq)).unwrap();
        }
    });
    let t0 = Instant::now();
    let mb = rig.mb.clone();
    assert!(rig.reader().lead(&|| mb.len() >= 2, t0 + ahead, None));
    assert_eq!(rig.mb.len(), 2);
    assert!(t0.elapsed() < ahead / 2, "it left when its answer was in");
    assert!(rig.peer.stats.reads_led.load(Relaxed) >= 1);
    sender.join().unwrap();
    // The turn is back with the reader thread: it reads what comes next.
    let by_caller = rig.peer.stats.reads_led.load(Relaxed);
    rig.send(2);
    rig.wait_len(3);
    assert_eq!(rig.peer.stats.reads_led.load(Relaxed), by_caller);
    // A caller whose answer is in already does not wait; one that finds no answer
    // leaves at its deadline.
    assert!(rig.reader().lead(&|| true, Instant::now() + ahead, None));
    assert_eq!(rig.peer.stats.reads_led.load(Relaxed), by_caller);
    let t1 = Instant::now();
    assert!(
        rig.reader()
            .lead(&|| false, t1 + Duration::from_millis(30), None)
    );
    assert!(t1.elapsed() >= Duration::from_millis(30));
    assert!(t1.elapsed() < ahead / 2);
    // Once no one has tried to lead for QUIET_READS reads (a stream), the reader
    // thread waits in recv(2) with the turn: a caller finds it taken. Its try makes
    // the reader thread leave the turn free again from its next read on.
    let mut next = 3u64;
    for _ in 0..=QUIET_READS {
        rig.send(next);
        next += 1;
        rig.wait_len(next as usize);
    }
    assert!(!rig.reader().lead(&|| true, Instant::now() + ahead, None));
    rig.send(next);
    next += 1;
    rig.wait_len(next as usize);
    rig.wait_free();
    assert!(rig.reader().lead(&|| true, Instant::now() + ahead, None));
    let mut got = Vec::new();
    rig.mb.take(&mut got, 1000, None).unwrap();
    let seqs: Vec<u64> = got
        .iter()
        .map(|e| u64::from_le_bytes(e.payload[..8].try_into().unwrap()))
        .collect();
    assert_eq!(seqs, (0..next).collect::<Vec<_>>(), "each once, in order");
    rig.conn.close();
    assert!(rig.join().is_err());
}

#[test]
fn a_bad_frame_or_a_goodbye_read_by_a_leading_caller_ends_the_connection_through_its_reader() {
    // A frame that claims 1 GiB: the caller stops leading at once, and the reader
    // thread reports the violation as its own.
    let mut rig = Rig::new();
    let mut theirs = rig.theirs.try_clone().unwrap();
    let bad = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        theirs.write_all(&[0xff; 64]).unwrap();
    });
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(10);
    rig.reader().lead(&|| false, until, None);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "not held until the deadline"
    );
    bad.join().unwrap();
    let end = rig.join();
    assert!(
        end.as_ref().is_err_and(|e| e.is_violation()),
        "the reader reports it: {end:?}"
    );
    // Nobody leads a connection whose reader stopped.
    assert!(
        !rig.reader()
            .lead(&|| false, Instant::now() + Duration::from_secs(1), None)
    );

    // GOODBYE, read by a caller: the reader thread ends cleanly.
    let mut rig = Rig::new();
    rig.send(0);
    let mut theirs = rig.theirs.try_clone().unwrap();
    let bye = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        let mut out = Vec::new();
        Frame::Goodbye.encode(&mut out);
        theirs.write_all(&out).unwrap();
    });
    let t0 = Instant::now();
    rig.reader()
        .lead(&|| false, t0 + Duration::from_secs(10), None);
    assert!(t0.elapsed() < Duration::from_secs(5));
    bye.join().unwrap();
    assert!(rig.join().is_ok(), "a goodbye");
    assert_eq!(rig.mb.len(), 1);
}

use crate::sys::thread_cpu_time as thread_cpu;

#[cfg(target_os = "linux")]
#[test]
fn a_receiver_leading_whose_eventfd_was_signalled_for_nothing_sleeps_not_spins() {
    // A push that another receiver took, or a late request for the turn: the eventfd
    // is readable but there is nothing for this one. It must empty it and sleep.
    let rig = Rig::new();
    let wake = Arc::new(crate::sys::eventfd().unwrap());
    crate::io::mailbox::signal(&wake);
    let (t0, cpu0) = (Instant::now(), thread_cpu());
    assert!(
        rig.reader()
            .lead(&|| false, t0 + Duration::from_millis(300), Some(&wake))
    );
    let (wall, cpu) = (t0.elapsed(), thread_cpu() - cpu0);
    assert!(wall >= Duration::from_millis(300), "{wall:?}");
    assert!(
        cpu < Duration::from_millis(100),
        "spun: {cpu:?} of CPU in {wall:?}"
    );
}

#[test]
fn the_reader_stands_aside_after_a_lead_while_leaders_keep_up() {
    let mut rig = Rig::new();
    // A thread led and its last read took all there was: the reader thread leaves the
    // connection to it for a pause before it reads again itself.
    rig.conn.led_drained.store(true, Relaxed);
    rig.conn.lead_tries.fetch_add(1, Relaxed);
    let t0 = Instant::now();
    rig.send(0);
    let mut got = Vec::new();
    rig.mb
        .take_within(&mut got, 1, Duration::from_secs(10))
        .unwrap();
    assert!(t0.elapsed() >= ASIDE, "read after {:?}", t0.elapsed());
    rig.conn.close();
    let _ = rig.join();
}

/// While `bump` runs on another thread without a pause (for at most 2 s), a message sent
/// to the rig: how long until it is in the mailbox.
fn read_while(rig: &mut Rig, bump: &(dyn Fn(&Conn) + std::marker::Sync)) -> Duration {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let conn = rig.conn.clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            // A pause of a millisecond between bumps would let a reader that stood
            // aside read after all.
            let t0 = Instant::now();
            while !stop.load(Relaxed) && t0.elapsed() < Duration::from_secs(2) {
                bump(&conn);
                std::thread::yield_now();
            }
        });
        std::thread::sleep(Duration::from_millis(5));
        rig.theirs.write_all(&inbox_frame(0)).unwrap();
        let t0 = Instant::now();
        let mut got = Vec::new();
        let r = rig.mb.take_within(&mut got, 1, Duration::from_secs(10));
        stop.store(true, Relaxed);
        r.unwrap();
        t0.elapsed()
    })
}

#[test]
fn the_reader_reads_beside_a_leader_that_is_behind() {
    let mut rig = Rig::new();
    // Threads lead all the time, but the last read a leader made filled all it asked
    // for (the receiver is behind): the reader thread does not stand aside.
    rig.conn.led_drained.store(false, Relaxed);
    let waited = read_while(&mut rig, &|c| {
        c.lead_tries.fetch_add(1, Relaxed);
    });
    assert!(
        waited < Duration::from_millis(1500),
        "read after {waited:?}"
    );
    rig.conn.close();
    let _ = rig.join();
}

/// Tries to lead go on without a pause (for at most 3 s) while `before` runs and the
/// reader thread is joined: it must end, and soon (it alone tears a connection down).
fn ends_while_tries_go_on(mut rig: Rig, before: impl FnOnce(&Rig)) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let conn = rig.conn.clone();
    let (r, took) = std::thread::scope(|s| {
        s.spawn(|| {
            let t0 = Instant::now();
            while !stop.load(Relaxed) && t0.elapsed() < Duration::from_secs(3) {
                conn.lead_tries.fetch_add(1, Relaxed);
                std::thread::yield_now();
            }
        });
        before(&rig);
        let t0 = Instant::now();
        let r = rig.join();
        stop.store(true, Relaxed);
        (r, t0.elapsed())
    });
    assert!(r.is_err(), "it ended: {r:?}");
    assert!(took < Duration::from_millis(1500), "after {took:?}");
}

#[test]
fn a_connection_a_leader_found_over_is_torn_down_while_threads_keep_trying_to_lead() {
    let rig = Rig::new();
    // A receiver leads and keeps up; then the peer closes the connection: the leader
    // reads the end and leaves it to the reader thread. Receivers go on trying to lead
    // meanwhile (each try fails at once on a connection that is over): the reader
    // thread must not stand aside for them.
    rig.conn.led_drained.store(true, Relaxed);
    let theirs = rig.theirs.try_clone().unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        theirs.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let until = Instant::now() + Duration::from_secs(10);
    assert!(
        rig.reader().lead(&|| false, until, None),
        "it led until the end"
    );
    closer.join().unwrap();
    ends_while_tries_go_on(rig, |_| {});
}

#[test]
fn the_reader_does_not_stand_aside_for_a_closed_connection() {
    let rig = Rig::new();
    // Tries keep coming after a leader that kept up, but the connection is closed.
    rig.conn.led_drained.store(true, Relaxed);
    ends_while_tries_go_on(rig, |rig| {
        std::thread::sleep(Duration::from_millis(5));
        rig.conn.close();
    });
}

/// 40 messages of 1 KB (past IDLE_ACK_BYTES: once it has read them all, the socket
/// drained, the leader makes an acknowledgement due), read by the test thread leading;
/// then the first ACK the other end gets within `within`, if any.
fn lead_and_see_ack(rig: &Rig, within: Duration) -> Option<u64> {
    let mut theirs = rig.theirs.try_clone().unwrap();
    let mut out = Vec::new();
    for seq in 0..40u64 {
        let mut list = MessageList::from_messages(&[Message {
            to: Name::from_static("inbox"),
            from: Name::from_static("x"),
            payload: Bytes::from(vec![seq as u8; 1024]),
        }]);
        list.first_seq = seq;
        Frame::Messages(list).encode(&mut out);
    }
    // Written while the test thread leads (holding the read turn), so it reads them.
    let mut w = theirs.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        w.write_all(&out).unwrap();
    });
    let mb = rig.mb.clone();
    let until = Instant::now() + Duration::from_secs(10);
    assert!(rig.reader().lead(&|| mb.len() >= 40, until, None));
    sender.join().unwrap();
    assert_eq!(rig.mb.len(), 40);
    assert!(rig.peer.stats.reads_led.load(Relaxed) >= 1);
    // The first ACK (the 40 may have come in more than one read, each acknowledged).
    theirs.set_read_timeout(Some(within)).unwrap();
    let mut got = BytesMut::new();
    loop {
        if let Some(f) = frame::decode(&mut got, 1 << 20).unwrap() {
            match f {
                Frame::Ack(next) => return Some(next),
                _ => continue,
            }
        }
        let mut buf = [0u8; 4096];
        match std::io::Read::read(&mut theirs, &mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

#[test]
fn a_leader_writes_the_acknowledgement_it_makes_due_itself() {
    // No writer thread here: an ACK on the wire can only come from the leading thread.
    let rig = Rig::with_capacity(1 << 20);
    let acked = lead_and_see_ack(&rig, Duration::from_secs(5));
    assert!(
        acked.is_some_and(|n| (16..=40).contains(&n)),
        "the leader acknowledged what it read: {acked:?}"
    );
}

#[test]
fn a_leader_leaves_acknowledgements_to_the_writer_while_shutting_down() {
    // Shutting down, the writer says the last word (final ACK, GOODBYE, then it shuts
    // the write side): a leader writing after it would fail the connection.
    let rig = Rig::with_capacity(1 << 20);
    rig.peer
        .session(|s, now| s.begin_close(now + Duration::from_secs(60)));
    let acked = lead_and_see_ack(&rig, Duration::from_millis(300));
    assert_eq!(acked, None, "left to the writer (there is none here)");
}
