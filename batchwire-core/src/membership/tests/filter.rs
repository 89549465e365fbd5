//! The comparison's filter: an answer holds only what the asker lacks; at rest the ask is
//! the digest alone.

use super::*;

/// An ask whose digest differs and that carries a filter of what the asker holds is
/// answered with only what it lacks; one that lacks nothing gets one empty part (a joining
/// round then knows it was answered with nothing new).
#[test]
fn a_filtered_ask_is_answered_with_only_what_the_asker_lacks() {
    let mut net = Net::at_rest(12, cfg());
    let now = net.now + Duration::from_secs(1);
    // Node 1 forgets nothing, but its filter leaves out n05 and n09: node 0 sends those.
    let me1 = net.node(1).me().clone();
    let held: Vec<MemberId> = net
        .node(0)
        .foca
        .iter_members()
        .map(|m| m.id().clone())
        .filter(|id| id.name.as_bytes() != b"n05" && id.name.as_bytes() != b"n09")
        .collect();
    let ask = |held: &[MemberId], salt: u64| {
        let mut bits = vec![0u8; sync::Filter::len_for(held.len() + 1)];
        sync::Filter::fill(
            &mut bits,
            salt,
            held.iter()
                .chain(std::iter::once(&me1))
                .map(sync::identity_hash),
        );
        let mut b = vec![TAG_STATE_ASK];
        b.extend_from_slice(&[0; sync::DIGEST_LEN]); // a digest that differs
        b.extend_from_slice(&salt.to_le_bytes());
        b.extend_from_slice(&bits);
        b
    };
    let m = net.node(0);
    while m.poll_transmit().is_some() {}
    m.handle_frame(now, &me1.name, &ask(&held, 7)).unwrap();
    let (to, body) = m.poll_transmit().expect("an answer");
    assert_eq!((&to.name, body[0]), (&me1.name, TAG_STATE));
    assert!(m.poll_transmit().is_none(), "one part");
    let mut rest = &body[1..];
    let mut names = Vec::new();
    while !rest.is_empty() {
        let mm: Member<MemberId> = PostcardCodec.decode_member(&mut rest).unwrap();
        names.push(mm.id().name.to_string());
    }
    names.sort();
    assert_eq!(names, ["n05", "n09"]);
    // Holding everything (every member and node 0 itself): one empty part.
    let mut all = net
        .node(0)
        .foca
        .iter_members()
        .map(|m| m.id().clone())
        .collect::<Vec<_>>();
    all.push(net.node(0).me().clone());
    let m = net.node(0);
    m.handle_frame(now + Duration::from_secs(2), &me1.name, &ask(&all, 8))
        .unwrap();
    let (_, body) = m.poll_transmit().expect("an empty answer");
    assert_eq!(&body[..], &[TAG_STATE]);
}

/// The filter holds every member put in it, and wrongly holds few others: under 2% at a
/// thousand members (ten bits a member, seven positions).
#[test]
fn the_ask_filter_has_no_false_negatives_and_few_false_positives() {
    let hash = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234;
    for n in [3usize, 100, 1000] {
        let mut bits = vec![0u8; sync::Filter::len_for(n)];
        sync::Filter::fill(&mut bits, 42, (0..n as u64).map(hash));
        let mut body = 42u64.to_le_bytes().to_vec();
        body.extend_from_slice(&bits);
        let f = sync::Filter::read(&body).expect("a filter of an allowed length");
        assert!(
            (0..n as u64).all(|i| f.holds(hash(i))),
            "{n}: a member missing"
        );
        let wrong = (1_000_000..1_010_000u64)
            .filter(|i| f.holds(hash(*i)))
            .count();
        assert!(wrong < 200, "{n}: {wrong} of 10000 wrongly held");
    }
    assert!(sync::Filter::read(&[0; 8 + 7]).is_none(), "too short");
    assert!(sync::Filter::read(&[0; 8 + 1361]).is_none(), "too long");
    // An ask's body: nothing, a digest, or a digest with a filter; nothing else.
    for (len, ok) in [
        (0, true),
        (5, false),
        (12, true),
        (20, false),
        (27, false),
        (28, true),
    ]
    .into_iter()
    .chain([(1380, true), (1381, false)])
    {
        assert_eq!(sync::read_ask(&vec![0; len]).is_ok(), ok, "{len} bytes");
    }
}

/// The filter rides only on asks made while the view changed lately (and the joining
/// rounds): at rest the periodic ask is the digest alone, so what a node sends at rest
/// does not grow with the cluster.
#[test]
fn at_rest_the_periodic_ask_carries_no_filter() {
    let c = MembershipConfig {
        announce_period: Duration::from_secs(8),
        ..cfg()
    };
    let mut net = Net::at_rest(12, c);
    let sizes = |net: &mut Net, secs: u64| {
        let mut v = Vec::new();
        for _ in 0..secs * 200 {
            net.step();
            v.extend(
                net.wire
                    .iter()
                    .filter(|w| w.1 == 0 && w.3[0] == TAG_STATE_ASK)
                    .map(|w| w.3.len()),
            );
        }
        v.dedup();
        v
    };
    // Right after the join the view changed lately: filtered asks (13 + 8 + 15 bytes).
    let early = sizes(&mut net, 3);
    assert!(early.iter().any(|l| *l > 1 + sync::DIGEST_LEN), "{early:?}");
    // Past the backoff, at rest: the digest alone.
    sizes(&mut net, 20);
    let rest = sizes(&mut net, 20);
    assert!(!rest.is_empty(), "node 0 compared at rest");
    assert!(rest.iter().all(|l| *l == 1 + sync::DIGEST_LEN), "{rest:?}");
}
