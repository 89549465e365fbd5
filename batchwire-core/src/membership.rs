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

/// Largest SWIM packet (foca's `max_packet_size`); a MEMBER body adds one tag byte.
pub const MAX_PACKET: usize = 1400;

use types::{Held, presized};
pub use types::{
    MAX_MEMBERS_LIMIT, MemberCounters, MemberError, MemberEvent, MemberId, MemberState,
    MembershipConfig, PRESIZE, ViewDelta,
};

/// A packet to send.
struct Send {
    to: MemberId,
    body: Bytes,
    kind: Kind,
}

/// What a packet is, for the counters (and one rule: a TurnUndead, "the cluster thinks
/// you are down", is sent only to a member that is down in this node's view, see
/// `Membership::after`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// SWIM's failure detection: pings, acks, indirect probes and their answers.
    Probe,
    /// SWIM's periodic gossip of updates.
    Gossip,
    /// A TurnUndead.
    DownNotice,
    /// A datagram of a full-state answer (see [`sync`]).
    StateAnswer,
    /// Anything else: announces and their answers, state asks, leave notices.
    Other,
}

impl Kind {
    /// The kind of a SWIM packet, by its header.
    fn of_swim(data: &[u8]) -> Kind {
        use foca::Message as M;
        match PostcardCodec.decode_header(data) {
            Ok(foca::Header::<MemberId> { message, .. }) => match message {
                M::Ping(_)
                | M::Ack(_)
                | M::PingReq { .. }
                | M::IndirectPing { .. }
                | M::IndirectAck { .. }
                | M::ForwardedAck { .. } => Kind::Probe,
                M::Gossip => Kind::Gossip,
                M::TurnUndead => Kind::DownNotice,
                _ => Kind::Other,
            },
            Err(_) => Kind::Other,
        }
    }
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
        let kind = Kind::of_swim(data);
        let mut b = BytesMut::with_capacity(data.len() + 1);
        b.put_u8(TAG_SWIM);
        b.put_slice(data);
        self.sends.push_back(Send {
            to,
            body: b.freeze(),
            kind,
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
    /// The view may hold a member that is down or left (set whenever one is taken in as
    /// such, cleared when a look finds none): only then does a full view look for one to
    /// give its place to a live newcomer.
    departed_in_view: bool,
    /// What SWIM held of each member of the view at the end of the last input: its id,
    /// incarnation and state. A member found as it was is skipped by `after`, and an
    /// update that repeats it is old news that `handle_frame` takes out before foca sees
    /// it (foca finds a member by a walk of its whole list, so at a thousand members the
    /// dozen copies of every update that SWIM's dissemination brings cost most of a node's
    /// work).
    swim: HashMap<Name, Held, NameHash>,
    /// Updates given to SWIM since the list was last compared (`handle_frames` compares
    /// once a batch): the same update from another sender in the batch is old news too.
    /// At most twice `max_members`; emptied by each compare.
    fed: HashMap<Name, Held, NameHash>,
    /// `swim` again, in the order of SWIM's list at the last compare (which moves only
    /// when members come or go, or a probe round ends): entry i is what `swim` holds of
    /// the member then at place i, `None` for this node, a down or refused member, or a
    /// place not compared since the list last shrank.
    order: Vec<Option<(MemberId, foca::Incarnation, State)>>,
    /// Members named by the inputs since the last pass of `after` (packets' senders and
    /// the updates they carried): the only ones a pass after packets looks at. At most
    /// `max_members`; past that, `dirty_all` and the whole list is walked.
    dirty: Vec<Name>,
    dirty_all: bool,
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
    /// to [`health::MAX_SLOWNESS`] while they run late (the machine is starved: its acks are late
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
        let cap = cfg.max_members.min(PRESIZE);
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
            view: presized(cap),
            view_changed: Vec::new(),
            view_whole: true,
            departed_in_view: false,
            fed: HashMap::default(),
            order: Vec::new(),
            dirty: Vec::new(),
            dirty_all: false,
            swim: presized(cap),
            left: HashMap::default(),
            events: VecDeque::new(),
            buckets: presized(cap),
            counters: MemberCounters::default(),
            left_cluster: false,
            hinted: Vec::new(),
            heard: presized(cap),
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

    /// The transport completed a handshake with the node `name` whose process started at
    /// `started` (its incarnation): direct evidence that it is alive, which puts off any
    /// suspicion of it (see [`Membership`]).
    pub fn handle_heard(&mut self, now: Instant, name: &Name, started: u64) {
        self.note_heard(now, name, started);
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
            // The view changed lately (the pace is still two probe periods): the ask
            // carries a filter of what this node holds. At rest the digest alone, so the
            // periodic ask stays small whatever the cluster's size.
            let lately = joining || self.sync_every <= self.cfg.probe_period * 2;
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
                self.ask_random(!joining, lately);
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
            let still = self.foca.member_by_addr(&id.name).is_some_and(|m| {
                *m.id() == id && m.state() == State::Suspect && m.incarnation() == inc
            });
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
        let Send { to, body, kind } = self.out.sends.pop_front()?;
        let c = &mut self.counters;
        match kind {
            Kind::Probe => c.probes_out += 1,
            Kind::Gossip => c.gossip_out += 1,
            Kind::StateAnswer => c.state_out += 1,
            Kind::DownNotice | Kind::Other => {}
        }
        c.packets_out += 1;
        c.bytes_out += body.len() as u64;
        Some((to, body))
    }

    /// The next change of the view.
    pub fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.pop_front()
    }

    /// When `handle_timeout` is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Left: nothing more is due (a caller that waited for the next anti-entropy round
        // or rejoin would find it due at once, every turn, and spin).
        if self.left_cluster {
            return None;
        }
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

    fn result(&mut self, r: Result<(), foca::Error>) {
        if r.is_err() {
            self.counters.ignored += 1;
        }
    }
}

pub mod datagram;
mod health;
mod input;
mod sync;
mod types;
mod walk;

use health::is_probe_timer;
use walk::Walk;

#[cfg(test)]
mod tests;
