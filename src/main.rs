//! The `batchwire` command: run a node, or benchmark the bundlers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use batchwire::bench::{self, throughput};
use batchwire::{BundlerKind, Node, NodeConfig, PeerSpec, RecvError};
use clap::{Parser, Subcommand};
use tracing::level_filters::LevelFilter;

#[derive(Parser)]
#[command(
    name = "batchwire",
    version,
    about = "Fast node-to-node messaging with message bundling"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a standalone node. It serves a mailbox "echo" that sends every message back to
    /// its sender, and prints its counters every --stats-every seconds.
    Node {
        /// This node's name, unique in the cluster.
        #[arg(long)]
        name: String,
        /// Address to listen on, e.g. 127.0.0.1:7001.
        #[arg(long)]
        listen: SocketAddr,
        /// A peer, NAME=HOST:PORT; repeat for each peer.
        #[arg(long = "peer")]
        peers: Vec<PeerSpec>,
        /// File holding the cluster secret.
        #[arg(long)]
        secret_file: PathBuf,
        /// Bundler: none, natural, per-destination, transfer-queue or linger.
        #[arg(long, default_value = "natural")]
        bundler: BundlerKind,
        /// How transport threads idle, 1 (park at once) ..= 10 (busy-spin).
        #[arg(long, default_value_t = 1)]
        idle_cpu_level: u8,
        /// Print counters every this many seconds (0: never).
        #[arg(long, default_value_t = 10)]
        stats_every: u64,
        /// Exit (shutting down cleanly) after this many seconds (0: run until killed).
        #[arg(long, default_value_t = 0)]
        run_for: u64,
    },
    /// Benchmark: start node processes on loopback, verify delivery, print medians.
    Bench(BenchArgs),
    /// Internal: a process started by `bench`.
    #[command(hide = true)]
    BenchWorker {
        #[command(subcommand)]
        scenario: WorkerCmd,
    },
}

#[derive(Subcommand)]
enum WorkerCmd {
    Throughput(throughput::WorkerArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Scenario to run (default: all of them, quick).
    #[arg(value_enum)]
    scenario: Option<Scenario>,
    /// Bundlers to compare: comma-separated names, `raw` (the TCP ceiling), or `all`.
    #[arg(long, default_value = "all")]
    bundler: String,
    /// Idle levels (1..=10) to run each bundler with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    idle_cpu_level: Vec<u8>,
    /// Message sizes in bytes, comma-separated (at least 8).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    size: Vec<usize>,
    /// Messages per run (default: by size, about 300 MB or 1M messages; a fifth for none).
    #[arg(long)]
    messages: Option<u64>,
    /// Runs per bundler; runs of different bundlers alternate.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Node i listens on base-port + i.
    #[arg(long, default_value_t = 27100)]
    base_port: u16,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No per-run progress lines.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Scenario {
    Throughput,
}

fn init_logs(default: LevelFilter) {
    let level = std::env::var("BATCHWIRE_LOG")
        .ok()
        .and_then(|s| s.parse::<LevelFilter>().ok())
        .unwrap_or(default);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Node {
            name,
            listen,
            peers,
            secret_file,
            bundler,
            idle_cpu_level,
            stats_every,
            run_for,
        } => {
            init_logs(LevelFilter::INFO);
            let secret = NodeConfig::read_secret(&secret_file).map_err(|e| e.to_string());
            secret.and_then(|secret| {
                let mut cfg = NodeConfig::new(name, listen, secret)
                    .bundler(bundler)
                    .idle_cpu_level(idle_cpu_level)
                    .mailbox("echo");
                cfg.peers = peers;
                run_node(cfg, stats_every, run_for)
            })
        }
        Cmd::Bench(a) => {
            init_logs(LevelFilter::WARN);
            run_bench(a)
        }
        Cmd::BenchWorker { scenario } => {
            init_logs(LevelFilter::WARN);
            let secret =
                std::env::var(bench::SECRET_ENV).unwrap_or_else(|_| "batchwire-bench".into());
            match scenario {
                WorkerCmd::Throughput(a) => throughput::worker(&a, secret.as_bytes()),
            }
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("batchwire: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_node(cfg: NodeConfig, stats_every: u64, run_for: u64) -> Result<(), String> {
    let node = Node::start(cfg).map_err(|e| e.to_string())?;
    let echo = node.mailbox("echo").map_err(|e| e.to_string())?;
    println!("node {} listening on {}", node.name(), node.local_addr());
    let start = Instant::now();
    let mut last_stats = Instant::now();
    let mut batch = Vec::new();
    loop {
        match echo.recv_batch_into(&mut batch, 4096, Duration::from_millis(200)) {
            Ok(_) => {
                for e in batch.drain(..) {
                    if let Err(err) = echo.send(&e.from, e.payload) {
                        tracing::warn!(to = %e.from, error = %err, "echo failed");
                    }
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(RecvError::Closed) => break,
        }
        if stats_every > 0 && last_stats.elapsed() >= Duration::from_secs(stats_every) {
            print!("{}", node.stats());
            last_stats = Instant::now();
        }
        if run_for > 0 && start.elapsed() >= Duration::from_secs(run_for) {
            break;
        }
    }
    print!("{}", node.stats());
    drop(echo);
    node.shutdown();
    Ok(())
}

fn run_bench(a: BenchArgs) -> Result<(), String> {
    let entries = throughput::Entry::parse_list(&a.bundler)?;
    for l in &a.idle_cpu_level {
        batchwire::core::idle::IdleStrategy::from_level(*l)?;
    }
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let mut results = Vec::new();
    let scenarios = match a.scenario {
        Some(s) => vec![s],
        None => vec![Scenario::Throughput],
    };
    for s in scenarios {
        match s {
            Scenario::Throughput => {
                let o = throughput::Options {
                    sizes: a.size.clone(),
                    entries: entries.clone(),
                    idle_levels: a.idle_cpu_level.clone(),
                    messages: a.messages,
                    runs: a.runs,
                    base_port: a.base_port,
                    quiet: a.quiet,
                };
                results.extend(throughput::run(&o)?);
            }
        }
    }
    if let Some(path) = &a.json {
        bench::write_json(path, &results)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    let failed: Vec<_> = results.iter().filter(|r| r.failed()).collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} result(s) FAILED verification (lost, duplicated or reordered messages)",
            failed.len()
        ));
    }
    Ok(())
}
