//! The `hol` scenario: no head-of-line blocking, measured. Two node processes, n0 sends and
//! n1 receives; each run has four phases of `--phase-ms` each (default 3000, quick 1500):
//!
//! 1. **rtt alone**: n0 pings n1's "echo" mailbox with 100 B messages, one at a time
//!    (round-trip latency into a histogram);
//! 2. **rtt with bulk**: the same pings while another thread of n0 streams 64 MiB messages
//!    to n1's "bulk" mailbox, which a thread on n1 reads and checks;
//! 3. **rate, both read**: n0 streams 100 B messages to n1's "read" mailbox and, from
//!    another thread, to "other1"; n1 reads both;
//! 4. **rate, other unread**: the same to "read" and to "other2", which n1 does not read
//!    until the run ends (its sender uses `try_send` and backs off on `Full`).
//!
//! n1 times the messages of "read" per phase (first to last arrival) for the delivery rate.
//! Every stream carries a sequence number: n1 counts what arrived, in order, once; at the
//! end it drains "other2"; the parent compares with what n0 says it sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use super::{
    BenchResult, CTL, Common, Context, Ctl, Faults, Progress, Table, add_pairs, hist_to_pairs,
    median_percentiles, new_histogram, node_addr, parse_results, percentiles_us, print_result,
    run_workers, u64_at, us, worker_args,
};
use batchwire::{Address, BundlerKind, Class, Error, Mailbox, Node, NodeConfig, RecvError};

/// Small messages (pings and the rate streams).
const SMALL: usize = 100;
/// Each message of the bulk stream.
const BULK: usize = 64 << 20;
/// How long n1 waits, once n0 is done, for the last messages of a stream.
const QUIET: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// send or recv.
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub listen: SocketAddr,
    #[arg(long)]
    pub peer: SocketAddr,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
    #[arg(long, default_value_t = 3000)]
    pub phase_ms: u64,
    #[arg(long)]
    pub bulk_inflight_bytes: Option<usize>,
}

/// What n0 reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SendReport {
    pub rtt_alone: Vec<(u64, u64)>,
    pub rtt_bulk: Vec<(u64, u64)>,
    /// Pings whose answer was not the ping (lost, duplicated or reordered).
    pub ping_faults: Faults,
    pub bulk_sent: u64,
    pub bulk_secs: f64,
    /// Messages sent to "read" in phases 3 and 4, to "other1" and to "other2".
    pub read_sent: [u64; 2],
    pub other1_sent: u64,
    pub other2_sent: u64,
    /// `try_send` to "other2" answered `Full`.
    pub other2_full: u64,
}

/// What n1 reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RecvReport {
    /// Per stream (bulk, read, other1, other2): in order, and faults seen.
    pub got: [u64; 4],
    pub dup: [u64; 4],
    pub reordered: [u64; 4],
    /// Bulk messages that arrived with the wrong length.
    pub bad_len: u64,
    /// Seconds from the first to the last message of "read" in phases 3 and 4.
    pub read_secs: [f64; 2],
}

/// One stream's order check: sequence numbers must come 0, 1, 2, ...
#[derive(Default)]
struct Seq {
    next: u64,
    dup: u64,
    reordered: u64,
}

impl Seq {
    fn see(&mut self, k: u64) {
        match k.cmp(&self.next) {
            std::cmp::Ordering::Equal => self.next += 1,
            std::cmp::Ordering::Less => self.dup += 1,
            std::cmp::Ordering::Greater => {
                self.reordered += 1;
                self.next = k + 1;
            }
        }
    }
}

/// A small message: its sequence number, its phase, then zeros.
fn small(k: u64, phase: u8) -> Bytes {
    let mut b = BytesMut::with_capacity(SMALL);
    b.put_u64_le(k);
    b.put_u8(phase);
    b.put_bytes(0, SMALL - 9);
    b.freeze()
}

pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    match a.role.as_str() {
        "send" => send(a, secret),
        "recv" => recv(a, secret),
        other => Err(format!("unknown hol role {other:?}")),
    }
}

fn start(
    a: &WorkerArgs,
    secret: &[u8],
    me: &str,
    peer: &str,
    boxes: &[&str],
) -> Result<Node, String> {
    let mut cfg = NodeConfig::new(me, a.listen, secret)
        .peer(peer, a.peer)
        .mailbox(CTL)
        .bundler(a.bundler)
        .idle_cpu_level(a.idle_cpu_level)
        .max_payload(BULK);
    if let Some(v) = a.bulk_inflight_bytes {
        cfg = cfg.bulk_inflight_bytes(v);
    }
    for b in boxes {
        cfg = cfg.mailbox(*b);
    }
    let node = Node::start(super::with_bench_settings(cfg, None)).ctx("starting the node")?;
    if !node.wait_for_peers(&[peer], Duration::from_secs(30)) {
        return Err(format!("{peer} did not come up within 30 s"));
    }
    Ok(node)
}

/// Ping `to` one message at a time until `until`; record round trips.
fn ping(
    pong: &Mailbox,
    to: &Address,
    until: Instant,
    k: &mut u64,
    faults: &mut Faults,
) -> Result<Vec<(u64, u64)>, String> {
    let mut h = new_histogram()?;
    while Instant::now() < until {
        let t0 = Instant::now();
        pong.send(to, small(*k, 0)).ctx("ping")?;
        match pong.recv_timeout(Duration::from_secs(10)) {
            Ok(e) if u64_at(&e.payload, 0) == Some(*k) => {
                h.record(t0.elapsed().as_nanos().max(1) as u64)
                    .ctx("recording")?;
            }
            Ok(_) => faults.reordered += 1,
            Err(e) => {
                faults.lost += 1;
                return Err(format!("ping {k}: no answer within 10 s ({e})"));
            }
        }
        *k += 1;
    }
    Ok(hist_to_pairs(&h))
}

/// Stream small messages to `to` until `stop`; `try_` backs off on `Full` (counted).
fn stream(
    node: &Node,
    to: &Address,
    phase: u8,
    k: &mut u64,
    stop: &AtomicBool,
    full: Option<&AtomicU64>,
) -> Result<(), String> {
    while !stop.load(Ordering::Relaxed) {
        match full {
            None => node.send(to, small(*k, phase)).ctx("send")?,
            Some(f) => match node.try_send(to, small(*k, phase)) {
                Ok(()) => {}
                Err(Error::Full { .. }) => {
                    f.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(format!("try_send to {to}: {e}")),
            },
        }
        *k += 1;
    }
    Ok(())
}

fn send(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let node = start(a, secret, "n0", "n1", &["pong"])?;
    let mut ctl = Ctl::new(&node, 0, 2)?;
    ctl.barrier(1, Duration::from_secs(30))?;
    let at = |m: &str| Address::new("n1", m).ctx("address");
    let (echo, bulk, read) = (at("echo")?, at("bulk")?, at("read")?);
    let (other1, other2) = (at("other1")?, at("other2")?);
    let phase = Duration::from_millis(a.phase_ms);
    let pong = node.mailbox("pong").ctx("mailbox")?;
    let mut r = SendReport::default();
    let mut k = 0;
    // 1 and 2: round trips alone, then beside the bulk stream.
    r.rtt_alone = ping(
        &pong,
        &echo,
        Instant::now() + phase,
        &mut k,
        &mut r.ping_faults,
    )?;
    let stop = AtomicBool::new(false);
    let (bulk_sent, bulk_secs) = std::thread::scope(|s| -> Result<(u64, f64), String> {
        let streamer = s.spawn(|| -> Result<(u64, f64), String> {
            let t0 = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Zeroed memory is mapped lazily: only the header's page is written.
                let mut v = vec![0u8; BULK];
                v[..8].copy_from_slice(&n.to_le_bytes());
                node.send_with(&bulk, v, Class::Bulk).ctx("bulk send")?;
                n += 1;
            }
            Ok((n, t0.elapsed().as_secs_f64()))
        });
        // Let the stream get going before timing pings beside it.
        std::thread::sleep(Duration::from_millis(200));
        let res = ping(
            &pong,
            &echo,
            Instant::now() + phase,
            &mut k,
            &mut r.ping_faults,
        );
        stop.store(true, Ordering::Relaxed);
        let sent = streamer.join().map_err(|_| "the bulk thread panicked")?;
        r.rtt_bulk = res?;
        sent
    })?;
    (r.bulk_sent, r.bulk_secs) = (bulk_sent, bulk_secs);
    ctl.barrier(2, Duration::from_secs(120))?;
    // 3 and 4: the rate to "read", beside a read mailbox, then beside an unread one.
    let mut kr = 0u64;
    let full = AtomicU64::new(0);
    for (p, other) in [(3u8, &other1), (4u8, &other2)] {
        let stop = AtomicBool::new(false);
        let start_k = kr;
        let mut ko = 0u64;
        std::thread::scope(|s| -> Result<(), String> {
            let o = s.spawn(|| {
                let f = (p == 4).then_some(&full);
                stream(&node, other, p, &mut ko, &stop, f)
            });
            let main = s.spawn(|| stream(&node, &read, p, &mut kr, &stop, None));
            std::thread::sleep(phase);
            stop.store(true, Ordering::Relaxed);
            main.join().map_err(|_| "a sending thread panicked")??;
            o.join().map_err(|_| "a sending thread panicked")??;
            Ok(())
        })?;
        r.read_sent[(p - 3) as usize] = kr - start_k;
        if p == 3 {
            r.other1_sent = ko;
        } else {
            r.other2_sent = ko;
        }
    }
    r.other2_full = full.load(Ordering::Relaxed);
    drop(pong);
    ctl.finish(Duration::from_secs(120))?;
    node.shutdown();
    print_result(&r)
}

/// Read a stream until n0 is done and nothing came for a while; check its order.
fn consume(mb: &Mailbox, seq: &mut Seq, done: &AtomicBool, each: &mut dyn FnMut(&[u8])) {
    let mut quiet_since: Option<Instant> = None;
    let mut batch = Vec::with_capacity(1024);
    loop {
        match mb.recv_batch_into(&mut batch, 1024, Duration::from_millis(20)) {
            Ok(_) => {
                quiet_since = None;
                for e in batch.drain(..) {
                    seq.see(u64_at(&e.payload, 0).unwrap_or(u64::MAX));
                    each(&e.payload);
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) if done.load(Ordering::Relaxed) => {
                let t = *quiet_since.get_or_insert_with(Instant::now);
                if t.elapsed() > QUIET {
                    return;
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => return,
        }
    }
}

fn recv(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let boxes = ["echo", "bulk", "read", "other1", "other2"];
    let node = start(a, secret, "n1", "n0", &boxes)?;
    let mut ctl = Ctl::new(&node, 1, 2)?;
    let mbs: Vec<Mailbox> = boxes
        .iter()
        .map(|b| node.mailbox(b).ctx("mailbox"))
        .collect::<Result<_, _>>()?;
    ctl.barrier(1, Duration::from_secs(30))?;
    let done = AtomicBool::new(false);
    let mut r = RecvReport::default();
    let mut seqs: [Seq; 4] = Default::default();
    let mut times: [Option<(Instant, Instant)>; 2] = [None, None];
    let mut bad_len = 0u64;
    std::thread::scope(|s| -> Result<(), String> {
        let done = &done;
        // Serve the pings.
        let echo = &mbs[0];
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok(e) = echo.recv_timeout(Duration::from_millis(20)) {
                    let _ = echo.send(&e.from, e.payload);
                }
            }
        });
        let [s_bulk, s_read, s_other1, s_other2] = &mut seqs;
        let (m_bulk, m_read, m_other1) = (&mbs[1], &mbs[2], &mbs[3]);
        let times = &mut times;
        let bad_len = &mut bad_len;
        s.spawn(move || {
            consume(m_bulk, s_bulk, done, &mut |p| {
                if p.len() != BULK {
                    *bad_len += 1;
                }
            })
        });
        s.spawn(move || {
            consume(m_read, s_read, done, &mut |p| {
                let ph = p.get(8).copied().unwrap_or(0);
                if let Some(i) = ph.checked_sub(3).map(usize::from).filter(|i| *i < 2) {
                    let now = Instant::now();
                    let t = times[i].get_or_insert((now, now));
                    t.1 = now;
                }
            })
        });
        s.spawn(move || consume(m_other1, s_other1, done, &mut |_| {}));
        ctl.barrier(2, Duration::from_secs(120))?;
        // "other2" is not read while n0 sends (phase 4); only once it is done.
        let res = ctl.finish(Duration::from_secs(120));
        done.store(true, Ordering::Relaxed);
        consume(&mbs[4], s_other2, done, &mut |_| {});
        res
    })?;
    r.bad_len = bad_len;
    for (i, s) in seqs.iter().enumerate() {
        (r.got[i], r.dup[i], r.reordered[i]) = (s.next, s.dup, s.reordered);
    }
    // The per-phase counts of "read" follow from the sequence numbers n0 sent; n1 gives
    // the time spans.
    for (i, t) in times.iter().enumerate() {
        r.read_secs[i] = t.map(|(a, b)| (b - a).as_secs_f64()).unwrap_or(0.0);
    }
    drop(mbs);
    node.shutdown();
    print_result(&r)
}

/// One run: both processes; returns both reports.
fn one_run(
    bundler: BundlerKind,
    idle: u8,
    o: &Options,
    base_port: u16,
) -> Result<(SendReport, RecvReport), String> {
    let send_addr = node_addr(base_port, 0)?;
    let recv_addr = node_addr(base_port, 1)?;
    let args = |role: &str, listen: SocketAddr, peer: SocketAddr| {
        let v = worker_args(
            "hol",
            role,
            &[
                ("listen", listen.to_string()),
                ("peer", peer.to_string()),
                ("bundler", bundler.name().to_string()),
                ("idle-cpu-level", idle.to_string()),
                ("phase-ms", o.phase_ms.to_string()),
            ],
        );
        let mut v = v;
        if let Some(b) = o.bulk_inflight_bytes {
            v.extend(["--bulk-inflight-bytes".to_string(), b.to_string()]);
        }
        v
    };
    let lines = run_workers(
        &[
            args("recv", recv_addr, send_addr),
            args("send", send_addr, recv_addr),
        ],
        Duration::from_secs(600),
    )?;
    let mut rr: Vec<RecvReport> = parse_results(&lines[..1])?;
    let mut sr: Vec<SendReport> = parse_results(&lines[1..])?;
    match (sr.pop(), rr.pop()) {
        (Some(s), Some(r)) => Ok((s, r)),
        _ => Err("a worker gave no report".into()),
    }
}

/// The faults of a run: every stream's count against what n0 sent.
fn faults(s: &SendReport, r: &RecvReport) -> Faults {
    let sent = [
        s.bulk_sent,
        s.read_sent[0] + s.read_sent[1],
        s.other1_sent,
        s.other2_sent,
    ];
    let mut f = s.ping_faults;
    f.lost += r.bad_len;
    for (i, sent) in sent.iter().enumerate() {
        f.lost += sent.saturating_sub(r.got[i]);
        f.duplicated += r.dup[i];
        f.reordered += r.reordered[i];
    }
    f
}

/// The scenario's own options.
pub struct Options {
    /// Milliseconds per phase.
    pub phase_ms: u64,
    /// `NodeConfig::bulk_inflight_bytes` for both nodes (default: the library's).
    pub bulk_inflight_bytes: Option<usize>,
}

/// Run the scenario: `runs` rounds alternating over the bundlers.
pub fn run(
    c: &Common,
    phase_ms: Option<u64>,
    bulk_inflight_bytes: Option<usize>,
) -> Result<Vec<BenchResult>, String> {
    c.require_bundlers("hol")?;
    c.refuse_remote("hol")?;
    let o = Options {
        phase_ms: phase_ms.unwrap_or(if c.quick { 1500 } else { 3000 }),
        bulk_inflight_bytes,
    };
    let phase_ms = o.phase_ms;
    let combos = c.combos();
    let progress = Progress::new((c.runs * combos.len()) as u64, "hol", c.quiet);
    #[derive(Default, Clone)]
    struct Acc {
        alone: Vec<[f64; 4]>,
        bulk: Vec<[f64; 4]>,
        bulk_mib_s: Vec<f64>,
        rate: [Vec<f64>; 2],
        faults: Faults,
        pings: u64,
    }
    let mut acc = vec![Acc::default(); combos.len()];
    for run in 0..c.runs {
        for (i, &(b, idle)) in combos.iter().enumerate() {
            let what = format!(
                "hol {:<20} run {}/{}",
                format!("{b} (idle {idle})"),
                run + 1,
                c.runs
            );
            progress.running(what.clone());
            let (s, r) = one_run(b, idle, &o, c.base_port)?;
            let a = &mut acc[i];
            a.faults += faults(&s, &r);
            let pct = |pairs: &[(u64, u64)]| -> Result<Option<[f64; 4]>, String> {
                let mut h = new_histogram()?;
                add_pairs(&mut h, pairs)?;
                Ok(percentiles_us(&h))
            };
            let (pa, pb) = (pct(&s.rtt_alone)?, pct(&s.rtt_bulk)?);
            a.pings += s
                .rtt_alone
                .iter()
                .chain(&s.rtt_bulk)
                .map(|p| p.1)
                .sum::<u64>();
            a.alone.extend(pa);
            a.bulk.extend(pb);
            let mib_s = s.bulk_sent as f64 * BULK as f64 / (1 << 20) as f64 / s.bulk_secs.max(1e-9);
            a.bulk_mib_s.push(mib_s);
            for p in 0..2 {
                a.rate[p].push(s.read_sent[p] as f64 / r.read_secs[p].max(1e-9));
            }
            progress.done(format!(
                "  {what}: p99 {} alone, {} with bulk ({mib_s:.0} MiB/s); read {} / {} msg/s; other2 full {}",
                pa.map(|p| us(p[2])).unwrap_or_default(),
                pb.map(|p| us(p[2])).unwrap_or_default(),
                super::si(*a.rate[0].last().unwrap_or(&0.0)),
                super::si(*a.rate[1].last().unwrap_or(&0.0)),
                s.other2_full,
            ));
        }
    }
    let mut results = Vec::new();
    for (i, &(b, idle)) in combos.iter().enumerate() {
        let a = &acc[i];
        let p99 = |v: &[[f64; 4]]| v.iter().map(|p| p[2]).collect::<Vec<_>>();
        let mut row =
            |scenario: &str, size: usize, runs: Vec<f64>, unit: &str, lat: Option<[f64; 4]>| {
                let mut r = BenchResult::new(scenario, b.name(), Some(idle), size, runs, unit)
                    .with_faults(a.faults)
                    .with_latency(lat);
                r.messages = a.pings;
                results.push(r);
            };
        row(
            "hol/rtt-alone",
            SMALL,
            p99(&a.alone),
            "us p99",
            median_percentiles(&a.alone),
        );
        row(
            "hol/rtt-with-bulk",
            SMALL,
            p99(&a.bulk),
            "us p99",
            median_percentiles(&a.bulk),
        );
        row("hol/bulk-stream", BULK, a.bulk_mib_s.clone(), "MiB/s", None);
        row(
            "hol/rate-other-read",
            SMALL,
            a.rate[0].clone(),
            "msg/s",
            None,
        );
        row(
            "hol/rate-other-unread",
            SMALL,
            a.rate[1].clone(),
            "msg/s",
            None,
        );
    }
    out!("{}", table(&results, c, phase_ms));
    Ok(results)
}

fn table(results: &[BenchResult], c: &Common, phase_ms: u64) -> String {
    let mut t = Table::new([
        "bundler",
        "rtt p50 / p99 alone",
        "with 64 MiB bulk stream",
        "p99 ratio",
        "bulk MiB/s",
        "read rate, other read",
        "other unread",
        "rate ratio",
    ]);
    for row in results.chunks(5) {
        let [alone, bulk, stream, r_read, r_unread] = row else {
            continue;
        };
        if alone.failed() {
            t.failed_row(vec![alone.label(c.show_idle())], alone.failure());
            continue;
        }
        let pp = |r: &BenchResult| {
            format!(
                "{} / {}",
                us(r.p50_us.unwrap_or(0.0)),
                us(r.p99_us.unwrap_or(0.0))
            )
        };
        t.row(vec![
            alone.label(c.show_idle()),
            pp(alone),
            pp(bulk),
            format!("{:.2}x", bulk.median / alone.median.max(1e-9)),
            format!("{:.0} ({:.0}-{:.0})", stream.median, stream.min, stream.max),
            format!(
                "{} ({}-{})",
                super::si(r_read.median),
                super::si(r_read.min),
                super::si(r_read.max)
            ),
            format!(
                "{} ({}-{})",
                super::si(r_unread.median),
                super::si(r_unread.min),
                super::si(r_unread.max)
            ),
            format!("{:.2}x", r_unread.median / r_read.median.max(1e-9)),
        ]);
    }
    format!(
        "\nhol: {SMALL} B round trips alone and beside a stream of 64 MiB messages to the same \
         node; the rate of {SMALL} B messages to one mailbox while another is read, and while \
         another is never read; {phase_ms} ms per phase, median (min-max) of {} alternating \
         runs (latency: median of each run's percentile); every stream verified\n{}",
        c.runs,
        t.render()
    )
}
