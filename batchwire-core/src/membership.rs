//! Cluster membership, sans IO: SWIM (the [`foca`] crate: probes, indirect probes,
//! suspicion, infection-style dissemination) glued to batchwire's authenticated senders.
//!
//! [`Membership`] owns one `Foca` instance and everything around it that is a protocol rule:
//! the timers (as deadlines, from the `now` passed in), the check that a packet comes from
//! the member that sealed its datagram, a size limit and a rate limit per sender,
//! the leave notice that tells a graceful leave from a crash, the transport's hint that a
//! member is unreachable, and the events a view change produces. The IO layer moves the
//! packets (MEMBER bodies in sealed datagrams, see [`datagram`]) and calls, in the manner
//! of quinn-proto:
//!
//! 1. inputs: [`Membership::handle_join`], [`Membership::handle_frame`],
//!    [`Membership::handle_unreachable`], [`Membership::handle_leave`] and
//!    [`Membership::handle_timeout`], each with `now`;
//! 2. outputs, after any input: [`Membership::poll_transmit`] (packets to send),
//!    [`Membership::poll_event`] (view changes), [`Membership::poll_timeout`] (when to call
//!    `handle_timeout` next).
//!
//! Trust: a packet is only ever fed in from a datagram that opened with the cluster key
//! (its sealer proved the secret), and the sender field inside must be that sealer. A node
//! appears in a view only once it proved the secret in a handshake with some member (the
//! join); what members say about third parties is believed (they hold the secret too),
//! within the view's bounds.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use foca::{
    Codec as _, Foca, Member, NoCustomBroadcast, Notification, PostcardCodec, Runtime, State, Timer,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::codec::{Name, NameHash};

/// The tag of a MEMBER body holding a SWIM packet.
const TAG_SWIM: u8 = 0;
/// The tag of a MEMBER body saying "I, the authenticated sender, am leaving".
const TAG_LEAVE: u8 = 1;
/// The tag of a MEMBER body asking for the sender's members (see [`sync`]).
const TAG_STATE_ASK: u8 = 2;
/// The tag of a MEMBER body with (part of) the answer: foca-encoded members.
const TAG_STATE: u8 = 3;
/// Most random members asked for the full state, a probe period apart, after the first
/// ask when joining (see `Membership::sync_tries`).
const SYNC_TRIES: u8 = 8;
/// Most a starved node stretches its probes: `1 + MAX_SLOWNESS` times (Lifeguard's 8).
const MAX_SLOWNESS: u32 = 8;
/// A probe's own timers: its start (which also gives up on the last one) and the
/// indirect probe. Local health stretches them and measures lateness by them.
fn is_probe_timer(t: &Timer<MemberId>) -> bool {
    matches!(
        t,
        Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. }
    )
}

/// Largest SWIM packet (foca's `max_packet_size`); a MEMBER body adds one tag byte.
pub const MAX_PACKET: usize = 1400;

pub use types::{
    MAX_MEMBERS_LIMIT, MemberCounters, MemberError, MemberEvent, MemberId, MemberState,
    MembershipConfig, ViewDelta,
};

/// A packet foca asked to send.
struct Send {
    to: MemberId,
    body: Bytes,
    /// A TurnUndead ("the cluster thinks you are down"): sent only to a member that is
    /// down in this node's view (see `Membership::after`).
    down_notice: bool,
}

/// What foca asks for while handling one input.
#[derive(Default)]
struct Out {
    sends: VecDeque<Send>,
    timers: Vec<(Timer<MemberId>, Duration)>,
}

impl Runtime<MemberId> for Out {
    fn notify(&mut self, _: Notification<'_, MemberId>) {
        // Ups, downs and renames are read off the member list after each input (suspicion
        // has no notification): nothing here.
    }
    fn send_to(&mut self, to: MemberId, data: &[u8]) {
        let down_notice = PostcardCodec
            .decode_header(data)
            .is_ok_and(|h: foca::Header<MemberId>| h.message == foca::Message::TurnUndead);
        let mut b = BytesMut::with_capacity(data.len() + 1);
        b.put_u8(TAG_SWIM);
        b.put_slice(data);
        self.sends.push_back(Send {
            to,
            body: b.freeze(),
            down_notice,
        });
    }
    fn submit_after(&mut self, event: Timer<MemberId>, after: Duration) {
        self.timers.push((event, after));
    }
}

/// A token bucket per sending peer.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The membership state machine (see the module documentation).
///
/// Two rules on top of SWIM keep a member whose connections keep breaking from being
/// declared down while it is alive (a broken connection is not a dead node):
///
/// - **Direct evidence before suspicion.** A member that SWIM declares down (its suspicion
///   was not refuted in time: the refutation can be lost with the connection that carried
///   it) but that was heard from directly (a handshake completed with it,
///   [`Membership::handle_heard`], or a SWIM packet from it) within the last
///   `suspicion_timeout` is not reported down: it stays suspect here, SWIM tells it it is
///   down, and it comes back under a renewed identity, which is not a departure either. A
///   member that is really gone is heard no more, and is reported down at SWIM's deadline
///   or `suspicion_timeout` after its last sign of life, whichever is later.
/// - **No stale "you are down" notice.** foca 2.0 sends a member its courtesy TurnUndead
///   when a suspicion timer fires even if the member refuted the suspicion meanwhile (the
///   timer's condition fails but the notice goes out). The member then believes the
///   cluster declared it down and rejoins under a new identity, which every other member
///   saw as the old one going down. Such notices are dropped here unless the member is
///   down in this node's view; a renewed identity of the same process (same `started`)
///   that replaces a live one is not reported as a departure.
pub struct Membership {
    foca: Foca<MemberId, PostcardCodec, SmallRng, NoCustomBroadcast>,
    cfg: MembershipConfig,
    out: Out,
    timers: BTreeMap<(Instant, u64), Timer<MemberId>>,
    seq: u64,
    /// What this node reported of each member (the view).
    view: HashMap<Name, (MemberId, MemberState), NameHash>,
    /// Names whose view entry changed since `take_view_delta` (with repeats; cleared past
    /// `max_members`, and then `view_whole` is set), and whether a member left the view.
    view_changed: Vec<Name>,
    view_whole: bool,
    /// What SWIM held of each member of the view at the end of the last input: its id,
    /// incarnation and state. A member found as it was is skipped by `after`, and an
    /// update that repeats it is old news that `handle_frame` takes out before foca sees
    /// it (foca finds a member by a walk of its whole list, so at a thousand members the
    /// dozen copies of every update that SWIM's dissemination brings cost most of a node's
    /// work).
    swim: HashMap<Name, (MemberId, foca::Incarnation, State), NameHash>,
    /// Updates given to SWIM since the list was last compared (`handle_frames` compares
    /// once a batch): the same update from another sender in the batch is old news too.
    /// At most twice `max_members`; emptied by each compare.
    fed: HashMap<Name, (MemberId, foca::Incarnation, State), NameHash>,
    /// `swim` again, in the order of SWIM's list at the last compare (which moves only
    /// when members come or go, or a probe round ends): entry i is what `swim` holds of
    /// the member then at place i, `None` for this node, a down or refused member, or a
    /// place not compared since the list last shrank.
    order: Vec<Option<(MemberId, foca::Incarnation, State)>>,
    /// Members that sent a leave notice (name → start and bump), so their going down is
    /// reported as a leave.
    left: HashMap<Name, (u64, u16), NameHash>,
    events: VecDeque<MemberEvent>,
    buckets: HashMap<Name, Bucket, NameHash>,
    counters: MemberCounters,
    left_cluster: bool,
    /// Suspicions this node raised on the transport's hint: (deadline, member, its SWIM
    /// incarnation then). Foca declares down only members its own probes suspected, so
    /// this node does the same for these: still suspect at the deadline, same incarnation
    /// (it did not refute), and it is declared down.
    hinted: Vec<(Instant, MemberId, foca::Incarnation)>,
    /// When each member of the view was last heard from directly: (its `started`, when).
    /// Bounded by the view: only members in it are recorded.
    heard: HashMap<Name, (u64, Instant), NameHash>,
    /// Members down in SWIM but still reported live, because they were heard from directly
    /// within `suspicion_timeout`: when to look again. At most one entry per view member.
    held: Vec<(Name, Instant)>,
    /// Members SWIM knows but the view had no room for (`max_members`), so each is
    /// counted once and never reported. Only names SWIM still lists, at most
    /// `REFUSED_NAMES` or `max_members` (cleared when full: then counted again).
    refused: HashSet<Name, NameHash>,
    /// Announces left to make to members learnt while joining. A seed's answer lists at
    /// most a packet's worth of members (about 40); announcing to a few of them brings
    /// the rest, each answering with a random selection.
    bootstrap: u8,
    /// Whether this node asked for a full state since it joined (see [`sync`]), and when
    /// it asks a random member next.
    synced: bool,
    sync_at: Instant,
    /// Asks left while joining. The seed answers at most a few a second, and a member
    /// that answers may not know everyone yet either: of 512 nodes joining at once, a few
    /// missed some members for the 30 s until the periodic sync (nobody gossiped them any
    /// more, and a given member probes a given other once in 500 s). So a random member is
    /// asked each probe period until a round's answer brings nothing new (or none came
    /// and the tries ran out).
    sync_tries: u8,
    /// Of the current round: whether an answer came, and whether it told anything new.
    sync_round: (bool, bool),
    /// After the joining rounds, the wait until the next comparison: twice the probe
    /// period after the view changed, doubling each comparison while it does not, up to
    /// `announce_period` (see `sync_soon`); and when the last sync was asked.
    sync_every: Duration,
    synced_at: Instant,
    /// Local health (Lifeguard's multiplier): 0 while this node's timers run on time, up
    /// to [`MAX_SLOWNESS`] while they run late (the machine is starved: its acks are late
    /// too, so a probe's silence says little). Probes are started and given up on
    /// `1 + slowness` times later. Down by one each probe period with no late timer.
    slowness: u32,
    slowness_at: Instant,
    /// When each asker was last answered (at most 2 x `max_members`), and the node-wide
    /// budget of answers.
    answered: HashMap<Name, Instant, NameHash>,
    answers: Bucket,
    /// For the choice of whom to ask.
    rng: SmallRng,
    /// Seeds this node announced itself to (at most `MAX_SEEDS`, the latest of each
    /// name), and when to announce again if it is still alone: an announce or its answer
    /// may be lost, and nothing else would bring a node that knows nobody in.
    seeds: Vec<MemberId>,
    rejoin_at: Option<Instant>,
}

/// Seeds remembered for announcing again (see `Membership::seeds`).
const MAX_SEEDS: usize = 16;

/// Names of members refused for want of room, remembered to count each once.
const REFUSED_NAMES: usize = 4096;

/// Extra announces a joining node makes (see `Membership::bootstrap`).
const BOOTSTRAP_ANNOUNCES: u8 = 3;

impl Membership {
    /// A node `me` alone in its cluster until it joins one; `seed` seeds the random choice
    /// of members to probe (tests pass a fixed one).
    pub fn new(
        me: MemberId,
        cfg: MembershipConfig,
        seed: u64,
        now: Instant,
    ) -> Result<Membership, MemberError> {
        let announce_period = cfg.announce_period;
        let foca = Foca::new(
            me,
            cfg.foca()?,
            SmallRng::seed_from_u64(seed),
            PostcardCodec,
        );
        let mut m = Membership {
            foca,
            cfg,
            out: Out::default(),
            timers: BTreeMap::new(),
            seq: 0,
            view: HashMap::default(),
            view_changed: Vec::new(),
            view_whole: true,
            fed: HashMap::default(),
            order: Vec::new(),
            swim: HashMap::default(),
            left: HashMap::default(),
            events: VecDeque::new(),
            buckets: HashMap::default(),
            counters: MemberCounters::default(),
            left_cluster: false,
            hinted: Vec::new(),
            heard: HashMap::default(),
            held: Vec::new(),
            refused: HashSet::default(),
            bootstrap: 0,
            synced: false,
            sync_at: now + announce_period,
            sync_tries: 0,
            sync_round: (false, false),
            sync_every: announce_period,
            synced_at: now,
            slowness: 0,
            slowness_at: now,
            answered: HashMap::default(),
            answers: Bucket {
                tokens: sync::ANSWERS_PER_SECOND,
                at: now,
            },
            rng: SmallRng::seed_from_u64(seed ^ 0x5eed_5bc0_ffee),
            seeds: Vec::new(),
            rejoin_at: None,
        };
        m.after(now, true);
        Ok(m)
    }

    // ---- getters ----

    /// Members in the view (without this node), whatever their state.
    pub fn view_len(&self) -> usize {
        self.view.len()
    }

    /// Whether `name` is a member SWIM knows but the view had no room for (`max_members`):
    /// the IO layer sends it nothing (no peer, no thread, no dial).
    pub fn is_refused(&self, name: &[u8]) -> bool {
        self.refused.contains(name)
    }

    /// This node's own id.
    pub fn me(&self) -> &MemberId {
        self.foca.identity()
    }

    /// The view: every member this node knows of (itself not included), with its state.
    /// Down and left members stay listed for `forget_down_after`.
    pub fn members(&self) -> Vec<(MemberId, MemberState)> {
        let mut v = self.view_unsorted();
        v.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        v
    }

    /// `members` in no order.
    pub fn view_unsorted(&self) -> Vec<(MemberId, MemberState)> {
        self.view.values().cloned().collect()
    }

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

    /// Note that `name`'s view entry changed (fields apart: called while foca's list is
    /// borrowed).
    fn view_touched(changed: &mut Vec<Name>, whole: &mut bool, max: usize, name: &Name) {
        if *whole {
            return;
        }
        if changed.len() >= max {
            changed.clear();
            *whole = true;
            return;
        }
        changed.push(name.detached());
    }

    /// The state of the member called `name`, if it is in the view.
    pub fn state_of(&self, name: &[u8]) -> Option<(MemberId, MemberState)> {
        self.view.get(name).cloned()
    }

    /// Whether no other member is live in this node's view (a node that should join).
    pub fn is_alone(&self) -> bool {
        self.foca.num_members() == 0
    }

    pub fn counters(&self) -> MemberCounters {
        self.counters
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.cfg
    }

    // ---- inputs ----

    /// A connection to `seed` (dialled by address; the handshake told its name) is up:
    /// announce ourselves to it. Its answer brings the rest of the cluster.
    pub fn handle_join(&mut self, now: Instant, seed: MemberId) {
        if seed.name == self.me().name {
            return;
        }
        self.seeds.retain(|s| s.name != seed.name);
        if self.seeds.len() == MAX_SEEDS {
            self.seeds.remove(0);
        }
        self.seeds.push(seed.clone());
        self.synced = false;
        let r = self.foca.announce(seed, &mut self.out);
        self.result(r);
        self.bootstrap = BOOTSTRAP_ANNOUNCES;
        // Still alone a probe period from now: announce again (see `handle_timeout`).
        self.rejoin_at = Some(now + self.cfg.probe_period);
        self.after(now, true);
    }

    /// A MEMBER body from `from` (its datagram opened with the cluster key and was sealed
    /// by `from`).
    pub fn handle_frame(
        &mut self,
        now: Instant,
        from: &Name,
        body: &[u8],
    ) -> Result<(), MemberError> {
        let walk = self.frame_in(now, from, body)?;
        self.after(now, walk);
        Ok(())
    }

    /// MEMBER bodies read together (a socket's backlog), as `handle_frame` each, except
    /// that SWIM's member list is compared with the view once, after the last. That walk
    /// looks at every member; after each packet, at a thousand members joining (nearly
    /// every packet has news then), it was most of a node's work, and a node that falls
    /// behind reads larger batches. A body that breaks the rules goes to `refused` with
    /// the reason, and the others are taken.
    pub fn handle_frames<'a>(
        &mut self,
        now: Instant,
        frames: impl IntoIterator<Item = (&'a Name, &'a [u8])>,
        mut refused: impl FnMut(&'a Name, MemberError),
    ) {
        let (mut walk, mut any) = (false, false);
        for (from, body) in frames {
            match self.frame_in(now, from, body) {
                Ok(w) => {
                    walk |= w;
                    any = true;
                }
                Err(e) => refused(from, e),
            }
        }
        if any {
            self.after(now, walk);
        }
    }

    /// One MEMBER body into SWIM; returns whether SWIM's list may have changed.
    fn frame_in(&mut self, now: Instant, from: &Name, body: &[u8]) -> Result<bool, MemberError> {
        let Some((&tag, packet)) = body.split_first() else {
            return Err(MemberError::Empty);
        };
        if packet.len() > MAX_PACKET {
            return Err(MemberError::TooLarge {
                len: packet.len(),
                max: MAX_PACKET,
            });
        }
        if !self.admit(now, from) {
            self.counters.rate_limited += 1;
            return Ok(false);
        }
        self.counters.packets_in += 1;
        self.counters.bytes_in += body.len() as u64;
        // Whether SWIM's member list may have changed (see `after`).
        let mut walk = true;
        match tag {
            TAG_SWIM => {
                // The sender field must be the connection's peer: no member speaks for
                // another.
                let mut body = packet;
                let header: foca::Header<MemberId> = PostcardCodec
                    .decode_header(&mut body)
                    .map_err(|e| MemberError::Malformed(e.to_string()))?;
                if header.src.name != *from {
                    return Err(MemberError::Impersonation {
                        peer: from.clone(),
                        claimed: header.src.name,
                    });
                }
                // A packet from the member itself is direct evidence that it is alive.
                self.note_heard(now, from, header.src.started);
                let (fresh, news) = self.without_old_news(packet, &header, body);
                walk = news;
                let packet = fresh.as_deref().unwrap_or(packet);
                match self.foca.handle_data(packet, &mut self.out) {
                    Ok(()) => {}
                    Err(foca::Error::MalformedPacket | foca::Error::Decode(_)) => {
                        return Err(MemberError::Malformed(
                            "SWIM packet does not decode".to_string(),
                        ));
                    }
                    Err(_) => self.counters.ignored += 1,
                }
            }
            TAG_LEAVE => {
                if !packet.is_empty() {
                    return Err(MemberError::Malformed(
                        "leave notice with a body".to_string(),
                    ));
                }
                let known = self
                    .foca
                    .iter_members()
                    .find(|m| m.id().name == *from)
                    .map(|m| m.id().clone());
                if let Some(id) = known {
                    if self.left.len() >= self.cfg.max_members {
                        self.left.clear();
                    }
                    self.left.insert(from.detached(), (id.started, id.bump));
                    let r = self.foca.apply_many(
                        std::iter::once(Member::down(id)),
                        true,
                        &mut self.out,
                    );
                    self.result(r);
                }
            }
            TAG_STATE_ASK if packet.is_empty() => self.handle_state_ask(now, from, None)?,
            TAG_STATE_ASK if packet.len() == sync::DIGEST_LEN => {
                self.handle_state_ask(now, from, Some(packet))?
            }
            TAG_STATE_ASK => {
                return Err(MemberError::Malformed(format!(
                    "state ask with a body of {} bytes (allowed: 0 or {})",
                    packet.len(),
                    sync::DIGEST_LEN
                )));
            }
            TAG_STATE => walk = self.handle_state(packet)?,
            other => return Err(MemberError::UnknownTag(other)),
        }
        Ok(walk)
    }

    /// The transport completed a handshake with the node `name` whose process started at
    /// `started` (its incarnation): direct evidence that it is alive, which puts off any
    /// suspicion of it (see [`Membership`]).
    pub fn handle_heard(&mut self, now: Instant, name: &Name, started: u64) {
        self.note_heard(now, name, started);
    }

    /// The transport lost its connection to `name` and could not open a new one: suspect
    /// it now rather than at its next probe (it refutes if it is alive).
    pub fn handle_unreachable(&mut self, now: Instant, name: &[u8]) {
        let m = self
            .foca
            .iter_members()
            .find(|m| m.id().name.as_bytes() == name && m.state() == State::Alive)
            .map(|m| Member::new(m.id().clone(), m.incarnation(), State::Suspect));
        if let Some(m) = m {
            // One deadline per member, for this suspicion: an older one is for an
            // incarnation the member has since refuted (it was alive to suspect again).
            let deadline = now + self.cfg.suspicion_timeout;
            let entry = (deadline, m.id().clone(), m.incarnation());
            if let Some(h) = self.hinted.iter_mut().find(|h| h.1 == *m.id()) {
                *h = entry;
            } else if self.hinted.len() < self.cfg.max_members {
                self.hinted.push(entry);
            }
            let r = self
                .foca
                .apply_many(std::iter::once(m), true, &mut self.out);
            self.result(r);
            self.after(now, true);
        }
    }

    /// Leave gracefully: a leave notice to every live member, then SWIM's own leave
    /// (this node declares itself down and gossips it). Afterwards this node sends nothing
    /// more on its own.
    pub fn handle_leave(&mut self, now: Instant) {
        if self.left_cluster {
            return;
        }
        self.left_cluster = true;
        let live: Vec<MemberId> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        for id in live {
            self.out.sends.push_back(Send {
                to: id,
                body: Bytes::from_static(&[TAG_LEAVE]),
                down_notice: false,
            });
        }
        let r = self.foca.leave_cluster(&mut self.out);
        self.result(r);
        self.after(now, true);
        self.timers.clear();
        self.hinted.clear();
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Whether SWIM's member list may have changed: gossip, announces and the send of
        // an indirect probe change nothing; the end of a probe (which may suspect), a
        // suspicion's end and forgetting do.
        let mut walk = false;
        self.note_lateness(now);
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            walk |= !matches!(
                timer,
                Timer::PeriodicGossip(_)
                    | Timer::PeriodicAnnounce(_)
                    | Timer::PeriodicAnnounceDown(_)
                    | Timer::SendIndirectProbe { .. }
            );
            let r = self.foca.handle_timer(timer, &mut self.out);
            self.result(r);
        }
        let (due, later): (Vec<_>, Vec<_>) =
            self.hinted.drain(..).partition(|(at, _, _)| *at <= now);
        self.hinted = later;
        walk |= !due.is_empty();
        // Held downs whose time came are looked at again by `after`.
        let held = self.held.len();
        self.held.retain(|(_, at)| *at > now);
        walk |= self.held.len() < held;
        // Anti-entropy: while joining, a full state from a random member each probe period;
        // then a comparison with a random member (see [`sync`]).
        if self.sync_at <= now {
            // Joining: again unless the last round's answer had nothing new.
            if self.sync_round == (true, false) {
                self.sync_tries = 0;
            }
            self.sync_round = (false, false);
            let joining = self.sync_tries > 0;
            self.sync_at = now
                + if joining {
                    self.sync_tries -= 1;
                    self.cfg.probe_period
                } else {
                    let every = self.sync_every;
                    self.sync_every = (every * 2).min(self.cfg.announce_period);
                    every
                };
            self.synced_at = now;
            if !self.left_cluster {
                self.ask_random(!joining);
            }
        }
        // Joining and still alone: the announce or its answer was lost; again, to every
        // seed, each probe period until someone answers (or this node leaves).
        if self.rejoin_at.is_some_and(|t| t <= now) {
            if self.is_alone() && !self.left_cluster {
                for seed in self.seeds.clone() {
                    let r = self.foca.announce(seed, &mut self.out);
                    self.result(r);
                }
                self.counters.rejoins += 1;
                self.rejoin_at = Some(now + self.cfg.probe_period);
            } else {
                self.rejoin_at = None;
            }
        }
        for (_, id, inc) in due {
            let still = self
                .foca
                .iter_members()
                .any(|m| *m.id() == id && m.state() == State::Suspect && m.incarnation() == inc);
            if still {
                let r =
                    self.foca
                        .apply_many(std::iter::once(Member::down(id)), true, &mut self.out);
                self.result(r);
            }
        }
        self.after(now, walk);
    }

    // ---- outputs ----

    /// The next packet to send: to whom, and the MEMBER body (sealed into a datagram by
    /// the IO layer).
    pub fn poll_transmit(&mut self) -> Option<(MemberId, Bytes)> {
        let Send { to, body, .. } = self.out.sends.pop_front()?;
        self.counters.packets_out += 1;
        self.counters.bytes_out += body.len() as u64;
        Some((to, body))
    }

    /// The next change of the view.
    pub fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.pop_front()
    }

    /// When `handle_timeout` is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let hinted = self
            .hinted
            .iter()
            .map(|h| h.0)
            .chain(self.held.iter().map(|h| h.1))
            .chain(self.rejoin_at)
            .chain(std::iter::once(self.sync_at))
            .min();
        // Periodic gossip only re-arms itself while there is nothing to gossip: that timer
        // waits for news (it fires at the first turn after some come) instead of waking
        // the thread five times a second at rest for nothing.
        let quiet = self.foca.updates_backlog() == 0 && self.foca.custom_broadcast_backlog() == 0;
        let t = self
            .timers
            .iter()
            .find(|(_, t)| !(quiet && matches!(t, Timer::PeriodicGossip(_))))
            .map(|(k, _)| k.0);
        match (t, hinted) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- internals ----

    /// Record that `name` (a member of the view, whose process started at `started`) was
    /// heard from directly at `now`.
    fn note_heard(&mut self, now: Instant, name: &Name, started: u64) {
        if let Some(h) = self.heard.get_mut(name) {
            *h = (started, now);
        } else if self.view.contains_key(name) {
            self.heard.insert(name.detached(), (started, now));
        }
    }

    /// Whether a packet from `from` fits its rate (a bucket of `frames_per_second`,
    /// refilled continuously). The table is bounded: past twice the view's bound it starts
    /// over.
    fn admit(&mut self, now: Instant, from: &Name) -> bool {
        let rate = self.cfg.frames_per_second as f64;
        if self.buckets.len() > self.cfg.max_members.saturating_mul(2)
            && !self.buckets.contains_key(from)
        {
            self.buckets.clear();
        }
        let b = self.buckets.entry(from.detached()).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + dt * rate).min(rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// `packet` (`header`, then `body`) without the updates that repeat what SWIM holds
    /// (see `swim`), or `None` when it has none (or does not decode: foca then says why).
    /// Such an update is a no-op in foca: a member's state only moves forward (a higher
    /// incarnation, alive to suspect to down, or a newer identity that wins), so what it
    /// held once it never takes back. Updates about this node are always left in.
    ///
    /// Also says whether the packet may change SWIM's member list at all: not when every
    /// update was old news and its sender is live here under the same id and incarnation
    /// (foca takes a packet's sender as alive; a down sender is looked at again, as what
    /// is reported of it depends on when it was last heard).
    fn without_old_news(
        &mut self,
        packet: &[u8],
        header: &foca::Header<MemberId>,
        body: &[u8],
    ) -> (Option<Vec<u8>>, bool) {
        let src_known = self
            .swim
            .get(&header.src.name)
            .is_some_and(|(id, inc, state)| {
                *id == header.src && *inc == header.src_incarnation && *state != State::Down
            });
        // Only these carry updates (an announce has no body; a broadcast carries none).
        let updates = !matches!(
            header.message,
            foca::Message::Announce | foca::Message::Broadcast
        );
        if !updates || body.len() < 2 {
            return (None, !(src_known && body.is_empty()));
        }
        let count = u16::from_be_bytes([body[0], body[1]]);
        let mut rest = &body[2..];
        // The count is the sender's word: room for what a packet can hold at most.
        let mut kept: Vec<&[u8]> = Vec::with_capacity(usize::from(count).min(MAX_PACKET / 16));
        let mut old = 0;
        for _ in 0..count {
            let before = rest;
            let Ok(m): Result<Member<MemberId>, _> = PostcardCodec.decode_member(&mut rest) else {
                return (None, true);
            };
            if self.is_old_news(&m) {
                old += 1;
            } else {
                kept.push(&before[..before.len() - rest.len()]);
                if self.fed.len() < self.cfg.max_members.saturating_mul(2) {
                    let (id, inc, state) = (m.id().clone(), m.incarnation(), m.state());
                    self.fed.insert(id.name.detached(), (id, inc, state));
                }
            }
        }
        let news = !kept.is_empty() || !src_known;
        if old == 0 {
            return (None, news);
        }
        self.counters.old_news += old;
        let mut out = Vec::with_capacity(packet.len());
        out.extend_from_slice(&packet[..packet.len() - body.len()]);
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        for k in kept {
            out.extend_from_slice(k);
        }
        out.extend_from_slice(rest);
        (Some(out), news)
    }

    /// Whether `m` is exactly what SWIM holds of that member, or an update SWIM was
    /// given since the list was last compared (never so for this node). Applied again,
    /// SWIM would find it no newer than what it holds: a no-op.
    fn is_old_news(&self, m: &Member<MemberId>) -> bool {
        let same = |(id, inc, state): &(MemberId, foca::Incarnation, State)| {
            id == m.id() && *inc == m.incarnation() && *state == m.state()
        };
        m.id().name != self.foca.identity().name
            && (self.swim.get(&m.id().name).is_some_and(same)
                || self.fed.get(&m.id().name).is_some_and(same))
    }

    /// The view changed: compare with a random member once it has been quiet for two
    /// probe periods (each change moves that on, but never past eight probe periods after
    /// the last sync: a view that keeps changing is compared that often), then less and
    /// less often while nothing changes. Gossip misses a few of a million (member, update)
    /// pairs when a thousand nodes join at once; this finds them seconds after the storm
    /// instead of an announce period later.
    fn sync_soon(&mut self, now: Instant) {
        if self.sync_tries > 0 {
            return;
        }
        self.sync_every = self.cfg.probe_period * 2;
        let latest = (self.cfg.probe_period * 8).min(self.cfg.announce_period);
        self.sync_at = (now + self.sync_every).min(self.synced_at + latest);
    }

    /// Local health: a timer due more than a third of `probe_rtt` ago means this node ran
    /// late (a thousand processes on two CPUs wait hundreds of milliseconds for their
    /// turn); then it waits longer for acks before it suspects anyone, and probes less
    /// often, instead of raising suspicions that its own slowness caused (each one a
    /// refutation gossiped to everyone: a storm that fed itself).
    fn note_lateness(&mut self, now: Instant) {
        // The probe's own timers: always waited for (periodic gossip may wait for news).
        let Some(due) = self
            .timers
            .iter()
            .take_while(|((at, _), _)| *at <= now)
            .find(|(_, t)| is_probe_timer(t))
            .map(|((at, _), _)| *at)
        else {
            return;
        };
        if now - due > self.cfg.probe_rtt / 3 {
            self.counters.late_timers += 1;
            self.slowness = (self.slowness + 1).min(MAX_SLOWNESS);
            self.slowness_at = now + self.cfg.probe_period;
        } else if self.slowness > 0 && now >= self.slowness_at {
            self.slowness -= 1;
            self.slowness_at = now + self.cfg.probe_period;
        }
    }

    fn result(&mut self, r: Result<(), foca::Error>) {
        if r.is_err() {
            self.counters.ignored += 1;
        }
    }

    /// After any input: turn foca's timer requests into deadlines, and compare the member
    /// list with the view to report what changed.
    fn after(&mut self, now: Instant, walk: bool) {
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
        self.out
            .sends
            .retain(|s| !s.down_notice || !foca.iter_members().any(|m| *m.id() == s.to));
        self.counters.stale_down_notices += (before - self.out.sends.len()) as u64;
        if !walk {
            return;
        }
        self.fed.clear();
        let mut announce = Vec::new();
        let mut sync_from = None;
        // Of the members SWIM lists, those in the view once this pass is done.
        let mut listed = 0;
        let me = self.foca.identity().name.clone();
        let mut pos = 0;
        let mut view_moved = false;
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
                if self.swim.get(&id.name).is_some_and(same) {
                    self.order[at] = Some((id.clone(), m.incarnation(), m.state()));
                    listed += 1;
                    continue;
                }
            }
            // Set again below once the member is taken as it is now.
            self.order[at] = None;
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
                                announce.push(id.clone());
                            }
                            MemberState::Suspect
                        }
                        _ => MemberState::Down,
                    }
                }
                (s, _) => s,
            };
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
                continue;
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
                    announce.push(id.clone());
                }
                // Joined through a seed that just answered: its full state brings the
                // rest of a large cluster at once (see `sync`).
                if !self.synced
                    && matches!(e, MemberEvent::Joined(_))
                    && self.seeds.iter().any(|s| s.name == id.name)
                {
                    self.synced = true;
                    sync_from = Some(id.clone());
                }
                self.events.push_back(e);
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
                view_moved = true;
                Self::view_touched(
                    &mut self.view_changed,
                    &mut self.view_whole,
                    self.cfg.max_members,
                    &id.name,
                );
            }
            match self.swim.get_mut(&id.name) {
                Some(v) => *v = (id.clone(), m.incarnation(), m.state()),
                None => {
                    self.swim
                        .insert(id.name.detached(), (id.clone(), m.incarnation(), m.state()));
                }
            }
            if m.state() != State::Down {
                self.order[at] = Some((id.clone(), m.incarnation(), m.state()));
            }
            listed += 1;
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
            view_moved |= shrank;
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
        if view_moved {
            self.sync_soon(now);
        }
        // Their answers come back as input, whose `after` finds nothing more to announce.
        for id in announce {
            let r = self.foca.announce(id, &mut self.out);
            self.result(r);
        }
        if let Some(id) = sync_from {
            self.ask_state(id, None);
            self.sync_tries = SYNC_TRIES;
            self.sync_round = (false, false);
            self.sync_at = now + self.cfg.probe_period;
        }
        // Room was made: members refused in this pass are looked at again now, as every
        // input used to (the next one may not walk the list). Once: the view now holds
        // only what SWIM lists, so that pass cannot shrink it.
        if again {
            self.after(now, true);
        }
    }
}

pub mod datagram;
mod sync;
mod types;

#[cfg(test)]
mod tests;
