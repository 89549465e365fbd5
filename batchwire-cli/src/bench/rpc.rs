//! The `rpc` scenario, after JGroups' UnicastTestRpc (the unicast table of JGRP-1540): N
//! node processes (default 4), T threads on each (default 16), each thread making
//! synchronous calls with `Node::request` to mailbox "rpc" of a random other node, for a
//! fixed count of calls per node (default 20,000). Every node runs a server thread on "rpc"
//! that answers each request with its payload (`Envelope::reply`), as `batchwire node`'s
//! "echo" mailbox does, so `--peers` measures the same exchange against nodes running
//! elsewhere.
//!
//! A reply must carry the id of its call (the request API pairs them; this checks it did).
//! Reported: calls per second per calling node, and latency percentiles from an HDR
//! histogram of every call.
//!
//! In the same run, for comparison: one outstanding call (2 nodes, 1 thread on n0 calling
//! n1, per bundler) and its floor, a plain TCP ping-pong of the same size between two
//! processes (std `TcpStream`, `TCP_NODELAY`, one request in flight); and the async
//! variant: 2 nodes, one tokio runtime (current-thread) on n0 with [`CONCURRENCY`] requests
//! in flight through `Node::request_async`.

mod worker;
pub use worker::*;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::{
    BenchResult, CTL, Common, Context, Ctl, Faults, Overrides, Progress, Rng, Table, add_pairs,
    hist_to_pairs, median_percentiles, mesh_config, new_histogram, parse_results, percentiles_us,
    print_result, run_workers, share, si, u64_at, us, worker_args,
};
use batchwire::{Address, BundlerKind, Envelope, Mailbox, Node, RecvError};

/// The payload header: the call id (u64, little-endian).
pub const HEADER: usize = 8;

/// The mailbox every node serves calls on.
pub const MAILBOX: &str = "rpc";

/// The name of the TCP floor in tables and JSON.
pub const TCP_FLOOR: &str = "tcp-ping-pong";

/// How long a call may wait for its reply before the rest of its calls count as lost.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests in flight at once in the async rows.
pub const CONCURRENCY: usize = 10_000;

const READY: u8 = 1;

/// Options of the scenario, defaults applied.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    pub nodes: usize,
    pub threads: usize,
    /// Calls per calling node with `threads` threads.
    pub calls: u64,
    /// Calls in the one-outstanding-call rows (and the TCP floor): a tenth of `calls`.
    pub single_calls: u64,
    /// Calls in the async rows (five times `calls`), with [`Options::concurrency`] in
    /// flight.
    pub async_calls: u64,
}

impl Options {
    /// Requests in flight in the async rows: [`CONCURRENCY`], or fewer for short runs.
    pub fn concurrency(&self) -> usize {
        CONCURRENCY.min(self.async_calls as usize).max(1)
    }

    pub fn resolve(c: &Common, o: &Overrides) -> Result<Options, String> {
        let mut calls = o.messages.unwrap_or(if c.quick { 10_000 } else { 20_000 });
        // Over an emulated link each call takes at least its RTT: about 60 RTTs' worth.
        if o.messages.is_none()
            && let Some(l) = crate::link::hosts::active_link()
            && !l.rtt.is_zero()
        {
            calls = calls.min((60.0 / l.rtt.as_secs_f64()) as u64).max(200);
        }
        if calls == 0 {
            return Err("rpc: --messages must be at least 1".into());
        }
        let nodes = match &c.remote {
            Some(r) => r.peers.len() + 1,
            None => o.nodes_or(4, "rpc")?,
        };
        Ok(Options {
            sizes: o.sizes_or(&[100], HEADER, "rpc")?,
            nodes,
            threads: o.threads_or(16, "rpc")?,
            calls,
            // A tenth: one outstanding call through `linger` takes ~2 ms.
            single_calls: (calls / 10).max(1),
            // Five times the N x T rows' count (100,000 by default), ten per task.
            async_calls: calls.saturating_mul(5),
        })
    }
}

/// One run's outcome of a row: the rate per calling node, the merged histogram, the faults.
struct RowRun {
    rate: f64,
    hist: Histogram<u64>,
    faults: Faults,
}

/// Fold the reports of one run's calling processes into a row run.
fn fold(reports: &[CallReport], expected_per_caller: u64) -> Result<RowRun, String> {
    let mut hist = new_histogram()?;
    let mut faults = Faults::default();
    let (mut sum, mut callers) = (0.0, 0usize);
    for r in reports.iter().filter(|r| r.secs > 0.0) {
        add_pairs(&mut hist, &r.hist)?;
        faults += r.faults;
        faults.lost += expected_per_caller.saturating_sub(r.calls + r.faults.lost);
        sum += r.calls as f64 / r.secs;
        callers += 1;
    }
    if callers == 0 {
        return Err("no calling node reported".into());
    }
    Ok(RowRun {
        rate: sum / callers as f64,
        hist,
        faults,
    })
}

/// A cluster of `nodes` processes, nodes 0..clients calling with `threads` threads each.
#[allow(clippy::too_many_arguments)]
fn cluster_run(
    bundler: BundlerKind,
    idle: u8,
    size: usize,
    nodes: usize,
    clients: usize,
    threads: usize,
    calls: u64,
    base_port: u16,
    concurrency: usize,
) -> Result<RowRun, String> {
    let args: Vec<Vec<String>> = (0..nodes)
        .map(|i| {
            worker_args(
                "rpc",
                "node",
                &[
                    ("index", i.to_string()),
                    ("nodes", nodes.to_string()),
                    ("clients", clients.to_string()),
                    ("base-port", base_port.to_string()),
                    ("threads", threads.to_string()),
                    ("calls", calls.to_string()),
                    ("size", size.to_string()),
                    ("bundler", bundler.name().to_string()),
                    ("idle-cpu-level", idle.to_string()),
                    ("concurrency", concurrency.to_string()),
                ],
            )
        })
        .collect();
    let reports: Vec<CallReport> = parse_results(&run_workers(&args, Duration::from_secs(600))?)?;
    fold(&reports, calls)
}

/// The TCP ping-pong floor: a server and a client process.
fn tcp_run(size: usize, calls: u64, base_port: u16) -> Result<RowRun, String> {
    let args = |role: &str| {
        worker_args(
            "rpc",
            role,
            &[
                ("base-port", base_port.to_string()),
                ("calls", calls.to_string()),
                ("size", size.to_string()),
            ],
        )
    };
    let lines = run_workers(
        &[args("tcp-server"), args("tcp-client")],
        Duration::from_secs(300),
    )?;
    let reports: Vec<CallReport> = parse_results(&lines[1..])?;
    fold(&reports, calls)
}

/// With `--peers`: this process is the only caller; the remote nodes' "echo" mailboxes
/// answer.
fn remote_run(
    c: &Common,
    bundler: BundlerKind,
    idle: u8,
    size: usize,
    threads: usize,
    calls: u64,
) -> Result<RowRun, String> {
    let remote = c.remote.as_ref().ok_or("no --peers")?;
    let node = remote.start_client(bundler, idle, &[])?;
    let targets = remote.echo_addresses()?;
    let rep = run_callers(&node, threads, &targets, calls, size, 1)?;
    super::settle();
    node.shutdown();
    fold(&[rep], calls)
}

/// Accumulates one row's runs.
#[derive(Default)]
struct Row {
    rates: Vec<f64>,
    pcts: Vec<[f64; 4]>,
    faults: Faults,
}

impl Row {
    fn add(&mut self, r: &RowRun) -> String {
        self.rates.push(r.rate);
        self.faults += r.faults;
        let p = percentiles_us(&r.hist);
        if let Some(p) = p {
            self.pcts.push(p);
        }
        format!(
            "{}calls/s, p50 {} µs, p99 {} µs",
            si(r.rate),
            p.map(|p| us(p[0])).unwrap_or_default(),
            p.map(|p| us(p[2])).unwrap_or_default()
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn result(
        &self,
        bundler: &str,
        idle: Option<u8>,
        size: usize,
        calls: u64,
        nodes: usize,
        threads: usize,
        unit: &str,
    ) -> BenchResult {
        let mut r = BenchResult::new("rpc", bundler, idle, size, self.rates.clone(), unit)
            .with_faults(self.faults)
            .with_latency(median_percentiles(&self.pcts));
        r.messages = calls;
        r.nodes = nodes;
        r.threads = threads;
        r
    }
}

/// Run the scenario: for each size, `runs` rounds; in each round every (bundler, idle
/// level) pair with N nodes x T threads, then with one outstanding call, then the TCP floor.
pub fn run(c: &Common, ov: &Overrides) -> Result<Vec<BenchResult>, String> {
    c.require_bundlers("rpc")?;
    let o = Options::resolve(c, ov)?;
    let combos = c.combos();
    let remote = c.remote.is_some();
    let per_round = 2 * combos.len() + usize::from(!remote) * (1 + combos.len());
    let progress = Progress::new((o.sizes.len() * c.runs * per_round) as u64, "rpc", c.quiet);
    let mut results = Vec::new();
    for &size in &o.sizes {
        let mut multi: Vec<Row> = combos.iter().map(|_| Row::default()).collect();
        let mut single: Vec<Row> = combos.iter().map(|_| Row::default()).collect();
        let mut asynch: Vec<Row> = combos.iter().map(|_| Row::default()).collect();
        let mut tcp = Row::default();
        for run in 0..c.runs {
            let of = format!("run {}/{}", run + 1, c.runs);
            for (i, &(b, idle)) in combos.iter().enumerate() {
                let name = super::row_label(b.name(), Some(idle), c.show_idle());
                let what = format!("rpc {size} B {name:<20} {}x{} {of}", o.nodes, o.threads);
                progress.running(what.clone());
                let r = if remote {
                    remote_run(c, b, idle, size, o.threads, o.calls)?
                } else {
                    cluster_run(
                        b,
                        idle,
                        size,
                        o.nodes,
                        o.nodes,
                        o.threads,
                        o.calls,
                        c.base_port,
                        0,
                    )?
                };
                progress.done(format!("  {what}: {}", multi[i].add(&r)));
            }
            for (i, &(b, idle)) in combos.iter().enumerate() {
                let name = super::row_label(b.name(), Some(idle), c.show_idle());
                let what = format!("rpc {size} B {name:<20} 1 call {of}");
                progress.running(what.clone());
                let r = if remote {
                    remote_run(c, b, idle, size, 1, o.single_calls)?
                } else {
                    cluster_run(b, idle, size, 2, 1, 1, o.single_calls, c.base_port, 0)?
                };
                progress.done(format!("  {what}: {}", single[i].add(&r)));
            }
            if !remote {
                for (i, &(b, idle)) in combos.iter().enumerate() {
                    let name = super::row_label(b.name(), Some(idle), c.show_idle());
                    let what = format!("rpc {size} B {name:<20} async x{} {of}", o.concurrency());
                    progress.running(what.clone());
                    let r = cluster_run(
                        b,
                        idle,
                        size,
                        2,
                        1,
                        1,
                        o.async_calls,
                        c.base_port,
                        o.concurrency(),
                    )?;
                    progress.done(format!("  {what}: {}", asynch[i].add(&r)));
                }
            }
            if !remote {
                let what = format!("rpc {size} B {TCP_FLOOR:<20} 1 call {of}");
                progress.running(what.clone());
                let r = tcp_run(size, o.single_calls, c.base_port)?;
                progress.done(format!("  {what}: {}", tcp.add(&r)));
            }
        }
        let first = results.len();
        for (i, &(b, idle)) in combos.iter().enumerate() {
            results.push(multi[i].result(
                b.name(),
                Some(idle),
                size,
                o.calls,
                o.nodes,
                o.threads,
                "calls/s/node",
            ));
        }
        let mid = results.len();
        let single_nodes = if remote { o.nodes } else { 2 };
        for (i, &(b, idle)) in combos.iter().enumerate() {
            results.push(single[i].result(
                b.name(),
                Some(idle),
                size,
                o.single_calls,
                single_nodes,
                1,
                "calls/s",
            ));
        }
        if !remote {
            results.push(tcp.result(TCP_FLOOR, None, size, o.single_calls, 2, 1, "calls/s"));
        }
        let amid = results.len();
        if !remote {
            for (i, &(b, idle)) in combos.iter().enumerate() {
                let mut r = asynch[i].result(
                    b.name(),
                    Some(idle),
                    size,
                    o.async_calls,
                    2,
                    o.concurrency(),
                    "calls/s",
                );
                r.scenario = "rpc-async".into();
                results.push(r);
            }
        }
        out!(
            "{}",
            tables(
                &results[first..mid],
                &results[mid..amid],
                &results[amid..],
                &o,
                c,
                size
            )
        );
    }
    Ok(results)
}

/// A row's name in the tables.
fn row_name(r: &BenchResult, show_idle: bool) -> String {
    if r.bundler == TCP_FLOOR {
        "tcp ping-pong (floor)".into()
    } else {
        r.label(show_idle)
    }
}

/// One table of rows with a rate per run and latency percentiles.
fn table(rows: &[BenchResult], runs: usize, show_idle: bool) -> String {
    let mut head = vec!["bundler".to_string(), "calls".to_string()];
    head.extend((1..=runs).map(|i| format!("run {i}")));
    head.extend(["median", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs"].map(String::from));
    let mut t = Table::new(head);
    for r in rows {
        let lead = vec![row_name(r, show_idle), r.messages.to_string()];
        if r.failed() {
            t.failed_row(lead, r.failure());
            continue;
        }
        let mut cells = lead;
        cells.extend(r.runs.iter().map(|v| si(*v)));
        cells.push(si(r.median));
        for p in [r.p50_us, r.p90_us, r.p99_us, r.p999_us] {
            cells.push(p.map(us).unwrap_or_else(|| "-".into()));
        }
        t.row(cells);
    }
    t.render()
}

fn tables(
    multi: &[BenchResult],
    single: &[BenchResult],
    asynch: &[BenchResult],
    o: &Options,
    c: &Common,
    size: usize,
) -> String {
    let who = match &c.remote {
        Some(r) => format!(
            "{} threads in this process (node {}) making synchronous calls ({size} B request, \
             echoed back) to the echo mailbox of a random one of {} remote nodes",
            o.threads,
            super::CLIENT_NAME,
            r.peers.len()
        ),
        None => format!(
            "{} nodes x {} threads, each thread making synchronous calls ({size} B request, \
             echoed back) to a random other node",
            o.nodes, o.threads
        ),
    };
    let one = match &c.remote {
        Some(_) => "1 thread in this process calling the remote nodes".to_string(),
        None => "2 nodes, 1 thread on n0 calling n1; the floor is a plain TCP ping-pong of \
                 the same size between two processes"
            .to_string(),
    };
    let mut out = format!(
        "\nrpc: {who}; calls/s per calling node, median of {} alternating runs; latency: \
         median over the runs of each run's percentile\n{}\
         \nrpc, one outstanding call: {one}; calls/s and latency as above\n{}",
        c.runs,
        table(multi, c.runs, c.show_idle()),
        table(single, c.runs, c.show_idle()),
    );
    if !asynch.is_empty() {
        out += &format!(
            "\nrpc, async: 2 nodes, one tokio runtime (current-thread) on n0 with {} \
             requests in flight (Node::request_async) to n1; calls/s and latency as above\n{}",
            o.concurrency(),
            table(asynch, c.runs, c.show_idle()),
        );
    }
    out
}
