//! The `scale` scenario: what one node costs per peer. A hub node process has N peers (N
//! leaf nodes in a second process, which dial it); once all are connected and settled, the
//! hub reads its CPU time over an idle window (nothing sent; only heartbeats flow), and its
//! threads and resident memory as the window ends. Run for several N (default 1, 16 and
//! 128).
//!
//! Every node runs with static peers only (`without_membership`): with membership the
//! leaves would learn of each other through the hub and connect in a full mesh, N x N
//! connections in the leaves' one process (about 33,000 threads at N = 128, beyond this
//! machine's `pid_max`), which is not what is measured. What membership adds per member
//! is the `membership` scenario's subject.
//!
//! With `bench --tls` every node runs mutual TLS: the run makes a throwaway CA and
//! certificates for the hub and the leaves it needs (the bench's own are for n0..n15 only),
//! passes their folder to its workers, and removes it at the end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{BenchResult, Context, Progress, Table, print_result, spawn_worker, worker_result};
use batchwire::{Node, NodeConfig};

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// hub or leaves.
    #[arg(long)]
    pub role: String,
    /// Peers of the hub (= leaf nodes).
    #[arg(long)]
    pub peers: usize,
    /// The hub listens here; leaf i on base-port + 1 + i.
    #[arg(long)]
    pub base_port: u16,
    /// Seconds of idle measured.
    #[arg(long)]
    pub idle_secs: u64,
    /// Run mutual TLS with the certificates in this folder (`NAME.pem`, `NAME-key.pem`,
    /// `ca.pem` for the hub and every leaf).
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
}

/// What the hub reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HubReport {
    pub peers: usize,
    pub threads: u64,
    pub rss_kib: u64,
    /// CPU time (user + system) used during the idle window, in milliseconds.
    pub idle_cpu_ms: f64,
    pub idle_secs: f64,
    /// Frames received per second during the idle window (the peers' heartbeats).
    pub frames_per_sec: f64,
    /// The hub ran mutual TLS.
    #[serde(default)]
    pub tls: bool,
}

fn leaf_name(i: usize) -> String {
    // Sorting before "hub": the leaves dial it.
    format!("a{i:04}")
}

fn addr(base: u16, i: usize) -> Result<SocketAddr, String> {
    let port =
        u16::try_from(base as usize + i).map_err(|_| format!("port {base}+{i} is too large"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The number after `key` (e.g. "Threads:", "VmRSS:") in a /proc/PID/status text.
pub fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// (threads, resident KiB, CPU ms) of this process, from /proc.
fn own_usage() -> Result<(u64, u64, f64), String> {
    let status = std::fs::read_to_string("/proc/self/status").ctx("reading /proc/self/status")?;
    let field =
        |k: &str| status_field(&status, k).ok_or_else(|| format!("no {k} in /proc/self/status"));
    let stat = std::fs::read_to_string("/proc/self/stat").ctx("reading /proc/self/stat")?;
    // Fields after the command name (which may hold spaces): utime is the 14th field
    // overall, stime the 15th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let cpu_ms = (ticks(11) + ticks(12)) as f64 * 10.0;
    Ok((field("Threads:")?, field("VmRSS:")?, cpu_ms))
}

/// Run a worker role.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let deadline = Duration::from_secs(60 + a.peers as u64 / 2);
    let tls = |cfg: NodeConfig| match &a.tls_dir {
        Some(d) => {
            let files = batchwire::TlsFiles::in_dir(d, cfg.name());
            cfg.tls(files)
        }
        None => cfg,
    };
    match a.role.as_str() {
        "hub" => {
            let mut cfg =
                tls(NodeConfig::new("hub", addr(a.base_port, 0)?, secret).without_membership());
            for i in 0..a.peers {
                cfg = cfg.peer(leaf_name(i), addr(a.base_port, 1 + i)?);
            }
            let node = Node::start(cfg).ctx("starting the hub")?;
            let names: Vec<String> = (0..a.peers).map(leaf_name).collect();
            let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            if !node.wait_for_peers(&refs, deadline) {
                return Err(format!(
                    "only {} of {} peers connected",
                    node.connected_peers().len(),
                    a.peers
                ));
            }
            // Let the connection threads of the start settle, then measure.
            std::thread::sleep(Duration::from_secs(2));
            let frames = |n: &Node| {
                n.stats()
                    .peers
                    .iter()
                    .map(|p| p.frames_received)
                    .sum::<u64>()
            };
            let (_, _, cpu0) = own_usage()?;
            let (f0, t0) = (frames(&node), Instant::now());
            std::thread::sleep(Duration::from_secs(a.idle_secs));
            // Threads and memory as the idle window ends: what an idle node keeps (a
            // writer with nothing to write ends after a linger of 2 s).
            let (threads, rss_kib, cpu1) = own_usage()?;
            let secs = t0.elapsed().as_secs_f64();
            let f1 = frames(&node);
            node.shutdown();
            print_result(&HubReport {
                peers: a.peers,
                threads,
                rss_kib,
                idle_cpu_ms: cpu1 - cpu0,
                idle_secs: secs,
                frames_per_sec: (f1 - f0) as f64 / secs,
                tls: a.tls_dir.is_some(),
            })
        }
        "leaves" => {
            let hub = addr(a.base_port, 0)?;
            let nodes = (0..a.peers)
                .map(|i| {
                    let cfg = tls(NodeConfig::new(
                        leaf_name(i),
                        addr(a.base_port, 1 + i)?,
                        secret,
                    ))
                    .without_membership()
                    .peer("hub", hub);
                    Node::start(cfg).ctx("starting a leaf")
                })
                .collect::<Result<Vec<_>, _>>()?;
            // Stay until the hub has measured and said goodbye (or the time is up).
            let end = Instant::now() + deadline + Duration::from_secs(a.idle_secs + 30);
            let mut seen_up = vec![false; nodes.len()];
            while Instant::now() < end {
                let mut done = true;
                for (n, up) in nodes.iter().zip(seen_up.iter_mut()) {
                    let connected = !n.connected_peers().is_empty();
                    *up |= connected;
                    done &= *up && !connected;
                }
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(nodes);
            print_result(&())
        }
        other => Err(format!("unknown scale role {other:?}")),
    }
}

/// Run the scenario for each peer count.
pub fn run(
    counts: &[usize],
    idle_secs: u64,
    base_port: u16,
    quiet: bool,
) -> Result<Vec<BenchResult>, String> {
    let progress = Progress::new(counts.len() as u64, "scale", quiet);
    // `bench --tls`: certificates for the hub and as many leaves as the largest count.
    let tls_dir = match super::workers::tls_for_all() {
        Some(_) => {
            let dir =
                std::env::temp_dir().join(format!("batchwire-scale-tls-{}", std::process::id()));
            let most = counts.iter().copied().max().unwrap_or(0);
            let mut names = vec!["hub".to_string()];
            names.extend((0..most).map(leaf_name));
            let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            crate::certs::generate_certs(&dir, &refs)?;
            Some(RemoveOnDrop(dir))
        }
        None => None,
    };
    let mut reports = Vec::new();
    for &n in counts {
        if n == 0 {
            return Err("peer counts must be at least 1".into());
        }
        progress.running(format!("scale: a node with {n} peers"));
        let args = |role: &str| -> Vec<String> {
            [
                "scale",
                "--role",
                role,
                "--peers",
                &n.to_string(),
                "--base-port",
                &base_port.to_string(),
                "--idle-secs",
                &idle_secs.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(
                tls_dir
                    .iter()
                    .flat_map(|d| ["--tls-dir".to_string(), d.0.to_string_lossy().into_owned()]),
            )
            .collect()
        };
        let hub = spawn_worker(&args("hub")).ctx("starting the hub")?;
        let leaves = spawn_worker(&args("leaves")).ctx("starting the leaves")?;
        let timeout = Duration::from_secs(120 + idle_secs + n as u64);
        let r = worker_result(hub, "RESULT", timeout)?;
        let _ = worker_result(leaves, "RESULT", timeout);
        let r: HubReport = serde_json::from_str(&r).ctx("hub result")?;
        progress.done(format!(
            "  {n} peers: {} threads, {:.1} MiB, idle CPU {:.2}%",
            r.threads,
            r.rss_kib as f64 / 1024.0,
            cpu_percent(&r)
        ));
        reports.push(r);
    }
    print_table(&reports);
    Ok(reports
        .iter()
        .flat_map(|r| {
            let row = |what: &str, v: f64, unit: &str| {
                let mut b = BenchResult::new("scale", what, Some(1), 0, vec![v], unit);
                b.nodes = r.peers + 1;
                b.messages = 0;
                b
            };
            [
                row(
                    &format!("{} peers: threads", r.peers),
                    r.threads as f64,
                    "threads",
                ),
                row(
                    &format!("{} peers: resident memory", r.peers),
                    r.rss_kib as f64,
                    "KiB",
                ),
                row(
                    &format!("{} peers: idle CPU", r.peers),
                    cpu_percent(r),
                    "% of one core",
                ),
            ]
        })
        .collect())
}

/// A folder removed when dropped (it holds a throwaway CA's private key).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cpu_percent(r: &HubReport) -> f64 {
    100.0 * r.idle_cpu_ms / 1000.0 / r.idle_secs.max(1e-9)
}

fn print_table(reports: &[HubReport]) {
    // As the hubs ran it.
    let tls = !reports.is_empty() && reports.iter().all(|r| r.tls);
    outln!(
        "\nscale: one node (natural, defaults: heartbeat 500 ms; static peers, membership off{}) with N peers, each peer a node in another process; measured on the node over an idle window after connecting (nothing sent), threads and memory as it ends",
        if tls { "; mutual TLS" } else { "" }
    );
    let mut t = Table::new([
        "peers",
        "threads",
        "resident MiB",
        "idle CPU % of one core",
        "frames/s received (heartbeats)",
    ]);
    for r in reports {
        t.row(vec![
            r.peers.to_string(),
            r.threads.to_string(),
            format!("{:.1}", r.rss_kib as f64 / 1024.0),
            format!("{:.2}", cpu_percent(r)),
            format!("{:.0}", r.frames_per_sec),
        ]);
    }
    out!("{}", t.render());
    if let (Some(a), Some(b)) = (reports.first(), reports.last())
        && b.peers > a.peers
    {
        let per = |x: f64, y: f64| (y - x) / (b.peers - a.peers) as f64;
        outln!(
            "per additional peer: {:.1} threads, {:.0} KiB resident, {:.3}% of a core idle",
            per(a.threads as f64, b.threads as f64),
            per(a.rss_kib as f64, b.rss_kib as f64),
            per(cpu_percent(a), cpu_percent(b)),
        );
    }
}
