//! The `batchwire` command: run a node, or benchmark the bundlers.
// The C library is called from `sys` alone.
#![deny(unsafe_code)]

/// `println!` that ends the process quietly on a closed pipe (see `sys::write_stdout`).
macro_rules! outln {
    () => { $crate::sys::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::sys::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that ends the process quietly on a closed pipe (see `sys::write_stdout`).
macro_rules! out {
    ($($t:tt)*) => { $crate::sys::write_stdout(format_args!($($t)*)) };
}

mod bench;
mod certs;
mod client;
mod echo;
mod link;
mod metrics_http;
mod nodefile;
mod sys;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bench::{Common, Overrides, Remote, fanin, mperf, plot, roundtrip, rpc, throughput};
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
        /// A config file (TOML) with any of the settings below and more (see
        /// --print-config); flags given here win over it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print every setting with its default, as a commented config file, and exit.
        #[arg(long)]
        print_config: bool,
        /// This node's name, unique in the cluster (here or in the config file).
        #[arg(long)]
        name: Option<String>,
        /// Address to listen on, e.g. 127.0.0.1:7001, [::1]:7001 or localhost:7001.
        #[arg(long, value_parser = client::resolve_addr)]
        listen: Option<SocketAddr>,
        /// A peer, NAME=HOST:PORT; repeat for each peer.
        #[arg(long = "peer")]
        peers: Vec<PeerSpec>,
        /// File holding the cluster secret.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Bundler: none, natural, per-destination, transfer-queue or linger [default: natural].
        #[arg(long)]
        bundler: Option<BundlerKind>,
        /// How transport threads idle, 1 (park at once) ..= 10 (busy-spin) [default: 1].
        #[arg(long)]
        idle_cpu_level: Option<u8>,
        /// Mutual TLS: this node's certificate (PEM; it must name the node).
        #[arg(long, requires_all = ["tls_key", "tls_ca"])]
        tls_cert: Option<PathBuf>,
        /// Mutual TLS: this node's private key (PEM).
        #[arg(long, requires_all = ["tls_cert", "tls_ca"])]
        tls_key: Option<PathBuf>,
        /// Mutual TLS: the CA that signed every node's certificate (PEM).
        #[arg(long, requires_all = ["tls_cert", "tls_key"])]
        tls_ca: Option<PathBuf>,
        /// Print counters every this many seconds (0: never) [default: 10].
        #[arg(long)]
        stats_every: Option<u64>,
        /// Print the counters as one JSON object a line (`NodeStats`), not as text.
        #[arg(long)]
        stats_json: bool,
        /// Print only the node's own counters (membership, totals), not every peer's:
        /// for clusters of hundreds of members.
        #[arg(long)]
        stats_brief: bool,
        /// Serve the node's counters for Prometheus at http://ADDR/metrics: a port (on
        /// 127.0.0.1) or an address (0.0.0.0:9100 to serve other hosts too)
        #[arg(long, value_parser = metrics_http::parse_addr)]
        metrics_listen: Option<SocketAddr>,
        /// Exit (shutting down cleanly) after this many seconds (0: run until stopped).
        #[arg(long, default_value_t = 0)]
        run_for: u64,
        /// Milliseconds a new connection has for TLS, the handshake and RESUME together
        /// [default: 5000].
        #[arg(long)]
        handshake_timeout_ms: Option<u64>,
        /// A connection to a member is made on the first send to it and closed after this
        /// many milliseconds with no message either way (0: dial every member when it joins
        /// and keep every connection, the full mesh) [default: 60000].
        #[arg(long)]
        idle_close_ms: Option<u64>,
        /// Most inbound handshakes in progress; more are closed at once [default: 64].
        #[arg(long)]
        max_handshakes: Option<usize>,
        /// Most inbound handshakes in progress from one source address [default: 16].
        #[arg(long)]
        max_handshakes_per_address: Option<usize>,
        /// Join a running cluster through the member at HOST:PORT (repeatable; one that
        /// answers is enough). HOST may be a DNS name: it is resolved again and again
        /// (join_refresh_ms in a config file, default 30 s) and every address it lists is a
        /// seed. Membership events are printed as `member ...` lines.
        #[arg(long = "join")]
        join: Vec<batchwire::Seed>,
        /// The address other members dial to reach this node [default: --listen].
        #[arg(long, value_parser = client::resolve_addr)]
        advertise: Option<SocketAddr>,
    },
    /// Send messages to a mailbox of a running cluster: each MESSAGE argument is one
    /// message (none: each line of standard input is one). Waits until the receiving node
    /// acknowledged them all; exits 1 if any failed or found no such mailbox.
    #[command(
        after_help = "Example: batchwire send inbox@b hello --join 127.0.0.1:7001 --secret-file secret"
    )]
    Send {
        /// Where: MAILBOX@NODE, e.g. inbox@b.
        to: String,
        /// The messages (text).
        messages: Vec<String>,
        #[command(flatten)]
        connect: client::Connect,
    },
    /// Make a request to a mailbox of a running cluster and print the reply.
    #[command(
        after_help = "Example: batchwire request echo@b ping --join 127.0.0.1:7001 --secret-file secret"
    )]
    Request {
        /// Where: MAILBOX@NODE, e.g. echo@b (every `batchwire node` serves echo).
        to: String,
        /// The request (text).
        message: String,
        /// How long to wait for the reply, e.g. 5s, 500ms.
        #[arg(long, default_value = "5s", value_parser = bench::soak::parse_duration)]
        timeout: Duration,
        #[command(flatten)]
        connect: client::Connect,
    },
    /// Open a mailbox on a client node and print every message that arrives in it, one a
    /// line: "FROM<TAB>TEXT" (or JSON). Others send to MAILBOX@NAME (the name is printed
    /// on stderr at start; choose it with --name).
    #[command(
        after_help = "Example: batchwire listen inbox --name '!me' --join 127.0.0.1:7001 --secret-file secret"
    )]
    Listen {
        /// The mailbox's name.
        mailbox: String,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this long, e.g. 30s.
        #[arg(long = "for", value_parser = bench::soak::parse_duration)]
        duration: Option<Duration>,
        /// Answer each request that arrives with this text.
        #[arg(long)]
        reply: Option<String>,
        #[command(flatten)]
        connect: client::Connect,
    },
    /// List the members of a running cluster: the client's own view once it has joined
    /// (--join), or the view of --node (or the first --peer), asked over its "status"
    /// mailbox.
    #[command(
        after_help = "Example: batchwire members --join 127.0.0.1:7001 --secret-file secret --json"
    )]
    Members {
        /// Show this node's view instead.
        #[arg(long)]
        node: Option<String>,
        /// Also members that are down or left.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        connect: client::Connect,
    },
    /// Print the status of the nodes of a running cluster (each `batchwire node` answers on
    /// its "status" mailbox): version, addresses, members, and per peer its connection and
    /// counters. Every live member with --join, the --peer nodes, or just --node.
    #[command(
        after_help = "Example: batchwire status --join 127.0.0.1:7001 --secret-file secret --json"
    )]
    Status {
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
        /// Also members that are down or left, and peers no longer connected.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        connect: client::Connect,
    },
    /// Generate a test CA and a certificate per node, to try mutual TLS in a minute.
    Certs {
        /// Folder to write ca.pem, ca-key.pem, NAME.pem and NAME-key.pem into.
        #[arg(long)]
        out: PathBuf,
        /// Node names, comma-separated (each becomes the certificate's DNS name).
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
    },
    /// Benchmark: start node processes on loopback, verify delivery, print medians.
    #[command(after_help = "Each scenario's own text and flags: batchwire bench SCENARIO --help")]
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
    Throughput(crate::bench::stream::WorkerArgs),
    FanIn(fanin::WorkerArgs),
    Mperf(mperf::WorkerArgs),
    Rpc(rpc::WorkerArgs),
    Roundtrip(roundtrip::WorkerArgs),
    Scale(crate::bench::scale::WorkerArgs),
    Hol(crate::bench::hol::WorkerArgs),
    Soak(crate::bench::soak::worker::WorkerArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Scenario to run (default: a quick version of every scenario).
    #[arg(value_enum)]
    scenario: Option<Scenario>,
    /// Bundlers to compare: comma-separated names, `raw` (pre-encoded messages over plain TCP: the ceiling of throughput, fan-in and mperf), `tcp` (the bytes alone in 1 MiB writes: throughput's true ceiling), or `all`.
    #[arg(long, default_value = "all")]
    bundler: String,
    /// Idle levels (1..=10) to run each bundler with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    idle_cpu_level: Vec<u8>,
    /// Message sizes in bytes, comma-separated (default per scenario: throughput and
    /// roundtrip 100,1000,10000; fan-in 100; mperf 1000; rpc 100).
    #[arg(long, value_delimiter = ',')]
    size: Option<Vec<usize>>,
    /// Nodes (mperf: 4, rpc: 4; membership: 8, 16 and 32; the other scenarios run 2).
    #[arg(long)]
    nodes: Option<usize>,
    /// Threads: fan-in's sender threads (1000), rpc's calling threads per node (16).
    #[arg(long)]
    threads: Option<usize>,
    /// Messages per run: throughput per run (by size), fan-in in all (200,000), mperf per
    /// node (100,000), rpc calls per node (20,000), roundtrip per batch (1000).
    #[arg(long)]
    messages: Option<u64>,
    /// Runs per bundler; runs of different bundlers alternate (default 5; 3 when quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Node i listens on base-port + i.
    #[arg(long, default_value_t = 27100)]
    base_port: u16,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the results as an SVG chart here (.svg only).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Run against `batchwire node` processes already running (rpc and roundtrip only):
    /// NAME=HOST:PORT, comma-separated. This process is the client node.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<PeerSpec>,
    /// With --peers: the file holding their cluster secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run every node with mutual TLS (a throwaway CA in a temporary folder). In
    /// throughput, `--bundler natural,natural/tls` compares both in one run instead.
    #[arg(long)]
    tls: bool,
    /// throughput: print sent / delivered / lost / duplicated / reordered for every run
    /// (every run is verified either way; this shows the counts).
    #[arg(long)]
    verify: bool,
    /// throughput: close the sending node's connections every this many milliseconds
    /// while it streams (chaos; reliable delivery must lose and repeat nothing).
    #[arg(long, default_value_t = 0)]
    break_every: u64,
    /// throughput: both nodes send to each other at once (each direction reported and
    /// verified on its own).
    #[arg(long)]
    duplex: bool,
    /// fan-in: run the sending node's process on CPU 0 and the receiving one's on CPU 1,
    /// each pinned, as on two machines (by default the scheduler places both, and 1000
    /// sender threads share the CPUs with the receiver).
    #[arg(long)]
    pin: bool,
    /// The nodes' send window in bytes (`NodeConfig::unacked_bytes`; default 16 MiB), e.g.
    /// 65536 with --duplex to keep both windows full.
    #[arg(long)]
    unacked_bytes: Option<usize>,
    /// scale: the peer counts of the node measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,128")]
    peer_counts: Vec<usize>,
    /// scale: seconds of idle measured per peer count.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// hol: milliseconds per phase (default 3000; 1500 when quick); membership: the
    /// window at rest (default 5000).
    #[arg(long)]
    phase_ms: Option<u64>,
    /// membership: the nodes' `--idle-close-ms` (connections on demand, closed after this
    /// long idle; 0: the full mesh) [default: 2000].
    #[arg(long)]
    idle_close_ms: Option<u64>,
    /// hol: the nodes' bulk budget (`NodeConfig::bulk_inflight_bytes`; default 128 KiB).
    #[arg(long)]
    bulk_inflight_bytes: Option<usize>,
    /// Where the nodes run: `loopback` (this host), or `netns`, a network namespace per
    /// node joined by the emulated link (needs root; throughput, fan-in, mperf, rpc,
    /// roundtrip and soak).
    #[arg(long, value_enum, default_value = "loopback")]
    hosts: HostsKind,
    /// With --hosts netns: the link between every two hosts, both directions, e.g.
    /// rtt=170ms,rate=20mbit[,loss=0.1%][,queue=BYTES] (default: no delay, no limit).
    #[arg(long)]
    link: Option<link::LinkSpec>,
    /// roundtrip: measured batches per size, comma-separated in size order, or one count
    /// for every size (default 100,50,15 as in the post; half when quick).
    #[arg(long, value_delimiter = ',')]
    batches: Option<Vec<u64>>,
    /// roundtrip: warm-up batches (default 50; half when quick).
    #[arg(long)]
    warmup_batches: Option<u64>,
    /// soak: how long to stream, e.g. 60s, 15m, 1h [default: 60s].
    #[arg(long, value_parser = crate::bench::soak::parse_duration)]
    duration: Option<Duration>,
    /// soak: messages per second from each node to each other node.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// soak: kill every connection between the nodes from outside (`ss -K`) this often,
    /// e.g. 1s, 200ms.
    #[arg(long, default_value = "1s", value_parser = crate::bench::soak::parse_duration)]
    kill_every: Duration,
    /// soak: SIGKILL the last node and start it again this often.
    #[arg(long, default_value = "60s", value_parser = crate::bench::soak::parse_duration)]
    restart_every: Duration,
    /// soak: print the totals this often.
    #[arg(long, default_value = "60s", value_parser = crate::bench::soak::parse_duration)]
    report_every: Duration,
    /// No progress bar or per-run lines.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum HostsKind {
    Loopback,
    Netns,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Throughput,
    FanIn,
    Mperf,
    Rpc,
    Roundtrip,
    /// What a node costs per peer (threads, memory, idle CPU); not in the quick default.
    Scale,
    /// No head-of-line blocking: small-message latency beside a 64 MiB stream, and the
    /// rate to one mailbox while another is never read.
    Hol,
    /// Cluster membership: N node processes join through one seed; convergence, crash
    /// detection, rejoin and bytes at rest (not in the quick default).
    Membership,
    /// Reliability over time: N nodes stream to each other while connections are killed
    /// from outside and one node is SIGKILLed and restarted (not in the quick default).
    Soak,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Throughput => "throughput",
            Scenario::FanIn => "fan-in",
            Scenario::Mperf => "mperf",
            Scenario::Rpc => "rpc",
            Scenario::Roundtrip => "roundtrip",
            Scenario::Scale => "scale",
            Scenario::Hol => "hol",
            Scenario::Membership => "membership",
            Scenario::Soak => "soak",
        }
    }

    /// The quick default order: the cheap, informative ones first.
    const ALL: [Scenario; 5] = [
        Scenario::Throughput,
        Scenario::FanIn,
        Scenario::Mperf,
        Scenario::Rpc,
        Scenario::Roundtrip,
    ];
}

fn init_logs(default: LevelFilter) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // BATCHWIRE_LOG (or else RUST_LOG): a level, or per-target directives as RUST_LOG
    // takes them without regexes ("warn,batchwire::io=debug"). One that does not parse is
    // said, not ignored.
    let (var, spec) = match (std::env::var("BATCHWIRE_LOG"), std::env::var("RUST_LOG")) {
        (Ok(s), _) => ("BATCHWIRE_LOG", Some(s)),
        (Err(_), Ok(s)) => ("RUST_LOG", Some(s)),
        _ => ("", None),
    };
    let filter = match spec.as_deref().map(str::parse::<Targets>) {
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            eprintln!(
                "batchwire: {var}={:?} is not a log filter ({e}): using {default}; give a \
                 level (error, warn, info, debug, trace) or TARGET=LEVEL,...",
                spec.unwrap_or_default()
            );
            Targets::new().with_default(default)
        }
        None => Targets::new().with_default(default),
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only for a terminal: not into a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(layer)
        .with(filter)
        .try_init();
}

/// Every scenario: what it measures, and the flags that apply to it (`bench SCENARIO
/// --help` shows only those).
const SCENARIO_HELP: &[(&str, &str, &[&str])] = &[
    (
        "throughput",
        "One sender thread streams to one mailbox on another node process, one way (or both \
         ways with --duplex); every message is verified. Reports messages/s and bytes/s by \
         bundler and size, beside `raw` (the same messages pre-encoded over plain TCP) and \
         `tcp` (the same bytes alone in 1 MiB writes: what the socket carries) if asked.",
        &[
            "size",
            "messages",
            "verify",
            "break_every",
            "duplex",
            "unacked_bytes",
            "tls",
            "hosts",
            "link",
        ],
    ),
    (
        "fan-in",
        "Many sender threads (1000 by default) on one node send to one mailbox on another: \
         what bundling does when many small sends meet one connection.",
        &["size", "threads", "messages", "pin", "tls", "hosts", "link"],
    ),
    (
        "mperf",
        "JGroups' MPerf: every node sends to every other at once (4 nodes by default); the \
         cluster's total rate.",
        &["size", "nodes", "messages", "tls", "hosts", "link"],
    ),
    (
        "rpc",
        "Request/reply (JGroups' UnicastTestRpc): calling threads on every node call random \
         others; calls/s and latency percentiles, beside a TCP ping-pong floor. With --peers, \
         against running `batchwire node` processes.",
        &[
            "size",
            "nodes",
            "threads",
            "messages",
            "peers",
            "secret_file",
            "tls",
            "hosts",
            "link",
        ],
    ),
    (
        "roundtrip",
        "The Erlang post's test: batches of messages sent and echoed back; ms per batch by \
         size. With --peers, against running `batchwire node` processes.",
        &[
            "size",
            "batches",
            "warmup_batches",
            "peers",
            "secret_file",
            "tls",
            "hosts",
            "link",
        ],
    ),
    (
        "scale",
        "What a node costs per peer: threads, memory and idle CPU of one node with 1, 16 and \
         128 peers (not in the quick default).",
        &["peer_counts", "idle_secs"],
    ),
    (
        "hol",
        "No head-of-line blocking: small-message latency beside a 64 MiB stream, and the \
         rate to one mailbox while another is never read.",
        &["phase_ms", "bulk_inflight_bytes", "tls"],
    ),
    (
        "membership",
        "Cluster membership: N node processes join through one seed; time to converge, to \
         see a SIGKILLed node down, to rejoin, and bytes/s at rest (8, 16 and 32 nodes by \
         default; not in the quick default).",
        &["nodes", "phase_ms", "idle_close_ms"],
    ),
    (
        "soak",
        "Reliability over time: N nodes stream to each other while connections are killed \
         from outside and one node is SIGKILLed and restarted; every message is counted \
         (not in the quick default).",
        &[
            "duration",
            "nodes",
            "size",
            "rate",
            "kill_every",
            "restart_every",
            "report_every",
            "hosts",
            "link",
        ],
    ),
];

/// Flags every scenario takes.
const BENCH_COMMON: &[&str] = &[
    "bundler",
    "idle_cpu_level",
    "runs",
    "base_port",
    "json",
    "plot",
    "quiet",
];

/// `batchwire bench SCENARIO --help`: that scenario's text and flags only (clap would show
/// every flag of every scenario).
fn scenario_help(args: &[String]) -> Option<String> {
    use clap::Args;
    if args.get(1).map(String::as_str) != Some("bench")
        || !args.iter().any(|a| a == "--help" || a == "-h")
    {
        return None;
    }
    let name = args[2..].iter().find(|a| !a.starts_with('-'))?;
    let (name, about, flags) = SCENARIO_HELP.iter().find(|(n, _, _)| n == name)?;
    let mut cmd = BenchArgs::augment_args(clap::Command::new("bench"))
        .bin_name(format!("batchwire bench {name}"))
        .about(*about)
        .mut_arg("scenario", |a| a.hide(true));
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        if id != "scenario" && !flags.contains(&id.as_str()) && !BENCH_COMMON.contains(&id.as_str())
        {
            cmd = cmd.mut_arg(id, |a| a.hide(true));
        }
    }
    Some(cmd.render_help().to_string())
}

fn main() -> ExitCode {
    sys::limit_malloc_arenas();
    let args: Vec<String> = std::env::args().collect();
    if let Some(help) = scenario_help(&args) {
        out!("{help}");
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Node {
            config,
            print_config,
            name,
            listen,
            peers,
            secret_file,
            bundler,
            idle_cpu_level,
            tls_cert,
            tls_key,
            tls_ca,
            stats_every,
            stats_json,
            stats_brief,
            metrics_listen,
            run_for,
            handshake_timeout_ms,
            idle_close_ms,
            max_handshakes,
            max_handshakes_per_address,
            join,
            advertise,
        } => {
            if print_config {
                out!("{}", nodefile::DEFAULTS);
                return ExitCode::SUCCESS;
            }
            init_logs(LevelFilter::INFO);
            let flags = nodefile::Flags {
                name,
                listen,
                secret_file,
                peers,
                bundler,
                idle_cpu_level,
                tls: match (tls_cert, tls_key, tls_ca) {
                    (Some(cert), Some(key), Some(ca)) => {
                        Some(batchwire::TlsFiles { cert, key, ca })
                    }
                    _ => None,
                },
                stats_every,
                metrics_listen,
                handshake_timeout_ms,
                idle_close_ms,
                max_handshakes,
                max_handshakes_per_address,
                join,
                advertise,
            };
            let file = match &config {
                Some(path) => nodefile::read(path),
                None => Ok(nodefile::CliFile::default()),
            };
            // A setting that does not build names the file it may come from.
            let built = file
                .and_then(|f| nodefile::build(flags, f))
                .map_err(|e| match &config {
                    Some(path) if !e.starts_with("config file") => {
                        format!("{e} (with config file {})", path.display())
                    }
                    _ => e,
                });
            built.and_then(|(cfg, mut extras)| {
                extras.stats_json = stats_json;
                extras.stats_brief = stats_brief;
                run_node(cfg, &extras, run_for)
            })
        }
        Cmd::Bench(a) => {
            init_logs(LevelFilter::WARN);
            let result = run_bench(a);
            // The throwaway CA's key and certificates go with the run (also on error).
            bench::remove_tls_certs();
            result
        }
        Cmd::Send {
            to,
            messages,
            connect,
        } => {
            // The command reports what went wrong itself; BATCHWIRE_LOG=warn shows more.
            init_logs(LevelFilter::ERROR);
            client::send(&connect, &to, messages)
        }
        Cmd::Request {
            to,
            message,
            timeout,
            connect,
        } => {
            // The command reports what went wrong itself; BATCHWIRE_LOG=warn shows more.
            init_logs(LevelFilter::ERROR);
            client::request(&connect, &to, &message, timeout)
        }
        Cmd::Listen {
            mailbox,
            count,
            duration,
            reply,
            connect,
        } => {
            // The command reports what went wrong itself; BATCHWIRE_LOG=warn shows more.
            init_logs(LevelFilter::ERROR);
            client::listen(&connect, &mailbox, count, duration, reply.as_deref())
        }
        Cmd::Members { node, all, connect } => {
            // The command reports what went wrong itself; BATCHWIRE_LOG=warn shows more.
            init_logs(LevelFilter::ERROR);
            client::members(&connect, node.as_deref(), all)
        }
        Cmd::Status { node, all, connect } => {
            // The command reports what went wrong itself; BATCHWIRE_LOG=warn shows more.
            init_logs(LevelFilter::ERROR);
            client::status(&connect, node.as_deref(), all)
        }
        Cmd::Certs { out, nodes } => {
            let names: Vec<&str> = nodes.iter().map(|s| s.as_str()).collect();
            certs::generate_certs(&out, &names)
                .map(|()| {
                    outln!(
                        "wrote {}: ca.pem, ca-key.pem, and NAME.pem + NAME-key.pem for {}",
                        out.display(),
                        names.join(", ")
                    );
                    outln!(
                        "use: batchwire node --name {n} --tls-cert {d}/{n}.pem --tls-key {d}/{n}-key.pem --tls-ca {d}/ca.pem ...",
                        n = names.first().copied().unwrap_or("a"),
                        d = out.display()
                    );
                })
        }
        Cmd::BenchWorker { scenario } => {
            // Nodes coming and going is the normal course of a bench run: only errors show
            // (BATCHWIRE_LOG=warn shows more); what arrived is verified anyway.
            init_logs(LevelFilter::ERROR);
            let secret =
                std::env::var(bench::SECRET_ENV).unwrap_or_else(|_| "batchwire-bench".into());
            let secret = secret.as_bytes();
            match scenario {
                WorkerCmd::Throughput(a) => crate::bench::stream::worker(&a, secret),
                WorkerCmd::FanIn(a) if a.role.starts_with("raw-") => {
                    crate::bench::faninraw::worker(&a)
                }
                WorkerCmd::FanIn(a) => fanin::worker(&a, secret),
                WorkerCmd::Mperf(a) => mperf::worker(&a, secret),
                WorkerCmd::Rpc(a) if a.role.starts_with("tcp-") => bench::pingpong::worker(&a),
                WorkerCmd::Rpc(a) => rpc::worker(&a, secret),
                WorkerCmd::Roundtrip(a) => roundtrip::worker(&a, secret),
                WorkerCmd::Scale(a) => crate::bench::scale::worker(&a, secret),
                WorkerCmd::Soak(a) => crate::bench::soak::worker::worker(&a, secret),
                WorkerCmd::Hol(a) => crate::bench::hol::worker(&a, secret),
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

fn run_node(cfg: NodeConfig, extras: &nodefile::Extras, run_for: u64) -> Result<(), String> {
    if let Some(t) = &extras.tls {
        t.check_names(cfg.name()).map_err(|e| e.to_string())?;
    }
    let stop = sys::stop_signals()?;
    let stats_every = extras.stats_every;
    let metrics = match extras.metrics_listen {
        Some(addr) => Some(metrics_http::serve(addr)?),
        None => None,
    };
    let started = Instant::now();
    let node = Node::start(cfg.mailbox(client::STATUS_MAILBOX)).map_err(|e| e.to_string())?;
    let mut last_published: Option<Instant> = None;
    let echo = node.mailbox("echo").map_err(|e| e.to_string())?;
    let status = node
        .mailbox(client::STATUS_MAILBOX)
        .map_err(|e| e.to_string())?;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Status requests are answered by a thread of their own, so they never wait behind
        // echo traffic. It ends when the mailbox closes (at shutdown) or `stop` is set.
        let (node, stop, done, status) = (&node, &stop, &done, &status);
        let answering = scope.spawn(move || serve_status(node, status, [stop, done], started));
        let r = echo_loop(
            node,
            echo,
            stop,
            &metrics,
            (stats_every, extras.stats_json, extras.stats_brief),
            run_for,
            started,
            &mut last_published,
        );
        done.store(true, Ordering::Release);
        // Wake the status thread now rather than at its next timeout.
        if let Ok(to) = batchwire::Address::new(node.name(), client::STATUS_MAILBOX) {
            let _ = status.try_send(&to, bytes::Bytes::new());
        }
        let _ = answering.join();
        r
    })?;
    print_stats(&node, extras.stats_json, extras.stats_brief);
    node.shutdown();
    Ok(())
}

/// The node's counters on stdout: text, or one JSON object on one line.
fn print_stats(node: &Node, json: bool, brief: bool) {
    let stats = if brief {
        node.stats_brief()
    } else {
        node.stats()
    };
    if json {
        match serde_json::to_string(&stats) {
            Ok(j) => outln!("{j}"),
            Err(e) => tracing::warn!(error = %e, "cannot print the counters as JSON"),
        }
    } else {
        out!("{stats}");
    }
}

/// Answer status requests (see `client::status_json`) until either flag is set.
fn serve_status(
    node: &Node,
    status: &batchwire::Mailbox,
    until: [&AtomicBool; 2],
    started: Instant,
) {
    // The echo loop wakes this thread when it ends (an empty message, see `run_node`);
    // the timeout is only a backstop.
    while !until.iter().any(|f| f.load(Ordering::Acquire)) {
        match status.recv_timeout(Duration::from_secs(5)) {
            Ok(e) if e.is_request() => {
                let body = client::status_json(node, started).to_string();
                if let Err(err) = e.try_reply(body) {
                    tracing::debug!(from = %e.from, error = %err, "status: reply not sent");
                }
            }
            Ok(_) | Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => break,
        }
    }
}

/// Longest the node's main loop sleeps with nothing to do; a SIGTERM is seen within it.
const STOP_POLL: Duration = Duration::from_millis(500);

/// The node's main loop: answer echo, publish metrics and status, print counters.
#[allow(clippy::too_many_arguments)]
fn echo_loop(
    node: &Node,
    echo: batchwire::Mailbox,
    stop: &AtomicBool,
    metrics: &Option<metrics_http::Served>,
    (stats_every, stats_json, stats_brief): (u64, bool, bool),
    run_for: u64,
    started: Instant,
    last_published: &mut Option<Instant>,
) -> Result<(), String> {
    // Subscribe first, then print the view as it stands: members that joined before the
    // subscription are printed from the view (one may be printed twice), none is missed.
    let events = node.events();
    for m in node.members() {
        let what = match m.state {
            batchwire::MemberState::Alive => "joined",
            batchwire::MemberState::Suspect => "suspected",
            batchwire::MemberState::Down => "down",
            _ => "left",
        };
        outln!("member {what} {} {} {}", m.name, m.addr, m.incarnation);
    }
    print_member_events(events);
    outln!("node {} listening on {}", node.name(), node.local_addr());
    let start = Instant::now();
    let mut last_stats = Instant::now();
    let mut batch = Vec::new();
    // A request gets a reply; a plain message goes back to its sender. Never waiting for
    // one client: see echo.rs.
    let mut owed = echo::Echo::default();
    let answer = |batch: &mut Vec<batchwire::Envelope>, owed: &mut echo::Echo| {
        owed.retry(&echo);
        for e in batch.drain(..) {
            owed.answer(&echo, e);
        }
    };
    loop {
        if stop.load(Ordering::Acquire) {
            // What the mailbox already holds was accepted: answer it before going.
            // (Only what is there now: peers may go on sending until our goodbye.)
            let held = echo.len();
            let mut n = 0;
            while n < held {
                match echo.recv_batch_into(&mut batch, 4096.min(held - n), Duration::ZERO) {
                    Ok(k) => n += k,
                    Err(_) => break,
                }
                answer(&mut batch, &mut owed);
            }
            // What still waits for room gets until the shutdown's own deadline.
            let until = Instant::now() + Duration::from_secs(5);
            while owed.is_waiting() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                owed.retry(&echo);
            }
            if owed.is_waiting() {
                tracing::warn!(
                    answers = owed.waiting(),
                    "echo: clients took no answers before the shutdown; these were not sent"
                );
            }
            tracing::info!(node = %node.name(), answered = n, "signal: draining and shutting down");
            break;
        }
        // Answers waiting for room are retried every 10 ms. Otherwise the loop sleeps until
        // its next duty (counters, metrics, the end of `--run-for`), at most `STOP_POLL`:
        // that is how soon a signal is seen. A thousand idle nodes on one machine each
        // woke ten times a second before (this loop and the status thread at 200 ms).
        let wait = if owed.is_waiting() {
            Duration::from_millis(10)
        } else {
            let mut due = STOP_POLL;
            let left = |since: Instant, every: Duration| every.saturating_sub(since.elapsed());
            if stats_every > 0 {
                due = due.min(left(last_stats, Duration::from_secs(stats_every)));
            }
            if metrics.is_some() {
                let since = last_published.unwrap_or(start);
                due = due.min(left(since, Duration::from_secs(1)));
            }
            if run_for > 0 {
                due = due.min(left(start, Duration::from_secs(run_for)));
            }
            due.max(Duration::from_millis(1))
        };
        match echo.recv_batch_into(&mut batch, 4096, wait) {
            Ok(_) | Err(RecvError::Timeout | RecvError::Empty) => answer(&mut batch, &mut owed),
            Err(_) => break,
        }
        // Metrics are copied from the node's counters once a second (a scrape sees values
        // at most that old).
        if let Some(m) = metrics
            && last_published.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            node.publish_metrics();
            m.metrics.run_upkeep();
            *m.status.lock().unwrap_or_else(|p| p.into_inner()) =
                client::status_json(node, started).to_string();
            *last_published = Some(Instant::now());
        }
        if stats_every > 0 && last_stats.elapsed() >= Duration::from_secs(stats_every) {
            print_stats(node, stats_json, stats_brief);
            last_stats = Instant::now();
        }
        if run_for > 0 && start.elapsed() >= Duration::from_secs(run_for) {
            break;
        }
    }
    Ok(())
}

/// Print each membership event as one line on stdout, as it happens:
/// `member joined|suspected|alive|down|left NAME ADDR INCARNATION`.
fn print_member_events(events: std::sync::mpsc::Receiver<batchwire::Event>) {
    use batchwire::Event as E;
    let spawned = std::thread::Builder::new()
        .name("member-events".into())
        .spawn(move || {
            use std::fmt::Write;
            // Every event already waiting goes out in one write: a thousand members
            // joining were a thousand writes (and wake-ups of whoever reads) per node.
            let mut lines = String::new();
            while let Ok(first) = events.recv() {
                for e in std::iter::once(first).chain(events.try_iter().take(1024)) {
                    let (what, m) = match &e {
                        E::MemberJoined { member } => ("joined", member),
                        E::MemberSuspected { member } => ("suspected", member),
                        E::MemberAlive { member } => ("alive", member),
                        E::MemberDown { member } => ("down", member),
                        E::MemberLeft { member } => ("left", member),
                        _ => continue,
                    };
                    let _ = writeln!(
                        lines,
                        "member {what} {} {} {}",
                        m.name, m.addr, m.incarnation
                    );
                }
                if !lines.is_empty() {
                    out!("{lines}");
                    lines.clear();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the event printer");
    }
}

fn run_bench(a: BenchArgs) -> Result<(), String> {
    let started = Instant::now();
    let entries = throughput::Entry::parse_list(&a.bundler)?;
    for l in &a.idle_cpu_level {
        batchwire_core::idle::IdleStrategy::from_level(*l)?;
    }
    if a.runs == Some(0) {
        return Err("--runs must be at least 1".into());
    }
    let throughput_only = [
        ("--duplex", a.duplex),
        ("--unacked-bytes", a.unacked_bytes.is_some()),
        ("--break-every", a.break_every > 0),
        ("--verify", a.verify),
    ];
    if a.scenario != Some(Scenario::Throughput)
        && let Some((flag, _)) = throughput_only.iter().find(|(_, on)| *on)
    {
        return Err(format!(
            "{flag} applies to the throughput scenario: batchwire bench throughput {flag} ..."
        ));
    }
    if a.pin && a.scenario != Some(Scenario::FanIn) {
        return Err(
            "--pin applies to the fan-in scenario: batchwire bench fan-in --pin ...".into(),
        );
    }
    if a.scenario != Some(Scenario::Roundtrip)
        && (a.batches.is_some() || a.warmup_batches.is_some())
    {
        return Err(
            "--batches and --warmup-batches apply to the roundtrip scenario: batchwire bench roundtrip --batches 10,5,2 ..."
                .into(),
        );
    }
    if a.unacked_bytes == Some(0) {
        return Err("--unacked-bytes must be above 0".into());
    }
    if a.tls {
        if !a.peers.is_empty() {
            return Err("--tls starts local nodes with throwaway certificates; it does not apply to --peers".into());
        }
        let dir = bench::enable_tls()?;
        if !a.quiet {
            eprintln!(
                "mutual TLS on every node (certificates in {})",
                dir.display()
            );
        }
    }
    if let Some(p) = &a.plot {
        plot::check_path(p)?;
    }
    let quick = a.scenario.is_none();
    let remote = match (a.peers.is_empty(), &a.secret_file) {
        (true, None) => None,
        (true, Some(_)) => return Err("--secret-file is for --peers".into()),
        (false, None) => {
            return Err("--peers needs --secret-file (the peers' cluster secret)".into());
        }
        (false, Some(f)) => Some(Remote {
            peers: a.peers.clone(),
            secret: NodeConfig::read_secret(f).map_err(|e| e.to_string())?,
        }),
    };
    let only_raw = entries.iter().all(|e| *e == throughput::Entry::Raw);
    let only_tcp = entries.iter().all(|e| *e == throughput::Entry::Tcp);
    let scenarios: Vec<Scenario> = match a.scenario {
        Some(s) => vec![s],
        // With --peers only the scenarios that can use them.
        None if remote.is_some() => vec![Scenario::Rpc, Scenario::Roundtrip],
        // `raw` is the ceiling of throughput, fan-in and mperf; the others compare bundlers
        // only.
        None if only_raw => vec![Scenario::Throughput, Scenario::FanIn, Scenario::Mperf],
        None if only_tcp => vec![Scenario::Throughput],
        None => Scenario::ALL.to_vec(),
    };
    let common = Common {
        bundlers: entries
            .iter()
            .filter_map(|e| match e {
                throughput::Entry::Bundler(b) => Some(*b),
                throughput::Entry::Unsequenced(_)
                | throughput::Entry::Tls(_)
                | throughput::Entry::Raw
                | throughput::Entry::Tcp => None,
            })
            .collect(),
        raw: entries.contains(&throughput::Entry::Raw),
        idle_levels: a.idle_cpu_level.clone(),
        runs: a.runs.unwrap_or(if quick { 3 } else { 5 }),
        base_port: a.base_port,
        quiet: a.quiet,
        quick,
        remote,
    };
    let over = Overrides {
        sizes: a.size.clone(),
        messages: a.messages,
        nodes: a.nodes,
        threads: a.threads,
        batches: a.batches.clone(),
        warmup_batches: a.warmup_batches,
    };
    let hosts = start_hosts(&a, &scenarios, common.remote.is_some())?;
    let mut results = Vec::new();
    for s in scenarios {
        let t0 = Instant::now();
        let link_before = hosts.as_ref().map(|h| h.stats()).unwrap_or_default();
        // In the quick run of every scenario, --nodes and --threads go only where they
        // apply; a named scenario refuses them if they do not.
        let mut over = over.clone();
        if quick {
            if !matches!(s, Scenario::Mperf | Scenario::Rpc) {
                over.nodes = None;
            }
            if !matches!(s, Scenario::FanIn | Scenario::Rpc) {
                over.threads = None;
            }
        }
        let res = match s {
            Scenario::Throughput => {
                common.refuse_remote("throughput")?;
                if over.nodes.is_some_and(|n| n != 2) || over.threads.is_some_and(|t| t != 1) {
                    return Err("throughput runs one sender thread on one of 2 nodes; \
                                --nodes and --threads apply to fan-in, mperf and rpc"
                        .into());
                }
                let o = throughput::Options {
                    sizes: a.size.clone().unwrap_or_else(|| vec![100, 1000, 10_000]),
                    entries: entries.clone(),
                    idle_levels: a.idle_cpu_level.clone(),
                    messages: a.messages,
                    runs: common.runs,
                    base_port: a.base_port,
                    quiet: a.quiet,
                    quick,
                    chaos: throughput::Chaos {
                        break_every_ms: a.break_every,
                    },
                    verify: a.verify,
                    duplex: a.duplex,
                    unacked_bytes: a.unacked_bytes,
                };
                throughput::run(&o)
            }
            Scenario::FanIn => fanin::run(&common, &over, a.pin),
            Scenario::Mperf => mperf::run(&common, &over),
            Scenario::Rpc => rpc::run(&common, &over),
            Scenario::Roundtrip => roundtrip::run(&common, &over),
            Scenario::Hol => crate::bench::hol::run(&common, a.phase_ms, a.bulk_inflight_bytes),
            Scenario::Membership => {
                common.refuse_remote("membership")?;
                let counts = match a.nodes {
                    Some(n) => vec![n],
                    None => vec![8, 16, 32],
                };
                crate::bench::membership::run(
                    &counts,
                    a.runs.unwrap_or(3),
                    Duration::from_millis(a.phase_ms.unwrap_or(5000)),
                    a.idle_close_ms.unwrap_or(2000),
                    a.quiet,
                )
            }
            Scenario::Soak => {
                common.refuse_remote("soak")?;
                common.require_bundlers("soak")?;
                crate::bench::soak::run(&crate::bench::soak::Options {
                    duration: a.duration.unwrap_or(Duration::from_secs(60)),
                    nodes: a.nodes.unwrap_or(3),
                    size: a
                        .size
                        .as_ref()
                        .and_then(|s| s.first().copied())
                        .unwrap_or(100),
                    rate: a.rate,
                    kill_every: a.kill_every,
                    restart_every: a.restart_every,
                    report_every: a.report_every,
                    bundlers: common.bundlers.clone(),
                    base_port: a.base_port,
                    namespaces: hosts
                        .as_ref()
                        .map(|h| h.names().to_vec())
                        .unwrap_or_default(),
                    quiet: a.quiet,
                })
            }
            Scenario::Scale => {
                common.refuse_remote("scale")?;
                crate::bench::scale::run(&a.peer_counts, a.idle_secs, a.base_port, a.quiet)
            }
        };
        let mut res = res?;
        if let Some(h) = &hosts {
            let spec = h.spec().to_string();
            for r in &mut res {
                r.link = Some(spec.clone());
            }
            out!("{}", link_reading(h, &link_before, &res));
        }
        results.extend(res);
        if !a.quiet {
            eprintln!("{} took {:.0} s", s.name(), t0.elapsed().as_secs_f64());
        }
    }
    drop(hosts);
    if let Some(path) = &a.json {
        bench::write_json(path, &results)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        outln!("\nwrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        plot::write_svg(path, &results)?;
        outln!("wrote {}", path.display());
    }
    if !a.quiet {
        eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
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

/// `--hosts netns`: a namespace per node, joined by the emulated link (removed when the
/// returned value is dropped, or on a signal).
fn start_hosts(
    a: &BenchArgs,
    scenarios: &[Scenario],
    remote: bool,
) -> Result<Option<link::hosts::Hosts>, String> {
    if a.hosts == HostsKind::Loopback {
        if a.link.is_some() {
            return Err("--link puts an emulated link between hosts: add --hosts netns".into());
        }
        return Ok(None);
    }
    if remote {
        return Err("--hosts netns starts its own nodes; it does not apply to --peers".into());
    }
    if let Some(s) = scenarios
        .iter()
        .find(|s| matches!(s, Scenario::Hol | Scenario::Scale | Scenario::Membership))
    {
        return Err(format!(
            "--hosts netns runs throughput, fan-in, mperf, rpc, roundtrip and soak; {} runs on loopback only",
            s.name()
        ));
    }
    // rpc and mperf default to 4 nodes; the others run 2.
    let n = a.nodes.unwrap_or(4).max(2);
    let spec = a.link.unwrap_or(link::LinkSpec::PASS);
    let t0 = Instant::now();
    let hosts = link::hosts::Hosts::start(n, spec)?;
    if !a.quiet {
        eprintln!(
            "{} hosts in network namespaces (10.99.0.1-{}), link {} each way, ready in {:.1} s",
            hosts.len(),
            n,
            match a.link {
                Some(l) => l.to_string(),
                None => "without delay or limit".into(),
            },
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(Some(hosts))
}

/// After a scenario on emulated hosts: the link's counters, and each figure against the
/// link (payload rate against the link rate; call latency against the RTT).
fn link_reading(
    h: &link::hosts::Hosts,
    before: &link::pipe::PipeStats,
    res: &[bench::BenchResult],
) -> String {
    let spec = h.spec();
    let s = h.stats().since(before);
    let mut out = format!(
        "\nlink {spec}: {} packets, {:.1} MB; lost at random {}, dropped by the full queue {}; \
         at most {} bytes held in one direction (bound {})\n",
        s.packets_in,
        s.bytes_in as f64 / 1e6,
        s.lost,
        s.queue_drops,
        s.max_held,
        h.held_limit()
    );
    if h.unroutable() > 0 {
        out += &format!(
            "  {} packets were for no host (not IPv4, or outside 10.99.0.0/24) and were not passed on\n",
            h.unroutable()
        );
    }
    for r in res {
        let what = format!("{} {}", r.scenario, r.label(true));
        // One sender over one link: throughput and fan-in.
        if matches!(r.scenario.as_str(), "throughput" | "fan-in")
            && let Some(bps) = spec.bytes_per_sec()
        {
            out += &format!(
                "  {} {} B: payload {:.2} MB/s = {:.0}% of the link's {:.2} MB/s\n",
                what,
                r.size,
                r.median * r.size as f64 / 1e6,
                100.0 * r.median * r.size as f64 / bps,
                bps / 1e6
            );
        }
        if let Some(p50) = r.p50_us
            && !spec.rtt.is_zero()
        {
            out += &format!(
                "  {} {} B: p50 {:.1} ms = {:.2}x the link's RTT of {:.0} ms\n",
                what,
                r.size,
                p50 / 1e3,
                p50 / 1e3 / (spec.rtt.as_secs_f64() * 1e3),
                spec.rtt.as_secs_f64() * 1e3
            );
        }
    }
    out
}
