//! Threads that rest (`NodeConfig::thread_linger`): traffic in bursts with pauses longer
//! than the linger, so writers and readers end and start again all the time, both ways,
//! with messages in pieces and requests among them; everything arrives once, in order, and
//! no peer is declared down. Every loop is bounded in count and time.

mod common;

use std::time::{Duration, Instant};

use batchwire::{Address, Event, NodeConfig};
use common::*;

const T: Duration = Duration::from_secs(30);

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Message `i` of a stream: its number, then filler; every 40th is 200 KB (in pieces).
fn payload(i: u64) -> Vec<u8> {
    let len = if i % 40 == 39 { 200_000 } else { 100 };
    let mut p = vec![(i % 251) as u8; len];
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

#[test]
fn bursts_with_pauses_longer_than_the_linger_arrive_once_in_order_both_ways() {
    const BURSTS: u64 = 30;
    let cfgs: Vec<NodeConfig> = mesh(&["ra", "rb"])
        .into_iter()
        .map(|c| {
            c.mailbox("inbox")
                .mailbox("echo")
                .heartbeat_interval(Duration::from_millis(50))
                .peer_timeout(Duration::from_secs(3))
                .thread_linger(Duration::from_millis(15))
        })
        .collect();
    let nodes = start(cfgs);
    let events: Vec<_> = nodes.iter().map(|n| n.events()).collect();
    let names = ["ra", "rb"];
    let started = Instant::now();
    let (sent, got): (Vec<u64>, Vec<u64>) = std::thread::scope(|s| {
        // Each node sends bursts to the other, with pauses of up to 150 ms (10x the linger),
        // then a last message numbered u64::MAX.
        let senders: Vec<_> = (0..2)
            .map(|k| {
                let (node, to) = (&nodes[k], Address::new(names[1 - k], "inbox").unwrap());
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (k as u64 + 1));
                    let mut i = 0u64;
                    for _ in 0..BURSTS {
                        for _ in 0..1 + rng.below(300) {
                            node.send(&to, payload(i)).unwrap();
                            i += 1;
                        }
                        std::thread::sleep(Duration::from_millis(rng.below(150)));
                    }
                    node.send(&to, u64::MAX.to_le_bytes().to_vec()).unwrap();
                    i
                })
            })
            .collect();
        let receivers: Vec<_> = (0..2)
            .map(|k| {
                let inbox = nodes[1 - k].mailbox("inbox").unwrap();
                s.spawn(move || {
                    // rb waits in `recv` (leading its connection, see `read/leading.rs`);
                    // ra looks now and then, so its connection's reader may rest.
                    let recv = || {
                        if k == 0 {
                            return inbox.recv_timeout(T);
                        }
                        let deadline = Instant::now() + T;
                        loop {
                            match inbox.try_recv() {
                                Err(_) if Instant::now() < deadline => {
                                    std::thread::sleep(Duration::from_millis(3))
                                }
                                r => return r,
                            }
                        }
                    };
                    for i in 0.. {
                        let e = recv().unwrap_or_else(|e| {
                            panic!("{} -> {}: message {i}: {e:?}", names[k], names[1 - k])
                        });
                        if e.payload[..] == u64::MAX.to_le_bytes() {
                            assert!(inbox.recv_timeout(Duration::from_millis(50)).is_err());
                            return i;
                        }
                        assert_eq!(&e.payload[..], &payload(i)[..], "once, in order");
                    }
                    unreachable!()
                })
            })
            .collect();
        // rb answers requests on "echo"; ra asks now and then.
        s.spawn(|| {
            let echo = nodes[1].mailbox("echo").unwrap();
            for _ in 0..BURSTS {
                let e = echo.recv_timeout(T).expect("a request");
                e.reply(e.payload.clone()).unwrap();
            }
        });
        s.spawn(|| {
            let to = Address::new("rb", "echo").unwrap();
            let mut rng = Rng(7);
            for q in 0..BURSTS {
                let r = nodes[0].request(&to, q.to_le_bytes().to_vec(), T).unwrap();
                assert_eq!(&r.payload[..], &q.to_le_bytes()[..]);
                std::thread::sleep(Duration::from_millis(rng.below(150)));
            }
        });
        (
            senders.into_iter().map(|h| h.join().unwrap()).collect(),
            receivers.into_iter().map(|h| h.join().unwrap()).collect(),
        )
    });
    assert_eq!(sent, got, "everything arrived");
    // The threads did rest and start again, over and over (else this tested nothing): the
    // writers on both nodes, the reader on ra (on rb a receiver waits on the connection).
    for (k, n) in nodes.iter().enumerate() {
        let st = n.stats();
        let p = st.peers.iter().find(|p| p.peer == names[1 - k]).unwrap();
        assert!(
            p.writer_starts >= 5 && (k == 1 || p.reader_rests >= 2),
            "{}: writers started {}, readers rested {}",
            names[k],
            p.writer_starts,
            p.reader_rests
        );
    }
    for (k, ev) in events.iter().enumerate() {
        let bad: Vec<_> = ev
            .try_iter()
            .filter(|e| matches!(e, Event::PeerDown { .. } | Event::SendFailed { .. }))
            .collect();
        assert!(bad.is_empty(), "{}: {bad:?}", names[k]);
    }
    assert!(started.elapsed() < T * 2);
}
