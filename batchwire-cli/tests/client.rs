//! The command-line client (`send`, `request`, `listen`, `members`, `status`) against a
//! cluster of real `batchwire node` processes.

#[path = "../../batchwire/tests/common/mod.rs"]
mod common;
#[path = "shared/proc.rs"]
mod proc;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{SECRET, free_addrs};
use proc::Proc;

const EXE: &str = env!("CARGO_BIN_EXE_batchwire");

/// A folder with the cluster's secret, and a wrong one.
struct Dir(std::path::PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("bw-client-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("secret"), SECRET).unwrap();
        std::fs::write(d.join("wrong"), b"not the secret").unwrap();
        Dir(d)
    }
    fn file(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
    /// The end of node `name`'s log (see [`node`]).
    fn log(&self, name: &str) -> String {
        let all = std::fs::read_to_string(self.file(&format!("{name}.log"))).unwrap_or_default();
        let from = all.len().saturating_sub(4000);
        all.get(from..).unwrap_or(&all).to_string()
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `batchwire node NAME` on `listen`, joining `join` if given.
fn node(dir: &Dir, name: &str, listen: SocketAddr, join: Option<SocketAddr>) -> Proc {
    // Its log (warnings and errors) is kept beside the secret, for a failure to show.
    let log = std::fs::File::create(dir.file(&format!("{name}.log"))).unwrap();
    let mut cmd = Command::new(EXE);
    cmd.args(["node", "--name", name, "--listen", &listen.to_string()])
        .args(["--secret-file", &dir.file("secret"), "--stats-every", "0"])
        .env("BATCHWIRE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(j) = join {
        cmd.args(["--join", &j.to_string()]);
    }
    Proc(cmd.spawn().unwrap())
}

/// Run the client command `args` (with `stdin`), bounded in time; its output.
fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(EXE)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `args` and insist it succeeded; its stdout.
fn ok(args: &[&str]) -> String {
    let o = run(args, "");
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Two nodes, a and b (b joined through a); every client command against them.
#[test]
fn the_client_sends_requests_listens_and_shows_members_and_status() {
    let dir = Dir::new("all");
    let addrs = free_addrs(2);
    let (a, b) = (addrs[0], addrs[1]);
    let _a = node(&dir, "a", a, None);
    let _b = node(&dir, "b", b, Some(a));
    let secret = dir.file("secret");
    let join = a.to_string();
    let via = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend([
            "--join".into(),
            join.clone(),
            "--secret-file".into(),
            secret.clone(),
        ]);
        v
    };

    // members: wait (bounded) until the cluster has formed, as seen by a client.
    let deadline = Instant::now() + Duration::from_secs(20);
    let members = loop {
        let args = via(&["members", "--json"]);
        let o = run(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>(), "");
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
            let names: Vec<&str> = v
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["state"] == "alive")
                .map(|m| m["name"].as_str().unwrap())
                .collect();
            if names.contains(&"a") && names.contains(&"b") {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no view with a and b: {}\nnode a's log:\n{}\nnode b's log:\n{}",
            stderr(&o),
            dir.log("a"),
            dir.log("b")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let a_entry = members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "a")
        .unwrap();
    assert_eq!(a_entry["addr"], a.to_string());

    // request: the reply, as text and as JSON.
    let args = via(&["request", "echo@b", "hello"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert_eq!(out, "hello\n");
    let args = via(&["request", "echo@b", "hello", "--json"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["text"], "hello");
    assert_eq!(v["from"], "echo@b");
    assert_eq!(v["bytes"], 5);

    // listen + send + request to the listener: every message, in order, once.
    let args = via(&[
        "listen", "inbox", "--name", "!l", "--count", "4", "--json", "--reply", "pong",
    ]);
    let mut listener = Proc(
        Command::new(EXE)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = BufReader::new(listener.0.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("inbox@!l"), "{line}");
    let args = via(&["send", "inbox@!l", "one", "two"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert_eq!(out, "sent 2 message(s) to inbox@!l: 2 acknowledged\n");
    // One message per line of standard input.
    let args = via(&["send", "inbox@!l"]);
    let o = run(
        &args.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "three\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "sent 1 message(s) to inbox@!l: 1 acknowledged\n"
    );
    let args = via(&["request", "inbox@!l", "ping", "--json"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["text"], "pong");
    let deadline = Instant::now() + Duration::from_secs(20);
    while listener.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "listen --count 4 did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut heard = String::new();
    std::io::Read::read_to_string(&mut listener.0.stdout.take().unwrap(), &mut heard).unwrap();
    let lines: Vec<serde_json::Value> = heard
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let texts: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["one", "two", "three", "ping"], "{heard}");
    assert_eq!(
        lines
            .iter()
            .map(|l| l["request"] == true)
            .collect::<Vec<_>>(),
        [false, false, false, true]
    );
    assert!(lines.iter().all(|l| l["to"] == "inbox@!l"));
    assert!(listener.0.wait().unwrap().success());

    // status of one node: its version, its view, its peers.
    let args = via(&["status", "--node", "b", "--json"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v[0];
    assert_eq!(s["node"], "b");
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["listen"], b.to_string());
    assert!(
        s["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "a" && m["state"] == "alive"),
        "{s}"
    );
    let peer_a = s["stats"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer"] == "a")
        .unwrap_or_else(|| panic!("{s}"));
    assert_eq!(peer_a["connected"], true);
    // Every node, in text.
    let args = via(&["status"]);
    let out = ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert!(
        out.contains("node a (batchwire ") && out.contains("node b (batchwire "),
        "{out}"
    );

    // Through --peer instead of joining: the peer's own view.
    let peer = format!("b={b}");
    let out = ok(&[
        "members",
        "--peer",
        &peer,
        "--secret-file",
        &secret,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v.as_array().unwrap().iter().any(|m| m["name"] == "a"),
        "{v}"
    );
    let out = ok(&[
        "request",
        "echo@b",
        "hi",
        "--peer",
        &peer,
        "--secret-file",
        &secret,
    ]);
    assert_eq!(out, "hi\n");
}

/// What goes wrong is said, names what, and ends with status 1, soon.
#[test]
fn client_errors_name_the_cause() {
    let dir = Dir::new("errors");
    let addrs = free_addrs(2);
    let (a, nobody) = (addrs[0], addrs[1]);
    let _a = node(&dir, "a", a, None);
    let secret = dir.file("secret");
    let join = a.to_string();
    // Wait (bounded) until a answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !run(
        &[
            "request",
            "echo@a",
            "x",
            "--join",
            &join,
            "--secret-file",
            &secret,
        ],
        "",
    )
    .status
    .success()
    {
        assert!(Instant::now() < deadline, "a never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let fails = |args: &[&str], within: Duration, want: &str| {
        let t0 = Instant::now();
        let o = run(args, "");
        let took = t0.elapsed();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(took < within, "{args:?} took {took:?}");
    };
    // A wrong secret is refused at once, not after the connect timeout.
    let wrong = dir.file("wrong");
    fails(
        &[
            "request",
            "echo@a",
            "x",
            "--join",
            &join,
            "--secret-file",
            &wrong,
        ],
        Duration::from_secs(8),
        "cluster secret mismatch",
    );
    // Nobody there: the timeout, and what was tried.
    fails(
        &[
            "send",
            "echo@a",
            "x",
            "--join",
            &nobody.to_string(),
            "--secret-file",
            &secret,
            "--connect-timeout",
            "1s",
        ],
        Duration::from_secs(10),
        &format!("no member answered at {nobody}"),
    );
    // No such member, no such mailbox.
    fails(
        &[
            "request",
            "echo@zz",
            "x",
            "--join",
            &join,
            "--secret-file",
            &secret,
            "--connect-timeout",
            "1s",
        ],
        Duration::from_secs(10),
        "no live member named \"zz\"",
    );
    fails(
        &[
            "send",
            "nobox@a",
            "x",
            "--join",
            &join,
            "--secret-file",
            &secret,
            "--json",
        ],
        Duration::from_secs(10),
        "a has no mailbox \"nobox\"",
    );
    fails(
        &[
            "request",
            "echo",
            "x",
            "--join",
            &join,
            "--secret-file",
            &secret,
        ],
        Duration::from_secs(5),
        "is not MAILBOX@NODE",
    );
    fails(
        &["members", "--secret-file", &secret],
        Duration::from_secs(5),
        "--join HOST:PORT",
    );
    // With --peer the client dials, so its name must sort first.
    fails(
        &[
            "members",
            "--peer",
            &format!("a={a}"),
            "--name",
            "zed",
            "--secret-file",
            &secret,
        ],
        Duration::from_secs(5),
        "sorts before this client's name",
    );
}
