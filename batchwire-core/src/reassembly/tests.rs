use super::*;
use crate::frame::message_len;

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

/// The pieces of a `total`-byte message with id `id`, `size` bytes each.
fn pieces(id: u64, total: usize, size: usize) -> Vec<Fragment> {
    let data = whole(total);
    let data = Bytes::from(data);
    (0..total.div_ceil(size).max(1))
        .map(|k| {
            let off = k * size;
            let end = (off + size).min(total);
            Fragment {
                seq: id + k as u64,
                id,
                total: total as u64,
                offset: off as u64,
                to: n("inbox"),
                from: n("big"),
                data: data.slice(off..end),
            }
        })
        .collect()
}

#[test]
fn pieces_make_the_message_and_charge_it_once() {
    let mut r = Reassembly::default();
    let ps = pieces(10, 1000, 300);
    for p in &ps[..3] {
        assert_eq!(r.add(p, true).unwrap(), Added::Partial);
    }
    assert_eq!(r.bytes(), 900);
    let Added::Complete {
        payload, charged, ..
    } = r.add(&ps[3], true).unwrap()
    else {
        panic!()
    };
    assert_eq!(payload.len(), 1000);
    assert!(payload.iter().enumerate().all(|(i, b)| *b == i as u8));
    assert_eq!(charged as usize, message_len(&n("inbox"), &n("big"), 1000));
    assert!(r.is_empty());
}

#[test]
fn interleaved_messages_reassemble_apart_up_to_the_bound() {
    let mut r = Reassembly::default();
    let a = pieces(0, 20, 10);
    let b = pieces(100, 20, 10);
    r.add(&a[0], true).unwrap();
    r.add(&b[0], true).unwrap();
    assert!(matches!(
        r.add(&a[1], true).unwrap(),
        Added::Complete { .. }
    ));
    assert!(matches!(
        r.add(&b[1], true).unwrap(),
        Added::Complete { .. }
    ));
    for k in 0..MAX_PARTIAL as u64 {
        r.add(&pieces(1000 + 10 * k, 20, 10)[0], true).unwrap();
    }
    assert_eq!(
        r.add(&pieces(5000, 20, 10)[0], true),
        Err(ReassemblyError::TooMany)
    );
}

#[test]
fn pieces_that_do_not_follow_on_are_violations() {
    let mut r = Reassembly::default();
    let ps = pieces(0, 30, 10);
    assert_eq!(r.add(&ps[1], true), Err(ReassemblyError::Unknown { id: 0 }));
    r.add(&ps[0], true).unwrap();
    assert!(matches!(
        r.add(&ps[2], true),
        Err(ReassemblyError::OutOfOrder { .. })
    ));
    assert_eq!(
        r.add(&ps[0], true),
        Err(ReassemblyError::Duplicate { id: 0 })
    );
    let mut other = ps[1].clone();
    other.to = n("elsewhere");
    assert!(r.add(&other, true).is_err());
}

#[test]
fn a_message_not_kept_is_followed_without_its_data() {
    let mut r = Reassembly::default();
    let ps = pieces(0, 30, 10);
    assert!(!r.keeps(&ps[0], || false));
    r.add(&ps[0], false).unwrap();
    assert!(!r.keeps(&ps[1], || true), "later pieces follow the first");
    r.add(&ps[1], false).unwrap();
    assert_eq!(r.bytes(), 0);
    let Added::Complete { payload, kept, .. } = r.add(&ps[2], false).unwrap() else {
        panic!()
    };
    assert!(payload.is_empty() && !kept);
}

#[test]
fn given_up_messages_are_dropped_with_what_they_charged() {
    let mut r = Reassembly::default();
    r.add(&pieces(5, 30, 10)[0], true).unwrap();
    r.add(&pieces(9, 30, 10)[0], false).unwrap();
    assert!(r.discard_below(5).is_empty());
    let gone = r.discard_below(9);
    assert_eq!(gone.len(), 1);
    assert!(gone[0].kept && gone[0].charged > 10);
    assert_eq!(r.clear().len(), 1);
    assert!(r.is_empty());
}

#[test]
fn a_buffer_never_grows_past_the_announced_length_or_far_ahead_of_the_data() {
    let mut r = Reassembly::default();
    let mut first = pieces(0, 100, 10)[0].clone();
    first.total = 1 << 40;
    r.add(&first, true).unwrap();
    assert!(r.partial[0].buf.capacity() <= 10 + LOOKAHEAD);
    // Past the lookahead, at most doubling what arrived.
    let big = 8 * LOOKAHEAD;
    let mut r = Reassembly::default();
    for p in pieces(0, big, 64 << 10) {
        r.add(&p, true).unwrap();
        if let Some(p) = r.partial.first() {
            let got = p.received as usize;
            assert!(p.buf.capacity() <= (2 * got).max(got + LOOKAHEAD));
        }
    }
    let mut r = Reassembly::default();
    for p in pieces(0, 1000, 7) {
        r.add(&p, true).unwrap();
        if let Some(p) = r.partial.first() {
            assert!(p.buf.capacity() <= 1000);
        }
    }
}

const C1: ConnId = ConnId::for_tests(1);
const C2: ConnId = ConnId::for_tests(2);

/// The payload `pieces` cuts up.
fn whole(total: usize) -> Vec<u8> {
    (0..total).map(|i| i as u8).collect()
}

/// A reassembly with the first of `ps` added.
fn started(ps: &[Fragment]) -> Reassembly {
    let mut r = Reassembly::default();
    r.add(&ps[0], true).unwrap();
    r
}

/// The head of piece `f`, as a reader sees it before the data.
fn head(f: &Fragment) -> FragmentHead {
    FragmentHead {
        piece: Fragment {
            data: Bytes::new(),
            ..f.clone()
        },
        head_len: 0,
        data_len: f.data.len(),
    }
}

/// Read piece `f` straight into its message's buffer, `step` bytes at a time.
fn direct(r: &mut Reassembly, f: &Fragment, step: usize) -> Result<Added, ReassemblyError> {
    let h = head(f);
    let mut read = 0;
    while read < f.data.len() {
        let (buf, left) = r.direct_room(&h, read, C1, || true).expect("room");
        assert_eq!(left, f.data.len() - read);
        let n = left.min(step);
        buf.extend_from_slice(&f.data[read..read + n]);
        read += n;
    }
    r.add_direct(&h, C1)
}

#[test]
fn pieces_read_straight_into_the_buffer_make_the_same_message() {
    let ps = pieces(10, 1000, 300);
    let mut r = Reassembly::default();
    assert!(
        r.direct_room(&head(&ps[0]), 0, C1, || false).is_none(),
        "a first piece of a message not kept"
    );
    assert!(r.is_empty());
    r.add(&ps[0], true).unwrap();
    let addr = r.partial[0].buf.as_ptr();
    assert_eq!(direct(&mut r, &ps[1], 7).unwrap(), Added::Partial);
    assert_eq!(r.add(&ps[2], true).unwrap(), Added::Partial, "mixed");
    let Added::Complete {
        payload, charged, ..
    } = direct(&mut r, &ps[3], 1000).unwrap()
    else {
        panic!("complete")
    };
    let whole = whole(1000);
    assert_eq!(&payload[..], &whole[..]);
    assert_eq!(payload.as_ptr(), addr, "one buffer, never moved");
    assert_eq!(charged as usize, message_len(&n("inbox"), &n("big"), 1000));
    assert!(r.is_empty());
}

#[test]
fn a_first_piece_read_in_place_starts_its_message_once_committed() {
    let ps = pieces(10, 1000, 300);
    let whole = whole(1000);
    // Every piece in place, the first included.
    let mut r = Reassembly::default();
    for p in &ps[..3] {
        assert_eq!(direct(&mut r, p, 64).unwrap(), Added::Partial);
    }
    let Added::Complete {
        payload, charged, ..
    } = direct(&mut r, &ps[3], 64).unwrap()
    else {
        panic!("complete")
    };
    assert_eq!(&payload[..], &whole[..]);
    assert_eq!(charged as usize, message_len(&n("inbox"), &n("big"), 1000));
    // A start cut off by a break holds a place but nothing of the message: the first
    // piece may come again, whole or in place, and is not a duplicate.
    for again_in_place in [false, true] {
        let mut r = Reassembly::default();
        let (buf, _) = r.direct_room(&head(&ps[0]), 0, C1, || true).unwrap();
        buf.extend_from_slice(&[0xee; 100]);
        assert_eq!(r.len(), 1);
        let added = if again_in_place {
            direct(&mut r, &ps[0], 300)
        } else {
            r.add(&ps[0], true)
        };
        assert_eq!(added.unwrap(), Added::Partial);
        assert_eq!(
            r.add(&ps[0], true),
            Err(ReassemblyError::Duplicate { id: 10 }),
            "once committed, a start again is a duplicate"
        );
        for p in &ps[1..3] {
            r.add(p, true).unwrap();
        }
        let Added::Complete { payload, .. } = r.add(&ps[3], true).unwrap() else {
            panic!("complete")
        };
        assert_eq!(&payload[..], &whole[..]);
    }
    // Not for a message in one piece, nor past the bound on messages in pieces, nor
    // for a message given up.
    let mut r = Reassembly::default();
    assert!(
        r.direct_room(&head(&pieces(1, 10, 10)[0]), 0, C1, || true)
            .is_none()
    );
    for id in 0..MAX_PARTIAL as u64 {
        let p = &pieces(id * 100, 1000, 300)[0];
        assert!(r.direct_room(&head(p), 0, C1, || true).is_some());
    }
    let p = &pieces(1000, 1000, 300)[0];
    assert!(r.direct_room(&head(p), 0, C1, || true).is_none());
    assert_eq!(r.discard_below(2000).len(), MAX_PARTIAL);
    assert!(
        r.direct_room(&head(p), 0, C1, || true).is_none(),
        "given up"
    );
}

#[test]
fn a_read_in_place_that_will_not_be_committed_is_dropped_with_the_start_it_made() {
    let ps = pieces(10, 1000, 300);
    // A start made by the read: the entry goes, the slot is free again.
    let mut r = Reassembly::default();
    let (buf, _) = r.direct_room(&head(&ps[0]), 0, C1, || true).unwrap();
    buf.extend_from_slice(&ps[0].data[..100]);
    r.drop_direct(&ps[0], C2);
    assert_eq!(r.len(), 1, "not C2's read");
    r.drop_direct(&ps[0], C1);
    assert!(r.is_empty());
    // A later piece: its bytes go, what was committed stays.
    let mut r = started(&ps);
    let h = head(&ps[1]);
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&ps[1].data[..100]);
    r.drop_direct(&ps[1], C1);
    assert_eq!((r.len(), r.bytes()), (1, 300));
    assert!(
        r.direct_room(&h, 100, C1, || true).is_none(),
        "nothing to go on"
    );
    assert_eq!(direct(&mut r, &ps[1], 300).unwrap(), Added::Partial);
}

#[test]
fn direct_room_is_only_for_the_next_piece_of_a_kept_message() {
    let ps = pieces(10, 1000, 300);
    let mut r = Reassembly::default();
    assert!(
        r.direct_room(&head(&ps[1]), 0, C1, || true).is_none(),
        "never started"
    );
    r.add(&ps[0], true).unwrap();
    assert!(
        r.direct_room(&head(&ps[2]), 0, C1, || true).is_none(),
        "not the next"
    );
    let mut other = head(&ps[1]);
    other.piece.to = n("elsewhere");
    assert!(
        r.direct_room(&other, 0, C1, || true).is_none(),
        "another mailbox"
    );
    let mut r2 = Reassembly::default();
    r2.add(&ps[0], false).unwrap();
    assert!(
        r2.direct_room(&head(&ps[1]), 0, C1, || true).is_none(),
        "not kept"
    );
    // Committing what was not handed out commits nothing.
    assert!(r.add_direct(&head(&ps[1]), C1).is_err());
    assert_eq!(direct(&mut r, &ps[1], 50).unwrap(), Added::Partial);
}

#[test]
fn an_unfinished_direct_read_is_dropped_when_the_piece_comes_again() {
    let ps = pieces(10, 1000, 300);
    let mut r = started(&ps);
    // Half of piece 1 read in place, then the connection broke.
    let h = head(&ps[1]);
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&[0xee; 150]);
    // Its stale reader cannot go on once the message moved on...
    assert_eq!(r.add(&ps[1], true).unwrap(), Added::Partial, "resent whole");
    assert!(r.direct_room(&h, 150, C1, || true).is_none());
    // ...and the message is exactly the data.
    for p in &ps[2..3] {
        r.add(p, true).unwrap();
    }
    let Added::Complete { payload, .. } = direct(&mut r, &ps[3], 13).unwrap() else {
        panic!("complete")
    };
    let whole = whole(1000);
    assert_eq!(&payload[..], &whole[..]);
    // A direct read abandoned before any byte, restarted: fine too.
    let mut r = started(&ps);
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&[0xee; 10]);
    assert_eq!(direct(&mut r, &ps[1], 300).unwrap(), Added::Partial);
    assert_eq!(r.bytes(), 600);
}

#[test]
fn a_connection_that_starts_a_direct_read_takes_it_over_from_another() {
    let ps = pieces(10, 1000, 300);
    let mut r = started(&ps);
    let h = head(&ps[1]);
    // C1 reads 100 bytes of piece 1; C2 (a newer connection) starts it again.
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&ps[1].data[..100]);
    let (buf, _) = r.direct_room(&h, 0, C2, || true).unwrap();
    buf.extend_from_slice(&ps[1].data[..100]);
    // C1 can neither go on (even at a matching length), start again, nor commit, and
    // trying leaves C2's read alone: C2 goes on from where it was.
    assert!(r.direct_room(&h, 100, C1, || true).is_none());
    assert!(
        r.direct_room(&h, 0, C1, || true).is_none(),
        "an older connection never takes over a newer one's read"
    );
    r.drop_direct(&h.piece, C1);
    assert_eq!(
        r.add_direct(&h, C1),
        Err(ReassemblyError::TakenOver { id: 10 })
    );
    let (buf, left) = r.direct_room(&h, 100, C2, || true).unwrap();
    assert_eq!(left, 200);
    buf.extend_from_slice(&ps[1].data[100..]);
    assert_eq!(r.add_direct(&h, C2).unwrap(), Added::Partial);
    r.add(&ps[2], true).unwrap();
    let Added::Complete { payload, .. } = r.add(&ps[3], true).unwrap() else {
        panic!("complete")
    };
    let whole = whole(1000);
    assert_eq!(&payload[..], &whole[..]);
}

#[test]
fn pieces_of_a_message_given_up_are_dropped_until_a_restart() {
    let mut r = Reassembly::default();
    let ps = pieces(10, 300, 100);
    assert_eq!(r.add(&ps[0], true).unwrap(), Added::Partial);
    // The peer goes on without message 10: what we have is dropped, and so are its
    // pieces that were still on their way (resent from its window), first or not.
    let gone = r.discard_below(20);
    assert_eq!(gone.len(), 1);
    assert!(!r.keeps(&ps[1], || true));
    assert_eq!(r.add(&ps[1], false).unwrap(), Added::Partial);
    assert!(!r.keeps(&ps[0], || true), "not started again");
    assert_eq!(r.add(&ps[0], false).unwrap(), Added::Partial);
    assert!(r.is_empty());
    // A RESUME with a lower keep does not lower the floor.
    r.discard_below(5);
    assert!(!r.keeps(&ps[0], || true));
    // A new incarnation numbers from 0: its message 10 is a new one.
    r.clear();
    assert!(r.keeps(&ps[0], || true));
    for p in &ps[..2] {
        assert_eq!(r.add(p, true).unwrap(), Added::Partial);
    }
    assert!(matches!(
        r.add(&ps[2], true).unwrap(),
        Added::Complete { kept: true, .. }
    ));
}

// ---- found by cargo-mutants: rules the tests above did not pin ----

/// The buffer grows ahead of the data: a message of up to `LOOKAHEAD` gets its whole
/// buffer with its first piece; a larger one doubles, so a 16 MiB message in 64 KiB
/// pieces is moved a handful of times, not once per piece; a piece read in place has
/// room for all of it before it is read.
#[test]
fn buffers_grow_ahead_so_messages_are_rarely_moved() {
    let mut r = Reassembly::default();
    let ps = pieces(0, LOOKAHEAD, 64 << 10);
    r.add(&ps[0], true).unwrap();
    assert_eq!(r.partial[0].buf.capacity(), LOOKAHEAD, "1 MiB at once");
    let mut r = Reassembly::default();
    let ps = pieces(0, 16 << 20, 64 << 10);
    let (mut caps, mut last) = (0, 0);
    for p in &ps[..ps.len() - 1] {
        r.add(p, true).unwrap();
        let c = r.partial[0].buf.capacity();
        if c != last {
            caps += 1;
            last = c;
        }
    }
    assert!(caps <= 6, "{caps} buffers for 16 MiB");
    // In place: room for the whole piece before a byte of it is read.
    let mut r = Reassembly::default();
    let ps = pieces(0, 200_000, 64 << 10);
    let (buf, left) = r.direct_room(&head(&ps[0]), 0, C1, || true).unwrap();
    assert_eq!(left, 64 << 10);
    assert!(buf.capacity() >= 64 << 10, "{}", buf.capacity());
}

/// What is held: messages in pieces and the bytes the kept ones will hold when whole.
#[test]
fn it_reports_messages_in_pieces_and_what_the_kept_ones_commit() {
    let mut r = Reassembly::default();
    assert_eq!((r.len(), r.committed()), (0, 0));
    r.add(&pieces(0, 3000, 1000)[0], true).unwrap();
    r.add(&pieces(10, 5000, 1000)[0], true).unwrap();
    r.add(&pieces(20, 7000, 1000)[0], false).unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r.committed(), 8000, "the one not kept commits nothing");
}

/// In place: a piece read to its end still has (empty) room; a later piece of a message
/// never started gets none and starts nothing; a read that appended less than it says
/// is not committed.
#[test]
fn in_place_reads_are_checked_at_both_ends() {
    let ps = pieces(0, 30, 10);
    let mut r = Reassembly::default();
    let h = head(&ps[0]);
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&ps[0].data);
    let (_, left) = r.direct_room(&h, 10, C1, || true).expect("read to its end");
    assert_eq!(left, 0);
    assert!(r.direct_room(&h, 11, C1, || true).is_none(), "past its end");
    assert_eq!(r.add_direct(&h, C1).unwrap(), Added::Partial);
    // A middle piece of a message nobody started: no room, no entry.
    let mut r = Reassembly::default();
    let qs = pieces(50, 30, 10);
    assert!(r.direct_room(&head(&qs[1]), 0, C1, || true).is_none());
    assert!(r.is_empty());
    // Claimed 10 bytes, appended 9: not committed.
    let mut r = Reassembly::default();
    let h = head(&ps[0]);
    let (buf, _) = r.direct_room(&h, 0, C1, || true).unwrap();
    buf.extend_from_slice(&ps[0].data[..9]);
    assert!(matches!(
        r.add_direct(&h, C1),
        Err(ReassemblyError::OutOfOrder { .. })
    ));
}

/// A first piece again: a duplicate once anything was received, and also when a start
/// read in place (nothing received) announced another length. A one-piece message not
/// kept carries no payload. Below the floor, a piece is dropped even while another
/// message is in pieces.
#[test]
fn first_pieces_again_one_piece_messages_and_the_floor() {
    let ps = pieces(0, 30, 10);
    let mut r = Reassembly::default();
    r.add(&ps[0], true).unwrap();
    assert_eq!(
        r.add(&ps[0], true),
        Err(ReassemblyError::Duplicate { id: 0 })
    );
    let mut r = Reassembly::default();
    r.direct_room(&head(&ps[0]), 0, C1, || true).unwrap();
    let mut longer = ps[0].clone();
    longer.total = 40;
    assert_eq!(
        r.add(&longer, true),
        Err(ReassemblyError::Duplicate { id: 0 })
    );
    // ...or another destination, or another sender.
    let mut elsewhere = ps[0].clone();
    elsewhere.to = n("elsewhere");
    assert_eq!(
        r.add(&elsewhere, true),
        Err(ReassemblyError::Duplicate { id: 0 })
    );
    let mut other = ps[0].clone();
    other.from = n("other");
    assert_eq!(
        r.add(&other, true),
        Err(ReassemblyError::Duplicate { id: 0 })
    );
    // One piece, not kept.
    let one = &pieces(7, 10, 10)[0];
    let Added::Complete { payload, kept, .. } = r.add(one, false).unwrap() else {
        panic!()
    };
    assert!(payload.is_empty() && !kept);
    // The floor: message 5 was given up; message 12 is in pieces.
    let mut r = Reassembly::default();
    r.discard_below(10);
    r.add(&pieces(12, 30, 10)[0], true).unwrap();
    assert_eq!(r.add(&pieces(5, 30, 10)[1], true), Ok(Added::Partial));
    assert_eq!(r.len(), 1);
}
