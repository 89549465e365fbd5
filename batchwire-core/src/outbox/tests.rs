use super::*;
use crate::frame::{self as fr, Frame};
use bytes::BytesMut;

const A: Dest = 0;
const B: Dest = 1;

fn push(o: &mut Outbox, dest: Dest, tag: u8) {
    let to = Name::from_static("mb");
    let from = Name::from_static("s");
    o.push_message(dest, &to, &from, &[tag; 3], None);
}

/// Decode the frames of a batch into (dest, payload tags).
fn lists(b: &Batch) -> Vec<(Dest, Vec<u8>)> {
    b.frames
        .iter()
        .map(|f| {
            let mut buf = BytesMut::from(&b.buf[f.start..f.end]);
            let Some(Frame::Messages(l)) = fr::decode(&mut buf, 1 << 20).unwrap() else {
                panic!("not a message list")
            };
            assert_eq!(l.len() as u32, f.messages);
            (f.dest, l.iter().map(|m| m.payload[0]).collect())
        })
        .collect()
}

/// A batch's size on the wire counts payloads sent by reference; a batch without
/// frames is empty; handing back a batch's messages skips its control frames.
#[test]
fn a_batch_counts_its_wire_bytes_and_hands_back_only_messages() {
    let mut o = Outbox::new(64 << 10).by_reference(100);
    let (to, from) = (Name::from_static("mb"), Name::from_static("s"));
    let big = Bytes::from(vec![7u8; 1000]);
    o.push_message(A, &to, &from, b"small", None);
    o.push_frame(A, &Frame::Ack(5));
    o.push_bytes(A, &to, &from, &big, None);
    let mut b = Batch::default();
    assert!(b.is_empty());
    o.take(usize::MAX, usize::MAX, &mut b, None);
    assert!(!b.is_empty());
    assert_eq!(b.refs.len(), 1, "the large payload went by reference");
    assert_eq!(b.wire_len(), b.buf.len() + 1000);
    assert!(b.frames.iter().all(|f| !f.is_empty()));
    assert_eq!(
        b.frames.iter().map(|f| f.wire_len()).sum::<usize>(),
        b.wire_len()
    );
    let back = b.decode_messages();
    let payloads: Vec<&[u8]> = back.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, [&b"small"[..], &big[..]]);
    assert_eq!(
        FrameMeta {
            start: 3,
            end: 3,
            ..b.frames[0]
        }
        .len(),
        0
    );
    assert!(
        FrameMeta {
            start: 3,
            end: 3,
            ..b.frames[0]
        }
        .is_empty()
    );
}

#[test]
fn the_seed_example_groups_runs_into_message_lists() {
    // JGRP-1540: destinations A, null, null, B, B, null, A, null, null, null.
    let seq = [A, ALL, ALL, B, B, ALL, A, ALL, ALL, ALL];
    let mut o = Outbox::new(64 << 10);
    for (i, d) in seq.iter().enumerate() {
        push(&mut o, *d, i as u8);
    }
    let mut b = Batch::default();
    o.take(usize::MAX, usize::MAX, &mut b, None);
    // "First we send a message list consisting of 1 message to A, next a list of 2 to the
    // cluster, then a batch of 2 messages to B, 1 to the cluster, 1 to A and 3 to the
    // cluster."
    assert_eq!(
        lists(&b),
        [
            (A, vec![0]),
            (ALL, vec![1, 2]),
            (B, vec![3, 4]),
            (ALL, vec![5]),
            (A, vec![6]),
            (ALL, vec![7, 8, 9]),
        ]
    );
    assert_eq!(b.groups().count(), 6);
    assert!(o.is_empty());
}

#[test]
fn frames_close_at_the_size_limit_and_runs_merge_them_into_one_write() {
    let mut o = Outbox::new(
        LIST_OVERHEAD + 2 * message_len(&Name::from_static("mb"), &Name::from_static("s"), 3),
    );
    for i in 0..5 {
        push(&mut o, A, i);
    }
    let mut b = Batch::default();
    o.take(usize::MAX, usize::MAX, &mut b, None);
    assert_eq!(lists(&b), [(A, vec![0, 1]), (A, vec![2, 3]), (A, vec![4])]);
    let groups: Vec<_> = b.groups().collect();
    assert_eq!(groups.len(), 1, "one destination: one write");
    let g = groups[0];
    assert_eq!((g.len(), g[0].start, g[2].end), (3, 0, b.buf.len()));
    assert!(g.windows(2).all(|w| w[0].end == w[1].start), "contiguous");
}

#[test]
fn zero_frame_bytes_means_one_message_per_frame_and_partial_takes_keep_order() {
    let mut o = Outbox::new(0);
    for i in 0..4 {
        push(&mut o, A, i);
    }
    assert_eq!(o.messages(), 4);
    let mut b = Batch::default();
    o.take(1, usize::MAX, &mut b, None);
    assert_eq!(lists(&b), [(A, vec![0])]);
    o.take(2, usize::MAX, &mut b, None);
    assert_eq!(lists(&b), [(A, vec![1]), (A, vec![2])]);
    push(&mut o, A, 9);
    o.take(usize::MAX, usize::MAX, &mut b, None);
    assert_eq!(lists(&b), [(A, vec![3]), (A, vec![9])]);
    assert!(o.is_empty() && o.messages() == 0);
}

#[test]
fn byte_limited_take_takes_at_least_one_frame() {
    let mut o = Outbox::new(0);
    push(&mut o, A, 1);
    push(&mut o, A, 2);
    let mut b = Batch::default();
    o.take(usize::MAX, 1, &mut b, None);
    assert_eq!(lists(&b), [(A, vec![1])]);
    assert_eq!(o.messages(), 1);
}

#[test]
fn control_frames_keep_their_place() {
    let mut o = Outbox::new(64 << 10);
    push(&mut o, A, 1);
    o.push_frame(A, &Frame::Goodbye);
    push(&mut o, A, 2);
    let mut b = Batch::default();
    assert_eq!(
        o.level().messages,
        3,
        "the control frame counts for the bundler"
    );
    o.take(usize::MAX, usize::MAX, &mut b, None);
    assert_eq!(b.frames.len(), 3);
    assert_eq!(b.frames[1].messages, 0);
    assert_eq!(b.messages(), 2);
}

/// The same messages (and control frames) through an outbox that copies every payload
/// and one that takes payloads of 100 bytes or more by reference, taken whole or a
/// few kilobytes at a time: the frames on the wire are the same bytes, and each large
/// payload is the caller's own buffer, not a copy.
#[test]
fn payloads_by_reference_are_not_copied_and_splice_into_the_same_frames() {
    let (to, from) = (Name::from_static("mb"), Name::from_static("s"));
    let sizes = [3usize, 100, 700, 99, 2000, 0, 1500];
    let payloads: Vec<Bytes> = (0..70)
        .map(|i| Bytes::from(vec![i as u8; sizes[i % sizes.len()]]))
        .collect();
    for max_bytes in [usize::MAX, 3000, 1] {
        let mut copy = Outbox::new(1 << 10);
        let mut by_ref = Outbox::new(1 << 10).by_reference(100);
        for (i, p) in payloads.iter().enumerate() {
            let d = [A, A, B, ALL, A][i % 5];
            copy.push_bytes(d, &to, &from, p, None);
            by_ref.push_bytes(d, &to, &from, p, None);
            if i % 17 == 5 {
                copy.push_frame(d, &Frame::Goodbye);
                by_ref.push_frame(d, &Frame::Goodbye);
            }
        }
        assert_eq!(copy.bytes(), by_ref.bytes(), "the same bytes queued");
        // A recount walks the same messages, charging each its encoded size.
        for d in [A, B] {
            let want: Vec<(Name, u64)> = (payloads.iter().enumerate())
                .filter(|(i, _)| [d, ALL].contains(&[A, A, B, ALL, A][i % 5]))
                .map(|(_, p)| (to.clone(), message_len(&to, &from, p.len()) as u64))
                .collect();
            for o in [&mut copy, &mut by_ref] {
                let mut got = Vec::new();
                o.charges(d, |m, c| got.push((m.clone(), c)));
                assert_eq!(got, want);
            }
        }
        assert_eq!(copy.level().messages, by_ref.level().messages);
        let (mut a, mut b) = (Batch::default(), Batch::default());
        let mut seen = 0;
        while !copy.is_empty() {
            copy.take(usize::MAX, max_bytes, &mut a, None);
            by_ref.take(usize::MAX, max_bytes, &mut b, None);
            assert!(a.refs.is_empty());
            assert_eq!(a.frames.len(), b.frames.len(), "the same frames taken");
            assert_eq!(a.wire_len(), b.wire_len());
            let mut rest = &b.refs[..];
            for (fa, fb) in a.frames.iter().zip(&b.frames) {
                assert_eq!((fa.dest, fa.messages), (fb.dest, fb.messages));
                assert_eq!(fa.wire_len(), fb.wire_len());
                let (wire, after) = spliced(&b.buf[fb.start..fb.end], fb.start, rest);
                rest = after;
                assert_eq!(&a.buf[fa.start..fa.end], &wire[..], "the same frame");
            }
            assert!(rest.is_empty(), "every reference in a frame");
            for r in &b.refs {
                assert!(r.payload.len() >= 100);
                assert!(
                    payloads.iter().any(|p| p.as_ptr() == r.payload.as_ptr()),
                    "the caller's buffer"
                );
            }
            let msgs = b.decode_messages();
            assert_eq!(a.decode_messages(), msgs);
            let n = seen + msgs.len();
            assert!(
                msgs.iter().map(|m| &m.payload).eq(&payloads[seen..n]),
                "the payloads pushed, in order"
            );
            seen = n;
        }
        assert!(by_ref.is_empty() && by_ref.bytes() == 0);
        assert_eq!(seen, payloads.len());
    }
}

#[test]
fn oldest_time_is_set_on_first_push_and_cleared_when_emptied() {
    let t0 = Instant::now();
    let mut o = Outbox::new(64 << 10);
    let (to, from) = (Name::from_static("m"), Name::from_static(""));
    o.push_message(A, &to, &from, b"x", Some(t0));
    o.push_message(
        A,
        &to,
        &from,
        b"y",
        Some(t0 + std::time::Duration::from_secs(1)),
    );
    assert_eq!(o.level().oldest, Some(t0));
    let mut b = Batch::default();
    o.take(usize::MAX, usize::MAX, &mut b, None);
    assert_eq!(o.level().oldest, None);
}
