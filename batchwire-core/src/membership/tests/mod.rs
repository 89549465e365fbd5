//! The membership glue on a simulated network with a fake clock: packets take 1 ms (or a
//! random delay, and may be lost at random), links can be cut, nodes can crash (stop,
//! silently) or leave. Seeded, so every run is the same.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::*;

/// A simulated cluster of `Membership` machines.
struct Net {
    nodes: Vec<Option<Membership>>,
    now: Instant,
    start: Instant,
    /// Packets in flight: (arrival, from, to, body).
    wire: Vec<(Instant, usize, usize, Bytes)>,
    /// Links that drop everything, both ways.
    cut: HashSet<(usize, usize)>,
    /// Every event each node reported, with the time since the start.
    log: Vec<Vec<(Duration, MemberEvent)>>,
    /// Random loss and delay: (probability a packet is lost, extra delay up to this), drawn
    /// from `rng`. None: every packet arrives after `LATENCY`.
    lossy: Option<(f64, Duration)>,
    rng: SmallRng,
    /// Packets the lossy network dropped.
    lost: u64,
    /// Times each node's timers were due (what wakes its thread when nothing comes).
    timeouts: Vec<u64>,
    /// Packets that arrive in the same step reach a node as one batch
    /// (`handle_frames`, as the IO layer reads a socket's backlog).
    batched: bool,
}

const LATENCY: Duration = Duration::from_millis(1);
const STEP: Duration = Duration::from_millis(5);

fn id(i: usize, started: u64) -> MemberId {
    MemberId {
        name: Name::new(&format!("n{i:02}")).unwrap(),
        addr: SocketAddr::from(([10, 0, 0, i as u8], 7000)),
        started,
        bump: 0,
    }
}

fn cfg() -> MembershipConfig {
    MembershipConfig {
        announce_period: Duration::from_secs(2),
        ..MembershipConfig::default()
    }
}

impl Net {
    /// `n` nodes, each alone.
    fn new(n: usize, cfg: MembershipConfig) -> Net {
        let now = Instant::now();
        let nodes = (0..n)
            .map(|i| Some(Membership::new(id(i, 1), cfg.clone(), 7 + i as u64, now).unwrap()))
            .collect();
        Net {
            nodes,
            now,
            start: now,
            wire: Vec::new(),
            cut: HashSet::new(),
            log: vec![Vec::new(); n],
            lossy: None,
            rng: SmallRng::seed_from_u64(0),
            lost: 0,
            timeouts: vec![0; n],
            batched: false,
        }
    }

    /// `n` nodes joined through node 0, converged, with every update gossiped its number
    /// of times (nothing left to gossip).
    fn at_rest(n: usize, cfg: MembershipConfig) -> Net {
        let mut net = Net::new(n, cfg);
        net.join_all_through_0();
        net.run_until(Duration::from_secs(10), Net::converged)
            .expect("converged");
        net.run_until(Duration::from_secs(30), |n| {
            n.nodes
                .iter()
                .flatten()
                .all(|m| m.foca.updates_backlog() == 0)
        })
        .expect("gossip drained");
        net
    }

    /// From now on every packet is lost with probability `loss`, and the others take
    /// `LATENCY` plus a uniform random delay up to `jitter` (so they may overtake each
    /// other); seeded.
    fn lossy(mut self, seed: u64, loss: f64, jitter: Duration) -> Net {
        self.lossy = Some((loss, jitter));
        self.rng = SmallRng::seed_from_u64(seed);
        self
    }

    fn node(&mut self, i: usize) -> &mut Membership {
        self.nodes[i].as_mut().expect("node is running")
    }

    /// Every node joins through node 0 (as the IO layer does once its handshake with the
    /// seed's address told it the seed's id).
    fn join_all_through_0(&mut self) {
        let seed = self.node(0).me().clone();
        let now = self.now;
        for i in 1..self.nodes.len() {
            self.node(i).handle_join(now, seed.clone());
        }
        self.collect();
    }

    fn index(&self, name: &Name) -> Option<usize> {
        // Every name is `id(i)`'s: n and the index (no search, for the large clusters).
        let i: usize = name.as_str().strip_prefix('n')?.parse().ok()?;
        self.nodes
            .get(i)?
            .as_ref()
            .is_some_and(|m| m.me().name == *name)
            .then_some(i)
    }

    /// Take every node's packets and events.
    fn collect(&mut self) {
        let t = self.now - self.start;
        for i in 0..self.nodes.len() {
            let Some(m) = self.nodes[i].as_mut() else {
                continue;
            };
            let mut sends = Vec::new();
            while let Some(s) = m.poll_transmit() {
                sends.push(s);
            }
            while let Some(e) = m.poll_event() {
                self.log[i].push((t, e));
            }
            for (to, body) in sends {
                let mut delay = LATENCY;
                if let Some((loss, jitter)) = self.lossy {
                    use rand::RngExt;
                    if self.rng.random_bool(loss) {
                        self.lost += 1;
                        continue;
                    }
                    let extra = self.rng.random_range(0..=jitter.as_micros() as u64);
                    delay += Duration::from_micros(extra);
                }
                if let Some(j) = self.index(&to.name) {
                    self.wire.push((self.now + delay, i, j, body));
                }
            }
        }
    }

    /// Advance the clock by one step: deliver what arrived, fire timers.
    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        // The view is checked against SWIM's list after every packet input in small
        // networks (each check walks the list; the thousand-node runs measure CPU).
        let small = self.nodes.len() <= 64;
        let (due, later): (Vec<_>, Vec<_>) = self.wire.drain(..).partition(|w| w.0 <= now);
        self.wire = later;
        let mut batches: Vec<Vec<(Name, Bytes)>> = vec![Vec::new(); self.nodes.len()];
        for (_, from, to, body) in due {
            if self.cut.contains(&(from, to)) || self.cut.contains(&(to, from)) {
                continue;
            }
            let Some(name) = self.nodes[from].as_ref().map(|m| m.me().name.clone()) else {
                continue;
            };
            if self.batched {
                batches[to].push((name, body));
            } else if let Some(m) = self.nodes[to].as_mut() {
                m.handle_frame(now, &name, &body).expect("valid packet");
                check_view(m, small);
            }
        }
        for (to, batch) in batches.iter().enumerate() {
            if let Some(m) = self.nodes[to].as_mut().filter(|_| !batch.is_empty()) {
                let frames = batch.iter().map(|(n, b)| (n, &b[..]));
                m.handle_frames(now, frames, |from, e| panic!("{from}: {e}"));
                check_view(m, small);
            }
        }
        for (m, n) in self.nodes.iter_mut().zip(&mut self.timeouts) {
            if let Some(m) = m
                && m.poll_timeout().is_some_and(|t| t <= now)
            {
                *n += 1;
                m.handle_timeout(now);
            }
        }
        self.collect();
    }

    /// Step until `cond` holds or `limit` of simulated time passes; returns the time taken.
    fn run_until(
        &mut self,
        limit: Duration,
        mut cond: impl FnMut(&Net) -> bool,
    ) -> Option<Duration> {
        let from = self.now;
        while self.now - from < limit {
            if cond(self) {
                return Some(self.now - from);
            }
            self.step();
        }
        cond(self).then(|| self.now - from)
    }

    /// Whether node `i` sees member `j` in `state`.
    fn sees(&self, i: usize, j: &Name, state: MemberState) -> bool {
        self.nodes[i]
            .as_ref()
            .is_some_and(|m| m.state_of(j.as_bytes()).is_some_and(|(_, s)| s == state))
    }

    /// Whether every running node sees every other running node alive.
    fn converged(&self) -> bool {
        let names: Vec<Name> = self
            .nodes
            .iter()
            .flatten()
            .map(|m| m.me().name.clone())
            .collect();
        self.nodes.iter().flatten().all(|m| {
            names.iter().filter(|n| **n != m.me().name).all(|n| {
                m.state_of(n.as_bytes())
                    .is_some_and(|(_, s)| s == MemberState::Alive)
            })
        })
    }

    fn all_running_see(&self, j: &Name, state: MemberState) -> bool {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_some())
            .all(|i| self.sees(i, j, state))
    }

    /// How many members node `i` sees alive.
    fn alive_seen_by(&self, i: usize) -> usize {
        self.nodes[i]
            .as_ref()
            .expect("node is running")
            .members()
            .iter()
            .filter(|m| m.1 == MemberState::Alive)
            .count()
    }

    /// Nodes `from..to` join through node 0, now.
    fn join_through_0(&mut self, from: usize, to: usize) {
        let seed = self.node(0).me().clone();
        let now = self.now;
        for i in from..to {
            self.node(i).handle_join(now, seed.clone());
        }
        self.collect();
    }

    fn events_of(&self, i: usize) -> Vec<MemberEvent> {
        self.log[i].iter().map(|(_, e)| e.clone()).collect()
    }
}

mod adversity;
mod details;
mod filter;
mod join_and_failure;
mod push_pull;

/// After packets, the view says what SWIM's list says of every live member it lists (see
/// `Membership::view_disagrees`): a pass that looks only at the members the packets named
/// (`Walk::Named`) must miss nothing a walk of the whole list would find.
fn check_view(m: &Membership, on: bool) {
    if on && let Some(e) = m.view_disagrees() {
        panic!("{e}");
    }
}
