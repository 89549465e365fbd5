//! The `throughput` scenario: one application thread on node n0 streams N messages of S
//! bytes to one mailbox on node n1, in another process; n1 checks every sequence number.
//!
//! The rate is N divided by the time from the sender's first `send` to the receiver's last
//! message (both processes read the same wall clock on one host), so pipeline fill and
//! drain are included. `raw` is the ceiling: the same messages pre-encoded as MESSAGES
//! frames, written in 64 KiB writes by the sending thread itself, read 64 KiB at a time
//! and decoded by the receiving thread itself: no queues, no thread hand-off. `tcp` is
//! what the socket carries: the same number of bytes, unframed, in 1 MiB writes, read into
//! one reused buffer (`iperf3 -l 1M`); its rate is in messages of the run's size.

use std::time::Duration;

use super::stream::{DuplexReport, SendReport};
use super::{BenchResult, Context, Faults, Progress, si, spawn_worker, worker_result};
use batchwire_core::bundler::BundlerKind;

/// What to run: a bundler, or the raw-TCP ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Bundler(BundlerKind),
    /// A bundler with reliable delivery off (`NAME/unsequenced`): no send window, no
    /// acknowledgements; the in-run baseline for what sequencing costs.
    Unsequenced(BundlerKind),
    /// A bundler over mutual TLS (`NAME/tls`), beside plaintext in the same run.
    Tls(BundlerKind),
    Raw,
    /// The plain-TCP ceiling (see the module documentation).
    Tcp,
}

impl Entry {
    pub fn name(self) -> String {
        match self {
            Entry::Bundler(b) => b.name().to_string(),
            Entry::Unsequenced(b) => format!("{}/unsequenced", b.name()),
            Entry::Tls(b) => format!("{}/tls", b.name()),
            Entry::Raw => "raw".to_string(),
            Entry::Tcp => "tcp".to_string(),
        }
    }

    fn kind(self) -> BundlerKind {
        match self {
            Entry::Bundler(b) | Entry::Unsequenced(b) | Entry::Tls(b) => b,
            Entry::Raw | Entry::Tcp => BundlerKind::Natural,
        }
    }

    /// Parse a comma-separated list of bundler names, `raw`, `tcp`, or `all` (every bundler,
    /// raw and tcp).
    pub fn parse_list(s: &str) -> Result<Vec<Entry>, String> {
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => {
                    v.extend(BundlerKind::ALL.iter().map(|b| Entry::Bundler(*b)));
                    v.push(Entry::Raw);
                    v.push(Entry::Tcp);
                }
                "raw" => v.push(Entry::Raw),
                "tcp" => v.push(Entry::Tcp),
                b => {
                    if let Some(b) = b.strip_suffix("/unsequenced") {
                        v.push(Entry::Unsequenced(b.parse()?));
                    } else if let Some(b) = b.strip_suffix("/tls") {
                        v.push(Entry::Tls(b.parse()?));
                    } else {
                        v.push(Entry::Bundler(b.parse()?));
                    }
                }
            }
        }
        v.dedup();
        if v.is_empty() {
            return Err("no bundler named".into());
        }
        Ok(v)
    }
}

/// Options of the scenario.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    pub entries: Vec<Entry>,
    /// Idle levels to run each bundler with (raw runs once).
    pub idle_levels: Vec<u8>,
    /// Messages per run; `None` picks by size (and fewer for `none`, which is slow).
    pub messages: Option<u64>,
    pub runs: usize,
    pub base_port: u16,
    pub quiet: bool,
    /// The quick version: a quarter of the default message counts.
    pub quick: bool,
    pub chaos: Chaos,
    /// Print sent / delivered / lost / duplicated / reordered for every run.
    pub verify: bool,
    /// Both nodes send to each other at once; each direction is reported on its own.
    pub duplex: bool,
    /// The nodes' send window (`NodeConfig::unacked_bytes`), if not the default.
    pub unacked_bytes: Option<usize>,
}

/// Default message count for a size: about 300 MB or one million messages, whichever is
/// fewer; a fifth of that for `none`, whose one write per message is ~20x slower.
pub fn default_messages(size: usize, entry: Entry) -> u64 {
    let n = (1_000_000u64)
        .min(300_000_000 / size.max(1) as u64)
        .max(1000);
    match entry {
        Entry::Bundler(BundlerKind::None)
        | Entry::Unsequenced(BundlerKind::None)
        | Entry::Tls(BundlerKind::None) => n / 5,
        _ => n,
    }
}

/// Connection breaks during a run (`--break-every`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Chaos {
    /// Close the sender's connections every this many milliseconds (0: never).
    pub break_every_ms: u64,
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct RunOutcome {
    pub rate: f64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub messages_per_write: f64,
    pub breaks: u64,
    /// CPU time of both processes per message delivered, in ns (0: not measured, as in
    /// duplex runs, where the two directions share the processes).
    pub cpu_ns_per_msg: f64,
}

/// One run: an entry and its settings.
#[derive(Debug, Clone, Copy)]
pub struct RunSpec {
    pub entry: Entry,
    pub chaos: Chaos,
    pub idle: u8,
    pub size: usize,
    pub messages: u64,
    pub base_port: u16,
    pub unacked_bytes: Option<usize>,
}

impl RunSpec {
    /// A worker's arguments for `role`, listening on `listen`, the other at `peer`.
    fn args(
        &self,
        role: &str,
        listen: &str,
        peer: &str,
        tls: Option<&std::path::Path>,
    ) -> Vec<String> {
        let mut v: Vec<String> = [
            "throughput",
            "--role",
            role,
            "--listen",
            listen,
            "--peer",
            peer,
            "--messages",
            &self.messages.to_string(),
            "--size",
            &self.size.to_string(),
            "--bundler",
            self.entry.kind().name(),
            "--idle-cpu-level",
            &self.idle.to_string(),
            "--break-every",
            &self.chaos.break_every_ms.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if matches!(self.entry, Entry::Unsequenced(_)) {
            v.push("--unsequenced".into());
        }
        if let Some(d) = tls {
            v.extend(["--tls-dir".to_string(), d.display().to_string()]);
        }
        if let Some(w) = self.unacked_bytes {
            v.extend(["--unacked-bytes".to_string(), w.to_string()]);
        }
        v
    }

    /// Start the two workers with roles `roles` (node 0's, node 1's) and return their
    /// report lines.
    fn workers(&self, roles: [&str; 2]) -> Result<[String; 2], String> {
        let tls = match self.entry {
            Entry::Tls(_) => Some(super::tls_certs()?),
            _ => None,
        };
        let a0 = super::node_addr(self.base_port, 0)?.to_string();
        let a1 = super::node_addr(self.base_port, 1)?.to_string();
        // Node 1 (the receiver) first, so the sender finds it.
        let w1 =
            spawn_worker(&self.args(roles[1], &a1, &a0, tls.as_deref())).ctx("starting node 1")?;
        let w0 =
            spawn_worker(&self.args(roles[0], &a0, &a1, tls.as_deref())).ctx("starting node 0")?;
        let timeout = Duration::from_secs(300);
        let r0 = match worker_result(w0, "RESULT", timeout) {
            Ok(r) => r,
            Err(e) => {
                // Node 0 failed: node 1 would wait for it in vain; stop it too.
                let mut w1 = w1;
                let _ = w1.kill();
                let _ = w1.wait();
                return Err(e);
            }
        };
        let r1 = worker_result(w1, "RESULT", timeout)?;
        Ok([r0, r1])
    }
}

/// Messages per second from `start` to `end` (ns).
fn rate(n: u64, start: u128, end: u128) -> f64 {
    let secs = end.saturating_sub(start) as f64 / 1e9;
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// One one-way run: node 0 sends, node 1 receives.
pub fn one_run(spec: &RunSpec) -> Result<RunOutcome, String> {
    let roles = match spec.entry {
        Entry::Raw => ["raw-send", "raw-recv"],
        Entry::Tcp => ["tcp-send", "tcp-recv"],
        _ => ["send", "recv"],
    };
    let [s, r] = spec.workers(roles)?;
    let s: SendReport = serde_json::from_str(&s).ctx("sender result")?;
    let r: super::RecvReport = serde_json::from_str(&r).ctx("receiver result")?;
    Ok(RunOutcome {
        rate: rate(r.distinct, s.start_ns, r.end_ns),
        lost: spec.messages - r.distinct,
        duplicated: r.duplicated,
        reordered: r.reordered,
        messages_per_write: s.messages_per_write,
        breaks: s.breaks,
        cpu_ns_per_msg: (s.cpu_ns + r.cpu_ns) as f64 / r.distinct.max(1) as f64,
    })
}

/// One duplex run: both nodes send to each other at once. Returns the outcome of each
/// direction (n0 -> n1, n1 -> n0).
pub fn one_duplex_run(spec: &RunSpec) -> Result<[RunOutcome; 2], String> {
    let [r0, r1] = spec.workers(["duplex0", "duplex1"])?;
    let r0: DuplexReport = serde_json::from_str(&r0).ctx("node 0 result")?;
    let r1: DuplexReport = serde_json::from_str(&r1).ctx("node 1 result")?;
    let way = |from: &DuplexReport, to: &DuplexReport| RunOutcome {
        rate: rate(to.distinct, from.start_ns, to.end_ns),
        lost: spec.messages - to.distinct,
        duplicated: to.duplicated,
        reordered: to.reordered,
        messages_per_write: 0.0,
        breaks: 0,
        cpu_ns_per_msg: 0.0,
    };
    Ok([way(&r0, &r1), way(&r1, &r0)])
}

/// Run the scenario: for each size, `runs` rounds, each round every entry once (so drift on
/// a shared machine hits every entry alike). Prints a table per size.
pub fn run(o: &Options) -> Result<Vec<BenchResult>, String> {
    // Every (entry, idle level) pair; raw and tcp have no transport threads, so they run
    // once.
    let mut combos: Vec<(Entry, Option<u8>)> = Vec::new();
    for &e in &o.entries {
        match e {
            Entry::Raw | Entry::Tcp => combos.push((e, None)),
            Entry::Bundler(_) | Entry::Unsequenced(_) | Entry::Tls(_) => {
                combos.extend(o.idle_levels.iter().map(|l| (e, Some(*l))))
            }
        }
    }
    // raw and tcp are one-way: with --duplex they are left out of a list (such as the
    // default `all`) that has bundlers to run, and refused alone.
    if o.duplex {
        combos.retain(|(e, _)| !matches!(e, Entry::Raw | Entry::Tcp));
        if combos.is_empty() {
            return Err("--duplex runs bundlers only (raw and tcp are one-way)".into());
        }
    }
    for &size in &o.sizes {
        if size < 8 {
            return Err(format!(
                "size {size} is below 8 bytes (the sequence number)"
            ));
        }
    }
    let n = |size: usize, e: Entry| {
        o.messages.unwrap_or_else(|| {
            let mut d = default_messages(size, e);
            if o.quick {
                d = (d / 4).max(1000);
            }
            // The socket alone moves a few GB/s: at least 4 GiB, about a second, quick or
            // not (1 GiB read 15-30% below `iperf3 -l 1M -t 3` in the same minute: start-up
            // weighs, and a low ceiling would flatter every "% tcp").
            if e == Entry::Tcp {
                d = d.max((4 << 30) / size as u64);
            }
            // Over an emulated link: about 6 s of the link's rate.
            if let Some(bps) = crate::link::hosts::active_link().and_then(|l| l.bytes_per_sec()) {
                d = d.min((bps * 6.0 / size as f64) as u64).max(1000);
            }
            d
        })
    };
    let progress = Progress::new(
        (o.sizes.len() * o.runs * combos.len()) as u64,
        "throughput",
        o.quiet,
    );
    let show_idle = o.idle_levels.len() > 1;
    let mut results = Vec::new();
    // The rows of a table: one per combination, two (one per direction) with --duplex.
    let ways: &[&str] = if o.duplex {
        &[" n0->n1", " n1->n0"]
    } else {
        &[""]
    };
    for &size in &o.sizes {
        let rows = combos.len() * ways.len();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); rows];
        let mut faults = vec![Faults::default(); rows];
        let mut mpw = vec![0.0f64; rows];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); rows];
        for run in 0..o.runs {
            for (i, &(e, idle)) in combos.iter().enumerate() {
                let what = format!(
                    "throughput {size} B {:<20} run {}/{}",
                    super::row_label(&e.name(), idle, show_idle),
                    run + 1,
                    o.runs
                );
                progress.running(what.clone());
                let spec = RunSpec {
                    entry: e,
                    chaos: o.chaos,
                    idle: idle.unwrap_or(1),
                    size,
                    messages: n(size, e),
                    base_port: o.base_port,
                    unacked_bytes: o.unacked_bytes,
                };
                let outs = if o.duplex {
                    one_duplex_run(&spec)?.to_vec()
                } else {
                    vec![one_run(&spec)?]
                };
                for (w, out) in outs.iter().enumerate() {
                    if o.verify {
                        outln!(
                            "verify {size} B {}{} run {}: sent {} delivered {} lost {} duplicated {} reordered {} (connection breaks {})",
                            e.name(),
                            ways[w],
                            run + 1,
                            spec.messages,
                            spec.messages - out.lost,
                            out.lost,
                            out.duplicated,
                            out.reordered,
                            out.breaks
                        );
                    }
                    let k = i * ways.len() + w;
                    rates[k].push(out.rate);
                    faults[k] += Faults {
                        lost: out.lost,
                        duplicated: out.duplicated,
                        reordered: out.reordered,
                    };
                    mpw[k] = out.messages_per_write;
                    if out.cpu_ns_per_msg > 0.0 {
                        cpu[k].push(out.cpu_ns_per_msg);
                    }
                }
                let shown: Vec<String> = outs
                    .iter()
                    .map(|o| format!("{}msg/s", si(o.rate)))
                    .collect();
                progress.done(format!("  {what}: {}", shown.join(" / ")));
            }
        }
        let first = results.len();
        for (i, &(e, idle)) in combos.iter().enumerate() {
            for (w, way) in ways.iter().enumerate() {
                let k = i * ways.len() + w;
                let scenario = if o.duplex {
                    "throughput-duplex"
                } else {
                    "throughput"
                };
                let mut r = BenchResult::new(
                    scenario,
                    &format!("{}{way}", e.name()),
                    idle,
                    size,
                    rates[k].clone(),
                    "msgs/s",
                )
                .with_faults(faults[k]);
                r.messages = n(size, e);
                r.cpu_ns_per_msg = (!cpu[k].is_empty()).then(|| super::summarize(&cpu[k]).0);
                results.push(r);
            }
        }
        print_table(&results[first..], &mpw, o.runs, show_idle, o.duplex);
    }
    Ok(results)
}

fn print_table(rows: &[BenchResult], mpw: &[f64], runs: usize, show_idle: bool, duplex: bool) {
    let Some(first) = rows.first() else { return };
    // A reference that failed its checks is no reference.
    let reference = |name: &str| {
        rows.iter()
            .find(|r| r.bundler == name && !r.failed())
            .map(|r| r.median)
    };
    let (raw, tcp) = (reference("raw"), reference("tcp"));
    let how = if duplex {
        "both nodes sending to each other at once (one sender thread each), each direction on its own row"
    } else {
        "one sender thread"
    };
    outln!(
        "\nthroughput: {} B messages, {how}, 2 processes {}; msgs/s, median of {runs} alternating runs; {}",
        first.size,
        match crate::link::hosts::active_link() {
            Some(l) => format!("on 2 hosts over the emulated link {l}"),
            None => "on loopback".into(),
        },
        // (tcp sends bytes, no payloads: its count says nothing of how they were built)
        super::payloads::how(
            rows.iter()
                .filter(|r| r.bundler != "tcp")
                .map(|r| r.messages)
                .max()
                .unwrap_or(0),
            first.size
        ),
    );
    out!("{:<25} {:>9}", "bundler", "messages");
    for i in 0..runs {
        out!(" {:>9}", format!("run {}", i + 1));
    }
    outln!(
        " {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>10}",
        "median",
        "min",
        "max",
        "MB/s",
        "% raw",
        "% tcp",
        "msgs/wr",
        "CPU ns/msg"
    );
    for (r, m) in rows.iter().zip(mpw) {
        out!("{:<25} {:>9}", r.label(show_idle), r.messages);
        if r.failed() {
            outln!(
                "  FAILED: lost {} duplicated {} reordered {}",
                r.lost,
                r.duplicated,
                r.reordered
            );
            continue;
        }
        for v in &r.runs {
            out!(" {:>9}", si(*v));
        }
        let pct = |of: Option<f64>| {
            of.map(|x| format!("{:.0}%", 100.0 * r.median / x))
                .unwrap_or_default()
        };
        let mw = if r.bundler == "raw" || r.bundler == "tcp" || *m == 0.0 {
            "-".to_string()
        } else {
            format!("{m:.1}")
        };
        let cpu = r
            .cpu_ns_per_msg
            .map_or("-".to_string(), |c| format!("{c:.0}"));
        outln!(
            " {:>9} {:>9} {:>9} {:>9.0} {:>7} {:>7} {:>9} {:>10}",
            si(r.median),
            si(r.min),
            si(r.max),
            r.median * r.size as f64 / 1e6,
            pct(raw),
            pct(tcp),
            mw,
            cpu
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_lists_parse() {
        assert_eq!(
            Entry::parse_list("natural,raw").unwrap(),
            [Entry::Bundler(BundlerKind::Natural), Entry::Raw]
        );
        assert!(Entry::parse_list("all").unwrap().contains(&Entry::Raw));
        assert!(Entry::parse_list("all").unwrap().contains(&Entry::Tcp));
        assert_eq!(Entry::parse_list("tcp").unwrap(), [Entry::Tcp]);
        assert!(Entry::parse_list("bogus").is_err());
    }
}
