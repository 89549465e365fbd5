//! Bad packets and settings, links that keep breaking, invented members past the limit,
//! random loss and delay, lost joins, and the suspicion timeout to the tick.

use super::*;

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
    // Periods too long to use, or for the clock (`Duration::MAX`), are named, not added.
    for c in [
        MembershipConfig {
            announce_period: Duration::MAX,
            ..MembershipConfig::default()
        },
        MembershipConfig {
            suspicion_timeout: Duration::from_secs(3601),
            ..MembershipConfig::default()
        },
    ] {
        match Membership::new(id(0, 1), c, 1, now) {
            Err(MemberError::Config(why)) => assert!(why.contains("out of range"), "{why}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("taken"),
        }
    }
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
        // SWIM lists at most eight others (twice the limit); members it lists past the
        // view's four are refused, each once (nine names at most, not once per packet or
        // timer).
        let listed = m.foca.iter_membership_state().len();
        assert!(listed <= 8, "node {i}: SWIM lists {listed}");
        assert!(
            c.members_refused as usize >= listed.saturating_sub(4) && c.members_refused <= 9,
            "node {i}: {} refusals with {listed} listed",
            c.members_refused
        );
    }
    // Ten nodes do not fit: the seed's list was full when the last one announced itself,
    // so that one stayed out (dropped and counted), rather than SWIM's list growing.
    assert!(net.nodes[0].as_ref().unwrap().counters().swim_full > 0);
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

/// A SWIM packet from `src` to `dst` carrying `updates` (as foca encodes one).
fn gossip(src: &MemberId, dst: &MemberId, updates: &[foca::Member<MemberId>]) -> Vec<u8> {
    use foca::Codec;
    let mut codec = foca::PostcardCodec;
    let mut buf = vec![TAG_SWIM];
    let header = foca::Header {
        src: src.clone(),
        src_incarnation: 0,
        dst: dst.clone(),
        message: foca::Message::Gossip,
    };
    codec.encode_header(&header, &mut buf).unwrap();
    buf.extend_from_slice(&(updates.len() as u16).to_be_bytes());
    for m in updates {
        codec.encode_member(m, &mut buf).unwrap();
    }
    buf
}

/// A node alone with `max_members` 4 (so SWIM lists at most 8 live members), itself, and
/// a member that went bad (id 1), from now.
fn alone_with_room_for_four() -> (Instant, Membership, MemberId, MemberId) {
    let t0 = Instant::now();
    let cfg = MembershipConfig {
        max_members: 4,
        ..cfg()
    };
    let a = Membership::new(id(0, 1), cfg, 1, t0).unwrap();
    let me = a.me().clone();
    (t0, a, me, id(1, 1))
}

/// A member that went bad gossips invented members without end, and sends under invented
/// names: SWIM's own list (not only the view) stays within twice `max_members`, and what
/// is dropped past it is counted. Members it already lists are still updated.
#[test]
fn invented_members_cannot_grow_swims_list_past_twice_the_limit() {
    let (t0, mut a, me, bad) = alone_with_room_for_four();
    let listed = |a: &Membership| a.foca.iter_membership_state().len();
    let mut t = t0;
    for round in 0..40 {
        t += Duration::from_millis(50);
        let invented: Vec<_> = (0..20)
            .map(|k| foca::Member::alive(id(100 + round * 20 + k, 1)))
            .collect();
        let _ = a.handle_frame(t, &bad.name, &gossip(&bad, &me, &invented));
        assert!(listed(&a) <= 8, "round {round}: SWIM lists {}", listed(&a));
    }
    // Under invented sender names.
    for k in 0..100 {
        t += Duration::from_millis(5);
        let from = id(2000 + k, 1);
        let _ = a.handle_frame(t, &from.name, &gossip(&from, &me, &[]));
    }
    assert_eq!(listed(&a), 8, "full, and no more");
    // In a full-state answer too.
    let mut state = vec![TAG_STATE];
    for k in 0..10 {
        use foca::Codec;
        let m = foca::Member::alive(id(3000 + k, 1));
        foca::PostcardCodec.encode_member(&m, &mut state).unwrap();
    }
    a.handle_frame(t, &bad.name, &state).unwrap();
    assert_eq!(listed(&a), 8, "full, and no more after a state answer");
    let c = a.counters();
    assert!(c.swim_full >= 40 * 20 + 100 + 10 - 8, "{c:?}");
    // A member SWIM lists is still heard: the bad member suspected by gossip is news.
    let suspect = foca::Member::new(bad.clone(), 1, foca::State::Suspect);
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &[suspect]))
        .unwrap();
    assert!(
        a.foca
            .iter_membership_state()
            .any(|m| m.id().name == bad.name && m.incarnation() >= 1),
        "an update about a listed member was dropped"
    );
}

/// Members listed as down (restarted under new names, until forgotten) do not keep live
/// newcomers out: they count only toward a larger bound (four times `max_members`), which
/// word of invented down members cannot pass either.
#[test]
fn down_members_count_only_toward_the_larger_bound() {
    let (t0, mut a, me, bad) = alone_with_room_for_four();
    let listed = |a: &Membership| a.foca.iter_membership_state().len();
    let mut t = t0 + Duration::from_millis(50);
    // Six members heard of only as down, then seven live ones, in one packet: all taken
    // (eight live with the sender, fourteen listed in all; the down ones in the packet do
    // not count toward the live bound either).
    let news: Vec<_> = (0..6)
        .map(|k| foca::Member::down(id(100 + k, 1)))
        .chain((0..7).map(|k| foca::Member::alive(id(200 + k, 1))))
        .collect();
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &news))
        .unwrap();
    assert_eq!(listed(&a), 14);
    assert_eq!(
        a.foca.num_members(),
        8,
        "live newcomers taken beside the down"
    );
    // No more live ones (eight is the live bound), and down ones only up to sixteen.
    t += Duration::from_millis(50);
    let more: Vec<_> = (0..10)
        .map(|k| foca::Member::alive(id(300 + k, 1)))
        .chain((0..10).map(|k| foca::Member::down(id(400 + k, 1))))
        .collect();
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &more))
        .unwrap();
    assert_eq!(a.foca.num_members(), 8);
    assert_eq!(listed(&a), 16);
}

/// A view full of members that are down or left (churn, or word of invented down members
/// from a member that went bad) does not keep a live newcomer out until they are
/// forgotten (`forget_down_after`, 10 minutes): the newcomer takes the place of one of
/// them, and is reported joined at once.
#[test]
fn departed_members_give_their_place_in_a_full_view_to_live_ones() {
    let (t0, mut a, me, bad) = alone_with_room_for_four();
    let mut t = t0 + Duration::from_millis(50);
    // The member that went bad, live, and three members it says are down: a full view.
    let down: Vec<_> = (0..3).map(|k| foca::Member::down(id(100 + k, 1))).collect();
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &down))
        .unwrap();
    assert_eq!(a.members().len(), 4, "{:?}", a.members());
    let _ = a.take_view_delta();
    // Two live newcomers: each takes a departed member's place, at once.
    t += Duration::from_millis(50);
    let two_alive = |from: usize| -> Vec<_> {
        (0..2)
            .map(|k| foca::Member::alive(id(from + k, 1)))
            .collect()
    };
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &two_alive(200)))
        .unwrap();
    let joined: Vec<Name> = std::iter::from_fn(|| a.poll_event())
        .filter_map(|e| match e {
            MemberEvent::Joined(id) => Some(id.name),
            _ => None,
        })
        .collect();
    for k in 0..2 {
        assert!(
            joined.contains(&id(200 + k, 1).name),
            "newcomer {k} not reported: {joined:?}"
        );
    }
    assert_eq!(a.members().len(), 4);
    assert_eq!(a.counters().departed_evicted, 2);
    // Members left the view: the IO layer is given the whole view, not a delta of the
    // entries that changed (which says nobody left).
    assert!(matches!(
        a.take_view_delta(),
        crate::membership::ViewDelta::Whole
    ));
    // A full view of live members still refuses newcomers, live or not.
    t += Duration::from_millis(50);
    let refused = a.counters().members_refused;
    a.handle_frame(t, &bad.name, &gossip(&bad, &me, &two_alive(300)))
        .unwrap();
    assert_eq!(a.counters().departed_evicted, 3, "the last departed one");
    assert_eq!(a.members().len(), 4);
    assert!(a.members().iter().filter(|m| m.1.is_live()).count() <= 4);
    assert_eq!(
        a.counters().members_refused,
        refused + 1,
        "the second, with only live members left, is refused"
    );
    assert_eq!(a.view_disagrees(), None);
}
