//! Rules the other tests did not pin, found by cargo-mutants: counters, rate limits,
//! bounds, identities, forgetting.

use super::*;

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
    // A leave notice of another boot of n1 (held back, or recorded before n1 restarted
    // and replayed): it says nothing of the n1 running now.
    let notice = |started: u64| {
        let mut v = vec![1u8];
        v.extend_from_slice(&started.to_le_bytes());
        v
    };
    net.node(0).handle_frame(t, &n1, &notice(0)).unwrap();
    assert!(net.sees(0, &n1, MemberState::Alive), "an old boot's notice");
    // Its own: it left.
    net.node(0).handle_frame(t, &n1, &notice(1)).unwrap();
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
    let leave = [1u8, 1, 0, 0, 0, 0, 0, 0, 0]; // a leave notice from a stranger: read, and ignored
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

/// A node that left has no timer due: before, the anti-entropy round and the rejoin of a
/// node still alone stayed due, and the IO layer's loop, which stops firing timers after
/// the leave, woke at once every turn until the node stopped.
#[test]
fn a_node_that_left_has_nothing_due() {
    let mut net = Net::new(2, cfg());
    // Alone: it rejoins every probe period until someone answers.
    let t = net.now;
    let seed = net.node(0).me().clone();
    net.node(1).handle_join(t, seed);
    assert!(net.node(1).poll_timeout().is_some());
    net.node(1).handle_leave(t);
    assert_eq!(net.node(1).poll_timeout(), None);
    // And after a join that converged.
    let mut net = Net::new(3, cfg());
    net.join_all_through_0();
    net.run_until(Duration::from_secs(10), Net::converged)
        .unwrap();
    let t = net.now + Duration::from_secs(1);
    net.node(2).handle_leave(t);
    assert_eq!(net.node(2).poll_timeout(), None);
}
