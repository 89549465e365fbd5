//! The membership's values: who a member is, the settings, states, events, errors and
//! counters. The state machine that uses them is in `membership.rs`.

use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{Identity, PeriodicParams, State};

use super::MAX_PACKET;
use crate::codec::{Name, NameHash};
use std::collections::HashMap;

/// Who a member is: its name, the address it listens on, when it started (so a node
/// restarted under the same name is a new member that wins over the old one), and a bump
/// (a node declared down by mistake comes back as the next bump).
///
/// Two ids are the same member when name, start and bump agree; the address is carried
/// along (the first one seen is kept).
#[derive(Clone, Debug)]
pub struct MemberId {
    pub name: Name,
    pub addr: SocketAddr,
    pub started: u64,
    pub bump: u16,
}

impl PartialEq for MemberId {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.started == o.started && self.bump == o.bump
    }
}
impl Eq for MemberId {}

impl Identity for MemberId {
    type Addr = Name;
    fn renew(&self) -> Option<Self> {
        Some(MemberId {
            bump: self.bump.checked_add(1)?,
            ..self.clone()
        })
    }
    fn addr(&self) -> Name {
        self.name.clone()
    }
    fn win_addr_conflict(&self, other: &Self) -> bool {
        (self.started, self.bump) > (other.started, other.bump)
    }
}

impl serde::Serialize for MemberId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.name.as_str(), self.addr, self.started, self.bump).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for MemberId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (MemberName(name), addr, started, bump) =
            <(MemberName, SocketAddr, u64, u16)>::deserialize(d)?;
        Ok(MemberId {
            name,
            addr,
            started,
            bump,
        })
    }
}

/// A member's name as decoded: the rules of a node name (1 to 255 bytes), taken from the
/// packet's bytes with no `String` in between (every update of every packet has one).
struct MemberName(Name);

impl<'de> serde::Deserialize<'de> for MemberName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MemberName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name of 1 to 255 bytes")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MemberName, E> {
                (!v.is_empty())
                    .then(|| Name::new(v))
                    .flatten()
                    .map(MemberName)
                    .ok_or_else(|| E::custom("member name must be 1 to 255 bytes"))
            }
        }
        d.deserialize_str(V)
    }
}

/// Membership settings. The defaults suit a LAN or one machine; see each field.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MembershipConfig {
    /// How often each member probes one other (SWIM's protocol period). Default 1 s.
    pub probe_period: Duration,
    /// How long a probe waits for its ACK before asking others to probe indirectly.
    /// Default 300 ms.
    pub probe_rtt: Duration,
    /// How long a suspected member has to refute before it is declared down. Default 3 s.
    pub suspicion_timeout: Duration,
    /// How often news (joins, suspicions, downs) is pushed to 3 random members while there
    /// is any. Default 200 ms.
    pub gossip_period: Duration,
    /// How often a member announces itself to one random member (repairs views that drifted
    /// apart), and to two members it saw go down (heals partitions). Default 30 s.
    pub announce_period: Duration,
    /// How long a down member stays in the view (as down) before it is forgotten.
    /// Default 10 min.
    pub forget_down_after: Duration,
    /// Most MEMBER frames taken from one peer per second (more are dropped and counted;
    /// SWIM tolerates loss). Default 200.
    pub frames_per_second: u32,
    /// Most members in the view (the node's own `max_peers` bounds it too). Default 1024.
    pub max_members: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(300),
            suspicion_timeout: Duration::from_secs(3),
            gossip_period: Duration::from_millis(200),
            announce_period: Duration::from_secs(30),
            forget_down_after: Duration::from_secs(600),
            frames_per_second: 200,
            max_members: 1024,
        }
    }
}

/// The largest `max_members` taken (a million: far past any cluster SWIM serves well).
pub const MAX_MEMBERS_LIMIT: usize = 1 << 20;

impl MembershipConfig {
    /// Check the settings (`Node::start` does).
    pub fn validate(&self) -> Result<(), MemberError> {
        self.foca().map(|_| ())
    }

    pub(super) fn foca(&self) -> Result<foca::Config, MemberError> {
        let bad = |why: &str| Err(MemberError::Config(why.to_string()));
        if self.probe_rtt.is_zero() || self.probe_rtt >= self.probe_period {
            return bad("probe_rtt must be above zero and below probe_period");
        }
        if self.suspicion_timeout.is_zero() || self.gossip_period.is_zero() {
            return bad("suspicion_timeout and gossip_period must be above zero");
        }
        if self.announce_period.is_zero() || self.frames_per_second == 0 || self.max_members == 0 {
            return bad("announce_period, frames_per_second and max_members must be above zero");
        }
        if self.max_members > MAX_MEMBERS_LIMIT {
            return Err(MemberError::Config(format!(
                "max_members = {} is out of range: allowed 1 ..= {MAX_MEMBERS_LIMIT}",
                self.max_members
            )));
        }
        // Periods past these say nothing a cluster can use, and the node adds them to
        // the clock (`Duration::MAX` must be a clear error, not an overflow later).
        const HOUR: Duration = Duration::from_secs(3600);
        for (key, v, hi) in [
            ("probe_period", self.probe_period, HOUR),
            ("suspicion_timeout", self.suspicion_timeout, HOUR),
            ("gossip_period", self.gossip_period, HOUR),
            ("announce_period", self.announce_period, HOUR),
            ("forget_down_after", self.forget_down_after, 24 * HOUR),
        ] {
            if v > hi {
                return Err(MemberError::Config(format!(
                    "{key} = {v:?} is out of range: at most {hi:?}"
                )));
            }
        }
        let mut c = foca::Config::simple();
        c.probe_period = self.probe_period;
        c.probe_rtt = self.probe_rtt;
        c.num_indirect_probes = NonZeroUsize::new(3).expect("3 > 0");
        // Each update goes out log10(n + 1) * 4 times (foca's LAN rule) for the view's bound:
        // enough to reach every member with high probability.
        let tx = (((self.max_members as f64 + 1.0).log10() * 4.0) as u8).max(4);
        c.max_transmissions = NonZeroU8::new(tx).expect("at least 4");
        c.suspect_to_down_after = self.suspicion_timeout;
        c.remove_down_after = Some(self.forget_down_after);
        c.max_packet_size = NonZeroUsize::new(MAX_PACKET).expect("> 0");
        c.notify_down_members = true;
        let every = |frequency, n| {
            Some(PeriodicParams {
                frequency,
                num_members: NonZeroUsize::new(n).expect("> 0"),
            })
        };
        c.periodic_gossip = every(self.gossip_period, 3);
        c.periodic_announce = every(self.announce_period, 1);
        c.periodic_announce_to_down_members = every(self.announce_period, 2);
        Ok(c)
    }
}

/// Where a member stands in this node's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberState {
    /// Answering probes.
    Alive,
    /// Some member could not reach it; it has `suspicion_timeout` to refute.
    Suspect,
    /// Declared down (it did not refute, or it was restarted as a new member).
    Down,
    /// Announced its leave.
    Left,
}

impl MemberState {
    /// Every state, in order (for counting members by state).
    pub const ALL: [MemberState; 4] = [
        MemberState::Alive,
        MemberState::Suspect,
        MemberState::Down,
        MemberState::Left,
    ];

    /// Its name in lower case, as metrics labels and the CLI's JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
            MemberState::Left => "left",
        }
    }

    /// Alive or suspect: a member that sends go to.
    pub fn is_live(self) -> bool {
        matches!(self, MemberState::Alive | MemberState::Suspect)
    }
}

/// What changed in the view since it was last asked (`Membership::take_view_delta`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewDelta {
    /// Nothing.
    Unchanged,
    /// These members' entries are new or changed (their current entry each, a member at
    /// most once); no member left the view.
    Changed(Vec<(MemberId, MemberState)>),
    /// Members left the view (forgotten), or too much changed to list: read it whole.
    Whole,
}

/// A change of this node's view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberEvent {
    /// A member appeared (or came back as a new incarnation).
    Joined(MemberId),
    /// A member is suspected down.
    Suspected(MemberId),
    /// A suspected member refuted the suspicion.
    Refuted(MemberId),
    /// A member was declared down.
    Down(MemberId),
    /// A member left gracefully.
    Left(MemberId),
}

/// A MEMBER frame that breaks the rules. The connection it came on is closed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    #[error("membership packet claims to come from {claimed:?} but the connection is {peer:?}")]
    Impersonation { peer: Name, claimed: Name },
    #[error("malformed membership packet: {0}")]
    Malformed(String),
    #[error("unknown membership packet tag {0}")]
    UnknownTag(u8),
    #[error("empty membership packet")]
    Empty,
    #[error("membership packet of {len} bytes exceeds {max}")]
    TooLarge { len: usize, max: usize },
    #[error("invalid membership settings: {0}")]
    Config(String),
}

/// Counters of what the membership layer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberCounters {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub packets_out: u64,
    pub bytes_out: u64,
    /// Of `packets_out`: SWIM's probes and their answers (pings, acks, indirect probes)...
    pub probes_out: u64,
    /// ...its periodic gossip...
    pub gossip_out: u64,
    /// ...and the datagrams of full-state answers (see `Membership`'s `sync`). The rest
    /// are announces and their answers, state asks and notices.
    pub state_out: u64,
    /// Packets dropped by the per-peer rate limit.
    pub rate_limited: u64,
    /// Packets SWIM rejected without breaking a rule (stale, races).
    pub ignored: u64,
    /// "You are down" notices not sent because the member was not down (see
    /// [`super::Membership`]'s rule on stale suspicion timers).
    pub stale_down_notices: u64,
    /// Times a member declared down in SWIM was still reported live here because it had
    /// been heard from directly within `suspicion_timeout`.
    pub downs_held: u64,
    /// Members not taken into the view because it already held `max_members`: each name
    /// counted once (while it stays out), however often SWIM mentions it.
    pub members_refused: u64,
    /// Members down or left that gave their place in a full view to a live newcomer.
    pub departed_evicted: u64,
    /// Times this node, joining and still alone a probe period after announcing itself,
    /// announced itself to its seeds again (the announce or the answer was lost).
    pub rejoins: u64,
    /// Full-state syncs: asks this node sent, asks it answered, and members it was told
    /// of in answers (see `Membership`'s `sync`).
    pub syncs_asked: u64,
    pub syncs_answered: u64,
    pub sync_members: u64,
    /// Periodic asks not answered because the asker's digest matched this node's.
    pub syncs_agreed: u64,
    /// Times this node's timers ran more than a third of `probe_rtt` late (it was starved
    /// of CPU); each stretches its probes for a while (local health, as Lifeguard's).
    pub late_timers: u64,
    /// Updates taken out of packets before SWIM saw them because they repeated what it
    /// held (each update reaches a member about a dozen times as it spreads).
    pub old_news: u64,
    /// Packets from, and updates about, members SWIM does not list, dropped because its
    /// list already held twice `max_members` live members (four times with down ones):
    /// invented members, or a cluster far larger than configured.
    pub swim_full: u64,
}

/// What SWIM held of a member (in `Membership::swim`, keyed by its name): the rest of
/// its identity (a `MemberId` is its name, start and bump: its address is not part of
/// it), its incarnation and state. Sixteen bytes: every packet of a join looks up a
/// dozen of these, each a cache miss with a thousand processes on two CPUs, and a whole
/// `MemberId` spread an entry over three cache lines.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Held {
    started: u64,
    bump: u16,
    pub(super) inc: foca::Incarnation,
    pub(super) state: State,
}

impl Held {
    pub(super) fn of(id: &MemberId, inc: foca::Incarnation, state: State) -> Held {
        Held {
            started: id.started,
            bump: id.bump,
            inc,
            state,
        }
    }

    /// Whether this is what SWIM holds of `id` (found under its name) at `inc` in `state`.
    pub(super) fn is(&self, id: &MemberId, inc: foca::Incarnation, state: State) -> bool {
        *self == Held::of(id, inc, state)
    }
}

/// A map for one entry per member, sized for the view's bound (at most [`PRESIZE`]) up
/// front. Grown a doubling at a time as a thousand members joined, each growth was a new
/// allocation (past glibc's mmap threshold: fresh pages, faulted in one by one) and a
/// rehash; with a thousand processes on two CPUs that was a tenth of each node's join.
/// Pages not yet written cost no memory.
pub(super) fn presized<V>(cap: usize) -> HashMap<Name, V, NameHash> {
    HashMap::with_capacity_and_hasher(cap, NameHash)
}

/// The most members a map is sized for up front (see `presized`; the IO layer's published
/// view too).
pub const PRESIZE: usize = 1024;
