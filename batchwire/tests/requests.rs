//! Request/reply between real nodes on loopback: blocking and typed requests, timeouts and
//! late replies, a peer that goes down, a mailbox that does not exist, the bounded pending
//! table, and 100,000 request futures dropped mid-flight.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use batchwire::{Address, Error, Mailbox};
use common::{mesh, start};
use futures_util::FutureExt;

/// Serve `mb` until `stop`: answer each request with its payload reversed, after `delay`
/// if the payload starts with "slow".
fn serve(mb: Mailbox, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut served = 0;
        while !stop.load(Ordering::Relaxed) {
            let Ok(e) = mb.recv_timeout(Duration::from_millis(20)) else {
                continue;
            };
            if e.payload.starts_with(b"slow") {
                thread::sleep(Duration::from_millis(300));
            }
            let mut p = e.payload.to_vec();
            p.reverse();
            if e.reply(p).is_ok() {
                served += 1;
            }
        }
        served
    })
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Add {
    a: u32,
    b: u32,
}

#[test]
fn requests_get_their_own_replies_blocking_typed_and_to_this_node() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let stop = Arc::new(AtomicBool::new(false));
    let echo = serve(b.mailbox("echo").unwrap(), stop.clone());
    let to = Address::new("b", "echo").unwrap();
    let t = Duration::from_secs(10);
    for i in 0..100u32 {
        let q = format!("hello {i}");
        let r = a.request(&to, q.clone(), t).unwrap();
        assert_eq!(r.payload, q.chars().rev().collect::<String>().as_bytes());
        assert_eq!(r.from.to_string(), "echo@b");
        assert!(!r.is_request(), "a reply is not a request");
    }
    // Several callers at once, each gets its own answer.
    let a = Arc::new(nodes);
    let callers: Vec<_> = (0..4)
        .map(|c| {
            let (n, to) = (a.clone(), to.clone());
            thread::spawn(move || {
                for i in 0..200 {
                    let q = format!("{c}:{i}");
                    let r = n[0].request(&to, q.clone(), t).unwrap();
                    let want: String = q.chars().rev().collect();
                    assert_eq!(r.payload, want.as_bytes());
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    let (a, b) = (&a[0], &a[1]);

    // Typed, served on a's own node: the request never leaves it.
    let adder = a.mailbox("adder").unwrap();
    let server = thread::spawn(move || {
        let e = adder.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(e.is_request());
        assert_eq!(e.from.to_string(), "@a");
        let q: Add = e.value().unwrap();
        e.reply_value(&(q.a + q.b)).unwrap();
    });
    let sum: u32 = a
        .request_value(
            &Address::new("a", "adder").unwrap(),
            &Add { a: 2, b: 40 },
            t,
        )
        .unwrap();
    assert_eq!(sum, 42);
    server.join().unwrap();

    // A plain message cannot be replied to; reserved names cannot be used.
    let plain = b.mailbox("plain").unwrap();
    a.send(&Address::new("b", "plain").unwrap(), "x").unwrap();
    let e = plain.recv_timeout(t).unwrap();
    assert!(matches!(e.reply("no"), Err(Error::NotARequest)));
    assert!(matches!(
        Address::new("b", "\0"),
        Err(Error::InvalidName(..))
    ));
    assert!(matches!(b.mailbox("\0x"), Err(Error::InvalidName(..))));

    stop.store(true, Ordering::Relaxed);
    assert_eq!(echo.join().unwrap(), 100 + 4 * 200);
    let s = a.stats().requests;
    assert_eq!((s.sent, s.answered, s.pending), (901, 901, 0), "{s:?}");
    assert_eq!((s.late_replies, s.stray_replies), (0, 0));
}

#[test]
fn a_late_reply_is_counted_and_dropped_never_handed_to_the_next_caller() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let stop = Arc::new(AtomicBool::new(false));
    let echo = serve(b.mailbox("echo").unwrap(), stop.clone());
    let to = Address::new("b", "echo").unwrap();
    let t0 = Instant::now();
    let r = a.request(&to, "slow one", Duration::from_millis(100));
    let took = t0.elapsed();
    assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
    // Never before its deadline (the clock is monotonic); exactly at it is the fake-clock
    // test in io::calls, so here only a bound that catches a hang.
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(5),
        "timed out after {took:?}, asked for 100 ms"
    );
    // The service is still busy with the first; this one waits its turn and must get its
    // own answer, not the late one.
    let r = a.request(&to, "second", Duration::from_secs(10)).unwrap();
    assert_eq!(r.payload, &b"dnoces"[..]);
    let s = a.stats().requests;
    assert_eq!(
        (s.timed_out, s.late_replies, s.answered, s.pending),
        (1, 1, 1, 0),
        "{s:?}"
    );
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
}

#[test]
fn a_request_fails_at_once_when_its_node_goes_down_or_has_no_such_mailbox() {
    let mut nodes = start(mesh(&["a", "b"]));
    let b = nodes.pop().unwrap();
    let a = nodes.pop().unwrap();
    let t = Duration::from_secs(60);
    // No such mailbox: b says so, and the request fails without waiting for its timeout.
    let t0 = Instant::now();
    let r = a.request(&Address::new("b", "nobody").unwrap(), "?", t);
    assert!(
        matches!(&r, Err(Error::Undeliverable { to }) if to == "nobody@b"),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    let r = a.request(&Address::new("a", "nobody").unwrap(), "?", t);
    assert!(matches!(&r, Err(Error::Undeliverable { .. })), "{r:?}");

    // A service that never answers, and a caller with a long timeout: b leaves.
    let _silent = b.mailbox("silent").unwrap();
    let a = Arc::new(a);
    let (n, ready) = (a.clone(), Arc::new(Barrier::new(2)));
    let r2 = ready.clone();
    let caller = thread::spawn(move || {
        r2.wait();
        let r = n.request(&Address::new("b", "silent").unwrap(), "hello?", t);
        (r, Instant::now())
    });
    ready.wait();
    // Let the request reach b before it leaves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stats().requests.pending == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(50));
    drop(b);
    let gone = Instant::now();
    let (r, at) = caller.join().unwrap();
    assert!(matches!(&r, Err(Error::PeerDown(p)) if p == "b"), "{r:?}");
    assert!(
        at.saturating_duration_since(gone) < Duration::from_secs(5),
        "failed {:?} after b left",
        at.saturating_duration_since(gone)
    );
    let r = a.request(&Address::new("b", "silent").unwrap(), "again?", t);
    assert!(matches!(&r, Err(Error::PeerDown(_))), "{r:?}");
    assert_eq!(a.stats().requests.pending, 0);
}

/// Poll a future once with a waker that does nothing.
fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll_unpin(&mut cx)
}

#[test]
fn the_pending_table_is_bounded_and_100k_dropped_request_futures_leave_nothing() {
    let mut cfgs = mesh(&["a", "b"]);
    cfgs[0] = cfgs[0].clone().max_pending_requests(100_000);
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let svc = b.mailbox("svc").unwrap();
    let to = Address::new("b", "svc").unwrap();
    let t = Duration::from_secs(60);

    let mut futs: Vec<_> = (0..100_000u32)
        .map(|i| a.request_async(&to, i.to_le_bytes().to_vec(), t))
        .collect();
    let mut sent = 0u64;
    for f in &mut futs {
        assert!(poll_once(f).is_pending());
        sent += 1;
    }
    assert_eq!(a.stats().requests.pending, 100_000);
    // One more is refused: the table is full.
    let mut extra = a.request_async(&to, "one more", t);
    assert!(matches!(
        poll_once(&mut extra),
        Poll::Ready(Err(Error::TooManyRequests { max: 100_000 }))
    ));
    drop(futs);
    let s = a.stats().requests;
    assert_eq!((s.pending, s.cancelled, s.refused), (0, sent, 1), "{s:?}");

    // The service answers whatever reached it: every reply is late, and dropped.
    let mut answered = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = Vec::new();
    while Instant::now() < deadline {
        buf.clear();
        match svc.recv_batch_into(&mut buf, 4096, Duration::from_millis(500)) {
            Ok(_) => {
                for e in &buf {
                    e.reply("late").unwrap();
                    answered += 1;
                }
            }
            Err(_) => break,
        }
    }
    assert!(
        answered > 0,
        "some requests were queued before they were dropped"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.stats().requests.late_replies < answered && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let s = a.stats().requests;
    assert_eq!(
        (s.late_replies, s.pending, s.answered),
        (answered, 0, 0),
        "{s:?}"
    );
}

/// Blocking callers read their own replies (leading: `reads_led`) when no one else
/// is reading the connection, and calls from many threads at once all get their own
/// answers while the caller's connections break every 7 ms and come back: a caller that
/// was reading a connection that broke leaves it to its reader thread, which reports it.
#[test]
fn callers_read_their_own_replies_and_calls_survive_connections_breaking_under_them() {
    let cfgs = mesh(&["a", "b"])
        .into_iter()
        .map(|c| c.reconnect(Duration::from_millis(5), Duration::from_millis(20)))
        .collect();
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let stop = Arc::new(AtomicBool::new(false));
    let echo = serve(b.mailbox("echo").unwrap(), stop.clone());
    let to = Address::new("b", "echo").unwrap();
    let t = Duration::from_secs(20);
    for i in 0..200u32 {
        let q = format!("one {i}");
        let r = a.request(&to, q.clone(), t).unwrap();
        assert_eq!(r.payload, q.chars().rev().collect::<String>().as_bytes());
    }
    let by_caller = |n: &batchwire::Node| n.stats().peers.iter().map(|p| p.reads_led).sum::<u64>();
    assert!(
        by_caller(a) > 0,
        "one caller at a time reads its own replies"
    );

    let breaking = AtomicBool::new(true);
    let breaks = std::sync::atomic::AtomicU64::new(0);
    let t0 = Instant::now();
    thread::scope(|s| {
        s.spawn(|| {
            while breaking.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                thread::sleep(Duration::from_millis(7));
                breaks.fetch_add(a.break_connections() as u64, Ordering::Relaxed);
            }
        });
        let callers: Vec<_> = (0..8)
            .map(|c| {
                let to = &to;
                s.spawn(move || {
                    for i in 0..150u32 {
                        let q = format!("caller {c} call {i}");
                        let r = a.request(to, q.clone(), t).unwrap_or_else(|e| {
                            panic!("caller {c} call {i}: {e}");
                        });
                        assert_eq!(r.payload, q.chars().rev().collect::<String>().as_bytes());
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        breaking.store(false, Ordering::Relaxed);
    });
    assert!(
        breaks.load(Ordering::Relaxed) > 0,
        "connections broke meanwhile"
    );
    assert!(t0.elapsed() < Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    assert!(echo.join().unwrap() >= 200 + 8 * 150);
}

/// The voluntary context switches so far of this process's threads whose name `pick`
/// chooses (other tests run in the same process), from /proc.
#[cfg(target_os = "linux")]
fn voluntary_switches(pick: impl Fn(&str) -> bool) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !pick(comm.trim()) {
            continue;
        }
        let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in s.lines() {
            if let Some(v) = l.strip_prefix("voluntary_ctxt_switches:") {
                n += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    n
}

/// CPU time (user + system, clock ticks) so far of this process's threads whose name
/// `pick` chooses, from /proc.
#[cfg(target_os = "linux")]
fn cpu_ticks(pick: impl Fn(&str) -> bool) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !pick(comm.trim()) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // After "pid (comm) ": state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            n += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
        }
    }
    n
}

/// A server thread that reads its connection while it waits (leading, after answering
/// calls one at a time) sleeps like a parked one once the calls stop: no periodic wake-ups.
#[cfg(target_os = "linux")]
#[test]
fn a_receiver_that_leads_uses_no_cpu_while_idle() {
    // Names of their own: the threads counted are these nodes' (bw-...-q7...) and the
    // server's.
    let nodes = start(mesh(&["q7", "q8"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let stop = Arc::new(AtomicBool::new(false));
    // The server waits in recv with a timeout far beyond the test (one wake-up at most),
    // as a real one would wait with none; so a node that never closes fails the test
    // instead of hanging it.
    let mb = b.mailbox("echo").unwrap();
    let stop2 = stop.clone();
    let server = thread::Builder::new()
        .name("q-server".into())
        .spawn(move || {
            while let Ok(e) = mb.recv_timeout(Duration::from_secs(60)) {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let _ = e.reply(e.payload.clone());
            }
        })
        .unwrap();
    let to = Address::new("q8", "echo").unwrap();
    for i in 0..100u32 {
        a.request(&to, format!("{i}"), Duration::from_secs(10))
            .unwrap();
    }
    let led = |n: &batchwire::Node| n.stats().peers.iter().map(|p| p.reads_led).sum::<u64>();
    assert!(led(b) > 0, "the server read requests itself");
    let ours = |name: &str| name == "q-server" || name.contains("q7") || name.contains("q8");
    thread::sleep(Duration::from_millis(300));
    let (before, ticks) = (voluntary_switches(ours), cpu_ticks(ours));
    thread::sleep(Duration::from_secs(1));
    let woke = voluntary_switches(ours) - before;
    let used = cpu_ticks(ours) - ticks;
    // A thread spinning would use about 100 ticks (1 s) while switching little.
    assert!(used < 20, "{used} ticks of CPU in an idle second");
    // Both nodes' threads, idle for a second: the tickers' rounds and little else. A
    // leader looking again every few milliseconds would add hundreds.
    assert!(woke < 150, "{woke} wake-ups in an idle second");
    stop.store(true, Ordering::Relaxed);
    let _ = a.send(&to, "bye");
    drop(nodes);
    server.join().unwrap();
}

/// Four server threads on one mailbox (a pool): whichever of them leads, calls one at a
/// time are all answered, each with its own payload, and once they stop the pool uses no
/// CPU. (The eventfd left readable by a push that another receiver took is covered in
/// `read.rs`'s unit tests, where it is made to happen.)
#[cfg(target_os = "linux")]
#[test]
fn a_pool_of_receivers_on_one_mailbox_answers_every_call_and_then_rests() {
    let nodes = start(mesh(&["p5", "p6"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let mb = Arc::new(b.mailbox("pool").unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = (0..4)
        .map(|i| {
            let (mb, stop) = (mb.clone(), stop.clone());
            thread::Builder::new()
                .name(format!("p-server-{i}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(e) = mb.recv_timeout(Duration::from_secs(5)) {
                            let _ = e.reply(e.payload.clone());
                        }
                    }
                })
                .unwrap()
        })
        .collect();
    let to = Address::new("p6", "pool").unwrap();
    for i in 0..300u32 {
        let q = format!("{i}");
        let r = a.request(&to, q.clone(), Duration::from_secs(10)).unwrap();
        assert_eq!(r.payload, q.as_bytes());
    }
    let ours =
        |name: &str| name.starts_with("p-server") || name.contains("p5") || name.contains("p6");
    thread::sleep(Duration::from_millis(300));
    let ticks = cpu_ticks(ours);
    thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(ours) - ticks;
    assert!(used < 20, "{used} ticks of CPU in an idle second");
    stop.store(true, Ordering::Relaxed);
    drop(nodes);
    for s in servers {
        s.join().unwrap();
    }
}

/// A timeout too long for the clock (`Duration::MAX`) means no deadline, as with std's
/// `recv_timeout`: requests, receiving and waiting for peers neither panic nor fail.
#[test]
fn a_timeout_too_long_for_the_clock_means_no_deadline() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    assert!(a.wait_for_peers(&["b"], Duration::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let echo = serve(b.mailbox("echo").unwrap(), stop.clone());
    let to = Address::new("b", "echo").unwrap();
    let r = a.request(&to, "forever", Duration::MAX).unwrap();
    assert_eq!(r.payload, "reverof".as_bytes());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let r = rt
        .block_on(a.request_async(&to, "async", Duration::MAX))
        .unwrap();
    assert_eq!(r.payload, "cnysa".as_bytes());
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    // Receiving on an empty mailbox, filled a moment later.
    let inbox = a.mailbox("inbox").unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(50));
            b.send(&Address::new("a", "inbox").unwrap(), "late")
                .unwrap();
        });
        let got = inbox.recv_timeout(Duration::MAX).unwrap();
        assert_eq!(got.payload, "late".as_bytes());
    });
}

/// A request queued in a mailbox that its node then drops fails at once with
/// `Undeliverable`, not at its timeout.
#[test]
fn a_request_in_a_dropped_mailbox_fails_at_once() {
    let nodes = start(mesh(&["a", "b"]));
    let (a, b) = (&nodes[0], &nodes[1]);
    let svc = b.mailbox("svc").unwrap();
    let to = Address::new("b", "svc").unwrap();
    thread::scope(|s| {
        let call = s.spawn(|| {
            let t0 = Instant::now();
            (
                a.request(&to, "never read", Duration::from_secs(60)),
                t0.elapsed(),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while svc.is_empty() {
            assert!(Instant::now() < deadline, "the request never arrived");
            thread::sleep(Duration::from_millis(5));
        }
        drop(svc);
        let (r, took) = call.join().unwrap();
        assert!(matches!(r, Err(Error::Undeliverable { .. })), "{r:?}");
        assert!(took < Duration::from_secs(30), "failed only after {took:?}");
    });
}
