//! `batchwire bench`: scenarios that start node processes of this same binary on loopback,
//! verify what arrived, and report medians of alternating runs beside an in-run baseline.

pub mod throughput;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The cluster secret bench processes share (a throwaway; passed in the environment).
pub const SECRET_ENV: &str = "BATCHWIRE_BENCH_SECRET";

/// One result: a scenario, a bundler and a size, over several runs. The JSON keys are
/// stable (see the README).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    pub scenario: String,
    pub bundler: String,
    /// The idle level the nodes ran with (`None` for `raw`, which has no transport threads).
    pub idle_cpu_level: Option<u8>,
    pub size: usize,
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
}

impl BenchResult {
    pub fn failed(&self) -> bool {
        self.lost + self.duplicated + self.reordered > 0
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

/// Write results as a JSON array.
pub fn write_json(path: &Path, results: &[BenchResult]) -> std::io::Result<()> {
    let s = serde_json::to_string_pretty(results).map_err(std::io::Error::other)?;
    std::fs::write(path, s + "\n")
}

/// Spawn this binary as a bench worker with `args`; stdout is piped for its result line.
pub fn spawn_worker(args: &[String]) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    Command::new(exe)
        .arg("bench-worker")
        .args(args)
        .env(SECRET_ENV, "batchwire-bench")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
}

/// Wait for a worker and return the payload of its line starting with `tag `.
pub fn worker_result(mut child: Child, tag: &str, timeout: Duration) -> Result<String, String> {
    let out = child.stdout.take().ok_or("worker has no stdout")?;
    let tag = format!("{tag} ");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut found = None;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix(&tag) {
                found = Some(rest.to_string());
            }
        }
        let _ = tx.send(found);
    });
    let res = match rx.recv_timeout(timeout) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err("worker exited without a result".to_string()),
        Err(_) => {
            let _ = child.kill();
            Err(format!("worker gave no result within {timeout:?}"))
        }
    };
    let status = child.wait();
    let _ = reader.join();
    match (res, status) {
        (Ok(s), _) => Ok(s),
        (Err(e), Ok(st)) if !st.success() => Err(format!("{e} (exit status {st})")),
        (Err(e), _) => Err(e),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_gives_median_min_max() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert_eq!(summarize(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn si_suffixes() {
        assert_eq!(si(1_234_567.0), "1.23 M");
        assert_eq!(si(999.0), "999.0 ");
    }
}
