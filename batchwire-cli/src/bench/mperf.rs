//! The `mperf` scenario, after JGroups' MPerf (the multicast table of JGRP-1540): N node
//! processes (default 4) each send M messages (default 100,000 of 1000 B) with `send_all`
//! to mailbox "mperf" on every member, itself included, so each node receives N x M.
//!
//! Each payload carries (sequence, sending node), so every node checks the count,
//! duplicates and each sender's order. The nodes start together (a barrier over their
//! "ctl" mailboxes); a node's rate is what it received divided by the time from that
//! barrier to its last delivery (its own clock only). A run's figure is the mean of the
//! nodes' rates, in messages per second per node, as in the JGroups table.
//!
//! `raw` is the ceiling, run in the same rounds: the same N processes exchange the same
//! messages pre-encoded as MESSAGES frames over plain TCP (a writer thread per peer, a
//! reading and checking thread per peer), with no node, window, acknowledgement or flow
//! control; a process's own messages are decoded and checked from its frames in memory
//! (local delivery at the cost of a decode). What is left between the two is what
//! batchwire does per message.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::payloads::Payloads;
use super::rawtcp;
use super::{
    BenchResult, CTL, Common, Context, Ctl, Faults, Overrides, Progress, Verifier, mesh_config,
    node_name, parse_results, print_result, run_workers, si, u32_at, worker_args,
};
use batchwire::{BundlerKind, RecvError};
use batchwire_core::codec::Name;

/// The payload header: sequence number (u64) and sending node (u32), little-endian.
pub const HEADER: usize = 12;

/// The mailbox every node sends to.
pub const MAILBOX: &str = "mperf";

const READY: u8 = 1;

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// node, or raw (the ceiling).
    #[arg(long)]
    pub role: String,
    /// This node's index (it listens on base-port + index).
    #[arg(long)]
    pub index: usize,
    #[arg(long)]
    pub nodes: usize,
    #[arg(long)]
    pub base_port: u16,
    /// Messages this node sends.
    #[arg(long)]
    pub messages: u64,
    #[arg(long)]
    pub size: usize,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
}

/// What a node reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodeReport {
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// From the start barrier to the last delivery.
    pub secs: f64,
}

/// Run a worker; prints its report line on stdout.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    match a.role.as_str() {
        "node" => {}
        "raw" => return raw_worker(a),
        other => return Err(format!("unknown mperf role {other:?}")),
    }
    let (i, n) = (a.index, a.nodes);
    let cfg = mesh_config(
        i,
        n,
        a.base_port,
        secret,
        a.bundler,
        a.idle_cpu_level,
        &[MAILBOX.to_string(), CTL.to_string()],
    )?;
    let (node, _) = super::start_cluster_node(cfg, i, n)?;
    let mut ctl = Ctl::new(&node, i, n)?;
    let mb = node.mailbox(MAILBOX).ctx("mailbox mperf")?;
    let payloads = Payloads::new(a.messages, a.size.max(HEADER), Some(i as u32));
    ctl.barrier(READY, Duration::from_secs(60))?;
    let t0 = Instant::now();
    let node_ref = &node;
    let (v, secs) = std::thread::scope(|s| -> Result<(Verifier, f64), String> {
        let sender = s.spawn(move || -> Result<(), String> {
            for p in payloads {
                node_ref
                    .send_all(MAILBOX, p)
                    .map_err(|e| format!("send_all: {e}"))?;
            }
            Ok(())
        });
        let expected = n as u64 * a.messages;
        let mut v = Verifier::new(n, a.messages);
        let mut batch = Vec::with_capacity(8192);
        let mut wait = Duration::from_secs(60);
        while v.distinct < expected {
            match mb.recv_batch_into(&mut batch, 8192, wait) {
                Ok(_) => {
                    for e in batch.drain(..) {
                        v.see_stamped(&e.payload);
                    }
                    wait = Duration::from_secs(10);
                }
                Err(RecvError::Empty) => {}
                Err(_) => break,
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        sender
            .join()
            .unwrap_or_else(|_| Err("the sender thread panicked".into()))?;
        Ok((v, secs))
    })?;
    // Stay up until every node has everything: the others may still be reading from us.
    let mut v = v;
    let expected = n as u64 * a.messages;
    let see = |v: &mut Verifier, p: &[u8]| v.see_stamped(p);
    super::finish_checking(ctl, mb, &mut v, expected, Duration::from_secs(300), see)?;
    node.shutdown();
    print_result(&NodeReport {
        distinct: v.distinct,
        duplicated: v.duplicated,
        reordered: v.reordered,
        secs,
    })
}

/// The `raw` ceiling's node `index`: listen, dial every other node and accept each of
/// theirs, meet them (each dialer sends its index once every connection is up, so a
/// stream is known by its sender), then write the pre-encoded frames to every peer while
/// reading and checking theirs and its own. A stream that ends early shows as lost
/// messages, as a node's would.
fn raw_worker(a: &WorkerArgs) -> Result<(), String> {
    /// The longest a raw stream may stall, reading or writing, before the run gives up.
    const IDLE: Duration = Duration::from_secs(10);
    let (i, n) = (a.index, a.nodes);
    // Each node's own address: loopback, or its namespace's with `--hosts netns`.
    let addrs = (0..n)
        .map(|j| super::node_addr(a.base_port, j))
        .collect::<Result<Vec<SocketAddr>, String>>()?;
    let addr = |j: usize| addrs[j];
    let l = TcpListener::bind(addr(i)).ctx(&format!("raw listen on {}", addr(i)))?;
    let frames = rawtcp::encode(
        a.messages,
        a.size.max(HEADER),
        Some(i as u32),
        &Name::from_static(MAILBOX),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut outs = Vec::with_capacity(n - 1);
    for j in (0..n).filter(|j| *j != i) {
        let left = deadline.saturating_duration_since(Instant::now());
        let s =
            rawtcp::connect_within(addr(j), left).map_err(|e| format!("{e} ({})", node_name(j)))?;
        s.set_write_timeout(Some(IDLE))
            .ctx(&format!("raw connect to {}", node_name(j)))?;
        outs.push((j, s));
    }
    let mut ins = Vec::with_capacity(n - 1);
    for _ in 1..n {
        // Every node dials before it accepts, so this waits for nothing but their dials (a
        // node that failed before dialling ends it at the deadline).
        let left = deadline.saturating_duration_since(Instant::now());
        ins.push(rawtcp::accept_within(&l, left)?);
    }
    for (j, s) in &mut outs {
        s.write_all(&(i as u32).to_le_bytes())
            .ctx(&format!("raw barrier to {}", node_name(*j)))?;
    }
    let mut from = Vec::with_capacity(n - 1);
    for s in &mut ins {
        let mut b = [0u8; 4];
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .ctx("raw barrier")?;
        s.read_exact(&mut b).ctx("raw barrier")?;
        // Then, as a node's receiver: 10 s without a byte ends the wait (and shows as lost
        // messages, or as an error naming the peer).
        s.set_read_timeout(Some(IDLE)).ctx("raw barrier")?;
        let j = u32::from_le_bytes(b) as usize;
        if j >= n || j == i || from.contains(&j) {
            return Err(format!("raw barrier: a stream says it comes from node {j}"));
        }
        from.push(j);
    }
    let t0 = Instant::now();
    let frames = &frames;
    let (v, secs) = std::thread::scope(|sc| -> Result<(Verifier, f64), String> {
        let writers: Vec<_> = outs
            .into_iter()
            .map(|(j, mut s)| {
                sc.spawn(move || -> Result<(), String> {
                    for c in frames.chunks(rawtcp::FRAME_BYTES) {
                        s.write_all(c)
                            .ctx(&format!("raw write to {}", node_name(j)))?;
                    }
                    Ok(())
                })
            })
            .collect();
        let readers: Vec<_> = ins
            .into_iter()
            .zip(from)
            .map(|(mut s, j)| {
                sc.spawn(move || -> Result<(Verifier, Duration), String> {
                    let mut v = Verifier::new(n, a.messages);
                    // Only node j's messages belong on this stream.
                    rawtcp::read(
                        &mut s,
                        a.messages,
                        || {},
                        |p| match u32_at(p, 8) {
                            Some(f) if f as usize == j => v.see_stamped(p),
                            _ => v.malformed(),
                        },
                    )
                    .map_err(|e| format!("from {}: {e}", node_name(j)))?;
                    Ok((v, t0.elapsed()))
                })
            })
            .collect();
        let mut v = Verifier::new(n, a.messages);
        rawtcp::read(&mut &frames[..], a.messages, || {}, |p| v.see_stamped(p))?;
        let mut end = t0.elapsed();
        let panicked = || "a raw thread panicked".to_string();
        for r in readers {
            let (rv, at) = r.join().map_err(|_| panicked())??;
            v.distinct += rv.distinct;
            v.duplicated += rv.duplicated;
            v.reordered += rv.reordered;
            end = end.max(at);
        }
        for w in writers {
            w.join().map_err(|_| panicked())??;
        }
        Ok((v, end.as_secs_f64()))
    })?;
    print_result(&NodeReport {
        distinct: v.distinct,
        duplicated: v.duplicated,
        reordered: v.reordered,
        secs,
    })
}

/// Options of the scenario, defaults applied.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    /// Messages each node sends.
    pub messages: u64,
    pub nodes: usize,
}

impl Options {
    pub fn resolve(c: &Common, o: &Overrides) -> Result<Options, String> {
        if let Some(t) = o.threads.filter(|t| *t != 1) {
            return Err(format!(
                "mperf sends from one thread per node; --threads {t} applies to fan-in and rpc"
            ));
        }
        Ok(Options {
            sizes: o.sizes_or(&[1000], HEADER, "mperf")?,
            messages: o.messages.unwrap_or(if c.quick { 25_000 } else { 100_000 }),
            nodes: o.nodes_or(4, "mperf")?,
        })
    }
}

/// One measured run of `bundler` (`None`: the raw ceiling): the mean of the nodes'
/// rates, and the faults of all nodes.
pub fn one_run(
    bundler: Option<BundlerKind>,
    idle: u8,
    size: usize,
    o: &Options,
    base_port: u16,
) -> Result<(f64, Faults), String> {
    let args: Vec<Vec<String>> = (0..o.nodes)
        .map(|i| {
            let mut kv = vec![
                ("index", i.to_string()),
                ("nodes", o.nodes.to_string()),
                ("base-port", base_port.to_string()),
                ("messages", o.messages.to_string()),
                ("size", size.to_string()),
            ];
            if let Some(b) = bundler {
                kv.push(("bundler", b.name().to_string()));
                kv.push(("idle-cpu-level", idle.to_string()));
            }
            worker_args("mperf", bundler.map_or("raw", |_| "node"), &kv)
        })
        .collect();
    let reports: Vec<NodeReport> = parse_results(&run_workers(&args, Duration::from_secs(600))?)?;
    let expected = o.nodes as u64 * o.messages;
    let mut faults = Faults::default();
    let mut sum = 0.0;
    for r in &reports {
        faults += Faults {
            lost: expected.saturating_sub(r.distinct),
            duplicated: r.duplicated,
            reordered: r.reordered,
        };
        if r.secs > 0.0 {
            sum += r.distinct as f64 / r.secs;
        }
    }
    Ok((sum / reports.len().max(1) as f64, faults))
}

/// Run the scenario: for each size, `runs` rounds of every (bundler, idle level) pair.
pub fn run(c: &Common, ov: &Overrides) -> Result<Vec<BenchResult>, String> {
    c.refuse_remote("mperf")?;
    if !c.raw {
        c.require_bundlers("mperf")?;
    }
    let o = Options::resolve(c, ov)?;
    // Every (bundler, idle level) pair, then the raw ceiling (no transport threads: once).
    let mut entries: Vec<(Option<BundlerKind>, u8)> =
        c.combos().into_iter().map(|(b, l)| (Some(b), l)).collect();
    if c.raw {
        entries.push((None, 0));
    }
    let progress = Progress::new(
        (o.sizes.len() * c.runs * entries.len()) as u64,
        "mperf",
        c.quiet,
    );
    let label = |b: Option<BundlerKind>, idle: u8| match b {
        None => "raw".to_string(),
        Some(b) if c.show_idle() => format!("{b} (idle {idle})"),
        Some(b) => b.to_string(),
    };
    let mut results = Vec::new();
    for &size in &o.sizes {
        let mut rates = vec![Vec::new(); entries.len()];
        let mut faults = vec![Faults::default(); entries.len()];
        for run in 0..c.runs {
            for (i, &(b, idle)) in entries.iter().enumerate() {
                let name = label(b, idle);
                let what = format!("mperf {size} B {name:<20} run {}/{}", run + 1, c.runs);
                progress.running(what.clone());
                let (rate, f) = one_run(b, idle, size, &o, c.base_port)?;
                progress.done(format!("  {what}: {}msg/s/node", si(rate)));
                rates[i].push(rate);
                faults[i] += f;
            }
        }
        let first = results.len();
        for (i, &(b, idle)) in entries.iter().enumerate() {
            let mut r = BenchResult::new(
                "mperf",
                b.map_or("raw", |b| b.name()),
                b.map(|_| idle),
                size,
                rates[i].clone(),
                "msgs/s/node",
            )
            .with_faults(faults[i]);
            r.messages = o.messages;
            r.nodes = o.nodes;
            results.push(r);
        }
        out!("{}", table(&results[first..], &o, c));
    }
    Ok(results)
}

/// The table of one size, as JGroups prints MPerf: one column per run; then each
/// bundler's median as a share of raw's, if raw ran.
fn table(rows: &[BenchResult], o: &Options, c: &Common) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let t = super::rate_table(rows, c.runs, c.show_idle(), "MB/s/node");
    let raw = rows.iter().any(|r| r.bundler == "raw");
    let shares = super::shares_of_raw(rows, c.show_idle());
    format!(
        "\nmperf: {} nodes, each sends {} x {} B to every member (itself included) with send_all; \
         msgs/s received per node (mean over the nodes) of {} alternating runs; {}{}\n{}{}",
        o.nodes,
        o.messages,
        first.size,
        c.runs,
        super::payloads::how(o.messages, first.size),
        if raw {
            "; raw: the same frames over plain TCP, no node"
        } else {
            ""
        },
        t.render(),
        shares
    )
}
