//! After any input: foca's timer requests become deadlines, and SWIM's member list is
//! compared with the view to report what changed (events, and the delta the IO layer
//! publishes). At a thousand members this walk ran after nearly every packet of a join,
//! so it first compares each member with what it was at the same place of the list.

use super::*;

impl Membership {
    /// What changed in the view since the last call (the first call says `Whole`). The
    /// IO layer keeps its published copy with this: at a thousand members joining, a
    /// copy of the whole view at each change (the view changes at nearly every packet)
    /// made each node's join quadratic.
    pub fn take_view_delta(&mut self) -> ViewDelta {
        if std::mem::take(&mut self.view_whole) {
            self.view_changed.clear();
            return ViewDelta::Whole;
        }
        if self.view_changed.is_empty() {
            return ViewDelta::Unchanged;
        }
        let mut names = std::mem::take(&mut self.view_changed);
        names.sort_unstable();
        names.dedup();
        let entries = names
            .iter()
            .filter_map(|n| self.view.get(n).cloned())
            .collect();
        names.clear();
        self.view_changed = names;
        ViewDelta::Changed(entries)
    }

    /// Note `name` in `names`, a list of at most `max` that stands for everything once
    /// `all` is set (and is then emptied): the view entries that changed
    /// (`view_changed`, `view_whole`), the members the inputs named (`dirty`, `dirty_all`).
    /// Fields apart: called while foca's list is borrowed.
    pub(super) fn note_name(names: &mut Vec<Name>, all: &mut bool, max: usize, name: &Name) {
        if *all {
            return;
        }
        if names.len() >= max {
            names.clear();
            *all = true;
            return;
        }
        names.push(name.detached());
    }

    /// After any input: turn foca's timer requests into deadlines, and compare the member
    /// list with the view to report what changed: all of it (`walk`), or nothing.
    pub(super) fn after(&mut self, now: Instant, walk: bool) {
        self.after_walk(now, if walk { Walk::All } else { Walk::Not });
    }

    /// `after`, comparing with the view as much of the list as `walk` says.
    pub(super) fn after_walk(&mut self, now: Instant, walk: Walk) {
        for (t, mut d) in self.out.timers.drain(..) {
            if is_probe_timer(&t) {
                d *= 1 + self.slowness;
            }
            self.seq += 1;
            self.timers.insert((now + d, self.seq), t);
        }
        // A "you are down" notice goes only to a member that is down here (foca also sends
        // one when a refuted suspicion's timer fires).
        let before = self.out.sends.len();
        let foca = &self.foca;
        self.out.sends.retain(|s| {
            s.kind != Kind::DownNotice || !foca.iter_members().any(|m| *m.id() == s.to)
        });
        self.counters.stale_down_notices += (before - self.out.sends.len()) as u64;
        // What the inputs noted counts whatever they returned: a packet that foca took
        // in part and then refused (it did not decode to the end) named its members all
        // the same.
        let walk = if self.dirty_all {
            Walk::All
        } else if !self.dirty.is_empty() {
            walk.max(Walk::Named)
        } else {
            walk
        };
        self.dirty_all = false;
        if walk != Walk::Named {
            self.dirty.clear();
        }
        if walk == Walk::Not {
            return;
        }
        self.fed.clear();
        let mut pass = Pass::default();
        let me = self.foca.identity().name.clone();
        if walk == Walk::Named {
            // Only the members the inputs named (each packet's sender and the updates it
            // carried): what else SWIM lists did not move. A member is found through
            // foca's index, and skipped if it is as this node last took it.
            let mut dirty = std::mem::take(&mut self.dirty);
            for name in &dirty {
                if *name == me {
                    continue;
                }
                let Some(m) = self.foca.member_by_addr(name) else {
                    continue;
                };
                let same = self
                    .swim
                    .get(name)
                    .is_some_and(|h| h.is(m.id(), m.incarnation(), m.state()));
                if same && m.state() != State::Down {
                    continue;
                }
                let m = m.clone();
                self.look_at(now, &m, &mut pass);
            }
            dirty.clear();
            self.dirty = dirty;
            self.after_pass(now, pass);
            return;
        }
        // Of the members SWIM lists, those in the view once this pass is done.
        let mut listed = 0;
        let mut pos = 0;
        // Members not found as they were: looked at once the list is no longer borrowed.
        let mut moved = Vec::new();
        for m in self.foca.iter_membership_state() {
            let id = m.id();
            let at = pos;
            pos += 1;
            if self.order.len() < pos {
                self.order.push(None);
            }
            if id.name == me {
                continue;
            }
            // Most members are as this node last reported them: found as they were at the
            // same place of SWIM's list (a comparison, in order), else by one lookup. This
            // runs after inputs, and at a thousand members comparing each in full (four
            // lookups and a set of every name) was most of a node's work; then the lookup
            // alone was (a cache miss a member, with a thousand processes on two CPUs).
            // (Down ones are looked at each time: what is reported depends on the clock.)
            let same = |(old, inc, state): &(MemberId, foca::Incarnation, State)| {
                old == id && *inc == m.incarnation() && *state == m.state()
            };
            if m.state() != State::Down {
                if self.order[at].as_ref().is_some_and(same) {
                    listed += 1;
                    continue;
                }
                if self
                    .swim
                    .get(&id.name)
                    .is_some_and(|h| h.is(id, m.incarnation(), m.state()))
                {
                    self.order[at] = Some((id.clone(), m.incarnation(), m.state()));
                    listed += 1;
                    continue;
                }
            }
            // Set again below once the member is taken as it is now.
            self.order[at] = None;
            moved.push((at, m.clone()));
        }
        for (at, m) in moved {
            if self.look_at(now, &m, &mut pass) {
                listed += 1;
                if m.state() != State::Down {
                    self.order[at] = Some((m.id().clone(), m.incarnation(), m.state()));
                }
            }
        }
        self.order.truncate(pos);
        // Forgotten by SWIM (down for `forget_down_after`): forgotten here too. Every name
        // SWIM lists is in the view or refused, so only then is a set of them needed.
        let mut again = false;
        if listed < self.view.len() || !self.refused.is_empty() {
            let seen: HashSet<Name, NameHash> = self
                .foca
                .iter_membership_state()
                .map(|m| m.id().name.clone())
                .filter(|n| *n != me)
                .collect();
            let shrank = listed < self.view.len();
            pass.view_moved |= shrank;
            if shrank {
                self.view.retain(|n, _| seen.contains(n));
                self.view_whole = true;
                self.view_changed.clear();
                let view = &self.view;
                self.heard.retain(|n, _| view.contains_key(n));
                self.swim.retain(|n, _| view.contains_key(n));
                // Only what `swim` still holds may be found in order.
                self.order.clear();
            }
            self.refused.retain(|n| seen.contains(n));
            again = shrank && !self.refused.is_empty();
        }
        self.after_pass(now, pass);
        // Room was made: members refused in this pass are looked at again now, as every
        // input used to (the next one may not walk the list). Once: the view now holds
        // only what SWIM lists, so that pass cannot shrink it.
        if again {
            self.after(now, true);
        }
    }

    /// What a pass found to do once it is over: compare soon if the view moved, announce
    /// to members learnt while joining, ask a seed that answered for its members.
    fn after_pass(&mut self, now: Instant, pass: Pass) {
        if pass.view_moved {
            self.sync_soon(now);
        }
        // Their answers come back as input, whose `after` finds nothing more to announce.
        for id in pass.announce {
            let r = self.foca.announce(id, &mut self.out);
            self.result(r);
        }
        if let Some(id) = pass.sync_from {
            self.ask_state(id, None, false);
            self.sync_tries = SYNC_TRIES;
            self.sync_round = (false, false);
            self.sync_at = now + self.cfg.probe_period;
        }
    }

    /// Take member `m` as SWIM lists it now: its state in the view, the event if that
    /// changed, and what to do after the pass (`pass`). Returns whether it is in the view
    /// (it may have found no room).
    fn look_at(&mut self, now: Instant, m: &Member<MemberId>, pass: &mut Pass) -> bool {
        let id = m.id();
        let state = match m.state() {
            State::Alive => MemberState::Alive,
            State::Suspect => MemberState::Suspect,
            State::Down
                if self
                    .left
                    .get(&id.name)
                    .is_some_and(|l| *l == (id.started, id.bump)) =>
            {
                MemberState::Left
            }
            State::Down => MemberState::Down,
        };
        // Down in SWIM, but heard from directly since the suspicion could have begun:
        // still reported live (as suspect) until `suspicion_timeout` after it was last
        // heard. It is told it is down, and comes back under a renewed identity.
        let state = match (state, self.view.get(&id.name)) {
            (MemberState::Down, Some((old, old_state))) if old == id && old_state.is_live() => {
                match self.heard.get(&id.name) {
                    Some(&(started, at))
                        if started == id.started && at + self.cfg.suspicion_timeout > now =>
                    {
                        // Looked at again when the hold ends or a probe period on,
                        // whichever is first; each time, an announce to it (SWIM
                        // stopped talking to it) brings its current identity back.
                        let until =
                            (at + self.cfg.suspicion_timeout).min(now + self.cfg.probe_period);
                        if !self.held.iter().any(|h| h.0 == id.name) {
                            if self.held.len() < self.cfg.max_members {
                                self.held.push((id.name.detached(), until));
                            }
                            self.counters.downs_held += 1;
                            pass.announce.push(id.clone());
                        }
                        MemberState::Suspect
                    }
                    _ => MemberState::Down,
                }
            }
            (s, _) => s,
        };
        // No room in the view for a live newcomer: a member that is down or left (listed
        // until SWIM forgets it, `forget_down_after`) gives it its place, so departed
        // members (churn, or word of invented ones) never keep live ones out. It is
        // refused from then on, as any member past the limit.
        if self.view.len() >= self.cfg.max_members
            && state.is_live()
            && self.departed_in_view
            && !self.view.contains_key(&id.name)
        {
            let gone = self
                .view
                .iter()
                .find(|(_, (_, s))| !s.is_live())
                .map(|(n, _)| n.clone());
            match gone {
                Some(n) => {
                    self.view.remove(&n);
                    self.heard.remove(&n);
                    self.swim.remove(&n);
                    if self.refused.len() >= REFUSED_NAMES.max(self.cfg.max_members) {
                        self.refused.clear();
                    }
                    self.refused.insert(n.detached());
                    // A member left the view: the whole view goes out (a delta of changed
                    // entries says no member left, see `ViewDelta`).
                    pass.view_moved = true;
                    self.view_whole = true;
                    self.view_changed.clear();
                    self.counters.departed_evicted += 1;
                }
                // None left to give way: no need to look again until one departs.
                None => self.departed_in_view = false,
            }
        }
        // No room in the view: never reported (so never dialled or announced to),
        // counted once. SWIM forgets it once it stops answering.
        if self.view.len() >= self.cfg.max_members && !self.view.contains_key(&id.name) {
            if !self.refused.contains(&id.name) {
                if self.refused.len() >= REFUSED_NAMES.max(self.cfg.max_members) {
                    self.refused.clear();
                }
                self.refused.insert(id.name.detached());
                self.counters.members_refused += 1;
            }
            return false;
        }
        let event = match self.view.get(&id.name) {
            None if state.is_live() => Some(MemberEvent::Joined(id.clone())),
            None => None,
            Some((old, old_state))
                if old != id
                    && old.started == id.started
                    && old_state.is_live()
                    && state.is_live() =>
            {
                // The same process renewed its SWIM identity (it was told it was down,
                // and came back) while it was live here: nothing departed.
                (*old_state == MemberState::Suspect && state == MemberState::Alive)
                    .then(|| MemberEvent::Refuted(id.clone()))
            }
            Some((old, old_state)) if old != id => {
                // Replaced by a new incarnation: the old one is gone.
                if old_state.is_live() {
                    self.events.push_back(MemberEvent::Down(old.clone()));
                }
                state.is_live().then(|| MemberEvent::Joined(id.clone()))
            }
            Some((_, old_state)) if *old_state == state => None,
            Some((_, old_state)) => match state {
                MemberState::Alive if *old_state == MemberState::Suspect => {
                    Some(MemberEvent::Refuted(id.clone()))
                }
                MemberState::Alive => Some(MemberEvent::Joined(id.clone())),
                MemberState::Suspect => Some(MemberEvent::Suspected(id.clone())),
                MemberState::Down => Some(MemberEvent::Down(id.clone())),
                MemberState::Left => Some(MemberEvent::Left(id.clone())),
            },
        };
        // A suspicion heard of (from gossip, or raised here): this node keeps its own
        // deadline for it, as SWIM's paper has every member do (foca declares down only
        // what its own probes suspected, and then the verdict still has to spread;
        // with no connection to feed the detector, that doubled the time until every
        // member saw a killed node down). A refutation (a newer incarnation) before the
        // deadline voids it.
        if matches!(event, Some(MemberEvent::Suspected(_)))
            && m.state() == State::Suspect
            && !self.hinted.iter().any(|h| h.1 == *id)
            && self.hinted.len() < self.cfg.max_members
        {
            self.hinted.push((
                now + self.cfg.suspicion_timeout,
                id.clone(),
                m.incarnation(),
            ));
        }
        if let Some(e) = event {
            if self.bootstrap > 0 && matches!(e, MemberEvent::Joined(_)) {
                self.bootstrap -= 1;
                pass.announce.push(id.clone());
            }
            // Joined through a seed that just answered: its full state brings the
            // rest of a large cluster at once (see `sync`).
            if !self.synced
                && matches!(e, MemberEvent::Joined(_))
                && self.seeds.iter().any(|s| s.name == id.name)
            {
                self.synced = true;
                pass.sync_from = Some(id.clone());
            }
            self.events.push_back(e);
        }
        if !state.is_live() {
            self.departed_in_view = true;
        }
        let touched = match self.view.get_mut(&id.name) {
            Some(v) if v.0 == *id && v.1 == state => false,
            Some(v) => {
                *v = (id.clone(), state);
                true
            }
            None => {
                self.refused.remove(&id.name);
                self.view.insert(id.name.detached(), (id.clone(), state));
                true
            }
        };
        if touched {
            pass.view_moved = true;
            Self::note_name(
                &mut self.view_changed,
                &mut self.view_whole,
                self.cfg.max_members,
                &id.name,
            );
        }
        let held = Held::of(id, m.incarnation(), m.state());
        match self.swim.get_mut(&id.name) {
            Some(v) => *v = held,
            None => {
                self.swim.insert(id.name.detached(), held);
            }
        }
        true
    }

    /// Where the view does not say what SWIM's list says of a live member it lists, if
    /// anywhere (for the tests and the fuzzer: after any input, none). Down members are not
    /// compared: what is reported of them also depends on the clock, and a timer walks the
    /// whole list.
    pub(crate) fn view_disagrees(&self) -> Option<String> {
        let me = &self.foca.identity().name;
        for s in self.foca.iter_membership_state() {
            let id = s.id();
            if id.name == *me || s.state() == State::Down || self.refused.contains(&id.name) {
                continue;
            }
            let want = match s.state() {
                State::Alive => MemberState::Alive,
                _ => MemberState::Suspect,
            };
            let got = self.view.get(&id.name);
            if !got.is_some_and(|(v, st)| v == id && *st == want) {
                return Some(format!(
                    "{me}: SWIM lists {id:?} as {:?} (incarnation {}), the view has {got:?}",
                    s.state(),
                    s.incarnation()
                ));
            }
        }
        None
    }

    /// Note that an input named member `name` (a packet's sender, an update): the next
    /// `after_walk(.., Walk::Named)` looks at it. Past `max_members` names the whole list
    /// is walked instead.
    pub(super) fn name_dirty(&mut self, name: &Name) {
        Self::note_name(
            &mut self.dirty,
            &mut self.dirty_all,
            self.cfg.max_members,
            name,
        );
    }
}

/// How much of SWIM's member list `after_walk` compares with the view.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum Walk {
    /// None of it: nothing in it moved.
    Not,
    /// The members named since the last pass (`name_dirty`): the inputs were packets,
    /// which change only their sender and the members their updates are about.
    Named,
    /// All of it (timers, joins, leaves, anything else).
    All,
}

/// What a pass of `after` found to do once it is over (see `Membership::after_pass`).
#[derive(Default)]
pub(super) struct Pass {
    announce: Vec<MemberId>,
    sync_from: Option<MemberId>,
    view_moved: bool,
}
