//! The `throughput` scenario: one application thread on node n0 streams N messages of S
//! bytes to one mailbox on node n1, in another process; n1 checks every sequence number.
//!
//! The rate is N divided by the time from the sender's first `send` to the receiver's last
//! message (both processes read the same wall clock on one host), so pipeline fill and
//! drain are included. `raw` is the ceiling: the same messages pre-encoded as MESSAGES
//! frames, written in 64 KiB writes by the sending thread itself, read 64 KiB at a time
//! and decoded by the receiving thread itself: no queues, no thread hand-off.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::{
    BenchResult, CTL, Context, Ctl, Faults, Progress, Verifier, now_ns, print_result, si,
    spawn_worker, u64_at, worker_result,
};
use batchwire::{Address, Node, NodeConfig, RecvError};
use batchwire_core::bundler::BundlerKind;
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, ListWriter};

/// What to run: a bundler, or the raw-TCP ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Bundler(BundlerKind),
    /// A bundler with reliable delivery off (`NAME/unsequenced`): no send window, no
    /// acknowledgements; the in-run baseline for what sequencing costs.
    Unsequenced(BundlerKind),
    /// A bundler over mutual TLS (`NAME/tls`), beside plaintext in the same run.
    Tls(BundlerKind),
    Raw,
}

impl Entry {
    pub fn name(self) -> String {
        match self {
            Entry::Bundler(b) => b.name().to_string(),
            Entry::Unsequenced(b) => format!("{}/unsequenced", b.name()),
            Entry::Tls(b) => format!("{}/tls", b.name()),
            Entry::Raw => "raw".to_string(),
        }
    }

    fn kind(self) -> BundlerKind {
        match self {
            Entry::Bundler(b) | Entry::Unsequenced(b) | Entry::Tls(b) => b,
            Entry::Raw => BundlerKind::Natural,
        }
    }

    /// Parse a comma-separated list of bundler names, `raw`, or `all` (every bundler and raw).
    pub fn parse_list(s: &str) -> Result<Vec<Entry>, String> {
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => {
                    v.extend(BundlerKind::ALL.iter().map(|b| Entry::Bundler(*b)));
                    v.push(Entry::Raw);
                }
                "raw" => v.push(Entry::Raw),
                b => {
                    if let Some(b) = b.strip_suffix("/unsequenced") {
                        v.push(Entry::Unsequenced(b.parse()?));
                    } else if let Some(b) = b.strip_suffix("/tls") {
                        v.push(Entry::Tls(b.parse()?));
                    } else {
                        v.push(Entry::Bundler(b.parse()?));
                    }
                }
            }
        }
        v.dedup();
        if v.is_empty() {
            return Err("no bundler named".into());
        }
        Ok(v)
    }
}

/// Options of the scenario.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    pub entries: Vec<Entry>,
    /// Idle levels to run each bundler with (raw runs once).
    pub idle_levels: Vec<u8>,
    /// Messages per run; `None` picks by size (and fewer for `none`, which is slow).
    pub messages: Option<u64>,
    pub runs: usize,
    pub base_port: u16,
    pub quiet: bool,
    /// The quick version: a quarter of the default message counts.
    pub quick: bool,
    pub chaos: Chaos,
    /// Print sent / delivered / lost / duplicated / reordered for every run.
    pub verify: bool,
}

/// Default message count for a size: about 300 MB or one million messages, whichever is
/// fewer; a fifth of that for `none`, whose one write per message is ~20x slower.
pub fn default_messages(size: usize, entry: Entry) -> u64 {
    let n = (1_000_000u64)
        .min(300_000_000 / size.max(1) as u64)
        .max(1000);
    match entry {
        Entry::Bundler(BundlerKind::None)
        | Entry::Unsequenced(BundlerKind::None)
        | Entry::Tls(BundlerKind::None) => n / 5,
        _ => n,
    }
}

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
}

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// recv, send, raw-recv or raw-send.
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
}

/// Connection breaks during a run (`--break-every`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Chaos {
    /// Close the sender's connections every this many milliseconds (0: never).
    pub break_every_ms: u64,
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
            let cfg = NodeConfig::new("n1", a.listen, secret)
                .peer("n0", a.peer)
                .mailbox("sink")
                .mailbox(CTL)
                .bundler(a.bundler)
                .idle_cpu_level(a.idle_cpu_level)
                .reliable(!a.unsequenced);
            let node = Node::start(super::with_bench_tls(cfg, a.tls_dir.as_deref()))
                .ctx("starting node n1")?;
            let ctl = Ctl::new(&node, 1, 2)?;
            let mb = node.mailbox("sink").ctx("mailbox sink")?;
            let mut v = Verifier::new(1, a.messages);
            let mut batch = Vec::with_capacity(8192);
            // Generous for the first message (the sender may start late), then 10 s idle.
            let mut wait = Duration::from_secs(60);
            while v.distinct < a.messages {
                match mb.recv_batch_into(&mut batch, 8192, wait) {
                    Ok(_) => {
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
            super::finish_receiver(node, ctl, mb, &v, end_ns)
        }
        "send" => {
            let cfg = NodeConfig::new("n0", a.listen, secret)
                .peer("n1", a.peer)
                .mailbox(CTL)
                .bundler(a.bundler)
                .idle_cpu_level(a.idle_cpu_level)
                .reliable(!a.unsequenced);
            let node = Node::start(super::with_bench_tls(cfg, a.tls_dir.as_deref()))
                .ctx("starting node n0")?;
            let ctl = Ctl::new(&node, 0, 2)?;
            if !node.wait_for_peers(&["n1"], Duration::from_secs(30)) {
                return Err("receiver did not come up within 30 s".into());
            }
            let to = Address::new("n1", "sink").ctx("address")?;
            let size = a.size.max(8);
            let mut chunk = BytesMut::new();
            let start_ns = now_ns();
            let sending = std::sync::atomic::AtomicBool::new(true);
            let breaks = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|sc| -> Result<(), String> {
                if a.break_every > 0 {
                    // Chaos: close the connections from inside the process while streaming.
                    sc.spawn(|| {
                        while sending.load(std::sync::atomic::Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(a.break_every));
                            if node.break_connections() > 0 {
                                breaks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    });
                }
                let res = (|| -> Result<(), String> {
                    for i in 0..a.messages {
                        // Payloads are cut from 1 MiB chunks, as a careful application would do:
                        // one allocation per ~10k small messages, none in batchwire.
                        if chunk.capacity() < size {
                            chunk = BytesMut::with_capacity((1 << 20).max(size));
                        }
                        chunk.put_u64_le(i);
                        chunk.put_bytes(0, size - 8);
                        node.send(&to, chunk.split().freeze()).ctx("send")?;
                    }
                    Ok(())
                })();
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
                sending.store(false, std::sync::atomic::Ordering::Relaxed);
                res
            })?;
            // Once the receiver has everything, every message was written: read the
            // messages-per-write figure then, not while the lane still holds some.
            ctl.finish(Duration::from_secs(300))?;
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
                breaks: breaks.load(std::sync::atomic::Ordering::Relaxed),
            })?;
            Ok(())
        }
        "raw-recv" => {
            let l = TcpListener::bind(a.listen).ctx(&format!("raw listen on {}", a.listen))?;
            let (mut s, _) = l.accept().ctx("raw accept")?;
            let mut v = Verifier::new(1, a.messages);
            let mut buf = BytesMut::with_capacity(1 << 17);
            while v.distinct < a.messages {
                let len = buf.len();
                buf.resize(len + (64 << 10), 0);
                let n = s.read(&mut buf[len..]).ctx("raw read")?;
                buf.truncate(len + n);
                if n == 0 {
                    break;
                }
                while let Some(f) = frame::decode(&mut buf, 1 << 26).ctx("raw decode")? {
                    if let Frame::Messages(list) = f {
                        for m in list.iter() {
                            see(&mut v, &m.payload);
                        }
                    }
                }
            }
            let end_ns = now_ns();
            print_result(&super::RecvReport {
                distinct: v.distinct,
                duplicated: v.duplicated,
                reordered: v.reordered,
                end_ns,
            })?;
            Ok(())
        }
        "raw-send" => {
            let (to, from) = (Name::from_static("sink"), Name::from_static(""));
            let size = a.size.max(8);
            let mut payload = vec![0u8; size];
            let mut out = Vec::with_capacity((a.messages as usize) * (size + 16));
            let mut w = ListWriter::start(&mut out);
            for i in 0..a.messages {
                payload[..8].copy_from_slice(&i.to_le_bytes());
                if !w.is_empty() && w.len(&out) + size + 16 > 64 << 10 {
                    w.finish(&mut out);
                    w = ListWriter::start(&mut out);
                }
                w.push(&mut out, &to, &from, &payload);
            }
            w.finish(&mut out);
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut s = loop {
                match TcpStream::connect(a.peer) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(format!("raw connect: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            };
            let _ = s.set_nodelay(true);
            let start_ns = now_ns();
            for c in out.chunks(64 << 10) {
                s.write_all(c).ctx("raw write")?;
            }
            print_result(&SendReport {
                start_ns,
                messages_per_write: 0.0,
                breaks: 0,
            })?;
            Ok(())
        }
        other => Err(format!("unknown worker role {other:?}")),
    }
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct RunOutcome {
    pub rate: f64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub messages_per_write: f64,
    pub breaks: u64,
}

/// Start the two worker processes for one run and collect the outcome.
pub fn one_run(
    entry: Entry,
    chaos: Chaos,
    idle: u8,
    size: usize,
    messages: u64,
    base_port: u16,
) -> Result<RunOutcome, String> {
    let send_addr = format!("127.0.0.1:{base_port}");
    let recv_addr = format!("127.0.0.1:{}", base_port + 1);
    let (rrole, srole) = match entry {
        Entry::Raw => ("raw-recv", "raw-send"),
        Entry::Bundler(_) | Entry::Unsequenced(_) | Entry::Tls(_) => ("recv", "send"),
    };
    let bundler = entry.kind();
    let unsequenced = matches!(entry, Entry::Unsequenced(_));
    let tls_dir = match entry {
        Entry::Tls(_) => Some(super::tls_certs()?),
        _ => None,
    };
    let args = |role: &str, listen: &str, peer: &str| -> Vec<String> {
        [
            "throughput",
            "--role",
            role,
            "--listen",
            listen,
            "--peer",
            peer,
            "--messages",
            &messages.to_string(),
            "--size",
            &size.to_string(),
            "--bundler",
            bundler.name(),
            "--idle-cpu-level",
            &idle.to_string(),
            "--break-every",
            &chaos.break_every_ms.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(unsequenced.then(|| "--unsequenced".to_string()))
        .chain(
            tls_dir
                .iter()
                .flat_map(|d| ["--tls-dir".to_string(), d.display().to_string()]),
        )
        .collect()
    };
    let recv = spawn_worker(&args(rrole, &recv_addr, &send_addr)).ctx("starting the receiver")?;
    let send = spawn_worker(&args(srole, &send_addr, &recv_addr)).ctx("starting the sender")?;
    let timeout = Duration::from_secs(300);
    let s = worker_result(send, "RESULT", timeout)?;
    let r = worker_result(recv, "RESULT", timeout)?;
    let s: SendReport = serde_json::from_str(&s).ctx("sender result")?;
    let r: super::RecvReport = serde_json::from_str(&r).ctx("receiver result")?;
    let secs = (r.end_ns.saturating_sub(s.start_ns)) as f64 / 1e9;
    Ok(RunOutcome {
        rate: if secs > 0.0 {
            r.distinct as f64 / secs
        } else {
            0.0
        },
        lost: messages - r.distinct,
        duplicated: r.duplicated,
        reordered: r.reordered,
        messages_per_write: s.messages_per_write,
        breaks: s.breaks,
    })
}

/// Run the scenario: for each size, `runs` rounds, each round every entry once (so drift on
/// a shared machine hits every entry alike). Prints a table per size.
pub fn run(o: &Options) -> Result<Vec<BenchResult>, String> {
    // Every (entry, idle level) pair; raw has no transport threads, so it runs once.
    let mut combos: Vec<(Entry, Option<u8>)> = Vec::new();
    for &e in &o.entries {
        match e {
            Entry::Raw => combos.push((e, None)),
            Entry::Bundler(_) | Entry::Unsequenced(_) | Entry::Tls(_) => {
                combos.extend(o.idle_levels.iter().map(|l| (e, Some(*l))))
            }
        }
    }
    for &size in &o.sizes {
        if size < 8 {
            return Err(format!(
                "size {size} is below 8 bytes (the sequence number)"
            ));
        }
    }
    let n = |size: usize, e: Entry| {
        o.messages.unwrap_or_else(|| {
            let d = default_messages(size, e);
            if o.quick { (d / 4).max(1000) } else { d }
        })
    };
    let progress = Progress::new(
        (o.sizes.len() * o.runs * combos.len()) as u64,
        "throughput",
        o.quiet,
    );
    let show_idle = o.idle_levels.len() > 1;
    let mut results = Vec::new();
    for &size in &o.sizes {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); combos.len()];
        let mut faults = vec![Faults::default(); combos.len()];
        let mut mpw = vec![0.0f64; combos.len()];
        for run in 0..o.runs {
            for (i, &(e, idle)) in combos.iter().enumerate() {
                let what = format!(
                    "throughput {size} B {:<20} run {}/{}",
                    super::row_label(&e.name(), idle, show_idle),
                    run + 1,
                    o.runs
                );
                progress.running(what.clone());
                let out = one_run(e, o.chaos, idle.unwrap_or(1), size, n(size, e), o.base_port)?;
                if o.verify {
                    let sent = n(size, e);
                    println!(
                        "verify {size} B {} run {}: sent {sent} delivered {} lost {} duplicated {} reordered {} (connection breaks {})",
                        e.name(),
                        run + 1,
                        sent - out.lost,
                        out.lost,
                        out.duplicated,
                        out.reordered,
                        out.breaks
                    );
                }
                progress.done(format!("  {what}: {}msg/s", si(out.rate)));
                rates[i].push(out.rate);
                faults[i] += Faults {
                    lost: out.lost,
                    duplicated: out.duplicated,
                    reordered: out.reordered,
                };
                mpw[i] = out.messages_per_write;
            }
        }
        let first = results.len();
        for (i, &(e, idle)) in combos.iter().enumerate() {
            let mut r = BenchResult::new(
                "throughput",
                &e.name(),
                idle,
                size,
                rates[i].clone(),
                "msgs/s",
            )
            .with_faults(faults[i]);
            r.messages = n(size, e);
            results.push(r);
        }
        print_table(&results[first..], &mpw, o.runs, show_idle);
    }
    Ok(results)
}

fn print_table(rows: &[BenchResult], mpw: &[f64], runs: usize, show_idle: bool) {
    let Some(first) = rows.first() else { return };
    let raw = rows.iter().find(|r| r.bundler == "raw").map(|r| r.median);
    println!(
        "\nthroughput: {} B messages, one sender thread, 2 processes on loopback; msgs/s, median of {runs} alternating runs",
        first.size
    );
    print!("{:<25} {:>9}", "bundler", "messages");
    for i in 0..runs {
        print!(" {:>9}", format!("run {}", i + 1));
    }
    println!(
        " {:>9} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "median", "min", "max", "MB/s", "% raw", "msgs/wr"
    );
    for (r, m) in rows.iter().zip(mpw) {
        print!("{:<25} {:>9}", r.label(show_idle), r.messages);
        if r.failed() {
            println!(
                "  FAILED: lost {} duplicated {} reordered {}",
                r.lost, r.duplicated, r.reordered
            );
            continue;
        }
        for v in &r.runs {
            print!(" {:>9}", si(*v));
        }
        let pct = raw
            .map(|x| format!("{:.0}%", 100.0 * r.median / x))
            .unwrap_or_default();
        let mw = if r.bundler == "raw" {
            "-".to_string()
        } else {
            format!("{m:.1}")
        };
        println!(
            " {:>9} {:>9} {:>9} {:>9.0} {:>7} {:>9}",
            si(r.median),
            si(r.min),
            si(r.max),
            r.median * r.size as f64 / 1e6,
            pct,
            mw
        );
    }
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

    #[test]
    fn entry_lists_parse() {
        assert_eq!(
            Entry::parse_list("natural,raw").unwrap(),
            [Entry::Bundler(BundlerKind::Natural), Entry::Raw]
        );
        assert!(Entry::parse_list("all").unwrap().contains(&Entry::Raw));
        assert!(Entry::parse_list("bogus").is_err());
    }
}
