//! Flow control per mailbox, by credit: the sender's [`SendCredit`] and the receiver's
//! [`RecvCredit`] for one peer, as pure state machines.
//!
//! The rules:
//! - **A window per (sending node, receiving mailbox).** The receiving node sets it (its
//!   `mailbox_bytes`) and announces it in SYNC; until the first SYNC a sender assumes
//!   [`INITIAL_WINDOW`].
//! - **Charged when sent, given back when taken.** A send to a mailbox is admitted while the
//!   bytes charged to that mailbox and not yet given back are below the window (so one
//!   message larger than the window still goes, alone). One that is not admitted waits, or
//!   `try_send` answers `Full`: only the senders to that mailbox are held back. The charge
//!   is the message's encoded size ([`crate::frame::message_len`]); the receiver gives it
//!   back (CREDIT) when its application takes the message, or at once if there is no such
//!   mailbox.
//! - **The receiver never waits for a consumer.** What arrives was admitted against the
//!   window, so it fits the mailbox's bound; the connection's reader hands it over and goes
//!   on. A peer that sends past [`RecvCredit::limit`] for one mailbox broke the protocol.
//! - **Repaired on every connection.** Grants can be lost with a connection, so the first
//!   thing each side says on a new one (and again whenever its accounts overflowed) is a
//!   SYNC: as of message `next`, these mailboxes hold this many bytes of your messages. The
//!   sender recounts each mailbox's charge as what is held there, plus what it has in flight
//!   from `next` on, plus what is still queued ([`SendCredit::sync`]). For that to add up,
//!   the receiver writes no ACK beyond `next` before its SYNC (the sender must still hold
//!   everything from `next` on), and the sender counts while nothing is on its way from its
//!   queue to its window (the IO layer orders both). With transfer-queue, a batch on its
//!   way from the shared queue to a peer's window can still be missed: the charge is then
//!   understated by at most that batch, which the limit's slack absorbs and the next SYNC
//!   corrects; it is never overstated, so no sender stalls for good.
//! - **A SYNC belongs to its connection.** The receiver writes a SYNC only on the
//!   connection whose reader took it, and grants only on its current connection; the
//!   sender recounts only for a SYNC on its current connection whose `next` its window
//!   still holds from, and ignores grants and SYNCs from a connection older than the one
//!   it recounted last. (A SYNC taken for one connection and written on the next said
//!   where credit stood before what the first delivered since, which the successor's
//!   RESUME had taken out of the window: the recount left it out, and the grants for it
//!   exceeded the charge.)
//! - **Values from the peer are checked**: a grant for more than was charged is clamped and
//!   counted ([`SendCredit::mismatched`]); entries are bounded in number.

use crate::codec::{Name, NameMap, bytes_eq};
use crate::frame::{Credit, MAX_CREDIT_ENTRIES, Sync};

/// The window a sender assumes for every mailbox of a peer until the peer's first SYNC.
pub const INITIAL_WINDOW: u64 = 64 << 10;

/// Bytes a receiver tolerates beyond twice the window plus one largest payload before it
/// calls a peer's sending a violation (what a recount may understate is far less).
pub const LIMIT_SLACK: u64 = 1 << 20;

/// Most mailbox accounts a sender keeps per peer beyond those with bytes outstanding.
const MAX_IDLE_SLOTS: usize = 4096;

/// Most accounts a receiver opens for names it has no mailbox for, per peer; past that it
/// asks for a SYNC instead of keeping more names.
const MAX_STRAY: usize = 64;

/// The sender's side of one peer: per destination mailbox, the bytes charged and not yet
/// given back.
#[derive(Debug)]
pub struct SendCredit {
    window: u64,
    peer_max_payload: Option<u64>,
    slots: Vec<(Name, u64)>,
    index: NameMap<usize>,
    /// The slot looked up last: one sender streaming to one mailbox finds it at once.
    last: usize,
    synced: bool,
    mismatched: u64,
}

impl Default for SendCredit {
    fn default() -> Self {
        SendCredit {
            window: INITIAL_WINDOW,
            peer_max_payload: None,
            slots: Vec::new(),
            index: NameMap::default(),
            last: 0,
            synced: false,
            mismatched: 0,
        }
    }
}

impl SendCredit {
    /// The window per mailbox (the peer's, once it said so).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Whether a SYNC from the peer has been applied.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The largest payload the peer accepts, once it said so.
    pub fn peer_max_payload(&self) -> Option<u64> {
        self.peer_max_payload
    }

    /// Bytes given back beyond what was charged (clamped): zero unless a peer misbehaves.
    pub fn mismatched(&self) -> u64 {
        self.mismatched
    }

    /// Whether every charge was given back (the peer's mailboxes hold nothing of ours).
    pub fn is_settled(&self) -> bool {
        self.slots.iter().all(|s| s.1 == 0)
    }

    /// Bytes charged to mailbox `to` and not given back.
    pub fn outstanding(&self, to: &[u8]) -> u64 {
        self.lookup(to).map_or(0, |i| self.slots[i].1)
    }

    /// The slot of `to`: the last one used first (a stream to one mailbox asks once per
    /// message, and hashes nothing).
    #[inline]
    fn lookup(&self, to: &[u8]) -> Option<usize> {
        if self
            .slots
            .get(self.last)
            .is_some_and(|s| bytes_eq(s.0.as_bytes(), to))
        {
            return Some(self.last);
        }
        self.index.get(to).copied()
    }

    /// Whether a send to `to` would be admitted now.
    pub fn admits(&self, to: &[u8]) -> bool {
        self.outstanding(to) < self.window
    }

    /// [`SendCredit::admits`], also returning the mailbox's slot (if it has one) for
    /// [`SendCredit::charge_at`]: a sender then looks its mailbox up once per message.
    #[inline(always)]
    pub fn admits_at(&self, to: &[u8]) -> (bool, Option<usize>) {
        match self.lookup(to) {
            Some(i) => (self.slots[i].1 < self.window, Some(i)),
            None => (self.window > 0, None),
        }
    }

    /// Charge `bytes` to `to`, at the slot [`SendCredit::admits_at`] returned. The slot
    /// is only valid with nothing changed in between (the caller holds one lock across
    /// both); without one, `to` gets a new slot.
    #[inline]
    pub fn charge_at(&mut self, slot: Option<usize>, to: &Name, bytes: u64) {
        let i = match slot {
            Some(i) => {
                debug_assert_eq!(self.slots[i].0.as_bytes(), to.as_bytes());
                self.last = i;
                i
            }
            None => self.slot(to),
        };
        let s = &mut self.slots[i].1;
        *s = s.saturating_add(bytes);
    }

    fn find(&mut self, to: &[u8]) -> Option<usize> {
        let i = self.lookup(to)?;
        self.last = i;
        Some(i)
    }

    fn slot(&mut self, to: &Name) -> usize {
        if let Some(i) = self.find(to.as_bytes()) {
            return i;
        }
        if self.slots.len() >= MAX_IDLE_SLOTS {
            self.prune();
        }
        self.slots.push((to.detached(), 0));
        let i = self.slots.len() - 1;
        self.index.insert(self.slots[i].0.clone(), i);
        self.last = i;
        i
    }

    /// Drop the accounts with nothing outstanding.
    fn prune(&mut self) {
        self.slots.retain(|s| s.1 > 0);
        self.index.clear();
        for (i, s) in self.slots.iter().enumerate() {
            self.index.insert(s.0.clone(), i);
        }
        self.last = 0;
    }

    /// Charge `bytes` to mailbox `to` if it is below its window; returns whether it was.
    #[inline]
    pub fn try_charge(&mut self, to: &Name, bytes: u64) -> bool {
        let i = self.slot(to);
        let s = &mut self.slots[i].1;
        if *s >= self.window {
            return false;
        }
        *s = s.saturating_add(bytes);
        true
    }

    /// The peer gave back `bytes` of mailbox `to`. Returns whether the mailbox went from
    /// closed to admitting (wake its senders). A grant for a mailbox nothing is charged to,
    /// or beyond the charge, is clamped and counted.
    pub fn grant(&mut self, to: &[u8], bytes: u64) -> bool {
        let Some(i) = self.find(to) else {
            self.mismatched = self.mismatched.saturating_add(bytes);
            return false;
        };
        let s = &mut self.slots[i].1;
        let was_closed = *s >= self.window;
        if bytes > *s {
            self.mismatched = self.mismatched.saturating_add(bytes - *s);
        }
        *s = s.saturating_sub(bytes);
        was_closed && *s < self.window
    }

    /// Apply a recount after the peer's SYNC: `window` and `max_payload` as the peer said,
    /// and each mailbox's charge as `totals` says (none for a mailbox not in it). Returns
    /// whether any mailbox went from closed to admitting.
    pub fn sync(&mut self, window: u64, max_payload: u64, totals: &NameMap<u64>) -> bool {
        let closed_before: Vec<bool> = self.slots.iter().map(|s| s.1 >= self.window).collect();
        self.window = window.max(1);
        self.peer_max_payload = Some(max_payload);
        self.synced = true;
        for s in &mut self.slots {
            s.1 = totals.get(s.0.as_bytes()).copied().unwrap_or(0);
        }
        for (name, &v) in totals {
            if v > 0 && !self.index.contains_key(name.as_bytes()) {
                let i = self.slot(name);
                self.slots[i].1 = v;
            }
        }
        let opened = self
            .slots
            .iter()
            .zip(closed_before)
            .any(|(s, was)| was && s.1 < self.window);
        if self.slots.len() > MAX_IDLE_SLOTS {
            self.prune();
        }
        opened
    }
}

/// Why a peer's messages break flow control.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// A peer sent more to one mailbox than its credit allows.
    #[error(
        "protocol violation: mailbox {mailbox:?} holds {held} bytes from the peer, beyond the credit limit of {limit} (the peer ignores flow control)"
    )]
    CreditExceeded {
        /// The mailbox.
        mailbox: String,
        /// What it would hold.
        held: u64,
        /// The limit.
        limit: u64,
    },
}

#[derive(Debug, Clone, Copy, Default)]
struct Account {
    /// Bytes of the peer's messages in the mailbox (or being reassembled for it).
    held: u64,
    /// Bytes the application took (or that found no mailbox), not yet given back.
    owed: u64,
    /// Opened for a name this node has no mailbox for.
    stray: bool,
}

/// The receiver's side of one peer: per mailbox, what the peer's messages hold and what is
/// owed back to it.
#[derive(Debug)]
pub struct RecvCredit {
    window: u64,
    limit: u64,
    accounts: NameMap<Account>,
    strays: usize,
    urgent: bool,
    sync_due: bool,
}

impl RecvCredit {
    /// Accounts for a peer of a node whose mailboxes take `window` bytes from each peer and
    /// payloads up to `max_payload`.
    pub fn new(window: u64, max_payload: u64) -> RecvCredit {
        RecvCredit {
            window,
            limit: window
                .saturating_mul(2)
                .saturating_add(max_payload)
                .saturating_add(LIMIT_SLACK),
            accounts: NameMap::default(),
            strays: 0,
            urgent: false,
            sync_due: false,
        }
    }

    /// The window announced to the peer.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Most bytes of the peer's messages one mailbox may hold: twice the window, one
    /// largest payload and [`LIMIT_SLACK`].
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes of the peer's messages held in `mailbox`.
    pub fn held(&self, mailbox: &[u8]) -> u64 {
        self.accounts.get(mailbox).map_or(0, |a| a.held)
    }

    /// `bytes` of the peer's messages arrived for `mailbox`, which exists here. A peer
    /// beyond the limit broke the protocol (nothing is charged then).
    pub fn charge(&mut self, mailbox: &Name, bytes: u64) -> Result<(), FlowError> {
        let a = match self.accounts.get_mut(mailbox.as_bytes()) {
            Some(a) => a,
            None => self.accounts.entry(mailbox.detached()).or_default(),
        };
        let would = a.held.saturating_add(a.owed).saturating_add(bytes);
        if would > self.limit {
            return Err(FlowError::CreditExceeded {
                mailbox: mailbox.to_string(),
                held: would,
                limit: self.limit,
            });
        }
        if a.stray {
            a.stray = false;
            self.strays -= 1;
        }
        a.held += bytes;
        Ok(())
    }

    /// Take back a charge of `bytes` for `mailbox` whose message was not kept after all
    /// (its piece did not add up): nothing is owed for it.
    pub fn uncharge(&mut self, mailbox: &[u8], bytes: u64) {
        if let Some(a) = self.accounts.get_mut(mailbox) {
            a.held = a.held.saturating_sub(bytes);
        }
        self.tidy();
    }

    fn owe(&mut self, mailbox: &[u8], bytes: u64, a_held: impl FnOnce(&mut Account)) -> bool {
        let Some(a) = self.accounts.get_mut(mailbox) else {
            return false;
        };
        a_held(a);
        a.owed += bytes;
        if a.owed >= (self.window / 8).max(1) {
            self.urgent = true;
        }
        self.urgent
    }

    /// The application took (or a closed mailbox dropped) `bytes` of the peer's messages
    /// from `mailbox`: they are owed back. Returns whether a grant is urgent (poke the
    /// writer); otherwise it goes with the next write.
    pub fn release(&mut self, mailbox: &[u8], bytes: u64) -> bool {
        self.owe(mailbox, bytes, |a| a.held = a.held.saturating_sub(bytes))
    }

    /// `bytes` of the peer's messages for `mailbox` found no such mailbox (or were given
    /// up): owed back at once. Past a bound on such names, a SYNC is asked for instead.
    /// Returns whether a grant (or SYNC) is urgent.
    pub fn dropped(&mut self, mailbox: &Name, bytes: u64) -> bool {
        if !self.accounts.contains_key(mailbox.as_bytes()) {
            if self.strays >= MAX_STRAY {
                self.sync_due = true;
                return true;
            }
            self.strays += 1;
            self.accounts.insert(
                mailbox.detached(),
                Account {
                    stray: true,
                    ..Account::default()
                },
            );
        }
        self.owe(mailbox.as_bytes(), bytes, |_| {});
        true
    }

    /// Whether a SYNC should be sent (the accounts overflowed).
    pub fn wants_sync(&self) -> bool {
        self.sync_due
    }

    /// Whether the peer's messages hold nothing here and nothing is owed back or due to it
    /// (no SYNC, no grant).
    pub fn is_settled(&self) -> bool {
        !self.sync_due && self.accounts.values().all(|a| a.held == 0 && a.owed == 0)
    }

    /// Ask for a SYNC (a new connection).
    pub fn request_sync(&mut self) {
        self.sync_due = true;
    }

    /// Whether grants are waiting, and whether they are urgent.
    pub fn grants_waiting(&self) -> (bool, bool) {
        (self.accounts.values().any(|a| a.owed > 0), self.urgent)
    }

    /// The SYNC for the peer, as of message `next` (the caller makes sure every message
    /// below `next`, and none above, is charged). Everything owed counts as given back.
    pub fn snapshot(&mut self, next: u64, max_payload: u64) -> Sync {
        let mut held: Vec<(Name, u64)> = Vec::new();
        for (name, a) in &mut self.accounts {
            a.owed = 0;
            if a.held > 0 && held.len() < MAX_CREDIT_ENTRIES {
                held.push((name.clone(), a.held));
            }
        }
        held.sort();
        self.tidy();
        self.sync_due = false;
        self.urgent = false;
        Sync {
            next,
            window: self.window,
            max_payload,
            held,
        }
    }

    /// The grants to send (at most one frame's worth; call again while it returns some).
    pub fn take_grants(&mut self) -> Option<Credit> {
        let mut grants = Vec::new();
        for (name, a) in &mut self.accounts {
            if a.owed > 0 {
                grants.push((name.clone(), std::mem::take(&mut a.owed)));
                if grants.len() == MAX_CREDIT_ENTRIES {
                    break;
                }
            }
        }
        self.tidy();
        if grants.is_empty() {
            self.urgent = false;
            return None;
        }
        self.urgent = self.accounts.values().any(|a| a.owed > 0) && self.urgent;
        grants.sort();
        Some(Credit { grants })
    }

    fn tidy(&mut self) {
        let mut strays = 0;
        self.accounts.retain(|_, a| {
            let keep = a.held > 0 || a.owed > 0;
            if keep && a.stray {
                strays += 1;
            }
            keep
        });
        self.strays = strays;
    }
}

#[cfg(test)]
mod tests;
