//! The `fan-in` scenario, after the Erlang relay post ("loads of client threads have to go
//! through a bottleneck of a single registered process"): on node n0, S OS threads
//! (default 1000) send N messages in all (default 200,000 of 100 B) at once to ONE mailbox
//! on node n1, in another process, which takes them one per call (`recv_timeout`).
//!
//! Each payload carries (sequence, sender thread), so n1 checks the count, duplicates and
//! each thread's order. The rate is N divided by the time from the release of all sender
//! threads (a gate they wait at, opened once every one of them is ready) to n1's last
//! delivery; both processes read the same wall clock on one host.
//!
//! `raw` (in `all`) is the ceiling, run in the same rounds: the same threads send the same
//! payloads through one mutex-guarded queue (each encoded into the frame open at its end,
//! as a lane does) that one writer thread drains to a plain TCP stream (`faninraw.rs`,
//! built on this file's sending threads).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use super::{
    BenchResult, CTL, Common, Context, Ctl, Faults, Overrides, Progress, Verifier, now_ns,
    parse_results, print_result, run_workers, share, si, worker_args,
};
use batchwire::{Address, BundlerKind, Node, NodeConfig, RecvError};

/// How `--pin` places the processes (in the table's title and the JSON's `pinned`).
const PINNED: &str = "n0's process on CPU 0, n1's on CPU 1";

/// The payload header: sequence number (u64) and sender thread (u32), little-endian.
pub const HEADER: usize = 12;

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// send or recv (a node), raw-send or raw-recv (the ceiling, run by `faninraw`).
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub listen: SocketAddr,
    /// The other process's address.
    #[arg(long)]
    pub peer: SocketAddr,
    /// Messages in all, over every sender thread.
    #[arg(long)]
    pub messages: u64,
    /// Sender threads.
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub size: usize,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
    /// Run this process (every thread it starts) on this CPU only.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
}

/// What the sending worker reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct SendReport {
    /// Wall clock (ns since the epoch) when the sender threads were released.
    pub start_ns: u128,
}

/// Where the sender threads wait until every one of them is ready. Only the last arrival
/// wakes the thread that opens the gate (`arrived`), and none wakes the threads already
/// waiting (`opened`).
struct Gate {
    /// Threads expected.
    all: usize,
    state: Mutex<(usize, Option<bool>)>,
    arrived: Condvar,
    opened: Condvar,
}

impl Gate {
    fn new(all: usize) -> Gate {
        Gate {
            all,
            state: Mutex::new((0, None)),
            arrived: Condvar::new(),
            opened: Condvar::new(),
        }
    }

    /// Arrive and wait for the verdict: true to go, false to give up.
    fn arrive_and_wait(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        if g.0 == self.all {
            self.arrived.notify_one();
        }
        loop {
            if let Some(go) = g.1 {
                return go;
            }
            g = self.opened.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wait until every thread arrived.
    fn wait_all(&self) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while g.0 < self.all {
            g = self.arrived.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open(&self, go: bool) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(go);
        self.opened.notify_all();
    }
}

/// Run a worker role; prints its report line on stdout.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    if let Some(cpu) = a.pin_cpu {
        // Before the node starts: its threads, and the sender threads, inherit it.
        pin_to_cpu(cpu)?;
    }
    match a.role.as_str() {
        "recv" => recv(a, secret),
        "send" => send(a, secret),
        other => Err(format!("unknown fan-in role {other:?}")),
    }
}

fn recv(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let cfg = NodeConfig::new("n1", a.listen, secret)
        .peer("n0", a.peer)
        .mailbox("sink")
        .mailbox(CTL)
        .bundler(a.bundler)
        .idle_cpu_level(a.idle_cpu_level);
    let node = Node::start(super::with_bench_settings(cfg, None)).ctx("starting node n1")?;
    let ctl = Ctl::new(&node, 1, 2)?;
    let mb = node.mailbox("sink").ctx("mailbox sink")?;
    let mut v = Verifier::new(a.threads, share(a.messages, a.threads, 0));
    // Generous for the first message (the sender may start late), then 10 s idle.
    let mut wait = Duration::from_secs(60);
    let mut cpu0 = None;
    while v.distinct < a.messages {
        match mb.recv_timeout(wait) {
            Ok(e) => {
                cpu0.get_or_insert_with(super::process_cpu_ns);
                v.see_stamped(&e.payload);
                wait = Duration::from_secs(10);
            }
            Err(RecvError::Empty) => {}
            Err(_) => break,
        }
    }
    let end_ns = now_ns();
    let cpu_ns = cpu0.map_or(0, |c| super::process_cpu_ns().saturating_sub(c));
    let see = |v: &mut Verifier, p: &[u8]| v.see_stamped(p);
    super::finish_receiver(node, ctl, mb, &mut v, a.messages, see, (end_ns, cpu_ns))
}

fn send(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let cfg = NodeConfig::new("n0", a.listen, secret)
        .peer("n1", a.peer)
        .mailbox(CTL)
        .bundler(a.bundler)
        .idle_cpu_level(a.idle_cpu_level);
    let node = Node::start(super::with_bench_settings(cfg, None)).ctx("starting node n0")?;
    let ctl = Ctl::new(&node, 0, 2)?;
    if !node.wait_for_peers(&["n1"], Duration::from_secs(30)) {
        return Err("receiver did not come up within 30 s".into());
    }
    let to = Address::new("n1", "sink").ctx("address")?;
    let mut finished = None;
    let start_ns = run_senders(
        a,
        &|p| node.send(&to, p).map_err(|e| e.to_string()),
        |all_sent| {
            // With none failed, the receiver's finish barrier means everything was
            // delivered: then the threads may end.
            if all_sent {
                finished = Some(ctl.finish(Duration::from_secs(300)));
            }
        },
    );
    let start_ns = start_ns?;
    finished.ok_or("the fan-in run did not finish")??;
    node.shutdown();
    print_result(&SendReport { start_ns })
}

/// The sending side's threads, for a node's run and the raw ceiling alike: S threads (128
/// KiB stacks), each builds its share of the payloads, waits at a gate until every thread
/// is ready, sends its payloads one per call of `send_one`, and waits at a second gate.
/// `sent(all_sent)` runs once every thread has sent (`all_sent` false if one failed), before
/// the threads may end: it waits until the receiver has everything, so that no thread
/// exits inside the measured interval (a thread that exits while others still send unmaps
/// its stack: TLB shootdowns on both CPUs, about a fifth of the senders' CPU time in the
/// measured interval at 100 B, a cost of the bench's short-lived threads and not of
/// sending). Returns when the gate opened (wall clock, ns), or the first error.
pub(super) fn run_senders(
    a: &WorkerArgs,
    send_one: &(dyn Fn(Bytes) -> Result<(), String> + Sync),
    sent: impl FnOnce(bool),
) -> Result<u128, String> {
    let size = a.size.max(HEADER);
    let (gate, end) = (Gate::new(a.threads), Gate::new(a.threads));
    let failed = AtomicBool::new(false);
    let (gate, end, failed) = (&gate, &end, &failed);
    std::thread::scope(|s| -> Result<u128, String> {
        let mut handles = Vec::with_capacity(a.threads);
        let mut spawn_error = None;
        for t in 0..a.threads {
            let n = share(a.messages, a.threads, t);
            let h = std::thread::Builder::new()
                .name(format!("fan-in-{t}"))
                .stack_size(128 << 10)
                .spawn_scoped(s, move || -> Result<(), String> {
                    // Payloads are built before the gate opens: only sending is timed.
                    let mut chunk = BytesMut::with_capacity(n as usize * size);
                    let mut payloads = Vec::with_capacity(n as usize);
                    for seq in 0..n {
                        chunk.put_u64_le(seq);
                        chunk.put_u32_le(t as u32);
                        chunk.put_bytes(0, size - HEADER);
                        payloads.push(chunk.split().freeze());
                    }
                    if !gate.arrive_and_wait() {
                        return Ok(());
                    }
                    let result = payloads
                        .into_iter()
                        .try_for_each(send_one)
                        .map_err(|e| format!("sender thread {t}: {e}"));
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    end.arrive_and_wait();
                    result
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(format!("cannot start sender thread {t}: {e}"));
                    break;
                }
            }
        }
        let start_ns = match &spawn_error {
            None => {
                gate.wait_all();
                let t = now_ns();
                gate.open(true);
                end.wait_all();
                sent(!failed.load(Ordering::Relaxed));
                end.open(true);
                t
            }
            Some(_) => {
                gate.open(false);
                0
            }
        };
        let mut first_error = spawn_error;
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err("a sender thread panicked".into()));
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(start_ns),
        }
    })
}

/// Restrict the calling thread (and the threads it starts from now on) to CPU `cpu`.
pub(super) fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    crate::sys::pin_to_cpu(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct RunOutcome {
    pub rate: f64,
    pub faults: Faults,
}

/// Options of the scenario, defaults applied.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    pub messages: u64,
    pub threads: usize,
    /// The sending process on CPU 0 and the receiving one on CPU 1 (`--pin`).
    pub pin: bool,
}

impl Options {
    /// The full-size defaults (200,000 messages of 100 B from 1000 threads), or the quick
    /// ones; the command line overrides either.
    pub fn resolve(c: &Common, o: &Overrides, pin: bool) -> Result<Options, String> {
        if pin {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if cpus < 2 {
                return Err(format!(
                    "fan-in --pin puts the two processes on CPUs 0 and 1; this process may use {cpus}"
                ));
            }
        }
        if let Some(n) = o.nodes.filter(|n| *n != 2) {
            return Err(format!(
                "fan-in runs 2 nodes (senders on one, the mailbox on the other); --nodes {n} applies to mperf and rpc"
            ));
        }
        let messages = o
            .messages
            .unwrap_or(if c.quick { 100_000 } else { 200_000 });
        let threads = o.threads_or(1000, "fan-in")?;
        if messages < threads as u64 {
            return Err(format!(
                "fan-in: --messages {messages} is fewer than the {threads} sender threads"
            ));
        }
        Ok(Options {
            sizes: o.sizes_or(&[100], HEADER, "fan-in")?,
            messages,
            threads,
            pin,
        })
    }
}

/// Start the two worker processes for one run and collect the outcome.
/// `bundler` `None` runs the raw ceiling.
pub fn one_run(
    bundler: Option<BundlerKind>,
    idle: u8,
    size: usize,
    o: &Options,
    base_port: u16,
) -> Result<RunOutcome, String> {
    let send_addr = super::node_addr(base_port, 0)?;
    let recv_addr = super::node_addr(base_port, 1)?;
    let args = |role: &str, listen: SocketAddr, peer: SocketAddr, cpu: usize| {
        let mut flags = vec![
            ("listen", listen.to_string()),
            ("peer", peer.to_string()),
            ("messages", o.messages.to_string()),
            ("threads", o.threads.to_string()),
            ("size", size.to_string()),
        ];
        if let Some(b) = bundler {
            flags.push(("bundler", b.name().to_string()));
            flags.push(("idle-cpu-level", idle.to_string()));
        }
        if o.pin {
            flags.push(("pin-cpu", cpu.to_string()));
        }
        worker_args("fan-in", role, &flags)
    };
    let [send_role, recv_role] = match bundler {
        Some(_) => ["send", "recv"],
        None => ["raw-send", "raw-recv"],
    };
    let lines = run_workers(
        &[
            args(recv_role, recv_addr, send_addr, 1),
            args(send_role, send_addr, recv_addr, 0),
        ],
        Duration::from_secs(300),
    )?;
    let (r, s) = (&lines[..1], &lines[1..]);
    let r: Vec<super::RecvReport> = parse_results(r)?;
    let s: Vec<SendReport> = parse_results(s)?;
    let (r, s) = (&r[0], &s[0]);
    let secs = r.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
    Ok(RunOutcome {
        rate: if secs > 0.0 {
            r.distinct as f64 / secs
        } else {
            0.0
        },
        faults: Faults {
            lost: o.messages.saturating_sub(r.distinct),
            duplicated: r.duplicated,
            reordered: r.reordered,
        },
    })
}

/// Run the scenario: for each size, `runs` rounds of every (bundler, idle level) pair.
pub fn run(c: &Common, ov: &Overrides, pin: bool) -> Result<Vec<BenchResult>, String> {
    c.refuse_remote("fan-in")?;
    if !c.raw {
        c.require_bundlers("fan-in")?;
    }
    let o = Options::resolve(c, ov, pin)?;
    // Every (bundler, idle level) pair, then the raw ceiling (no transport threads: once).
    let mut combos: Vec<(Option<BundlerKind>, u8)> =
        c.combos().into_iter().map(|(b, l)| (Some(b), l)).collect();
    if c.raw {
        combos.push((None, 0));
    }
    let label = |b: Option<BundlerKind>, idle: u8| match b {
        None => "raw".to_string(),
        Some(b) => super::row_label(b.name(), Some(idle), c.show_idle()),
    };
    let progress = Progress::new(
        (o.sizes.len() * c.runs * combos.len()) as u64,
        "fan-in",
        c.quiet,
    );
    let mut results = Vec::new();
    for &size in &o.sizes {
        let mut rates = vec![Vec::new(); combos.len()];
        let mut faults = vec![Faults::default(); combos.len()];
        for run in 0..c.runs {
            for (i, &(b, idle)) in combos.iter().enumerate() {
                let what = format!(
                    "fan-in {size} B {:<20} run {}/{}",
                    label(b, idle),
                    run + 1,
                    c.runs
                );
                progress.running(what.clone());
                let out = one_run(b, idle, size, &o, c.base_port)?;
                progress.done(format!("  {what}: {}msg/s", si(out.rate)));
                rates[i].push(out.rate);
                faults[i] += out.faults;
            }
        }
        let first = results.len();
        for (i, &(b, idle)) in combos.iter().enumerate() {
            let mut r = BenchResult::new(
                "fan-in",
                b.map_or("raw", |b| b.name()),
                b.map(|_| idle),
                size,
                rates[i].clone(),
                "msgs/s",
            )
            .with_faults(faults[i]);
            r.messages = o.messages;
            r.threads = o.threads;
            r.pinned = o.pin.then(|| PINNED.to_string());
            results.push(r);
        }
        out!("{}", table(&results[first..], &o, c));
    }
    Ok(results)
}

/// The table of one size.
fn table(rows: &[BenchResult], o: &Options, c: &Common) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let t = super::rate_table(rows, c.runs, c.show_idle(), "MB/s");
    let raw = rows.iter().any(|r| r.bundler == "raw");
    format!(
        "\nfan-in: {} x {} B from {} threads on n0 to ONE mailbox on n1, received one message per call; \
         msgs/s from the threads' release to the last delivery, median of {} alternating runs{}{}\n{}{}",
        o.messages,
        first.size,
        o.threads,
        c.runs,
        if o.pin {
            format!(" ({PINNED})")
        } else {
            String::new()
        },
        if raw {
            "; raw: the same threads and payloads through one mutex-guarded queue and one writer thread to plain TCP, no node"
        } else {
            ""
        },
        t.render(),
        super::shares_of_raw(rows, c.show_idle())
    )
}
