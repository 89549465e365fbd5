//! Whole windows: exactly once across random breaks, acknowledgements, rewinds, pieces.

use super::*;

#[test]
fn exactly_once_in_order_across_random_breaks() {
    let mut total_breaks = 0;
    for seed in 1..=200u64 {
        let total = 500 + seed * 7;
        let (got, breaks) = simulate(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), total);
        let want: Vec<u64> = (0..total).collect();
        assert_eq!(got, want, "seed {seed}: {breaks} breaks");
        total_breaks += breaks;
    }
    assert!(
        total_breaks > 1000,
        "the simulation broke connections only {total_breaks} times"
    );
}

#[test]
fn acks_free_whole_chunks_and_rewind_resends_from_the_oldest() {
    let mut w = SendWindow::default();
    hold(&mut w, 0..10);
    hold(&mut w, 10..20);
    assert_eq!((w.base(), w.next_seq(), w.messages()), (0, 20, 20));
    let u = w.unwritten();
    let (c, g) = (u.chunks(), u.generation);
    assert_eq!((c.len(), u.messages), (2, 20));
    w.mark_written(g, u.ends[1]);
    assert!(!w.has_unwritten());
    assert_eq!(
        w.ack(15),
        Ok(c[0].len()),
        "only the first chunk is wholly acknowledged"
    );
    assert_eq!(w.base(), 10);
    w.rewind(12).unwrap();
    assert!(
        w.has_unwritten(),
        "after a break everything held is written again"
    );
    w.mark_written(g, 20);
    assert!(w.has_unwritten(), "a stale generation is ignored");
}

#[test]
fn an_ack_during_the_write_does_not_shift_what_is_marked_written() {
    let mut w = SendWindow::default();
    hold(&mut w, 0..10);
    hold(&mut w, 10..20);
    let u = w.unwritten();
    // The first chunk arrives and is acknowledged while the write is still going on,
    // and the application holds a third chunk meanwhile.
    w.ack(10).unwrap();
    hold(&mut w, 20..30);
    w.mark_written(u.generation, *u.ends.last().unwrap());
    let rest = w.unwritten();
    assert_eq!(
        rest.chunks().len(),
        1,
        "the third chunk is still to be written"
    );
    assert_eq!(rest.ends, [30]);
}

#[test]
fn the_free_buffer_taken_is_the_smallest_that_fits_and_the_smallest_go_first_over_a_bound() {
    let mut w = SendWindow::default();
    let caps = |w: &SendWindow| {
        let mut c: Vec<usize> = w.free.iter().map(|b| b.capacity()).collect();
        c.sort();
        c
    };
    for cap in [4 << 10, 1 << 20, 64 << 10] {
        w.recycle(Bytes::from(Vec::<u8>::with_capacity(cap)));
    }
    // The smallest that holds the need, not the first nor the largest.
    assert_eq!(w.take_free(10 << 10, 0).capacity(), 64 << 10);
    assert_eq!(caps(&w), [4 << 10, 1 << 20]);
    // None holds it: a new one of the size asked, and the free ones stay.
    assert_eq!(w.take_free(2 << 20, 3 << 20).capacity(), 3 << 20);
    assert_eq!(caps(&w), [4 << 10, 1 << 20]);
    // Past FREE_BUFFERS the smallest are dropped, so many small buffers never crowd out a
    // large one.
    for _ in 0..FREE_BUFFERS {
        w.recycle(Bytes::from(Vec::<u8>::with_capacity(1 << 10)));
    }
    let mut want = vec![1 << 10; FREE_BUFFERS - 2];
    want.extend([4 << 10, 1 << 20]);
    assert_eq!(
        caps(&w),
        want,
        "the two smallest went; the large one is kept"
    );
    // Past FREE_BYTES too, smallest first.
    w.recycle(Bytes::from(Vec::<u8>::with_capacity(
        FREE_BYTES - (1 << 20),
    )));
    assert!(w.free_bytes <= FREE_BYTES);
    assert_eq!(w.free_bytes, caps(&w).iter().sum::<usize>());
    assert_eq!(caps(&w), [1 << 20, FREE_BYTES - (1 << 20)]);
    // A buffer larger than the bound is not kept at all, and pushes none of the others out.
    w.recycle(Bytes::from(Vec::<u8>::with_capacity(FREE_BYTES + 1)));
    assert_eq!(caps(&w), [1 << 20, FREE_BYTES - (1 << 20)]);
    // A peer gone for good lets go of them all.
    assert_eq!(w.spare_bytes(), FREE_BYTES);
    w.release_buffers();
    assert_eq!((w.spare_bytes(), w.free.capacity()), (0, 0));
}

#[test]
fn acknowledged_buffers_are_reused_within_bounds() {
    let mut w = SendWindow::default();
    for round in 0..20u64 {
        hold(&mut w, round * 10..round * 10 + 10);
        let u = w.unwritten();
        w.mark_written(u.generation, w.next_seq());
        drop(u);
        w.ack(w.next_seq()).unwrap();
        assert!(w.free.len() <= FREE_BUFFERS);
    }
    assert_eq!(w.free.len(), 1, "one buffer cycles between hold and ack");
    assert_eq!((w.bytes(), w.messages()), (0, 0));
}

#[test]
fn failed_messages_come_back_with_their_payloads() {
    let mut w = SendWindow::default();
    hold(&mut w, 0..5);
    w.unwritten();
    w.ack(2).unwrap();
    let failed = w.take_failed(true);
    let nums: Vec<u64> = failed
        .iter()
        .map(|m| u64::from_le_bytes(m.payload[..8].try_into().unwrap()))
        .collect();
    assert_eq!(
        nums,
        [0, 1, 2, 3, 4],
        "the chunk was not wholly acknowledged, so all of it"
    );
    assert_eq!((w.next_seq(), w.bytes()), (0, 0));
}

#[test]
fn receiver_skips_duplicates_refuses_gaps_and_acks_once() {
    let mut r = RecvWindow::default();
    assert_eq!(r.accept(0, 10), Ok(0));
    assert_eq!(
        r.accept(5, 10),
        Ok(5),
        "a resent frame overlapping what arrived"
    );
    assert_eq!(r.accept(0, 10), Ok(10));
    assert_eq!(
        r.accept(20, 1),
        Err(SeqError::Gap {
            expected: 15,
            got: 20
        })
    );
    assert_eq!(r.ack_due(), Some(15));
    assert_eq!(r.ack_due(), None);
    r.resume(30);
    assert_eq!(r.next(), 15, "a gap is taken only when its frame arrives");
    assert_eq!(r.accept(30, 2), Ok(0), "the sender gave up 15..30");
    assert_eq!(r.next(), 32);
    r.reset();
    assert_eq!(r.next(), 0);
}

#[test]
fn forged_acks_and_resumes_are_violations_that_change_nothing() {
    let mut w = SendWindow::default();
    hold(&mut w, 0..10);
    assert_eq!(
        w.ack(5),
        Err(SeqError::AckBeyondSent { ack: 5, sent: 0 }),
        "nothing was written yet"
    );
    w.unwritten();
    assert_eq!(
        w.ack(11),
        Err(SeqError::AckBeyondSent { ack: 11, sent: 10 })
    );
    assert_eq!(
        w.ack(u64::MAX),
        Err(SeqError::AckBeyondSent {
            ack: u64::MAX,
            sent: 10
        })
    );
    assert_eq!(
        w.rewind(u64::MAX),
        Err(SeqError::ResumeBeyondSent {
            next: u64::MAX,
            sent: 10
        })
    );
    assert_eq!((w.base(), w.messages()), (0, 10), "nothing was dropped");
    assert_eq!(
        w.ack(10).map(|b| b > 0),
        Ok(true),
        "the edge itself is fine"
    );
    assert_eq!(w.ack(3), Ok(0), "a stale ack changes nothing");
}

#[test]
fn a_forged_resume_base_cannot_make_the_receiver_skip_real_messages() {
    let mut r = RecvWindow::default();
    assert_eq!(r.accept(0, 5), Ok(0));
    r.resume(u64::MAX);
    // The real stream goes on where it was: nothing is skipped.
    assert_eq!(r.accept(5, 5), Ok(0));
    assert_eq!(r.next(), 10);
    // A frame at the forged base itself overflows.
    r.resume(u64::MAX);
    assert_eq!(
        r.accept(u64::MAX, 1),
        Err(SeqError::Overflow {
            first: u64::MAX,
            count: 1
        })
    );
    assert_eq!(
        r.accept(u64::MAX - 1, 1),
        Err(SeqError::Gap {
            expected: 10,
            got: u64::MAX - 1
        })
    );
    assert_eq!(r.next(), 10, "violations change nothing");
    // Edges: the largest frame that fits is fine once announced.
    r.resume(u64::MAX - 1);
    assert_eq!(r.accept(u64::MAX - 1, 1), Ok(0));
    assert_eq!(r.next(), u64::MAX);
    assert_eq!(r.accept(u64::MAX, 0), Ok(0));
}

#[test]
fn a_rewind_writes_again_only_the_frames_the_peer_lacks() {
    let mut w = SendWindow::default();
    // One chunk of several 1 KiB frames, written, then the connection breaks.
    hold(&mut w, 0..200);
    let u = w.unwritten();
    let frames = u.frames;
    assert!(frames >= 4, "{frames} frames");
    w.mark_written(u.generation, 200);
    let before = w.bytes();
    // The peer got the first 150.
    w.rewind(150).unwrap();
    let again = w.unwritten();
    assert!(
        again.frames < frames,
        "{} of {frames} frames written again",
        again.frames
    );
    assert!(w.bytes() < before);
    // What is written again starts at or below 150, at a frame boundary, and holds 150..200.
    assert!(w.base() <= 150 && w.base() > 0, "base {}", w.base());
    let mut wire = BytesMut::new();
    for c in &again.chunks() {
        wire.extend_from_slice(c);
    }
    let mut rw = RecvWindow::default();
    rw.commit(0, 150);
    let mut got = Vec::new();
    while let Ok(Some(f)) = frame::decode(&mut wire, 1 << 24) {
        let Frame::Messages(l) = f else { continue };
        let skip = rw.accept(l.first_seq, l.len() as u32).unwrap();
        for m in l.skip(skip).iter() {
            got.push(u64::from_le_bytes(m.payload[..8].try_into().unwrap()));
        }
    }
    assert_eq!(got, (150..200).collect::<Vec<_>>());
    // A peer with everything of the chunk but its last message: the last frame stays.
    w.rewind(199).unwrap();
    assert_eq!(w.unwritten().frames, 1);
    // Failed messages handed back are exactly the ones not acknowledged.
    let failed = w.take_failed(false);
    assert!(
        failed.len() as u64 >= 1 && failed.len() <= 50,
        "{}",
        failed.len()
    );
}
