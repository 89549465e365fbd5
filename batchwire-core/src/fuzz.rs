//! Entry points for fuzzing (see `fuzz/`), also run over a corpus by `tests/fuzz_corpus.rs`
//! so every `cargo test` covers them. They feed arbitrary bytes to the code that reads what
//! a peer sends; the only failure is a panic (or, under a fuzzer, a hang or huge allocation).

use bytes::{Bytes, BytesMut};

use super::codec::{Name, NameMap};
use super::credit::{RecvCredit, SendCredit};
use super::frame::{self, Fragment, Frame};
use super::handshake::{Handshake, HandshakeConfig, Role};
use super::outbox::{Batch, Outbox};
use super::reassembly::{MAX_PARTIAL, Reassembly};
use super::reliable::{RecvWindow, SendWindow};
use super::session::ConnId;

/// The limit the targets decode with: small, so a fuzzer finds the limit checks.
const MAX_FRAME: usize = 64 << 10;

/// Decode frames from `data` as a connection reader would, walking every message list the
/// way the reader and the receiving mailbox do, and applying ACK and RESUME values to a send
/// window that holds a few messages; pieces go to reassembly, messages and pieces are
/// charged to the receiver's credit, CREDIT and SYNC are applied to a sender's credit.
/// Violations are errors, never panics, and never move the windows backwards; reassembly
/// never holds more than its bound of messages, nor more bytes than were fed to it.
pub fn frames(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let mut rw = RecvWindow::default();
    let mut sw = SendWindow::default();
    // Small frames, and payloads of 4 bytes or more by reference, so that resumes trim
    // frames with payloads held by reference too.
    let mut ob = Outbox::new(64).by_reference(4);
    for i in 0..20u8 {
        ob.push_bytes(
            0,
            &Name::from_static("m"),
            &Name::from_static(""),
            &Bytes::from(vec![i; 1 + i as usize % 8]),
            None,
        );
    }
    let mut reas = Reassembly::default();
    let mut recv_credit = RecvCredit::new(64 << 10, 1 << 20);
    let mut send_credit = SendCredit::default();
    let mut fed = 0usize;
    let mut batch = Batch::default();
    ob.take(usize::MAX, usize::MAX, &mut batch, None);
    sw.hold_batch(&mut batch);
    sw.unwritten();
    let conn = ConnId::new(1);
    let mut pieces = 0u32;
    // Each iteration consumes at least one frame header, so this ends.
    loop {
        // A piece's fields read before its data has all come agree with the whole frame
        // (or are refused exactly when the whole frame is).
        if let Ok(Some(n)) = frame::check(&buf, MAX_FRAME) {
            let head = frame::fragment_head(&buf[..n - 1], MAX_FRAME);
            let whole = frame::decode(&mut BytesMut::from(&buf[..n]), MAX_FRAME);
            match (head, whole) {
                (Ok(Some(h)), Ok(Some(Frame::Fragment(f)))) => {
                    assert_eq!(
                        h.piece,
                        Fragment {
                            data: Bytes::new(),
                            ..f.clone()
                        }
                    );
                    assert_eq!((h.data_len, h.frame_len()), (f.data.len(), n));
                }
                (Ok(Some(h)), other) => panic!("fields {h:?} of a frame that is {other:?}"),
                (Err(e), Ok(f)) => panic!("fields refused ({e}) of a frame that is {f:?}"),
                _ => {}
            }
        }
        let Ok(Some(f)) = frame::decode(&mut buf, MAX_FRAME) else {
            break;
        };
        let (next, base) = (rw.next(), sw.base());
        match f {
            Frame::Messages(list) => {
                let skip = rw.accept(list.first_seq, list.len() as u32).unwrap_or(0);
                let list = list.skip(skip);
                for (to, range, n) in list.runs() {
                    assert!(!to.is_empty() || n > 0);
                    let mut data = list.body().slice(range);
                    while frame::next_message(&mut data).is_some() {}
                }
                for m in list.iter() {
                    let _ = (m.to.as_str(), m.from.as_str(), m.payload.len());
                    let _ = recv_credit.charge(&m.to, m.payload.len() as u64);
                }
                let _ = recv_credit.take_grants();
            }
            // As the session does: a piece is numbered like a message.
            Frame::Fragment(f) if rw.accept(f.seq, 1) == Ok(0) => {
                let keep = reas.keeps(&f, || f.total <= 1 << 20);
                if keep && recv_credit.charge(&f.to, f.charge()).is_err() {
                    continue;
                }
                fed += f.data.len();
                // Every other piece as a reader that reads its data in place, in two parts
                // (if reassembly has room for it there; else as read whole).
                pieces += 1;
                let head = frame::FragmentHead {
                    piece: Fragment {
                        data: Bytes::new(),
                        ..f.clone()
                    },
                    head_len: 0,
                    data_len: f.data.len(),
                };
                let cut = f.data.len() / 2;
                let added = match reas.direct_room(&head, 0, conn, || keep) {
                    Some((dst, left)) if pieces.is_multiple_of(2) => {
                        assert_eq!(left, f.data.len());
                        dst.extend_from_slice(&f.data[..cut]);
                        let (dst, left) =
                            reas.direct_room(&head, cut, conn, || keep).expect("room");
                        assert_eq!(left, f.data.len() - cut);
                        dst.extend_from_slice(&f.data[cut..]);
                        reas.add_direct(&head, conn)
                    }
                    _ => reas.add(&f, keep),
                };
                if added.is_err() {
                    continue;
                }
                assert!(reas.len() <= MAX_PARTIAL);
                assert!(reas.bytes() <= fed, "reassembly holds more than it was fed");
            }
            Frame::Credit(c) => {
                for (to, n) in &c.grants {
                    send_credit.grant(to.as_bytes(), *n);
                }
            }
            Frame::Sync(sy) => {
                let mut totals = NameMap::default();
                for (to, n) in sy.held {
                    let e = totals.entry(to).or_insert(0u64);
                    *e = e.saturating_add(n);
                }
                send_credit.sync(sy.window, sy.max_payload, &totals);
                let _ = send_credit.admits(b"m");
            }
            Frame::Ack(n) => {
                let _ = sw.ack(n);
            }
            Frame::Resume(r) if sw.rewind(r.next).is_ok() => rw.resume(r.base),
            _ => {}
        }
        assert!(rw.next() >= next, "the receive window went backwards");
        assert!(sw.base() >= base && sw.base() <= sw.next_seq());
        // What a (new) connection would be given is all that is held, byte for byte.
        let u = sw.unwritten();
        assert_eq!(u.wire_len(), sw.bytes());
        assert_eq!(u.messages, sw.messages());
    }
    // A recount walks every message held, in place; a failure hands every one of them back.
    let (mut counted, mut charged) = (0u64, 0u64);
    sw.charges_from(sw.base(), |_, c| {
        counted += 1;
        charged += c;
    });
    assert_eq!(counted, sw.messages());
    assert!(charged as usize <= sw.bytes());
    let held = sw.messages();
    assert_eq!(sw.take_failed(false).len() as u64, held);
}

/// Feed arbitrary bytes to a peer machine ([`crate::peer::Peer`]) as its connection's
/// reader would, in chunks the input chooses, with the writer's rounds, deliveries taken,
/// and time passing in between, under the bundler the first byte picks. What breaks the
/// protocol is an error, after which the connection is replaced (as the IO layer closes
/// it and the peer reconnects); nothing panics, and every delivery's charge is what the
/// receive credit holds until it is taken.
pub fn peer(data: &[u8]) {
    use crate::peer::{Peer, PeerConfig};
    use crate::session::SessionConfig;
    use std::time::{Duration, Instant};
    let cfg = PeerConfig {
        session: SessionConfig {
            unacked_bytes: 64 << 10,
            ..SessionConfig::default()
        },
        piece_bytes: 1024,
        frame_bytes: 4 << 10,
        mailbox_bytes: 64 << 10,
        max_payload: 1 << 20,
        max_frame: MAX_FRAME,
    };
    use crate::bundler::{BundlerConfig, BundlerKind};
    // The first byte picks the bundler that drains the ordinary queue.
    let kinds = [
        BundlerKind::Natural,
        BundlerKind::None,
        BundlerKind::PerDestination,
        BundlerKind::TransferQueue,
        BundlerKind::Linger,
    ];
    let kind = kinds[data.first().map_or(0, |b| *b as usize % kinds.len())];
    let bundler = BundlerConfig {
        kind,
        max_size: 4 << 10,
        max_delay: Duration::from_millis(2),
    }
    .build();
    let t0 = Instant::now();
    let mut now = t0;
    let mut p = Peer::with_bundler(cfg, bundler, t0);
    let connect = |p: &mut Peer, now: Instant| {
        p.handle_connect(now, 7);
        let _ = p.handle_resume(now, frame::Resume::FRESH);
    };
    connect(&mut p, now);
    // Something of ours in flight, so that ACKs and RESUMEs have something to act on.
    for i in 0..8u8 {
        let _ = p.send(
            now,
            &Name::from_static("m"),
            &Name::from_static("s"),
            Bytes::from(vec![i; 1 + i as usize * 300]),
            i % 3 == 0,
        );
    }
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let take = (rest[0] as usize % 64 + 1).min(rest.len());
        let (chunk, more) = rest.split_at(take);
        rest = more;
        if p.handle_read(now, chunk, |to| to.as_bytes().first() == Some(&b'm'))
            .is_err()
        {
            p.handle_disconnect(now);
            connect(&mut p, now);
        }
        while let Some(d) = p.poll_delivery() {
            assert!(d.to.as_bytes().first() == Some(&b'm'));
            assert!(p.recv_credit().held(d.to.as_bytes()) >= d.charge);
            p.handle_taken(d.to.as_bytes(), d.charge);
        }
        out.clear();
        p.poll_transmit(now, &mut out, 16 << 10);
        now += Duration::from_millis(chunk[0] as u64 % 50);
        p.handle_timeout(now);
        while p.poll_event().is_some() {}
    }
}

/// Feed the frames in `data` to a handshake in progress, as an unauthenticated peer could.
pub fn handshake(data: &[u8]) {
    let cfg = HandshakeConfig {
        name: Name::from_static("fuzzed"),
        incarnation: 1,
        secret: std::sync::Arc::from(&b"secret"[..]),
        role: Role::Accept {
            refuse: std::sync::Arc::from([Name::from_static("later")]),
        },
    };
    let mut hs = Handshake::new(cfg, [7; 16]);
    while hs.poll_transmit().is_some() {}
    let mut buf = BytesMut::from(data);
    while let Ok(Some(f)) = frame::decode(&mut buf, 4096) {
        let done = hs.handle(f);
        while hs.poll_transmit().is_some() {}
        if done.is_err() || hs.is_done() {
            break;
        }
    }
}

/// Feed a member "a" of a two-member cluster (it knows "b") what `data` describes, as an
/// authenticated sender could send it: MEMBER bodies from "b" and from a stranger "c",
/// clock steps with their timers, and the transport's unreachable hint. The view stays
/// within its bound, each input queues a bounded number of packets, and nothing panics.
pub fn membership(data: &[u8]) {
    use super::membership::{Membership, MembershipConfig};
    use std::time::{Duration, Instant};
    let id = fuzz_member;
    let cfg = MembershipConfig {
        max_members: 8,
        ..MembershipConfig::default()
    };
    let mut now = Instant::now();
    let (Ok(mut a), Ok(mut b)) = (
        Membership::new(id("a", 1), cfg.clone(), 1, now),
        Membership::new(id("b", 2), cfg, 2, now),
    ) else {
        return;
    };
    // b announces itself to a; a answers.
    b.handle_join(now, id("a", 1));
    while let Some((_, p)) = b.poll_transmit() {
        let _ = a.handle_frame(now, &Name::from_static("b"), &p);
    }
    while a.poll_transmit().is_some() {}
    let (from_b, from_c) = (Name::from_static("b"), Name::from_static("c"));
    // Frames whose op has the top bit set wait and go in as one batch (`handle_frames`)
    // before the next other input.
    let mut batch: Vec<(&Name, &[u8])> = Vec::new();
    // The view as the IO layer keeps it, from the deltas: always the machine's view.
    let mut mirror = std::collections::HashMap::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if op % 4 > 1 || rest.is_empty() {
            a.handle_frames(now, batch.drain(..), |_, _| {});
        }
        match op % 4 {
            0 | 1 => {
                let n = rest.first().map_or(0, |&n| n as usize * 8);
                let body = &rest[1.min(rest.len())..(1 + n).min(rest.len())];
                rest = &rest[(1 + n).min(rest.len())..];
                let from = if op % 4 == 0 { &from_b } else { &from_c };
                if op & 0x80 != 0 && !rest.is_empty() {
                    batch.push((from, body));
                    continue;
                }
                let _ = a.handle_frame(now, from, body);
            }
            2 => {
                let step = rest.first().map_or(0, |&s| s as u64 * 20);
                rest = &rest[1.min(rest.len())..];
                now += Duration::from_millis(step);
                a.handle_timeout(now);
            }
            _ => a.handle_unreachable(now, b"b"),
        }
        let mut sent = 0;
        while a.poll_transmit().is_some() {
            sent += 1;
        }
        assert!(sent <= 64, "{sent} packets for one input");
        while a.poll_event().is_some() {}
        assert!(a.members().len() <= 8, "the view outgrew its bound");
        // What SWIM lists live, the view says (after packets only the members they named
        // are looked at).
        if let Some(e) = a.view_disagrees() {
            panic!("{e}");
        }
        match a.take_view_delta() {
            super::membership::ViewDelta::Changed(v) => {
                for e in v {
                    mirror.insert(e.0.name.clone(), e);
                }
            }
            super::membership::ViewDelta::Whole => {
                mirror = a
                    .view_unsorted()
                    .into_iter()
                    .map(|e| (e.0.name.clone(), e))
                    .collect();
            }
            _ => {}
        }
        let mut kept: Vec<_> = mirror.values().cloned().collect();
        kept.sort_by(|x, y| x.0.name.cmp(&y.0.name));
        assert_eq!(kept, a.members(), "the view's deltas missed a change");
    }
    a.handle_frames(now, batch.drain(..), |_, _| {});
}

/// Inputs for [`membership`] made of real packets: b's announce, a ping, a leave notice,
/// clock steps.
pub fn membership_seeds() -> Vec<Vec<u8>> {
    use super::membership::{Membership, MembershipConfig};
    use std::time::Instant;
    let id = fuzz_member;
    let now = Instant::now();
    let Ok(mut b) = Membership::new(id("b", 2), MembershipConfig::default(), 2, now) else {
        return Vec::new();
    };
    b.handle_join(now, id("a", 1));
    let mut packets: Vec<Vec<u8>> = Vec::new();
    while let Some((_, p)) = b.poll_transmit() {
        packets.push(p.to_vec());
    }
    let mut seeds = Vec::new();
    for p in &packets {
        // op 0 (from b), length in units of 8 (padded with zeros), the body.
        let n = p.len().div_ceil(8);
        let mut s = vec![0u8, n as u8];
        s.extend_from_slice(p);
        s.resize(2 + n * 8, 0);
        s.extend_from_slice(&[2, 60, 2, 200, 3, 2, 255]);
        seeds.push(s);
    }
    seeds.push(vec![0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 2, 100]);
    seeds.push(vec![3, 2, 200, 2, 200, 2, 200]);
    // b's announce, then a comparing ask with a filter (a zero digest, salt and filter:
    // 40 bytes), asked again after a step.
    if let Some(first) = seeds.first().cloned() {
        let mut s = first;
        let mut ask = vec![0u8, 5, 2];
        ask.resize(3 + 39, 0);
        s.extend_from_slice(&ask);
        s.extend_from_slice(&[2, 60]);
        s.extend_from_slice(&ask);
        seeds.push(s);
    }
    seeds
}

/// Member `name` of the membership targets, listening on 127.0.0.1:`port`.
fn fuzz_member(name: &'static str, port: u16) -> super::membership::MemberId {
    super::membership::MemberId {
        name: Name::from_static(name),
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        started: 1,
        bump: 0,
    }
}

/// A membership datagram as the receiver's reader takes it: open it (for member "a", boot 5),
/// and if it opens, check it against the replay guard twice (the second must be a
/// replay). Whatever opens must also seal back to a datagram that opens to the same body.
pub fn datagram(data: &[u8]) {
    use super::membership::datagram::{DatagramKey, ReplayGuard, Sealer, open};
    let key = DatagramKey::from_secret(b"fuzz secret");
    let mut guard = ReplayGuard::new(4);
    if let Ok(d) = open(&key, b"a", 5, data) {
        assert!(guard.check(&d).is_ok(), "a first datagram is new");
        assert!(guard.check(&d).is_err(), "the same again is a replay");
    }
    // Any body up to the largest seals and opens back.
    let body = &data[..data.len().min(1 + super::membership::MAX_PACKET)];
    let mut s = Sealer::new(&key, Name::from_static("b"), 7);
    let sealed = s.seal(b"a", 5, body);
    let back = open(&key, b"a", 5, &sealed).expect("a sealed datagram opens");
    assert_eq!(back.body, body);
    assert!(
        open(&key, b"c", 5, &sealed).is_err(),
        "not for another member"
    );
    assert!(
        open(&key, b"a", 6, &sealed).is_err(),
        "not for another boot"
    );
}

/// Datagrams for the `datagram` target: sealed ones (that open), and the same cut and
/// damaged by the corpus test.
pub fn datagram_seeds() -> Vec<Vec<u8>> {
    use super::membership::datagram::{DatagramKey, Sealer};
    let key = DatagramKey::from_secret(b"fuzz secret");
    let mut s = Sealer::new(&key, Name::from_static("b"), 7);
    let mut out: Vec<Vec<u8>> = membership_seeds()
        .iter()
        .map(|p| s.seal(b"a", 5, p))
        .collect();
    out.push(s.seal(b"a", 5, &[1]));
    out.push(s.seal(b"a", 5, &[]));
    out
}
