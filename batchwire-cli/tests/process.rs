//! Real `batchwire` processes: standalone nodes, and the benchmark at a tiny size.

// The library's test helpers (free ports, small clusters, the test certificates).
#[path = "shared/can_run.rs"]
mod can_run;
#[path = "../../batchwire/tests/common/mod.rs"]
mod common;
#[path = "shared/proc.rs"]
mod proc;

use std::process::{Command, Stdio};
use std::time::Duration;

use batchwire::{Address, Node, NodeConfig};
use common::*;
use proc::Proc;

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("batchwire-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `batchwire node` process named "b" on `b`, with peer "a" on `a` and the test secret
/// (in a folder of its own, `tag`), quiet stats, `extra` flags, `env` and its stderr.
fn node_b(
    tag: &str,
    a: std::net::SocketAddr,
    b: std::net::SocketAddr,
    extra: &[&str],
    env: &[(&str, &str)],
    stderr: Stdio,
) -> Proc {
    let dir = temp_dir(tag);
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let mut cmd = Command::new(EXE);
    cmd.args(["node", "--name", "b", "--listen", &b.to_string()])
        .args(["--peer", &format!("a={a}")])
        .args([
            "--secret-file",
            secret.to_str().unwrap(),
            "--stats-every",
            "0",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr);
    Proc(cmd.spawn().unwrap())
}

/// Send `n` numbered messages from a mailbox of `node` to b's echo and take every echo
/// back (each within 20 s).
fn echo_through_b(node: &Node, n: u64) {
    let me = node.mailbox("me").unwrap();
    for k in 0..n {
        me.send(
            &Address::new("b", "echo").unwrap(),
            k.to_le_bytes().to_vec(),
        )
        .unwrap();
    }
    for _ in 0..n {
        me.recv_timeout(Duration::from_secs(20)).expect("echo lost");
    }
}

/// Send SIGTERM to `p` and wait (bounded) for it to exit.
fn sigterm_and_wait(p: &mut Proc, within: Duration) -> std::process::ExitStatus {
    sigterm_and_wait_for(p, "-TERM", within)
}

/// Send `signal` (as `kill` names it, e.g. "-INT") to `p` and wait (bounded) for it to exit.
fn sigterm_and_wait_for(p: &mut Proc, signal: &str, within: Duration) -> std::process::ExitStatus {
    let st = Command::new("kill")
        .args([signal, &p.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after {signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn node_processes_echo_messages_back_in_order() {
    let dir = temp_dir("nodes");
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{}\n", String::from_utf8_lossy(SECRET))).unwrap();
    let addrs = free_addrs(3);
    let (a, b, c) = (addrs[0], addrs[1], addrs[2]);
    let spawn = |name: &str, listen: std::net::SocketAddr, peers: &[String]| {
        let mut cmd = Command::new(EXE);
        cmd.args(["node", "--name", name, "--listen", &listen.to_string()])
            .args([
                "--secret-file",
                secret.to_str().unwrap(),
                "--stats-every",
                "0",
            ]);
        for p in peers {
            cmd.args(["--peer", p]);
        }
        Proc(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _b = spawn("b", b, &[format!("a={a}"), format!("c={c}")]);
    let _c = spawn("c", c, &[format!("a={a}"), format!("b={b}")]);
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b).peer("c", c)).unwrap();
    assert!(
        node.wait_for_peers(&["b", "c"], Duration::from_secs(20)),
        "{:?}",
        node.connected_peers()
    );
    let me = node.mailbox("me").unwrap();
    const N: u64 = 2000;
    for i in 0..N {
        for peer in ["b", "c"] {
            me.send(
                &Address::new(peer, "echo").unwrap(),
                i.to_le_bytes().to_vec(),
            )
            .unwrap();
        }
    }
    let mut next =
        std::collections::HashMap::from([("b".to_string(), 0u64), ("c".to_string(), 0u64)]);
    for _ in 0..2 * N {
        let e = me.recv_timeout(Duration::from_secs(20)).expect("echo lost");
        let seq = u64::from_le_bytes(e.payload[..].try_into().unwrap());
        let n = next.get_mut(e.from.node()).unwrap();
        assert_eq!(seq, *n, "echo from {} out of order", e.from);
        *n += 1;
        assert_eq!(e.from.mailbox(), "echo");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A node given another node's certificate does not start (every peer would refuse it):
/// the error names the file, the node and the names the certificate has.
#[test]
fn a_node_refuses_to_start_with_a_certificate_for_another_node() {
    let dir = temp_dir("wrongcert");
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    // The library's committed test certificates.
    let certs =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../batchwire/tests/certs/main");
    let addr = free_addrs(1)[0];
    let out = Command::new(EXE)
        .args(["node", "--name", "c", "--listen", &addr.to_string()])
        .args(["--secret-file", dir.join("secret").to_str().unwrap()])
        .args(["--tls-cert", certs.join("a.pem").to_str().unwrap()])
        .args(["--tls-key", certs.join("a-key.pem").to_str().unwrap()])
        .args([
            "--tls-ca",
            certs.join("ca.pem").to_str().unwrap(),
            "--run-for",
            "3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a.pem: not the certificate of node \"c\"") && err.contains(r#"["a"]"#),
        "{err}"
    );
    // Its own certificate: starts (and stops after --run-for).
    let out = Command::new(EXE)
        .args(["node", "--name", "c", "--listen", &addr.to_string()])
        .args(["--secret-file", dir.join("secret").to_str().unwrap()])
        .args(["--tls-cert", certs.join("c.pem").to_str().unwrap()])
        .args(["--tls-key", certs.join("c-key.pem").to_str().unwrap()])
        .args([
            "--tls-ca",
            certs.join("ca.pem").to_str().unwrap(),
            "--run-for",
            "1",
        ])
        .args(["--stats-every", "0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn node_process_refuses_a_wrong_secret_file() {
    let dir = temp_dir("badsecret");
    let secret = dir.join("secret");
    std::fs::write(&secret, "other-secret").unwrap();
    let addrs = free_addrs(2);
    let _b = Proc(
        Command::new(EXE)
            .args(["node", "--name", "b", "--listen", &addrs[1].to_string()])
            .args([
                "--peer",
                &format!("a={}", addrs[0]),
                "--secret-file",
                secret.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let node = Node::start(NodeConfig::new("a", addrs[0], SECRET).peer("b", addrs[1])).unwrap();
    let events = node.events();
    let ev = wait_event(&events, Duration::from_secs(20), |e| {
        matches!(e, batchwire::Event::HandshakeFailed { .. })
    });
    let Some(batchwire::Event::HandshakeFailed { peer, reason, .. }) = ev else {
        panic!("no handshake failure: {ev:?}")
    };
    assert_eq!(peer.as_deref(), Some("b"));
    assert!(reason.contains("secret"), "{reason}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_secret_file_is_a_clear_error() {
    let out = Command::new(EXE)
        .args([
            "node",
            "--name",
            "a",
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            "/nonexistent/secret",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read secret file /nonexistent/secret"),
        "{err}"
    );
}

/// A base port with `n` consecutive free ports from it (node i listens on base + i),
/// taken for this test alone.
fn free_base(n: u16) -> u16 {
    free_run(n)
}

/// Run `batchwire bench ARGS --runs 1 --quiet --base-port P --json FILE` and return the
/// parsed JSON report and stdout; panics (with the output) if the command fails.
fn bench(tag: &str, ports: u16, args: &[&str]) -> (serde_json::Value, String) {
    bench_with_env(tag, ports, args, &[])
}

/// [`bench`] with extra environment variables (e.g. `BATCHWIRE_LOG=warn`, so that a failure
/// shows what the nodes saw).
fn bench_with_env(
    tag: &str,
    ports: u16,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (serde_json::Value, String) {
    bench_within(tag, ports, args, envs, Duration::from_secs(30))
}

/// [`bench_with_env`] for a run that may take up to `limit`.
fn bench_within(
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
fn check_report(v: &serde_json::Value, scenario: &str) -> Vec<serde_json::Value> {
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
        // 10 ms ticks).
        let may_be_zero = r["bundler"].as_str().is_some_and(|b| {
            b.starts_with("all-bytes-per-sec-at-rest") || b.starts_with("idle-cpu-per-node")
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
static NETNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The bench's namespaces now present (`bw<pid>-...`).
fn bench_namespaces() -> Vec<String> {
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

#[test]
fn a_killed_node_is_declared_down_in_time_and_every_pending_message_is_reported() {
    use batchwire::Event;
    let dir = temp_dir("sigkill");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let addrs = free_addrs(2);
    let mut b = Proc(
        Command::new(EXE)
            .args(["node", "--name", "b", "--listen", &addrs[1].to_string()])
            .args([
                "--peer",
                &format!("a={}", addrs[0]),
                "--secret-file",
                secret.to_str().unwrap(),
            ])
            .args(["--stats-every", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let timeout = Duration::from_millis(1000);
    let cfg = NodeConfig::new("a", addrs[0], SECRET)
        .peer("b", addrs[1])
        .peer_timeout(timeout)
        .heartbeat_interval(Duration::from_millis(100));
    let node = Node::start(cfg).unwrap();
    let events = node.events();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    let to = Address::new("b", "echo").unwrap();
    let (accepted, killed_at) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            // Stream until sends fail fast (b declared down), at most 2M messages / 30 s.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut accepted = 0u64;
            for i in 0..2_000_000u64 {
                match node.send(&to, [&i.to_le_bytes()[..], &[0u8; 92][..]].concat()) {
                    Ok(()) => accepted += 1,
                    Err(batchwire::Error::PeerDown(p)) => {
                        assert_eq!(p, "b");
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
                if std::time::Instant::now() > deadline {
                    break;
                }
            }
            accepted
        });
        std::thread::sleep(Duration::from_millis(200));
        let _ = b.0.kill(); // SIGKILL
        let killed_at = std::time::Instant::now();
        (sender.join().unwrap(), killed_at)
    });
    // Declared down within the timeout (plus slack for a loaded 2-core machine).
    let mut down_after = None;
    let mut failed = 0u64;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        match events.recv_timeout(Duration::from_millis(300)) {
            Ok(Event::PeerDown { peer, .. }) if peer == "b" => {
                down_after = Some(killed_at.elapsed())
            }
            Ok(Event::SendFailed {
                peer,
                count,
                messages,
                ..
            }) if peer == "b" => {
                assert_eq!(count as usize, messages.len());
                failed += count;
            }
            Ok(_) => {}
            Err(_) if down_after.is_some() => break,
            Err(_) => {}
        }
    }
    let down_after = down_after.expect("b was never declared down");
    assert!(
        down_after < timeout + Duration::from_millis(1500),
        "declared down after {down_after:?}"
    );
    let st = node.stats();
    let b_stats = st.peers.iter().find(|p| p.peer == "b").unwrap();
    assert!(
        failed > 0,
        "nothing was pending when b died? accepted {accepted}"
    );
    assert_eq!(
        b_stats.acked + failed,
        accepted,
        "every accepted message is either acknowledged or handed back: {b_stats:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tls_cluster_of_node_processes_from_the_certs_command() {
    let dir = temp_dir("tls-nodes");
    let certs = dir.join("certs");
    let out = Command::new(EXE)
        .args([
            "certs",
            "--out",
            certs.to_str().unwrap(),
            "--nodes",
            "a,b,c",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Private keys readable by their owner only; certificates by anyone.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| {
            std::fs::metadata(certs.join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        for n in ["ca", "a", "b", "c"] {
            assert_eq!(mode(&format!("{n}-key.pem")), 0o600, "{n}-key.pem");
            assert_eq!(mode(&format!("{n}.pem")), 0o644, "{n}.pem");
        }
    }
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let addrs = free_addrs(3);
    let spawn = |name: &str, i: usize| {
        let mut cmd = Command::new(EXE);
        cmd.args(["node", "--name", name, "--listen", &addrs[i].to_string()])
            .args([
                "--secret-file",
                secret.to_str().unwrap(),
                "--stats-every",
                "0",
            ])
            .args([
                "--tls-cert",
                certs.join(format!("{name}.pem")).to_str().unwrap(),
            ])
            .args([
                "--tls-key",
                certs.join(format!("{name}-key.pem")).to_str().unwrap(),
            ])
            .args(["--tls-ca", certs.join("ca.pem").to_str().unwrap()]);
        for (j, p) in ["a", "b", "c"].iter().enumerate() {
            if j != i {
                cmd.args(["--peer", &format!("{p}={}", addrs[j])]);
            }
        }
        Proc(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _b = spawn("b", 1);
    let _c = spawn("c", 2);
    let cfg = NodeConfig::new("a", addrs[0], SECRET)
        .peer("b", addrs[1])
        .peer("c", addrs[2])
        .tls(batchwire::TlsFiles::in_dir(&certs, "a"));
    let node = Node::start(cfg).unwrap();
    assert!(
        node.wait_for_peers(&["b", "c"], Duration::from_secs(20)),
        "{:?}",
        node.connected_peers()
    );
    let me = node.mailbox("me").unwrap();
    for i in 0..500u64 {
        for p in ["b", "c"] {
            me.send(&Address::new(p, "echo").unwrap(), i.to_le_bytes().to_vec())
                .unwrap();
        }
    }
    // Every echo comes back once, from the node it went to, with its payload, in order
    // per node; and no more.
    let mut next = std::collections::HashMap::new();
    for k in 0..1000 {
        let e = me
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("echo {k} of 1000 over TLS: {e}"));
        assert_eq!(e.from.mailbox(), "echo");
        let n = next.entry(e.from.node().to_string()).or_insert(0u64);
        assert_eq!(e.payload[..], n.to_le_bytes(), "from {}", e.from);
        *n += 1;
    }
    assert_eq!((next["b"], next["c"], next.len()), (500, 500, 2));
    assert!(
        me.recv_timeout(Duration::from_millis(200)).is_err(),
        "an echo too many"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bench_runs_every_scenario_over_tls_at_a_tiny_size() {
    // Up to 4 nodes (mperf, rpc), and the TCP floor's pair.
    let port = free_base(8);
    let out = Command::new(EXE)
        .args([
            "bench",
            "--tls",
            "--bundler",
            "natural,natural/tls",
            "--nodes",
            "3",
            "--threads",
            "2",
        ])
        .args([
            "--messages",
            "300",
            "--runs",
            "1",
            "--quiet",
            "--base-port",
            &port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = out.id();
    let out = out.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for s in [
        "throughput:",
        "fan-in:",
        "mperf:",
        "rpc:",
        "roundtrip:",
        "natural/tls",
    ] {
        assert!(stdout.contains(s), "{s} missing in\n{stdout}");
    }
    // The throwaway CA (its private key included) does not outlive the run.
    let certs = std::env::temp_dir().join(format!("batchwire-bench-tls-{pid}"));
    assert!(!certs.exists(), "{} left behind", certs.display());
}

/// Over TLS with every connection closed 15 ms into its life or sooner, every message
/// arrives once and in order. (A resend after a reconnect is the whole send window; it
/// used to be encrypted in one go before any of it was written, which took longer than a
/// connection lived: after the first break nothing more arrived, and the peer was declared
/// down a minute later.)
#[test]
fn chaos_over_tls_with_a_break_every_15_ms_delivers_everything() {
    let (v, out) = bench_with_env(
        "tls-chaos",
        2,
        &[
            "throughput",
            "--bundler",
            "natural/tls",
            "--size",
            "1000",
            "--messages",
            "30000",
            "--break-every",
            "15",
            "--verify",
        ],
        &[("BATCHWIRE_LOG", "error")],
    );
    let rows = check_report(&v, "throughput");
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["messages"], 30000, "{v}");
    assert!(
        out.contains("connection breaks") && !out.contains("connection breaks 0)"),
        "{out}"
    );
}

/// SIGTERM mid-stream: `batchwire node` answers what its echo mailbox holds, says goodbye
/// and exits 0 within its shutdown timeout. The echoes that come back are in order, none
/// twice, and cover at least every message it had acknowledged when the signal went.
#[test]
fn sigterm_drains_a_node_mid_stream_and_it_exits_cleanly() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let addrs = free_addrs(2);
    let (a, b) = (addrs[0], addrs[1]);
    let mut child = node_b("sigterm", a, b, &[], &[], Stdio::null());
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b)).unwrap();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    let me = node.mailbox("me").unwrap();
    let to = Address::new("b", "echo").unwrap();
    let stop = AtomicBool::new(false);
    let (mut next, mut acked_at_signal) = (0u64, 0u64);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) && k < 5_000_000 {
                if me.send(&to, k.to_le_bytes().to_vec()).is_err() {
                    break;
                }
                k += 1;
            }
        });
        let mut signalled = false;
        let t0 = Instant::now();
        loop {
            match me.recv_timeout(Duration::from_secs(3)) {
                Ok(e) => {
                    let k = u64::from_le_bytes(e.payload[..].try_into().unwrap());
                    assert_eq!(k, next, "an echo lost, duplicated or reordered");
                    next += 1;
                }
                Err(_) if signalled => break,
                Err(e) => panic!("echoes stopped before the signal: {e}"),
            }
            if !signalled && next == 50_000 {
                acked_at_signal = node.stats().peers[0].acked;
                let st = Command::new("kill")
                    .args(["-TERM", &child.0.id().to_string()])
                    .status()
                    .unwrap();
                assert!(st.success());
                signalled = true;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "bounded");
        }
        stop.store(true, Ordering::Relaxed);
    });
    // Exits 0 within its shutdown timeout (5 s) and a margin.
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");
    assert!(
        next >= acked_at_signal,
        "{next} echoes, but {acked_at_signal} messages were acknowledged at the signal"
    );
}

/// Log lines name their connection: the connection's span (node, peer, address,
/// incarnation) prefixes what is logged on it, and a healthy node is quiet at INFO (a few
/// lines for its lifecycle and its connection, none per message).
#[test]
fn log_lines_name_their_connection_and_a_healthy_node_is_quiet_at_info() {
    let log = temp_dir("spans-log").join("stderr");
    let addrs = free_addrs(2);
    let (a, b) = (addrs[0], addrs[1]);
    let stderr = Stdio::from(std::fs::File::create(&log).unwrap());
    let mut child = node_b("spans", a, b, &[], &[("BATCHWIRE_LOG", "info")], stderr);
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b)).unwrap();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    echo_through_b(&node, 20_000);
    sigterm_and_wait(&mut child, Duration::from_secs(15));
    let text = std::fs::read_to_string(&log).unwrap();
    let connected = text
        .lines()
        .find(|l| l.contains("connected"))
        .unwrap_or_else(|| panic!("no connected line in:\n{text}"));
    for part in ["conn{", "node=b", "peer=a", "incarnation="] {
        assert!(
            connected.contains(part),
            "{part:?} missing from {connected:?}"
        );
    }
    let lines = text.lines().count();
    assert!(
        lines <= 12,
        "{lines} lines at INFO for 20,000 messages:\n{text}"
    );
}

/// `--stats-json`: the counters a line at a time as JSON, with what went through.
#[test]
fn stats_can_be_printed_as_json_lines() {
    let addrs = free_addrs(2);
    let (a, b) = (addrs[0], addrs[1]);
    let dir = temp_dir("stats-json");
    let out_path = dir.join("stdout");
    let mut cmd = Command::new(EXE);
    cmd.args(["node", "--name", "b", "--listen", &b.to_string()])
        .args(["--peer", &format!("a={a}")])
        .args(["--secret-file", dir.join("secret").to_str().unwrap()])
        .args(["--stats-every", "1", "--stats-json"])
        .stdout(Stdio::from(std::fs::File::create(&out_path).unwrap()))
        .stderr(Stdio::null());
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    let mut child = Proc(cmd.spawn().unwrap());
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b)).unwrap();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    echo_through_b(&node, 100);
    std::thread::sleep(Duration::from_millis(1500));
    sigterm_and_wait(&mut child, Duration::from_secs(15));
    let text = std::fs::read_to_string(&out_path).unwrap();
    let stats: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(stats.len() >= 2, "{text}");
    let last = stats.last().unwrap();
    assert_eq!(last["node"], "b");
    let peer_a = last["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer"] == "a")
        .unwrap_or_else(|| panic!("{last}"));
    assert_eq!(peer_a["messages_received"], 100, "{last}");
    assert_eq!(peer_a["messages_sent"], 100, "{last}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--print-config` prints every setting; a node runs from a config file (flags still
/// win); a config file with an unknown key or a bad value is refused, naming it.
#[test]
fn node_runs_from_a_config_file_and_refuses_unknown_keys() {
    let out = Command::new(EXE)
        .args(["node", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let defaults = String::from_utf8(out.stdout).unwrap();
    for key in [
        "mailbox_bytes",
        "bulk_inflight_bytes",
        "peer_timeout_ms",
        "[tls]",
    ] {
        assert!(defaults.contains(key), "{key} missing from --print-config");
    }
    let dir = temp_dir("config");
    let secret = dir.join("secret");
    std::fs::write(&secret, String::from_utf8_lossy(SECRET).as_bytes()).unwrap();
    let addrs = free_addrs(2);
    let (a, b) = (addrs[0], addrs[1]);
    let conf = dir.join("node.toml");
    std::fs::write(
        &conf,
        format!(
            "name = \"b\"\nlisten = \"{b}\"\nsecret_file = {secret:?}\npeers = [\"a={a}\"]\n\
             bundler = \"linger\"\nmailbox_bytes = 1048576\nstats_every_secs = 0\n"
        ),
    )
    .unwrap();
    let _b = Proc(
        Command::new(EXE)
            .args([
                "node",
                "--config",
                conf.to_str().unwrap(),
                "--bundler",
                "natural",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b)).unwrap();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    let me = node.mailbox("me").unwrap();
    me.send(&Address::new("b", "echo").unwrap(), b"hi".to_vec())
        .unwrap();
    assert_eq!(
        &me.recv_timeout(Duration::from_secs(20)).unwrap().payload[..],
        b"hi"
    );
    for (text, key) in [
        ("name = \"b\"\nmailbox_byte = 5\n", "mailbox_byte"),
        ("name = \"b\"\nmax_payload = \"big\"\n", "max_payload"),
    ] {
        std::fs::write(&conf, text).unwrap();
        let out = Command::new(EXE)
            .args(["node", "--config", conf.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key) && err.contains("node.toml"), "{err}");
    }
}

/// `--metrics-listen`: a Prometheus scrape over real HTTP parses, and the counters move as
/// messages flow (labelled by node and peer).
#[test]
fn metrics_are_served_for_prometheus_and_counters_move() {
    use std::io::{BufRead, Read, Write};
    use std::time::Instant;
    let addrs = free_addrs(3);
    let (a, b, m) = (addrs[0], addrs[1], addrs[2]);
    let m_flag = m.to_string();
    let _b = node_b(
        "metrics",
        a,
        b,
        &["--metrics-listen", &m_flag],
        &[],
        Stdio::null(),
    );
    let scrape = || -> Option<prometheus_parse::Scrape> {
        let mut s = std::net::TcpStream::connect_timeout(&m, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {m}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let body = text.split_once("\r\n\r\n")?.1.to_string();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        prometheus_parse::Scrape::parse(body.as_bytes().lines()).ok()
    };
    let received = |sc: &prometheus_parse::Scrape| {
        sc.samples
            .iter()
            .find(|s| {
                s.metric == "batchwire_messages_received_total"
                    && s.labels.get("peer") == Some("a")
                    && s.labels.get("node") == Some("b")
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => panic!("not a counter: {:?}", s.value),
            })
    };
    let node = Node::start(NodeConfig::new("a", a, SECRET).peer("b", b)).unwrap();
    assert!(node.wait_for_peers(&["b"], Duration::from_secs(20)));
    let me = node.mailbox("me").unwrap();
    const N: u64 = 5000;
    for k in 0..N {
        me.send(
            &Address::new("b", "echo").unwrap(),
            k.to_le_bytes().to_vec(),
        )
        .unwrap();
    }
    for _ in 0..N {
        me.recv_timeout(Duration::from_secs(20)).expect("echo lost");
    }
    // Published once a second: wait (bounded) until a scrape shows every message.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(sc) = scrape()
            && received(&sc).is_some_and(|v| v >= N as f64)
        {
            let connected = sc.samples.iter().any(|s| {
                s.metric == "batchwire_peer_connected" && s.labels.get("peer") == Some("a")
            });
            assert!(connected, "no batchwire_peer_connected for a");
            let has = |name: &str, label: (&str, &str)| {
                sc.samples
                    .iter()
                    .any(|s| s.metric.starts_with(name) && s.labels.get(label.0) == Some(label.1))
            };
            assert!(has("batchwire_mailbox_depth", ("mailbox", "echo")));
            // A real histogram (buckets), described, beside build and membership gauges.
            let hist = sc
                .samples
                .iter()
                .find(|s| {
                    s.metric == "batchwire_messages_per_write" && s.labels.get("peer") == Some("a")
                })
                .expect("no per-write histogram");
            match &hist.value {
                prometheus_parse::Value::Histogram(buckets) => {
                    assert!(buckets.len() >= 17, "{buckets:?}")
                }
                v => panic!("batchwire_messages_per_write is not a histogram: {v:?}"),
            }
            for name in [
                "batchwire_messages_per_write",
                "batchwire_messages_sent_total",
                "batchwire_disconnects_total",
                "batchwire_members",
                "batchwire_build_info",
            ] {
                assert!(sc.docs.contains_key(name), "no # HELP for {name}");
            }
            assert!(has(
                "batchwire_build_info",
                ("version", env!("CARGO_PKG_VERSION"))
            ));
            let alive = sc.samples.iter().find(|s| {
                s.metric == "batchwire_members" && s.labels.get("state") == Some("alive")
            });
            assert!(
                alive.is_some_and(
                    |s| matches!(s.value, prometheus_parse::Value::Gauge(v) if v >= 1.0)
                ),
                "{alive:?}"
            );
            // The status beside the metrics.
            let mut s = std::net::TcpStream::connect_timeout(&m, Duration::from_secs(2)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(s, "GET /status HTTP/1.1\r\nHost: {m}\r\n\r\n").unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            assert!(text.contains("application/json"), "{text}");
            let body = text.split_once("\r\n\r\n").unwrap().1;
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["node"], "b");
            assert!(
                v["stats"]["peer"].is_null() && v["stats"]["peers"].is_array(),
                "{v}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the counters never showed {N} messages"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `bench SCENARIO --help` shows that scenario's text and its flags, not every flag.
#[test]
fn each_bench_scenario_has_its_own_help() {
    let help = |scenario: &str| {
        let o = Command::new(EXE)
            .args(["bench", scenario, "--help"])
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    let hol = help("hol");
    assert!(
        hol.contains("head-of-line") && hol.contains("--phase-ms"),
        "{hol}"
    );
    assert!(
        !hol.contains("--duplex") && !hol.contains("--peer-counts"),
        "{hol}"
    );
    let tp = help("throughput");
    assert!(
        tp.contains("--duplex") && tp.contains("--break-every"),
        "{tp}"
    );
    assert!(
        !tp.contains("--phase-ms") && !tp.contains("--restart-every"),
        "{tp}"
    );
    assert_ne!(help("soak"), help("mperf"));
}

/// 64 `batchwire node` processes (the thousand-nodes issue asks CI for at least 64): they
/// join through one seed, one is SIGKILLed and restarted. About 25 s and 8,500 threads.
#[test]
fn bench_membership_runs_sixty_four_node_processes() {
    let (v, stdout) = bench(
        "bench-membership",
        1,
        &["membership", "--nodes", "64", "--phase-ms", "1000"],
    );
    let rows = check_report(&v, "membership");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["bundler"].as_str().unwrap())
        .collect();
    for what in [
        "converge/64-nodes",
        "down-seen-by-all/64-nodes",
        "rejoin/64-nodes",
        "member-bytes-per-sec-at-rest/64-nodes",
    ] {
        assert!(names.contains(&what), "{what} missing: {names:?}");
    }
    assert!(stdout.contains("killed node down at all"), "{stdout}");
    // The figures themselves, against the protocol's rules (defaults: probe 1 s,
    // suspicion 3 s) and the thousand-nodes issue's targets: a killed node is declared
    // down no sooner than the suspicion timeout and seen down by all within 10 s (SWIM's
    // probes alone: no connection to it at rest); membership at rest sends under 1 KB/s
    // per node (here 100 B/s); the cluster converged within 15 s (here 0.7 s) and the
    // restarted node was seen again. (Their lost/duplicated/reordered say nothing: no
    // messages are counted in this scenario.)
    let value = |what: &str| {
        rows.iter()
            .find(|r| r["bundler"] == what)
            .and_then(|r| r["median"].as_f64())
            .unwrap_or_else(|| panic!("{what}: {rows:?}"))
    };
    let down = value("down-seen-by-all/64-nodes");
    assert!(
        (3.0..10.0).contains(&down),
        "down seen by all after {down} s"
    );
    let rest = value("member-bytes-per-sec-at-rest/64-nodes");
    assert!(rest > 0.0 && rest < 1024.0, "{rest} B/s at rest");
    for what in ["converge/64-nodes", "rejoin/64-nodes"] {
        let v = value(what);
        assert!(v > 0.0 && v < 15.0, "{what}: {v} s");
    }
    // Connections on demand (the bench's idle close is 2 s): at rest no member has a
    // connection, so no data bytes flow and each node runs its fixed threads (the issue's
    // target: at most 8 threads and 32 MiB per idle node; here 7 and about 8 MiB). In the
    // mesh each ran 131.
    assert_eq!(value("all-bytes-per-sec-at-rest/64-nodes"), 0.0);
    let threads = value("threads-max/64-nodes");
    assert!(
        threads <= 8.0,
        "{threads} threads on the busiest node at rest"
    );
    let rss = value("rss-per-node/64-nodes");
    assert!(rss < 32.0, "{rss} MiB per node at rest");
}

/// The soak's CI version (`bench soak`, 60 s on loopback): three nodes stream to each other
/// in every direction, membership on, every connection killed from outside each second and
/// n2 SIGKILLed and restarted every 20 s. Nothing is lost, duplicated or reordered; only
/// towards the restarted node may anything be reported failed; the nodes that were never
/// restarted are never declared down; every message accepted between live processes
/// arrives once the run settles.
#[test]
fn a_60_second_soak_under_kills_and_restarts_loses_nothing() {
    let (v, stdout) = bench_within(
        "soak",
        3,
        &[
            "soak",
            "--duration",
            "60s",
            "--restart-every",
            "20s",
            "--report-every",
            "20s",
        ],
        &[("BATCHWIRE_LOG", "error")],
        Duration::from_secs(150),
    );
    let rows = check_report(&v, "soak");
    assert_eq!(rows.len(), 1, "{v}");
    let (r, s) = (&rows[0], &rows[0]["soak"]);
    assert_eq!(r["nodes"], 3, "{v}");
    for k in ["lost", "duplicated", "reordered"] {
        assert_eq!(r[k], 0, "{k}: {stdout}");
    }
    for k in ["failed_between_others", "downs_of_survivors"] {
        assert_eq!(s[k], 0, "{k}: {stdout}");
    }
    // 2 restarts (at 20 and 40 s), a kill nearly every second, and a real stream: 6
    // directions at 2000 messages a second.
    assert_eq!(s["restarts"], 2, "{stdout}");
    assert!(s["kills"].as_u64().unwrap() >= 40, "{stdout}");
    assert!(s["delivered"].as_u64().unwrap() >= 500_000, "{stdout}");
    let nodes = s["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{v}");
    for n in nodes {
        assert!(n["threads_max"].as_u64().unwrap() > 0, "{n}");
        assert!(n["rss_mib_max"].as_f64().unwrap() > 0.0, "{n}");
    }
    assert!(stdout.contains("soak 20 s: sent"), "{stdout}");
}

/// `batchwire ... | head`: output into a pipe nobody reads any more ends the process with
/// the status of a SIGPIPE (141), quietly, not with a panic.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(EXE)
        .args(["node", "--print-config"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `--listen` takes a host name as `--peer` does.
#[test]
fn a_node_listens_on_a_host_name() {
    let dir = temp_dir("listen-name");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let port = free_addrs(1)[0].port();
    let out = Command::new(EXE)
        .args([
            "node",
            "--name",
            "a",
            "--listen",
            &format!("localhost:{port}"),
        ])
        .args(["--secret-file", secret.to_str().unwrap(), "--run-for", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("listening on 127.0.0.1:{port}"))
            || stdout.contains(&format!("listening on [::1]:{port}")),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `--duplex` with the default bundler list (which has `raw`, one-way) runs the bundlers;
/// a size past the default 64 MiB payload limit is taken (the bench's nodes allow it).
#[test]
fn bench_duplex_with_the_default_list_and_a_size_past_64_mib() {
    let (v, _) = bench(
        "bench-duplex-default",
        2,
        &[
            "throughput",
            "--duplex",
            "--messages",
            "500",
            "--size",
            "100",
        ],
    );
    let rows = check_report(&v, "throughput");
    assert!(rows.iter().all(|r| r["bundler"] != "raw"), "{rows:?}");
    assert!(rows.iter().any(|r| {
        r["bundler"]
            .as_str()
            .is_some_and(|b| b.starts_with("natural"))
    }));
    let big = (64 << 20) + 1;
    let (v, _) = bench(
        "bench-past-64-mib",
        2,
        &[
            "throughput",
            "--bundler",
            "natural",
            "--messages",
            "2",
            "--size",
            &big.to_string(),
            "--verify",
        ],
    );
    let rows = check_report(&v, "throughput");
    assert_eq!(rows[0]["size"], big, "{rows:?}");
}
