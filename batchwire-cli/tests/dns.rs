//! Discovery through DNS against a real DNS server: dnsmasq, started by the test in a
//! network namespace of its own whose resolv.conf points at it (`ip netns exec` puts
//! `/etc/netns/NS/resolv.conf` over `/etc/resolv.conf`), so `batchwire node --join
//! NAME:PORT` resolves through the system resolver exactly as in a Kubernetes pod.
//!
//! Needs root, network namespaces and dnsmasq (`.ci/run` installs it); skipped with a
//! SKIPPED line elsewhere, a failure under CI.

#[path = "shared/can_run.rs"]
mod can_run;
#[path = "shared/proc.rs"]
mod proc;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proc::Proc;

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");
const PORT: u16 = 7000;

/// The dnsmasq binary, if installed.
fn dnsmasq() -> Option<PathBuf> {
    ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A network namespace with only `lo` up, its resolv.conf pointing at 127.0.0.53, and a
/// scratch folder; all removed when dropped.
struct Netns {
    name: String,
    dir: PathBuf,
}

impl Netns {
    fn new() -> Netns {
        let name = format!("bwdns{}", std::process::id());
        let dir = std::env::temp_dir().join(&name);
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name, dir };
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        std::fs::create_dir_all(ns.etc()).unwrap();
        // Fast failures: one second a try, two tries.
        std::fs::write(
            ns.etc().join("resolv.conf"),
            "nameserver 127.0.0.53\noptions timeout:1 attempts:2\n",
        )
        .unwrap();
        std::fs::create_dir_all(&ns.dir).unwrap();
        std::fs::write(ns.dir.join("secret"), "dns-test-secret").unwrap();
        // Every node resolves the names again every 500 ms once joined.
        std::fs::write(ns.dir.join("node.toml"), "join_refresh_ms = 500\n").unwrap();
        ns
    }

    fn etc(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.name)
    }

    /// The names dnsmasq answers (a hosts file it reads again on SIGHUP).
    fn hosts(&self, lines: &[(&str, &str)]) {
        let text: String = lines.iter().map(|(ip, n)| format!("{ip} {n}\n")).collect();
        std::fs::write(self.dir.join("hosts"), text).unwrap();
    }

    /// A command inside the namespace.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(self.etc());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(program: &str, args: &[&str]) {
    let s = Command::new(program).args(args).status().unwrap();
    assert!(s.success(), "{program} {args:?}: {s}");
}

/// A node's view as its `member ...` lines tell it: name -> last state.
type View = Arc<Mutex<BTreeMap<String, String>>>;

/// `batchwire node NAME` on 127.0.0.IP:7000 in the namespace, joining through `seed`.
fn node(ns: &Netns, name: &str, ip: u8, seed: &str) -> (Proc, View, Arc<Mutex<String>>) {
    let mut child = ns
        .cmd(EXE)
        .args(["node", "--name", name, "--listen"])
        .arg(format!("127.0.0.{ip}:{PORT}"))
        .arg("--secret-file")
        .arg(ns.dir.join("secret"))
        .arg("--config")
        .arg(ns.dir.join("node.toml"))
        .args(["--stats-every", "0", "--run-for", "90", "--join", seed])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let view: View = Default::default();
    let log = Arc::new(Mutex::new(String::new()));
    let out = child.stdout.take().unwrap();
    let v = view.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let w: Vec<&str> = line.split_whitespace().collect();
            if let ["member", what, who, ..] = w[..] {
                v.lock().unwrap().insert(who.to_string(), what.to_string());
            }
        }
    });
    let err = child.stderr.take().unwrap();
    let l = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut g = l.lock().unwrap();
            if g.len() < 1 << 20 {
                g.push_str(&line);
                g.push('\n');
            }
        }
    });
    (Proc(child), view, log)
}

/// The live members a node sees.
fn live(v: &View) -> BTreeSet<String> {
    v.lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| matches!(s.as_str(), "joined" | "alive"))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Wait (at most `limit`) until each node in `who` sees exactly `expect` as its live
/// members (itself excluded); the views on failure.
fn wait_views(who: &[(&str, &View)], expect: &[&str], limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let mut wrong = Vec::new();
        for (name, v) in who {
            let want: BTreeSet<String> = expect
                .iter()
                .filter(|n| *n != name)
                .map(|n| n.to_string())
                .collect();
            let got = live(v);
            if got != want {
                wrong.push(format!("{name} sees {got:?}, not {want:?}"));
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(wrong.join("; "));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nodes_find_each_other_through_a_dns_name_re_resolved_until_groups_merge() {
    let missing = can_run::netns_missing().or_else(|| {
        dnsmasq()
            .is_none()
            .then(|| "needs dnsmasq (apt-get install dnsmasq-base)".to_string())
    });
    if !can_run::can_run("the DNS discovery test", missing) {
        return;
    }
    let ns = Netns::new();
    // At first `peers` lists a alone, `apart` lists d and e, `later` does not exist.
    ns.hosts(&[
        ("127.0.0.2", "peers.bw.test"),
        ("127.0.0.5", "apart.bw.test"),
        ("127.0.0.6", "apart.bw.test"),
    ]);
    let dns = ns
        .cmd(dnsmasq().unwrap().to_str().unwrap())
        .args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--local=/bw.test/",
            "--listen-address=127.0.0.53",
            "--bind-interfaces",
            "--port=53",
            "--pid-file=",
            "--user=root",
            "--log-facility=-",
        ])
        .arg(format!("--addn-hosts={}", ns.dir.join("hosts").display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let dns = Proc(dns);
    // Answering?
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns
            .cmd("getent")
            .args(["ahosts", "peers.bw.test"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("127.0.0.2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dnsmasq never answered: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // a finds only itself behind `peers` (alone); b finds a through it.
    let (_a, va, la) = node(&ns, "a", 2, "peers.bw.test:7000");
    std::thread::sleep(Duration::from_millis(300));
    let (_b, vb, _) = node(&ns, "b", 3, "peers.bw.test:7000");
    // c joins through a name that does not resolve yet.
    let (_c, vc, lc) = node(&ns, "c", 4, "later.bw.test:7000");
    // d and e form a group of their own behind `apart`.
    let (_d, vd, _) = node(&ns, "d", 5, "apart.bw.test:7000");
    let (_e, ve, _) = node(&ns, "e", 6, "apart.bw.test:7000");
    let t = Duration::from_secs(20);
    wait_views(&[("a", &va), ("b", &vb)], &["a", "b"], t).unwrap();
    wait_views(&[("d", &vd), ("e", &ve)], &["d", "e"], t).unwrap();
    // c is still alone, and says why.
    assert!(live(&vc).is_empty(), "c sees {:?}", live(&vc));
    let deadline = Instant::now() + t;
    while !lc.lock().unwrap().contains("cannot resolve the seed yet") {
        assert!(Instant::now() < deadline, "c: {}", lc.lock().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }

    // The names change: `later` now lists a, `apart` also lists b. dnsmasq reads its hosts
    // file again on SIGHUP; c (alone) joins a, and d or e (joined) dial b: the two groups
    // merge into one of five, with no node restarted.
    ns.hosts(&[
        ("127.0.0.2", "peers.bw.test"),
        ("127.0.0.5", "apart.bw.test"),
        ("127.0.0.6", "apart.bw.test"),
        ("127.0.0.3", "apart.bw.test"),
        ("127.0.0.2", "later.bw.test"),
    ]);
    run("kill", &["-HUP", &dns.0.id().to_string()]);
    let changed = Instant::now();
    let all = ["a", "b", "c", "d", "e"];
    let views = [("a", &va), ("b", &vb), ("c", &vc), ("d", &vd), ("e", &ve)];
    wait_views(&views, &all, Duration::from_secs(30)).unwrap_or_else(|e| {
        panic!("{e}\nc's log:\n{}", lc.lock().unwrap());
    });
    eprintln!(
        "one group of five {:?} after the names changed",
        changed.elapsed()
    );
    // What the resolver said is in the logs, and a logged each change once: it resolved
    // `peers` to itself, then only ever to the same address.
    let a_log = la.lock().unwrap().clone();
    assert_eq!(
        a_log.matches("seed resolved").count(),
        1,
        "a's log:\n{a_log}"
    );
    assert!(lc.lock().unwrap().contains("seed resolved"));
}
