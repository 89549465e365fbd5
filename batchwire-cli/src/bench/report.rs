//! What the scenarios report: the result record and its JSON, medians, latency
//! histograms, tables and progress bars.

use std::io::IsTerminal;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::workers::{Context, Faults};

/// A row's name: the bundler, with its idle level when several are compared.
pub fn row_label(bundler: &str, idle: Option<u8>, show_idle: bool) -> String {
    match idle {
        Some(l) if show_idle => format!("{bundler} (idle {l})"),
        _ => bundler.to_string(),
    }
}

/// Each bundler's median as a share of `raw`'s (the in-run ceiling), one line each, if raw
/// ran and did not fail.
pub fn shares_of_raw(rows: &[BenchResult], show_idle: bool) -> String {
    let Some(raw) = rows
        .iter()
        .find(|r| r.bundler == "raw" && !r.failed())
        .map(|r| r.median)
        .filter(|v| *v > 0.0)
    else {
        return String::new();
    };
    rows.iter()
        .filter(|r| r.bundler != "raw" && !r.failed())
        .map(|r| {
            format!(
                "{}: {:.0}% of raw\n",
                r.label(show_idle),
                100.0 * r.median / raw
            )
        })
        .collect()
}

/// The table of a rate scenario: one column per run, then median, min, max and the
/// median's megabytes per second under `mb_head`.
pub fn rate_table(rows: &[BenchResult], runs: usize, show_idle: bool, mb_head: &str) -> Table {
    let mut head = vec!["bundler".to_string()];
    head.extend((1..=runs).map(|i| format!("run {i}")));
    head.extend(["median", "min", "max", mb_head].map(String::from));
    let mut t = Table::new(head);
    for r in rows {
        if r.failed() {
            t.failed_row(vec![r.label(show_idle)], r.failure());
            continue;
        }
        let mut cells = vec![r.label(show_idle)];
        cells.extend(r.runs.iter().map(|v| si(*v)));
        cells.extend([si(r.median), si(r.min), si(r.max)]);
        cells.push(format!("{:.0}", r.median * r.size as f64 / 1e6));
        t.row(cells);
    }
    t
}

/// One result: a scenario, a bundler and a size, over several runs. The JSON keys are
/// stable (see docs/benchmark.md, "JSON").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    pub scenario: String,
    pub bundler: String,
    /// The idle level the nodes ran with (`None` for `raw` and the TCP floor, which have
    /// no transport threads).
    pub idle_cpu_level: Option<u8>,
    pub size: usize,
    /// Messages (or calls) per run, as the scenario counts them (see `unit`).
    pub messages: u64,
    /// The figure of each run, in `unit`.
    pub runs: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub unit: String,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Node processes in each run.
    pub nodes: usize,
    /// Sending (or calling) application threads per sending node.
    pub threads: usize,
    /// Call latency percentiles in microseconds (`rpc` only; the median over the runs).
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// The emulated link between the nodes (`--hosts netns --link ...`); `None` on
    /// loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Where the node processes ran when pinned to CPUs (`fan-in --pin`); `None` when the
    /// scheduler placed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// CPU time of both processes per message, in ns, the median over the runs
    /// (`throughput` one way: the sender's from its first send until the receiver had
    /// everything, the receiver's from its first delivery to its last); `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns_per_msg: Option<f64>,
    /// The soak's own figures (failures, kills, restarts, memory over time); `None`
    /// elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakFigures>,
    /// In the JSON only: the run failed its checks (lost, duplicated or reordered
    /// messages, or the soak's failures), so its figures measure nothing; readers
    /// (`scripts/ab.py`) refuse it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verification_failed: bool,
}

impl BenchResult {
    pub fn failed(&self) -> bool {
        self.lost + self.duplicated + self.reordered > 0
            || self
                .soak
                .as_ref()
                .is_some_and(|s| s.failed_between_others + s.downs_of_survivors > 0)
    }

    /// A result of `scenario` for `bundler` with its figures summarized; counts, faults
    /// and latency are filled in by the caller.
    pub fn new(
        scenario: &str,
        bundler: &str,
        idle_cpu_level: Option<u8>,
        size: usize,
        runs: Vec<f64>,
        unit: &str,
    ) -> BenchResult {
        let (median, min, max) = summarize(&runs);
        BenchResult {
            scenario: scenario.into(),
            bundler: bundler.into(),
            idle_cpu_level,
            size,
            messages: 0,
            runs,
            median,
            min,
            max,
            unit: unit.into(),
            lost: 0,
            duplicated: 0,
            reordered: 0,
            nodes: 2,
            threads: 1,
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            link: None,
            pinned: None,
            cpu_ns_per_msg: None,
            soak: None,
            verification_failed: false,
        }
    }

    pub fn with_faults(mut self, f: Faults) -> Self {
        self.lost = f.lost;
        self.duplicated = f.duplicated;
        self.reordered = f.reordered;
        self
    }

    /// The latency percentiles, `[p50, p90, p99, p99.9]` in µs.
    pub fn with_latency(mut self, p: Option<[f64; 4]>) -> Self {
        if let Some([a, b, c, d]) = p {
            (self.p50_us, self.p90_us, self.p99_us, self.p999_us) =
                (Some(a), Some(b), Some(c), Some(d));
        }
        self
    }

    /// The row name: the bundler, with its idle level when several are compared.
    pub fn label(&self, show_idle: bool) -> String {
        row_label(&self.bundler, self.idle_cpu_level, show_idle)
    }

    /// What went wrong, for a FAILED row.
    pub fn failure(&self) -> String {
        let soak = self.soak.as_ref().map_or(String::new(), |s| {
            format!(
                " failed between others {} downs of others {}",
                s.failed_between_others, s.downs_of_survivors
            )
        });
        format!(
            "FAILED: lost {} duplicated {} reordered {}{soak}",
            self.lost, self.duplicated, self.reordered
        )
    }
}

/// Median, min and max (the median of an even count is the mean of the middle two).
pub fn summarize(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

// Latency.

/// A latency histogram in nanoseconds, 1 ns .. 1 hour, 3 significant digits.
pub fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).ctx("creating a histogram")
}

/// A histogram as (value, count) pairs, to send from a worker to the parent.
pub fn hist_to_pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// Add (value, count) pairs from [`hist_to_pairs`] to `h`.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[(u64, u64)]) -> Result<(), String> {
    for (v, c) in pairs {
        h.record_n(*v, *c).ctx("merging a histogram")?;
    }
    Ok(())
}

/// p50, p90, p99 and p99.9 in microseconds (`None` if nothing was recorded).
pub fn percentiles_us(h: &Histogram<u64>) -> Option<[f64; 4]> {
    if h.is_empty() {
        return None;
    }
    let q = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Some([q(0.50), q(0.90), q(0.99), q(0.999)])
}

/// The median of each percentile over several runs.
pub fn median_percentiles(per_run: &[[f64; 4]]) -> Option<[f64; 4]> {
    if per_run.is_empty() {
        return None;
    }
    let mut out = [0.0; 4];
    for (k, o) in out.iter_mut().enumerate() {
        let col: Vec<f64> = per_run.iter().map(|p| p[k]).collect();
        *o = summarize(&col).0;
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------
// Output: tables, progress, JSON.

/// Format a rate with an SI suffix (1.23 M).
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.1} ")
    }
}

/// Format a latency in µs with sensible precision.
pub fn us(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A text table: the first column left-aligned, the others right-aligned. A failed row
/// prints its leading cells and then the failure instead of any figure.
#[derive(Debug, Default)]
pub struct Table {
    head: Vec<String>,
    rows: Vec<(Vec<String>, Option<String>)>,
}

impl Table {
    pub fn new<S: Into<String>>(head: impl IntoIterator<Item = S>) -> Table {
        Table {
            head: head.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push((cells, None));
    }

    /// A row whose figures must not be shown: `lead` cells, then `failure`.
    pub fn failed_row(&mut self, lead: Vec<String>, failure: String) {
        self.rows.push((lead, Some(failure)));
    }

    pub fn render(&self) -> String {
        let mut w: Vec<usize> = self.head.iter().map(|h| h.chars().count()).collect();
        for (cells, _) in &self.rows {
            for (i, c) in cells.iter().enumerate() {
                if i >= w.len() {
                    w.push(0);
                }
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i == 0 {
                    s += &format!("{c:<width$}", width = w[0]);
                } else {
                    s += &format!("  {c:>width$}", width = w[i]);
                }
            }
            s
        };
        let mut out = line(&self.head).trim_end().to_string() + "\n";
        for (cells, failure) in &self.rows {
            let mut l = line(cells);
            if let Some(f) = failure {
                l += "  ";
                l += f;
            }
            out += l.trim_end();
            out.push('\n');
        }
        out
    }
}

/// A progress bar on stderr for a scenario's runs, hidden with `--quiet` or when stderr
/// is not a terminal. Without a bar, finished runs are still listed on stderr (unless
/// `--quiet`), as one line each.
pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    what: String,
}

impl Progress {
    pub fn new(total: u64, what: &str, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix:>10} [{bar:20}] {pos}/{len} runs {elapsed} (eta {eta}) {wide_msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.set_prefix(what.to_string());
            b.enable_steady_tick(Duration::from_millis(250));
            b
        });
        Progress {
            bar,
            quiet,
            what: what.to_string(),
        }
    }

    /// Say what runs now.
    pub fn running(&self, msg: String) {
        if let Some(b) = &self.bar {
            // The bar's prefix names the scenario already.
            let mut words: Vec<&str> = msg.split_whitespace().collect();
            if words.first() == Some(&self.what.as_str()) {
                words.remove(0);
            }
            b.set_message(words.join(" "));
        }
    }

    /// A run finished; `line` says how it went.
    pub fn done(&self, line: String) {
        match &self.bar {
            Some(b) => {
                b.println(line);
                b.inc(1);
            }
            None if !self.quiet => eprintln!("{line}"),
            None => {}
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub cores: usize,
    pub kernel: String,
    pub cpu: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("{} {}", std::env::consts::OS, s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_string());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        Machine { cores, kernel, cpu }
    }
}

/// The commit being measured: `git rev-parse HEAD` in the source tree this binary was
/// built from if it is still there, else in the current directory; "unknown" without git.
pub fn current_commit() -> String {
    let git = |dir: Option<&str>| {
        let mut c = Command::new("git");
        if let Some(d) = dir {
            c.arg("-C").arg(d);
        }
        c.args(["rev-parse", "HEAD"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let src = env!("CARGO_MANIFEST_DIR");
    let from_src = Path::new(src).join(".git").exists().then(|| git(Some(src)));
    from_src
        .flatten()
        .or_else(|| git(None))
        .unwrap_or_else(|| "unknown".into())
}

/// What `--json` writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub machine: Machine,
    pub commit: String,
    /// Every node ran mutual TLS (`--tls`); `raw` and `tcp` stay plain TCP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    pub results: Vec<BenchResult>,
}

/// Write the results, with the machine and commit, as one JSON object.
pub fn write_json(path: &Path, results: &[BenchResult]) -> std::io::Result<()> {
    let r = Report {
        machine: Machine::detect(),
        commit: current_commit(),
        tls: super::tls_for_all().is_some(),
        results: results
            .iter()
            .map(|r| BenchResult {
                verification_failed: r.failed(),
                ..r.clone()
            })
            .collect(),
    };
    let s = serde_json::to_string_pretty(&r).map_err(std::io::Error::other)?;
    std::fs::write(path, s + "\n")
}

/// The soak's own figures, in its JSON row.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SoakFigures {
    pub duration_s: f64,
    pub sent: u64,
    pub delivered: u64,
    /// Failed (refused by `send` or handed back) towards the restarted node.
    pub failed_to_restarted: u64,
    /// Failed between nodes that were not restarted, or by the restarted node's later
    /// incarnations towards the others: must be 0.
    pub failed_between_others: u64,
    /// `MemberDown`/`PeerDown` events about nodes that were never restarted.
    pub downs_of_survivors: u64,
    pub kills: u64,
    pub restarts: u64,
    /// Per node: (name, threads at the end, max threads, RSS MiB at the end, max RSS MiB,
    /// RSS slope in MiB per hour over the run after its first sixth; `None` for the
    /// restarted node, whose processes live a minute each).
    pub nodes: Vec<NodeUsage>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct NodeUsage {
    pub name: String,
    pub threads_end: u64,
    pub threads_max: u64,
    pub rss_mib_end: f64,
    pub rss_mib_max: f64,
    pub rss_slope_mib_per_h: Option<f64>,
    /// The same over the second half of the run only: memory that grows while the run
    /// warms up (allocator and stack high-water marks) and then stays shows here as about
    /// 0; a leak shows in both.
    #[serde(default)]
    pub rss_slope_second_half_mib_per_h: Option<f64>,
}

#[cfg(test)]
mod tests;
