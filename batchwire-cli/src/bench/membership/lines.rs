//! The lines the membership bench reads from its nodes: each node's view as its
//! `member ...` lines tell it (timed by the node's own clock when the line carries it,
//! `--event-times`), and its latest counters.

use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// What one node has said so far.
#[derive(Default, Clone)]
pub(super) struct Seen {
    /// Member name → (state word, incarnation, when). Sized for every node at its first
    /// member line: grown a doubling at a time, a thousand nodes' maps were most of the
    /// bench's own CPU and page faults during a join, beside the nodes it measures.
    pub(super) members: HashMap<String, (&'static str, u64, Instant)>,
    /// Of `members`, those live (joined, alive or suspected): kept as lines come, so a
    /// thousand nodes' views are not counted again at every line.
    pub(super) live: usize,
    /// (when, membership bytes sent, all bytes sent) from its latest counters.
    pub(super) sent: Option<(Instant, u64, u64)>,
    /// Membership packets read and sent so far, from its latest counters, and of those
    /// sent: probes, gossip and full-state answers.
    pub(super) packets: (u64, u64),
    pub(super) sent_kinds: [u64; 3],
    /// When it first saw every other node live.
    pub(super) full_at: Option<Instant>,
    /// Suspicions and downs it reported (false alarms while nobody failed).
    pub(super) alarms: (u64, u64),
    /// The member whose news completed its view (at `full_at`).
    pub(super) completed_by: String,
}

fn is_live(state: &str) -> bool {
    state == "joined" || state == "alive" || state == "suspected"
}

/// The state word of a member line, without a copy (a word the bench does not know is
/// kept as "other", which is not live).
fn word(what: &str) -> &'static str {
    ["joined", "alive", "suspected", "down", "left"]
        .into_iter()
        .find(|w| *w == what)
        .unwrap_or("other")
}

impl Seen {
    pub(super) fn live(&self) -> usize {
        self.live
    }
}

/// The lines of every process, as (node index, arrival, lines) from [`crate::bench::pipes::Pipes`].
pub(super) struct Lines {
    rx: Receiver<(usize, Instant, String)>,
    pub(super) seen: Vec<Seen>,
    /// How many nodes the run has.
    nodes: usize,
    /// This process's clock and the host's monotonic clock read together, once per run of
    /// lines (see [`node_instant`]): not twice per line of a million.
    clock: (Instant, u64),
    /// The first node that said it dropped events (`events dropped N`), and how many.
    pub(super) dropped: Option<(usize, u64)>,
}

/// When the median node and the 90th-percentile node first saw every other node live, in
/// seconds since `t0` (infinite if one never did).
pub(super) fn spread(seen: &[Seen], t0: Instant) -> (f64, f64) {
    let mut t: Vec<f64> = seen
        .iter()
        .map(|s| {
            s.full_at
                .map_or(f64::INFINITY, |at| (at - t0).as_secs_f64())
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| t[((t.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.9))
}

/// When each share of all (node, member) pairs had been learnt: the times of the lines
/// that made each member live in each node's view, in seconds since `t0`, at 50%, 90%, 99% and
/// 99.9%. Where the join's time goes: a long tail past 99% is a few updates that
/// gossip missed, a late 50% is a slow spread.
pub(super) fn learnt(seen: &[Seen], t0: Instant) -> [f64; 4] {
    let mut t: Vec<f64> = seen
        .iter()
        .flat_map(|s| s.members.values())
        .filter(|(state, _, _)| is_live(state))
        .map(|(_, _, at)| at.saturating_duration_since(t0).as_secs_f64())
        .collect();
    if t.is_empty() {
        return [f64::NAN; 4];
    }
    t.sort_by(|a, b| a.total_cmp(b));
    [0.5, 0.9, 0.99, 0.999].map(|q| t[((t.len() as f64 - 1.0) * q).round() as usize])
}

impl Lines {
    /// The lines of `nodes` nodes, as they come on `rx` (from [`crate::bench::pipes::Pipes`]).
    pub(super) fn new(rx: Receiver<(usize, Instant, String)>, nodes: usize) -> Lines {
        Lines {
            rx,
            seen: vec![Seen::default(); nodes],
            nodes,
            clock: now(),
            dropped: None,
        }
    }

    /// Take one line of node `i`, read at `at`; for a member line, its time.
    pub(super) fn take(&mut self, i: usize, at: Instant, line: &str) -> Option<Instant> {
        if let Some(count) = line.strip_prefix("events dropped ") {
            self.dropped
                .get_or_insert((i, count.trim().parse().unwrap_or(0)));
            return None;
        }
        let s = &mut self.seen[i];
        let mut words = line.split_whitespace();
        let w: [Option<&str>; 7] = std::array::from_fn(|_| words.next());
        let member = match w {
            [
                Some("member"),
                Some(what),
                Some(name),
                Some(_),
                Some(inc),
                None,
                _,
            ] => Some((what, name, inc, None)),
            [
                Some("member"),
                Some(what),
                Some(name),
                Some(_),
                Some(inc),
                Some(time),
                None,
            ] => Some((what, name, inc, time.parse().ok())),
            _ => None,
        };
        if let Some((what, name, inc, time)) = member {
            // The node's own time for the line (`--event-times`), when it gave one: the
            // one reader takes each pipe up to a pause late, later on a busy machine.
            let at = time.map_or(at, |t| node_instant(t, at, self.clock));
            let inc = inc.parse().unwrap_or(0);
            if s.members.capacity() == 0 {
                s.members.reserve(self.nodes);
            }
            let now = (word(what), inc, at);
            // The name is copied only the first time the node names that member.
            let old = match s.members.get_mut(name) {
                Some(v) => Some(std::mem::replace(v, now)),
                None => s.members.insert(name.to_string(), now),
            };
            let was = old.is_some_and(|o| is_live(o.0));
            match what {
                "suspected" => s.alarms.0 += 1,
                "down" => s.alarms.1 += 1,
                _ => {}
            }
            match (was, is_live(what)) {
                (false, true) => s.live += 1,
                (true, false) => s.live -= 1,
                _ => {}
            }
            if s.full_at.is_none() && s.live + 1 == self.nodes {
                s.full_at = Some(at);
                s.completed_by = name.to_string();
            }
            return Some(at);
        } else if let Some(rest) = line.trim().strip_prefix("membership: ") {
            // "in P packets / B B, out P packets / B B (P probes, G gossip, S state), ...;
            // all peers: sent S B"
            let nums: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|t| t.parse().ok())
                .collect();
            if let ([p_in, _, p_out, out_b, probes, gossip, state, ..], Some(all)) =
                (&nums[..], nums.last())
            {
                s.sent = Some((at, *out_b, *all));
                s.packets = (*p_in, *p_out);
                s.sent_kinds = [*probes, *gossip, *state];
            }
        }
        None
    }

    /// Take lines until `done` holds or `timeout` passes; returns when it held (the time
    /// of the latest member line taken before it did). `done` is asked after each run of
    /// lines already waiting, not after every line (a thousand nodes print a million).
    pub(super) fn until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[Seen]) -> bool,
    ) -> Option<Instant> {
        let end = Instant::now() + timeout;
        let mut last = None;
        loop {
            if done(&self.seen) {
                return Some(last.unwrap_or_else(Instant::now));
            }
            let left = end.checked_duration_since(Instant::now())?;
            if let Ok(first) = self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                self.clock = now();
                let waiting = std::iter::from_fn(|| self.rx.try_recv().ok()).take(10_000);
                let lines: Vec<_> = std::iter::once(first).chain(waiting).collect();
                for (i, at, text) in lines {
                    for l in text.lines() {
                        last = last.max(self.take(i, at, l));
                    }
                }
            }
        }
    }
}

/// Both clocks now: this process's and the host's monotonic one (in nanoseconds).
fn now() -> (Instant, u64) {
    (Instant::now(), crate::sys::monotonic_ns())
}

/// The `Instant` of `ns` on the host's monotonic clock (which `Instant` reads), given
/// `arrival`, when the line was read, and `clock`, both clocks read together before it
/// (see [`now`]): no later than the arrival.
fn node_instant(ns: u64, arrival: Instant, clock: (Instant, u64)) -> Instant {
    let ago = clock.1.saturating_sub(ns);
    clock
        .0
        .checked_sub(Duration::from_nanos(ago))
        .map_or(arrival, |t| t.min(arrival))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pipes::Pipes;
    use std::sync::mpsc::channel;

    /// A node's time a second ago is a second before now, give or take the calls between;
    /// a time not yet come (or no shared clock) is the arrival.
    #[test]
    fn a_node_time_is_placed_on_this_clock_no_later_than_its_arrival() {
        let arrival = Instant::now() + Duration::from_secs(5);
        let second_ago = crate::sys::monotonic_ns() - 1_000_000_000;
        let at = node_instant(second_ago, arrival, now());
        let ago = Instant::now() - at;
        assert!(
            ago >= Duration::from_secs(1) && ago < Duration::from_millis(1500),
            "{ago:?}"
        );
        let early = Instant::now() - Duration::from_secs(1);
        assert_eq!(
            node_instant(second_ago + 10_000_000_000, early, now()),
            early
        );
    }

    /// Member lines with and without the node's time; the time, when there, is the one
    /// the view records, and the node is full once it sees the others.
    #[test]
    fn member_lines_with_the_nodes_time_and_without() {
        let (tx, rx) = channel();
        let then = crate::sys::monotonic_ns() - 2_000_000_000;
        let _pipes = Pipes::start(tx);
        let mut lines = Lines::new(rx, 3);
        let read = Instant::now();
        let t = lines.take(0, read, &format!("member joined m001 127.0.0.1:1 1 {then}"));
        let t = t.expect("a member line");
        assert!(read - t >= Duration::from_secs(2), "{:?}", read - t);
        assert!(lines.seen[0].full_at.is_none());
        let u = lines.take(0, read, "member suspected m002 127.0.0.1:2 3");
        assert_eq!(u, Some(read));
        assert_eq!(lines.seen[0].full_at, Some(read));
        assert_eq!(lines.seen[0].alarms, (1, 0));
        assert_eq!(
            lines.take(
                0,
                read,
                "membership: in 1 packets / 2 B, out 3 packets / 4 B (1 probes, 2 gossip, 0 state); all peers: sent 5 B"
            ),
            None
        );
        assert_eq!(lines.seen[0].packets, (1, 3));
        assert_eq!(lines.seen[0].sent_kinds, [1, 2, 0]);
        // A node that lost events says so; the first one is kept.
        assert_eq!(lines.dropped, None);
        assert_eq!(lines.take(2, read, "events dropped 17"), None);
        assert_eq!(lines.take(1, read, "events dropped 3"), None);
        assert_eq!(lines.dropped, Some((2, 17)));
    }
}
