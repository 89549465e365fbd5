use super::*;
use crate::io::link::Link;
use crate::io::peer::testing;
use batchwire_core::frame::Message;
use batchwire_core::idle::IdleStrategy;
use batchwire_core::session::SessionConfig;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Decode the frames the writer would send for the flow.
fn flow_output(peer: &Peer) -> Vec<Frame> {
    let mut out = Vec::new();
    let on = peer
        .session(|s, _| s.current())
        .expect("a current connection");
    peer.flow.take_output(on, &mut out);
    let mut b = BytesMut::from(&out[..]);
    std::iter::from_fn(|| frame::decode(&mut b, 1 << 20).unwrap()).collect()
}

#[test]
fn a_reader_never_waits_for_a_full_mailbox_and_credit_goes_back_as_it_is_read() {
    // A mailbox of 10 bytes.
    let mut rig = Rig::with_capacity(10);
    let (peer, mb) = (rig.peer.clone(), rig.mb.clone());
    let name = Name::from_static("inbox");
    // Three frames of one message each, and one piece of a message in two pieces:
    // the mailbox is full after the first, and all of it is handed over at once.
    let mut out = Vec::new();
    for seq in 0..3u64 {
        let mut list = MessageList::from_messages(&[Message {
            to: name.clone(),
            from: Name::from_static("x"),
            payload: Bytes::from(vec![seq as u8; 50]),
        }]);
        list.first_seq = seq;
        Frame::Messages(list).encode(&mut out);
    }
    let big = Bytes::from(vec![7u8; 100]);
    for (seq, off) in [(3u64, 0usize), (4, 60)] {
        let end = (off + 60).min(100);
        Frame::Fragment(Fragment {
            seq,
            id: 3,
            total: 100,
            offset: off as u64,
            to: name.clone(),
            from: Name::from_static("big"),
            data: big.slice(off..end),
        })
        .encode(&mut out);
    }
    rig.theirs.write_all(&out).unwrap();
    let t0 = Instant::now();
    while mb.len() < 4 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        mb.len(),
        4,
        "all handed over without waiting for the consumer"
    );
    let charged = 3 * (6 + 5 + 1 + 50) + (6 + 5 + 3 + 100);
    assert_eq!(peer.flow.held(b"inbox"), charged);
    // The writer's first word on the connection: where credit stood (nothing held).
    let first = flow_output(&peer);
    assert!(
        matches!(&first[..], [Frame::Sync(s)] if s.next == 0 && s.held.is_empty()),
        "{first:?}"
    );
    // The application takes everything: its credit is owed back, and goes as a grant.
    let mut got = Vec::new();
    mb.take(&mut got, 10, None).unwrap();
    assert_eq!(got[3].payload, big, "the pieces, whole");
    assert_eq!(peer.flow.held(b"inbox"), 0);
    let grants = flow_output(&peer);
    assert!(
        matches!(&grants[..], [Frame::Credit(c)] if c.grants == [(name.clone(), charged)]),
        "{grants:?}"
    );
    rig.conn.close();
    assert!(rig.join().is_err());
    let (_, resume) = peer.session(|s, now| s.handle_connect(now, 1));
    assert_eq!(resume.next, 5, "every message and piece was committed");
}

/// A reader thread on one end of a loopback pair, with mailbox "inbox"; the test
/// writes to the other end.
struct Rig {
    theirs: TcpStream,
    peer: Arc<Peer>,
    conn: Arc<Conn>,
    mailboxes: Mailboxes,
    events: Events,
    mb: Arc<MailboxQueue>,
    reader: Option<std::thread::JoinHandle<Result<(), LinkError>>>,
}

impl Rig {
    fn new() -> Rig {
        Rig::with_capacity(1000)
    }

    fn with_capacity(capacity: usize) -> Rig {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let theirs = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        let peer = testing::peer(SessionConfig::default());
        let conn = testing::connect(&peer, Link::Plain(ours));
        let mailboxes = Mailboxes::default();
        let name = Name::from_static("inbox");
        let mb = mailboxes.get_or_insert(&name, || {
            MailboxQueue::new(name.clone(), capacity, IdleStrategy::default())
        });
        let events = Events::new(16);
        let (p, c, m, e) = (
            peer.clone(),
            conn.clone(),
            mailboxes.clone(),
            events.clone(),
        );
        let reader = std::thread::spawn(move || reader_of(&p, &c, &m, &e).run(BytesMut::new()));
        let rig = Rig {
            theirs,
            peer,
            conn,
            mailboxes,
            events,
            mb,
            reader: Some(reader),
        };
        // Until the reader thread reads (its read state is installed) and has let go
        // of the turn (it waits for the socket).
        rig.wait_free();
        rig
    }

    fn wait_free(&self) {
        let t0 = Instant::now();
        while !self.conn.try_read_turn().is_some_and(|t| t.is_some()) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the turn stays taken"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn reader(&self) -> Reader<'_> {
        reader_of(&self.peer, &self.conn, &self.mailboxes, &self.events)
    }

    /// Message `seq` to the inbox.
    fn send(&mut self, seq: u64) {
        self.theirs.write_all(&inbox_frame(seq)).unwrap();
    }

    fn wait_len(&self, n: usize) {
        let t0 = Instant::now();
        while self.mb.len() < n && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(self.mb.len(), n);
    }

    fn join(&mut self) -> Result<(), LinkError> {
        self.reader.take().unwrap().join().unwrap()
    }
}

/// Message `seq` (its payload: `seq`) to the inbox, as a frame numbered `seq`.
fn inbox_frame(seq: u64) -> Vec<u8> {
    let mut list = MessageList::from_messages(&[Message {
        to: Name::from_static("inbox"),
        from: Name::from_static("x"),
        payload: Bytes::from(seq.to_le_bytes().to_vec()),
    }]);
    list.first_seq = seq;
    let mut out = Vec::new();
    Frame::Messages(list).encode(&mut out);
    out
}

fn reader_of<'a>(
    peer: &'a Peer,
    conn: &'a Conn,
    mailboxes: &'a Mailboxes,
    events: &'a Events,
) -> Reader<'a> {
    Reader {
        peer,
        conn,
        mailboxes,
        events,
        shared: None,
        max_frame: 1 << 20,
        max_payload: 1 << 20,
        read_bytes: 1 << 16,
        linger: None,
    }
}

/// The FRAGMENT frames of a `total`-byte message to the inbox, numbered from 0, in
/// 64 KiB pieces, and the message's payload.
fn pieces_to_inbox(total: usize) -> (Vec<Vec<u8>>, Bytes) {
    let payload: Bytes = (0..total).map(|i| (i * 7 % 251) as u8).collect();
    let frames = (0..total.div_ceil(1 << 16))
        .map(|k| {
            let off = k << 16;
            let end = (off + (1 << 16)).min(total);
            let mut out = Vec::new();
            Frame::Fragment(Fragment {
                seq: k as u64,
                id: 0,
                total: total as u64,
                offset: off as u64,
                to: Name::from_static("inbox"),
                from: Name::from_static("x"),
                data: payload.slice(off..end),
            })
            .encode(&mut out);
            out
        })
        .collect();
    (frames, payload)
}

#[test]
fn pieces_are_read_in_place_and_make_the_whole_message_and_the_stream_goes_on() {
    let mut rig = Rig::new();
    let (frames, payload) = pieces_to_inbox(600 << 10);
    // Each piece's fields first, then its data in parts: the reader sees the fields
    // before the data, as it does when pieces stream.
    for f in &frames {
        rig.theirs.write_all(&f[..200]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        for part in f[200..].chunks(16 << 10) {
            rig.theirs.write_all(part).unwrap();
        }
    }
    rig.theirs
        .write_all(&inbox_frame(frames.len() as u64))
        .unwrap();
    rig.wait_len(2);
    let mut got = Vec::new();
    rig.mb.take(&mut got, 10, None).unwrap();
    assert_eq!(got[0].payload, payload, "reassembled whole and exact");
    assert_eq!(&got[1].payload[..], &10u64.to_le_bytes());
    let stats = &rig.peer.stats;
    assert_eq!(stats.fragments_received.load(Relaxed), 10);
    // All but the bytes that came with each piece's fields went in place.
    let in_place = stats.piece_bytes_in_place.load(Relaxed);
    assert!(
        in_place > (600 << 10) - 10 * 600 && in_place <= 600 << 10,
        "{in_place} bytes in place"
    );
    drop(rig.theirs.shutdown(std::net::Shutdown::Write));
    assert!(matches!(rig.join(), Err(LinkError::Eof)));
}

#[test]
fn a_piece_cut_off_while_read_in_place_comes_again_whole_on_the_next_connection() {
    // The first piece (which starts the message) or a later one.
    for cut in [0, 1] {
        cut_off_in_place(cut);
    }
}

fn cut_off_in_place(cut: usize) {
    let mut rig = Rig::new();
    let (frames, payload) = pieces_to_inbox(300 << 10);
    for f in &frames[..cut] {
        rig.theirs.write_all(f).unwrap();
    }
    // The piece's fields, then 20 KiB of its data, then the connection breaks.
    rig.theirs.write_all(&frames[cut][..200]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rig.theirs.write_all(&frames[cut][200..20 << 10]).unwrap();
    let t0 = Instant::now();
    while rig.peer.stats.piece_bytes_in_place.load(Relaxed) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "read in place");
        std::thread::sleep(Duration::from_millis(1));
    }
    rig.theirs.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(rig.join(), Err(LinkError::Eof)));
    assert_eq!(rig.mb.len(), 0);
    // What was read in place went with the connection: only committed pieces stay.
    let r = rig.peer.lock_reassembly();
    assert_eq!((r.len(), r.bytes()), (cut, cut << 16));
    drop(r);
    // The next connection: the sender resends from that piece, whole and at once.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut theirs = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ours, _) = l.accept().unwrap();
    let conn = testing::connect(&rig.peer, Link::Plain(ours));
    let (p, c, m, e) = (
        rig.peer.clone(),
        conn.clone(),
        rig.mailboxes.clone(),
        rig.events.clone(),
    );
    let reader = std::thread::spawn(move || reader_of(&p, &c, &m, &e).run(BytesMut::new()));
    for f in &frames[cut..] {
        theirs.write_all(f).unwrap();
    }
    rig.wait_len(1);
    let mut got = Vec::new();
    rig.mb.take(&mut got, 10, None).unwrap();
    assert_eq!(
        got[0].payload, payload,
        "exact: nothing of the cut-off read in it"
    );
    theirs.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(reader.join().unwrap(), Err(LinkError::Eof)));
}

mod leading;

/// A SYNC that comes on a connection after it was replaced is not recounted: the
/// successor begins with a SYNC of its own, and one recounted late (after ACKs on the
/// successor took messages out of the window) would leave those out of the charge.
#[test]
fn a_sync_on_a_replaced_connection_is_ignored() {
    let mut rig = Rig::new();
    let sync = |window| {
        let mut out = Vec::new();
        Frame::Sync(batchwire_core::frame::Sync {
            next: 0,
            window,
            max_payload: 1 << 20,
            held: Vec::new(),
        })
        .encode(&mut out);
        out
    };
    rig.theirs.write_all(&sync(5555)).unwrap();
    let t0 = Instant::now();
    while rig.peer.lane.credit_window() != 5555 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        rig.peer.lane.credit_window(),
        5555,
        "recounted while current"
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _other = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    testing::connect(&rig.peer, Link::Plain(l.accept().unwrap().0));
    // Then a message: a replaced connection's reader ends at its first delivery.
    let mut late = sync(7777);
    late.extend(inbox_frame(0));
    rig.theirs.write_all(&late).unwrap();
    assert!(matches!(rig.join(), Err(LinkError::Replaced)));
    assert_eq!(
        rig.peer.lane.credit_window(),
        5555,
        "a stale SYNC was recounted"
    );
}
