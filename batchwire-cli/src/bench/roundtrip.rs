//! The `roundtrip` scenario, after the Akka post comparing Artery and Netty remoting: a
//! receiver node n1 has 16 mailboxes ("rt0".."rt15"), each served by a thread that sends
//! every message's 8-byte id back to the sender's mailbox. The sender on n0 sends batches
//! of 1000 messages spread round-robin over the 16 mailboxes; a batch ends when all 1000
//! ids are back. After 50 warm-up batches of 100 B it measures the average milliseconds per
//! batch over 100 batches of 100 B, 50 of 1 KB and 15 of 10 KB, as the post did.
//!
//! Message c (counted over the whole run) goes to mailbox c mod 16, so the ids coming back
//! from each mailbox must be consecutive in c / 16: the sender checks count, duplicates and
//! order per mailbox. A receiving thread in the sender process collects the replies while
//! the main thread sends, so large batches never wait for the sender to stop sending.
//! With `--peers` the remote nodes' "echo" mailboxes answer (with the whole payload).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::{
    BenchResult, CTL, Common, Context, Ctl, Faults, Overrides, Progress, Table, Verifier,
    node_addr, parse_results, print_result, run_workers, u64_at, worker_args,
};
use batchwire::{Address, BundlerKind, Mailbox, Node, NodeConfig, RecvError};

/// The payload header: the message's id (u64, little-endian).
pub const HEADER: usize = 8;

/// Mailboxes (and serving threads) on the receiving node.
pub const MAILBOXES: usize = 16;

/// The sender's mailbox, where the ids come back.
const BACK: &str = "back";

/// How long the sender waits for the next id before the rest count as lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// What one run does: warm-up batches, then (size, batches) groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Messages per batch.
    pub batch: u64,
    pub warmup: u64,
    pub warmup_size: usize,
    pub groups: Vec<(usize, u64)>,
}

impl Plan {
    /// The post's plan (quick: half the batches), for `sizes` and `batch`.
    pub fn new(sizes: &[usize], batch: u64, quick: bool) -> Plan {
        let scale = |n: u64| if quick { (n / 2).max(3) } else { n };
        Plan {
            batch,
            warmup: scale(50),
            warmup_size: sizes.first().copied().unwrap_or(100),
            groups: sizes
                .iter()
                .map(|&s| {
                    let n = match s {
                        0..=100 => 100,
                        101..=1000 => 50,
                        _ => 15,
                    };
                    (s, scale(n))
                })
                .collect(),
        }
    }

    /// `--batches` (one count per size, or one for all) and `--warmup-batches` instead of
    /// the post's counts.
    pub fn with_counts(
        mut self,
        batches: Option<&[u64]>,
        warmup: Option<u64>,
    ) -> Result<Plan, String> {
        if let Some(b) = batches {
            let n = self.groups.len();
            let counts: Vec<u64> = match b.len() {
                1 => vec![b[0]; n],
                k if k == n => b.to_vec(),
                k => {
                    return Err(format!(
                        "roundtrip: --batches has {k} counts for {n} sizes (give one, or one per size)"
                    ));
                }
            };
            if counts.contains(&0) {
                return Err("roundtrip: --batches must be at least 1".into());
            }
            for (g, c) in self.groups.iter_mut().zip(counts) {
                g.1 = c;
            }
        }
        if let Some(w) = warmup {
            self.warmup = w;
        }
        Ok(self)
    }

    /// Every group, the warm-up first.
    fn all_groups(&self) -> Vec<(usize, u64)> {
        let warmup = (self.warmup > 0).then_some((self.warmup_size, self.warmup));
        warmup
            .into_iter()
            .chain(self.groups.iter().copied())
            .collect()
    }

    fn total_messages(&self) -> u64 {
        self.all_groups().iter().map(|(_, n)| n * self.batch).sum()
    }

    fn encode(&self) -> Result<String, String> {
        serde_json::to_string(self).ctx("encoding the plan")
    }
}

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// send or recv.
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub listen: SocketAddr,
    /// The other process's address.
    #[arg(long)]
    pub peer: SocketAddr,
    /// The plan, as JSON.
    #[arg(long)]
    pub plan: String,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
}

/// What the sender reports: per measured group, the average ms per batch and the faults
/// (warm-up faults are added to the first group).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DriveReport {
    pub groups: Vec<GroupReport>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct GroupReport {
    pub size: usize,
    pub batches: u64,
    pub ms_per_batch: f64,
    pub faults: Faults,
}

/// What the receiver reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServeReport {
    pub served: u64,
}

fn rt_name(k: usize) -> String {
    format!("rt{k}")
}

/// Run a worker role; prints its report line on stdout.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let plan: Plan = serde_json::from_str(&a.plan).ctx("--plan")?;
    match a.role.as_str() {
        "recv" => recv(a, secret),
        "send" => {
            let cfg = NodeConfig::new("n0", a.listen, secret)
                .peer("n1", a.peer)
                .mailbox(BACK)
                .mailbox(CTL)
                .bundler(a.bundler)
                .idle_cpu_level(a.idle_cpu_level);
            let node =
                Node::start(super::with_bench_settings(cfg, None)).ctx("starting node n0")?;
            if !node.wait_for_peers(&["n1"], Duration::from_secs(30)) {
                return Err("receiver did not come up within 30 s".into());
            }
            let ctl = Ctl::new(&node, 0, 2)?;
            let dests = (0..MAILBOXES)
                .map(|k| Address::new("n1", &rt_name(k)).ctx("address"))
                .collect::<Result<Vec<_>, _>>()?;
            let mb = node.mailbox(BACK).ctx("mailbox back")?;
            let report = drive(&mb, &dests, &plan)?;
            drop(mb);
            ctl.finish(Duration::from_secs(60))?;
            node.shutdown();
            print_result(&report)
        }
        other => Err(format!("unknown roundtrip role {other:?}")),
    }
}

fn recv(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let mut cfg = NodeConfig::new("n1", a.listen, secret)
        .peer("n0", a.peer)
        .mailbox(CTL)
        .bundler(a.bundler)
        .idle_cpu_level(a.idle_cpu_level);
    for k in 0..MAILBOXES {
        cfg = cfg.mailbox(rt_name(k));
    }
    let node = Node::start(super::with_bench_settings(cfg, None)).ctx("starting node n1")?;
    let ctl = Ctl::new(&node, 1, 2)?;
    let mbs = (0..MAILBOXES)
        .map(|k| node.mailbox(&rt_name(k)).ctx("mailbox"))
        .collect::<Result<Vec<_>, _>>()?;
    let stop = AtomicBool::new(false);
    let served = std::thread::scope(|s| -> Result<u64, String> {
        let hs: Vec<_> = mbs
            .iter()
            .map(|mb| s.spawn(|| serve_ids(mb, &stop)))
            .collect();
        // The sender says when it is done (generous: 10 KB batches on a slow bundler).
        let done = ctl.finish(Duration::from_secs(900));
        stop.store(true, Ordering::Release);
        let mut served = 0;
        for h in hs {
            served += h
                .join()
                .unwrap_or_else(|_| Err("a serving thread panicked".into()))?;
        }
        done?;
        Ok(served)
    })?;
    drop(mbs);
    node.shutdown();
    print_result(&ServeReport { served })
}

/// Send every message's 8-byte id back to its sender until `stop`.
fn serve_ids(mb: &Mailbox, stop: &AtomicBool) -> Result<u64, String> {
    let mut batch = Vec::with_capacity(1024);
    let mut served = 0;
    loop {
        match mb.recv_batch_into(&mut batch, 1024, Duration::from_millis(20)) {
            Ok(_) => {
                for e in batch.drain(..) {
                    let id = e.payload.slice(..HEADER.min(e.payload.len()));
                    mb.send(&e.from, id)
                        .map_err(|err| format!("reply to {}: {err}", e.from))?;
                    served += 1;
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) if stop.load(Ordering::Acquire) => {
                return Ok(served);
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => return Ok(served),
        }
    }
}

/// Run `plan` from `mb` against `dests` (message c goes to `dests[c % len]`): send each
/// batch, wait until its ids are back, time it.
pub fn drive(mb: &Mailbox, dests: &[Address], plan: &Plan) -> Result<DriveReport, String> {
    let groups = plan.all_groups();
    let streams = dests.len().max(1);
    let per_stream = plan.total_messages().div_ceil(streams as u64);
    let batch = plan.batch;
    let (tx, rx) = mpsc::channel::<Option<Instant>>();
    let groups_ref = &groups;
    std::thread::scope(|s| -> Result<DriveReport, String> {
        // The receiving side: count the ids back, batch by batch; per group, the faults.
        let receiver = s.spawn(move || -> Vec<Faults> {
            let mut v = Verifier::new(streams, per_stream);
            let mut buf = Vec::with_capacity(4096);
            let mut faults = Vec::new();
            let mut want = 0u64;
            let mut gave_up = false;
            for &(_, batches) in groups_ref {
                let (d0, dup0, re0) = (v.distinct, v.duplicated, v.reordered);
                let group_total = batches * batch;
                for _ in 0..batches {
                    want += batch;
                    while !gave_up && v.distinct < want {
                        match mb.recv_batch_into(&mut buf, 4096, REPLY_TIMEOUT) {
                            Ok(_) => {
                                for e in buf.drain(..) {
                                    match u64_at(&e.payload, 0) {
                                        Some(c) => {
                                            v.see((c % streams as u64) as usize, c / streams as u64)
                                        }
                                        None => v.malformed(),
                                    }
                                }
                            }
                            Err(RecvError::Empty) => {}
                            Err(_) => gave_up = true,
                        }
                    }
                    if gave_up {
                        let _ = tx.send(None);
                        break;
                    }
                    let _ = tx.send(Some(Instant::now()));
                }
                faults.push(Faults {
                    lost: group_total.saturating_sub(v.distinct - d0),
                    duplicated: v.duplicated - dup0,
                    reordered: v.reordered - re0,
                });
            }
            faults
        });
        // The sending side: one batch at a time, timed from its first send to its last id.
        let mut elapsed: Vec<Duration> = vec![Duration::ZERO; groups.len()];
        let mut c = 0u64;
        let mut chunk = BytesMut::new();
        let mut send_error = None;
        'all: for (g, &(size, batches)) in groups.iter().enumerate() {
            let size = size.max(HEADER);
            for _ in 0..batches {
                let t0 = Instant::now();
                for _ in 0..batch {
                    if chunk.capacity() < size {
                        chunk = BytesMut::with_capacity((1 << 20).max(size));
                    }
                    chunk.put_u64_le(c);
                    chunk.put_bytes(0, size - HEADER);
                    let to = &dests[(c % streams as u64) as usize];
                    if let Err(e) = mb.send(to, chunk.split().freeze()) {
                        send_error = Some(format!("send to {to}: {e}"));
                        break 'all;
                    }
                    c += 1;
                }
                match rx.recv() {
                    Ok(Some(end)) => elapsed[g] += end.saturating_duration_since(t0),
                    Ok(None) | Err(_) => break 'all,
                }
            }
        }
        let faults = receiver
            .join()
            .map_err(|_| "the receiving thread panicked".to_string())?;
        if let Some(e) = send_error {
            return Err(e);
        }
        let mut out: Vec<GroupReport> = groups
            .iter()
            .zip(&elapsed)
            .zip(&faults)
            .map(|((&(size, batches), d), f)| GroupReport {
                size,
                batches,
                ms_per_batch: d.as_secs_f64() * 1e3 / batches.max(1) as f64,
                faults: *f,
            })
            .collect();
        // The warm-up is not reported, but its faults fail the first group.
        if plan.warmup > 0 && !out.is_empty() {
            let w = out.remove(0);
            if let Some(first) = out.first_mut() {
                first.faults += w.faults;
            }
        }
        Ok(DriveReport { groups: out })
    })
}

/// Start the two worker processes for one run and collect the sender's report.
fn one_run(
    bundler: BundlerKind,
    idle: u8,
    plan: &Plan,
    base_port: u16,
) -> Result<DriveReport, String> {
    let send_addr = node_addr(base_port, 0)?;
    let recv_addr = node_addr(base_port, 1)?;
    let plan = plan.encode()?;
    let args = |role: &str, listen: SocketAddr, peer: SocketAddr| {
        worker_args(
            "roundtrip",
            role,
            &[
                ("listen", listen.to_string()),
                ("peer", peer.to_string()),
                ("plan", plan.clone()),
                ("bundler", bundler.name().to_string()),
                ("idle-cpu-level", idle.to_string()),
            ],
        )
    };
    let lines = run_workers(
        &[
            args("recv", recv_addr, send_addr),
            args("send", send_addr, recv_addr),
        ],
        Duration::from_secs(900),
    )?;
    let mut r: Vec<DriveReport> = parse_results(&lines[1..])?;
    r.pop().ok_or_else(|| "no sender report".into())
}

/// With `--peers`: this process sends; the remote nodes' echo mailboxes answer.
fn remote_run(
    c: &Common,
    bundler: BundlerKind,
    idle: u8,
    plan: &Plan,
) -> Result<DriveReport, String> {
    let remote = c.remote.as_ref().ok_or("no --peers")?;
    let node = remote.start_client(bundler, idle, &[BACK.to_string()])?;
    let dests = remote.echo_addresses()?;
    let mb = node.mailbox(BACK).ctx("mailbox back")?;
    let report = drive(&mb, &dests, plan)?;
    drop(mb);
    super::settle();
    node.shutdown();
    Ok(report)
}

/// Run the scenario: `runs` rounds of every (bundler, idle level) pair, each run the whole
/// plan.
pub fn run(c: &Common, ov: &Overrides) -> Result<Vec<BenchResult>, String> {
    c.require_bundlers("roundtrip")?;
    if let Some(n) = ov.nodes.filter(|n| *n != 2) {
        return Err(format!(
            "roundtrip runs 2 nodes (a sender and a receiver with {MAILBOXES} mailboxes); --nodes {n} applies to mperf and rpc"
        ));
    }
    if let Some(t) = ov.threads {
        return Err(format!(
            "roundtrip has one sending thread and {MAILBOXES} receiving mailboxes; --threads {t} applies to fan-in and rpc"
        ));
    }
    let sizes = ov.sizes_or(&[100, 1000, 10_000], HEADER, "roundtrip")?;
    let batch = ov.messages.unwrap_or(1000);
    if batch == 0 {
        return Err("roundtrip: --messages (per batch) must be at least 1".into());
    }
    let plan =
        Plan::new(&sizes, batch, c.quick).with_counts(ov.batches.as_deref(), ov.warmup_batches)?;
    let combos = c.combos();
    let progress = Progress::new((c.runs * combos.len()) as u64, "roundtrip", c.quiet);
    // per combo, per group: the run figures and faults.
    let mut figs = vec![vec![Vec::new(); plan.groups.len()]; combos.len()];
    let mut faults = vec![vec![Faults::default(); plan.groups.len()]; combos.len()];
    for run in 0..c.runs {
        for (i, &(b, idle)) in combos.iter().enumerate() {
            let what = format!(
                "roundtrip {:<20} run {}/{}",
                format!("{b} (idle {idle})"),
                run + 1,
                c.runs
            );
            progress.running(what.clone());
            let rep = match &c.remote {
                Some(_) => remote_run(c, b, idle, &plan)?,
                None => one_run(b, idle, &plan, c.base_port)?,
            };
            let mut line = format!("  {what}:");
            for (g, gr) in rep.groups.iter().enumerate().take(plan.groups.len()) {
                figs[i][g].push(gr.ms_per_batch);
                faults[i][g] += gr.faults;
                line += &format!(" {} B {:.2} ms", gr.size, gr.ms_per_batch);
            }
            progress.done(line);
        }
    }
    let nodes = c.remote.as_ref().map(|r| r.peers.len() + 1).unwrap_or(2);
    let mut results = Vec::new();
    for (g, &(size, batches)) in plan.groups.iter().enumerate() {
        for (i, &(b, idle)) in combos.iter().enumerate() {
            let mut r = BenchResult::new(
                "roundtrip",
                b.name(),
                Some(idle),
                size,
                figs[i][g].clone(),
                "ms/batch",
            )
            .with_faults(faults[i][g]);
            r.messages = batches * plan.batch;
            r.nodes = nodes;
            results.push(r);
        }
    }
    out!("{}", table(&results, &plan, c));
    Ok(results)
}

/// Rows: sizes; columns: (bundler, idle level) pairs, as in the post's table.
fn table(results: &[BenchResult], plan: &Plan, c: &Common) -> String {
    let combos = c.combos();
    let mut head = vec!["messages / bytes".to_string()];
    head.extend(combos.iter().map(|(b, l)| format!("{b} (idle {l})")));
    let mut t = Table::new(head);
    for (g, &(size, batches)) in plan.groups.iter().enumerate() {
        let row = &results[g * combos.len()..(g + 1) * combos.len()];
        let mut cells = vec![format!("{} / {} B ({batches} batches)", plan.batch, size)];
        let mut failures = Vec::new();
        for r in row {
            if r.failed() {
                cells.push("FAILED".into());
                failures.push(format!("{}: {}", r.label(true), r.failure()));
            } else {
                cells.push(format!("{:.2}", r.median));
            }
        }
        t.row(cells);
        for f in failures {
            t.failed_row(vec![String::new()], f);
        }
    }
    let who = match &c.remote {
        Some(r) => format!(
            "to the echo mailbox of {} remote node(s), which send the whole message back",
            r.peers.len()
        ),
        None => format!(
            "spread over {MAILBOXES} mailboxes on n1, each served by a thread that sends the 8-byte id back"
        ),
    };
    format!(
        "\nroundtrip: batches of {} messages {who}; a batch ends when every id is back; \
         average ms per batch (lower is better), median of {} alternating runs, after {} \
         warm-up batches of {} B\n{}",
        plan.batch,
        c.runs,
        plan.warmup,
        plan.warmup_size,
        t.render()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_plan_is_the_posts() {
        let p = Plan::new(&[100, 1000, 10_000], 1000, false);
        assert_eq!((p.warmup, p.warmup_size), (50, 100));
        assert_eq!(p.groups, [(100, 100), (1000, 50), (10_000, 15)]);
        assert_eq!(p.total_messages(), (50 + 100 + 50 + 15) * 1000);
        let q = Plan::new(&[100, 1000, 10_000], 1000, true);
        assert_eq!(q.groups, [(100, 50), (1000, 25), (10_000, 7)]);
        let back: Plan = serde_json::from_str(&p.encode().unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn batch_counts_can_be_given() {
        let p = Plan::new(&[100, 1000, 10_000], 1000, false);
        let q = p.clone().with_counts(Some(&[10, 5, 2]), Some(3)).unwrap();
        assert_eq!(q.groups, [(100, 10), (1000, 5), (10_000, 2)]);
        assert_eq!(q.warmup, 3);
        let one = p.clone().with_counts(Some(&[4]), None).unwrap();
        assert_eq!(one.groups, [(100, 4), (1000, 4), (10_000, 4)]);
        assert_eq!(one.warmup, 50);
        assert!(p.clone().with_counts(Some(&[1, 2]), None).is_err());
        assert!(p.with_counts(Some(&[0]), None).is_err());
    }
}
