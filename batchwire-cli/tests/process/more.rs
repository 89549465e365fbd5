//! Metrics, help, membership and soak at scale, pipes, host names, duplex.

use super::bench::*;
use super::*;

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

/// `bench scale` measures a node with N idle peers, over plain TCP and, with `--tls`, over
/// mutual TLS with certificates it makes for the hub and its leaves (the bench's own are
/// for n0..n15): every peer connects (else the hub fails the run) and the rows are there.
#[test]
fn bench_scale_runs_over_plain_tcp_and_tls() {
    for tls in [false, true] {
        let mut args = vec!["scale", "--peer-counts", "1,3", "--idle-secs", "1"];
        if tls {
            args.push("--tls");
        }
        let (v, stdout) = bench_within(
            "bench-scale",
            4,
            &args,
            &[],
            std::time::Duration::from_secs(60),
        );
        assert_eq!(stdout.contains("mutual TLS"), tls, "{stdout}");
        let rows = check_report(&v, "scale");
        for n in [1, 3] {
            for (what, unit) in [
                ("threads", "threads"),
                ("resident memory", "KiB"),
                ("idle CPU", "% of one core"),
            ] {
                let name = format!("{n} peers: {what}");
                let r = rows
                    .iter()
                    .find(|r| r["bundler"] == name.as_str())
                    .unwrap_or_else(|| panic!("no row {name:?}: {rows:?}"));
                assert_eq!(r["unit"], unit, "{r}");
                assert_eq!(r["nodes"], n + 1, "{r}");
                if what != "idle CPU" {
                    assert!(r["median"].as_f64().unwrap() > 0.0, "{r}");
                }
            }
        }
    }
}

/// Output that cannot be written for another reason (a full disk: `/dev/full`) ends the
/// process with a message and status 74, not a panic.
#[test]
fn output_that_cannot_be_written_ends_with_a_message() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(EXE)
        .args(["node", "--print-config"])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
