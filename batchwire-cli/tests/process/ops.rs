//! Running nodes: TLS, chaos, signals, logs, stats, config files.

use super::bench::*;
use super::*;

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
