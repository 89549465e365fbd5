//! Joining: the joiner thread finds the cluster through the seeds (addresses, and DNS names
//! resolved through the system resolver) and dials them.
//!
//! While this node has no live member, each round resolves the names again and dials every
//! seed address that has no join connection yet, then waits with the reconnect back-off.
//! Each dial runs on a thread of its own, the connect too (so a seed address that does not
//! answer holds up no other), and a connection that comes up runs there to its end:
//! the handshake tells the seed's name and the connection announces this node to the
//! seed's membership (see `Setup::run`), which brings the rest of the cluster both ways.
//!
//! Once joined, a node whose seeds are all addresses is done (the thread ends). With DNS
//! names it goes on: every `join_refresh` it resolves them again and dials each address
//! that is no live member's, so a node started before the name listed anyone still
//! joins, and two groups that formed apart (each behind the same name, before the name
//! listed both) merge. In a settled cluster every address is a member's and nothing is
//! dialled.
//!
//! Bounds: at most [`MAX_ADDRS`] addresses a round, at most [`MAX_IN_FLIGHT`] join
//! connections being made at once (established ones do not count), one per address;
//! the resolver is waited for at most [`LOOKUP_WAIT`] a round (one lookup per name at a
//! time, off this thread); what the resolver says is logged when a name's addresses
//! change, and failures at the first and then at doubling counts.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info};

use crate::io::dial::Backoff;
use crate::io::members::Members;
use crate::io::setup::{Setup, Side};
use crate::io::threads::Threads;
use crate::seed::Seed;

/// Most seed addresses dialled in one round (what all the names resolve to, together).
pub(crate) const MAX_ADDRS: usize = 1024;
/// Most join connections running at once.
pub(crate) const MAX_IN_FLIGHT: usize = 8;

/// The resolver: a name and a port to addresses (the system's, or a test's).
pub(crate) type Lookup = dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + Sync;

/// The system resolver (`getaddrinfo`: /etc/hosts, then DNS A and AAAA records), waited
/// for at most [`LOOKUP_WAIT`] (see [`off_thread`]).
pub(crate) fn system_lookup() -> Box<Lookup> {
    off_thread(
        |host, port| Ok((host, port).to_socket_addrs()?.collect()),
        LOOKUP_WAIT,
    )
}

/// How long the joiner waits for the resolver in one round.
const LOOKUP_WAIT: Duration = Duration::from_millis(500);

/// A blocking `lookup` with a deadline: `getaddrinfo` cannot be cancelled and, with a DNS
/// server that does not answer, takes as long as resolv.conf's timeouts and attempts
/// allow (tens of seconds with search domains), during which the joiner could neither go
/// on nor let the node shut down. Each name is looked up on a short-lived thread of its
/// own, at most one at a time per name; the caller waits at most `wait`, and an answer
/// that comes later is taken at the next call for that name (meanwhile the call fails,
/// and the resolver keeps the name's last answer). One caller at a time (the joiner
/// thread): "at most one per name" counts on it, as the lock is not held while waiting.
fn off_thread(
    lookup: fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    wait: Duration,
) -> Box<Lookup> {
    type Answer = std::io::Result<Vec<SocketAddr>>;
    // Lookups still running, by name and port: at most one per seed name.
    let pending: Mutex<HashMap<(String, u16), Receiver<Answer>>> = Mutex::default();
    Box::new(move |host, port| {
        let key = (host.to_string(), port);
        let taken = pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        // No lock is held while waiting for the resolver.
        let rx = match taken {
            Some(rx) => rx,
            None => {
                let (tx, rx) = sync_channel(1);
                let h = key.0.clone();
                std::thread::Builder::new()
                    .name("bw-resolve".into())
                    .spawn(move || {
                        let _ = tx.send(lookup(&h, port));
                    })?;
                rx
            }
        };
        match rx.recv_timeout(wait) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, rx);
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the resolver has not answered within {wait:?} (still asking)"),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => Err(std::io::Error::other(
                "the resolver's thread ended without an answer",
            )),
        }
    })
}

/// What one round of resolving found, and what it logs.
#[derive(Default)]
pub(crate) struct Resolver {
    /// Per name: the addresses it last resolved to (sorted) and its failures in a row.
    last: HashMap<String, (Vec<SocketAddr>, u32)>,
}

impl Resolver {
    /// Every seed as addresses: the fixed ones, and each name resolved now. Addresses of
    /// this node (`skip`) are left out, each address appears once, at most [`MAX_ADDRS`].
    pub fn resolve(
        &mut self,
        node: &str,
        seeds: &[Seed],
        skip: &[SocketAddr],
        lookup: &Lookup,
    ) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut add = |a: SocketAddr, out: &mut Vec<SocketAddr>| {
            if out.len() < MAX_ADDRS && !skip.contains(&a) && seen.insert(a) {
                out.push(a);
            }
        };
        for seed in seeds {
            match seed {
                Seed::Addr(a) => add(*a, &mut out),
                Seed::Name { host, port } => {
                    let (last, failures) = self.last.entry(seed.to_string()).or_default();
                    match lookup(host, *port) {
                        Ok(mut addrs) => {
                            addrs.sort();
                            addrs.dedup();
                            addrs.truncate(MAX_ADDRS);
                            if addrs != *last || *failures > 0 {
                                info!(node, seed = %seed, addrs = ?Shown(&addrs), "seed resolved");
                            }
                            *failures = 0;
                            for a in &addrs {
                                add(*a, &mut out);
                            }
                            *last = addrs;
                        }
                        Err(e) => {
                            *failures = failures.saturating_add(1);
                            if failures.is_power_of_two() {
                                info!(node, seed = %seed, error = %e, failures = *failures, "cannot resolve the seed yet; retrying");
                            }
                            // What it said last still stands (a resolver that fails for a
                            // moment does not hide the cluster).
                            for a in last.iter() {
                                add(*a, &mut out);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// A list of addresses for a log line: the first 8 and how many more.
struct Shown<'a>(&'a [SocketAddr]);

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut l = f.debug_list();
        l.entries(self.0.iter().take(8));
        if self.0.len() > 8 {
            l.entry(&format_args!("... {} more", self.0.len() - 8));
        }
        l.finish()
    }
}

/// The joiner thread's body (see the module's text).
pub(crate) fn run_joiner(
    setup: Arc<Setup>,
    members: Members,
    threads: Threads,
    seeds: Vec<Seed>,
    skip: Vec<SocketAddr>,
    lookup: Box<Lookup>,
) {
    let names = seeds.iter().any(|s| matches!(s, Seed::Name { .. }));
    let mut backoff = Backoff::new(setup.config.reconnect_min, setup.config.reconnect_max);
    let mut resolver = Resolver::default();
    // Addresses with a join connection, and whether it is established (see `InFlight`).
    let in_flight: Arc<Mutex<HashMap<SocketAddr, bool>>> = Default::default();
    let mut attempts = 0u32;
    let mut was_joined = false;
    // Where the next round starts in the addresses: after the last one dialled, so that
    // silent addresses listed first cannot take every connect's place round after round
    // while a live one waits behind them.
    let mut cursor = 0usize;
    let mut spawn_failures = 0u32;
    loop {
        if setup.shutdown.is_shutting_down() {
            return;
        }
        let addrs = resolver.resolve(setup.name.as_str(), &seeds, &skip, &*lookup);
        setup.set_seed_addrs(&addrs);
        let live: HashSet<SocketAddr> = members
            .view()
            .iter()
            .filter(|m| m.state.is_live())
            .map(|m| m.addr)
            .collect();
        let joined = !live.is_empty();
        if joined && !was_joined {
            info!(node = %setup.name, "joined the cluster");
        }
        was_joined = joined;
        if joined && !names {
            return;
        }
        let start = cursor % addrs.len().max(1);
        for i in (0..addrs.len()).map(|k| (start + k) % addrs.len()) {
            let addr = &addrs[i];
            if setup.shutdown.is_shutting_down() {
                return;
            }
            if live.contains(addr) {
                continue;
            }
            if !joined && members.view().iter().any(|m| m.state.is_live()) {
                break; // joined meanwhile: the next round sees it
            }
            {
                let mut f = in_flight.lock().unwrap_or_else(|p| p.into_inner());
                // Not one with a join connection already (up or on its way), and at most
                // `MAX_IN_FLIGHT` connects on their way (established ones do not count).
                let connecting = f.values().filter(|up| !**up).count();
                if f.contains_key(addr) || connecting >= MAX_IN_FLIGHT {
                    continue;
                }
                f.insert(*addr, false);
            }
            attempts += 1;
            let done = InFlight(in_flight.clone(), *addr);
            // The connect too runs on the connection's thread: a seed address that does
            // not answer (a host gone, its SYNs dropped) costs its own thread up to the
            // handshake timeout, not every address after it in this round.
            let (st, addr, n) = (setup.clone(), *addr, attempts);
            let spawned = threads.spawn(format!("bw-join-{}", setup.name), move || {
                join_through(&st, addr, done, joined, n)
            });
            cursor = i + 1;
            if let Err(e) = spawned {
                // No thread now: the round ends here (the address is free again, and
                // first in the next round), and the log says so at the first failure
                // and then at doubling counts.
                cursor = i;
                spawn_failures += 1;
                if spawn_failures.is_power_of_two() {
                    info!(node = %setup.name, seed = %addr, error = %e, failures = spawn_failures, "cannot start a thread for a join connection; retrying");
                }
                break;
            }
        }
        let pause = if joined {
            setup.config.join_refresh
        } else {
            backoff.after(false)
        };
        if !setup.shutdown.sleep(pause) {
            return;
        }
    }
}

/// On a thread of its own: connect to seed `addr` and run the connection to its end;
/// `done` frees the address for the joiner when this returns. `attempts` counts the
/// joiner's connects so far (for the log's back-off).
fn join_through(setup: &Arc<Setup>, addr: SocketAddr, done: InFlight, joined: bool, attempts: u32) {
    match TcpStream::connect_timeout(&addr, setup.config.handshake_timeout) {
        Ok(s) => {
            if joined {
                debug!(node = %setup.name, seed = %addr, "a seed address that is no live member's answers; joining through it too");
            }
            let up = Established(done.0.clone(), done.1);
            setup.run(
                s,
                Side::Join {
                    place: Box::new(up),
                },
            );
        }
        Err(e) if attempts == 1 || attempts.is_power_of_two() => {
            info!(node = %setup.name, seed = %addr, error = %e, attempts, "cannot reach the seed yet; retrying");
        }
        Err(e) => debug!(node = %setup.name, seed = %addr, error = %e, "cannot reach the seed"),
    }
    drop(done);
}

/// An address with a join connection (or a connect) in progress; removed when dropped
/// (when the connection's thread ends: join connections do not rest).
struct InFlight(Arc<Mutex<HashMap<SocketAddr, bool>>>, SocketAddr);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

/// Marks the address's join connection established when dropped (by the connection's
/// setup, see `Side::Join`): it no longer counts among the connects on their way, so
/// lasting join connections do not keep later seed addresses from being dialled.
struct Established(Arc<Mutex<HashMap<SocketAddr, bool>>>, SocketAddr);

impl Drop for Established {
    fn drop(&mut self) {
        if let Some(up) = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.1)
        {
            *up = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn names_resolve_with_the_fixed_seeds_deduplicated_without_this_node() {
        let seeds: Vec<Seed> = ["10.0.0.1:7000", "peers:7000", "more:7001", "10.0.0.2:7000"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let lookup = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            Ok(match host {
                "peers" => vec![
                    SocketAddr::new("10.0.0.3".parse().unwrap(), port),
                    SocketAddr::new("10.0.0.1".parse().unwrap(), port),
                    SocketAddr::new("10.0.0.9".parse().unwrap(), port),
                    SocketAddr::new("10.0.0.3".parse().unwrap(), port),
                ],
                _ => vec![SocketAddr::new("fd00::1".parse().unwrap(), port)],
            })
        };
        let mut r = Resolver::default();
        let got = r.resolve("n", &seeds, &[a("10.0.0.9:7000")], &lookup);
        assert_eq!(
            got,
            [
                a("10.0.0.1:7000"),
                a("10.0.0.3:7000"),
                a("[fd00::1]:7001"),
                a("10.0.0.2:7000")
            ]
        );
    }

    #[test]
    fn a_slow_resolver_is_waited_for_with_a_deadline_and_asked_once_at_a_time() {
        static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        fn slow(_: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
            CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            Ok(vec![SocketAddr::from(([10, 0, 0, 1], port))])
        }
        let lookup = off_thread(slow, Duration::from_millis(50));
        let t0 = std::time::Instant::now();
        let e = lookup("peers", 7000).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(
            t0.elapsed() < Duration::from_millis(250),
            "waited {:?}",
            t0.elapsed()
        );
        // Asked again before the answer: the same lookup is waited for, no second one.
        assert!(lookup("peers", 7000).is_err());
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(lookup("peers", 7000).unwrap(), [a("10.0.0.1:7000")]);
        assert_eq!(CALLS.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The next call asks anew.
        let t0 = std::time::Instant::now();
        assert!(lookup("peers", 7000).is_err());
        assert!(t0.elapsed() < Duration::from_millis(250));
        assert_eq!(CALLS.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failing_resolver_keeps_the_last_answer_and_a_huge_answer_is_cut() {
        let seeds: Vec<Seed> = vec!["peers:7000".parse().unwrap()];
        let mut r = Resolver::default();
        let fail = |_: &str, _: u16| -> std::io::Result<Vec<SocketAddr>> {
            Err(std::io::Error::other("no such name"))
        };
        assert!(r.resolve("n", &seeds, &[], &fail).is_empty());
        let many = |_: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            Ok((0..5000u32)
                .map(|i| SocketAddr::new(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), port))
                .collect())
        };
        let got = r.resolve("n", &seeds, &[], &many);
        assert_eq!(got.len(), MAX_ADDRS);
        assert_eq!(
            r.resolve("n", &seeds, &[], &fail),
            got,
            "the last answer stands"
        );
        assert_eq!(r.last["peers:7000"].1, 1, "one failure counted");
        // Names and fixed seeds together are bounded too.
        let seeds: Vec<Seed> = vec!["peers:7000".parse().unwrap(), "other:7000".parse().unwrap()];
        assert_eq!(r.resolve("n", &seeds, &[], &many).len(), MAX_ADDRS);
    }
}
