//! Full-state sync (memberlist's push-pull, pull only): a member asks another for every
//! member it knows live, and applies the answer as SWIM updates. SWIM's gossip carries
//! only what changed lately and an announce's answer holds one packet's worth of members
//! (about 30), so without it a node that joins a large cluster at rest learns the others
//! only as they happen to probe it: a node restarted into 255 others still saw 195 of them
//! after a minute. With it, one exchange brings them all.
//!
//! - **When**: once a joining node is no longer alone, from the member that answered it,
//!   then from a random live member each probe period until an answer brings nothing new
//!   (at most 8 more). After that, anti-entropy (two groups that formed apart, or an
//!   update gossip lost): the node compares with a random live member two probe periods
//!   after its view last changed (each change moves that on, up to two probe periods
//!   after the last comparison: a view that keeps changing is compared every two), then 4,
//!   8, ... probe periods apart up to `announce_period` while nothing changes, and at least
//!   every `announce_period`.
//!   Gossip misses a few of the million (member, update) pairs of a thousand nodes joining
//!   at once; this repairs them seconds after the storm, not an announce period later.
//! - **The comparison**: the periodic ask (and each joining round's) carries a digest of
//!   the asker's live members (itself included): their count and the xor of a hash of each
//!   identity, and a Bloom filter of those identities ([`Filter`]: ten bits a member, at
//!   most 1360 bytes, salted afresh each ask). An answerer whose own digest is the same
//!   sends nothing (at rest a sync is one ask and no answer a period); otherwise it sends
//!   the members the filter says the asker lacks, or one empty part if none. Past
//!   `FILTER_MAX` members the ask carries the digest alone and a differing answerer sends
//!   everything. A digest or filter that lies costs the liar a full answer or none, as any
//!   ask does.
//! - **The answer**: those live members (alive or suspect) the answerer knows, itself and
//!   the asker excepted, as foca's own member encoding, split over as many MEMBER bodies as
//!   needed (each at most `MAX_PACKET`), sent to the asker's address in the view. (In full,
//!   for a thousand members, about 35 datagrams; in a simulated thousand-node join the
//!   filter took the full-state datagrams a node sent from 32 to 3.)
//! - **Bounds**: an asker gets an answer at most once a probe period, and a node answers
//!   at most [`ANSWERS_PER_SECOND`] asks a second in all (an ask is at most 1381 bytes; an
//!   answer is at most the answerer's whole view). What an answer holds is a member's
//!   word about third parties, as SWIM's gossip is: it goes through the same rules (the
//!   view holds at most `max_members`, invented members are forgotten when they never
//!   answer).

use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use foca::{Codec, Member, State};
use rand::Rng;

use super::{Kind, MAX_PACKET, MemberError, MemberId, Membership, Send, TAG_STATE, TAG_STATE_ASK};
use crate::codec::Name;

/// Most sync asks a node answers a second, from all members together.
pub const ANSWERS_PER_SECOND: f64 = 4.0;

/// The body of a periodic ask: the count of live members (u32) and the xor of their
/// identities' hashes (u64), little-endian.
pub(super) const DIGEST_LEN: usize = 12;

/// What a comparing ask adds after its digest: a salt (u64, little-endian) and a Bloom
/// filter of the asker's live members (see [`Filter`]), ten bits a member, from 8 bytes up
/// to `FILTER_MAX_LEN` (so a body of 28 to 1380 bytes).
pub(super) const FILTER_MAX_LEN: usize = 1360;
pub(super) const FILTER_MIN_LEN: usize = 8;

/// Bit positions a member sets in a filter.
const FILTER_K: u64 = 7;

/// Most live members an asker puts in a filter. A member the filter wrongly says the
/// asker holds is left out of the answer: 0.5% of them at 1000 members, 3.5% at 1500 (a
/// new salt each ask, so another ask finds them). Past this the ask carries the digest
/// alone and a differing member answers in full.
const FILTER_MAX: usize = 1500;

/// The hash of a member's identity (name, start and bump: not the incarnation, a refuted
/// suspicion is no difference worth an answer), for the digest and the filter.
pub(super) fn identity_hash(id: &MemberId) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = crate::codec::NameHash.build_hasher();
    h.write(id.name.as_bytes());
    h.write_u64(id.started);
    h.write_u16(id.bump);
    h.finish()
}

/// A Bloom filter of identity hashes, salted by the asker for each ask: an answerer sends
/// only the members it holds that the filter does not (memberlist's push-pull sends
/// everything; with a thousand members that was about 35 datagrams for each comparison
/// that differed, most of it what the asker held already).
pub(super) struct Filter<'a> {
    salt: u64,
    bits: &'a [u8],
}

impl Filter<'_> {
    /// The bit positions of `hash` under `salt` in a filter of `len` bytes (double hashing
    /// over a mixed value).
    fn positions(hash: u64, salt: u64, len: usize) -> impl Iterator<Item = usize> {
        let mut x = hash ^ salt;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let step = x.rotate_left(32) | 1;
        let m = (len * 8) as u64;
        (0..FILTER_K).map(move |i| (x.wrapping_add(i.wrapping_mul(step)) % m) as usize)
    }

    /// The length of a filter for `n` members.
    pub(super) fn len_for(n: usize) -> usize {
        (n * 10).div_ceil(8).clamp(FILTER_MIN_LEN, FILTER_MAX_LEN)
    }

    /// A filter of `hashes`, salted with `salt`, into `bits`.
    pub(super) fn fill(bits: &mut [u8], salt: u64, hashes: impl Iterator<Item = u64>) {
        let len = bits.len();
        for h in hashes {
            for p in Self::positions(h, salt, len) {
                bits[p / 8] |= 1 << (p % 8);
            }
        }
    }

    /// The filter of a comparing ask's body after its digest, if it has one of a length
    /// allowed.
    pub(super) fn read(rest: &[u8]) -> Option<Filter<'_>> {
        (FILTER_MIN_LEN..=FILTER_MAX_LEN)
            .contains(&rest.len().saturating_sub(8))
            .then(|| Filter {
                salt: u64::from_le_bytes(rest[..8].try_into().unwrap_or([0; 8])),
                bits: &rest[8..],
            })
    }

    /// Whether the asker (probably) holds the member with this identity hash.
    pub(super) fn holds(&self, hash: u64) -> bool {
        Self::positions(hash, self.salt, self.bits.len())
            .all(|p| self.bits[p / 8] & (1 << (p % 8)) != 0)
    }
}

/// The parts of a state ask's body (after the tag): nothing (send everything), a digest
/// (send everything if ours differs), or a digest and a filter (send what the filter
/// lacks if ours differs); any other length is malformed.
pub(super) fn read_ask(packet: &[u8]) -> Result<(Option<&[u8]>, Option<Filter<'_>>), MemberError> {
    if packet.is_empty() {
        return Ok((None, None));
    }
    let (digest, rest) = packet.split_at(DIGEST_LEN.min(packet.len()));
    match Filter::read(rest) {
        _ if digest.len() == DIGEST_LEN && rest.is_empty() => Ok((Some(digest), None)),
        Some(f) => Ok((Some(digest), Some(f))),
        None => Err(MemberError::Malformed(format!(
            "state ask with a body of {} bytes (allowed: 0, {DIGEST_LEN} or {} to {})",
            packet.len(),
            DIGEST_LEN + 8 + FILTER_MIN_LEN,
            DIGEST_LEN + 8 + FILTER_MAX_LEN
        ))),
    }
}

/// `(count, xor of hashes)` of the members SWIM holds live (alive or suspect), this node
/// included, over name, start and bump (see [`identity_hash`]).
fn digest<'a>(
    members: impl Iterator<Item = &'a Member<MemberId>>,
    me: &MemberId,
) -> [u8; DIGEST_LEN] {
    let (mut count, mut xor) = (1u32, identity_hash(me));
    for m in members.filter(|m| m.state() != State::Down && m.id() != me) {
        count = count.wrapping_add(1);
        xor ^= identity_hash(m.id());
    }
    let mut out = [0; DIGEST_LEN];
    out[..4].copy_from_slice(&count.to_le_bytes());
    out[4..].copy_from_slice(&xor.to_le_bytes());
    out
}

impl Membership {
    /// Ask `to` for its members: all of them, or with this node's `digest` only if its
    /// own differs (and, `filtered`, with a filter of what this node holds: only those it
    /// lacks, see [`Filter`]; `ask_random` keeps filters to `FILTER_MAX` members).
    pub(super) fn ask_state(
        &mut self,
        to: MemberId,
        digest: Option<[u8; DIGEST_LEN]>,
        filtered: bool,
    ) {
        self.counters.syncs_asked += 1;
        let body = match digest {
            None => Bytes::from_static(&[TAG_STATE_ASK]),
            Some(d) if !filtered => {
                let mut b = BytesMut::with_capacity(1 + DIGEST_LEN);
                b.put_u8(TAG_STATE_ASK);
                b.put_slice(&d);
                b.freeze()
            }
            Some(d) => {
                let salt = self.rng.next_u64();
                let mut bits = vec![0u8; Filter::len_for(self.foca.num_members() + 1)];
                let me = self.foca.identity();
                let held = self
                    .foca
                    .iter_members()
                    .filter(|m| m.state() != State::Down && m.id() != me)
                    .map(|m| identity_hash(m.id()));
                Filter::fill(
                    &mut bits,
                    salt,
                    std::iter::once(identity_hash(me)).chain(held),
                );
                let mut b = BytesMut::with_capacity(1 + DIGEST_LEN + 8 + bits.len());
                b.put_u8(TAG_STATE_ASK);
                b.put_slice(&d);
                b.put_u64_le(salt);
                b.put_slice(&bits);
                b.freeze()
            }
        };
        self.out.sends.push_back(Send {
            to,
            body,
            kind: Kind::Other,
        });
    }

    /// This node's digest of its live members (see [`digest`]).
    pub(super) fn digest(&self) -> [u8; DIGEST_LEN] {
        digest(self.foca.iter_members(), self.foca.identity())
    }

    /// Ask a random live member for its members (the periodic sync and the joining
    /// rounds): with this node's digest when `compare` or `filtered`, and its filter when
    /// `filtered` (an answer comes only if the member's digest differs, with what this
    /// node lacks; past `FILTER_MAX` members no filter: a full answer if it differs, and
    /// none while joining).
    pub(super) fn ask_random(&mut self, compare: bool, filtered: bool) {
        let live: Vec<MemberId> = self
            .foca
            .iter_members()
            .filter(|m| m.state() != State::Down)
            .map(|m| m.id().clone())
            .collect();
        if live.is_empty() {
            return;
        }
        let i = (self.rng.next_u64() % live.len() as u64) as usize;
        let filtered = filtered && live.len() < FILTER_MAX;
        let digest = (compare || filtered).then(|| self.digest());
        self.ask_state(live[i].clone(), digest, filtered);
    }

    /// `from` asks for our members; with its `digest`, only if ours differs, and with its
    /// `filter`, only those it lacks (an answer with none is one empty part, so that a
    /// joining round sees it was answered).
    pub(super) fn handle_state_ask(
        &mut self,
        now: Instant,
        from: &Name,
        digest: Option<&[u8]>,
        filter: Option<Filter<'_>>,
    ) -> Result<(), MemberError> {
        let Some(to) = self
            .foca
            .member_by_addr(from)
            .filter(|m| m.state() != State::Down)
            .map(|m| m.id().clone())
        else {
            // Not a member here (yet): it learns of us otherwise first.
            self.counters.ignored += 1;
            return Ok(());
        };
        if !self.may_answer(now, from) {
            self.counters.rate_limited += 1;
            return Ok(());
        }
        if digest.is_some_and(|d| d == self.digest()) {
            self.counters.syncs_agreed += 1;
            return Ok(());
        }
        self.counters.syncs_answered += 1;
        let members: Vec<Member<MemberId>> = self
            .foca
            .iter_members()
            .filter(|m| m.state() != State::Down && m.id().name != *from)
            .filter(|m| {
                filter
                    .as_ref()
                    .is_none_or(|f| !f.holds(identity_hash(m.id())))
            })
            .cloned()
            .collect();
        let mut body = BytesMut::with_capacity(MAX_PACKET + 1);
        body.put_u8(TAG_STATE);
        let mut codec = foca::PostcardCodec;
        let mut one = Vec::with_capacity(300);
        for m in &members {
            one.clear();
            if codec.encode_member(m, &mut one).is_err() {
                continue;
            }
            if body.len() - 1 + one.len() > MAX_PACKET {
                let full = std::mem::replace(&mut body, BytesMut::with_capacity(MAX_PACKET + 1));
                self.out.sends.push_back(Send {
                    to: to.clone(),
                    body: full.freeze(),
                    kind: Kind::StateAnswer,
                });
                body.put_u8(TAG_STATE);
            }
            body.put_slice(&one);
        }
        if body.len() > 1 || members.is_empty() {
            self.out.sends.push_back(Send {
                to,
                body: body.freeze(),
                kind: Kind::StateAnswer,
            });
        }
        Ok(())
    }

    /// Part of an answer from `from`: apply each member as a SWIM update.
    /// Returns whether it told anything SWIM did not hold (old news is left out, as in
    /// `without_old_news`: a sync at a thousand members would otherwise cost a walk of
    /// foca's list per member).
    pub(super) fn handle_state(&mut self, packet: &[u8]) -> Result<bool, MemberError> {
        let mut codec = foca::PostcardCodec;
        let mut buf = packet;
        let mut members = Vec::new();
        while !buf.is_empty() {
            let m: Member<MemberId> = codec
                .decode_member(&mut buf)
                .map_err(|e| MemberError::Malformed(format!("state answer: {e}")))?;
            // Only live members are sent; anything else is not an answer of ours.
            if m.state() == State::Down {
                return Err(MemberError::Malformed(
                    "state answer lists a down member".to_string(),
                ));
            }
            members.push(m);
        }
        self.counters.sync_members += members.len() as u64;
        let told = members.len();
        members.retain(|m| !self.is_old_news(m));
        self.counters.old_news += (told - members.len()) as u64;
        // What SWIM's list has room for (see `swim_takes`).
        let (mut adding, before) = (super::input::Adding::default(), members.len());
        members.retain(|m| self.swim_takes(&m.id().name, &mut adding, false));
        self.counters.swim_full += (before - members.len()) as u64;
        for m in &members {
            self.name_dirty(&m.id().name);
        }
        // For the joining rounds (see `sync_tries`).
        self.sync_round.0 = true;
        self.sync_round.1 |= !members.is_empty();
        if members.is_empty() {
            return Ok(false);
        }
        let r = self
            .foca
            .apply_many(members.into_iter(), false, &mut self.out);
        self.result(r);
        Ok(true)
    }

    /// Whether an ask from `from` is answered now: once a probe period per asker, and at
    /// most [`ANSWERS_PER_SECOND`] a second in all.
    fn may_answer(&mut self, now: Instant, from: &Name) -> bool {
        let per = self.cfg.probe_period;
        if self.answered.get(from).is_some_and(|t| now < *t + per) {
            return false;
        }
        let b = &mut self.answers;
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + dt * ANSWERS_PER_SECOND).min(ANSWERS_PER_SECOND);
        b.at = now;
        if b.tokens < 1.0 {
            return false;
        }
        b.tokens -= 1.0;
        if self.answered.len() >= self.cfg.max_members.saturating_mul(2) {
            self.answered.clear();
        }
        self.answered.insert(from.detached(), now);
        true
    }

    /// The view changed: compare with a random member once it has been quiet for two
    /// probe periods (each change moves that on, but never past two probe periods after
    /// the last sync: a view that keeps changing is compared that often), then less and
    /// less often while nothing changes. Gossip misses a few of a million (member, update)
    /// pairs when a thousand nodes join at once; this finds them seconds after the storm
    /// instead of an announce period later. (With eight periods the cap, the last nodes
    /// of a thousand joining at once waited seconds for their comparison, the CPUs idle:
    /// see `docs/results.md`.)
    pub(super) fn sync_soon(&mut self, now: Instant) {
        if self.sync_tries > 0 {
            return;
        }
        self.sync_every = self.cfg.probe_period * 2;
        let latest = (self.cfg.probe_period * 2).min(self.cfg.announce_period);
        self.sync_at = (now + self.sync_every).min(self.synced_at + latest);
    }
}
