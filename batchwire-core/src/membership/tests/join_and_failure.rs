//! Joining, crashes, suspicions and their refutation, leaves, partitions and restarts.

use super::*;

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
        // The news of the crash reached each survivor from several members: the copies
        // were taken out before foca saw them. (Not checked at convergence: the join can
        // converge in a few steps, on announces' answers and full states, before any
        // update came twice.)
        assert!(net.node(i).counters().old_news > 0, "node {i}");
    }
}

/// A SWIM gossip packet from `from` to `to` carrying `updates`, as foca lays one out.
fn gossip(from: &Membership, to: &Membership, updates: &[Member<MemberId>]) -> Vec<u8> {
    let mut b = vec![TAG_SWIM];
    let h = foca::Header {
        src: from.me().clone(),
        // What the receiver holds of the sender's incarnation.
        src_incarnation: to.swim.get(&from.me().name).map_or(0, |s| s.inc),
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
    let inc = net.node(0).swim.get(&x.name).expect("known").inc;
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
        Some(&Held::of(&x, inc + 1, State::Alive)),
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

/// The leaver's own "I am down" (foca's leave) can reach a member before its leave notice
/// (relayed by another member that got the notice first, or ahead in the same batch):
/// the member is down in SWIM then, reported suspect (it was heard from directly), and
/// the notice still makes it a leave, not a crash reported when the hold ends. (Seen in
/// CI: about one run in 25 of the 3-node leave test on real nodes.)
#[test]
fn a_leave_notice_after_the_leavers_down_gossip_is_still_a_leave() {
    let mut net = Net::at_rest(3, cfg());
    let b = net.node(1).me().clone();
    let inc = net.node(0).swim.get(&b.name).expect("known").inc;
    let down = Member::new(b.clone(), inc, State::Down);
    let c_name = net.node(2).me().name.clone();
    let from_c = {
        let (a, c) = (
            net.nodes[0].as_ref().unwrap(),
            net.nodes[2].as_ref().unwrap(),
        );
        gossip(c, a, std::slice::from_ref(&down))
    };
    let now = net.now;
    let a = net.node(0);
    while a.poll_event().is_some() {}
    a.handle_frame(now, &c_name, &from_c).unwrap();
    assert_ne!(
        a.state_of(b.name.as_bytes()).map(|v| v.1),
        Some(MemberState::Left),
        "not a leave yet"
    );
    let mut notice = vec![TAG_LEAVE];
    notice.extend_from_slice(&b.started.to_le_bytes());
    a.handle_frame(now, &b.name, &notice).unwrap();
    assert_eq!(
        a.state_of(b.name.as_bytes()).map(|v| v.1),
        Some(MemberState::Left)
    );
    let events: Vec<MemberEvent> = std::iter::from_fn(|| a.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, MemberEvent::Left(m) if m.name == b.name)),
        "{events:?}"
    );
}
