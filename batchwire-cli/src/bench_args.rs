//! The arguments of `batchwire bench`, and the help of each scenario.

use std::path::PathBuf;
use std::time::Duration;

use batchwire::PeerSpec;

use crate::link;

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Scenario to run (default: a quick version of every scenario).
    #[arg(value_enum)]
    pub(crate) scenario: Option<Scenario>,
    /// Bundlers to compare: comma-separated names, `raw` (pre-encoded messages over plain TCP: the ceiling of throughput, fan-in and mperf), `tcp` (the bytes alone in 1 MiB writes: throughput's true ceiling), or `all`.
    #[arg(long, default_value = "all")]
    pub(crate) bundler: String,
    /// Idle levels (1..=10) to run each bundler with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) idle_cpu_level: Vec<u8>,
    /// Message sizes in bytes, comma-separated (default per scenario: throughput and
    /// roundtrip 100,1000,10000; fan-in 100; mperf 1000; rpc 100).
    #[arg(long, value_delimiter = ',')]
    pub(crate) size: Option<Vec<usize>>,
    /// Nodes (mperf: 4, rpc: 4; membership: 8, 16 and 32; the other scenarios run 2).
    #[arg(long)]
    pub(crate) nodes: Option<usize>,
    /// Threads: fan-in's sender threads (1000), rpc's calling threads per node (16).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Messages per run: throughput per run (by size), fan-in in all (200,000), mperf per
    /// node (100,000), rpc calls per node (20,000), roundtrip per batch (1000).
    #[arg(long)]
    pub(crate) messages: Option<u64>,
    /// Runs per bundler; runs of different bundlers alternate (default 5; 3 when quick).
    #[arg(long)]
    pub(crate) runs: Option<usize>,
    /// Node i listens on base-port + i.
    #[arg(long, default_value_t = 27100)]
    pub(crate) base_port: u16,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Also draw the results as an SVG chart here (.svg only).
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Run against `batchwire node` processes already running (rpc and roundtrip only):
    /// NAME=HOST:PORT, comma-separated. This process is the client node.
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<PeerSpec>,
    /// With --peers: the file holding their cluster secret.
    #[arg(long)]
    pub(crate) secret_file: Option<PathBuf>,
    /// Run every node with mutual TLS (a throwaway CA in a temporary folder). In
    /// throughput, `--bundler natural,natural/tls` compares both in one run instead.
    #[arg(long)]
    pub(crate) tls: bool,
    /// throughput: print sent / delivered / lost / duplicated / reordered for every run
    /// (every run is verified either way; this shows the counts).
    #[arg(long)]
    pub(crate) verify: bool,
    /// throughput: close the sending node's connections every this many milliseconds
    /// while it streams (chaos; reliable delivery must lose and repeat nothing).
    #[arg(long, default_value_t = 0)]
    pub(crate) break_every: u64,
    /// throughput: both nodes send to each other at once (each direction reported and
    /// verified on its own).
    #[arg(long)]
    pub(crate) duplex: bool,
    /// fan-in: run the sending node's process on CPU 0 and the receiving one's on CPU 1,
    /// each pinned, as on two machines (by default the scheduler places both, and 1000
    /// sender threads share the CPUs with the receiver).
    #[arg(long)]
    pub(crate) pin: bool,
    /// The nodes' send window in bytes (`NodeConfig::unacked_bytes`; default 16 MiB), e.g.
    /// 65536 with --duplex to keep both windows full.
    #[arg(long)]
    pub(crate) unacked_bytes: Option<usize>,
    /// scale: the peer counts of the node measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,128")]
    pub(crate) peer_counts: Vec<usize>,
    /// scale: seconds of idle measured per peer count.
    #[arg(long, default_value_t = 10)]
    pub(crate) idle_secs: u64,
    /// hol: milliseconds per phase (default 3000; 1500 when quick); membership: the
    /// window at rest (default 5000).
    #[arg(long)]
    pub(crate) phase_ms: Option<u64>,
    /// membership: the nodes' `--idle-close-ms` (connections on demand, closed after this
    /// long idle; 0: the full mesh) [default: 2000].
    #[arg(long)]
    pub(crate) idle_close_ms: Option<u64>,
    /// hol: the nodes' bulk budget (`NodeConfig::bulk_inflight_bytes`; default 128 KiB).
    #[arg(long)]
    pub(crate) bulk_inflight_bytes: Option<usize>,
    /// Where the nodes run: `loopback` (this host), or `netns`, a network namespace per
    /// node joined by the emulated link (needs root; throughput, fan-in, mperf, rpc,
    /// roundtrip and soak).
    #[arg(long, value_enum, default_value = "loopback")]
    pub(crate) hosts: HostsKind,
    /// With --hosts netns: the link between every two hosts, both directions, e.g.
    /// rtt=170ms,rate=20mbit[,loss=0.1%][,queue=BYTES] (default: no delay, no limit).
    #[arg(long)]
    pub(crate) link: Option<link::LinkSpec>,
    /// roundtrip: measured batches per size, comma-separated in size order, or one count
    /// for every size (default 100,50,15 as in the post; half when quick).
    #[arg(long, value_delimiter = ',')]
    pub(crate) batches: Option<Vec<u64>>,
    /// roundtrip: warm-up batches (default 50; half when quick).
    #[arg(long)]
    pub(crate) warmup_batches: Option<u64>,
    /// soak: how long to stream, e.g. 60s, 15m, 1h [default: 60s].
    #[arg(long, value_parser = crate::bench::soak::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// soak: messages per second from each node to each other node.
    #[arg(long, default_value_t = 2000)]
    pub(crate) rate: u64,
    /// soak: kill every connection between the nodes from outside (`ss -K`) this often,
    /// e.g. 1s, 200ms.
    #[arg(long, default_value = "1s", value_parser = crate::bench::soak::parse_duration)]
    pub(crate) kill_every: Duration,
    /// soak: SIGKILL the last node and start it again this often.
    #[arg(long, default_value = "60s", value_parser = crate::bench::soak::parse_duration)]
    pub(crate) restart_every: Duration,
    /// soak: print the totals this often.
    #[arg(long, default_value = "60s", value_parser = crate::bench::soak::parse_duration)]
    pub(crate) report_every: Duration,
    /// No progress bar or per-run lines.
    #[arg(long)]
    pub(crate) quiet: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HostsKind {
    Loopback,
    Netns,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
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
    pub(crate) fn name(self) -> &'static str {
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
    pub(crate) const ALL: [Scenario; 5] = [
        Scenario::Throughput,
        Scenario::FanIn,
        Scenario::Mperf,
        Scenario::Rpc,
        Scenario::Roundtrip,
    ];
}

/// Every scenario: what it measures, and the flags that apply to it (`bench SCENARIO
/// --help` shows only those).
pub(crate) const SCENARIO_HELP: &[(&str, &str, &[&str])] = &[
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
pub(crate) const BENCH_COMMON: &[&str] = &[
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
pub(crate) fn scenario_help(args: &[String]) -> Option<String> {
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
