//! The echo service of `batchwire node`, against clients that misbehave.

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchwire::{Address, Node, NodeConfig};

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");
const SECRET: &[u8] = b"echo-test-secret";

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One client sends 200 messages of 8 KiB to `echo` from a mailbox it never reads (with
/// 64 KiB of credit: the echo's answers find no room after 8). Another client, on another
/// node, still gets each of its echoes within 3 s (before: the one echo thread blocked on
/// the first answer without room, and everyone waited).
#[test]
fn one_client_that_takes_no_answers_never_stops_the_echo_for_others() {
    let dir = std::env::temp_dir().join(format!("bw-echo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    let (a, b, c) = (free_addr(), free_addr(), free_addr());
    let _b = Kill(
        Command::new(EXE)
            .args([
                "node",
                "--name",
                "b",
                "--stats-every",
                "0",
                "--run-for",
                "60",
            ])
            .args(["--listen", &b.to_string()])
            .args(["--peer", &format!("a={a}"), "--peer", &format!("c={c}")])
            .arg("--secret-file")
            .arg(dir.join("secret"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deaf_node = Node::start(
        NodeConfig::new("a", a, SECRET)
            .peer("b", b)
            .mailbox_bytes(64 << 10),
    )
    .unwrap();
    let live_node = Node::start(NodeConfig::new("c", c, SECRET).peer("b", b)).unwrap();
    assert!(deaf_node.wait_for_peers(&["b"], Duration::from_secs(20)));
    assert!(live_node.wait_for_peers(&["b"], Duration::from_secs(20)));
    let echo = Address::new("b", "echo").unwrap();
    let deaf = deaf_node.mailbox("deaf").unwrap();
    for _ in 0..200 {
        deaf.send(&echo, vec![7u8; 8 << 10]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let live = live_node.mailbox("live").unwrap();
    for k in 0..3u8 {
        let t0 = Instant::now();
        live.send(&echo, vec![k]).unwrap();
        let e = live
            .recv_timeout(Duration::from_secs(3))
            .unwrap_or_else(|_| panic!("echo {k} not back in 3 s: the deaf client stopped it"));
        assert_eq!(&e.payload[..], [k]);
        assert!(t0.elapsed() < Duration::from_secs(3));
    }
    // The deaf client's answers were not lost: they wait for its credit, and come when it
    // reads.
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < 200 && Instant::now() < deadline {
        if deaf.recv_timeout(Duration::from_secs(1)).is_ok() {
            got += 1;
        }
    }
    assert_eq!(got, 200, "the deaf client's answers");
    let _ = std::fs::remove_dir_all(&dir);
}
