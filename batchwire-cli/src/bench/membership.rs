//! The `membership` scenario: N `batchwire node` processes on loopback (each node its own
//! process, so a crash is a real SIGKILL), all joining through one seed. Each node prints
//! its membership events (`member joined|suspected|alive|down|left NAME ADDR INCARNATION`)
//! and, every second, its counters; the bench timestamps every line as it arrives.
//!
//! Per run it measures:
//! 1. **converge**: from starting the seed until every node sees the other N-1 alive (the
//!    bench starts them all at once, its starting thread ahead of the nodes if it may);
//! 2. **at rest**: over `--phase-ms` (default 5 s) after that, the membership bytes each node
//!    sends per second, and all bytes it sends (connection heartbeats included);
//! 3. **down**: a non-seed node is SIGKILLed; the time until every survivor reports it down;
//! 4. **rejoin**: it is started again (same name and port: a new incarnation); the time
//!    until every survivor reports it joined and it sees the N-1 others.
//!
//! Then every process is killed. The threads, resident memory and CPU of every node are
//! read from /proc at rest (after the join connections closed for idleness, with
//! connections on demand: `--idle-close-ms`, default 2000 here; 0 runs the full mesh).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use batchwire::MembershipConfig;

use super::pipes::Pipes;
use super::{BenchResult, Context, Progress, Table};

mod lines;
use lines::{Lines, Seen, learnt, spread};

/// One node process.
struct Proc {
    child: Child,
}

fn free_addrs(n: usize) -> Result<Vec<SocketAddr>, String> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .ctx("finding free ports")?;
    ls.iter()
        .map(|l| l.local_addr().ctx("a free port"))
        .collect()
}

/// How each node is started.
#[derive(Clone, Copy)]
struct NodeOpts {
    /// `--idle-close-ms` (0: the full mesh).
    idle_close_ms: u64,
}

fn spawn(
    dir: &std::path::Path,
    i: usize,
    name: &str,
    addr: SocketAddr,
    seed: Option<SocketAddr>,
    pipes: &Pipes,
    opts: NodeOpts,
) -> Result<Proc, String> {
    let exe = std::env::current_exe().ctx("finding the batchwire binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["node", "--name", name, "--listen", &addr.to_string()])
        .arg("--secret-file")
        .arg(dir.join("secret"))
        .args(["--stats-every", "1", "--stats-brief", "--event-times"])
        .args(["--idle-close-ms", &opts.idle_close_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // BATCHWIRE_BENCH_LOGS=DIR keeps each node's log (at BATCHWIRE_LOG's level) there.
    match std::env::var_os("BATCHWIRE_BENCH_LOGS") {
        Some(logs) => {
            let f = std::fs::File::create(std::path::Path::new(&logs).join(format!("{name}.log")))
                .ctx("creating a node log")?;
            cmd.stderr(f);
        }
        None => {
            cmd.env("BATCHWIRE_LOG", "error").stderr(Stdio::null());
        }
    }
    if let Some(s) = seed {
        cmd.args(["--join", &s.to_string()]);
    }
    let mut child = cmd.spawn().ctx("starting a node process")?;
    pipes.add(i, child.stdout.take().ok_or("no stdout")?);
    Ok(Proc { child })
}

/// (threads, resident KiB, CPU ms used so far) of process `pid`.
fn usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k| super::scale::status_field(&status, k).unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's name: state is field 3, utime 14 and stime 15 (clock ticks of
    // 10 ms).
    let rest: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (
        field("Threads:"),
        field("VmRSS:"),
        (ticks(11) + ticks(12)) as f64 * 10.0,
    )
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct RunFigures {
    converge_s: f64,
    /// When the last node process was started (the bench starts them one by one).
    spawned_s: f64,
    /// When the median and the 90th-percentile node first saw all others.
    converge_p50_s: f64,
    converge_p90_s: f64,
    /// When half, 90%, 99% and 99.9% of all (node, member) pairs had been learnt.
    learnt_s: [f64; 4],
    /// CPU per node (ms, median and largest) and of all nodes (s) from their start to rest.
    join_cpu_ms: (f64, f64),
    join_cpu_total_s: f64,
    /// Suspicions and downs all nodes reported until converged (no node had failed).
    join_alarms: (u64, u64),
    /// Membership packets each node read and sent from its start to rest (medians), and
    /// of those sent, probes, gossip and full-state answers (medians).
    join_packets: (f64, f64),
    join_sent_kinds: [f64; 3],
    /// The node that saw all last, and the member it learnt last.
    slowest: String,
    down_all_s: f64,
    down_median_s: f64,
    rejoin_s: f64,
    member_bps_median: f64,
    member_bps_max: f64,
    all_bps_median: f64,
    /// Per node at rest: median and largest.
    threads: (f64, f64),
    rss_mib: (f64, f64),
    /// Percent of one core, per node at rest: median and largest.
    cpu_percent: (f64, f64),
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

fn med_max(mut v: Vec<f64>) -> (f64, f64) {
    let max = v.iter().cloned().fold(0.0, f64::max);
    (median(&mut v), max)
}

fn one_run(n: usize, rest: Duration, opts: NodeOpts) -> Result<RunFigures, String> {
    let dir = std::env::temp_dir().join(format!("batchwire-membership-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ctx("making a temporary folder")?;
    std::fs::write(dir.join("secret"), "batchwire-bench-membership").ctx("writing the secret")?;
    let addrs = free_addrs(n)?;
    let (tx, rx) = channel();
    // Every node's stdout, read on one thread (it ends when the run is over: this handle
    // dropped, every node gone).
    let pipes = Pipes::start(tx);
    let mut lines = Lines::new(rx, n);
    let names: Vec<String> = (0..n).map(|i| format!("m{i:03}")).collect();
    let mut procs: Vec<Proc> = Vec::with_capacity(n);
    let res = (|| {
        // 1. Converge: the seed, then everyone else at once, knowing only the seed.
        //    This thread runs ahead of the nodes while it starts them (they run at the
        //    ordinary priority): else it gets a share of the CPUs among the nodes already
        //    started, and how fast one thread can start a thousand processes on two CPUs
        //    is what gets measured (17-20 s), not how fast they converge.
        let ahead = crate::sys::run_ahead(true);
        if let Err(e) = &ahead {
            eprintln!(
                "note: starting the nodes at the ordinary priority ({e}; needs CAP_SYS_NICE): the time to start them is part of the convergence time"
            );
        }
        let t0 = Instant::now();
        let started = (0..n).try_for_each(|i| {
            let seed = (i > 0).then_some(addrs[0]);
            procs.push(spawn(&dir, i, &names[i], addrs[i], seed, &pipes, opts)?);
            Ok::<_, String>(())
        });
        let spawned_s = t0.elapsed().as_secs_f64();
        if ahead.is_ok() {
            let _ = crate::sys::run_ahead(false);
        }
        started?;
        let all = |s: &[Seen]| s.iter().all(|x| x.live() == n - 1);
        let limit = Duration::from_secs(60).max(Duration::from_millis(120 * n as u64));
        let done = lines.until(limit, all).ok_or_else(|| {
            let mut live: Vec<usize> = lines.seen.iter().map(Seen::live).collect();
            live.sort();
            format!(
                "{n} nodes did not converge within {limit:?} (live members each sees, least first: {:?})",
                &live[..live.len().min(20)]
            )
        })?;
        let converge_s = (done - t0).as_secs_f64();
        let (converge_p50_s, converge_p90_s) = spread(&lines.seen, t0);
        let learnt_s = learnt(&lines.seen, t0);
        let join_alarms = lines
            .seen
            .iter()
            .fold((0, 0), |a, s| (a.0 + s.alarms.0, a.1 + s.alarms.1));
        let slowest = lines
            .seen
            .iter()
            .enumerate()
            .max_by_key(|(_, s)| s.full_at)
            .map(|(i, s)| format!("{} (it learnt {} last)", names[i], s.completed_by))
            .unwrap_or_default();
        // 2. At rest: after the join connections closed for idleness (on demand), for
        //    `rest`.
        let settle = Duration::from_millis(1500 + opts.idle_close_ms);
        let t_settle = Instant::now();
        while t_settle.elapsed() < settle {
            lines.until(Duration::from_millis(100), |_| false);
        }
        let before: Vec<_> = lines.seen.iter().map(|s| s.sent).collect();
        let cpu0: Vec<f64> = procs.iter().map(|p| usage(p.child.id()).2).collect();
        // What the join cost: each node's CPU from its start until now (the settle included).
        let join_cpu_ms = med_max(cpu0.clone());
        let join_cpu_total_s = cpu0.iter().sum::<f64>() / 1000.0;
        let packets = |f: fn(&Seen) -> u64| {
            median(&mut lines.seen.iter().map(|s| f(s) as f64).collect::<Vec<_>>())
        };
        let join_packets = (packets(|s| s.packets.0), packets(|s| s.packets.1));
        let join_sent_kinds = [
            packets(|s| s.sent_kinds[0]),
            packets(|s| s.sent_kinds[1]),
            packets(|s| s.sent_kinds[2]),
        ];
        let tc = Instant::now();
        lines.until(rest, |_| false);
        let used: Vec<(u64, u64, f64)> = procs.iter().map(|p| usage(p.child.id())).collect();
        let secs = tc.elapsed().as_secs_f64();
        let threads = med_max(used.iter().map(|u| u.0 as f64).collect());
        let rss_mib = med_max(used.iter().map(|u| u.1 as f64 / 1024.0).collect());
        let cpu_percent = med_max(
            used.iter()
                .zip(&cpu0)
                .map(|(u, c0)| (u.2 - c0) / 1000.0 / secs * 100.0)
                .collect(),
        );
        let (mut member_bps, mut all_bps) = (Vec::new(), Vec::new());
        for (b, s) in before.iter().zip(&lines.seen) {
            if let (Some((t0, m0, a0)), Some((t1, m1, a1))) = (b, s.sent) {
                let dt = (t1 - *t0).as_secs_f64();
                if dt > 0.5 {
                    member_bps.push((m1 - m0) as f64 / dt);
                    all_bps.push((a1 - a0) as f64 / dt);
                }
            }
        }
        if member_bps.len() < n / 2 {
            return Err("too few nodes printed their counters at rest".to_string());
        }
        // 3. A crash: SIGKILL a node that is not the seed.
        let v = n / 2;
        let victim = names[v].clone();
        let old_inc = lines.seen[0].members.get(&victim).map_or(0, |m| m.1);
        procs[v].child.kill().ctx("killing a node")?;
        let tk = Instant::now();
        let _ = procs[v].child.wait();
        let down = |s: &[Seen]| {
            s.iter().enumerate().filter(|(i, _)| *i != v).all(|(_, x)| {
                x.members
                    .get(&victim)
                    .is_some_and(|m| m.0 == "down" || m.0 == "left")
            })
        };
        let all_down = lines
            .until(limit, down)
            .ok_or_else(|| format!("not every survivor saw {victim} down within {limit:?}"))?;
        let mut each: Vec<f64> = lines
            .seen
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != v)
            .filter_map(|(_, x)| x.members.get(&victim).map(|m| (m.2 - tk).as_secs_f64()))
            .collect();
        // 4. Rejoin: the same name and port, a new incarnation.
        lines.seen[v] = Seen::default();
        let tr = Instant::now();
        procs[v] = spawn(&dir, v, &victim, addrs[v], Some(addrs[0]), &pipes, opts)?;
        let back = |s: &[Seen]| {
            s[v].live() == n - 1
                && s.iter().enumerate().filter(|(i, _)| *i != v).all(|(_, x)| {
                    x.members
                        .get(&victim)
                        .is_some_and(|m| m.0 == "joined" && m.1 != old_inc)
                })
        };
        let rejoined = lines
            .until(limit, back)
            .ok_or_else(|| {
                let s = &lines.seen;
                let states: HashMap<String, usize> = s
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != v)
                    .fold(HashMap::new(), |mut m, (_, x)| {
                        let k = match x.members.get(&victim) {
                            Some(m) if m.1 == old_inc => format!("{} (old incarnation)", m.0),
                            Some(m) => m.0.to_string(),
                            None => "unknown".into(),
                        };
                        *m.entry(k).or_default() += 1;
                        m
                    });
                format!(
                    "{victim} did not rejoin within {limit:?}: it sees {} of {} members live; the survivors see it as {states:?}",
                    s[v].live(),
                    n - 1
                )
            })?;
        // A node whose printer fell behind lost member lines: its figures would be wrong.
        if let Some((i, count)) = lines.dropped {
            return Err(format!(
                "{} dropped {count} events for its printer (the host never went idle long enough): its member lines are incomplete, so this run's figures are not given",
                names[i]
            ));
        }
        Ok(RunFigures {
            converge_s,
            spawned_s,
            converge_p50_s,
            learnt_s,
            converge_p90_s,
            join_cpu_ms,
            join_cpu_total_s,
            join_alarms,
            join_packets,
            join_sent_kinds,
            slowest,
            down_all_s: (all_down - tk).as_secs_f64(),
            down_median_s: median(&mut each),
            rejoin_s: (rejoined - tr).as_secs_f64(),
            member_bps_median: median(&mut member_bps.clone()),
            member_bps_max: member_bps.iter().cloned().fold(0.0, f64::max),
            all_bps_median: median(&mut all_bps),
            threads,
            rss_mib,
            cpu_percent,
        })
    })();
    for p in &mut procs {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// Run the scenario for each node count, `runs` times each.
pub fn run(
    counts: &[usize],
    runs: usize,
    rest: Duration,
    idle_close_ms: u64,
    quiet: bool,
) -> Result<Vec<BenchResult>, String> {
    let opts = NodeOpts { idle_close_ms };
    let progress = Progress::new((counts.len() * runs) as u64, "membership", quiet);
    let mut all: Vec<(usize, Vec<RunFigures>)> = Vec::new();
    for &n in counts {
        if n < 3 {
            return Err("membership needs at least 3 nodes".into());
        }
        let mut figs = Vec::new();
        for r in 0..runs {
            progress.running(format!("membership: {n} nodes, run {}", r + 1));
            let f = one_run(n, rest, opts)?;
            progress.done(format!(
                "  {n} nodes: converged {:.2} s (all started by {:.2} s; median node {:.2} s, 90th percentile {:.2} s, last {}; pairs learnt: half by {:.2} s, 90% {:.2}, 99% {:.2}, 99.9% {:.2}; CPU to rest {:.0} ms per node, largest {:.0}, {:.1} s in all; {:.0} membership packets in and {:.0} out per node to rest ({:.0} probes, {:.0} gossip, {:.0} state); false alarms: {} suspected, {} down), down seen by all {:.2} s, rejoined {:.2} s, {:.0} B/s membership per node at rest",
                f.converge_s,
                f.spawned_s,
                f.converge_p50_s,
                f.converge_p90_s,
                f.slowest,
                f.learnt_s[0],
                f.learnt_s[1],
                f.learnt_s[2],
                f.learnt_s[3],
                f.join_cpu_ms.0,
                f.join_cpu_ms.1,
                f.join_cpu_total_s,
                f.join_packets.0,
                f.join_packets.1,
                f.join_sent_kinds[0],
                f.join_sent_kinds[1],
                f.join_sent_kinds[2],
                f.join_alarms.0,
                f.join_alarms.1,
                f.down_all_s,
                f.rejoin_s,
                f.member_bps_median
            ));
            figs.push(f);
        }
        all.push((n, figs));
    }
    let d = MembershipConfig::default();
    outln!(
        "\nmembership: N nodes, each its own `batchwire node` process on loopback, joining through one seed (defaults: probe every {:?}, probe RTT {:?}, suspicion timeout {:?}, gossip every {:?}); {}; medians of {runs} run(s) (min-max); per node at rest: the median node (and the largest, the seed's as a rule)",
        d.probe_period,
        d.probe_rtt,
        d.suspicion_timeout,
        d.gossip_period,
        if idle_close_ms == 0 {
            "the full mesh (--idle-close-ms 0: every member dialled and kept)".to_string()
        } else {
            format!("connections on demand, closed after {idle_close_ms} ms idle")
        }
    );
    let mut t = Table::new([
        "nodes",
        "converge s",
        "killed node down at all s",
        "(median survivor)",
        "rejoin s",
        "membership B/s per node at rest (median, max)",
        "all bytes sent B/s per node at rest",
        "threads per node (max)",
        "MiB per node (max)",
        "idle CPU % per node (max)",
    ]);
    let mut results = Vec::new();
    for (n, figs) in &all {
        let col = |f: fn(&RunFigures) -> f64| figs.iter().map(f).collect::<Vec<f64>>();
        let cell = |v: &[f64], prec: usize| {
            let r = BenchResult::new("membership", "", None, 0, v.to_vec(), "");
            format!("{:.p$} ({:.p$}-{:.p$})", r.median, r.min, r.max, p = prec)
        };
        let (conv, down, downm, rej, mb, mbmax, allb) = (
            col(|f| f.converge_s),
            col(|f| f.down_all_s),
            col(|f| f.down_median_s),
            col(|f| f.rejoin_s),
            col(|f| f.member_bps_median),
            col(|f| f.member_bps_max),
            col(|f| f.all_bps_median),
        );
        let last = figs.last().cloned().unwrap_or_default();
        t.row(vec![
            n.to_string(),
            cell(&conv, 2),
            cell(&down, 2),
            cell(&downm, 2),
            cell(&rej, 2),
            format!(
                "{} (max {:.0})",
                cell(&mb, 0),
                mbmax.iter().cloned().fold(0.0, f64::max)
            ),
            cell(&allb, 0),
            format!("{:.0} ({:.0})", last.threads.0, last.threads.1),
            format!("{:.1} ({:.1})", last.rss_mib.0, last.rss_mib.1),
            format!("{:.2} ({:.2})", last.cpu_percent.0, last.cpu_percent.1),
        ]);
        for (what, v, unit) in [
            ("converge", conv, "s"),
            ("down-seen-by-all", down, "s"),
            ("rejoin", rej, "s"),
            ("member-bytes-per-sec-at-rest", mb, "B/s"),
            ("all-bytes-per-sec-at-rest", allb, "B/s"),
            ("threads-per-node", col(|f| f.threads.0), "threads"),
            ("threads-max", col(|f| f.threads.1), "threads"),
            ("rss-per-node", col(|f| f.rss_mib.0), "MiB"),
            ("rss-max", col(|f| f.rss_mib.1), "MiB"),
            ("idle-cpu-per-node", col(|f| f.cpu_percent.0), "%"),
        ] {
            results.push(BenchResult::new(
                "membership",
                &format!("{what}/{n}-nodes"),
                None,
                *n,
                v,
                unit,
            ));
        }
    }
    out!("{}", t.render());
    outln!(
        "targets: 32 nodes converge in under 3 s; a killed node is seen down by all within the suspicion timeout plus one probe period ({:?}); at rest under 1 KB/s of membership per node",
        d.suspicion_timeout + d.probe_period
    );
    Ok(results)
}
