//! One node of the soak: a `bench-worker soak` process. It streams numbered messages to
//! every other node at a steady rate, checks what arrives from each, and prints its
//! counters as one JSON line every `--report-ms` (cumulative for this process).
//!
//! A payload is `[the sender process's id: u64][sequence number: u64][padding]`; the
//! sequence numbers run per destination name from 0 for each sender process. A receiver
//! follows one stream per sender name: a higher process id starts a new stream (the sender
//! was restarted), and within a stream a number above the next expected is a gap (lost,
//! unless it turns up later, which is a reorder), one below is a duplicate.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use batchwire::{Address, BundlerKind, Event, Node, NodeConfig, RecvError};
use serde::{Deserialize, Serialize};

use crate::bench::{Context, node_addr, node_name, now_ns};

/// The mailbox every soak node streams to.
const MB: &str = "soak";
/// Gaps remembered per stream to tell a late message (reordered) from a lost one.
const MISSING_MAX: usize = 100_000;

#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This node's index (name `n<i>`, port base + i).
    #[arg(long)]
    pub index: usize,
    /// Nodes in the cluster.
    #[arg(long)]
    pub nodes: usize,
    #[arg(long)]
    pub base_port: u16,
    /// Payload bytes (at least 16).
    #[arg(long)]
    pub size: usize,
    /// Messages per second to each other node.
    #[arg(long)]
    pub rate: u64,
    #[arg(long)]
    pub bundler: BundlerKind,
    /// Stop sending at this wall-clock time (ns since the epoch); keep receiving.
    #[arg(long)]
    pub send_until_ns: u64,
    /// Print counters every this many milliseconds.
    #[arg(long)]
    pub report_ms: u64,
    /// This process replaces a killed one: streams of senders that started before it are
    /// followed from their first message seen (what came before went to the killed one);
    /// otherwise every stream is expected from its first message on.
    #[arg(long)]
    pub restarted: bool,
}

/// What one sender process's stream to this node looked like (cumulative).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct FromPeer {
    /// The sender process whose stream is followed now.
    pub pid: u64,
    /// The next sequence number expected from it.
    pub next: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// What this node did towards one other node (cumulative).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ToPeer {
    /// Messages accepted by `send` (the next sequence number).
    pub sent: u64,
    /// Messages refused by `send` or handed back in `SendFailed` events.
    pub failed: u64,
    /// `MemberDown` events about it.
    pub member_down: u64,
    /// `PeerDown` events about it.
    pub peer_down: u64,
}

/// One report line.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Report {
    pub index: usize,
    /// This process's id in payloads (its start time in ns).
    pub pid: u64,
    pub to: BTreeMap<String, ToPeer>,
    pub from: BTreeMap<String, FromPeer>,
}

#[derive(Default)]
struct Stream {
    f: FromPeer,
    missing: BTreeSet<u64>,
}

impl Stream {
    /// Message `seq` of sender process `pid`; a sender process not seen before starts its
    /// stream at 0 if `from_zero` (a gap at its start is lost, as any other), else where it
    /// is first seen.
    fn see(&mut self, pid: u64, seq: u64, from_zero: bool) {
        let f = &mut self.f;
        if pid < f.pid {
            // A message of a sender process older than the one already seen.
            f.reordered += 1;
            return;
        }
        if pid > f.pid {
            // A new sender process: its stream starts at 0, or here if this node may have
            // missed its start by being restarted itself.
            *f = FromPeer {
                pid,
                next: if from_zero { 0 } else { seq },
                delivered: f.delivered,
                lost: f.lost,
                duplicated: f.duplicated,
                reordered: f.reordered,
            };
            self.missing.clear();
        }
        if seq == f.next {
            f.delivered += 1;
            f.next += 1;
        } else if seq > f.next {
            f.lost += seq - f.next;
            for s in f.next..seq {
                if self.missing.len() >= MISSING_MAX {
                    break;
                }
                self.missing.insert(s);
            }
            f.delivered += 1;
            f.next = seq + 1;
        } else if self.missing.remove(&seq) {
            f.lost -= 1;
            f.reordered += 1;
            f.delivered += 1;
        } else {
            f.duplicated += 1;
        }
    }
}

struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
    member_down: AtomicU64,
    peer_down: AtomicU64,
}

fn payload(pid: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut p = vec![0u8; size.max(16)];
    p[..8].copy_from_slice(&pid.to_le_bytes());
    p[8..16].copy_from_slice(&seq.to_le_bytes());
    p
}

/// Run one soak node until killed (or, bounded, 10 minutes after it stopped sending).
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let pid = now_ns() as u64;
    let me_pid = pid;
    let me = node_name(a.index);
    let others: Vec<usize> = (0..a.nodes).filter(|j| *j != a.index).collect();
    let mut cfg = NodeConfig::new(&me, node_addr(a.base_port, a.index)?, secret)
        .mailbox(MB)
        .bundler(a.bundler);
    for j in &others {
        cfg = cfg.peer(node_name(*j), node_addr(a.base_port, *j)?);
    }
    let cfg = crate::bench::with_bench_settings(cfg, None);
    let node = Node::start(cfg).ctx(&format!("starting node {me}"))?;
    let events = node.events();
    let mb = node.mailbox(MB).ctx("soak mailbox")?;
    let names: Vec<String> = others.iter().map(|j| node_name(*j)).collect();
    let counters: HashMap<String, Counters> = names
        .iter()
        .map(|n| {
            let c = Counters {
                sent: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                member_down: AtomicU64::new(0),
                peer_down: AtomicU64::new(0),
            };
            (n.clone(), c)
        })
        .collect();
    let streams: Mutex<HashMap<String, Stream>> = Mutex::new(HashMap::new());
    let stop = AtomicBool::new(false);
    let until = Duration::from_nanos(a.send_until_ns);
    let sending = || Duration::from_nanos(now_ns() as u64) < until;
    let counters = &counters;
    std::thread::scope(|sc| -> Result<(), String> {
        // One sender per destination, paced in 10 ms ticks (at most 1 s behind).
        for name in &names {
            let (node, stop) = (&node, &stop);
            let to = Address::new(name, MB).ctx("address")?;
            let c = &counters[name];
            sc.spawn(move || {
                let tick = Duration::from_millis(10);
                let per_tick = (a.rate / 100).max(1);
                let mut next_tick = Instant::now();
                let mut seq = 0u64;
                while sending() && !stop.load(Relaxed) {
                    for _ in 0..per_tick {
                        match node.send(&to, payload(pid, seq, a.size)) {
                            Ok(()) => {
                                seq += 1;
                                c.sent.store(seq, Relaxed);
                            }
                            Err(_) => {
                                c.failed.fetch_add(1, Relaxed);
                                std::thread::sleep(tick);
                                break;
                            }
                        }
                    }
                    next_tick = (next_tick + tick).max(Instant::now() - Duration::from_secs(1));
                    std::thread::sleep(next_tick.saturating_duration_since(Instant::now()));
                }
            });
        }
        // Events: failures handed back, and who was declared down.
        let stop = &stop;
        sc.spawn(move || {
            while !stop.load(Relaxed) {
                let Ok(ev) = events.recv_timeout(Duration::from_millis(200)) else {
                    continue;
                };
                let (peer, what) = match &ev {
                    Event::SendFailed { peer, count, .. } => (peer.clone(), ("failed", *count)),
                    Event::MemberDown { member } => (member.name.clone(), ("member_down", 1)),
                    Event::PeerDown { peer, .. } => (peer.clone(), ("peer_down", 1)),
                    _ => continue,
                };
                if let Some(c) = counters.get(&peer) {
                    let field = match what.0 {
                        "failed" => &c.failed,
                        "member_down" => &c.member_down,
                        _ => &c.peer_down,
                    };
                    field.fetch_add(what.1, Relaxed);
                }
            }
        });
        // The receiver.
        sc.spawn(|| {
            let mut batch = Vec::with_capacity(1024);
            while !stop.load(Relaxed) {
                match mb.recv_batch_into(&mut batch, 1024, Duration::from_millis(200)) {
                    Ok(_) => {
                        let mut s = streams.lock().unwrap_or_else(|p| p.into_inner());
                        for e in batch.drain(..) {
                            let p = &e.payload;
                            let (Some(pid), Some(seq)) = (u64_at(p, 0), u64_at(p, 8)) else {
                                continue;
                            };
                            // A sender that started before this (restarted) process sent
                            // the start of its stream to the one killed.
                            let from_zero = !a.restarted || pid > me_pid;
                            s.entry(e.from.node().to_string())
                                .or_default()
                                .see(pid, seq, from_zero);
                        }
                    }
                    Err(RecvError::Closed) => break,
                    Err(_) => {}
                }
            }
        });
        // Reports, until killed; bounded: 10 minutes after sending stopped.
        let quit_at = until + Duration::from_secs(600);
        while Duration::from_nanos(now_ns() as u64) < quit_at {
            std::thread::sleep(Duration::from_millis(a.report_ms.max(50)));
            let r = Report {
                index: a.index,
                pid,
                to: counters
                    .iter()
                    .map(|(n, c)| {
                        let t = ToPeer {
                            sent: c.sent.load(Relaxed),
                            failed: c.failed.load(Relaxed),
                            member_down: c.member_down.load(Relaxed),
                            peer_down: c.peer_down.load(Relaxed),
                        };
                        (n.clone(), t)
                    })
                    .collect(),
                from: streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(n, s)| (n.clone(), s.f.clone()))
                    .collect(),
            };
            crate::bench::print_result(&r)?;
        }
        stop.store(true, Relaxed);
        Ok(())
    })?;
    node.shutdown();
    Ok(())
}

fn u64_at(p: &[u8], at: usize) -> Option<u64> {
    p.get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_tells_lost_duplicated_and_reordered_apart() {
        let mut s = Stream::default();
        for q in 0..5 {
            s.see(7, q, true);
        }
        s.see(7, 8, true); // 5, 6, 7 missing
        s.see(7, 6, true); // late: reordered
        s.see(7, 8, true); // again: duplicated
        assert_eq!(
            (s.f.delivered, s.f.lost, s.f.reordered, s.f.duplicated),
            (7, 2, 1, 1)
        );
        // A sender this (restarted) process may have missed the start of: its stream
        // starts wherever it is first seen.
        s.see(9, 40, false);
        s.see(9, 41, false);
        s.see(7, 9, false); // the old process's: counted as reordered
        assert_eq!((s.f.pid, s.f.next, s.f.delivered), (9, 42, 9));
        assert_eq!((s.f.lost, s.f.reordered, s.f.duplicated), (2, 2, 1));
        // A sender that started later: its first messages lost are counted.
        s.see(11, 3, true);
        assert_eq!((s.f.pid, s.f.next, s.f.lost), (11, 4, 5));
        s.see(11, 1, true); // late: reordered
        assert_eq!((s.f.lost, s.f.reordered), (4, 3));
    }
}
