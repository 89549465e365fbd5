//! The no-head-of-line rules end to end, without IO: two nodes, each with an ordinary
//! outbox, a bulk queue and credit toward the other, a session, reassembly, credit accounts
//! and mailboxes, over a simulated connection that holds a bounded number of bytes and can
//! break, driven by a fake clock in 1 ms steps. Each node's writer and reader take the same
//! steps, in the same order, as the IO layer's (`batchwire`'s `io::write` and `io::read`):
//! control and credit first, then the ordinary batch, then pieces while there is bulk room.
//! Each node is the core's peer machine ([`crate::peer::Peer`]) with mailboxes around it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::bundler::{BundlerConfig, BundlerKind};
use crate::codec::Name;
use crate::frame::MAX_FRAME_LEN;
use crate::peer::{Peer, PeerConfig};
use crate::session::{SessionConfig, SessionEvent};
use crate::testutil::Rng;

const MS: Duration = Duration::from_millis(1);
/// The fragment size of these runs.
const PIECE: usize = 1024;
const MAX_PAYLOAD: u64 = 1 << 20;

fn n(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn cfg() -> SessionConfig {
    SessionConfig {
        unacked_bytes: 64 << 10,
        ack_every: 32,
        ack_every_bytes: 8 << 10,
        ack_delay: 2 * MS,
        heartbeat_interval: 100 * MS,
        peer_timeout: Duration::from_secs(60),
        bulk_inflight: 4 << 10,
        bulk_stream: 16 << 10,
        ..SessionConfig::default()
    }
}

/// A payload of `len` bytes that says which message it is: its pair's counter first.
fn payload(k: u64, len: usize) -> Bytes {
    let mut v = vec![(k % 251) as u8; len.max(8)];
    v[..8].copy_from_slice(&k.to_le_bytes());
    Bytes::from(v)
}

fn counter(p: &[u8]) -> u64 {
    u64::from_le_bytes(p[..8].try_into().unwrap())
}

/// One direction's bytes in flight: a writer blocks at `cap`, a reader takes at most `cap`
/// per step (the link's rate).
struct Wire {
    bytes: Vec<u8>,
    cap: usize,
}

/// A node as the simulation sees it: the peer machine toward the other node, the
/// mailboxes its deliveries go to, and the events it reported.
struct Node {
    incarnation: u64,
    /// The latest time the node was given (a send is queued at it).
    now: Instant,
    m: Peer,
    boxes: BTreeMap<String, VecDeque<(String, Bytes, u64)>>,
    events: Vec<SessionEvent>,
}

// The scenarios look at the machine's parts (its session, queues, credit, reassembly).
impl std::ops::Deref for Node {
    type Target = Peer;
    fn deref(&self) -> &Peer {
        &self.m
    }
}

impl std::ops::DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Peer {
        &mut self.m
    }
}

impl Node {
    fn new(incarnation: u64, window: u64, mailboxes: &[&str], t0: Instant) -> Node {
        Node::with_bundler(incarnation, window, mailboxes, t0, BundlerKind::Natural)
    }

    fn with_bundler(
        incarnation: u64,
        window: u64,
        mailboxes: &[&str],
        t0: Instant,
        kind: BundlerKind,
    ) -> Node {
        let cfg = PeerConfig {
            session: cfg(),
            piece_bytes: PIECE,
            frame_bytes: 4 << 10,
            mailbox_bytes: window,
            max_payload: MAX_PAYLOAD,
            max_frame: MAX_FRAME_LEN,
        };
        Node {
            incarnation,
            now: t0,
            m: Peer::with_bundler(
                cfg,
                BundlerConfig {
                    kind,
                    max_size: 16 << 10,
                    max_delay: 2 * MS,
                }
                .build(),
                t0,
            ),
            boxes: mailboxes
                .iter()
                .map(|m| (m.to_string(), VecDeque::new()))
                .collect(),
            events: Vec::new(),
        }
    }

    /// `send` / `try_send`: false if the mailbox's credit is used up.
    fn send(&mut self, to: &str, from: &str, p: Bytes, bulk: bool) -> bool {
        self.m.send(self.now, &n(to), &n(from), p, bulk).is_ok()
    }

    /// The writer's round, onto the wire while it has room.
    fn write(&mut self, now: Instant, w: &mut Wire) {
        self.now = now;
        self.m.poll_transmit(now, &mut w.bytes, w.cap);
        self.collect();
    }

    /// The reader: what the link delivers this step, every whole frame in it, each whole
    /// message handed to its mailbox.
    fn read(&mut self, now: Instant, w: &mut Wire) {
        if w.bytes.is_empty() {
            return;
        }
        let k = w.bytes.len().min(w.cap);
        let boxes = &self.boxes;
        self.m
            .handle_read(now, &w.bytes[..k], |to: &Name| {
                boxes.contains_key(to.as_str())
            })
            .unwrap();
        w.bytes.drain(..k);
        while let Some(d) = self.m.poll_delivery() {
            let q = self.boxes.get_mut(d.to.as_str()).unwrap();
            q.push_back((d.from.to_string(), d.payload, d.charge));
        }
        self.collect();
    }

    /// The application takes up to `k` messages from `mailbox`.
    fn consume(&mut self, mailbox: &str, k: usize) -> Vec<(String, Bytes)> {
        let mut out = Vec::new();
        let q = self.boxes.get_mut(mailbox).unwrap();
        for _ in 0..k {
            let Some((from, p, charge)) = q.pop_front() else {
                break;
            };
            self.m.handle_taken(mailbox.as_bytes(), charge);
            out.push((from, p));
        }
        out
    }

    fn tick(&mut self, now: Instant) {
        self.now = now;
        self.m.handle_timeout(now);
        self.collect();
    }

    fn collect(&mut self) {
        self.events
            .extend(std::iter::from_fn(|| self.m.poll_event()));
    }
}

/// A new connection: both handshakes, both RESUMEs, then each side's SYNC goes first.
fn connect(a: &mut Node, b: &mut Node, now: Instant) {
    let ra = a.m.handle_connect(now, b.incarnation);
    let rb = b.m.handle_connect(now, a.incarnation);
    for x in [&mut *a, &mut *b] {
        x.collect();
        // A restart of the other side is no fault of the run.
        if x.events
            .iter()
            .any(|e| matches!(e, SessionEvent::Restarted { .. }))
        {
            x.events.clear();
        }
    }
    a.m.handle_resume(now, rb).unwrap();
    b.m.handle_resume(now, ra).unwrap();
}

fn wires(cap: usize) -> (Wire, Wire) {
    let w = || Wire {
        bytes: Vec::new(),
        cap,
    };
    (w(), w())
}

/// One step of both nodes.
fn step(a: &mut Node, b: &mut Node, ab: &mut Wire, ba: &mut Wire, now: Instant) {
    a.tick(now);
    b.tick(now);
    a.write(now, ab);
    b.write(now, ba);
    b.read(now, ab);
    a.read(now, ba);
}

/// Messages of one pair in the order they arrived: their counters.
fn counters(got: &[(String, Bytes)], from: &str) -> Vec<u64> {
    got.iter()
        .filter(|(f, _)| f.starts_with(from))
        .map(|(_, p)| counter(p))
        .collect()
}

mod scenarios;
