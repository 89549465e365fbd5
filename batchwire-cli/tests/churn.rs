//! Attack 3 of issue 9, against a `batchwire node` process: connection churn must leave
//! no trace in its threads, memory maps or resident memory. (The other attacks are in
//! batchwire/tests/attacks.rs.)

#[path = "../../batchwire/tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchwire::{Address, Node, NodeConfig};
use common::*;

const T: Duration = Duration::from_secs(10);

/// Kills the child process when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (threads, memory maps, resident KiB) of a process.
fn usage(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .count() as u64;
    (field("Threads:"), maps, field("VmRSS:"))
}

/// Wait (bounded) until the process runs `threads` threads or fewer; its usage then.
fn settle(pid: u32, threads: u64) -> (u64, u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let u = usage(pid);
        if u.0 <= threads || Instant::now() > deadline {
            return u;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` connections opened and closed by 4 client threads. Each waits for the node's first
/// bytes (its HELLO, or the close of a connection beyond the cap) before closing, so the
/// clients go at the pace the node accepts, rather than overflowing the listen backlog
/// (the kernel would then drop SYNs and the clients wait a second to retry). They close
/// with a reset (linger 0), as a scanner does, so that 20,000 client ports do not sit in
/// TIME-WAIT and keep later tests from finding free ports.
fn churn(addr: SocketAddr, n: usize) {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..n / 4 {
                    let Ok(c) =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    else {
                        continue;
                    };
                    let _ = c.set_linger(Some(Duration::ZERO));
                    if c.connect_timeout(&addr.into(), T).is_ok() {
                        let mut c: TcpStream = c.into();
                        let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                        let _ = c.read(&mut [0u8; 64]);
                    }
                }
            });
        }
    });
}

/// Attack 3: 20,000 connect-and-close against a `batchwire node` process. Its threads,
/// memory maps and resident memory come back to (a small margin over) their baseline, the
/// second 10,000 cost nothing the first did not, and a real peer still connects.
#[test]
fn twenty_thousand_connect_and_close_leave_no_trace() {
    let dir = std::env::temp_dir().join(format!("batchwire-churn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let addrs = free_addrs(2);
    let child = Command::new(env!("CARGO_BIN_EXE_batchwire"))
        .args(["node", "--name", "b", "--listen", &addrs[1].to_string()])
        .args(["--peer", &format!("a={}", addrs[0])])
        .args([
            "--secret-file",
            secret.to_str().unwrap(),
            "--stats-every",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _p = Proc(child);
    let a = Node::start(NodeConfig::new("a", addrs[0], SECRET).peer("b", addrs[1])).unwrap();
    assert!(a.wait_for_peers(&["b"], T));
    let me = a.mailbox("me").unwrap();
    let ping = |i: u64| {
        me.send(
            &Address::new("b", "echo").unwrap(),
            i.to_le_bytes().to_vec(),
        )
        .unwrap();
        let e = me.recv_timeout(T).expect("no echo");
        assert_eq!(e.payload[..], i.to_le_bytes());
    };
    ping(0);
    let threads = usage(pid).0;
    // A first small round, so that what any connection allocates once is in the baseline.
    churn(addrs[1], 200);
    let base = settle(pid, threads);
    churn(addrs[1], 10_000);
    let half = settle(pid, base.0);
    churn(addrs[1], 10_000);
    let end = settle(pid, base.0);
    eprintln!(
        "threads / maps / RSS KiB: baseline {base:?}, after 10,000 {half:?}, after 20,000 {end:?}"
    );
    // A leak would be one thread, two maps and its stack per connection: 20,000 of each.
    // What remains is the allocator's per-thread arenas (glibc keeps at most 8 per core):
    // measured here +14..+22 maps and +0.1..0.3 MiB, flat from 10,000 to 70,000.
    // Threads may end below the baseline: a writer or reader with nothing to do for
    // `thread_linger` (2 s) rests, and the churn takes longer than that.
    assert!(end.0 <= base.0, "threads: {base:?} -> {end:?}");
    assert!(end.1 <= base.1 + 48, "memory maps: {base:?} -> {end:?}");
    assert!(
        end.1 <= half.1 + 24,
        "the second 10,000 added maps: {half:?} -> {end:?}"
    );
    assert!(
        end.2 <= base.2 + 8 * 1024,
        "resident memory: {base:?} -> {end:?}"
    );
    assert!(
        end.2 <= half.2 + 2 * 1024,
        "the second 10,000 added memory: {half:?} -> {end:?}"
    );
    // The real peer still talks to it, and a new connection (a restart of a) gets in.
    ping(1);
    drop(me);
    a.shutdown();
    let a = Node::start(NodeConfig::new("a", addrs[0], SECRET).peer("b", addrs[1])).unwrap();
    assert!(
        a.wait_for_peers(&["b"], T),
        "a real peer cannot connect any more"
    );
    let _ = std::fs::remove_dir_all(dir);
}
