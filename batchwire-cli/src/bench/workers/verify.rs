//! What the scenarios' workers share beyond starting: the control mailbox that starts and
//! ends a run, fault counts, per-sender sequence checks, payload fields, a seeded
//! generator.

use super::*;

/// The nodes of one run meet here: each sends a tag to the "ctl" mailbox of every other
/// node and waits until it has that tag from all of them (tags may arrive early; they are
/// counted until asked for).
pub struct Ctl {
    mb: Mailbox,
    others: Vec<Address>,
    seen: HashMap<u8, usize>,
}

/// The mailbox the barrier uses; declare it on every node.
pub const CTL: &str = "ctl";

/// The tag of the last barrier, before shutdown.
pub(super) const FINISH: u8 = 255;

/// How long nodes wait after the last barrier before shutting down. Receivers acknowledge
/// lazily (after a few ms), and a node's shutdown waits for its messages to be
/// acknowledged: without this pause the barrier's own last message could miss its
/// acknowledgement and hold up that node's shutdown until its timeout.
pub(super) const SETTLE: Duration = Duration::from_millis(25);

impl Ctl {
    pub fn new(node: &Node, i: usize, n: usize) -> Result<Ctl, String> {
        let others = (0..n)
            .filter(|j| *j != i)
            .map(|j| Address::new(&node_name(j), CTL).ctx("ctl address"))
            .collect::<Result<_, _>>()?;
        Ok(Ctl {
            mb: node.mailbox(CTL).ctx("ctl mailbox")?,
            others,
            seen: HashMap::new(),
        })
    }

    /// Tell every other node `tag`, and wait until every other node told us `tag`.
    pub fn barrier(&mut self, tag: u8, timeout: Duration) -> Result<(), String> {
        for a in &self.others {
            self.mb.send(a, vec![tag]).ctx("sending to the barrier")?;
        }
        let deadline = Instant::now() + timeout;
        while self.seen.get(&tag).copied().unwrap_or(0) < self.others.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.mb.recv_timeout(left) {
                Ok(e) => {
                    if let Some(t) = e.payload.first() {
                        *self.seen.entry(*t).or_default() += 1;
                    }
                }
                Err(RecvError::Empty) => {}
                Err(e) => {
                    return Err(format!(
                        "barrier {tag}: {} of {} nodes arrived within {timeout:?} ({e})",
                        self.seen.get(&tag).copied().unwrap_or(0),
                        self.others.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The last barrier of a run: every node is done with every other, so all may shut
    /// down (none still needs another's server or receiver). Then a short settle.
    pub fn finish(mut self, timeout: Duration) -> Result<(), String> {
        self.barrier(FINISH, timeout)?;
        settle();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Verification.

/// Lost, duplicated and reordered messages, summed over runs or nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Faults {
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl std::ops::AddAssign for Faults {
    fn add_assign(&mut self, o: Faults) {
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
    }
}

/// Checks numbered messages on several independent streams (a sender, or a sender and
/// receiver pair): each stream's sequence numbers 0..per_stream must arrive once each, in
/// order. Counts distinct, duplicated and reordered (a number other than the next one).
#[derive(Debug, Clone)]
pub struct Verifier {
    per_stream: u64,
    seen: Vec<u64>,
    next: Vec<u64>,
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl Verifier {
    pub fn new(streams: usize, per_stream: u64) -> Self {
        let bits = streams as u64 * per_stream;
        Verifier {
            per_stream,
            seen: vec![0; bits.div_ceil(64) as usize],
            next: vec![0; streams],
            distinct: 0,
            duplicated: 0,
            reordered: 0,
        }
    }

    /// A message that is not one of ours (too short, or numbered out of range): a fault,
    /// counted as a duplicate.
    pub fn malformed(&mut self) {
        self.duplicated += 1;
    }

    #[inline]
    pub fn see(&mut self, stream: usize, seq: u64) {
        if stream >= self.next.len() || seq >= self.per_stream {
            self.malformed();
            return;
        }
        let bit = stream as u64 * self.per_stream + seq;
        let (w, b) = ((bit / 64) as usize, bit % 64);
        if self.seen[w] & (1 << b) != 0 {
            self.duplicated += 1;
            return;
        }
        self.seen[w] |= 1 << b;
        self.distinct += 1;
        if seq != self.next[stream] {
            self.reordered += 1;
        }
        self.next[stream] = seq + 1;
    }

    /// A payload stamped with its sequence number (u64) and then its stream (u32), both
    /// little-endian (fan-in's sending thread, mperf's sending node); one too short to
    /// carry both is malformed.
    #[inline]
    pub fn see_stamped(&mut self, p: &[u8]) {
        match (u64_at(p, 0), u32_at(p, 8)) {
            (Some(seq), Some(stream)) => self.see(stream as usize, seq),
            _ => self.malformed(),
        }
    }

    /// The faults, given how many messages were expected in all.
    #[cfg(test)]
    pub fn faults(&self, expected: u64) -> Faults {
        Faults {
            lost: expected.saturating_sub(self.distinct),
            duplicated: self.duplicated,
            reordered: self.reordered,
        }
    }
}

/// The little-endian u64 at `at` in `payload`.
#[inline]
pub fn u64_at(payload: &[u8], at: usize) -> Option<u64> {
    let b = payload.get(at..at + 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The little-endian u32 at `at` in `payload`.
#[inline]
pub fn u32_at(payload: &[u8], at: usize) -> Option<u32> {
    let b = payload.get(at..at + 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// Thread `t`'s part of `total` messages split over `threads` threads.
pub fn share(total: u64, threads: usize, t: usize) -> u64 {
    let threads = threads.max(1) as u64;
    total / threads + u64::from((t as u64) < total % threads)
}

/// A small fast PRNG (xorshift64*) for picking call targets; no crate needed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------
