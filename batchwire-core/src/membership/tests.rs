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
            }
        }
        for (to, batch) in batches.iter().enumerate() {
            if let Some(m) = self.nodes[to].as_mut().filter(|_| !batch.is_empty()) {
                let frames = batch.iter().map(|(n, b)| (n, &b[..]));
                m.handle_frames(now, frames, |from, e| panic!("{from}: {e}"));
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

#[test]
fn eight_nodes_join_through_one_seed_and_converge() {
    let mut net = Net::new(8, cfg());
    net.join_all_through_0();
    let t = net.run_until(Duration::from_secs(10), Net::converged);
    let t = t.expect("every node sees every other within 10 s");
    assert!(t < Duration::from_secs(3), "converged in {t:?}");
    // Each node reported each other one joined, once.
    for i in 0..8 {
        let joined = net
            .events_of(i)
            .iter()
            .filter(|e| matches!(e, MemberEvent::Joined(_)))
            .count();
        assert_eq!(joined, 7, "node {i}: {:?}", net.events_of(i));
    }
    // At rest nothing is suspected for a while.
    net.run_until(Duration::from_secs(20), |_| false);
    for i in 0..8 {
        assert!(
            !net.events_of(i)
                .iter()
                .any(|e| matches!(e, MemberEvent::Suspected(_))),
            "node {i} suspected someone at rest: {:?}",
            net.events_of(i)
        );
    }
    // Each update reached each node more than once; the copies were taken out before foca
    // saw them (see `Membership::without_old_news`).
    for i in 0..8 {
        assert!(net.node(i).counters().old_news > 0, "node {i}");
    }
}

#[test]
fn batched_reads_converge_report_each_change_once_and_detect_a_crash() {
    // Packets of a step reach a node together: SWIM's list is compared once per batch,
    // and the same update from several senders in a batch is old news after the first.
    // Sixteen nodes with a 5 ms step make batches of several packets during the join.
    let c = cfg();
    let n = 16;
    let mut net = Net::new(n, c.clone());
    net.batched = true;
    net.join_all_through_0();
    let t = net
        .run_until(Duration::from_secs(10), Net::converged)
        .expect("converged");
    assert!(t < Duration::from_secs(3), "converged in {t:?}");
    for i in 0..n {
        let joined = net
            .events_of(i)
            .iter()
            .filter(|e| matches!(e, MemberEvent::Joined(_)))
            .count();
        assert_eq!(joined, n - 1, "node {i}: {:?}", net.events_of(i));
        let mut view = net.node(i).members();
        assert_eq!(view.len(), n - 1);
        view.retain(|m| m.1 != MemberState::Alive);
        assert!(view.is_empty(), "node {i}: {view:?}");
        assert!(net.node(i).counters().old_news > 0, "node {i}");
    }
    let victim = net.node(7).me().name.clone();
    net.nodes[7] = None;
    let t = net
        .run_until(Duration::from_secs(30), |n| {
            n.all_running_see(&victim, MemberState::Down)
        })
        .expect("every survivor sees the crash");
    // As unbatched (8 s with this seed): sixteen members take a few rounds to probe it.
    assert!(t <= c.suspicion_timeout + 6 * c.probe_period, "{t:?}");
    for i in (0..n).filter(|i| *i != 7) {
        let ev = net.events_of(i);
        let about = |e: &&MemberEvent| match e {
            MemberEvent::Suspected(m) | MemberEvent::Down(m) => m.name != victim,
            _ => false,
        };
        assert!(!ev.iter().any(|e| about(&e)), "node {i}: {ev:?}");
    }
}

/// A SWIM gossip packet from `from` to `to` carrying `updates`, as foca lays one out.
fn gossip(from: &Membership, to: &Membership, updates: &[Member<MemberId>]) -> Vec<u8> {
    let mut b = vec![TAG_SWIM];
    let h = foca::Header {
        src: from.me().clone(),
        // What the receiver holds of the sender's incarnation.
        src_incarnation: to.swim.get(&from.me().name).map_or(0, |s| s.1),
        dst: to.me().clone(),
        message: foca::Message::Gossip,
    };
    PostcardCodec.encode_header(&h, &mut b).unwrap();
    b.extend_from_slice(&(updates.len() as u16).to_be_bytes());
    for u in updates {
        PostcardCodec.encode_member(u, &mut b).unwrap();
    }
    b
}

#[test]
fn in_a_batch_a_repeated_update_is_old_news_and_a_newer_one_is_not() {
    let mut net = Net::at_rest(4, cfg());
    let x = net.node(3).me().clone();
    let inc = net.node(0).swim.get(&x.name).expect("known").1;
    let suspect = Member::new(x.clone(), inc, State::Suspect);
    let refuted = Member::new(x.clone(), inc + 1, State::Alive);
    let (n1, n2) = (net.node(1).me().name.clone(), net.node(2).me().name.clone());
    let (a, b, c) = (
        net.nodes[0].as_ref().unwrap(),
        net.nodes[1].as_ref().unwrap(),
        net.nodes[2].as_ref().unwrap(),
    );
    // The same suspicion from two members, then its refutation, in one batch.
    let f1 = gossip(b, a, std::slice::from_ref(&suspect));
    let f2 = gossip(c, a, std::slice::from_ref(&suspect));
    let f3 = gossip(b, a, std::slice::from_ref(&refuted));
    let now = net.now;
    let a = net.node(0);
    let old = a.counters().old_news;
    let frames = [(&n1, &f1[..]), (&n2, &f2[..]), (&n1, &f3[..])];
    a.handle_frames(now, frames, |from, e| panic!("{from}: {e}"));
    assert_eq!(
        a.counters().old_news - old,
        1,
        "the second copy of the suspicion"
    );
    // The refutation was news: SWIM holds the member alive at its new incarnation.
    assert_eq!(
        a.swim.get(&x.name),
        Some(&(x.clone(), inc + 1, State::Alive)),
        "the refutation in the same batch was dropped"
    );
    assert_eq!(
        a.state_of(x.name.as_bytes()).map(|v| v.1),
        Some(MemberState::Alive)
    );
}

#[test]
fn a_crashed_node_is_declared_down_by_every_survivor() {
    let c = cfg();
    let mut net = Net::new(8, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let victim = net.node(5).me().name.clone();
    net.nodes[5] = None;
    // SWIM alone: found by a probe, suspected, then down after the suspicion timeout.
    let t = net
        .run_until(Duration::from_secs(30), |n| {
            n.all_running_see(&victim, MemberState::Down)
        })
        .expect("every survivor sees the crash");
    // Someone probes it within a few periods; then the probe round and the suspicion.
    assert!(
        t <= c.suspicion_timeout + 4 * c.probe_period,
        "detected after {t:?}"
    );
    for i in (0..8).filter(|i| *i != 5) {
        let ev = net.events_of(i);
        assert!(
            ev.iter()
                .any(|e| matches!(e, MemberEvent::Down(m) if m.name == victim))
        );
        assert!(!ev.iter().any(|e| matches!(e, MemberEvent::Left(_))));
    }
}

/// Every member that hears of a suspicion keeps its own deadline (SWIM's paper): the
/// survivors declare a crashed node down within the suspicion timeout of hearing of the
/// suspicion, not after the first one's verdict spread too.
#[test]
fn every_member_that_hears_of_a_suspicion_declares_down_at_its_own_deadline() {
    let c = cfg();
    let n = 24;
    let mut net = Net::new(n, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(20), Net::converged)
        .unwrap();
    let victim = net.node(7).me().name.clone();
    net.nodes[7] = None;
    net.run_until(Duration::from_secs(30), |n| {
        n.all_running_see(&victim, MemberState::Down)
    })
    .expect("every survivor sees the crash");
    // For each survivor: when it first heard of the suspicion and when it said down.
    let mut late = Vec::new();
    for i in (0..n).filter(|i| *i != 7) {
        let suspected = net.log[i].iter().find_map(|(t, e)| {
            matches!(e, MemberEvent::Suspected(m) if m.name == victim).then_some(*t)
        });
        let down = net.log[i]
            .iter()
            .find_map(|(t, e)| matches!(e, MemberEvent::Down(m) if m.name == victim).then_some(*t));
        if let (Some(s), Some(d)) = (suspected, down) {
            // At its own deadline (a step of slack), not later.
            if d > s + c.suspicion_timeout + STEP {
                late.push((i, d - s));
            }
        }
    }
    assert!(late.is_empty(), "declared down late: {late:?}");
}

#[test]
fn the_transports_hint_makes_detection_take_the_suspicion_timeout() {
    let c = cfg();
    let mut net = Net::new(8, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let victim = net.node(3).me().name.clone();
    net.nodes[3] = None;
    // The node that dials it finds its connection refused at once.
    let now = net.now;
    net.node(0).handle_unreachable(now, victim.as_bytes());
    net.collect();
    let t = net
        .run_until(Duration::from_secs(30), |n| {
            n.all_running_see(&victim, MemberState::Down)
        })
        .unwrap();
    assert!(
        t <= c.suspicion_timeout + c.probe_period,
        "detected after {t:?}"
    );
}

#[test]
fn a_suspicion_is_refuted_by_a_live_member() {
    let mut net = Net::new(6, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let target = net.node(2).me().name.clone();
    // A transport hiccup: node 0 suspects node 2, which is alive.
    let now = net.now;
    net.node(0).handle_unreachable(now, target.as_bytes());
    net.collect();
    net.run_until(Duration::from_secs(15), |_| false);
    for i in [0, 1, 3, 4, 5] {
        assert!(net.sees(i, &target, MemberState::Alive), "node {i}");
        assert!(
            !net.events_of(i)
                .iter()
                .any(|e| matches!(e, MemberEvent::Down(m) if m.name == target)),
            "node {i} declared a live member down"
        );
    }
    let ev = net.events_of(0);
    assert!(
        ev.iter()
            .any(|e| matches!(e, MemberEvent::Suspected(m) if m.name == target))
    );

    assert!(
        ev.iter()
            .any(|e| matches!(e, MemberEvent::Refuted(m) if m.name == target))
    );
}

#[test]
fn a_leave_is_told_apart_from_a_crash() {
    let mut net = Net::new(6, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let (leaver, crasher) = (net.node(4).me().name.clone(), net.node(5).me().name.clone());
    let now = net.now;
    net.node(4).handle_leave(now);
    net.collect();
    // Its last packets go out; then it stops.
    net.step();
    net.nodes[4] = None;
    net.nodes[5] = None;
    let t = net
        .run_until(Duration::from_secs(30), |n| {
            n.all_running_see(&leaver, MemberState::Left)
                && n.all_running_see(&crasher, MemberState::Down)
        })
        .expect("the leave and the crash are both seen");
    for i in 0..4 {
        let ev = net.events_of(i);
        assert!(
            ev.iter()
                .any(|e| matches!(e, MemberEvent::Left(m) if m.name == leaver))
        );
        assert!(
            !ev.iter()
                .any(|e| matches!(e, MemberEvent::Suspected(m) if m.name == leaver))
        );
        assert!(
            ev.iter()
                .any(|e| matches!(e, MemberEvent::Down(m) if m.name == crasher))
        );
    }
    // The leave is seen at once, long before the crash.
    let left_at = net.log[0]
        .iter()
        .find(|(_, e)| matches!(e, MemberEvent::Left(_)))
        .unwrap()
        .0;
    let down_at = net.log[0]
        .iter()
        .find(|(_, e)| matches!(e, MemberEvent::Down(_)))
        .unwrap()
        .0;
    assert!(
        left_at < down_at,
        "left {left_at:?}, down {down_at:?} (run {t:?})"
    );
}

#[test]
fn a_partition_heals() {
    let mut net = Net::new(6, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    for a in 0..3 {
        for b in 3..6 {
            net.cut.insert((a, b));
        }
    }
    let far = net.node(4).me().name.clone();
    net.run_until(Duration::from_secs(30), |n| {
        n.sees(0, &far, MemberState::Down)
    })
    .expect("each side declares the other down");
    net.cut.clear();
    net.run_until(Duration::from_secs(60), Net::converged)
        .expect("after the heal every node sees every other alive again");
}

#[test]
fn a_restarted_node_joins_as_a_new_incarnation() {
    let mut net = Net::new(5, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let old = net.node(3).me().clone();
    // Killed and started again at once, under the same name, later start time.
    let now = net.now;
    net.nodes[3] = Some(Membership::new(id(3, 2), cfg(), 99, now).unwrap());
    let seed = net.node(0).me().clone();
    net.node(3).handle_join(now, seed);
    net.collect();
    net.run_until(Duration::from_secs(20), |n| {
        (0..5).filter(|i| *i != 3).all(|i| {
            n.nodes[i]
                .as_ref()
                .unwrap()
                .state_of(old.name.as_bytes())
                .is_some_and(|(m, s)| m.started == 2 && s == MemberState::Alive)
        })
    })
    .expect("everyone sees the new incarnation");
    for i in [0, 1, 2, 4] {
        let ev = net.events_of(i);
        let joined_new = ev
            .iter()
            .any(|e| matches!(e, MemberEvent::Joined(m) if m.name == old.name && m.started == 2));
        assert!(joined_new, "node {i}: {ev:?}");
    }
}

#[test]
fn packets_that_break_the_rules_are_refused() {
    let now = Instant::now();
    let mut a = Membership::new(id(0, 1), cfg(), 1, now).unwrap();
    let mut b = Membership::new(id(1, 1), cfg(), 2, now).unwrap();
    b.handle_join(now, a.me().clone());
    let (_, announce) = b.poll_transmit().unwrap();
    let mallory = Name::new("mallory").unwrap();
    // From a connection that is not the sender named inside.
    assert!(matches!(
        a.handle_frame(now, &mallory, &announce),
        Err(MemberError::Impersonation { .. })
    ));
    assert!(a.members().is_empty(), "nothing was learnt from it");
    let from = b.me().name.clone();
    assert!(matches!(
        a.handle_frame(now, &from, &[]),
        Err(MemberError::Empty)
    ));
    assert!(matches!(
        a.handle_frame(now, &from, &[9, 1]),
        Err(MemberError::UnknownTag(9))
    ));
    assert!(matches!(
        a.handle_frame(now, &from, &[0, 0xff, 0xff, 0xff]),
        Err(MemberError::Malformed(_))
    ));
    let mut big = vec![0u8; MAX_PACKET + 2];
    big[0] = TAG_SWIM;
    assert!(matches!(
        a.handle_frame(now, &from, &big),
        Err(MemberError::TooLarge { .. })
    ));
    assert!(matches!(
        a.handle_frame(now, &from, &[TAG_LEAVE, 1]),
        Err(MemberError::Malformed(_))
    ));
    // The real announce is taken.
    a.handle_frame(now, &from, &announce).unwrap();
    assert_eq!(a.members().len(), 1);
    // A flood in one instant: past the rate, packets are dropped and counted.
    for _ in 0..1000 {
        a.handle_frame(now, &from, &announce).unwrap();
    }
    let c = a.counters();
    assert!(c.rate_limited >= 1000 - 200, "{c:?}");
    // Everything queued in answer is bounded by the packets admitted.
    let mut answers = 0;
    while a.poll_transmit().is_some() {
        answers += 1;
    }
    assert!(answers <= 201, "{answers} answers");
}

#[test]
fn bad_settings_are_refused() {
    let now = Instant::now();
    let c = MembershipConfig {
        probe_rtt: Duration::from_secs(2),
        ..MembershipConfig::default()
    };
    assert!(matches!(
        Membership::new(id(0, 1), c, 1, now),
        Err(MemberError::Config(_))
    ));
}

/// Two members over a link that breaks every 200 ms for 20-80 ms (what is in flight or
/// sent meanwhile is lost), as `ss -K` from outside does to a TCP connection; on half the
/// breaks each side's dialer reports the other unreachable, and each reconnect is a
/// completed handshake.
fn flapping(seed: u64) -> Net {
    use rand::RngExt;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut net = Net::new(2, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let names = [net.node(0).me().name.clone(), net.node(1).me().name.clone()];
    for _ in 0..300 {
        net.cut.insert((0, 1));
        net.wire.clear();
        let now = net.now;
        for i in 0..2 {
            if rng.random_bool(0.5) {
                net.node(i).handle_unreachable(now, names[1 - i].as_bytes());
            }
        }
        net.collect();
        let down = rng.random_range(20..80u64);
        net.run_until(Duration::from_millis(down), |_| false);
        net.cut.clear();
        let now = net.now;
        for i in 0..2 {
            net.node(i).handle_heard(now, &names[1 - i], 1);
        }
        net.run_until(Duration::from_millis(200 - down), |_| false);
    }
    net
}

#[test]
fn a_member_whose_link_keeps_breaking_is_never_declared_down() {
    let c = cfg();
    for seed in 0..20u64 {
        let mut net = flapping(seed);
        for i in 0..2 {
            let downs: Vec<_> = net.log[i]
                .iter()
                .filter(|e| matches!(e.1, MemberEvent::Down(_)))
                .collect();
            assert!(downs.is_empty(), "seed {seed} node {i}: {downs:?}");
        }
        // Once the link holds, every suspicion is refuted.
        assert!(
            net.run_until(Duration::from_secs(10), Net::converged)
                .is_some(),
            "seed {seed}: {:?} / {:?}",
            net.node(0).members(),
            net.node(1).members()
        );
        // A member that is really gone is still found down in time: node 1 crashes, node
        // 0's dialer finds it unreachable.
        let victim = net.node(1).me().name.clone();
        net.nodes[1] = None;
        let now = net.now;
        net.node(0).handle_unreachable(now, victim.as_bytes());
        net.collect();
        let t = net
            .run_until(Duration::from_secs(30), |n| {
                n.sees(0, &victim, MemberState::Down)
            })
            .expect("the crashed member is declared down");
        assert!(
            t <= c.suspicion_timeout + c.probe_period,
            "seed {seed}: detected after {t:?}"
        );
    }
}

#[test]
fn a_refuted_suspicion_tells_the_member_nothing() {
    // Two members: a link cut for longer than a probe period makes node 0's probe of node 1
    // fail (there is no one to probe through), so node 0 suspects it; the link heals and
    // node 1 refutes. When the suspicion's timer fires, foca would still send node 1 "you
    // are down", and node 1 would rejoin under a new identity (which node 0 saw as the old
    // one going down). The notice is not sent.
    let c = cfg();
    let mut net = Net::new(2, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let target = net.node(1).me().name.clone();
    net.cut.insert((0, 1));
    net.run_until(Duration::from_secs(3), |n| {
        n.sees(0, &target, MemberState::Suspect)
    })
    .expect("node 0 suspects node 1");
    net.cut.clear();
    net.run_until(Duration::from_secs(2), |n| {
        n.sees(0, &target, MemberState::Alive)
    })
    .expect("node 1 refutes");
    net.run_until(c.suspicion_timeout + c.probe_period, |_| false);
    assert_eq!(net.node(0).counters().stale_down_notices, 1);
    assert_eq!(net.node(1).me().bump, 0, "node 1 was told it was down");
    assert!(
        !net.events_of(0)
            .iter()
            .any(|e| matches!(e, MemberEvent::Down(_))),
        "{:?}",
        net.events_of(0)
    );
}

/// Members past `max_members` (invented ones, or a cluster larger than configured) are
/// never reported, so the IO layer never dials them or makes peers for them; each is
/// counted once however often SWIM mentions it.
#[test]
fn members_past_the_limit_are_never_reported_and_counted_once() {
    let cfg = MembershipConfig {
        max_members: 4,
        ..cfg()
    };
    let mut net = Net::new(10, cfg);
    net.join_all_through_0();
    // Ten seconds of probes, gossip and periodic announces: every node hears of the nine
    // others again and again.
    net.run_until(Duration::from_secs(10), |_| false);
    for i in 0..10 {
        let m = net.nodes[i].as_ref().unwrap();
        assert!(m.members().len() <= 4, "node {i}: {:?}", m.members());
        let joined: Vec<Name> = net
            .events_of(i)
            .into_iter()
            .filter_map(|e| match e {
                MemberEvent::Joined(id) => Some(id.name),
                _ => None,
            })
            .collect();
        let distinct: HashSet<&Name> = joined.iter().collect();
        assert!(
            distinct.len() <= 4,
            "node {i} reported {} members joined: {joined:?}",
            distinct.len()
        );
        // Every name it reported is in its view (nothing announced past the limit).
        for n in &distinct {
            assert!(
                m.state_of(n.as_bytes()).is_some(),
                "node {i}: {n} reported, not kept"
            );
        }
        let c = m.counters();
        // Five others at least were refused, each once (nine names at most, not once per
        // packet or timer).
        assert!(
            (5..=9).contains(&c.members_refused),
            "node {i}: {} refusals",
            c.members_refused
        );
    }
}

#[test]
fn an_absurd_member_limit_is_refused_not_overflowed() {
    let mut c = cfg();
    c.max_members = usize::MAX;
    let e = Membership::new(id(0, 1), c, 1, Instant::now())
        .err()
        .unwrap();
    assert!(e.to_string().contains("max_members"), "{e}");
}

/// Random loss and delay (seeded): 8 nodes, 10 % or 25 % of packets lost and up to 40 ms
/// of extra delay each (reordering them), for a simulated minute: no live member is ever
/// declared down (suspicions, hundreds at 25 %, are refuted in time). Then one crashes, found by the transport as the
/// IO layer does (its connections fail at every peer), and every survivor sees it down
/// within the suspicion timeout plus one probe period: the guide's claim, under loss.
#[test]
fn under_random_loss_and_delay_no_live_member_is_declared_down_and_a_dead_one_is() {
    let c = cfg();
    // Each seed twice: packets one at a time, and as batches (`handle_frames`; with up
    // to 40 ms of jitter, a suspicion and its refutation can come in one batch).
    for (seed, batched) in (0..8).flat_map(|s| [(s, false), (s, true)]) {
        let loss = if seed % 2 == 0 { 0.10 } else { 0.25 };
        let mut net = Net::new(8, c.clone()).lossy(seed, loss, Duration::from_millis(40));
        net.batched = batched;
        net.join_all_through_0();
        if net
            .run_until(Duration::from_secs(20), Net::converged)
            .is_none()
        {
            for i in 0..8 {
                let v: Vec<_> = (0..8)
                    .filter(|j| *j != i)
                    .map(|j| {
                        let n = id(j, 1).name;
                        net.nodes[i]
                            .as_ref()
                            .unwrap()
                            .state_of(n.as_bytes())
                            .map(|(_, s)| s)
                    })
                    .collect();
                eprintln!("node {i}: {v:?} events {:?}", net.events_of(i));
            }
            panic!("seed {seed}: never converged");
        }
        net.run_until(Duration::from_secs(60), |_| false);
        for i in 0..8 {
            let downs: Vec<_> = net.log[i]
                .iter()
                .filter(|(_, e)| matches!(e, MemberEvent::Down(_) | MemberEvent::Left(_)))
                .collect();
            assert!(downs.is_empty(), "seed {seed}: node {i} declared {downs:?}");
        }
        assert!(
            net.lost > 100,
            "seed {seed}: only {} packets lost",
            net.lost
        );
        let suspected: usize = (0..8)
            .map(|i| {
                net.log[i]
                    .iter()
                    .filter(|(_, e)| matches!(e, MemberEvent::Suspected(_)))
                    .count()
            })
            .sum();
        eprintln!(
            "seed {seed}, loss {loss}: {} packets lost in a minute, {suspected} suspicions, all refuted",
            net.lost
        );
        // A crash.
        let victim = net.node(5).me().name.clone();
        net.nodes[5] = None;
        let now = net.now;
        for i in (0..8).filter(|i| *i != 5) {
            net.node(i).handle_unreachable(now, victim.as_bytes());
        }
        net.collect();
        let t = net
            .run_until(c.suspicion_timeout + c.probe_period, |n| {
                n.all_running_see(&victim, MemberState::Down)
            })
            .unwrap_or_else(|| panic!("seed {seed}: the crash was not seen by all in time"));
        eprintln!("seed {seed}: crash seen by all after {t:?}");
        // And nobody else went down meanwhile.
        for i in (0..8).filter(|i| *i != 5) {
            assert!(
                !net.log[i].iter().any(
                    |(_, e)| matches!(e, MemberEvent::Down(m) | MemberEvent::Left(m) if m.name != victim)
                ),
                "seed {seed}: node {i}"
            );
        }
    }
}

/// A joining node whose announce is lost (or whose seed's answer is) announces itself
/// again each probe period while it is alone, and stops once it is in.
#[test]
fn a_lost_join_is_announced_again_until_it_is_answered() {
    let c = cfg();
    let mut net = Net::new(2, c.clone());
    net.cut.insert((0, 1));
    net.join_all_through_0();
    net.run_until(c.probe_period * 3 + STEP, |_| false);
    assert!(net.node(1).is_alone());
    let tries = net.node(1).counters().rejoins;
    assert_eq!(tries, 3, "once a probe period");
    net.cut.clear();
    let t = net
        .run_until(c.probe_period * 2, Net::converged)
        .expect("joined once the link works");
    assert!(t <= c.probe_period + STEP, "{t:?}");
    net.run_until(c.probe_period * 5, |_| false);
    assert!(
        net.node(1).counters().rejoins <= tries + 1,
        "no more announces once in"
    );
}

/// The suspicion timeout on the fake clock: a member the transport reports unreachable
/// at t0 is suspect until t0 + suspicion_timeout and down at that moment, not a step
/// before; a member that refutes in time is never down.
#[test]
fn a_suspicion_ends_in_down_at_its_timeout_not_before() {
    let c = cfg();
    let mut net = Net::new(3, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let victim = net.node(2).me().name.clone();
    net.nodes[2] = None;
    let t0 = net.now;
    net.node(0).handle_unreachable(t0, victim.as_bytes());
    net.collect();
    assert!(net.sees(0, &victim, MemberState::Suspect));
    while net.now + STEP < t0 + c.suspicion_timeout {
        net.step();
        assert!(
            net.sees(0, &victim, MemberState::Suspect),
            "{:?} after the hint, {:?} before the timeout",
            net.now - t0,
            c.suspicion_timeout
        );
    }
    net.step();
    assert_eq!(net.now - t0, c.suspicion_timeout);
    assert!(
        net.sees(0, &victim, MemberState::Down),
        "down at the timeout"
    );
    // A live member suspected the same way refutes within the timeout: never down.
    let mut net = Net::new(3, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let live = net.node(2).me().name.clone();
    let t0 = net.now;
    net.node(0).handle_unreachable(t0, live.as_bytes());
    net.collect();
    net.run_until(c.suspicion_timeout * 3, |_| false);
    assert!(net.sees(0, &live, MemberState::Alive) && net.sees(1, &live, MemberState::Alive));
    assert!(!(0..3).any(|i| {
        net.events_of(i)
            .iter()
            .any(|e| matches!(e, MemberEvent::Down(_)))
    }));
}

// ---- found by cargo-mutants: rules the tests above did not pin ----

/// Every packet counted once on each side: when the wire is quiet, what all nodes sent
/// (packets and bytes) is what all nodes received.
#[test]
fn packets_and_bytes_are_counted_once_on_each_side() {
    let mut net = Net::new(4, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    net.run_until(Duration::from_secs(5), |_| false);
    net.run_until(Duration::from_secs(1), |n| n.wire.is_empty());
    let sum = |f: fn(&MemberCounters) -> u64| -> u64 {
        net.nodes.iter().flatten().map(|m| f(&m.counters())).sum()
    };
    let (pin, pout) = (sum(|c| c.packets_in), sum(|c| c.packets_out));
    let (bin, bout) = (sum(|c| c.bytes_in), sum(|c| c.bytes_out));
    assert!(pin > 20 && bin > 20 * pin.min(10), "{pin} {bin}");
    assert_eq!((pin, bin), (pout, bout));
    assert_eq!(sum(|c| c.rate_limited), 0);
}

/// Each peer gets `frames_per_second` packets at once and then that many a second: the
/// rest is counted and dropped, not read.
#[test]
fn packets_past_a_peers_rate_are_counted_and_dropped() {
    let mut c = cfg();
    c.frames_per_second = 5;
    let mut net = Net::new(2, c);
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    // A packet n1 really sent, replayed.
    let t = net.now + Duration::from_secs(2);
    let from = net.node(1).me().name.clone();
    net.node(1).handle_leave(t);
    let (_, body) = net.node(1).poll_transmit().unwrap();
    let m = net.node(0);
    let before = m.counters();
    for _ in 0..12 {
        let _ = m.handle_frame(t, &from, &body);
    }
    let after = m.counters();
    assert_eq!(after.rate_limited - before.rate_limited, 7, "5 of 12 read");
    assert_eq!(after.packets_in - before.packets_in, 5);
    // A second later, five more.
    let t = t + Duration::from_secs(1);
    for _ in 0..6 {
        let _ = m.handle_frame(t, &from, &body);
    }
    assert_eq!(m.counters().packets_in - after.packets_in, 5);
}

/// Getters, and the packet size bound exactly: `MAX_PACKET` bytes are read, one more is
/// refused.
#[test]
fn the_view_size_refusals_settings_and_the_packet_bound() {
    let mut c = cfg();
    c.max_members = 2;
    let mut net = Net::new(4, c);
    assert_eq!(net.node(0).view_len(), 0);
    assert_eq!(net.node(0).config().max_members, 2);
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), |_| false);
    let m = net.node(0);
    assert_eq!(m.view_len(), 2);
    let refused: Vec<_> = (1..4)
        .filter(|i| m.is_refused(id(*i, 1).name.as_bytes()))
        .collect();
    assert_eq!(refused.len(), 1, "one of three had no room");
    assert!(!m.is_refused(b"n77"), "never heard of");
    let t = net.now;
    let from = Name::new("n01").unwrap();
    let mut body = vec![0u8; 1 + MAX_PACKET];
    assert!(!matches!(
        net.node(0).handle_frame(t, &from, &body),
        Err(MemberError::TooLarge { .. })
    ));
    body.push(0);
    assert!(matches!(
        net.node(0).handle_frame(t, &from, &body),
        Err(MemberError::TooLarge { .. })
    ));
}

/// A leave notice, and a transport's "unreachable", are about the member named and no
/// other.
#[test]
fn a_leave_or_an_unreachable_hint_touches_only_its_member() {
    let mut net = Net::new(3, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let (n1, n2) = (id(1, 1).name, id(2, 1).name);
    let t = net.now;
    net.node(0).handle_unreachable(t, n2.as_bytes());
    assert!(net.sees(0, &n2, MemberState::Suspect));
    assert!(net.sees(0, &n1, MemberState::Alive));
    net.node(0).handle_frame(t, &n1, &[1]).unwrap();
    assert!(
        net.sees(0, &n1, MemberState::Left),
        "{:?}",
        net.node(0).members()
    );
    assert!(net.sees(0, &n2, MemberState::Suspect));
}

/// A seed given twice is announced to once per round; every distinct seed is.
#[test]
fn a_lonely_node_announces_to_each_seed_once_a_round() {
    let c = cfg();
    let mut net = Net::new(3, c.clone());
    let (s0, s1) = (net.node(0).me().clone(), net.node(1).me().clone());
    let t = net.now;
    let m = net.node(2);
    m.handle_join(t, s0.clone());
    m.handle_join(t, s1.clone());
    m.handle_join(t, s0.clone());
    while m.poll_transmit().is_some() {}
    m.handle_timeout(t + c.probe_period);
    let mut to: Vec<_> = std::iter::from_fn(|| m.poll_transmit())
        .map(|(who, _)| who.name)
        .collect();
    to.sort();
    assert_eq!(to, [s0.name, s1.name]);
}

#[test]
fn at_rest_a_member_wakes_for_its_probes_not_for_gossip_it_has_not_got() {
    // Periodic gossip re-arms itself every `gossip_period` (200 ms) even with nothing to
    // say; a thread woken for each was most of an idle member's CPU across 1000 processes.
    let c = cfg();
    let mut net = Net::at_rest(12, c.clone());
    let before = net.timeouts.clone();
    let rest = Duration::from_secs(10);
    net.run_until(rest, |_| false);
    let periods = (rest.as_millis() / c.probe_period.as_millis()) as u64;
    for (i, (a, b)) in before.iter().zip(&net.timeouts).enumerate() {
        let wakes = b - a;
        // Each probe period: the probe and its indirect-probe deadline; and a state sync
        // each announce period (2 s here). Gossip alone would add five a second.
        assert!(
            (periods..=2 * periods + periods / 2 + 1).contains(&wakes),
            "node {i} woke {wakes} times in {rest:?} at rest"
        );
    }
    // News still goes out at once, by gossip: a member that crashed and that one node
    // suspects (on its transport's hint) is suspected by all within a probe period,
    // before their own probes would find it (each probes it once in eleven periods).
    let gone = net.node(4).me().name.clone();
    net.nodes[4] = None;
    let now = net.now;
    net.node(1).handle_unreachable(now, gone.as_bytes());
    net.collect();
    let t = net
        .run_until(c.probe_period, |n| {
            (0..n.nodes.len())
                .filter(|i| n.nodes[*i].is_some())
                .all(|i| n.sees(i, &gone, MemberState::Suspect))
        })
        .expect("the suspicion reached every member by gossip");
    assert!(t <= c.gossip_period * 4, "{t:?}");
}

#[test]
fn the_view_delta_lists_what_changed_and_asks_for_a_whole_read_when_members_leave() {
    let c = MembershipConfig {
        forget_down_after: Duration::from_secs(5),
        ..cfg()
    };
    let mut net = Net::new(4, c.clone());
    // Never asked: read it whole.
    assert_eq!(net.node(0).take_view_delta(), ViewDelta::Whole);
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .expect("converged");
    // Each member once, as the view has it.
    let ViewDelta::Changed(mut got) = net.node(0).take_view_delta() else {
        panic!("the joins are a change");
    };
    got.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    assert_eq!(got, net.node(0).members());
    assert_eq!(net.node(0).take_view_delta(), ViewDelta::Unchanged);
    // A crash: only that member's entry, each time it changes.
    let gone = net.node(3).me().name.clone();
    net.nodes[3] = None;
    net.run_until(c.suspicion_timeout + c.probe_period * 3, |n| {
        n.all_running_see(&gone, MemberState::Down)
    })
    .expect("seen down");
    match net.node(0).take_view_delta() {
        ViewDelta::Changed(v) => {
            assert_eq!(v.len(), 1, "{v:?}");
            assert_eq!((&v[0].0.name, v[0].1), (&gone, MemberState::Down));
        }
        other => panic!("{other:?}"),
    }
    // Forgotten: it leaves the view, and the delta says read it whole.
    net.run_until(c.forget_down_after + c.probe_period * 3, |n| {
        n.nodes[0].as_ref().unwrap().view_len() == 2
    })
    .expect("forgotten");
    assert_eq!(net.node(0).take_view_delta(), ViewDelta::Whole);
    assert_eq!(net.node(0).take_view_delta(), ViewDelta::Unchanged);
}

/// A timer due exactly now fires now.
#[test]
fn a_timer_fires_at_its_instant() {
    let mut net = Net::new(2, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let m = net.node(0);
    let at = m.poll_timeout().unwrap();
    m.handle_timeout(at);
    assert!(
        m.poll_timeout().unwrap() > at,
        "the timer at {at:?} was taken"
    );
}

/// A member already declared down stays down when something of its old identity is heard
/// afterwards (only a renewed identity comes back).
#[test]
fn a_member_down_in_the_view_is_not_held_up_by_old_news() {
    let c = cfg();
    let mut net = Net::new(3, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let victim = id(2, 1);
    net.nodes[2] = None;
    let t = net.now;
    net.node(0).handle_unreachable(t, victim.name.as_bytes());
    net.run_until(Duration::from_secs(30), |n| {
        n.sees(0, &victim.name, MemberState::Down)
    })
    .unwrap();
    let t = net.now;
    net.node(0).handle_heard(t, &victim.name, victim.started);
    net.step();
    assert!(
        net.sees(0, &victim.name, MemberState::Down),
        "{:?}",
        net.node(0).members()
    );
}

/// Errors foca reports (here: a packet of this node's own, come back) are counted, one
/// each.
#[test]
fn packets_foca_refuses_are_counted_as_ignored() {
    let mut net = Net::new(2, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let n0 = id(0, 1).name;
    let mut t = net.now;
    let mut body = None;
    for _ in 0..1000 {
        t += STEP;
        let m = net.node(0);
        m.handle_timeout(t);
        body = m.poll_transmit().map(|(_, b)| b);
        if body.is_some() {
            break;
        }
    }
    let body = body.expect("n0 sends within 5 s");
    let m = net.node(0);
    let before = m.counters().ignored;
    m.handle_frame(t, &n0, &body).unwrap();
    m.handle_frame(t, &n0, &body).unwrap();
    assert_eq!(m.counters().ignored, before + 2);
}

/// Every bad setting is refused by `validate`, each bound exactly: `max_members` may be
/// `MAX_MEMBERS_LIMIT`, not one more; `probe_rtt` must be below `probe_period`.
#[test]
fn every_bad_setting_is_refused_at_its_bound() {
    let ok = MembershipConfig::default();
    assert!(ok.validate().is_ok());
    let s = Duration::from_secs(1);
    let bad: Vec<(&str, MembershipConfig)> = vec![
        (
            "probe_rtt 0",
            MembershipConfig {
                probe_rtt: Duration::ZERO,
                ..ok.clone()
            },
        ),
        (
            "probe_rtt = period",
            MembershipConfig {
                probe_rtt: s,
                probe_period: s,
                ..ok.clone()
            },
        ),
        (
            "suspicion 0",
            MembershipConfig {
                suspicion_timeout: Duration::ZERO,
                ..ok.clone()
            },
        ),
        (
            "gossip 0",
            MembershipConfig {
                gossip_period: Duration::ZERO,
                ..ok.clone()
            },
        ),
        (
            "announce 0",
            MembershipConfig {
                announce_period: Duration::ZERO,
                ..ok.clone()
            },
        ),
        (
            "frames 0",
            MembershipConfig {
                frames_per_second: 0,
                ..ok.clone()
            },
        ),
        (
            "members 0",
            MembershipConfig {
                max_members: 0,
                ..ok.clone()
            },
        ),
        (
            "members past the limit",
            MembershipConfig {
                max_members: MAX_MEMBERS_LIMIT + 1,
                ..ok.clone()
            },
        ),
    ];
    for (what, c) in bad {
        assert!(
            matches!(c.validate(), Err(MemberError::Config(_))),
            "{what}: accepted"
        );
    }
    let edge = MembershipConfig {
        max_members: MAX_MEMBERS_LIMIT,
        probe_rtt: s - Duration::from_nanos(1),
        probe_period: s,
        ..ok.clone()
    };
    assert!(edge.validate().is_ok());
    // Updates are retransmitted log10(max_members + 1) x 4 times (at least 4).
    let tx = |m: usize| {
        MembershipConfig {
            max_members: m,
            ..ok.clone()
        }
        .foca()
        .unwrap()
        .max_transmissions
        .get()
    };
    assert_eq!((tx(1), tx(99), tx(1024)), (4, 8, 12));
}

/// Identities: only alive and suspect members are live; of two identities of one name,
/// the later start (then the later bump) wins, and an identity does not win against
/// itself.
#[test]
fn liveness_and_which_identity_wins() {
    use foca::Identity;
    assert!(MemberState::Alive.is_live() && MemberState::Suspect.is_live());
    assert!(!MemberState::Down.is_live() && !MemberState::Left.is_live());
    let a = id(1, 5);
    let later = id(1, 6);
    let bumped = MemberId {
        bump: 1,
        ..a.clone()
    };
    assert!(later.win_addr_conflict(&a) && !a.win_addr_conflict(&later));
    assert!(bumped.win_addr_conflict(&a));
    assert!(!a.win_addr_conflict(&a), "no win against itself");
}

/// A node that joins after a member went down hears of it as down: it never reports it
/// joined. Down members are forgotten after `forget_down_after`, from the view and from
/// the refused names alike.
#[test]
fn a_member_first_heard_of_as_down_never_joined_and_the_forgotten_go() {
    let c = MembershipConfig {
        forget_down_after: Duration::from_secs(8),
        ..cfg()
    };
    let mut net = Net::new(4, c.clone());
    // Nodes 0-2 form the cluster; 3 joins later.
    let seed = net.node(0).me().clone();
    let t = net.now;
    for i in 1..3 {
        net.node(i).handle_join(t, seed.clone());
    }
    net.collect();
    net.run_until(Duration::from_secs(10), |n| {
        (0..3).all(|i| {
            (0..3)
                .filter(|j| *j != i)
                .all(|j| n.sees(i, &id(j, 1).name, MemberState::Alive))
        })
    })
    .unwrap();
    let victim = id(2, 1).name;
    net.nodes[2] = None;
    let t = net.now;
    net.node(0).handle_unreachable(t, victim.as_bytes());
    net.collect();
    net.run_until(Duration::from_secs(10), |n| {
        n.sees(0, &victim, MemberState::Down) && n.sees(1, &victim, MemberState::Down)
    })
    .unwrap();
    let t = net.now;
    net.node(3).handle_join(t, seed);
    net.collect();
    net.run_until(Duration::from_secs(3), |n| {
        n.sees(3, &victim, MemberState::Down)
    })
    .expect("the newcomer hears of the down member");
    assert!(
        !net.events_of(3)
            .iter()
            .any(|e| matches!(e, MemberEvent::Joined(m) if m.name == victim)),
        "{:?}",
        net.events_of(3)
    );
    // Forgotten after forget_down_after, by everyone.
    net.run_until(c.forget_down_after + Duration::from_secs(5), |n| {
        [0, 1, 3].iter().all(|i| {
            n.nodes[*i]
                .as_ref()
                .unwrap()
                .state_of(victim.as_bytes())
                .is_none()
        })
    })
    .expect("the down member is forgotten");
}

/// A name refused for want of room is forgotten with the member: once SWIM forgets it,
/// it is not "refused" any more.
#[test]
fn refused_names_are_forgotten_with_their_members() {
    let c = MembershipConfig {
        max_members: 1,
        forget_down_after: Duration::from_secs(5),
        ..cfg()
    };
    let mut net = Net::new(3, c.clone());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(5), |_| false);
    let refused: Vec<usize> = (1..3)
        .filter(|i| net.node(0).is_refused(id(*i, 1).name.as_bytes()))
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", net.node(0).members());
    let r = refused[0];
    net.nodes[r] = None;
    net.run_until(Duration::from_secs(40), |n| {
        !n.nodes[0]
            .as_ref()
            .unwrap()
            .is_refused(id(r, 1).name.as_bytes())
    })
    .expect("forgotten once SWIM forgets it");
}

/// The table of rate buckets is bounded (twice `max_members`): past it, a new sender
/// starts it over, and every sender has its full rate again.
#[test]
fn the_rate_table_is_bounded_and_starts_over() {
    let c = MembershipConfig {
        frames_per_second: 2,
        max_members: 1,
        ..cfg()
    };
    let now = Instant::now();
    let mut m = Membership::new(id(0, 1), c, 1, now).unwrap();
    let p = Name::new("p").unwrap();
    let leave = [1u8]; // a leave notice from a stranger: read, and ignored
    for _ in 0..3 {
        m.handle_frame(now, &p, &leave).unwrap();
    }
    assert_eq!(m.counters().rate_limited, 1, "p used its two");
    for q in ["q", "r"] {
        m.handle_frame(now, &Name::new(q).unwrap(), &leave).unwrap();
    }
    m.handle_frame(now, &p, &leave).unwrap();
    assert_eq!(
        m.counters().rate_limited,
        2,
        "p, q, r: within the bound, p still spent"
    );
    m.handle_frame(now, &Name::new("s").unwrap(), &leave)
        .unwrap();
    m.handle_frame(now, &p, &leave).unwrap();
    assert_eq!(
        m.counters().rate_limited,
        2,
        "s started the table over: p has its rate"
    );
}

/// A node joining a large cluster at rest learns every member in one full-state exchange
/// with its seed, not as the members happen to probe it; the answer spans several bodies,
/// each within the packet bound.
#[test]
fn a_node_joining_a_cluster_at_rest_gets_the_full_state_from_its_seed() {
    let n = 121;
    let mut net = Net::new(n, cfg());
    net.join_through_0(1, n - 1);
    // The others converge (node 0 and node 60 see all 119 others alive), then rest.
    let all = |net: &Net, i: usize| net.alive_seen_by(i);
    net.run_until(Duration::from_secs(60), |net| {
        all(net, 0) == n - 2 && all(net, 60) == n - 2
    })
    .expect("the first 120 converge");
    net.run_until(Duration::from_secs(5), |_| false);
    let asked_before = net.node(0).counters().syncs_answered;
    net.join_through_0(n - 1, n);
    let took = net
        .run_until(Duration::from_secs(30), |net| all(net, n - 1) == n - 1)
        .expect("the newcomer sees everyone");
    // An announce, its answer, the ask and the answer's bodies: within a probe period.
    assert!(took < Duration::from_millis(200), "took {took:?}");
    let c = net.node(n - 1).counters();
    assert_eq!(c.syncs_asked, 1);
    assert!(c.sync_members >= (n - 2) as u64, "{c:?}");
    assert_eq!(net.node(0).counters().syncs_answered, asked_before + 1);
}

/// Eight nodes join a cluster of 100 at rest through one seed at once: the seed answers
/// only a few full-state asks a second, and those it turned away ask random members each
/// probe period, so every newcomer sees everyone within a few periods (not at the periodic
/// sync, 30 s on).
#[test]
fn newcomers_the_seed_turned_away_get_the_state_from_others() {
    let (old, new) = (250, 8);
    let n = old + new;
    let mut net = Net::new(
        n,
        MembershipConfig {
            announce_period: Duration::from_secs(30),
            ..cfg()
        },
    );
    net.join_through_0(1, old);
    let alive = |net: &Net, i: usize| net.alive_seen_by(i);
    net.run_until(Duration::from_secs(60), |net| {
        (0..old).all(|i| alive(net, i) == old - 1)
    })
    .expect("the first 100 converge");
    // At rest: nothing left to gossip about them.
    net.run_until(Duration::from_secs(20), |_| false);
    net.join_through_0(old, n);
    let took = net
        .run_until(Duration::from_secs(20), |net| {
            (old..n).all(|i| alive(net, i) == n - 1)
        })
        .expect("every newcomer sees everyone");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let asked: Vec<u64> = (old..n)
        .map(|i| net.node(i).counters().syncs_asked)
        .collect();
    assert!(
        asked.iter().any(|a| *a > 1),
        "nobody asked again: {asked:?}"
    );
    assert!(
        asked.iter().all(|a| *a <= 1 + SYNC_TRIES as u64),
        "{asked:?}"
    );
}

/// Asks are answered at most once a probe period per asker, and the answer's bodies are
/// each within the bound; an answer listing a down member, or a state ask with a body, is
/// malformed.
#[test]
fn state_asks_are_rate_limited_and_answers_checked() {
    let mut net = Net::new(100, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(60), |n| {
        n.nodes[0].as_ref().unwrap().view_len() == 99
    })
    .expect("node 0 sees every other");
    let now = net.now;
    let from = net.node(1).me().name.clone();
    let m = net.node(0);
    while m.poll_transmit().is_some() {}
    m.handle_frame(now, &from, &[TAG_STATE_ASK]).unwrap();
    let mut bodies = Vec::new();
    while let Some((to, b)) = m.poll_transmit() {
        assert_eq!(to.name, from);
        bodies.push(b);
    }
    assert!(bodies.len() >= 2, "99 members take more than one body");
    assert!(
        bodies
            .iter()
            .all(|b| b[0] == TAG_STATE && b.len() <= MAX_PACKET + 1)
    );
    // Every member but the asker (and the answerer), once.
    let mut codec = foca::PostcardCodec;
    let mut names = HashSet::new();
    for b in &bodies {
        let mut buf = &b[1..];
        while !buf.is_empty() {
            let mm: Member<MemberId> = codec.decode_member(&mut buf).unwrap();
            assert!(names.insert(mm.id().name.clone()));
        }
    }
    assert_eq!(
        names.len(),
        98,
        "every member but the asker and node 0 itself"
    );
    assert!(!names.contains(&from));
    // Again within a probe period: not answered, counted.
    let limited = m.counters().rate_limited;
    m.handle_frame(now + Duration::from_millis(500), &from, &[TAG_STATE_ASK])
        .unwrap();
    assert!(m.poll_transmit().is_none());
    assert_eq!(m.counters().rate_limited, limited + 1);
    // After it: answered.
    m.handle_frame(now + Duration::from_millis(1000), &from, &[TAG_STATE_ASK])
        .unwrap();
    assert!(m.poll_transmit().is_some());
    while m.poll_transmit().is_some() {}
    // Many askers at once: at most ANSWERS_PER_SECOND (4) answered.
    let t = now + Duration::from_secs(10);
    let answered = m.counters().syncs_answered;
    for i in 2..30 {
        let name = Name::new(&format!("n{i:02}")).unwrap();
        m.handle_frame(t, &name, &[TAG_STATE_ASK]).unwrap();
    }
    assert_eq!(m.counters().syncs_answered, answered + 4);
    // Malformed.
    assert!(matches!(
        m.handle_frame(t, &from, &[TAG_STATE_ASK, 0]),
        Err(MemberError::Malformed(_))
    ));
    let mut body = vec![TAG_STATE];
    codec
        .encode_member(&Member::down(id(77, 1)), &mut body)
        .unwrap();
    assert!(matches!(
        m.handle_frame(t, &from, &body),
        Err(MemberError::Malformed(_))
    ));
    assert!(matches!(
        m.handle_frame(t, &from, &[TAG_STATE, 0xff, 0xff]),
        Err(MemberError::Malformed(_))
    ));
}

/// At rest the periodic sync is a comparison: each ask carries the asker's digest, and a
/// member that holds the same members sends nothing back (no full answer of every member
/// each period); the asks back off to `announce_period` while nothing changes.
#[test]
fn at_rest_a_sync_is_a_digest_and_an_agreeing_member_sends_nothing() {
    let period = Duration::from_secs(8);
    let mut net = Net::at_rest(
        12,
        MembershipConfig {
            announce_period: period,
            ..cfg()
        },
    );
    let sum = |net: &Net, f: fn(&MemberCounters) -> u64| -> u64 {
        net.nodes.iter().flatten().map(|m| f(&m.counters())).sum()
    };
    // Past the backoff (2, 4, 8 s after the last change), then four periods.
    net.run_until(Duration::from_secs(20), |_| false);
    let (asked, answered, agreed) = (
        sum(&net, |c| c.syncs_asked),
        sum(&net, |c| c.syncs_answered),
        sum(&net, |c| c.syncs_agreed),
    );
    net.run_until(period * 4, |_| false);
    let asked = sum(&net, |c| c.syncs_asked) - asked;
    let agreed = sum(&net, |c| c.syncs_agreed) - agreed;
    assert!(
        (36..=60).contains(&asked),
        "12 nodes, 4 periods: {asked} asks"
    );
    assert_eq!(agreed, asked, "every ask agreed");
    assert_eq!(
        sum(&net, |c| c.syncs_answered),
        answered,
        "nothing answered"
    );
    // An ask whose digest differs is answered in full.
    let now = net.now + Duration::from_secs(1);
    let from = net.node(1).me().name.clone();
    let mut ask = vec![TAG_STATE_ASK];
    ask.extend_from_slice(&[0; sync::DIGEST_LEN]);
    let m = net.node(0);
    while m.poll_transmit().is_some() {}
    m.handle_frame(now, &from, &ask).unwrap();
    let (to, body) = m.poll_transmit().expect("a full answer");
    assert_eq!((to.name, body[0]), (from, TAG_STATE));
}

/// A member that gossip missed (a node heard nothing while a newcomer's join spread) is
/// found by the comparison soon after the node's view settles, not an announce period
/// (here a minute) later, nor when the newcomer's probes come round to it (40 members,
/// one probe a second).
#[test]
fn a_join_gossip_missed_is_found_by_comparing_soon_after() {
    let n = 41;
    let late = n - 1;
    let mut net = Net::new(
        n,
        MembershipConfig {
            announce_period: Duration::from_secs(60),
            suspicion_timeout: Duration::from_secs(20),
            ..cfg()
        },
    );
    net.join_through_0(1, late);
    net.run_until(Duration::from_secs(60), |net| {
        (0..late).all(|i| net.alive_seen_by(i) == late - 1)
    })
    .expect("the first 40 converge");
    net.run_until(Duration::from_secs(20), |_| false);
    // Node 1 hears nothing (and is heard by nobody) while the newcomer joins and its news
    // is gossiped until no member has it left to send (8 s; the suspicion timeout is long
    // enough that node 1 is not declared down meanwhile). Without the comparison it took
    // 13.5 s more (the newcomer's probe came round to it).
    for k in 0..n {
        if k != 1 {
            net.cut.insert((1, k));
        }
    }
    net.join_through_0(late, n);
    let newcomer = net.node(late).me().name.clone();
    net.run_until(Duration::from_secs(8), |_| false);
    assert!(
        !net.sees(1, &newcomer, MemberState::Alive),
        "node 1 heard of it"
    );
    assert!(
        (2..late).all(|i| net.sees(i, &newcomer, MemberState::Alive)),
        "the others know the newcomer"
    );
    net.cut.clear();
    let took = net
        .run_until(Duration::from_secs(60), |net| {
            net.sees(1, &newcomer, MemberState::Alive)
        })
        .expect("node 1 learns of the newcomer");
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// Local health: a node whose probe timers run late (it is starved of CPU, so its acks
/// and its view of others' acks are late too) waits longer before it suspects anyone and
/// probes less often, up to 9 times; on time again, it comes back one probe period at a
/// time.
#[test]
fn a_node_whose_timers_run_late_stretches_its_probes_and_recovers() {
    // Node 0 is driven alone (its probes go unanswered): its members stay suspect, not
    // down, for the test's 130 s, so it keeps probing.
    let mut net = Net::at_rest(
        3,
        MembershipConfig {
            suspicion_timeout: Duration::from_secs(600),
            ..cfg()
        },
    );
    let pp = cfg().probe_period;
    let m = net.node(0);
    let next_probe = |m: &Membership| {
        m.timers
            .iter()
            .find(|(_, t)| matches!(t, Timer::ProbeRandomMember(_)))
            .map(|((at, _), _)| *at)
            .expect("a probe is scheduled")
    };
    // The probe's timers fired `late` after their deadlines (the indirect probe, then the
    // next probe's start); the gap from that start to the one after it.
    let turn = |m: &mut Membership, late: Duration| -> Duration {
        let probe = next_probe(m);
        let indirect = m
            .timers
            .iter()
            .find(|(_, t)| matches!(t, Timer::SendIndirectProbe { .. }))
            .map(|((at, _), _)| *at);
        if let Some(t) = indirect.filter(|t| *t + late < probe) {
            m.handle_timeout(t + late);
        }
        m.handle_timeout(probe + late);
        next_probe(m) - (probe + late)
    };
    assert_eq!(turn(m, Duration::ZERO), pp, "on time");
    let late: Vec<Duration> = (0..8)
        .map(|_| turn(m, Duration::from_millis(400)))
        .collect();
    assert!(late[0] > pp, "{late:?}");
    assert!(late.windows(2).all(|w| w[0] <= w[1]), "{late:?}");
    assert_eq!(*late.last().unwrap(), pp * 9, "at most 9 times: {late:?}");
    let counted = m.counters().late_timers;
    assert!(counted >= 8, "{counted}");
    let on_time: Vec<Duration> = (0..8).map(|_| turn(m, Duration::ZERO)).collect();
    assert!(on_time[0] < pp * 9, "{on_time:?}");
    assert!(on_time.windows(2).all(|w| w[0] >= w[1]), "{on_time:?}");
    assert_eq!(*on_time.last().unwrap(), pp, "back to normal: {on_time:?}");
    assert_eq!(m.counters().late_timers, counted);
}

/// Not a test of behaviour: how much CPU the machines of a large cluster take to join
/// and at rest (run it by hand, in release, with `--ignored --nocapture`; N from
/// BW_SCALE_N, default 512).
#[test]
#[ignore]
fn cost_at_scale() {
    let n: usize = std::env::var("BW_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let mut net = Net::new(n, cfg());
    let t = std::time::Instant::now();
    net.join_all_through_0();
    let took = net.run_until(Duration::from_secs(120), |net| {
        [0, n / 2, n - 1]
            .iter()
            .all(|i| net.alive_seen_by(*i) == n - 1)
    });
    let cpu_join = t.elapsed();
    let took = took.expect("the three sampled nodes see everyone within 120 s");
    eprintln!("{n} nodes: simulated converge {took:?}, CPU {cpu_join:?}");
    let t = std::time::Instant::now();
    let rest = Duration::from_secs(10);
    net.run_until(rest, |_| false);
    let cpu = t.elapsed();
    eprintln!(
        "at rest: CPU {cpu:?} for {rest:?} simulated: {:.3} % of a core per node",
        cpu.as_secs_f64() / rest.as_secs_f64() / n as f64 * 100.0
    );
    let c: Vec<MemberCounters> = net.nodes.iter().flatten().map(|m| m.counters()).collect();
    let sum = |f: fn(&MemberCounters) -> u64| c.iter().map(f).sum::<u64>() / n as u64;
    eprintln!(
        "per node: {} packets in, {} updates of old news, {} syncs answered",
        sum(|c| c.packets_in),
        sum(|c| c.old_news),
        sum(|c| c.syncs_answered)
    );
}
