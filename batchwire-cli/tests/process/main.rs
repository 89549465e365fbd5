//! Real `batchwire` processes: standalone nodes, and the benchmark at a tiny size.

// The library's test helpers (free ports, small clusters, the test certificates).
#[path = "../shared/can_run.rs"]
mod can_run;
#[path = "../../../batchwire/tests/common/mod.rs"]
mod common;
#[path = "../shared/proc.rs"]
mod proc;

mod bench;
mod more;
mod ops;

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
