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
mod bench_args;
mod bench_cmd;
mod certs;
mod client;
mod echo;
mod link;
mod metrics_http;
mod node_cmd;
mod nodefile;
mod sys;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::bench::{fanin, mperf, roundtrip, rpc};
use crate::bench_args::{BenchArgs, scenario_help};
use crate::bench_cmd::run_bench;
use crate::node_cmd::run_node;
use batchwire::{BundlerKind, PeerSpec};
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
        /// End each `member ...` line with the time the node emitted the event:
        /// nanoseconds of the host's monotonic clock (CLOCK_MONOTONIC), to line up the
        /// lines of several nodes on one host (the membership bench does). The lines are
        /// then printed when the host's CPUs are otherwise idle, each with its event's time.
        #[arg(long)]
        event_times: bool,
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
            event_times,
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
                extras.event_times = event_times;
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
