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

mod worker;
pub use worker::*;

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
