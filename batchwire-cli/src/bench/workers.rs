//! Running a scenario's node processes: starting and collecting workers, the barrier the
//! nodes of one run meet at, per-sender sequence checks, and the bench's TLS.

mod verify;
pub use verify::*;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use batchwire::{Address, BundlerKind, Mailbox, Node, NodeConfig, RecvError};

/// What a receiving worker of a stream (throughput, fan-in) reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecvReport {
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Wall clock (ns since the epoch) when the last message arrived.
    pub end_ns: u128,
    /// CPU time of the receiving process (all its threads) from its first delivery to its
    /// last, in ns.
    #[serde(default)]
    pub cpu_ns: u64,
}

impl RecvReport {
    /// What `v` saw, the last message at `end_ns`, `cpu_ns` spent receiving.
    pub fn of(v: &Verifier, end_ns: u128, cpu_ns: u64) -> RecvReport {
        RecvReport {
            distinct: v.distinct,
            duplicated: v.duplicated,
            reordered: v.reordered,
            end_ns,
            cpu_ns,
        }
    }
}

/// The end of a receiving worker: wait for the sender at the last barrier (both sides
/// shut down together), shut down, and print what arrived.
pub fn finish_receiver(
    node: Node,
    ctl: Ctl,
    mb: batchwire::Mailbox,
    v: &mut Verifier,
    expected: u64,
    see: impl Fn(&mut Verifier, &[u8]),
    (end_ns, cpu_ns): (u128, u64),
) -> Result<(), String> {
    finish_checking(ctl, mb, v, expected, Duration::from_secs(60), see)?;
    node.shutdown();
    print_result(&RecvReport::of(v, end_ns, cpu_ns))
}

/// The last barrier of a receiving node that stopped taking messages once `v` had
/// `expected` distinct ones: after it, whatever is left in `mb` came after every expected
/// message (the senders had finished, and a node's messages arrive in the order it sent
/// them, its barrier tag last; not a message in pieces on the bulk lane, which the tag may
/// overtake), so each is checked with `see` and a repeat counts as duplicated (a late
/// duplicate is not missed by stopping at the count). A receiver that
/// stopped short (something was lost) drops its mailbox first, so that a sender still
/// sending is told its messages found no mailbox rather than left waiting for credit.
pub fn finish_checking(
    ctl: Ctl,
    mb: batchwire::Mailbox,
    v: &mut Verifier,
    expected: u64,
    timeout: Duration,
    see: impl Fn(&mut Verifier, &[u8]),
) -> Result<(), String> {
    if v.distinct < expected {
        drop(mb);
        return ctl.finish(timeout);
    }
    ctl.finish(timeout)?;
    let mut batch = Vec::new();
    while mb
        .recv_batch_into(&mut batch, 8192, Duration::ZERO)
        .is_ok_and(|n| n > 0)
    {
        for e in batch.drain(..) {
            see(v, &e.payload);
        }
    }
    Ok(())
}

/// Start node `i` of an `n`-node bench cluster (with the bench's TLS, if any) and wait
/// until it is connected to every other node. Returns the node and the others' names.
pub fn start_cluster_node(
    cfg: NodeConfig,
    i: usize,
    n: usize,
) -> Result<(Node, Vec<String>), String> {
    let node = Node::start(with_bench_settings(cfg, None))
        .ctx(&format!("starting node {}", node_name(i)))?;
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

/// Run workers under this command (a profiler: `heaptrack`, `valgrind --tool=massif`,
/// `perf record -g`), split on whitespace, with the worker's command line after it...
pub const WRAP_ENV: &str = "BATCHWIRE_BENCH_WRAP";
/// ...only the workers whose arguments contain this text (e.g. `--index 1`), if set.
pub const WRAP_ONLY_ENV: &str = "BATCHWIRE_BENCH_WRAP_ONLY";

/// Spawn this binary as a bench worker with `args`; stdout is piped for its result line.
pub fn spawn_worker(args: &[String]) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let wrap = std::env::var(WRAP_ENV).ok().filter(|w| {
        !w.trim().is_empty()
            && std::env::var(WRAP_ONLY_ENV)
                .ok()
                .is_none_or(|only| args.join(" ").contains(&only))
    });
    let mut cmd = match &wrap {
        Some(w) => {
            let mut words = w.split_whitespace();
            let mut c = Command::new(words.next().unwrap_or_default());
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // Only `bench --tls` puts every worker on TLS. A `NAME/tls` entry passes its folder
    // to its own workers (`--tls-dir`): plaintext entries run after it stay plaintext.
    match tls_for_all() {
        Some(dir) => cmd.env(TLS_DIR_ENV, dir),
        // Nor from this process's own environment.
        None => cmd.env_remove(TLS_DIR_ENV),
    };
    let host = placement(args);
    if let Some(ns) = crate::link::hosts::ns_fd(host) {
        cmd.env(crate::link::hosts::HOSTS_ENV, "netns");
        if let Some(l) = crate::link::hosts::active_link() {
            cmd.env(crate::link::hosts::LINK_ENV, l.to_string());
        }
        // `ns` stays open in this process while hosts run.
        crate::sys::exec_in_netns(&mut cmd, ns);
    }
    let child = cmd
        .arg("bench-worker")
        .args(args)
        .env(SECRET_ENV, "batchwire-bench")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    if crate::link::hosts::in_netns() {
        crate::link::hosts::register_child(child.id());
    }
    Ok(child)
}

/// Which host a worker runs on with `--hosts netns`: the one that owns its `--listen`
/// address, else node `--index`; the TCP floor's server is node 1's and its client node
/// 0's, like the nodes they stand in for.
fn placement(args: &[String]) -> usize {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    if let Some(ip) = value("--listen").and_then(|v| v.parse::<SocketAddr>().ok()) {
        return crate::link::hosts::host_of(ip.ip()).unwrap_or(0);
    }
    if let Some(i) = value("--index").and_then(|v| v.parse::<usize>().ok()) {
        return i;
    }
    usize::from(value("--role").is_some_and(|r| r == "tcp-server"))
}

/// Where bench workers find their TLS material (`bench --tls`): certificates for n0..n15.
pub const TLS_DIR_ENV: &str = "BATCHWIRE_BENCH_TLS_DIR";

static BENCH_TLS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// `bench --tls`: every worker runs TLS (see [`spawn_worker`]).
static TLS_FOR_ALL: AtomicBool = AtomicBool::new(false);

/// The certificates every worker is given: only with `bench --tls`.
pub(crate) fn tls_for_all() -> Option<&'static std::path::PathBuf> {
    BENCH_TLS
        .get()
        .filter(|_| TLS_FOR_ALL.load(Ordering::Relaxed))
}

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

/// Remove the folder [`tls_certs`] made, if it made one. Called once the bench is over:
/// the folder holds a CA's private key and must not outlive the run.
pub fn remove_tls_certs() {
    if let Some(d) = BENCH_TLS.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// `bench --tls`: every worker of every scenario runs mutual TLS.
pub fn enable_tls() -> Result<std::path::PathBuf, String> {
    let dir = tls_certs()?;
    TLS_FOR_ALL.store(true, Ordering::Relaxed);
    Ok(dir)
}

/// In a worker: TLS from the bench's folder (`--tls`, or a `NAME/tls` entry), if any;
/// and over an emulated link, failure detectors set for it (see [`crate::link::tune`]).
pub fn with_bench_settings(cfg: NodeConfig, dir: Option<&std::path::Path>) -> NodeConfig {
    let cfg = match std::env::var(crate::link::hosts::LINK_ENV)
        .ok()
        .and_then(|s| s.parse::<crate::link::LinkSpec>().ok())
    {
        Some(link) => crate::link::tune(cfg, &link),
        None => cfg,
    };
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
    outln!("RESULT {s}");
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

/// The CPU time this process (all its threads) has used so far, in ns: what a run costs,
/// as against how fast it went.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The time of `clock` in ns (0 if it cannot be read).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    crate::sys::clock_ns(clock)
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
    if crate::link::hosts::in_netns() {
        return Ok((crate::link::hosts::host_ip(i), port).into());
    }
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

#[cfg(test)]
mod tests;
