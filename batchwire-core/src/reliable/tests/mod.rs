//! Tests of the parent module.

use super::*;
use crate::frame::{Frame, Resume, message_len};
use crate::outbox::numbered;
use bytes::BytesMut;

use crate::testutil::Rng;

/// Encode messages `nums` (payload = the number) into one held chunk, by either path
/// (small batches are copied by both; see the test of large ones below).
fn hold(w: &mut SendWindow, nums: std::ops::Range<u64>) {
    if nums.start.is_multiple_of(2) {
        w.hold_batch(&mut numbered(nums));
    } else {
        w.hold(&numbered(nums).message_frames());
    }
}

/// A batch of messages `nums` with 1 KiB payloads (the number first): over 256 KiB from
/// 256 messages on.
fn big(nums: std::ops::Range<u64>) -> Batch {
    let mut ob = crate::outbox::Outbox::new(64 << 10);
    for i in nums {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(1024, 0);
        ob.push_message(
            0,
            &Name::from_static("m"),
            &Name::from_static("s"),
            &p,
            None,
        );
    }
    let mut b = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut b, None);
    b
}

/// Messages `nums` with payloads of 8 to 1500 bytes (the number first), in frames of at
/// most 4 KiB, a control frame now and then; payloads of `by_ref` bytes or more by
/// reference. Taken in one batch, or with `max_bytes` in several.
fn mixed(nums: std::ops::Range<u64>, by_ref: usize, max_bytes: usize) -> Vec<Batch> {
    let mut ob = crate::outbox::Outbox::new(4 << 10).by_reference(by_ref);
    for i in nums {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(8 + (i as usize * 389) % 1500, i as u8);
        ob.push_bytes(
            0,
            &Name::from_static("m"),
            &Name::from_static("s"),
            &Bytes::from(p),
            None,
        );
        if i % 23 == 7 {
            ob.push_frame(0, &Frame::Ack(i));
        }
    }
    let mut out = Vec::new();
    while !ob.is_empty() {
        let mut b = Batch::default();
        ob.take(usize::MAX, max_bytes, &mut b, None);
        out.push(b);
    }
    out
}

/// What `w` would write now, as one byte string.
fn wire_of(w: &mut SendWindow) -> (Vec<u8>, u64) {
    let u = w.unwritten();
    // What a writer writes (the slices), the same as the shared buffers it keeps for the
    // rest of a partial write, and as long as it says.
    let mut slices = Vec::new();
    u.slices(&mut slices);
    assert!(slices.len() <= u.slices_bound());
    let wire = slices.concat();
    assert_eq!(wire, u.chunks().concat());
    assert_eq!(wire.len(), u.wire_len());
    (wire, u.frames)
}

/// The messages of a chunk's MESSAGES frames, checking that they are numbered from `first`.
fn numbers_in(chunk: &[u8], first: u64) -> Vec<u64> {
    let mut buf = BytesMut::from(chunk);
    let mut seen = Vec::new();
    while let Ok(Some(Frame::Messages(l))) = frame::decode(&mut buf, 1 << 20) {
        assert_eq!(l.first_seq, first + seen.len() as u64);
        seen.extend(
            l.iter()
                .map(|m| u64::from_le_bytes(m.payload[..8].try_into().unwrap())),
        );
    }
    seen
}

#[test]
fn a_large_batch_moves_in_uncopied_and_the_outbox_gets_a_buffer_as_large() {
    let mut w = SendWindow::default();
    let ack_all = |w: &mut SendWindow| {
        let u = w.unwritten();
        if let Some(end) = u.ends.last() {
            w.mark_written(u.generation, *end);
        }
        drop(u);
        w.ack(w.next_seq()).unwrap();
    };
    // No buffer free yet: it moves all the same, numbered in place, and the batch gets a
    // new, empty buffer of the capacity it gave (so the outbox does not grow it again).
    let mut b = big(0..300);
    let (ptr, len, cap) = (b.buf.as_ptr(), b.buf.len(), b.buf.capacity());
    assert_eq!(w.hold_batch(&mut b), 300);
    assert!(
        b.buf.is_empty() && b.frames.is_empty(),
        "the batch is left empty"
    );
    assert!(b.buf.capacity() >= cap, "with a buffer as large");
    let u = w.unwritten();
    let chunks = u.chunks();
    assert_eq!(chunks.len(), 1);
    assert_eq!(
        (chunks[0].as_ptr(), chunks[0].len()),
        (ptr, len),
        "not copied"
    );
    assert_eq!(numbers_in(&chunks[0], 0), (0..300).collect::<Vec<_>>());
    drop((u, chunks));
    ack_all(&mut w);
    // Its buffer, acknowledged, is free: the next large batch moves and takes it.
    assert_eq!(w.free.len(), 1);
    let mut b = big(0..300);
    assert_eq!(w.hold_batch(&mut b), 300);
    assert_eq!(b.buf.as_ptr(), ptr, "the acknowledged buffer, reused");
    assert!(w.free.is_empty());
    assert_eq!(
        numbers_in(&w.unwritten().chunks()[0], 300),
        (0..300).collect::<Vec<_>>()
    );
    ack_all(&mut w);
    // A small batch is copied even with a buffer free (cheap, and the outbox keeps its
    // own), and not into that free buffer, which is far larger than it: it stays free for
    // the next large batch to move into.
    assert_eq!(w.free.len(), 1);
    let free_ptr = w.free[0].as_ptr();
    let mut small = numbered(0..50);
    assert_eq!(w.hold_batch(&mut small), 50);
    assert!(!small.buf.is_empty(), "small: copied");
    assert_eq!(w.free.len(), 1, "the large free buffer is still free");
    assert_ne!(w.unwritten().chunks()[0].as_ptr(), free_ptr);
    let mut b = big(0..300);
    assert_eq!(w.hold_batch(&mut b), 300);
    assert_eq!(b.buf.as_ptr(), free_ptr, "taken by the next large batch");
    // So is a batch with a control frame in it (its message frames only).
    let mut ob = crate::outbox::Outbox::new(1 << 10);
    ob.push_message(
        0,
        &Name::from_static("m"),
        &Name::from_static(""),
        b"x",
        None,
    );
    ob.push_frame(0, &Frame::Ack(3));
    let mut mixed = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut mixed, None);
    assert_eq!(w.hold_batch(&mut mixed), 1);
    assert!(!mixed.buf.is_empty(), "copied, not moved");
    assert_eq!(w.next_seq(), 951);
}

/// The same messages held in two windows, one with every payload copied and one with
/// payloads of 200 bytes or more by reference (batches copied, and moved): the bytes
/// written, after writes, acknowledgements and rewinds to any message, are the same;
/// each large payload goes out as the caller's buffer; recounts and failures agree.
#[test]
fn payloads_by_reference_write_the_same_bytes_through_acks_and_rewinds() {
    for (move_from, max_bytes) in [(None, usize::MAX), (Some(0), usize::MAX), (None, 5000)] {
        let (mut copy, mut by_ref) = (SendWindow::default(), SendWindow::default());
        by_ref.move_from = move_from;
        let mut refs = 0;
        for (mut a, mut b) in
            mixed(0..300, usize::MAX, max_bytes)
                .into_iter()
                .zip(mixed(0..300, 200, max_bytes))
        {
            refs += b.refs.len();
            let payloads: Vec<*const u8> = b.refs.iter().map(|r| r.payload.as_ptr()).collect();
            assert_eq!(copy.hold_batch(&mut a), by_ref.hold_batch(&mut b));
            assert!(
                b.refs.is_empty() && b.frames.is_empty(),
                "the batch is left empty"
            );
            let u = by_ref.unwritten();
            let chunks = u.chunks();
            for p in payloads {
                assert!(chunks.iter().any(|c| c.as_ptr() == p), "not copied");
            }
            // One end per chunk (not per slice), the last where the window ends.
            assert!(u.ends.windows(2).all(|e| e[0] < e[1]));
            assert_eq!(u.ends.last(), Some(&by_ref.next_seq()));
            assert_eq!(u.wire_len(), chunks.iter().map(|c| c.len()).sum::<usize>());
        }
        assert!(refs > 100, "{refs} payloads by reference");
        assert_eq!(copy.bytes(), by_ref.bytes());
        assert_eq!(wire_of(&mut copy), wire_of(&mut by_ref));
        let mut rng = Rng(7);
        for _ in 0..30 {
            let (ga, gb) = (copy.generation(), by_ref.generation());
            let sent = copy.next_seq();
            copy.mark_written(ga, sent);
            by_ref.mark_written(gb, sent);
            let (wa, wb) = (wire_of(&mut copy), wire_of(&mut by_ref));
            assert_eq!(wa, wb);
            // The peer has everything below some message: acknowledged, or on a new
            // connection (whole frames it has are not written again).
            let to = copy.base() + rng.below(sent - copy.base() + 1);
            if rng.chance(50) {
                assert_eq!(copy.ack(to), by_ref.ack(to));
            } else {
                copy.rewind(to).unwrap();
                by_ref.rewind(to).unwrap();
                let (wa, wb) = (wire_of(&mut copy), wire_of(&mut by_ref));
                assert_eq!(wa, wb, "rewound to {to}");
            }
            assert_eq!(copy.bytes(), by_ref.bytes());
            let (mut ca, mut cb) = (Vec::new(), Vec::new());
            copy.charges_from(to, |m, c| ca.push((m.clone(), c)));
            by_ref.charges_from(to, |m, c| cb.push((m.clone(), c)));
            assert_eq!(ca, cb);
        }
        // Against the bytes themselves: everything held, decoded from what a new
        // connection would be given, is what a recount counts and a failure hands back.
        let base = by_ref.base();
        by_ref.rewind(base).unwrap();
        let mut wire = BytesMut::from(&wire_of(&mut by_ref).0[..]);
        let mut decoded = Vec::new();
        while let Ok(Some(f)) = frame::decode(&mut wire, 1 << 24) {
            let Frame::Messages(l) = f else { continue };
            decoded.extend(l.iter());
        }
        let mut charges = Vec::new();
        by_ref.charges_from(base, |m, c| charges.push((m.clone(), c)));
        let want: Vec<_> = (decoded.iter())
            .map(|m| {
                (
                    m.to.clone(),
                    message_len(&m.to, &m.from, m.payload.len()) as u64,
                )
            })
            .collect();
        assert_eq!(charges, want);
        assert_eq!(copy.take_failed(false), decoded);
        assert_eq!(by_ref.take_failed(false), decoded);
    }
}

/// The receiving end of one simulated connection.
#[derive(Default)]
struct Conn {
    /// Bytes "in the network" (written by the sender, not yet read).
    wire: Vec<u8>,
    /// Bytes read by the receiver, not yet a whole frame.
    buf: BytesMut,
}

/// Read whatever whole frames `conn` has (up to `max` bytes from the wire), deliver
/// them through `rw` into `got`. Returns false on a sequence gap (connection closed).
fn read(conn: &mut Conn, rw: &mut RecvWindow, max: usize, got: &mut Vec<u64>) -> bool {
    let n = max.min(conn.wire.len());
    conn.buf.extend_from_slice(&conn.wire[..n]);
    conn.wire.drain(..n);
    while let Ok(Some(f)) = frame::decode(&mut conn.buf, 1 << 24) {
        let Frame::Messages(l) = f else { continue };
        let Ok(skip) = rw.accept(l.first_seq, l.len() as u32) else {
            return false;
        };
        for m in l.skip(skip).iter() {
            got.push(u64::from_le_bytes(m.payload[..8].try_into().unwrap()));
        }
    }
    true
}

/// One seeded run: a stream of `total` messages over connections that break at random
/// points (mid-frame included), with resends, late frames from dead connections, and
/// acknowledgements lost with their connection.
fn simulate(seed: u64, total: u64) -> (Vec<u64>, u32) {
    let mut rng = Rng(seed | 1);
    let (mut sw, mut rw) = (SendWindow::default(), RecvWindow::default());
    // Odd seeds move every batch it can (whatever its size), even ones copy small ones.
    if !seed.is_multiple_of(2) {
        sw.move_from = Some(0);
    }
    let mut conn = Conn::default();
    let mut old: Option<Conn> = None;
    let (mut queued, mut got, mut breaks) = (0u64, Vec::new(), 0u32);
    let mut acks_in_flight: Vec<u64> = Vec::new();
    for _ in 0..100_000 {
        if got.len() as u64 == total {
            break;
        }
        match rng.below(10) {
            // The application sends a few messages.
            0..=2 if queued < total => {
                let n = (1 + rng.below(40)).min(total - queued);
                if seed.is_multiple_of(3) {
                    // Payloads of 300 bytes or more by reference, in partial takes.
                    let max = 500 + rng.below(8000) as usize;
                    for mut b in mixed(queued..queued + n, 300, max) {
                        sw.hold_batch(&mut b);
                    }
                } else {
                    hold(&mut sw, queued..queued + n);
                }
                queued += n;
            }
            // The writer writes what is unwritten, sometimes only partly before the
            // connection breaks (the rest of the write is lost).
            3 | 4 => {
                let u = sw.unwritten();
                for c in &u.chunks() {
                    conn.wire.extend_from_slice(c);
                }
                if let Some(end) = u.ends.last() {
                    sw.mark_written(u.generation, *end);
                }
            }
            // The receiver reads some bytes; sometimes a dead connection's reader
            // still delivers what it had buffered.
            5 | 6 => {
                let max = 1 + rng.below(3000) as usize;
                if !read(&mut conn, &mut rw, max, &mut got) {
                    conn = Conn::default(); // gap: that connection is closed
                }
                if let Some(o) = old.as_mut()
                    && rng.chance(50)
                {
                    read(o, &mut rw, usize::MAX, &mut got);
                    old = None;
                }
                if let Some(a) = rw.ack_due() {
                    acks_in_flight.push(a);
                }
            }
            // Acknowledgements arrive (in order, on the live connection).
            7 => {
                for a in acks_in_flight.drain(..) {
                    sw.ack(a).unwrap();
                }
            }
            // The connection breaks at a random point: bytes in flight and acks in
            // flight are lost; a new connection resumes.
            8 if rng.chance(30) => {
                breaks += 1;
                let keep = rng.below(conn.wire.len() as u64 + 1) as usize;
                conn.wire.truncate(keep);
                acks_in_flight.clear();
                // Its reader may still hand over what fully arrived, later.
                old = Some(std::mem::take(&mut conn));
                // RESUME each way.
                let theirs = Resume {
                    next: rw.next(),
                    base: sw.base(),
                    keep: 0,
                };
                sw.rewind(theirs.next).unwrap();
                rw.resume(theirs.base);
            }
            _ => {}
        }
    }
    (got, breaks)
}

mod windows;
