//! Message lists: the writer, properties of encode and decode, runs by mailbox, pieces.

use super::*;

#[test]
fn list_writer_matches_from_messages() {
    let m = Message {
        to: n("to"),
        from: n("from"),
        payload: Bytes::from_static(b"abc"),
    };
    let mut v = Vec::new();
    let mut w = ListWriter::start(&mut v);
    w.push(&mut v, &m.to, &m.from, &m.payload);
    w.push(&mut v, &m.to, &m.from, &m.payload);
    assert_eq!(
        w.len(&v),
        LIST_OVERHEAD + 2 * message_len(&m.to, &m.from, 3)
    );
    w.finish(&mut v);
    let mut expect = Vec::new();
    Frame::Messages(MessageList::from_messages([&m, &m])).encode(&mut expect);
    assert_eq!(v, expect);
}

fn arb_name() -> impl Strategy<Value = Name> {
    // Both forms: inline (up to Name::INLINE bytes) and shared, and non-ASCII.
    "[a-z0-9/_é-]{0,40}".prop_map(|s| Name::new(&s).unwrap())
}

fn arb_message() -> impl Strategy<Value = Message> {
    (
        arb_name(),
        arb_name(),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(to, from, p)| Message {
            to,
            from,
            payload: p.into(),
        })
}

proptest! {
    #[test]
    fn message_lists_round_trip(msgs in proptest::collection::vec(arb_message(), 0..40)) {
        let mut v = Vec::new();
        Frame::Messages(MessageList::from_messages(&msgs)).encode(&mut v);
        let mut buf = BytesMut::from(&v[..]);
        let Some(Frame::Messages(list)) = decode(&mut buf, MAX).unwrap() else {
            panic!("not a message list")
        };
        prop_assert_eq!(list.iter().collect::<Vec<_>>(), msgs);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut buf = BytesMut::from(&bytes[..]);
        // Decode until error or incomplete; every outcome is fine but a panic.
        for _ in 0..512 {
            match decode(&mut buf, 4096) {
                Ok(Some(Frame::Messages(l))) => { let _ = l.iter().count(); }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// `next_message` is public: on bytes nobody checked it stops (`None`), never panics,
    /// and never hands out more bytes than it was given.
    #[test]
    fn next_message_on_unchecked_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut data = Bytes::from(bytes);
        let mut taken = 0;
        for _ in 0..300 {
            let before = data.len();
            let Some((_, payload, used)) = next_message(&mut data) else { break };
            prop_assert!(used <= before && payload.len() <= used);
            prop_assert_eq!(data.len(), before - used);
            taken += used;
        }
        prop_assert!(taken <= 300);
    }

    #[test]
    fn random_bodies_behind_valid_headers_never_panic(
        kind in 0u8..8, body in proptest::collection::vec(any::<u8>(), 0..256)
    ) {
        let mut v = ((body.len() + 1) as u32).to_le_bytes().to_vec();
        v.push(kind);
        v.extend_from_slice(&body);
        let _ = decode(&mut BytesMut::from(&v[..]), 4096);
    }
}

/// Messages whose names come from a small pool (inline, shared and non-ASCII), so that
/// consecutive messages often repeat both names, one, or neither.
fn pooled_messages() -> impl Strategy<Value = Vec<Message>> {
    let pool = [
        "sink",
        "a",
        "",
        "é",
        "mailbox/with/a/name/longer/than/inline",
    ];
    proptest::collection::vec(
        (
            0..pool.len(),
            0..pool.len(),
            proptest::collection::vec(any::<u8>(), 0..40),
        ),
        0..30,
    )
    .prop_map(move |v| {
        v.into_iter()
            .map(|(t, f, p)| msg(pool[t], pool[f], &p))
            .collect()
    })
}

/// What a message-list body means, checked the slow way: every message on its own, each
/// name in full, as if none repeated the one before. The reference for `MessageList::read`.
fn read_slowly(body: &[u8], count: u32, first_seq: u64) -> Result<MessageList, DecodeError> {
    let (mut pos, mut msgs) = (0, Vec::new());
    for _ in 0..count {
        let s = check_message(body, pos, None)?;
        let name = |r: (usize, usize)| Name::new(std::str::from_utf8(&body[r.0..r.1]).unwrap());
        msgs.push(Message {
            to: name(s.to).unwrap(),
            from: name(s.from).unwrap(),
            payload: Bytes::copy_from_slice(&body[s.payload.0..s.payload.1]),
        });
        pos = s.end;
    }
    if pos != body.len() {
        return Err(DecodeError::TrailingBytes(body.len() - pos));
    }
    let mut list = MessageList::from_messages(&msgs);
    list.first_seq = first_seq;
    Ok(list)
}

proptest! {
    /// The shortcut for a message that repeats the names before it accepts and refuses
    /// exactly what checking every message in full does, with the same error, for valid
    /// lists and for lists with one byte changed or cut short anywhere after the count.
    #[test]
    fn a_message_list_is_read_as_checking_each_message_in_full_would(
        msgs in pooled_messages(),
        change in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut v = Vec::new();
        Frame::Messages(MessageList::from_messages(&msgs)).encode(&mut v);
        let body_at = LIST_OVERHEAD;
        if let Some((i, b)) = change && v.len() > body_at {
            let i = body_at + i.index(v.len() - body_at);
            v[i] = b;
        }
        if let Some(i) = cut && v.len() > body_at {
            v.truncate(body_at + i.index(v.len() - body_at));
            // The frame's length says how much it holds.
            let len = (v.len() - 4) as u32;
            v[..4].copy_from_slice(&len.to_le_bytes());
        }
        let count = u32::from_le_bytes(v[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap());
        let expect = read_slowly(&v[body_at..], count, 0);
        match (decode(&mut BytesMut::from(&v[..]), MAX), expect) {
            (Ok(Some(Frame::Messages(got))), Ok(want)) => prop_assert_eq!(got, want),
            (Err(FrameError::Malformed { source, .. }), Err(want)) => prop_assert_eq!(source, want),
            (got, want) => prop_assert!(false, "read {got:?}, checked in full {want:?}"),
        }
    }
}

fn msg(to: &str, from: &str, p: &[u8]) -> Message {
    Message {
        to: Name::new(to).unwrap(),
        from: Name::new(from).unwrap(),
        payload: Bytes::copy_from_slice(p),
    }
}

/// A list's runs, owned: (mailbox, byte range, message count).
fn runs_of(list: &MessageList) -> Vec<(Vec<u8>, std::ops::Range<usize>, u32)> {
    list.runs().map(|(to, r, n)| (to.to_vec(), r, n)).collect()
}

#[test]
fn runs_group_consecutive_messages_by_mailbox_and_next_message_walks_a_run() {
    let msgs = [
        msg("a", "x", b"1"),
        msg("a", "y", b"2"),
        msg("b", "x", b"3"),
        msg("a", "x", b"4"),
    ];
    let list = MessageList::from_messages(&msgs);
    let runs = runs_of(&list);
    assert_eq!(runs.len(), 3);
    assert_eq!((runs[0].0.as_slice(), runs[0].2), (&b"a"[..], 2));
    assert_eq!((runs[1].0.as_slice(), runs[1].2), (&b"b"[..], 1));
    assert_eq!((runs[2].0.as_slice(), runs[2].2), (&b"a"[..], 1));
    assert_eq!(runs[2].1.end, list.body().len());
    let mut data = list.body().slice(runs[0].1.clone());
    let (from, payload, _) = next_message(&mut data).unwrap();
    assert_eq!((from.as_str(), &payload[..]), ("x", &b"1"[..]));
    let (from, payload, _) = next_message(&mut data).unwrap();
    assert_eq!((from.as_str(), &payload[..]), ("y", &b"2"[..]));
    assert!(next_message(&mut data).is_none());
}

#[test]
fn skip_drops_leading_messages_and_advances_the_sequence() {
    let mut list = MessageList::from_messages(&[
        msg("a", "x", b"1"),
        msg("a", "x", b"2"),
        msg("b", "y", b"3"),
    ]);
    list.first_seq = 10;
    let rest = list.skip(2);
    assert_eq!(rest.first_seq, 12);
    let got: Vec<_> = rest.iter().map(|m| m.payload.to_vec()).collect();
    assert_eq!(got, [b"3".to_vec()]);
    assert!(list.skip(3).is_empty() && list.skip(9).is_empty());
    let mut v = vec![0u8; 0];
    let mut w = ListWriter::start(&mut v);
    w.push(
        &mut v,
        &Name::from_static("a"),
        &Name::from_static(""),
        b"z",
    );
    w.finish(&mut v);
    set_first_seq(&mut v, 99);
    let Ok(Some(Frame::Messages(l))) = decode(&mut BytesMut::from(&v[..]), 1 << 20) else {
        panic!()
    };
    assert_eq!(l.first_seq, 99);
}

#[test]
fn a_bad_name_after_a_good_one_is_still_caught() {
    let list = MessageList::from_messages(&[msg("a", "x", b"1"), msg("bb", "x", b"2")]);
    let mut v = Vec::new();
    Frame::Messages(list).encode(&mut v);
    // The second message's destination "bb" becomes invalid UTF-8.
    let at = v.iter().rposition(|b| *b == b'b').unwrap();
    v[at] = 0xff;
    let err = decode(&mut BytesMut::from(&v[..]), 1 << 20).unwrap_err();
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn an_empty_list_has_no_runs() {
    assert_eq!(MessageList::from_messages(&[]).runs().count(), 0);
}

#[test]
fn names_beyond_ascii_are_checked_unless_repeated() {
    // Valid non-ASCII names pass, first and repeated.
    let list = MessageList::from_messages(&[msg("é", "ü", b"1"), msg("é", "ü", b"2")]);
    let mut v = Vec::new();
    Frame::Messages(list).encode(&mut v);
    assert!(decode(&mut BytesMut::from(&v[..]), 1 << 20).is_ok());
    // A non-ASCII byte that is not UTF-8 is caught in either name, first or after an
    // ASCII name of the same length.
    for (first, second, what) in [
        (("a", "x"), ("b", "y"), "destination"),
        (("a", "x"), ("a", "y"), "sending"),
    ] {
        let list = MessageList::from_messages(&[
            msg(first.0, first.1, b"1"),
            msg(second.0, second.1, b"2"),
        ]);
        let mut v = Vec::new();
        Frame::Messages(list).encode(&mut v);
        let target = if what == "destination" { b'b' } else { b'y' };
        let at = v.iter().rposition(|b| *b == target).unwrap();
        v[at] = 0xc3; // a lead byte with nothing after it
        let err = decode(&mut BytesMut::from(&v[..]), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{what}: {err}");
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

#[test]
fn a_list_to_one_mailbox_is_one_run_however_it_was_made() {
    let list = MessageList::from_messages(&[
        msg("a", "x", b"1"),
        msg("a", "y", b"22"),
        msg("a", "x", b"3"),
    ]);
    assert_eq!(runs_of(&list), [(b"a".to_vec(), 0..list.body().len(), 3)]);
    // Read off the wire: the same list, the same single run.
    let mut v = Vec::new();
    Frame::Messages(list.clone()).encode(&mut v);
    let Ok(Some(Frame::Messages(read))) = decode(&mut BytesMut::from(&v[..]), 1 << 20) else {
        panic!()
    };
    assert_eq!(read, list);
    assert_eq!(read.runs().count(), 1);
    // Same-length names that differ are two runs; a suffix to one mailbox is one again.
    let mixed = MessageList::from_messages(&[
        msg("b", "x", b"1"),
        msg("a", "x", b"2"),
        msg("a", "x", b"3"),
    ]);
    assert_eq!(mixed.runs().count(), 2);
    let rest = mixed.skip(1);
    let runs: Vec<_> = rest.runs().map(|(to, _, n)| (to.to_vec(), n)).collect();
    assert_eq!(runs, [(b"a".to_vec(), 2)]);
    let mut data = rest.body().clone();
    assert_eq!(&next_message(&mut data).unwrap().1[..], b"2");
}

/// A FRAGMENT written as its head and then its data (the writer's way, data uncopied)
/// is byte for byte the frame encoded whole; only the piece whose data ends the message
/// is the last.
#[test]
fn a_fragment_head_and_its_data_are_the_whole_frame() {
    let (to, from) = (Name::new("inbox").unwrap(), Name::new("big").unwrap());
    let data = Bytes::from(vec![5u8; 300]);
    let f = Fragment {
        seq: 9,
        id: 7,
        total: 1000,
        offset: 700,
        to: to.clone(),
        from: from.clone(),
        data: data.clone(),
    };
    assert!(f.is_last() && !f.is_first());
    let mut whole = Vec::new();
    Frame::Fragment(f).encode(&mut whole);
    let mut split = Vec::new();
    encode_fragment_head(&mut split, 9, 7, 1000, 700, &to, &from, data.len());
    split.extend_from_slice(&data);
    assert_eq!(split, whole);
    assert_eq!(
        whole.len(),
        FRAGMENT_OVERHEAD + to.len() + from.len() + data.len(),
        "what a piece costs on the wire"
    );
    let middle = Fragment {
        seq: 8,
        id: 7,
        total: 1000,
        offset: 400,
        to,
        from,
        data,
    };
    assert!(!middle.is_last() && !middle.is_first());
}

/// Small things the decoders and writers rely on: a writer or a list with no message is
/// empty and one with a message is not; `get_encoding` is `encode` into a fresh vector;
/// bytes left after a value, or after a list's last message, are an error naming how many.
#[test]
fn emptiness_encodings_and_trailing_bytes() {
    use crate::codec::{Codec, Reader};
    let (to, from) = (n("to"), n("from"));
    let mut v = Vec::new();
    let mut w = ListWriter::start(&mut v);
    assert!(w.is_empty());
    w.push(&mut v, &to, &from, b"x");
    assert!(!w.is_empty());
    assert!(MessageList::from_messages(&[]).is_empty());
    let m = Message {
        to: to.clone(),
        from: from.clone(),
        payload: Bytes::from_static(b"abc"),
    };
    let list = MessageList::from_messages([&m]);
    assert!(!list.is_empty());
    let mut by_hand = Vec::new();
    list.encode(&mut by_hand);
    assert_eq!(list.get_encoding(), by_hand);
    assert!(by_hand.len() > 12);
    // A reader with bytes left says how many.
    let mut r = Reader::new(Bytes::from(by_hand.clone()));
    assert_eq!(
        r.expect_empty(),
        Err(DecodeError::TrailingBytes(by_hand.len()))
    );
    MessageList::read(&mut r).unwrap();
    assert_eq!(r.expect_empty(), Ok(()));
    // A list's body with three bytes past its last message.
    let mut body = list.get_encoding();
    body.extend_from_slice(&[1, 2, 3]);
    let e = MessageList::read(&mut Reader::new(Bytes::from(body))).unwrap_err();
    assert_eq!(e, DecodeError::TrailingBytes(3));
}
