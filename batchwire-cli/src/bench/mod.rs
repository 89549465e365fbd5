//! `batchwire bench`: scenarios that start node processes of this same binary on loopback,
//! verify what arrived, and report medians of alternating runs beside an in-run baseline.
//!
//! One file per scenario (`throughput`, `fanin`, `mperf`, `rpc`, `roundtrip`); `plot`
//! writes the SVG chart. This file holds what they share: the result record and the JSON
//! report, starting and collecting worker processes, the barrier the nodes of one run meet
//! at, per-sender sequence checks, latency histograms, tables and progress bars.

pub mod fanin;
pub mod mperf;
pub mod plot;
pub mod roundtrip;
pub mod rpc;
pub mod stream;
pub mod throughput;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use batchwire::{Address, BundlerKind, Mailbox, Node, NodeConfig, PeerSpec, RecvError};

/// A row's name: the bundler, with its idle level when several are compared.
pub fn row_label(bundler: &str, idle: Option<u8>, show_idle: bool) -> String {
    match idle {
        Some(l) if show_idle => format!("{bundler} (idle {l})"),
        _ => bundler.to_string(),
    }
}

/// The table of a rate scenario: one column per run, then median, min, max and the
/// median's megabytes per second under `mb_head`.
pub fn rate_table(rows: &[BenchResult], runs: usize, show_idle: bool, mb_head: &str) -> Table {
    let mut head = vec!["bundler".to_string()];
    head.extend((1..=runs).map(|i| format!("run {i}")));
    head.extend(["median", "min", "max", mb_head].map(String::from));
    let mut t = Table::new(head);
    for r in rows {
        if r.failed() {
            t.failed_row(vec![r.label(show_idle)], r.failure());
            continue;
        }
        let mut cells = vec![r.label(show_idle)];
        cells.extend(r.runs.iter().map(|v| si(*v)));
        cells.extend([si(r.median), si(r.min), si(r.max)]);
        cells.push(format!("{:.0}", r.median * r.size as f64 / 1e6));
        t.row(cells);
    }
    t
}

/// What a receiving worker of a stream (throughput, fan-in) reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecvReport {
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Wall clock (ns since the epoch) when the last message arrived.
    pub end_ns: u128,
}

/// The end of a receiving worker: wait for the sender at the last barrier (both sides
/// shut down together), shut down, and print what arrived.
pub fn finish_receiver(
    node: Node,
    ctl: Ctl,
    mb: batchwire::Mailbox,
    v: &Verifier,
    end_ns: u128,
) -> Result<(), String> {
    drop(mb);
    ctl.finish(Duration::from_secs(60))?;
    node.shutdown();
    print_result(&RecvReport {
        distinct: v.distinct,
        duplicated: v.duplicated,
        reordered: v.reordered,
        end_ns,
    })
}

/// Start node `i` of an `n`-node bench cluster (with the bench's TLS, if any) and wait
/// until it is connected to every other node. Returns the node and the others' names.
pub fn start_cluster_node(
    cfg: NodeConfig,
    i: usize,
    n: usize,
) -> Result<(Node, Vec<String>), String> {
    let node =
        Node::start(with_bench_tls(cfg, None)).ctx(&format!("starting node {}", node_name(i)))?;
    let others: Vec<String> = (0..n).filter(|j| *j != i).map(node_name).collect();
    let names: Vec<&str> = others.iter().map(String::as_str).collect();
    if !node.wait_for_peers(&names, Duration::from_secs(30)) {
        return Err(format!(
            "{}: peers did not come up within 30 s (connected: {:?})",
            node_name(i),
            node.connected_peers()
        ));
    }
    Ok((node, others))
}

/// The cluster secret bench processes share (a throwaway; passed in the environment).
pub const SECRET_ENV: &str = "BATCHWIRE_BENCH_SECRET";

/// One result: a scenario, a bundler and a size, over several runs. The JSON keys are
/// stable (see docs/bench.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    pub scenario: String,
    pub bundler: String,
    /// The idle level the nodes ran with (`None` for `raw` and the TCP floor, which have
    /// no transport threads).
    pub idle_cpu_level: Option<u8>,
    pub size: usize,
    /// Messages (or calls) per run, as the scenario counts them (see `unit`).
    pub messages: u64,
    /// The figure of each run, in `unit`.
    pub runs: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub unit: String,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Node processes in each run.
    pub nodes: usize,
    /// Sending (or calling) application threads per sending node.
    pub threads: usize,
    /// Call latency percentiles in microseconds (`rpc` only; the median over the runs).
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

impl BenchResult {
    pub fn failed(&self) -> bool {
        self.lost + self.duplicated + self.reordered > 0
    }

    /// A result of `scenario` for `bundler` with its figures summarized; counts, faults
    /// and latency are filled in by the caller.
    pub fn new(
        scenario: &str,
        bundler: &str,
        idle_cpu_level: Option<u8>,
        size: usize,
        runs: Vec<f64>,
        unit: &str,
    ) -> BenchResult {
        let (median, min, max) = summarize(&runs);
        BenchResult {
            scenario: scenario.into(),
            bundler: bundler.into(),
            idle_cpu_level,
            size,
            messages: 0,
            runs,
            median,
            min,
            max,
            unit: unit.into(),
            lost: 0,
            duplicated: 0,
            reordered: 0,
            nodes: 2,
            threads: 1,
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
        }
    }

    pub fn with_faults(mut self, f: Faults) -> Self {
        self.lost = f.lost;
        self.duplicated = f.duplicated;
        self.reordered = f.reordered;
        self
    }

    /// The latency percentiles, `[p50, p90, p99, p99.9]` in µs.
    pub fn with_latency(mut self, p: Option<[f64; 4]>) -> Self {
        if let Some([a, b, c, d]) = p {
            (self.p50_us, self.p90_us, self.p99_us, self.p999_us) =
                (Some(a), Some(b), Some(c), Some(d));
        }
        self
    }

    /// The row name: the bundler, with its idle level when several are compared.
    pub fn label(&self, show_idle: bool) -> String {
        row_label(&self.bundler, self.idle_cpu_level, show_idle)
    }

    /// What went wrong, for a FAILED row.
    pub fn failure(&self) -> String {
        format!(
            "FAILED: lost {} duplicated {} reordered {}",
            self.lost, self.duplicated, self.reordered
        )
    }
}

/// Lost, duplicated and reordered messages, summed over runs or nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Faults {
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl std::ops::AddAssign for Faults {
    fn add_assign(&mut self, o: Faults) {
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
    }
}

/// Median, min and max (the median of an even count is the mean of the middle two).
pub fn summarize(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

// ---------------------------------------------------------------------------------------
// Options shared by the scenarios.

/// What every scenario is told.
#[derive(Debug, Clone)]
pub struct Common {
    /// Bundlers to compare (`raw` is throughput's own and is passed to it separately).
    pub bundlers: Vec<BundlerKind>,
    pub idle_levels: Vec<u8>,
    pub runs: usize,
    /// Node i of a run listens on `base_port + i`.
    pub base_port: u16,
    pub quiet: bool,
    /// The quick version (no scenario named): smaller counts.
    pub quick: bool,
    /// Run against already running `batchwire node` processes (rpc and roundtrip only).
    pub remote: Option<Remote>,
}

impl Common {
    /// Every (bundler, idle level) pair, in the order runs alternate through them.
    pub fn combos(&self) -> Vec<(BundlerKind, u8)> {
        self.bundlers
            .iter()
            .flat_map(|b| self.idle_levels.iter().map(move |l| (*b, *l)))
            .collect()
    }

    /// Whether tables name the idle level (only when several are compared).
    pub fn show_idle(&self) -> bool {
        self.idle_levels.len() > 1
    }

    /// The bundlers, or an error naming `scenario` if there are none (`raw` alone).
    pub fn require_bundlers(&self, scenario: &str) -> Result<(), String> {
        if self.bundlers.is_empty() {
            return Err(format!(
                "{scenario} compares bundlers; `raw` is the throughput scenario's ceiling only"
            ));
        }
        Ok(())
    }

    /// Refuse `--peers` for a scenario that needs its own nodes.
    pub fn refuse_remote(&self, scenario: &str) -> Result<(), String> {
        if self.remote.is_some() {
            return Err(format!(
                "{scenario} cannot run against --peers: its nodes run scenario code of their own, \
                 and `batchwire node` only serves an echo mailbox (--peers works with rpc and roundtrip)"
            ));
        }
        Ok(())
    }
}

/// Values given on the command line that override a scenario's defaults.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub sizes: Option<Vec<usize>>,
    pub messages: Option<u64>,
    pub nodes: Option<usize>,
    pub threads: Option<usize>,
}

impl Overrides {
    /// The sizes, each at least `min` bytes.
    pub fn sizes_or(
        &self,
        default: &[usize],
        min: usize,
        scenario: &str,
    ) -> Result<Vec<usize>, String> {
        let v = self.sizes.clone().unwrap_or_else(|| default.to_vec());
        if let Some(s) = v.iter().find(|s| **s < min) {
            return Err(format!(
                "{scenario}: size {s} is below {min} bytes (the sequence header)"
            ));
        }
        if v.is_empty() {
            return Err(format!("{scenario}: no size given"));
        }
        Ok(v)
    }

    pub fn nodes_or(&self, default: usize, scenario: &str) -> Result<usize, String> {
        let n = self.nodes.unwrap_or(default);
        if n < 2 {
            return Err(format!("{scenario}: --nodes must be at least 2"));
        }
        Ok(n)
    }

    pub fn threads_or(&self, default: usize, scenario: &str) -> Result<usize, String> {
        let n = self.threads.unwrap_or(default);
        if n == 0 {
            return Err(format!("{scenario}: --threads must be at least 1"));
        }
        Ok(n)
    }
}

/// Nodes that run elsewhere (`--peers`), each serving the "echo" mailbox of `batchwire node`.
#[derive(Debug, Clone)]
pub struct Remote {
    pub peers: Vec<PeerSpec>,
    pub secret: Vec<u8>,
}

/// The name of the local client node with `--peers`. Of two peers the one whose name sorts
/// first dials, and the remote nodes do not list us, so ours must sort before theirs.
pub const CLIENT_NAME: &str = "!bench";

impl Remote {
    /// Start the local client node, connected to every remote node, with `mailboxes`.
    pub fn start_client(
        &self,
        bundler: BundlerKind,
        idle: u8,
        mailboxes: &[String],
    ) -> Result<Node, String> {
        let listen: SocketAddr = ([127, 0, 0, 1], 0).into();
        let mut cfg = NodeConfig::new(CLIENT_NAME, listen, self.secret.clone())
            .bundler(bundler)
            .idle_cpu_level(idle);
        for p in &self.peers {
            if p.name.as_str() <= CLIENT_NAME {
                return Err(format!(
                    "peer name {:?} sorts before the bench client's name {CLIENT_NAME:?}; the \
                     bench dials the peers, so their names must sort after it",
                    p.name
                ));
            }
            cfg = cfg.peer(p.name.clone(), p.addr);
        }
        for m in mailboxes {
            cfg = cfg.mailbox(m.clone());
        }
        let node = Node::start(cfg).ctx("starting the bench client node")?;
        let names: Vec<&str> = self.peers.iter().map(|p| p.name.as_str()).collect();
        if !node.wait_for_peers(&names, Duration::from_secs(30)) {
            return Err(format!(
                "could not connect to every peer within 30 s (connected: {:?}); are they running \
                 `batchwire node` with the same secret?",
                node.connected_peers()
            ));
        }
        Ok(node)
    }

    /// Every remote node's "echo" mailbox.
    pub fn echo_addresses(&self) -> Result<Vec<Address>, String> {
        self.peers
            .iter()
            .map(|p| Address::new(&p.name, "echo").ctx("peer name"))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Errors with context (worker processes return these instead of panicking).

/// Attach what was being done to an error, as a `String`.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

// ---------------------------------------------------------------------------------------
// Worker processes.

/// Spawn this binary as a bench worker with `args`; stdout is piped for its result line.
pub fn spawn_worker(args: &[String]) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    if let Some(dir) = BENCH_TLS.get() {
        cmd.env(TLS_DIR_ENV, dir);
    }
    cmd.arg("bench-worker")
        .args(args)
        .env(SECRET_ENV, "batchwire-bench")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
}

/// Where bench workers find their TLS material (`bench --tls`): certificates for n0..n15.
pub const TLS_DIR_ENV: &str = "BATCHWIRE_BENCH_TLS_DIR";

static BENCH_TLS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// A throwaway CA and certificates for the bench's node names, in a temporary folder
/// (made once per process). Returns the folder.
pub fn tls_certs() -> Result<std::path::PathBuf, String> {
    if let Some(d) = BENCH_TLS.get() {
        return Ok(d.clone());
    }
    let dir = std::env::temp_dir().join(format!("batchwire-bench-tls-{}", std::process::id()));
    let names: Vec<String> = (0..16).map(node_name).collect();
    let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    crate::certs::generate_certs(&dir, &refs).map_err(|e| e.to_string())?;
    Ok(BENCH_TLS.get_or_init(|| dir).clone())
}

/// `bench --tls`: every worker of every scenario runs mutual TLS.
pub fn enable_tls() -> Result<std::path::PathBuf, String> {
    tls_certs()
}

/// In a worker: TLS from the bench's folder (`--tls`, or a `NAME/tls` entry), if any.
pub fn with_bench_tls(cfg: NodeConfig, dir: Option<&std::path::Path>) -> NodeConfig {
    let env = std::env::var_os(TLS_DIR_ENV).map(std::path::PathBuf::from);
    match dir.map(|d| d.to_path_buf()).or(env) {
        Some(d) => {
            let files = batchwire::TlsFiles::in_dir(&d, cfg.name());
            cfg.tls(files)
        }
        None => cfg,
    }
}

/// The last line of `out` that starts with `tag ` (without the tag), read until EOF.
fn scan_for(out: impl std::io::Read, tag: &str) -> Option<String> {
    let tag = format!("{tag} ");
    let mut found = None;
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix(&tag) {
            found = Some(rest.to_string());
        }
    }
    found
}

/// Wait for a worker and return the payload of its line starting with `tag `.
pub fn worker_result(mut child: Child, tag: &str, timeout: Duration) -> Result<String, String> {
    let out = child.stdout.take().ok_or("worker has no stdout")?;
    let tag = tag.to_string();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let _ = tx.send(scan_for(out, &tag));
    });
    let res = match rx.recv_timeout(timeout) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err("worker exited without a result".to_string()),
        Err(_) => {
            let _ = child.kill();
            Err(format!("worker gave no result within {timeout:?}"))
        }
    };
    let status = child.wait();
    let _ = reader.join();
    match (res, status) {
        (Ok(s), _) => Ok(s),
        (Err(e), Ok(st)) if !st.success() => Err(format!("{e} (exit status {st})")),
        (Err(e), _) => Err(e),
    }
}

/// Worker processes of one run; whichever are still running when this is dropped (an
/// error, a timeout) are killed, so a failed run leaves nothing behind.
struct Workers(Vec<(Child, String)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start one worker per argument list and return each one's `RESULT` payload, in order.
/// If any exits without a result, or the time runs out, the others are killed at once.
pub fn run_workers(args: &[Vec<String>], timeout: Duration) -> Result<Vec<String>, String> {
    let mut kids = Workers(Vec::new());
    let (tx, rx) = mpsc::channel();
    for (i, a) in args.iter().enumerate() {
        let what = a.iter().take(5).cloned().collect::<Vec<_>>().join(" ");
        let mut c = spawn_worker(a).map_err(|e| format!("cannot start worker {what}: {e}"))?;
        let out = c.stdout.take().ok_or("worker has no stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, scan_for(out, "RESULT")));
        });
        kids.0.push((c, what));
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    let mut got: Vec<Option<String>> = vec![None; args.len()];
    for _ in 0..args.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, Some(s))) => got[i] = Some(s),
            Ok((i, None)) => {
                let (c, what) = &mut kids.0[i];
                let status = c.wait().map(|s| format!(" ({s})")).unwrap_or_default();
                return Err(format!("worker `{what}` exited without a result{status}"));
            }
            Err(_) => return Err(format!("workers gave no result within {timeout:?}")),
        }
    }
    for (c, _) in &mut kids.0 {
        let _ = c.wait();
    }
    kids.0.clear();
    Ok(got.into_iter().flatten().collect())
}

/// Parse every worker's JSON result.
pub fn parse_results<T: serde::de::DeserializeOwned>(lines: &[String]) -> Result<Vec<T>, String> {
    lines
        .iter()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad worker result {l:?}: {e}")))
        .collect()
}

/// Print a worker's result line (`RESULT {json}`) on stdout.
pub fn print_result<T: Serialize>(v: &T) -> Result<(), String> {
    let s = serde_json::to_string(v).ctx("encoding the result")?;
    println!("RESULT {s}");
    Ok(())
}

/// Build a worker's argument list from `(flag, value)` pairs after the scenario and role.
pub fn worker_args(scenario: &str, role: &str, flags: &[(&str, String)]) -> Vec<String> {
    let mut v = vec![scenario.to_string(), "--role".into(), role.to_string()];
    for (k, val) in flags {
        v.push(format!("--{k}"));
        v.push(val.clone());
    }
    v
}

/// The wall clock in ns since the epoch (both processes of a run are on one host).
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Node `i`'s name in a spawned cluster.
pub fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// Where node `i` of a run listens.
pub fn node_addr(base_port: u16, i: usize) -> Result<SocketAddr, String> {
    let port = u16::try_from(base_port as usize + i)
        .map_err(|_| format!("--base-port {base_port} + {i} is past 65535"))?;
    Ok(([127, 0, 0, 1], port).into())
}

/// Node `i` of a full mesh of `n` nodes on loopback, with `mailboxes` declared.
pub fn mesh_config(
    i: usize,
    n: usize,
    base_port: u16,
    secret: &[u8],
    bundler: BundlerKind,
    idle: u8,
    mailboxes: &[String],
) -> Result<NodeConfig, String> {
    let mut cfg = NodeConfig::new(node_name(i), node_addr(base_port, i)?, secret)
        .bundler(bundler)
        .idle_cpu_level(idle);
    for j in (0..n).filter(|j| *j != i) {
        cfg = cfg.peer(node_name(j), node_addr(base_port, j)?);
    }
    for m in mailboxes {
        cfg = cfg.mailbox(m.clone());
    }
    Ok(cfg)
}

/// Give the last acknowledgements time to cross before a node shuts down (see [`SETTLE`]).
pub fn settle() {
    std::thread::sleep(SETTLE);
}

/// The nodes of one run meet here: each sends a tag to the "ctl" mailbox of every other
/// node and waits until it has that tag from all of them (tags may arrive early; they are
/// counted until asked for).
pub struct Ctl {
    mb: Mailbox,
    others: Vec<Address>,
    seen: HashMap<u8, usize>,
}

/// The mailbox the barrier uses; declare it on every node.
pub const CTL: &str = "ctl";

/// The tag of the last barrier, before shutdown.
const FINISH: u8 = 255;

/// How long nodes wait after the last barrier before shutting down. Receivers acknowledge
/// lazily (after a few ms), and a node's shutdown waits for its messages to be
/// acknowledged: without this pause the barrier's own last message could miss its
/// acknowledgement and hold up that node's shutdown until its timeout.
const SETTLE: Duration = Duration::from_millis(25);

impl Ctl {
    pub fn new(node: &Node, i: usize, n: usize) -> Result<Ctl, String> {
        let others = (0..n)
            .filter(|j| *j != i)
            .map(|j| Address::new(&node_name(j), CTL).ctx("ctl address"))
            .collect::<Result<_, _>>()?;
        Ok(Ctl {
            mb: node.mailbox(CTL).ctx("ctl mailbox")?,
            others,
            seen: HashMap::new(),
        })
    }

    /// Tell every other node `tag`, and wait until every other node told us `tag`.
    pub fn barrier(&mut self, tag: u8, timeout: Duration) -> Result<(), String> {
        for a in &self.others {
            self.mb.send(a, vec![tag]).ctx("sending to the barrier")?;
        }
        let deadline = Instant::now() + timeout;
        while self.seen.get(&tag).copied().unwrap_or(0) < self.others.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.mb.recv_timeout(left) {
                Ok(e) => {
                    if let Some(t) = e.payload.first() {
                        *self.seen.entry(*t).or_default() += 1;
                    }
                }
                Err(RecvError::Empty) => {}
                Err(e) => {
                    return Err(format!(
                        "barrier {tag}: {} of {} nodes arrived within {timeout:?} ({e})",
                        self.seen.get(&tag).copied().unwrap_or(0),
                        self.others.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The last barrier of a run: every node is done with every other, so all may shut
    /// down (none still needs another's server or receiver). Then a short settle.
    pub fn finish(mut self, timeout: Duration) -> Result<(), String> {
        self.barrier(FINISH, timeout)?;
        settle();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Verification.

/// Checks numbered messages on several independent streams (a sender, or a sender and
/// receiver pair): each stream's sequence numbers 0..per_stream must arrive once each, in
/// order. Counts distinct, duplicated and reordered (a number other than the next one).
#[derive(Debug, Clone)]
pub struct Verifier {
    per_stream: u64,
    seen: Vec<u64>,
    next: Vec<u64>,
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl Verifier {
    pub fn new(streams: usize, per_stream: u64) -> Self {
        let bits = streams as u64 * per_stream;
        Verifier {
            per_stream,
            seen: vec![0; bits.div_ceil(64) as usize],
            next: vec![0; streams],
            distinct: 0,
            duplicated: 0,
            reordered: 0,
        }
    }

    /// A message that is not one of ours (too short, or numbered out of range): a fault,
    /// counted as a duplicate.
    pub fn malformed(&mut self) {
        self.duplicated += 1;
    }

    #[inline]
    pub fn see(&mut self, stream: usize, seq: u64) {
        if stream >= self.next.len() || seq >= self.per_stream {
            self.malformed();
            return;
        }
        let bit = stream as u64 * self.per_stream + seq;
        let (w, b) = ((bit / 64) as usize, bit % 64);
        if self.seen[w] & (1 << b) != 0 {
            self.duplicated += 1;
            return;
        }
        self.seen[w] |= 1 << b;
        self.distinct += 1;
        if seq != self.next[stream] {
            self.reordered += 1;
        }
        self.next[stream] = seq + 1;
    }

    /// The faults, given how many messages were expected in all.
    #[cfg(test)]
    pub fn faults(&self, expected: u64) -> Faults {
        Faults {
            lost: expected.saturating_sub(self.distinct),
            duplicated: self.duplicated,
            reordered: self.reordered,
        }
    }
}

/// The little-endian u64 at `at` in `payload`.
#[inline]
pub fn u64_at(payload: &[u8], at: usize) -> Option<u64> {
    let b = payload.get(at..at + 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The little-endian u32 at `at` in `payload`.
#[inline]
pub fn u32_at(payload: &[u8], at: usize) -> Option<u32> {
    let b = payload.get(at..at + 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// Thread `t`'s part of `total` messages split over `threads` threads.
pub fn share(total: u64, threads: usize, t: usize) -> u64 {
    let threads = threads.max(1) as u64;
    total / threads + u64::from((t as u64) < total % threads)
}

/// A small fast PRNG (xorshift64*) for picking call targets; no crate needed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------
// Latency.

/// A latency histogram in nanoseconds, 1 ns .. 1 hour, 3 significant digits.
pub fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).ctx("creating a histogram")
}

/// A histogram as (value, count) pairs, to send from a worker to the parent.
pub fn hist_to_pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// Add (value, count) pairs from [`hist_to_pairs`] to `h`.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[(u64, u64)]) -> Result<(), String> {
    for (v, c) in pairs {
        h.record_n(*v, *c).ctx("merging a histogram")?;
    }
    Ok(())
}

/// p50, p90, p99 and p99.9 in microseconds (`None` if nothing was recorded).
pub fn percentiles_us(h: &Histogram<u64>) -> Option<[f64; 4]> {
    if h.is_empty() {
        return None;
    }
    let q = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Some([q(0.50), q(0.90), q(0.99), q(0.999)])
}

/// The median of each percentile over several runs.
pub fn median_percentiles(per_run: &[[f64; 4]]) -> Option<[f64; 4]> {
    if per_run.is_empty() {
        return None;
    }
    let mut out = [0.0; 4];
    for (k, o) in out.iter_mut().enumerate() {
        let col: Vec<f64> = per_run.iter().map(|p| p[k]).collect();
        *o = summarize(&col).0;
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------
// Output: tables, progress, JSON.

/// Format a rate with an SI suffix (1.23 M).
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.1} ")
    }
}

/// Format a latency in µs with sensible precision.
pub fn us(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A text table: the first column left-aligned, the others right-aligned. A failed row
/// prints its leading cells and then the failure instead of any figure.
#[derive(Debug, Default)]
pub struct Table {
    head: Vec<String>,
    rows: Vec<(Vec<String>, Option<String>)>,
}

impl Table {
    pub fn new<S: Into<String>>(head: impl IntoIterator<Item = S>) -> Table {
        Table {
            head: head.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push((cells, None));
    }

    /// A row whose figures must not be shown: `lead` cells, then `failure`.
    pub fn failed_row(&mut self, lead: Vec<String>, failure: String) {
        self.rows.push((lead, Some(failure)));
    }

    pub fn render(&self) -> String {
        let mut w: Vec<usize> = self.head.iter().map(|h| h.chars().count()).collect();
        for (cells, _) in &self.rows {
            for (i, c) in cells.iter().enumerate() {
                if i >= w.len() {
                    w.push(0);
                }
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i == 0 {
                    s += &format!("{c:<width$}", width = w[0]);
                } else {
                    s += &format!("  {c:>width$}", width = w[i]);
                }
            }
            s
        };
        let mut out = line(&self.head).trim_end().to_string() + "\n";
        for (cells, failure) in &self.rows {
            let mut l = line(cells);
            if let Some(f) = failure {
                l += "  ";
                l += f;
            }
            out += l.trim_end();
            out.push('\n');
        }
        out
    }
}

/// A progress bar on stderr for a scenario's runs, hidden with `--quiet` or when stderr
/// is not a terminal. Without a bar, finished runs are still listed on stderr (unless
/// `--quiet`), as one line each.
pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    what: String,
}

impl Progress {
    pub fn new(total: u64, what: &str, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix:>10} [{bar:20}] {pos}/{len} runs {elapsed} (eta {eta}) {wide_msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.set_prefix(what.to_string());
            b.enable_steady_tick(Duration::from_millis(250));
            b
        });
        Progress {
            bar,
            quiet,
            what: what.to_string(),
        }
    }

    /// Say what runs now.
    pub fn running(&self, msg: String) {
        if let Some(b) = &self.bar {
            // The bar's prefix names the scenario already.
            let mut words: Vec<&str> = msg.split_whitespace().collect();
            if words.first() == Some(&self.what.as_str()) {
                words.remove(0);
            }
            b.set_message(words.join(" "));
        }
    }

    /// A run finished; `line` says how it went.
    pub fn done(&self, line: String) {
        match &self.bar {
            Some(b) => {
                b.println(line);
                b.inc(1);
            }
            None if !self.quiet => eprintln!("{line}"),
            None => {}
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub cores: usize,
    pub kernel: String,
    pub cpu: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("{} {}", std::env::consts::OS, s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_string());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        Machine { cores, kernel, cpu }
    }
}

/// The commit being measured: `git rev-parse HEAD` in the source tree this binary was
/// built from if it is still there, else in the current directory; "unknown" without git.
pub fn current_commit() -> String {
    let git = |dir: Option<&str>| {
        let mut c = Command::new("git");
        if let Some(d) = dir {
            c.arg("-C").arg(d);
        }
        c.args(["rev-parse", "HEAD"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let src = env!("CARGO_MANIFEST_DIR");
    let from_src = Path::new(src).join(".git").exists().then(|| git(Some(src)));
    from_src
        .flatten()
        .or_else(|| git(None))
        .unwrap_or_else(|| "unknown".into())
}

/// What `--json` writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub machine: Machine,
    pub commit: String,
    pub results: Vec<BenchResult>,
}

/// Write the results, with the machine and commit, as one JSON object.
pub fn write_json(path: &Path, results: &[BenchResult]) -> std::io::Result<()> {
    let r = Report {
        machine: Machine::detect(),
        commit: current_commit(),
        results: results.to_vec(),
    };
    let s = serde_json::to_string_pretty(&r).map_err(std::io::Error::other)?;
    std::fs::write(path, s + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_gives_median_min_max() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert_eq!(summarize(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn si_suffixes() {
        assert_eq!(si(1_234_567.0), "1.23 M");
        assert_eq!(si(999.0), "999.0 ");
    }

    #[test]
    fn verifier_counts_faults_per_stream() {
        let mut v = Verifier::new(2, 3);
        for (s, q) in [(0, 0), (1, 0), (0, 1), (1, 2), (1, 1), (0, 1), (0, 2)] {
            v.see(s, q);
        }
        // Stream 1 saw 2 before 1 (two reorderings: 2 skips 1, then 1 goes back).
        assert_eq!((v.distinct, v.duplicated, v.reordered), (6, 1, 2));
        v.see(2, 0); // no such stream
        v.see(0, 3); // out of range
        assert_eq!(v.duplicated, 3);
        assert_eq!(
            v.faults(7),
            Faults {
                lost: 1,
                duplicated: 3,
                reordered: 2
            }
        );
        let mut ok = Verifier::new(3, 2);
        for q in 0..2 {
            for s in 0..3 {
                ok.see(s, q);
            }
        }
        assert_eq!(ok.faults(6), Faults::default());
    }

    #[test]
    fn percentiles_come_from_the_histogram_in_microseconds() {
        let mut h = new_histogram().unwrap();
        assert_eq!(percentiles_us(&h), None);
        for i in 1..=1000u64 {
            h.record(i * 1000).unwrap(); // 1 µs .. 1000 µs
        }
        let [p50, p90, p99, p999] = percentiles_us(&h).unwrap();
        for (got, want) in [(p50, 500.0), (p90, 900.0), (p99, 990.0), (p999, 999.0)] {
            assert!((got - want).abs() <= want * 0.002, "{got} vs {want}");
        }
        // Shipping a histogram as pairs and merging it back loses nothing.
        let mut back = new_histogram().unwrap();
        add_pairs(&mut back, &hist_to_pairs(&h)).unwrap();
        assert_eq!(back.len(), 1000);
        assert_eq!(percentiles_us(&back), percentiles_us(&h));
        assert_eq!(
            median_percentiles(&[[1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0], [2.0; 4]]),
            Some([2.0, 2.0, 3.0, 4.0])
        );
    }

    #[test]
    fn tables_align_and_failed_rows_show_no_figures() {
        let mut ok = BenchResult::new("fan-in", "natural", Some(1), 100, vec![1e6, 2e6], "msgs/s");
        ok.messages = 10;
        let bad = BenchResult::new("fan-in", "linger", Some(1), 100, vec![3e6, 4e6], "msgs/s")
            .with_faults(Faults {
                lost: 2,
                duplicated: 0,
                reordered: 1,
            });
        assert!(!ok.failed() && bad.failed());
        let mut t = Table::new(["bundler", "median"]);
        for r in [&ok, &bad] {
            if r.failed() {
                t.failed_row(vec![r.label(false)], r.failure());
            } else {
                t.row(vec![r.label(false), si(r.median)]);
            }
        }
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "bundler  median");
        assert_eq!(lines[1], "natural  1.50 M");
        assert_eq!(lines[2], "linger   FAILED: lost 2 duplicated 0 reordered 1");
        assert!(!s.contains("3.50"), "a failed row shows no figure: {s}");
    }

    #[test]
    fn shares_add_up() {
        let total: u64 = (0..7).map(|t| share(100, 7, t)).sum();
        assert_eq!(total, 100);
        assert_eq!((share(100, 7, 0), share(100, 7, 6)), (15, 14));
    }

    #[test]
    fn rng_stays_in_range() {
        let mut r = Rng::new(7);
        let mut hit = [false; 3];
        for _ in 0..100 {
            hit[r.below(3)] = true;
        }
        assert_eq!(hit, [true; 3]);
    }

    #[test]
    fn machine_and_commit_are_filled() {
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(!m.kernel.is_empty() && !m.cpu.is_empty());
        assert!(!current_commit().is_empty());
    }
}
