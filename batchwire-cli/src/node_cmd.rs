//! `batchwire node`: run a node until a signal, printing its stats and membership
//! events, answering its echo and status mailboxes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use batchwire::{Node, NodeConfig, RecvError};

use crate::{client, echo, metrics_http, nodefile, sys};

pub(crate) fn run_node(
    cfg: NodeConfig,
    extras: &nodefile::Extras,
    run_for: u64,
) -> Result<(), String> {
    if let Some(t) = &extras.tls {
        t.check_names(cfg.name()).map_err(|e| e.to_string())?;
    }
    let stop = sys::stop_signals()?;
    let stats_every = extras.stats_every;
    let metrics = match extras.metrics_listen {
        Some(addr) => Some(metrics_http::serve(addr)?),
        None => None,
    };
    let started = Instant::now();
    let node = Node::start(cfg.mailbox(client::STATUS_MAILBOX)).map_err(|e| e.to_string())?;
    let mut last_published: Option<Instant> = None;
    let echo = node.mailbox("echo").map_err(|e| e.to_string())?;
    let status = node
        .mailbox(client::STATUS_MAILBOX)
        .map_err(|e| e.to_string())?;
    let printer = print_members(&node, extras.event_times);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Status requests are answered by a thread of their own, so they never wait behind
        // echo traffic. It ends when the mailbox closes (at shutdown) or `stop` is set.
        let (node, stop, done, status) = (&node, &stop, &done, &status);
        let answering = scope.spawn(move || serve_status(node, status, [stop, done], started));
        let r = echo_loop(
            node,
            echo,
            stop,
            &metrics,
            (stats_every, extras.stats_json, extras.stats_brief),
            run_for,
            started,
            &mut last_published,
        );
        done.store(true, Ordering::Release);
        // Wake the status thread now rather than at its next timeout.
        if let Ok(to) = batchwire::Address::new(node.name(), client::STATUS_MAILBOX) {
            let _ = status.try_send(&to, bytes::Bytes::new());
        }
        let _ = answering.join();
        r
    })?;
    print_stats(&node, extras.stats_json, extras.stats_brief);
    node.shutdown();
    printer.finish(std::time::Duration::from_secs(2));
    Ok(())
}

/// The node's counters on stdout: text, or one JSON object on one line.
pub(crate) fn print_stats(node: &Node, json: bool, brief: bool) {
    let stats = if brief {
        node.stats_brief()
    } else {
        node.stats()
    };
    if json {
        match serde_json::to_string(&stats) {
            Ok(j) => outln!("{j}"),
            Err(e) => tracing::warn!(error = %e, "cannot print the counters as JSON"),
        }
    } else {
        out!("{stats}");
    }
}

/// Answer status requests (see `client::status_json`) until either flag is set.
pub(crate) fn serve_status(
    node: &Node,
    status: &batchwire::Mailbox,
    until: [&AtomicBool; 2],
    started: Instant,
) {
    // The echo loop wakes this thread when it ends (an empty message, see `run_node`);
    // the timeout is only a backstop.
    while !until.iter().any(|f| f.load(Ordering::Acquire)) {
        match status.recv_timeout(Duration::from_secs(5)) {
            Ok(e) if e.is_request() => {
                let body = client::status_json(node, started).to_string();
                if let Err(err) = e.try_reply(body) {
                    tracing::debug!(from = %e.from, error = %err, "status: reply not sent");
                }
            }
            Ok(_) | Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => break,
        }
    }
}

/// Longest the node's main loop sleeps with nothing to do; a SIGTERM is seen within it.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(500);

/// The node's main loop: answer echo, publish metrics and status, print counters.
#[allow(clippy::too_many_arguments)]
pub(crate) fn echo_loop(
    node: &Node,
    echo: batchwire::Mailbox,
    stop: &AtomicBool,
    metrics: &Option<metrics_http::Served>,
    (stats_every, stats_json, stats_brief): (u64, bool, bool),
    run_for: u64,
    started: Instant,
    last_published: &mut Option<Instant>,
) -> Result<(), String> {
    outln!("node {} listening on {}", node.name(), node.local_addr());
    let start = Instant::now();
    let mut last_stats = Instant::now();
    let mut batch = Vec::new();
    // A request gets a reply; a plain message goes back to its sender. Never waiting for
    // one client: see echo.rs.
    let mut owed = echo::Echo::default();
    let answer = |batch: &mut Vec<batchwire::Envelope>, owed: &mut echo::Echo| {
        owed.retry(&echo);
        for e in batch.drain(..) {
            owed.answer(&echo, e);
        }
    };
    loop {
        if stop.load(Ordering::Acquire) {
            // What the mailbox already holds was accepted: answer it before going.
            // (Only what is there now: peers may go on sending until our goodbye.)
            let held = echo.len();
            let mut n = 0;
            while n < held {
                match echo.recv_batch_into(&mut batch, 4096.min(held - n), Duration::ZERO) {
                    Ok(k) => n += k,
                    Err(_) => break,
                }
                answer(&mut batch, &mut owed);
            }
            // What still waits for room gets until the shutdown's own deadline.
            let until = Instant::now() + Duration::from_secs(5);
            while owed.is_waiting() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                owed.retry(&echo);
            }
            if owed.is_waiting() {
                tracing::warn!(
                    answers = owed.waiting(),
                    "echo: clients took no answers before the shutdown; these were not sent"
                );
            }
            tracing::info!(node = %node.name(), answered = n, "signal: draining and shutting down");
            break;
        }
        // Answers waiting for room are retried every 10 ms. Otherwise the loop sleeps until
        // its next duty (counters, metrics, the end of `--run-for`), at most `STOP_POLL`:
        // that is how soon a signal is seen. A thousand idle nodes on one machine each
        // woke ten times a second before (this loop and the status thread at 200 ms).
        let wait = if owed.is_waiting() {
            Duration::from_millis(10)
        } else {
            let mut due = STOP_POLL;
            let left = |since: Instant, every: Duration| every.saturating_sub(since.elapsed());
            if stats_every > 0 {
                due = due.min(left(last_stats, Duration::from_secs(stats_every)));
            }
            if metrics.is_some() {
                let since = last_published.unwrap_or(start);
                due = due.min(left(since, Duration::from_secs(1)));
            }
            if run_for > 0 {
                due = due.min(left(start, Duration::from_secs(run_for)));
            }
            due.max(Duration::from_millis(1))
        };
        match echo.recv_batch_into(&mut batch, 4096, wait) {
            Ok(_) | Err(RecvError::Timeout | RecvError::Empty) => answer(&mut batch, &mut owed),
            Err(_) => break,
        }
        // Metrics are copied from the node's counters once a second (a scrape sees values
        // at most that old).
        if let Some(m) = metrics
            && last_published.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            node.publish_metrics();
            m.metrics.run_upkeep();
            *m.status.lock().unwrap_or_else(|p| p.into_inner()) =
                client::status_json(node, started).to_string();
            *last_published = Some(Instant::now());
        }
        if stats_every > 0 && last_stats.elapsed() >= Duration::from_secs(stats_every) {
            print_stats(node, stats_json, stats_brief);
            last_stats = Instant::now();
        }
        if run_for > 0 && start.elapsed() >= Duration::from_secs(run_for) {
            break;
        }
    }
    Ok(())
}

/// Print the members, then each membership event as it happens, one line each on stdout:
/// `member joined|suspected|alive|down|left NAME ADDR INCARNATION`, and with `times` the
/// host's monotonic time in nanoseconds after that (`--event-times`); `events dropped N`
/// if the printer fell so far behind that the node dropped events for it. With `times`
/// each event carries the moment the node emitted it, so the printer need not run at once:
/// it runs only when the host's CPUs have nothing else to do (with a thousand nodes on one
/// host, printers woken for each batch of events took a tenth of the CPU). It writes with
/// plain `write(2)` calls of whole lines, not through the stdout lock, so a printer that
/// waits for a CPU or for its reader holds up no other line of the node.
fn print_members(node: &Node, times: bool) -> Printer {
    // Subscribe first, then print the view as it stands: members that joined before the
    // subscription are printed from the view (one may be printed twice), none is missed.
    let events = if times {
        Events::Timed(node.timed_events())
    } else {
        Events::Now(node.events())
    };
    let clock = Clock::new();
    let now = std::time::Instant::now();
    let mut lines = String::new();
    for m in node.members() {
        let what = match m.state {
            batchwire::MemberState::Alive => "joined",
            batchwire::MemberState::Suspect => "suspected",
            batchwire::MemberState::Down => "down",
            _ => "left",
        };
        member_line(&mut lines, what, &m, times.then(|| clock.ns(now)));
    }
    sys::write_stdout_lines(&lines);
    print_member_events(events, clock)
}

/// One member line onto `out`.
fn member_line(out: &mut String, what: &str, m: &batchwire::Member, time: Option<u64>) {
    use std::fmt::Write;
    let _ = write!(out, "member {what} {} {} {}", m.name, m.addr, m.incarnation);
    let _ = match time {
        Some(t) => writeln!(out, " {t}"),
        None => writeln!(out),
    };
}

/// The printer's subscription: plain, or with the time of each event.
enum Events {
    Now(std::sync::mpsc::Receiver<batchwire::Event>),
    Timed(std::sync::mpsc::Receiver<batchwire::TimedEvent>),
}

/// `Instant` to the host's monotonic nanoseconds (`sys::monotonic_ns`, the same clock).
#[derive(Clone, Copy)]
struct Clock {
    at: std::time::Instant,
    ns: u64,
}

impl Clock {
    /// Both clocks read together: the `Instant` between two readings of the other, taken
    /// again (a few times at most) if this thread was held up between them.
    fn new() -> Clock {
        let mut best: Option<(u64, Clock)> = None;
        for _ in 0..5 {
            let a = sys::monotonic_ns();
            let at = std::time::Instant::now();
            let b = sys::monotonic_ns();
            let gap = b.saturating_sub(a);
            let c = Clock {
                at,
                ns: a + gap / 2,
            };
            if best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, c));
            }
            if gap < 20_000 {
                break;
            }
        }
        best.map_or(
            Clock {
                at: std::time::Instant::now(),
                ns: sys::monotonic_ns(),
            },
            |(_, c)| c,
        )
    }

    fn ns(&self, t: std::time::Instant) -> u64 {
        match t.checked_duration_since(self.at) {
            Some(d) => self.ns.saturating_add(d.as_nanos() as u64),
            None => self
                .ns
                .saturating_sub(self.at.duration_since(t).as_nanos() as u64),
        }
    }
}

/// The event printer's thread, told apart so the node can let it finish at exit.
pub(crate) struct Printer(Option<std::sync::mpsc::Receiver<()>>);

impl Printer {
    /// Once the node shut down (its events end): give the printer up to `limit` to print
    /// what it still holds.
    pub(crate) fn finish(self, limit: std::time::Duration) {
        if let Some(done) = self.0 {
            let _ = done.recv_timeout(limit);
        }
    }
}

/// The event printer of [`print_members`], on a thread of its own.
fn print_member_events(events: Events, clock: Clock) -> Printer {
    use batchwire::Event as E;
    let (done_tx, done) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("member-events".into())
        .spawn(move || {
            if matches!(events, Events::Timed(_)) {
                // Each event has its time: the printer can wait until the host has nothing
                // else to do.
                if let Err(e) = sys::run_when_idle() {
                    tracing::debug!(error = %e, "event printer keeps its priority");
                }
            }
            // Every event already waiting goes out in one write: a thousand members
            // joining were a thousand writes (and wake-ups of whoever reads) per node.
            let mut lines = String::new();
            let mut batch: Vec<(Option<std::time::Instant>, E)> = Vec::new();
            loop {
                match &events {
                    Events::Now(rx) => {
                        let Ok(first) = rx.recv() else { break };
                        batch.extend(
                            std::iter::once(first)
                                .chain(rx.try_iter().take(1024))
                                .map(|e| (None, e)),
                        );
                    }
                    Events::Timed(rx) => {
                        let Ok(first) = rx.recv() else { break };
                        batch.extend(
                            std::iter::once(first)
                                .chain(rx.try_iter().take(4096))
                                .map(|t| (Some(t.at), t.event)),
                        );
                    }
                }
                for (t, e) in batch.drain(..) {
                    let (what, m) = match &e {
                        E::MemberJoined { member } => ("joined", member),
                        E::MemberSuspected { member } => ("suspected", member),
                        E::MemberAlive { member } => ("alive", member),
                        E::MemberDown { member } => ("down", member),
                        E::MemberLeft { member } => ("left", member),
                        E::EventsDropped { count } => {
                            use std::fmt::Write;
                            let _ = writeln!(lines, "events dropped {count}");
                            continue;
                        }
                        _ => continue,
                    };
                    member_line(&mut lines, what, m, t.map(|t| clock.ns(t)));
                }
                sys::write_stdout_lines(&lines);
                lines.clear();
            }
            let _ = done_tx.send(());
        });
    match spawned {
        Ok(_) => Printer(Some(done)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the event printer");
            Printer(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A member line carries the time of its event, however long ago that was: an event
    /// a second old is a second before the clock's anchor.
    #[test]
    fn a_member_line_carries_its_events_time_on_the_hosts_clock() {
        let clock = Clock::new();
        let before = clock.at.checked_sub(Duration::from_secs(1)).unwrap();
        let later = clock.at + Duration::from_millis(1500);
        assert_eq!(clock.ns(before), clock.ns - 1_000_000_000);
        assert_eq!(clock.ns(later), clock.ns + 1_500_000_000);
        let m = batchwire::Member {
            name: "m7".into(),
            addr: "127.0.0.1:9".parse().unwrap(),
            incarnation: 3,
            state: batchwire::MemberState::Alive,
        };
        let mut out = String::new();
        member_line(&mut out, "joined", &m, Some(clock.ns(before)));
        member_line(&mut out, "left", &m, None);
        let want = format!(
            "member joined m7 127.0.0.1:9 3 {}\nmember left m7 127.0.0.1:9 3\n",
            clock.ns - 1_000_000_000
        );
        assert_eq!(out, want);
        // Both clocks read together: the anchor is within a few milliseconds of a fresh
        // reading of each.
        let (ns, at) = (sys::monotonic_ns(), Instant::now());
        let apart = clock.ns(at).abs_diff(ns);
        assert!(apart < 5_000_000, "{apart} ns apart");
    }
}
