//! The node-wide budget of bytes held in reassembly, and the guard that keeps a peer's
//! share of it counted.

use super::*;

/// The node-wide bound on reassembly memory: the announced lengths of every peer's kept
/// messages in pieces, summed. A message that would start past it is followed to its end
/// without keeping its data and reported to its sender as undeliverable, so a member that
/// starts large messages and never ends them (under many names) pins a bounded amount.
pub(crate) struct ReassemblyBudget {
    limit: u64,
    used: std::sync::atomic::AtomicU64,
}

impl ReassemblyBudget {
    pub fn new(limit: u64) -> ReassemblyBudget {
        ReassemblyBudget {
            limit,
            used: Default::default(),
        }
    }

    /// Whether a message of `total` bytes may start. (Two starting at the same instant may
    /// both pass: the bound holds to within a message per reading connection.)
    pub fn has_room(&self, total: u64) -> bool {
        self.used.load(Ordering::Relaxed).saturating_add(total) <= self.limit
    }

    /// Bytes committed now, node-wide.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// A peer's reassembly under its lock; on release, the node-wide budget learns how much it
/// committed (derived from the state, so nothing can leak).
pub(crate) struct ReassemblyGuard<'a> {
    pub(super) g: MutexGuard<'a, (Reassembly, u64)>,
    pub(super) budget: &'a ReassemblyBudget,
}

impl std::ops::Deref for ReassemblyGuard<'_> {
    type Target = Reassembly;
    fn deref(&self) -> &Reassembly {
        &self.g.0
    }
}

impl std::ops::DerefMut for ReassemblyGuard<'_> {
    fn deref_mut(&mut self) -> &mut Reassembly {
        &mut self.g.0
    }
}

impl Drop for ReassemblyGuard<'_> {
    fn drop(&mut self) {
        let now = self.g.0.committed();
        let was = std::mem::replace(&mut self.g.1, now);
        if now > was {
            self.budget.used.fetch_add(now - was, Ordering::Relaxed);
        } else if was > now {
            self.budget.used.fetch_sub(was - now, Ordering::Relaxed);
        }
    }
}
