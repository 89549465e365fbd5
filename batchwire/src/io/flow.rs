//! The receiving side of a peer's flow control: its credit accounts (core `RecvCredit`)
//! behind a lock, and what its writer has to send about them (a SYNC, CREDIT grants).
//!
//! Three kinds of threads touch it, each for one step: the peer's connection reader
//! charges what arrives ([`Flow::charge`], [`Flow::dropped`]) and takes the SYNC snapshot
//! at a frame boundary ([`Flow::snapshot`]); the application threads that take messages
//! out of mailboxes give their credit back ([`Held`], dropped or released as messages are
//! taken); the peer's writer sends what is due with its control frames
//! ([`Flow::take_output`]). Whoever makes a grant urgent pokes the writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use batchwire_core::codec::Name;
use batchwire_core::credit::{FlowError, RecvCredit};
use batchwire_core::frame::{Frame, Sync};
use batchwire_core::session::ConnId;

use crate::io::lane::Lane;

struct Inner {
    credit: RecvCredit,
    /// The SYNC to send first (the latest snapshot replaces an unsent one), and the
    /// connection current when it was taken: written on that connection or not at all.
    sync: Option<(ConnId, Sync)>,
}

/// A peer's receive-side credit.
pub(crate) struct Flow {
    inner: Mutex<Inner>,
    /// Whether the writer has something to send (read without the lock every round).
    output: AtomicBool,
    /// The peer's lane: poking it wakes the peer's writer.
    lane: Arc<Lane>,
    max_payload: u64,
}

impl Flow {
    /// Accounts for a peer of a node whose mailboxes take `window` bytes from each peer.
    pub fn new(window: u64, max_payload: u64, lane: Arc<Lane>) -> Flow {
        Flow {
            inner: Mutex::new(Inner {
                credit: RecvCredit::new(window, max_payload),
                sync: None,
            }),
            output: AtomicBool::new(false),
            lane,
            max_payload,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self, urgent: bool) {
        self.output.store(true, Ordering::Release);
        if urgent {
            self.lane.poke();
        }
    }

    /// `bytes` of the peer's messages arrived for `mailbox` (which exists): held until
    /// taken. Beyond the credit limit, the peer broke the protocol.
    pub fn charge(&self, mailbox: &Name, bytes: u64) -> Result<(), FlowError> {
        self.lock().credit.charge(mailbox, bytes)
    }

    /// Take back a charge for a piece that was not kept after all (it did not add up).
    pub fn uncharge(&self, mailbox: &Name, bytes: u64) {
        self.lock().credit.uncharge(mailbox.as_bytes(), bytes);
    }

    /// `bytes` of the peer's messages were taken out of `mailbox` (or dropped with it).
    pub fn release(&self, mailbox: &[u8], bytes: u64) {
        let urgent = self.lock().credit.release(mailbox, bytes);
        self.wake(urgent);
    }

    /// `bytes` of the peer's messages for `mailbox` found no such mailbox.
    pub fn dropped(&self, mailbox: &Name, bytes: u64) {
        let urgent = self.lock().credit.dropped(mailbox, bytes);
        self.wake(urgent);
    }

    /// Whether nothing of the peer's is held here and nothing is due to it (see
    /// `RecvCredit::is_settled`).
    pub fn is_quiet(&self) -> bool {
        !self.output.load(Ordering::Acquire) && self.lock().credit.is_settled()
    }

    /// Whether a SYNC or grants wait for the writer.
    pub fn has_output(&self) -> bool {
        self.output.load(Ordering::Acquire)
    }

    /// Whether a SYNC is asked for (the accounts overflowed).
    pub fn wants_sync(&self) -> bool {
        self.lock().credit.wants_sync()
    }

    /// Take the snapshot for a SYNC as of message `next` (then [`Flow::wake_writer`],
    /// outside the session turn). The caller is at a frame boundary with the delivery turn
    /// (so exactly the messages below `next` are charged) and calls this inside the session
    /// turn in which it read `next`: the writer takes the SYNC in the session turn in which
    /// it takes its ACKs ([`Flow::take_output`]), so no ACK beyond `next` is written before
    /// this SYNC, and the peer still holds every message from `next` on when it recounts.
    ///
    /// The SYNC belongs to connection `on`, current when it was taken: written on a successor
    /// (the writer missed `on`), it would say where credit stood before what was delivered
    /// on `on` since, which the peer's window no longer holds after the successor's
    /// RESUME, and the peer's recount would leave that out.
    pub fn snapshot(&self, on: ConnId, next: u64) {
        let mut g = self.lock();
        let s = g.credit.snapshot(next, self.max_payload);
        g.sync = Some((on, s));
    }

    /// Wake the peer's writer: a SYNC is waiting.
    pub fn wake_writer(&self) {
        self.wake(true);
    }

    /// Bytes of the peer's messages held in `mailbox` (tests and stats).
    #[cfg(test)]
    pub fn held(&self, mailbox: &[u8]) -> u64 {
        self.lock().credit.held(mailbox)
    }

    /// The writer's part, for connection `on`: encode the SYNC (if one is due) and the
    /// grants into `out`. A SYNC taken for another connection is dropped: that one is
    /// over (`on` is current), and `on` has (or will have) a SYNC of its own.
    pub fn take_output(&self, on: ConnId, out: &mut Vec<u8>) {
        if !self.output.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut g = self.lock();
        match g.sync.take() {
            Some((c, s)) if c == on => Frame::Sync(s).encode(out),
            _ => {}
        }
        while let Some(c) = g.credit.take_grants() {
            Frame::Credit(c).encode(out);
        }
    }
}

/// Credit held by a message (or run of messages) in a mailbox: given back to its sender as
/// it is taken, and whatever is left when it is dropped.
///
/// A run taken a message at a time gives its credit back in steps of [`RELEASE_STEP`]
/// bytes, not per message: each release takes the peer's flow lock, which the reader
/// charges under, and a receiver taking one 100 B message per call spent more on that
/// than on the message. What is not given back yet belongs to messages already taken
/// from a run that still has some left, so it comes back at the latest when the rest of
/// the run is taken (or dropped with the mailbox).
pub(crate) struct Held {
    flow: Arc<Flow>,
    mailbox: Name,
    bytes: u64,
    /// Of `bytes`, those taken and not yet given back.
    pending: u64,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} B for {})", self.bytes, self.mailbox)
    }
}

/// Bytes of a run's credit given back at once when it is taken a little at a time.
const RELEASE_STEP: u64 = 16 << 10;

impl Held {
    pub fn new(flow: Arc<Flow>, mailbox: Name, bytes: u64) -> Held {
        Held {
            flow,
            mailbox,
            bytes,
            pending: 0,
        }
    }

    /// `bytes` of the run were taken: given back once a step's worth has been.
    pub fn release(&mut self, bytes: u64) {
        self.pending = self.pending.saturating_add(bytes).min(self.bytes);
        if self.pending >= RELEASE_STEP {
            let b = std::mem::take(&mut self.pending);
            self.bytes -= b;
            self.flow.release(self.mailbox.as_bytes(), b);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.flow.release(self.mailbox.as_bytes(), self.bytes);
        }
    }
}

/// A flow of its own (1 MiB windows), for the io layer's tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub fn flow() -> Arc<Flow> {
        Arc::new(Flow::new(1 << 20, 1 << 20, crate::io::lane::test_lane()))
    }
}
