//! Tests of the parent module.

use super::*;
use bytes::BytesMut;
use proptest::prelude::*;

const MAX: usize = 1 << 20;

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn sample_frames() -> Vec<Frame> {
    let msgs = [
        Message {
            to: n("inbox"),
            from: n("client"),
            payload: Bytes::from_static(b"hello"),
        },
        Message {
            to: n("x"),
            from: n(""),
            payload: Bytes::new(),
        },
    ];
    vec![
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: 42,
            nonce: [7; 16],
            name: n("node-a"),
        }),
        Frame::Auth(Auth { proof: [9; 32] }),
        Frame::Refuse(Refuse {
            code: RefuseCode::Secret,
            reason: "wrong cluster secret".into(),
        }),
        Frame::Messages(MessageList::from_messages(&msgs)),
        Frame::Undeliverable(Undeliverable {
            count: 3,
            to: n("nobody"),
            from: n("me"),
        }),
        Frame::Goodbye,
        Frame::Ack(77),
        Frame::Resume(Resume {
            next: 5,
            base: 3,
            keep: 4,
        }),
        Frame::Fragment(Fragment {
            seq: 9,
            id: 7,
            total: 10,
            offset: 4,
            to: n("inbox"),
            from: n("big"),
            data: Bytes::from_static(b"abcdef"),
        }),
        Frame::Credit(Credit {
            grants: vec![(n("inbox"), 4096), (n("x"), 1)],
        }),
        Frame::Sync(Sync {
            next: 12,
            window: 4 << 20,
            max_payload: 1 << 30,
            held: vec![(n("inbox"), 100)],
        }),
    ]
}

#[test]
fn a_fragment_head_and_its_data_make_the_frame() {
    let f = Fragment {
        seq: 3,
        id: 3,
        total: 5,
        offset: 0,
        to: n("m"),
        from: n("s"),
        data: Bytes::from_static(b"hello"),
    };
    let mut v = Vec::new();
    encode_fragment_head(&mut v, 3, 3, 5, 0, &f.to, &f.from, 5);
    v.extend_from_slice(&f.data);
    let mut buf = BytesMut::from(&v[..]);
    assert_eq!(
        decode(&mut buf, MAX).unwrap(),
        Some(Frame::Fragment(f.clone()))
    );
    assert!(f.is_first() && f.is_last());
    assert_eq!(f.charge() as usize, message_len(&f.to, &f.from, 5));
}

#[test]
fn a_fragment_head_is_read_from_any_prefix_that_holds_its_fields() {
    let f = Fragment {
        seq: 9,
        id: 4,
        total: 100,
        offset: 40,
        to: n("inbox"),
        from: n("sender"),
        data: Bytes::from_static(b"0123456789"),
    };
    let mut v = Vec::new();
    Frame::Fragment(f.clone()).encode(&mut v);
    let head_len = v.len() - f.data.len();
    for p in 0..=v.len() {
        let got = fragment_head(&v[..p], MAX).unwrap();
        if p < head_len || p == v.len() {
            assert_eq!(got, None, "prefix {p}");
            continue;
        }
        let h = got.unwrap_or_else(|| panic!("prefix {p}"));
        assert_eq!(h.head_len, head_len);
        assert_eq!(h.data_len, 10);
        assert_eq!(h.frame_len(), v.len());
        assert_eq!(
            h.piece,
            Fragment {
                data: Bytes::new(),
                ..f.clone()
            }
        );
        assert_eq!(h.charge(), f.charge());
        assert!(!h.is_last());
    }
    // Another kind, or a whole frame: not its business.
    let mut ack = Vec::new();
    Frame::Ack(5).encode(&mut ack);
    assert_eq!(fragment_head(&ack[..ack.len() - 1], MAX), Ok(None));
}

#[test]
fn a_fragment_head_is_refused_as_decode_refuses_the_whole_frame() {
    let frame = |seq, id, total, offset, data: &'static [u8]| {
        let mut v = Vec::new();
        Frame::Fragment(Fragment {
            seq,
            id,
            total,
            offset,
            to: n("m"),
            from: n("s"),
            data: Bytes::from_static(data),
        })
        .encode(&mut v);
        v
    };
    for v in [
        frame(2, 1, 3, 2, b"ab"),     // past the end of the message
        frame(2, 2, 9, 1, b"ab"),     // a later piece that is its own id
        frame(2, 5, 9, 1, b"ab"),     // an id from the future
        frame(1, 1, 9, 0, b"abcdef"), // fine
    ] {
        let whole = decode(&mut BytesMut::from(&v[..]), MAX).map(|_| ());
        let head = fragment_head(&v[..v.len() - 1], MAX).map(|_| ());
        assert_eq!(head, whole);
    }
    // A length past the limit is refused before anything else.
    let mut v = frame(1, 1, 9, 0, b"abcdef");
    v[..4].copy_from_slice(&(MAX as u32 + 1).to_le_bytes());
    assert!(matches!(
        fragment_head(&v, MAX),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn pieces_charge_exactly_what_the_whole_message_would() {
    let (to, from) = (n("inbox"), n("sender"));
    let total = 1000u64;
    let mut sum = 0;
    for off in (0..total).step_by(300) {
        let len = (total - off).min(300) as usize;
        sum += fragment_charge(off, len, &to, &from);
    }
    assert_eq!(sum as usize, message_len(&to, &from, total as usize));
}

#[test]
fn fragments_that_do_not_add_up_are_refused() {
    let bad = |seq, id, total, offset, data: &'static [u8]| {
        let f = Fragment {
            seq,
            id,
            total,
            offset,
            to: n("m"),
            from: n(""),
            data: Bytes::from_static(data),
        };
        let mut v = Vec::new();
        Frame::Fragment(f).encode(&mut v);
        decode(&mut BytesMut::from(&v[..]), MAX)
    };
    assert!(bad(1, 1, 3, 0, b"abc").is_ok());
    // Past the end of the message; offset overflow.
    assert!(bad(1, 1, 2, 0, b"abc").is_err());
    assert!(bad(2, 1, 3, u64::MAX, b"a").is_err());
    // A later piece that is its own id, a first piece that is not, an id from the future.
    assert!(bad(2, 2, 3, 1, b"a").is_err());
    assert!(bad(2, 1, 3, 0, b"a").is_err());
    assert!(bad(2, 5, 9, 1, b"a").is_err());
    // An empty piece of a non-empty message (it would make no progress).
    assert!(bad(2, 1, 3, 1, b"").is_err());
}

#[test]
fn credit_entries_are_bounded() {
    let mut v = Vec::new();
    let start = crate::header::begin(&mut v, crate::header::KIND_CREDIT);
    v.extend_from_slice(&((MAX_CREDIT_ENTRIES + 1) as u16).to_le_bytes());
    crate::header::finish(&mut v, start);
    assert!(matches!(
        decode(&mut BytesMut::from(&v[..]), MAX),
        Err(FrameError::Malformed { kind: "CREDIT", .. })
    ));
}

#[test]
fn every_frame_round_trips() {
    for f in sample_frames() {
        let mut v = Vec::new();
        f.encode(&mut v);
        let mut buf = BytesMut::from(&v[..]);
        assert_eq!(decode(&mut buf, MAX).unwrap(), Some(f));
        assert!(buf.is_empty());
    }
}

#[test]
fn every_truncation_is_incomplete_not_an_error() {
    for f in sample_frames() {
        let mut v = Vec::new();
        f.encode(&mut v);
        for cut in 0..v.len() {
            let mut buf = BytesMut::from(&v[..cut]);
            assert_eq!(decode(&mut buf, MAX), Ok(None), "{f:?} cut at {cut}");
            assert_eq!(buf.len(), cut, "an incomplete frame consumes nothing");
        }
    }
}

#[test]
fn huge_length_is_refused_from_the_header_alone() {
    let buf = [0xff, 0xff, 0xff, 0x7f];
    assert_eq!(
        check(&buf, MAX),
        Err(FrameError::TooLarge {
            len: 0x7fff_ffff,
            max: MAX
        })
    );
    assert_eq!(check(&[0, 0, 0, 0], MAX), Err(FrameError::Empty));
}

#[test]
fn garbled_frames_are_typed_errors() {
    // Unknown kind.
    assert_eq!(
        decode(&mut BytesMut::from(&[1, 0, 0, 0, 99][..]), MAX),
        Err(FrameError::UnknownKind(99))
    );
    // Hello with the wrong magic.
    let mut v = Vec::new();
    Frame::Hello(Hello {
        version: 1,
        incarnation: 1,
        nonce: [0; 16],
        name: n("a"),
    })
    .encode(&mut v);
    v[5] = b'X';
    assert!(matches!(
        decode(&mut BytesMut::from(&v[..]), MAX),
        Err(FrameError::Malformed { kind: "HELLO", .. })
    ));
    // A message list whose count promises more messages than it holds.
    let mut v = Vec::new();
    Frame::Messages(MessageList::from_messages(&[])).encode(&mut v);
    v[5] = 1;
    assert!(matches!(
        decode(&mut BytesMut::from(&v[..]), MAX),
        Err(FrameError::Malformed {
            kind: "MESSAGES",
            ..
        })
    ));
}

mod lists;
