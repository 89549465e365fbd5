//! The `soak` scenario: a cluster of node processes (3 by default) streaming to each other
//! in every direction for a given time, while connections are killed from outside (`ss
//! -K`, every second by default) and the last node is SIGKILLed and started again (every
//! minute by default; it takes the next bundler each time, the others keep theirs).
//!
//! Every node checks what arrives (see [`worker`]). Reported every `--report-every` and at
//! the end: messages sent, delivered, lost, duplicated, reordered, and reported failed,
//! split into failures towards the restarted node (its old incarnation may lose what it
//! held: allowed) and between the other nodes (must be 0); connection kills and restarts;
//! the threads and resident memory of every node over time, with the slope of the
//! survivors' memory per hour. At the end, after sending stops and the cluster settles,
//! every message a live sender had accepted for a live receiver must have arrived: what is
//! missing counts as lost.

pub mod worker;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use batchwire::BundlerKind;

use self::worker::Report;
use crate::bench::{BenchResult, Context, NodeUsage, SoakFigures, node_name, now_ns, spawn_worker};

/// What `bench soak` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub duration: Duration,
    pub nodes: usize,
    pub size: usize,
    /// Messages per second from each node to each other node.
    pub rate: u64,
    pub kill_every: Duration,
    pub restart_every: Duration,
    pub report_every: Duration,
    /// Bundlers: node i starts with `bundlers[i % len]`; the restarted node takes the next
    /// one at each restart.
    pub bundlers: Vec<BundlerKind>,
    pub base_port: u16,
    /// Network namespaces the nodes run in (`--hosts netns`), to kill connections in;
    /// empty on loopback.
    pub namespaces: Vec<String>,
    pub quiet: bool,
}

/// One node process (one incarnation).
struct Proc {
    child: Child,
    generation: usize,
}

/// Totals of one set of reports.
#[derive(Default, Debug, Clone, Copy)]
struct Totals {
    sent: u64,
    delivered: u64,
    lost: u64,
    duplicated: u64,
    reordered: u64,
    failed_to_restarted: u64,
    failed_between_others: u64,
    downs_of_survivors: u64,
}

struct Soak<'a> {
    o: &'a Options,
    procs: Vec<Proc>,
    /// Latest report of every incarnation: (node, generation) -> report.
    reports: HashMap<(usize, usize), Report>,
    lines: Receiver<(usize, usize, String)>,
    tx: Sender<(usize, usize, String)>,
    /// (seconds since start, node, threads, RSS KiB).
    samples: Vec<(f64, usize, u64, u64)>,
    kills: u64,
    restarts: u64,
    start: Instant,
    send_until_ns: u64,
}

impl Soak<'_> {
    fn restarted(&self) -> usize {
        self.o.nodes - 1
    }

    fn spawn(&mut self, i: usize, generation: usize) -> Result<Proc, String> {
        let b = self.o.bundlers[(i + generation) % self.o.bundlers.len()];
        let args: Vec<String> = [
            "soak",
            "--index",
            &i.to_string(),
            "--nodes",
            &self.o.nodes.to_string(),
            "--base-port",
            &self.o.base_port.to_string(),
            "--size",
            &self.o.size.to_string(),
            "--rate",
            &self.o.rate.to_string(),
            "--bundler",
            b.name(),
            "--send-until-ns",
            &self.send_until_ns.to_string(),
            "--report-ms",
            "500",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain((generation > 0).then(|| "--restarted".to_string()))
        .collect();
        let mut child = spawn_worker(&args).ctx(&format!("starting node {i}"))?;
        let out = child.stdout.take().expect("piped");
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((i, generation, line)).is_err() {
                    break;
                }
            }
        });
        Ok(Proc { child, generation })
    }

    fn take_lines(&mut self) {
        while let Ok((i, generation, line)) = self.lines.try_recv() {
            if let Some(j) = line.strip_prefix("RESULT ")
                && let Ok(r) = serde_json::from_str::<Report>(j)
            {
                self.reports.insert((i, generation), r);
            }
        }
    }

    /// Kill every connection between the nodes from outside, in each namespace.
    fn kill_connections(&mut self) {
        let (lo, hi) = (
            self.o.base_port,
            self.o.base_port as usize + self.o.nodes - 1,
        );
        let filter = format!(
            "( sport >= :{lo} and sport <= :{hi} ) or ( dport >= :{lo} and dport <= :{hi} )"
        );
        let run = |ns: Option<&str>| {
            let mut c = match ns {
                Some(ns) => {
                    let mut c = std::process::Command::new("ip");
                    c.args(["netns", "exec", ns, "ss"]);
                    c
                }
                None => std::process::Command::new("ss"),
            };
            c.args(["-K", "-t", &filter])
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .map(|o| {
                    // One header line, then a line per socket killed.
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .count()
                        .saturating_sub(1) as u64
                })
                .unwrap_or(0)
        };
        let n: u64 = if self.o.namespaces.is_empty() {
            run(None)
        } else {
            self.o.namespaces.iter().map(|ns| run(Some(ns))).sum()
        };
        if n > 0 {
            self.kills += 1;
        }
    }

    fn sample(&mut self) {
        let t = self.start.elapsed().as_secs_f64();
        for (i, p) in self.procs.iter().enumerate() {
            let status = std::fs::read_to_string(format!("/proc/{}/status", p.child.id()))
                .unwrap_or_default();
            let f = |k| crate::bench::scale::status_field(&status, k).unwrap_or(0);
            let (thr, rss) = (f("Threads:"), f("VmRSS:"));
            if rss > 0 {
                self.samples.push((t, i, thr, rss));
            }
        }
    }

    /// Sum the latest reports: every incarnation's last word.
    fn totals(&self) -> Totals {
        let r = self.restarted();
        let mut t = Totals::default();
        for ((i, generation), rep) in &self.reports {
            for (peer, to) in &rep.to {
                t.sent += to.sent;
                let peer_is_r = *peer == node_name(r);
                if peer_is_r && *i != r {
                    t.failed_to_restarted += to.failed;
                } else {
                    t.failed_between_others += to.failed;
                }
                if !peer_is_r {
                    t.downs_of_survivors += to.member_down + to.peer_down;
                }
            }
            for f in rep.from.values() {
                t.delivered += f.delivered;
                t.lost += f.lost;
                t.duplicated += f.duplicated;
                t.reordered += f.reordered;
            }
            let _ = generation;
        }
        t
    }

    /// What the live senders accepted for the live receivers and did not arrive.
    fn missing_at_end(&self) -> u64 {
        self.pairs().iter().map(|p| p.2.saturating_sub(p.3)).sum()
    }

    /// Every stream between the live processes: (sender, receiver, accepted, arrived in
    /// order).
    fn pairs(&self) -> Vec<(usize, usize, u64, u64)> {
        let current: Vec<(usize, &Report)> = self
            .procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| self.reports.get(&(i, p.generation)).map(|r| (i, r)))
            .collect();
        let mut v = Vec::new();
        for (s, rs) in &current {
            for (d, rd) in &current {
                if s == d {
                    continue;
                }
                let sent = rs.to.get(&node_name(*d)).map_or(0, |t| t.sent);
                let got = rd
                    .from
                    .get(&node_name(*s))
                    .filter(|f| f.pid == rs.pid)
                    .map_or(0, |f| f.next);
                v.push((*s, *d, sent, got));
            }
        }
        v
    }

    fn line(&self, t: &Totals, label: &str) -> String {
        let mut usage = String::new();
        for i in 0..self.o.nodes {
            if let Some(s) = self.samples.iter().rev().find(|s| s.1 == i) {
                usage.push_str(&format!(
                    " n{i} {} thr {:.1} MiB;",
                    s.2,
                    s.3 as f64 / 1024.0
                ));
            }
        }
        format!(
            "soak {label}: sent {} delivered {} lost {} duplicated {} reordered {} failed {} to the restarted node, {} between others; downs of others {}; kills {} restarts {};{}",
            t.sent,
            t.delivered,
            t.lost,
            t.duplicated,
            t.reordered,
            t.failed_to_restarted,
            t.failed_between_others,
            t.downs_of_survivors,
            self.kills,
            self.restarts,
            usage.trim_end_matches(';')
        )
    }

    fn usage(&self) -> Vec<NodeUsage> {
        let from = self.o.duration.as_secs_f64() / 6.0;
        let half = self.o.duration.as_secs_f64() / 2.0;
        (0..self.o.nodes)
            .map(|i| {
                let s: Vec<_> = self.samples.iter().filter(|s| s.1 == i).collect();
                let mib = |kib: u64| kib as f64 / 1024.0;
                let late: Vec<(f64, f64)> = s
                    .iter()
                    .filter(|s| s.0 >= from)
                    .map(|s| (s.0 / 3600.0, mib(s.3)))
                    .collect();
                NodeUsage {
                    name: node_name(i),
                    threads_end: s.last().map_or(0, |s| s.2),
                    threads_max: s.iter().map(|s| s.2).max().unwrap_or(0),
                    rss_mib_end: s.last().map_or(0.0, |s| mib(s.3)),
                    rss_mib_max: s.iter().map(|s| mib(s.3)).fold(0.0, f64::max),
                    rss_slope_mib_per_h: (i != self.restarted() || self.restarts == 0)
                        .then(|| slope(&late))
                        .flatten(),
                    rss_slope_second_half_mib_per_h: (i != self.restarted() || self.restarts == 0)
                        .then(|| {
                            let second: Vec<_> = late
                                .iter()
                                .copied()
                                .filter(|p| p.0 * 3600.0 >= half)
                                .collect();
                            slope(&second)
                        })
                        .flatten(),
                }
            })
            .collect()
    }
}

/// The least-squares slope of `points` (x, y), if there are at least 3.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Parse a duration: `90`, `90s`, `15m`, `1h`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 60s, 15m, 1h)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m or h)")),
    };
    if !(secs.is_finite() && secs > 0.0 && secs <= 7.0 * 86400.0) {
        return Err(format!("duration {s:?} must be above 0 and at most a week"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Run the soak.
pub fn run(o: &Options) -> Result<Vec<BenchResult>, String> {
    if o.nodes < 2 {
        return Err("soak needs at least 2 nodes".into());
    }
    if o.bundlers.is_empty() {
        return Err("soak needs at least one bundler".into());
    }
    if o.size < 16 {
        return Err("soak payloads carry 16 bytes of numbering: --size at least 16".into());
    }
    if o.rate == 0 {
        return Err("soak --rate must be above 0".into());
    }
    let (tx, lines) = channel();
    let start = Instant::now();
    let send_until_ns = (now_ns() + o.duration.as_nanos()) as u64;
    let mut s = Soak {
        o,
        procs: Vec::new(),
        reports: HashMap::new(),
        lines,
        tx,
        samples: Vec::new(),
        kills: 0,
        restarts: 0,
        start,
        send_until_ns,
    };
    let res = s.drive();
    for p in &mut s.procs {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    res
}

impl Soak<'_> {
    fn drive(&mut self) -> Result<Vec<BenchResult>, String> {
        let o = self.o;
        for i in 0..o.nodes {
            let p = self.spawn(i, 0)?;
            self.procs.push(p);
        }
        if !o.quiet {
            eprintln!(
                "soak: {} nodes for {:.0} s, {} B at {}/s per direction; connections killed every {} ms, n{} restarted every {:.0} s",
                o.nodes,
                o.duration.as_secs_f64(),
                o.size,
                o.rate,
                o.kill_every.as_millis(),
                self.restarted(),
                o.restart_every.as_secs_f64()
            );
        }
        let tick = Duration::from_millis(100);
        let (mut next_kill, mut next_restart, mut next_report, mut next_sample) = (
            self.start + o.kill_every,
            self.start + o.restart_every,
            self.start + o.report_every,
            self.start,
        );
        let end = self.start + o.duration;
        while Instant::now() < end {
            std::thread::sleep(tick);
            let now = Instant::now();
            self.take_lines();
            // A node that died by itself is a failure of the run.
            for (i, p) in self.procs.iter_mut().enumerate() {
                if let Ok(Some(st)) = p.child.try_wait() {
                    return Err(format!("node n{i} exited on its own: {st}"));
                }
            }
            if now >= next_sample {
                self.sample();
                next_sample = now + Duration::from_secs(1);
            }
            if now >= next_kill {
                self.kill_connections();
                next_kill = now + o.kill_every;
            }
            if now >= next_restart && now + Duration::from_secs(5) < end {
                let r = self.restarted();
                let generation = self.procs[r].generation + 1;
                let _ = self.procs[r].child.kill();
                let _ = self.procs[r].child.wait();
                self.take_lines();
                self.procs[r] = self.spawn(r, generation)?;
                self.restarts += 1;
                next_restart = now + o.restart_every;
            }
            if now >= next_report {
                let t = self.totals();
                let label = format!("{:.0} s", self.start.elapsed().as_secs_f64());
                outln!("{}", self.line(&t, &label));
                next_report = now + o.report_every;
            }
        }
        // Sending stops; the last messages settle (at most 60 s).
        let settle_by = Instant::now() + Duration::from_secs(60);
        std::thread::sleep(Duration::from_secs(2));
        loop {
            self.take_lines();
            self.sample();
            if self.missing_at_end() == 0 || Instant::now() >= settle_by {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // One more report from every node, so the totals are the settled ones.
        std::thread::sleep(Duration::from_millis(700));
        self.take_lines();
        let mut t = self.totals();
        let missing = self.missing_at_end();
        t.lost += missing;
        let elapsed = o.duration.as_secs_f64();
        outln!("{}", self.line(&t, "end"));
        let usage = self.usage();
        for u in &usage {
            outln!(
                "  {}: threads {} (max {}), RSS {:.1} MiB (max {:.1}), RSS slope {}{}",
                u.name,
                u.threads_end,
                u.threads_max,
                u.rss_mib_end,
                u.rss_mib_max,
                u.rss_slope_mib_per_h
                    .map_or("n/a (restarted)".to_string(), |v| format!("{v:+.2} MiB/h")),
                u.rss_slope_second_half_mib_per_h
                    .map_or(String::new(), |v| format!(", second half {v:+.2} MiB/h"))
            );
        }
        let vanished = t
            .sent
            .saturating_sub(t.delivered + t.failed_to_restarted + t.failed_between_others);
        if self.restarts > 0 {
            outln!(
                "  sent - delivered - failed = {vanished}: what the SIGKILLed processes held or had in flight when they died (nobody is left to tell)"
            );
        }
        if missing > 0 {
            outln!("  {missing} accepted messages never arrived after the run settled:");
            for (s, d, sent, got) in self.pairs() {
                outln!("    n{s} -> n{d}: accepted {sent}, arrived {got}");
            }
        }
        let bundler = if o.bundlers.len() == 1 {
            o.bundlers[0].name().to_string()
        } else {
            format!(
                "mixed:{}",
                o.bundlers
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join("+")
            )
        };
        let rate = t.delivered as f64 / elapsed;
        let mut r = BenchResult::new("soak", &bundler, None, o.size, vec![rate], "msg/s");
        r.messages = t.delivered;
        r.lost = t.lost;
        r.duplicated = t.duplicated;
        r.reordered = t.reordered;
        r.nodes = o.nodes;
        r.threads = 1;
        r.soak = Some(SoakFigures {
            duration_s: elapsed,
            sent: t.sent,
            delivered: t.delivered,
            failed_to_restarted: t.failed_to_restarted,
            failed_between_others: t.failed_between_others,
            downs_of_survivors: t.downs_of_survivors,
            kills: self.kills,
            restarts: self.restarts,
            nodes: usage,
        });
        Ok(vec![r])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_absurd_ones_are_refused() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1s", "1y", "", "s", "9999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slope_of_a_line_and_of_too_few_points() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 + 2.0 * i as f64)).collect();
        assert!((slope(&pts).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(slope(&pts[..2]), None);
    }
}
