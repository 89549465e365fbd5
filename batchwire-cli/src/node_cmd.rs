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
    print_members(&node, extras.event_times);
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
/// host's monotonic time in nanoseconds after that (`--event-times`). With `times` each
/// event carries the moment the node emitted it, so the printer need not run at once: it
/// runs only when the host's CPUs have nothing else to do (with a thousand nodes on one
/// host, printers woken for each batch of events took a tenth of the CPU).
fn print_members(node: &Node, times: bool) {
    // Subscribe first, then print the view as it stands: members that joined before the
    // subscription are printed from the view (one may be printed twice), none is missed.
    let events = if times {
        Events::Timed(node.timed_events())
    } else {
        Events::Now(node.events())
    };
    let clock = Clock::new();
    let now = std::time::Instant::now();
    for m in node.members() {
        let what = match m.state {
            batchwire::MemberState::Alive => "joined",
            batchwire::MemberState::Suspect => "suspected",
            batchwire::MemberState::Down => "down",
            _ => "left",
        };
        outln!(
            "member {what} {} {} {}{}",
            m.name,
            m.addr,
            m.incarnation,
            if times {
                format!(" {}", clock.ns(now))
            } else {
                String::new()
            }
        );
    }
    print_member_events(events, clock);
}

/// The printer's subscription: plain, or with the time of each event.
enum Events {
    Now(std::sync::mpsc::Receiver<batchwire::Event>),
    Timed(std::sync::mpsc::Receiver<(std::time::Instant, batchwire::Event)>),
}

/// `Instant` to the host's monotonic nanoseconds (`sys::monotonic_ns`, the same clock).
#[derive(Clone, Copy)]
struct Clock {
    at: std::time::Instant,
    ns: u64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            at: std::time::Instant::now(),
            ns: sys::monotonic_ns(),
        }
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

/// The event printer of [`print_members`], on a thread of its own.
fn print_member_events(events: Events, clock: Clock) {
    use batchwire::Event as E;
    let spawned = std::thread::Builder::new()
        .name("member-events".into())
        .spawn(move || {
            use std::fmt::Write;
            // Every event already waiting goes out in one write: a thousand members
            // joining were a thousand writes (and wake-ups of whoever reads) per node.
            let mut lines = String::new();
            if matches!(events, Events::Timed(_)) {
                // Each event has its time: the printer can wait until the host has nothing
                // else to do.
                if let Err(e) = sys::run_when_idle() {
                    tracing::debug!(error = %e, "event printer keeps its priority");
                }
            }
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
                        let Ok((t, first)) = rx.recv() else { break };
                        batch.extend(
                            std::iter::once((t, first))
                                .chain(rx.try_iter().take(4096))
                                .map(|(t, e)| (Some(t), e)),
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
                        _ => continue,
                    };
                    let _ = write!(
                        lines,
                        "member {what} {} {} {}",
                        m.name, m.addr, m.incarnation
                    );
                    let _ = match t {
                        Some(t) => writeln!(lines, " {}", clock.ns(t)),
                        None => writeln!(lines),
                    };
                }
                if !lines.is_empty() {
                    out!("{lines}");
                    lines.clear();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the event printer");
    }
}
