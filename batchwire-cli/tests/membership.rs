//! Membership with real `batchwire node` processes: joining through one seed, a SIGKILL
//! seen as down, a restart seen as a new incarnation, a SIGTERM seen as a leave; on
//! loopback, and across network namespaces (root only: the CI runs as root).

#[path = "shared/can_run.rs"]
mod can_run;
#[path = "../../batchwire/tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use batchwire::{Event, MemberState, Node, NodeConfig};
use common::*;

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");
const T: Duration = Duration::from_secs(30);

/// Kills the child process when dropped, so a failing test leaves nothing running.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(dir: &std::path::Path, name: &str, listen: SocketAddr, seed: SocketAddr) -> Proc {
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let child = Command::new(EXE)
        .args(["node", "--name", name, "--listen", &listen.to_string()])
        .args(["--join", &seed.to_string(), "--stats-every", "0"])
        .arg("--secret-file")
        .arg(&secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc(child)
}

fn member_event(rx: &std::sync::mpsc::Receiver<Event>, name: &str, what: &str) -> Event {
    let e = wait_event(rx, T, |e| match (e, what) {
        (Event::MemberJoined { member }, "joined")
        | (Event::MemberDown { member }, "down")
        | (Event::MemberLeft { member }, "left") => member.name == name,
        _ => false,
    });
    e.unwrap_or_else(|| panic!("no member {what} event for {name}"))
}

#[test]
fn node_processes_join_crash_restart_and_leave() {
    let dir = std::env::temp_dir().join(format!("batchwire-members-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let addrs = free_addrs(3);
    // The seed runs in this process, so the test reads its view and events directly.
    let seed = Node::start(NodeConfig::new("a", addrs[0], SECRET)).unwrap();
    let ev = seed.events();
    let b = spawn(&dir, "b", addrs[1], addrs[0]);
    let mut c = spawn(&dir, "c", addrs[2], addrs[0]);
    // Both joined, in either order (the view, not the events, which may come either way).
    let both = |v: &[batchwire::Member]| {
        ["b", "c"].iter().all(|n| {
            v.iter()
                .any(|m| m.name == *n && m.state == MemberState::Alive)
        })
    };
    assert!(seed.wait_for_members(T, both), "{:?}", seed.members());
    let c1 = seed.members().into_iter().find(|m| m.name == "c").unwrap();
    // SIGKILL: no goodbye, no leave. Seen down within the suspicion timeout (3 s) plus a
    // probe period (1 s), with slack for a loaded machine.
    let t0 = std::time::Instant::now();
    c.0.kill().unwrap();
    c.0.wait().unwrap();
    member_event(&ev, "c", "down");
    let took = t0.elapsed();
    eprintln!("SIGKILLed c seen down after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Restarted under the same name: a new incarnation joins.
    let _c = spawn(&dir, "c", addrs[2], addrs[0]);
    let Event::MemberJoined { member: c2 } = member_event(&ev, "c", "joined") else {
        unreachable!()
    };
    assert!(c2.incarnation > c1.incarnation, "{c1:?} then {c2:?}");
    assert!(seed.wait_for_members(T, |v| {
        v.iter().filter(|m| m.state == MemberState::Alive).count() == 2
    }));
    // SIGTERM: a clean shutdown announces the leave; nobody suspects it first.
    let st = Command::new("kill")
        .args(["-TERM", &b.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let seen = std::cell::RefCell::new(Vec::new());
    let left = wait_event(&ev, T, |e| {
        seen.borrow_mut().push(format!("{e:?}"));
        matches!(e, Event::MemberLeft { member } if member.name == "b")
    });
    let seen = seen.into_inner();
    assert!(left.is_some(), "no leave for b");
    assert!(
        !seen
            .iter()
            .any(|e| e.contains("MemberSuspected") && e.contains("\"b\"")),
        "{seen:?}"
    );
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cluster_across_network_namespaces_survives_kills_and_restarts() {
    if !can_run::can_run("the netns cluster test", can_run::netns_missing()) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/netns-cluster.sh");
    let mut child = Command::new("bash")
        .args([script, EXE, "5", "2"])
        .env("NETNS_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the script's own waits are 30 s each; kill it (its trap cleans up) past 3 min.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(2));
            let _ = child.kill();
            panic!("the netns script ran past 3 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stdout}");
    assert!(status.success(), "{stdout}\n{stderr}");
    for check in [
        "joined through n1 only",
        "SIGKILLed n4 n5",
        "sees the killed nodes down",
        "restarted nodes as new incarnations",
        "every node sees every other alive again",
    ] {
        assert!(stdout.contains(check), "missing {check:?}:\n{stdout}");
    }
    // Nothing left behind: the script names its namespaces TAGh1..TAGhN.
    let tag = stdout
        .split("(namespaces ")
        .nth(1)
        .and_then(|r| r.split("h1..").next())
        .expect("the script names its namespaces")
        .to_string();
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&ns.stdout);
    assert!(
        !left.lines().any(|l| l.starts_with(&tag)),
        "{tag} left: {left}"
    );
}

/// The host's monotonic clock in nanoseconds (what `--event-times` prints, on Linux).
#[cfg(target_os = "linux")]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec, which lives in this frame.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// `--event-times`: a member line ends with the moment the node saw the change, on the
/// host's monotonic clock: after the member started joining, before the line was read.
/// (That the time is the event's, not the printing's, is the unit test beside the printer.)
#[cfg(target_os = "linux")]
#[test]
fn event_times_put_each_member_line_on_the_hosts_clock() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("batchwire-evtimes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let addrs = free_addrs(2);
    let child = Command::new(EXE)
        .args(["node", "--name", "b", "--listen", &addrs[1].to_string()])
        .args(["--stats-every", "0", "--event-times"])
        .arg("--secret-file")
        .arg(&secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut b = Proc(child);
    let out = b.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((line, monotonic_ns())).is_err() {
                break;
            }
        }
    });
    // b is up once it answers a connect.
    let up = std::time::Instant::now();
    while std::net::TcpStream::connect(addrs[1]).is_err() {
        assert!(up.elapsed() < T, "b never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = monotonic_ns();
    let a = Node::start(NodeConfig::new("a", addrs[0], SECRET).join(addrs[1])).unwrap();
    let deadline = std::time::Instant::now() + T;
    let (line, read) = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (line, read) = rx.recv_timeout(left).expect("no member line for a");
        if line.starts_with("member joined a ") {
            break (line, read);
        }
    };
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(
        fields.len(),
        6,
        "member joined NAME ADDR INCARNATION TIME: {line}"
    );
    let t: u64 = fields[5].parse().unwrap();
    assert!(
        before <= t && t <= read,
        "{line}: the time {t} is not between a's start {before} and the read {read}"
    );
    a.shutdown();
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
