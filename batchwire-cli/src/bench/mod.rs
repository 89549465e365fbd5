//! `batchwire bench`: scenarios that start node processes of this same binary on loopback,
//! verify what arrived, and report medians of alternating runs beside an in-run baseline.
//!
//! One file per scenario (`throughput`, `fanin`, `mperf`, `rpc`, `roundtrip`); `plot`
//! writes the SVG chart. This file holds what they share: the result record and the JSON
//! report, starting and collecting worker processes, the barrier the nodes of one run meet
//! at, per-sender sequence checks, latency histograms, tables and progress bars.

pub mod fanin;
pub mod faninraw;
pub mod hol;
pub mod membership;
pub mod mperf;
mod payloads;
pub mod pingpong;
mod pipes;
pub mod plot;
mod rawtcp;
pub mod roundtrip;
pub mod rpc;
pub mod scale;
pub mod soak;
pub mod stream;
pub mod throughput;

mod report;
mod workers;

pub use report::*;
pub use workers::*;

use std::net::SocketAddr;
use std::time::Duration;

use batchwire::{Address, BundlerKind, Node, NodeConfig, PeerSpec};

// ---------------------------------------------------------------------------------------
// Options shared by the scenarios.

/// What every scenario is told.
#[derive(Debug, Clone)]
pub struct Common {
    /// Bundlers to compare (`raw` is not one: see `raw`).
    pub bundlers: Vec<BundlerKind>,
    /// `raw` was asked for: the raw-TCP ceiling of the scenarios that have one (throughput
    /// takes its entries itself; mperf runs its own).
    pub raw: bool,
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
                "{scenario} compares bundlers; `raw` is the ceiling of throughput, fan-in and mperf only"
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
    /// roundtrip: measured batches per size (one value: for every size).
    pub batches: Option<Vec<u64>>,
    /// roundtrip: warm-up batches.
    pub warmup_batches: Option<u64>,
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
