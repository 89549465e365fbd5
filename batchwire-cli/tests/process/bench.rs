//! `batchwire bench` at a tiny size: each scenario runs and reports what it says it does.

use super::*;

/// A base port with `n` consecutive free ports from it (node i listens on base + i),
/// taken for this test alone.
pub(crate) fn free_base(n: u16) -> u16 {
    free_run(n)
}

/// Run `batchwire bench ARGS --runs 1 --quiet --base-port P --json FILE` and return the
/// parsed JSON report and stdout; panics (with the output) if the command fails.
pub(crate) fn bench(tag: &str, ports: u16, args: &[&str]) -> (serde_json::Value, String) {
    bench_with_env(tag, ports, args, &[])
}

/// [`bench`] with extra environment variables (e.g. `BATCHWIRE_LOG=warn`, so that a failure
/// shows what the nodes saw).
pub(crate) fn bench_with_env(
    tag: &str,
    ports: u16,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (serde_json::Value, String) {
    bench_within(tag, ports, args, envs, Duration::from_secs(30))
}

/// [`bench_with_env`] for a run that may take up to `limit`.
pub(crate) fn bench_within(
    tag: &str,
    ports: u16,
    args: &[&str],
    envs: &[(&str, &str)],
    limit: Duration,
) -> (serde_json::Value, String) {
    let dir = temp_dir(tag);
    let json = dir.join("out.json");
    let started = std::time::Instant::now();
    let out = Command::new(EXE)
        .envs(envs.iter().copied())
        .arg("bench")
        .args(args)
        .args(["--runs", "1", "--quiet", "--base-port"])
        .arg(free_base(ports).to_string())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    assert!(
        started.elapsed() < limit,
        "bench {args:?} took {:?}",
        started.elapsed()
    );
    (v, stdout)
}

/// The report's envelope, and the keys every result has; returns the results.
pub(crate) fn check_report(v: &serde_json::Value, scenario: &str) -> Vec<serde_json::Value> {
    let m = &v["machine"];
    assert!(m["cores"].as_u64().unwrap() >= 1, "{v}");
    assert!(m["kernel"].is_string() && m["cpu"].is_string(), "{v}");
    assert!(!v["commit"].as_str().unwrap().is_empty(), "{v}");
    let rows = v["results"].as_array().unwrap().clone();
    assert!(!rows.is_empty());
    for r in &rows {
        for key in [
            "scenario",
            "bundler",
            "idle_cpu_level",
            "size",
            "messages",
            "runs",
            "median",
            "min",
            "max",
            "unit",
            "lost",
            "duplicated",
            "reordered",
            "nodes",
            "threads",
            "p50_us",
            "p90_us",
            "p99_us",
            "p999_us",
        ] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        // rpc's async rows are "rpc-async".
        assert!(r["scenario"].as_str().unwrap().starts_with(scenario), "{r}");
        assert_eq!(
            (&r["lost"], &r["duplicated"], &r["reordered"]),
            (&0.into(), &0.into(), &0.into()),
            "{r}"
        );
        assert_eq!(r["runs"].as_array().unwrap().len(), 1, "{r}");
        // With connections on demand a membership cluster at rest sends nothing but
        // membership: its "all bytes" row may be 0, and so may its idle CPU (counted in
        // 10 ms ticks), and so may a node's idle CPU in `scale` with a few peers.
        let may_be_zero = r["bundler"].as_str().is_some_and(|b| {
            b.starts_with("all-bytes-per-sec-at-rest")
                || b.starts_with("idle-cpu-per-node")
                || b.ends_with("peers: idle CPU")
        });
        assert!(may_be_zero || r["median"].as_f64().unwrap() > 0.0, "{r}");
        if scenario != "rpc" {
            assert!(r["p50_us"].is_null(), "{r}");
        }
    }
    rows
}

#[test]
fn bench_throughput_runs_every_entry_at_a_tiny_size_and_writes_json() {
    let (v, stdout) = bench(
        "bench-throughput",
        2,
        &[
            "throughput",
            "--bundler",
            "all",
            "--size",
            "100,1000",
            "--messages",
            "3000",
        ],
    );
    assert!(
        stdout.contains("throughput: 100 B") && stdout.contains("natural"),
        "{stdout}"
    );
    let rows = check_report(&v, "throughput");
    // Every bundler, the raw ceiling and the plain-TCP one, at each size; check_report
    // wants every message of every row delivered (tcp's: all the bytes).
    assert_eq!(rows.len(), 2 * (batchwire::BundlerKind::ALL.len() + 2));
    for ceiling in ["raw", "tcp"] {
        assert!(
            rows.iter()
                .any(|r| r["bundler"] == ceiling && r["idle_cpu_level"].is_null()),
            "{ceiling}"
        );
    }
    assert!(stdout.contains("% tcp"), "{stdout}");
    assert!(
        rows.iter()
            .all(|r| r["nodes"] == 2 && r["unit"] == "msgs/s")
    );
}

#[test]
fn bench_fan_in_runs_every_bundler_with_a_few_threads() {
    let (v, stdout) = bench(
        "bench-fanin",
        2,
        &["fan-in", "--messages", "2000", "--threads", "8"],
    );
    assert!(stdout.contains("from 8 threads"), "{stdout}");
    assert!(
        stdout.contains("natural: ") && stdout.contains("% of raw"),
        "{stdout}"
    );
    let rows = check_report(&v, "fan-in");
    // Every bundler, and the raw ceiling (`all` includes it), nothing lost.
    assert_eq!(rows.len(), batchwire::BundlerKind::ALL.len() + 1);
    assert!(
        rows.iter()
            .any(|r| r["bundler"] == "raw" && r["idle_cpu_level"].is_null())
    );
    for r in &rows {
        assert_eq!(
            (&r["threads"], &r["messages"], &r["size"]),
            (&8.into(), &2000.into(), &100.into())
        );
    }
}

#[test]
fn bench_fan_in_pins_its_processes_when_asked() {
    if !can_run::can_run("the --pin test", can_run::cpus_missing(2)) {
        return;
    }
    let (v, stdout) = bench(
        "bench-fanin-pin",
        2,
        &[
            "fan-in",
            "--pin",
            "--bundler",
            "natural",
            "--messages",
            "2000",
            "--threads",
            "8",
        ],
    );
    assert!(
        stdout.contains("n0's process on CPU 0, n1's on CPU 1"),
        "{stdout}"
    );
    let rows = check_report(&v, "fan-in");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["pinned"], "n0's process on CPU 0, n1's on CPU 1");
}

#[test]
fn bench_mperf_runs_three_nodes() {
    let (v, stdout) = bench(
        "bench-mperf",
        3,
        &["mperf", "--nodes", "3", "--messages", "500", "--size", "64"],
    );
    assert!(stdout.contains("mperf: 3 nodes"), "{stdout}");
    // Every bundler and the raw ceiling (whose 3 processes check what they got too:
    // check_report wants nothing lost, duplicated or reordered in any row).
    assert!(
        stdout.contains("natural: ") && stdout.contains("% of raw"),
        "{stdout}"
    );
    let rows = check_report(&v, "mperf");
    assert_eq!(rows.len(), batchwire::BundlerKind::ALL.len() + 1);
    assert!(
        rows.iter()
            .any(|r| r["bundler"] == "raw" && r["idle_cpu_level"].is_null())
    );
    assert!(
        rows.iter()
            .all(|r| r["nodes"] == 3 && r["unit"] == "msgs/s/node")
    );
}

#[test]
fn bench_rpc_reports_latency_beside_the_tcp_floor_and_plots_it() {
    let dir = temp_dir("bench-rpc-plot");
    let svg = dir.join("rpc.svg");
    let (v, stdout) = bench(
        "bench-rpc",
        3,
        &[
            "rpc",
            "--nodes",
            "3",
            "--threads",
            "2",
            "--messages",
            "200",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert!(stdout.contains("tcp ping-pong (floor)"), "{stdout}");
    assert!(stdout.contains("rpc, async"), "{stdout}");
    let rows = check_report(&v, "rpc");
    let n = batchwire::BundlerKind::ALL.len();
    assert_eq!(rows.len(), 3 * n + 1);
    // The async rows: 1000 calls (5 x 200), all in flight at once.
    assert_eq!(
        rows.iter()
            .filter(|r| r["scenario"] == "rpc-async"
                && r["threads"] == 1000
                && r["messages"] == 1000)
            .count(),
        n
    );
    for r in &rows {
        for k in ["p50_us", "p90_us", "p99_us", "p999_us"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k} in {r}");
        }
        assert!(r["p50_us"].as_f64() <= r["p999_us"].as_f64(), "{r}");
    }
    assert_eq!(
        rows.iter()
            .filter(|r| r["nodes"] == 3 && r["threads"] == 2)
            .count(),
        n
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r["nodes"] == 2 && r["threads"] == 1)
            .count(),
        n + 1
    );
    assert!(
        rows.iter()
            .any(|r| r["bundler"] == "tcp-ping-pong" && r["idle_cpu_level"].is_null())
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("latency percentiles") && svg.contains("natural"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bench_roundtrip_reports_ms_per_batch_by_size() {
    let (v, stdout) = bench(
        "bench-roundtrip",
        2,
        &[
            "roundtrip",
            "--messages",
            "20",
            "--size",
            "100,1000",
            "--idle-cpu-level",
            "1,2",
        ],
    );
    assert!(stdout.contains("natural (idle 2)"), "{stdout}");
    let rows = check_report(&v, "roundtrip");
    assert_eq!(rows.len(), 2 * 2 * batchwire::BundlerKind::ALL.len());
    for r in &rows {
        assert_eq!(r["unit"], "ms/batch");
        // 100 batches of 100 B, 50 of 1000 B (the post's plan), 20 messages each.
        let want = if r["size"] == 100 { 2000 } else { 1000 };
        assert_eq!(r["messages"], want, "{r}");
    }
}

#[test]
fn bench_refuses_what_it_cannot_do_before_running() {
    let run = |args: &[&str]| {
        let out = Command::new(EXE).arg("bench").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&["rpc", "--plot", "/tmp/batchwire-never.png"]);
    assert!(e.contains("only .svg is supported"), "{e}");
    let dir = temp_dir("bench-refuse");
    let secret = dir.join("secret");
    std::fs::write(&secret, "s").unwrap();
    let e = run(&[
        "mperf",
        "--peers",
        "a=127.0.0.1:9",
        "--secret-file",
        secret.to_str().unwrap(),
    ]);
    assert!(e.contains("mperf cannot run against --peers"), "{e}");
    let e = run(&["rpc", "--peers", "a=127.0.0.1:9"]);
    assert!(e.contains("--secret-file"), "{e}");
    let e = run(&["fan-in", "--nodes", "3"]);
    assert!(e.contains("--nodes 3 applies to mperf and rpc"), "{e}");
    let e = run(&["throughput", "--link", "rtt=10ms"]);
    assert!(e.contains("add --hosts netns"), "{e}");
    let e = run(&[
        "throughput",
        "--hosts",
        "netns",
        "--link",
        "rtt=10ms,rate=5",
    ]);
    assert!(e.contains("needs a unit"), "{e}");
    let e = run(&["hol", "--hosts", "netns"]);
    assert!(e.contains("hol runs on loopback only"), "{e}");
    let e = run(&["throughput", "--batches", "3"]);
    assert!(e.contains("apply to the roundtrip scenario"), "{e}");
    let e = run(&["mperf", "--pin"]);
    assert!(e.contains("--pin applies to the fan-in scenario"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The tests that make network namespaces run one at a time: each checks that its bench
/// left none behind, and must not see the other's (seen in CI: the WAN test found the
/// Ctrl-C test's four namespaces, which that test was still waiting to see removed).
pub(crate) static NETNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The bench's namespaces now present (`bw<pid>-...`).
pub(crate) fn bench_namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("bw") && n.contains('-'))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bench_runs_over_an_emulated_wan_link_and_chaos_on_a_lossy_one_loses_nothing() {
    if !can_run::can_run("the WAN bench test", can_run::netns_missing()) {
        return;
    }
    let _alone = NETNS.lock().unwrap_or_else(|p| p.into_inner());
    // Namespaces of another bench already running on this machine are not ours to count.
    let before = bench_namespaces();
    // Roundtrip, the seed's experiment, cut to a few batches over a short link.
    let (v, out) = bench(
        "wan-roundtrip",
        2,
        &[
            "roundtrip",
            "--hosts",
            "netns",
            "--link",
            "rtt=10ms,rate=100mbit",
            "--bundler",
            "natural",
            "--size",
            "100,1000",
            "--batches",
            "2",
            "--warmup-batches",
            "1",
        ],
    );
    let rows = check_report(&v, "roundtrip");
    assert_eq!(rows.len(), 2, "{v}");
    for r in &rows {
        assert_eq!(r["link"], "rtt=10ms,rate=100mbit,queue=125000", "{r}");
        // A batch is at least one round trip.
        assert!(r["median"].as_f64().unwrap() >= 10.0, "{r}");
    }
    assert!(out.contains("link rtt=10ms,rate=100mbit"), "{out}");
    // Chaos on a lossy, rate-limited link: connections closed every 500 ms, 1% of packets
    // lost. (Before resends started at the frames the peer lacked, this stalled: each
    // connection carried one frame of new messages.)
    let (v, out) = bench_with_env(
        "wan-chaos",
        2,
        &[
            "throughput",
            "--hosts",
            "netns",
            "--link",
            "rtt=10ms,rate=50mbit,loss=1%",
            "--bundler",
            "natural",
            "--size",
            "1000",
            "--messages",
            "20000",
            "--break-every",
            "500",
            "--verify",
        ],
        &[("BATCHWIRE_LOG", "warn")],
    );
    let rows = check_report(&v, "throughput");
    assert_eq!(rows.len(), 1, "{v}");
    assert!(out.contains("lost at random"), "{out}");
    assert!(
        !out.contains("lost at random 0,"),
        "no packet was lost: {out}"
    );
    let left: Vec<String> = bench_namespaces()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn ctrl_c_during_a_wan_run_removes_the_hosts() {
    if !can_run::can_run("the WAN Ctrl-C test", can_run::netns_missing()) {
        return;
    }
    let _alone = NETNS.lock().unwrap_or_else(|p| p.into_inner());
    let mut p = Proc(
        Command::new(EXE)
            .args([
                "bench",
                "roundtrip",
                "--hosts",
                "netns",
                "--link",
                "rtt=200ms,rate=10mbit",
                "--bundler",
                "natural",
                "--batches",
                "1000",
                "--runs",
                "1",
                "--quiet",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let prefix = format!("bw{}-", p.0.id());
    let mine = || -> Vec<String> {
        bench_namespaces()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while mine().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no hosts made");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the workers start on them, then interrupt as a terminal would.
    std::thread::sleep(Duration::from_secs(2));
    let status = sigterm_and_wait_for(&mut p, "-INT", Duration::from_secs(20));
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(mine().is_empty(), "left behind: {:?}", mine());
}

#[test]
fn bench_rpc_and_roundtrip_run_against_running_nodes_with_peers() {
    let dir = temp_dir("bench-peers");
    let secret = dir.join("secret");
    std::fs::write(&secret, "peer-secret\n").unwrap();
    let addrs = free_addrs(2);
    let spawn = |name: &str, me: std::net::SocketAddr, other: (&str, std::net::SocketAddr)| {
        Proc(
            Command::new(EXE)
                .args(["node", "--name", name, "--listen", &me.to_string()])
                .args(["--peer", &format!("{}={}", other.0, other.1)])
                .args([
                    "--secret-file",
                    secret.to_str().unwrap(),
                    "--stats-every",
                    "0",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _a = spawn("a", addrs[0], ("b", addrs[1]));
    let _b = spawn("b", addrs[1], ("a", addrs[0]));
    let peers = format!("a={},b={}", addrs[0], addrs[1]);
    let common = [
        "--peers",
        peers.as_str(),
        "--secret-file",
        secret.to_str().unwrap(),
        "--bundler",
        "natural",
    ];
    let mut args = vec!["rpc", "--threads", "2", "--messages", "100"];
    args.extend(common);
    let (v, stdout) = bench("bench-peers-rpc", 1, &args);
    assert!(stdout.contains("echo mailbox"), "{stdout}");
    let rows = check_report(&v, "rpc");
    assert_eq!(rows.len(), 2, "no TCP floor with --peers");
    assert!(rows.iter().all(|r| r["nodes"] == 3));
    let mut args = vec!["roundtrip", "--messages", "10", "--size", "100"];
    args.extend(common);
    let (v, _) = bench("bench-peers-roundtrip", 1, &args);
    assert_eq!(check_report(&v, "roundtrip").len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}
