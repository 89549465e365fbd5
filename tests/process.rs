//! Real `batchwire` processes: standalone nodes, and the benchmark at a tiny size.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use batchwire::{Address, Node, NodeConfig};
use common::*;

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");

/// Kills the child process when dropped, so a failing test leaves nothing running.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("batchwire-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
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
fn bench_runs_every_entry_at_a_tiny_size_and_writes_json() {
    let dir = temp_dir("bench");
    let json = dir.join("out.json");
    let port = free_addrs(1)[0].port();
    let out = Command::new(EXE)
        .args([
            "bench",
            "throughput",
            "--bundler",
            "all",
            "--size",
            "100,1000",
        ])
        .args([
            "--messages",
            "3000",
            "--runs",
            "2",
            "--quiet",
            "--base-port",
            &port.to_string(),
        ])
        .args(["--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("throughput: 100 B") && stdout.contains("natural"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2 * (batchwire::BundlerKind::ALL.len() + 1));
    for r in rows {
        for key in [
            "scenario",
            "bundler",
            "size",
            "messages",
            "runs",
            "median",
            "unit",
            "lost",
            "duplicated",
            "reordered",
        ] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert_eq!(r["lost"], 0);
        assert_eq!(r["runs"].as_array().unwrap().len(), 2);
        assert!(r["median"].as_f64().unwrap() > 0.0);
    }
    let _ = std::fs::remove_dir_all(dir);
}
