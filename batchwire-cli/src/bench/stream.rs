//! The worker side of the `throughput` scenario: the processes that send, receive, or
//! both (`--duplex`), and the raw-TCP ceiling's pair. Each prints one report line.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::payloads::Payloads;
use super::rawtcp;
use super::{CTL, Context, Ctl, Verifier, now_ns, print_result, process_cpu_ns, u64_at};
use batchwire::{Address, Node, NodeConfig, RecvError};
use batchwire_core::bundler::BundlerKind;
use batchwire_core::codec::Name;

/// What the sending worker reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct SendReport {
    /// Wall clock (ns since the epoch) just before the first send.
    pub start_ns: u128,
    /// Mean messages per write on the sending side (0 for raw).
    pub messages_per_write: f64,
    /// Connection breaks made by `--break-every`.
    #[serde(default)]
    pub breaks: u64,
    /// CPU time of the sending process (all its threads) from just before the first send
    /// until the receiver had everything (raw: until the last write returned), in ns.
    #[serde(default)]
    pub cpu_ns: u64,
}

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// recv, send, duplex0, duplex1, raw-recv, raw-send, tcp-recv or tcp-send.
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub listen: SocketAddr,
    /// The other process's address.
    #[arg(long)]
    pub peer: SocketAddr,
    #[arg(long)]
    pub messages: u64,
    #[arg(long)]
    pub size: usize,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
    /// Sender: close the node's connections every this many ms while streaming (0: never).
    #[arg(long, default_value_t = 0)]
    pub break_every: u64,
    /// Run with reliable delivery off (the unsequenced baseline).
    #[arg(long)]
    pub unsequenced: bool,
    /// Run mutual TLS with the certificates in this folder (a `NAME/tls` entry).
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
    /// The nodes' send window in bytes (`NodeConfig::unacked_bytes`).
    #[arg(long)]
    pub unacked_bytes: Option<usize>,
}

impl WorkerArgs {
    /// The node configuration every role starts from.
    fn config(&self, name: &str, peer: &str, secret: &[u8]) -> NodeConfig {
        let mut cfg = NodeConfig::new(name, self.listen, secret)
            .peer(peer, self.peer)
            .mailbox("sink")
            .mailbox(CTL)
            .bundler(self.bundler)
            .idle_cpu_level(self.idle_cpu_level)
            .reliable(!self.unsequenced);
        if let Some(w) = self.unacked_bytes {
            cfg = cfg.unacked_bytes(w);
        }
        // Messages past the default largest payload (64 MiB) are what the run asks for:
        // both nodes take them.
        if self.size > 64 << 20 {
            cfg = cfg.max_payload(self.size);
        }
        super::with_bench_settings(cfg, self.tls_dir.as_deref())
    }
}

/// The sequence number at the start of a payload (a malformed one counts as a fault).
#[inline]
fn see(v: &mut Verifier, payload: &[u8]) {
    match u64_at(payload, 0) {
        Some(seq) => v.see(0, seq),
        None => v.malformed(),
    }
}

/// Run a worker role; prints its report line on stdout.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    match a.role.as_str() {
        "recv" => {
            let node = Node::start(a.config("n1", "n0", secret)).ctx("starting node n1")?;
            let ctl = Ctl::new(&node, 1, 2)?;
            let mb = node.mailbox("sink").ctx("mailbox sink")?;
            let mut v = Verifier::new(1, a.messages);
            let mut batch = Vec::with_capacity(8192);
            // Generous for the first message (the sender may start late), then 10 s idle.
            let mut wait = Duration::from_secs(60);
            let mut cpu0 = None;
            while v.distinct < a.messages {
                match mb.recv_batch_into(&mut batch, 8192, wait) {
                    Ok(_) => {
                        cpu0.get_or_insert_with(process_cpu_ns);
                        for e in batch.drain(..) {
                            see(&mut v, &e.payload);
                        }
                        wait = Duration::from_secs(10);
                    }
                    Err(RecvError::Empty) => {}
                    Err(_) => break,
                }
            }
            let end_ns = now_ns();
            let cpu_ns = cpu0.map_or(0, |c| process_cpu_ns().saturating_sub(c));
            let expected = a.messages;
            super::finish_receiver(node, ctl, mb, &mut v, expected, see, (end_ns, cpu_ns))
        }
        "duplex0" => duplex(a, secret, 0),
        "duplex1" => duplex(a, secret, 1),
        "send" => {
            let node = Node::start(a.config("n0", "n1", secret)).ctx("starting node n0")?;
            let ctl = Ctl::new(&node, 0, 2)?;
            if !node.wait_for_peers(&["n1"], Duration::from_secs(30)) {
                return Err("receiver did not come up within 30 s".into());
            }
            let to = Address::new("n1", "sink").ctx("address")?;
            let payloads = Payloads::new(a.messages, a.size, None);
            let start_ns = now_ns();
            let cpu0 = process_cpu_ns();
            let sending = AtomicBool::new(true);
            let breaks = AtomicU64::new(0);
            std::thread::scope(|sc| -> Result<(), String> {
                if a.break_every > 0 {
                    // Chaos: close the connections from inside the process while streaming.
                    sc.spawn(|| {
                        while sending.load(Relaxed) {
                            std::thread::sleep(Duration::from_millis(a.break_every));
                            if node.break_connections() > 0 {
                                breaks.fetch_add(1, Relaxed);
                            }
                        }
                    });
                }
                let res = stream(&node, &to, payloads);
                // Keep breaking until everything is acknowledged, then stop the chaos thread.
                let deadline = std::time::Instant::now() + Duration::from_secs(300);
                while a.break_every > 0
                    && node
                        .stats()
                        .peers
                        .iter()
                        .any(|p| p.unacked_bytes > 0 || p.queued > 0)
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                sending.store(false, Relaxed);
                res
            })?;
            // Once the receiver has everything, every message was written: read the
            // messages-per-write figure then, not while the lane still holds some.
            ctl.finish(Duration::from_secs(300))?;
            let cpu_ns = process_cpu_ns().saturating_sub(cpu0);
            let mpw = node
                .stats()
                .peers
                .first()
                .map(|p| p.messages_per_write())
                .unwrap_or(0.0);
            node.shutdown();
            print_result(&SendReport {
                start_ns,
                messages_per_write: mpw,
                breaks: breaks.load(Relaxed),
                cpu_ns,
            })?;
            Ok(())
        }
        "raw-recv" => {
            let l = TcpListener::bind(a.listen).ctx(&format!("raw listen on {}", a.listen))?;
            let mut s = rawtcp::accept_within(&l, Duration::from_secs(60))?;
            let mut v = Verifier::new(1, a.messages);
            let mut cpu0 = None;
            rawtcp::read(
                &mut s,
                a.messages,
                || {
                    cpu0 = Some(process_cpu_ns());
                },
                |p| see(&mut v, p),
            )?;
            let end_ns = now_ns();
            let cpu_ns = cpu0.map_or(0, |c| process_cpu_ns().saturating_sub(c));
            print_result(&super::RecvReport::of(&v, end_ns, cpu_ns))?;
            Ok(())
        }
        "raw-send" => {
            let out = rawtcp::encode(a.messages, a.size, None, &Name::from_static("sink"));
            plain_send(a, |s| {
                for c in out.chunks(rawtcp::FRAME_BYTES) {
                    s.write_all(c).ctx("raw write")?;
                }
                Ok(())
            })
        }
        // The plain-TCP ceiling: the run's bytes (messages times size) with nothing else;
        // whole messages' worth of bytes count as delivered.
        "tcp-recv" => {
            let l = TcpListener::bind(a.listen).ctx(&format!("tcp listen on {}", a.listen))?;
            let mut s = rawtcp::accept_within(&l, Duration::from_secs(60))?;
            let total = a.messages * a.size as u64;
            let mut cpu0 = None;
            let got = rawtcp::drain_bytes(&mut s, total, || cpu0 = Some(process_cpu_ns()))?;
            let end_ns = now_ns();
            let cpu_ns = cpu0.map_or(0, |c| process_cpu_ns().saturating_sub(c));
            print_result(&super::RecvReport {
                distinct: got / a.size.max(1) as u64,
                duplicated: 0,
                reordered: 0,
                end_ns,
                cpu_ns,
            })?;
            Ok(())
        }
        "tcp-send" => plain_send(a, |s| rawtcp::stream_bytes(s, a.messages * a.size as u64)),
        other => Err(format!("unknown worker role {other:?}")),
    }
}

/// A ceiling's sender (`raw-send`, `tcp-send`): connect to the receiver, then time `write`
/// on the plain socket (wall clock at its start, the process's CPU during it) and report.
fn plain_send(
    a: &WorkerArgs,
    write: impl FnOnce(&mut std::net::TcpStream) -> Result<(), String>,
) -> Result<(), String> {
    let mut s = rawtcp::connect_within(a.peer, Duration::from_secs(30))?;
    let start_ns = now_ns();
    let cpu0 = process_cpu_ns();
    write(&mut s)?;
    print_result(&SendReport {
        start_ns,
        messages_per_write: 0.0,
        breaks: 0,
        cpu_ns: process_cpu_ns().saturating_sub(cpu0),
    })
}

/// What a duplex worker reports: its own sending start, and what it received.
#[derive(Debug, Serialize, Deserialize)]
pub struct DuplexReport {
    /// Wall clock (ns since the epoch) just before this node's first send.
    pub start_ns: u128,
    /// Wall clock when this node had received everything (or gave up).
    pub end_ns: u128,
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// `--duplex`: node n0 or n1 streams `messages` to the other's `sink` while receiving the
/// other's stream, at once.
fn duplex(a: &WorkerArgs, secret: &[u8], me: usize) -> Result<(), String> {
    let (name, other) = if me == 0 { ("n0", "n1") } else { ("n1", "n0") };
    let node = Node::start(a.config(name, other, secret)).ctx("starting the node")?;
    let mut ctl = Ctl::new(&node, me, 2)?;
    if !node.wait_for_peers(&[other], Duration::from_secs(30)) {
        return Err(format!("{other} did not come up within 30 s"));
    }
    // Payloads and the mailbox first: the other node's clock starts at the barrier too.
    let payloads = Payloads::new(a.messages, a.size, None);
    let mb = node.mailbox("sink").ctx("mailbox sink")?;
    ctl.barrier(1, Duration::from_secs(60))?;
    let to = Address::new(other, "sink").ctx("address")?;
    let mut v = Verifier::new(1, a.messages);
    let start_ns = now_ns();
    let end_ns = std::thread::scope(|sc| -> Result<u128, String> {
        let sender = sc.spawn(|| stream(&node, &to, payloads));
        let mut batch = Vec::with_capacity(8192);
        while v.distinct < a.messages {
            match mb.recv_batch_into(&mut batch, 8192, Duration::from_secs(30)) {
                Ok(_) => batch.drain(..).for_each(|e| see(&mut v, &e.payload)),
                Err(RecvError::Empty) => {}
                Err(_) => break,
            }
        }
        let end = now_ns();
        sender
            .join()
            .map_err(|_| "the sender panicked".to_string())??;
        Ok(end)
    })?;
    super::finish_checking(ctl, mb, &mut v, a.messages, Duration::from_secs(300), see)?;
    node.shutdown();
    print_result(&DuplexReport {
        start_ns,
        end_ns,
        distinct: v.distinct,
        duplicated: v.duplicated,
        reordered: v.reordered,
    })
}

/// Send every payload of `payloads` to `to`, in order.
fn stream(node: &Node, to: &Address, payloads: Payloads) -> Result<(), String> {
    for p in payloads {
        node.send(to, p).ctx("send")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_counts_faults() {
        let mut v = Verifier::new(1, 4);
        for s in [0u64, 2, 2, 1, 3] {
            see(&mut v, &s.to_le_bytes());
        }
        see(&mut v, b"short");
        assert_eq!((v.distinct, v.duplicated), (4, 2));
        assert!(v.reordered >= 2);
        let mut ok = Verifier::new(1, 3);
        for s in 0u64..3 {
            see(&mut ok, &s.to_le_bytes());
        }
        assert_eq!((ok.distinct, ok.duplicated, ok.reordered), (3, 0, 0));
    }
}
