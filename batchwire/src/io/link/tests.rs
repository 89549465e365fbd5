//! Tests of the TLS transport: writes in pieces, reads appended, garbage refused.

use super::{Link, PIECE, RECORD, TlsConfigs, TlsWrite};
use crate::certs::TlsFiles;
use bytes::BytesMut;
use proptest::prelude::*;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A TLS link pair over loopback with the committed test certificates: (a, b).
pub fn tls_pair() -> (Link, Link) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/certs/main");
    let cfg = |n: &str| TlsConfigs::load(&TlsFiles::in_dir(&dir, n), n).unwrap();
    let (ca, cb) = (cfg("a"), cfg("b"));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        Link::tls(s, &cb, None, deadline).unwrap()
    });
    let a = Link::tls(TcpStream::connect(addr).unwrap(), &ca, Some("b"), deadline).unwrap();
    let b = server.join().unwrap();
    for l in [&a, &b] {
        l.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        l.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    (a, b)
}

/// What one TLS link writes in pieces (slices of every size), the other reads whole
/// and in order, however much each read asks for; a read may take more than a record.
#[test]
fn tls_reads_append_what_was_written_in_any_amounts() {
    let (a, b) = tls_pair();
    let sizes = [
        1usize, 100, 16_383, 16_384, 16_385, 70_000, 300_000, 5, 1_000_000, 9,
    ];
    let data: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            let n = sizes[i % sizes.len()];
            (0..n).map(|j| (i * 7 + j * 13) as u8).collect()
        })
        .collect();
    let want: Vec<u8> = data.concat();
    let total = want.len();
    let writer = std::thread::spawn(move || {
        for chunk in data.chunks(3) {
            let bufs: Vec<&[u8]> = chunk.iter().map(|d| &d[..]).collect();
            a.write_vectored(&bufs, &mut || false).unwrap();
        }
        a
    });
    let asks = [1usize, 7, 100, 16 << 10, 64 << 10, 200 << 10];
    let mut got = BytesMut::new();
    let (mut calls, mut more_than_a_record) = (0, 0);
    while got.len() < total {
        let ask = asks[calls % asks.len()];
        let before = got.len();
        let n = b.read_append(&mut got, ask, true).unwrap();
        assert!(n > 0 && n <= ask, "asked {ask}, got {n}");
        assert_eq!(got.len(), before + n);
        more_than_a_record += usize::from(n > RECORD);
        calls += 1;
    }
    assert_eq!(&got[..], &want[..]);
    assert!(more_than_a_record > 0, "no read took more than one record");
    drop(writer.join().unwrap());
    // The writer's end closed: the end of the stream or an error, and nothing more.
    let mut rest = BytesMut::new();
    let r = b.read_append(&mut rest, 100, true);
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert!(rest.is_empty());
}

/// Records what rustls would be handed, call by call.
#[derive(Default)]
struct Calls(Vec<Vec<u8>>);

impl std::io::Write for Calls {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.push(b.to_vec());
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Feed `sizes` (slices of distinct bytes) through `TlsWrite` and check: the bytes come
/// out whole and in order; a piece is bounded; records are whole but for at most one
/// short call per piece; a slice of a record or more is handed on without gathering.
fn check(sizes: &[usize]) {
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
        .collect();
    let bufs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let total: usize = sizes.iter().sum();
    let mut w = TlsWrite::new(&bufs);
    let mut all = Vec::new();
    let mut pieces = 0;
    loop {
        let mut calls = Calls::default();
        let more = w.feed(&mut calls, PIECE).unwrap();
        pieces += 1;
        let fed: usize = calls.0.iter().map(|c| c.len()).sum();
        assert!(fed < PIECE + RECORD, "a piece of {fed} bytes");
        // rustls cuts what it is handed into records of RECORD bytes: every call but at
        // most one per piece hands it whole records.
        let short = calls.0.iter().filter(|c| c.len() % RECORD != 0).count();
        assert!(short <= 1, "{short} calls with a short record in one piece");
        assert!(calls.0.iter().all(|c| !c.is_empty()));
        all.extend(calls.0.into_iter().flatten());
        if !more {
            break;
        }
        assert!(pieces <= total / RECORD + 2, "no progress");
    }
    let want: Vec<u8> = data.concat();
    assert_eq!(all, want);
    // A write of a window of `total` bytes takes about total / PIECE turns.
    assert!(pieces <= total / PIECE + 1 + usize::from(total == 0));
}

#[test]
fn tls_pieces_cover_everything_in_order() {
    check(&[]);
    check(&[0, 0]);
    check(&[100; 10_000]);
    check(&[
        RECORD - 1,
        1,
        RECORD,
        RECORD + 1,
        3 * PIECE + 7,
        5,
        0,
        PIECE,
    ]);
    check(&[2 << 20]);
}

/// Bytes that are not TLS records after the handshake (written past rustls on the
/// socket, after some real records): the reader hands on real plaintext only (all of
/// it here, though a read that decrypted the last real record in the same call as it
/// met the garbage may drop that call's part: the connection closes either way), then
/// an error.
#[test]
fn tls_garbage_after_the_handshake_is_an_error_not_data() {
    use std::io::Write;
    let (a, b) = tls_pair();
    a.write_all(&[7u8; 40_000]).unwrap();
    (&mut a.sock())
        .write_all(&[0x17, 0x03, 0x03, 0x00, 0x20])
        .unwrap();
    (&mut a.sock()).write_all(&[0xAB; 32]).unwrap();
    let mut got = BytesMut::new();
    let err = loop {
        match b.read_append(&mut got, 64 << 10, true) {
            Ok(0) => panic!("end of stream instead of an error"),
            Ok(_) => assert!(got.len() <= 40_000),
            Err(e) => break e,
        }
    };
    assert!(got.iter().all(|&b| b == 7), "garbage handed on as data");
    // And so does every read after it (nothing past the refused record is handed on).
    let before = got.len();
    assert!(b.read_append(&mut got, 64 << 10, true).is_err());
    assert_eq!(got.len(), before);
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn tls_pieces_any_slices(sizes in proptest::collection::vec(
        prop_oneof![0usize..200, 200usize..20_000, 20_000usize..300_000], 0..24)) {
        check(&sizes);
    }
}

/// Writes that do not wait, over TLS, into a socket the reader does not empty: each takes
/// at most a piece of plaintext, records the socket refused wait in the link (it says so)
/// and go out first with the next write of either kind, and once the socket takes none, a
/// write without waiting takes no plaintext either. The reader gets every byte once, in
/// order, when it reads at last.
#[cfg(unix)]
#[test]
fn tls_writes_without_waiting_keep_what_the_socket_refused_in_order() {
    let (a, b) = tls_pair();
    assert!(a.writes_without_waiting());
    let mut want = Vec::new();
    let (mut refused, mut full) = (false, false);
    for i in 0..4000usize {
        let data: Vec<u8> = (0..(1 + i % 3) * 20_000)
            .map(|j| (i * 31 + j) as u8)
            .collect();
        let n = a
            .try_write_vectored(&[&data[..10], &data[10..]])
            .unwrap()
            .unwrap();
        assert!(n <= PIECE, "took {n} bytes in one write without waiting");
        want.extend_from_slice(&data[..n]);
        refused |= a.tls_pending();
        if n == 0 {
            full = true;
            break;
        }
    }
    assert!(
        refused && full,
        "the socket never filled: refused {refused}, full {full}"
    );
    // An ordinary write now: what waits goes first, then this.
    let tail: Vec<u8> = (0..50_000).map(|j| (j * 7) as u8).collect();
    want.extend_from_slice(&tail);
    let total = want.len();
    let reader = std::thread::spawn(move || {
        let mut got = BytesMut::new();
        while got.len() < total {
            let n = b.read_append(&mut got, 256 << 10, true).unwrap();
            assert!(n > 0);
        }
        got
    });
    a.write_vectored(&[&tail], &mut || true).unwrap();
    assert!(!a.tls_pending(), "sent");
    let got = reader.join().unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got[..] == want[..], "the bytes differ");
}

/// A write over TLS that gives up part way (the socket full, `go_on` says stop, as at
/// shutdown) keeps what it did not write: the next write goes on from there, so the
/// reader decrypts one unbroken stream (a repeated or skipped byte of a record fails its
/// check): what was taken without waiting, then a prefix of the write that gave up, then
/// the last write, whole.
#[cfg(unix)]
#[test]
fn tls_a_write_that_gives_up_part_way_leaves_the_stream_whole() {
    let (a, b) = tls_pair();
    a.set_write_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut taken = Vec::new();
    for i in 0..4000usize {
        let data: Vec<u8> = (0..300_000).map(|j| (i * 17 + j) as u8).collect();
        let n = a.try_write_vectored(&[&data]).unwrap().unwrap();
        taken.extend_from_slice(&data[..n]);
        if n == 0 {
            break;
        }
    }
    assert!(a.tls_pending(), "the socket never filled");
    // Some room, less than what waits: the next write gets part of it out, then gives up.
    let mut got = BytesMut::new();
    while got.len() < 1 << 20 {
        b.read_append(&mut got, 64 << 10, true).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    let given_up: Vec<u8> = (0..16_000_000).map(|j| (j * 3) as u8).collect();
    assert!(a.write_vectored(&[&given_up], &mut || false).is_err());
    let last: Vec<u8> = (0..5_000).map(|j| (j * 11) as u8).collect();
    let (min, end) = (taken.len() + last.len(), last.clone());
    let reader = std::thread::spawn(move || {
        let mut got = got;
        while got.len() < min || !got.ends_with(&end) {
            b.read_append(&mut got, 256 << 10, true)?;
        }
        Ok::<_, std::io::Error>(got)
    });
    a.write_vectored(&[&last], &mut || true).unwrap();
    let got = match reader.join().unwrap() {
        Ok(g) => g,
        Err(e) => panic!("the stream broke: {e}"),
    };
    assert!(got.starts_with(&taken), "what was taken without waiting");
    let middle = &got[taken.len()..got.len() - last.len()];
    assert!(
        given_up.starts_with(middle),
        "{} bytes of the write that gave up, not a prefix of it",
        middle.len()
    );
}

/// A read without waiting takes what is at hand, and says `WouldBlock` once nothing is
/// (the reader looks so after a read that took all it asked for, to acknowledge at once
/// when a stream stopped exactly there).
#[test]
fn tls_reads_without_waiting_take_what_is_at_hand() {
    let (a, b) = tls_pair();
    let mut got = BytesMut::new();
    let r = b.read_append(&mut got, 1000, false);
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    a.write_all(&vec![3u8; 100_000]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 100_000 {
        assert!(Instant::now() < deadline);
        let left = 100_000 - got.len();
        match b.read_append(&mut got, left, false) {
            Ok(n) => assert!(n > 0 && n <= left),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&got[..], &vec![3u8; 100_000][..]);
    let r = b.read_append(&mut got, 1000, false);
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
}

/// A certificate (self-signed: only its names matter here) with these subject alternative
/// names.
fn cert_with(sans: Vec<rcgen::SanType>) -> rustls::pki_types::CertificateDer<'static> {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.subject_alt_names = sans;
    let key = rcgen::KeyPair::generate().unwrap();
    p.self_signed(&key).unwrap().der().clone()
}

fn dns(n: &str) -> rcgen::SanType {
    rcgen::SanType::DnsName(n.try_into().unwrap())
}

/// How a certificate's names are matched to a node name: exactly. webpki alone would take
/// a certificate for "b" as naming "B", "*.c" as naming "a.c" and an IP address as naming
/// a node called by it; node names are exact bytes, so none of those name a node.
#[test]
fn a_certificate_names_only_the_nodes_spelt_exactly_as_in_it() {
    use crate::certs::cert_names;
    let both = cert_with(vec![dns("a"), dns("b")]);
    assert_eq!(cert_names(&both, "a"), Ok(()));
    assert_eq!(cert_names(&both, "b"), Ok(()));
    let e = cert_names(&both, "c").unwrap_err();
    assert!(
        e.contains(r#"does not name "c" (it names ["a", "b"]"#),
        "{e}"
    );
    // Case: "b" and "B" are two nodes.
    let lower = cert_with(vec![dns("node-b.cluster")]);
    assert_eq!(cert_names(&lower, "node-b.cluster"), Ok(()));
    assert!(cert_names(&lower, "NODE-B.cluster").is_err());
    assert!(cert_names(&cert_with(vec![dns("B")]), "b").is_err());
    // Wildcards name no node, not even one spelt like the wildcard.
    let wild = cert_with(vec![dns("*.cluster")]);
    assert!(cert_names(&wild, "a.cluster").is_err());
    assert!(cert_names(&wild, "*.cluster").is_err());
    // IP addresses are not node names, even when a node is called by one.
    let ip = cert_with(vec![rcgen::SanType::IpAddress(
        "127.0.0.1".parse().unwrap(),
    )]);
    let e = cert_names(&ip, "127.0.0.1").unwrap_err();
    assert!(e.contains("it names []"), "{e}");
    // A node name that is no DNS name cannot be in a certificate: said so.
    let e = cert_names(&both, "not a dns name").unwrap_err();
    assert!(e.contains("is not a DNS name"), "{e}");
    // The list shown is bounded (the certificate is the peer's).
    let many = cert_with((0..50).map(|i| dns(&format!("n{i}"))).collect());
    let e = cert_names(&many, "x").unwrap_err();
    assert!(e.contains("and 46 more"), "{e}");
    assert!(e.len() < 300, "{e}");
    // Not a certificate at all.
    let junk = rustls::pki_types::CertificateDer::from(vec![0u8; 10]);
    assert!(cert_names(&junk, "a").unwrap_err().contains("unreadable"));
}

/// Bytes the TLS link's ciphertext buffer holds allocated (0 once let go).
fn cipher_capacity(l: &Link) -> usize {
    match l {
        Link::Tls { cipher, .. } => Link::lock(cipher).buf.capacity(),
        Link::Plain(_) => 0,
    }
}

/// A resting link lets go of its ciphertext buffer only once rustls took all of it:
/// asked between every read, however small, nothing read is lost or reordered, and the
/// next read makes a new buffer.
#[test]
fn tls_a_resting_link_lets_go_of_its_read_buffer_only_when_rustls_took_it_all() {
    let (a, b) = tls_pair();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        a.write_all(&sent).unwrap();
        a
    });
    let asks = [1usize, 300, 5_000, 20_000];
    let mut got = BytesMut::new();
    let (mut kept, mut let_go) = (0, 0);
    for i in 0.. {
        assert!(i < 1_000_000, "the data did not arrive");
        if got.len() == data.len() {
            break;
        }
        let ask = asks[i % asks.len()].min(data.len() - got.len());
        b.read_append(&mut got, ask, true).unwrap();
        if b.release_read_buffer() {
            let_go += 1;
            assert_eq!(cipher_capacity(&b), 0);
        } else {
            kept += 1;
        }
    }
    assert_eq!(&got[..], &data[..]);
    assert!(kept > 0, "no read left ciphertext for the next one");
    assert!(let_go > 0, "the buffer was never let go");
    // Let go with nothing left in it; a later read makes a new one.
    let a = writer.join().unwrap();
    a.write_all(b"after").unwrap();
    let mut more = BytesMut::new();
    while more.len() < 5 {
        let left = 5 - more.len();
        b.read_append(&mut more, left, true).unwrap();
    }
    assert_eq!(&more[..], b"after");
    assert!(b.release_read_buffer());
    assert!(!b.release_read_buffer(), "nothing left to let go");
}
