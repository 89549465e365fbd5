//! Full-state exchanges and digest comparisons (push-pull), and local health.

use super::*;

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
    eprintln!("per node: {}", per_node(&net));
}

/// What the nodes of `net` did, averaged per node: packets and bytes both ways, what the
/// packets sent were, old news, syncs (for the measurements by hand).
fn per_node(net: &Net) -> String {
    let c: Vec<MemberCounters> = net.nodes.iter().flatten().map(|m| m.counters()).collect();
    let sum = |f: fn(&MemberCounters) -> u64| c.iter().map(f).sum::<u64>() / c.len() as u64;
    format!(
        "{} packets in ({} KB), {} out ({} KB: {} probes, {} gossip, {} state), {} updates of old news, {} syncs asked, {} answered in full ({} members in them), {} agreed",
        sum(|c| c.packets_in),
        sum(|c| c.bytes_in) / 1000,
        sum(|c| c.packets_out),
        sum(|c| c.bytes_out) / 1000,
        sum(|c| c.probes_out),
        sum(|c| c.gossip_out),
        sum(|c| c.state_out),
        sum(|c| c.old_news),
        sum(|c| c.syncs_asked),
        sum(|c| c.syncs_answered),
        sum(|c| c.sync_members),
        sum(|c| c.syncs_agreed)
    )
}

/// Not a test of behaviour: when each node of a large cluster first sees every other
/// live, with the nodes joining over a spread of time as a thousand processes started
/// together do (run by hand, in release, `--ignored --nocapture`; N from BW_SCALE_N,
/// default 512, the spread from BW_SCALE_SPREAD_MS, default 4000).
#[test]
#[ignore]
fn tail_at_scale() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("BW_SCALE_N", 512) as usize;
    let spread = Duration::from_millis(env("BW_SCALE_SPREAD_MS", 4000));
    let mut net = Net::new(n, cfg());
    net.batched = true;
    let seed = net.node(0).me().clone();
    let mut full: Vec<Option<Duration>> = vec![None; n];
    let t0 = net.now;
    let mut joined = 1;
    let mut checked = net.now;
    let live = |m: &Membership| {
        m.view_unsorted()
            .iter()
            .filter(|(_, s)| matches!(s, MemberState::Alive | MemberState::Suspect))
            .count()
    };
    while net.now - t0 < Duration::from_secs(120) {
        // Node i joins at i/n of the spread.
        while joined < n && (net.now - t0) >= spread * joined as u32 / n as u32 {
            let now = net.now;
            net.node(joined).handle_join(now, seed.clone());
            joined += 1;
        }
        net.step();
        if net.now - checked >= Duration::from_millis(100) {
            checked = net.now;
            for (i, f) in full.iter_mut().enumerate() {
                if f.is_none() && live(net.nodes[i].as_ref().unwrap()) + 1 == n {
                    *f = Some(net.now - t0);
                }
            }
            if full.iter().all(Option::is_some) {
                break;
            }
        }
    }
    let mut t: Vec<f64> = full
        .iter()
        .map(|f| f.map_or(f64::INFINITY, |d| d.as_secs_f64()))
        .collect();
    t.sort_by(f64::total_cmp);
    let at = |q: f64| t[((t.len() as f64 - 1.0) * q).round() as usize];
    eprintln!(
        "{n} nodes joining over {spread:?}: every node full by {:.2} s (median {:.2}, 90th {:.2}, 99th {:.2}); per node {}",
        at(1.0),
        at(0.5),
        at(0.9),
        at(0.99),
        per_node(&net),
    );
}

/// Packets out are counted by kind: joining takes gossip and full-state answers; once the
/// joining rounds are over, a node at rest sends probes and acks (and digest asks, which
/// agree, and announces), no gossip and no state.
#[test]
fn packets_out_are_counted_by_kind() {
    let mut net = Net::at_rest(8, cfg());
    let total = |net: &Net| {
        let mut t = MemberCounters::default();
        for c in net.nodes.iter().flatten().map(|m| m.counters()) {
            t.packets_out += c.packets_out;
            t.probes_out += c.probes_out;
            t.gossip_out += c.gossip_out;
            t.state_out += c.state_out;
        }
        t
    };
    let joined = total(&net);
    assert!(joined.gossip_out > 0 && joined.state_out > 0, "{joined:?}");
    assert!(
        joined.probes_out + joined.gossip_out + joined.state_out <= joined.packets_out,
        "{joined:?}"
    );
    // The joining rounds of full-state asks end (an answer told nothing new), then 5 s
    // at rest.
    net.run_until(Duration::from_secs(10), |_| false);
    let settled = total(&net);
    net.run_until(Duration::from_secs(5), |_| false);
    let rest = total(&net);
    assert_eq!(rest.gossip_out, settled.gossip_out, "gossip at rest");
    assert_eq!(rest.state_out, settled.state_out, "full answers at rest");
    // Each of the 8 probes a member a second, and is answered: at least 2 x 8 x 4.
    assert!(rest.probes_out - settled.probes_out >= 64, "{rest:?}");
}

/// A view that keeps changing (a storm of joins, members coming and going) is still
/// compared every two probe periods: each change puts the comparison off only up to two
/// periods after the last one. With a thousand nodes joining at once, the last members
/// that gossip missed were found by a comparison, and each change then put it off up to
/// eight periods while the CPUs stood idle.
#[test]
fn a_view_that_keeps_changing_is_still_compared_every_two_probe_periods() {
    // The periodic comparison, when nothing changes, a minute apart.
    let c = MembershipConfig {
        announce_period: Duration::from_secs(60),
        ..cfg()
    };
    let mut net = Net::at_rest(6, c.clone());
    // Past the joining rounds and the first comparisons.
    net.run_until(Duration::from_secs(30), |_| false);
    let asked = net.node(0).counters().syncs_asked;
    // Six probe periods during which node 0's view changes every half period.
    let mut t = Duration::ZERO;
    while t < c.probe_period * 6 {
        let now = net.now;
        net.node(0).sync_soon(now);
        net.run_until(c.probe_period / 2, |_| false);
        t += c.probe_period / 2;
    }
    let compared = net.node(0).counters().syncs_asked - asked;
    assert!(
        (2..=4).contains(&compared),
        "{compared} comparisons in six periods"
    );
}
