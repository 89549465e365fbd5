//! `batchwire node` under the operating system's limits: an address-space limit
//! (`ulimit -v`, here through `prlimit`) and a flood of handshakes from a few addresses
//! must never abort it.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn connect_from(ip: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// 64 silent handshakes from 4 addresses (every place) under a 200 MiB address-space
/// limit: before, each thread's malloc arena reserved 64 MiB and its stack 2 MiB, an
/// allocation failed and the process aborted ("memory allocation of 41 bytes failed",
/// exit 134). Now it serves them, answers a client afterwards, and exits cleanly.
#[test]
fn a_handshake_flood_under_an_address_space_limit_does_not_abort_the_node() {
    let dir = std::env::temp_dir().join(format!("bw-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "limits-secret").unwrap();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut node = Command::new("prlimit")
        .arg(format!("--as={}", 200 << 20))
        .arg(EXE)
        .args([
            "node",
            "--name",
            "b",
            "--stats-every",
            "0",
            "--run-for",
            "6",
        ])
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--secret-file")
        .arg(&secret)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) runs the node");
    // Listening?
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut held = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"] {
        for _ in 0..16 {
            if let Ok(s) = connect_from(ip, addr) {
                held.push(s);
            }
        }
    }
    assert_eq!(held.len(), 64);
    std::thread::sleep(Duration::from_secs(1));
    // A client from another address still gets the node's HELLO.
    let mut c = TcpStream::connect(addr).expect("the node is still listening");
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut first = [0u8; 1];
    assert_eq!(c.read(&mut first).ok(), Some(1), "no HELLO after the flood");
    drop(held);
    let status = node.wait().unwrap();
    let mut err = String::new();
    node.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.success(),
        "the node ended with {status}: {}",
        err.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The operator typos of the security v2 issue, in a node file: each is refused at start
/// with the key, the value and the allowed range (before: a node that spun a CPU sending
/// 354,554 ACK frames in 3 s, or aborted on an allocation).
#[test]
fn out_of_range_settings_in_a_node_file_are_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("bw-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), "limits-secret").unwrap();
    for (line, want) in [
        (
            "heartbeat_interval_ms = 0",
            "heartbeat_interval_ms = 0 is out of range: allowed 1 ..= 60000",
        ),
        (
            "read_bytes = 1099511627776",
            "read_bytes = 1099511627776 is out of range",
        ),
        (
            "events_capacity = 1000000000000",
            "events_capacity = 1000000000000 is out of range",
        ),
    ] {
        let file = dir.join("node.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"a\"\nlisten = \"127.0.0.1:0\"\nsecret_file = \"{}\"\n{line}\n",
                dir.join("secret").display()
            ),
        )
        .unwrap();
        let out = Command::new(EXE)
            .args(["node", "--run-for", "5", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{line}: the node started");
        assert!(err.contains(want), "{line}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
