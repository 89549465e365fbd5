//! Named mailboxes' queues, and the registry of a node's mailboxes.
//!
//! A mailbox's queue is bounded in bytes, two ways. Messages from other nodes are admitted
//! by credit (see `batchwire_core::credit`): each sending node may have `mailbox_bytes` of
//! them here at once, so a connection's reader hands what arrives over without ever waiting
//! for the consumer, and a mailbox nobody reads holds back only its own senders. Each such
//! message carries its credit ([`Held`]), given back to its sender as the application takes
//! it. Messages from this node wait for room (or are refused with `try_send`) while the
//! mailbox holds `mailbox_bytes` or more.

mod registry;
mod take;
pub(crate) use registry::Mailboxes;

use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::address::Address;
use crate::error::RecvError;
use crate::io::NameHash;
use crate::io::envelope::{Envelope, Outbound, Sink};
use crate::io::flow::Held;
use crate::io::wakers::{Relay, Sleepers, Ticket, Wakers};
use batchwire_core::codec::Name;
use batchwire_core::frame;
use batchwire_core::idle::{self, IdleStep, IdleStrategy};
use tracing::warn;

/// Bytes a message counts against its mailbox's bound beyond its encoded size.
const PER_MESSAGE: usize = 16;

/// How a local push waits for room.
pub(crate) enum Wait {
    /// Not at all: a full mailbox refuses.
    No,
    /// Until there is room or the mailbox closes (an application thread).
    Forever,
}

/// Why a push did not queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Full,
    Closed,
}

/// What a mailbox queue holds.
enum Item {
    /// A run of encoded messages from one frame, all for this mailbox, still in the receive
    /// buffer. They are decoded by the receiving thread, so the reference counts of the
    /// shared receive buffer are touched by that thread alone, not bounced between the
    /// connection reader and the application.
    Run {
        from: Name,
        data: Bytes,
        left: u32,
        held: Held,
    },
    /// One message: delivered locally, or reassembled from pieces (with its credit, boxed:
    /// see the size check below).
    One(Envelope, Option<Box<Held>>),
}

// An item is moved three times per local message (into the queue, out of it, into the
// receiver's batch). Up to 128 bytes a move is inlined; at 160 (with the credit inline in
// `One`) each was a `memcpy` call, on the path of every local message.
const _: () = assert!(std::mem::size_of::<Item>() <= 128);

struct Inner {
    q: VecDeque<Item>,
    bytes: usize,
    closed: bool,
    /// Tasks waiting for a message (async receivers).
    wakers: Wakers,
    /// Tasks waiting for room (local async sends).
    room: Wakers,
    /// The way back for the requests taken from here (set by the handle that claims it).
    replier: Option<Weak<dyn Outbound>>,
    /// Who may read a connection for a receiver with nothing to take (set with the
    /// replier; see [`Leader`]).
    leader: Option<Weak<dyn Leader>>,
    /// A receiver is reading a connection while it waits: a push signals `wake_fd`.
    leading: bool,
    /// A push signalled `wake_fd` while a receiver led (it is emptied when the lead ends).
    signalled: bool,
    /// The node the last message from another node came from: the connection a waiting
    /// receiver reads, since its next message most likely comes on it too...
    last_from: Option<Name>,
    /// ...if the last [`ONE_SOURCE`] did (pushes from it in a row). Messages from several
    /// nodes at once are better left to their readers: a receiver reading one connection
    /// would be woken through its eventfd for the others' (a wake-up per message).
    same_from: u32,
    /// When messages from one node last followed messages from another: a receiver does
    /// not lead for [`MIXED_QUIET`] after that (see `lead`).
    mixed_at: Option<Instant>,
    /// Local pushers waiting for room, woken one at a time (they all wait for the same).
    pushers: Relay<()>,
    /// Receiving threads waiting for a message.
    receivers: Sleepers,
    /// The last take was small messages: a receiver yields once before it parks (see
    /// `batchwire_core::idle::small_take`).
    yield_next: bool,
}

/// The state behind a mailbox, shared between the node (which pushes) and the handle.
pub(crate) struct MailboxQueue {
    pub name: Name,
    inner: Mutex<Inner>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
    idle: IdleStrategy,
    /// Whether a `Mailbox` handle owns this queue (declared mailboxes start unclaimed).
    pub claimed: std::sync::atomic::AtomicBool,
    /// What a pusher signals while a receiver leads (an eventfd, made at the first lead;
    /// `None` where there is none to make).
    wake_fd: std::sync::OnceLock<Option<Arc<std::os::fd::OwnedFd>>>,
}

/// What a receiver with nothing to take may do instead of parking: read the connection to
/// node `peer` itself until `done()`, `until`, or the connection ends, waking also when
/// the file descriptor `wake` is readable (a push). Returns false, at once, if it could
/// not (no such connection, or someone else reads it). The node's runtime does it; see
/// `Reader::lead`.
pub(crate) trait Leader: Send + Sync {
    fn lead_for(
        &self,
        peer: &Name,
        wake: &Arc<std::os::fd::OwnedFd>,
        done: &dyn Fn() -> bool,
        until: Instant,
    ) -> bool;
}

thread_local! {
    /// This thread woke a receiver that waited for a mailbox (see [`MailboxQueue::lead`]).
    static HANDED_ON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The mailbox this thread leads for, while it does (see [`MailboxQueue::lead`]).
    static LEADS: std::cell::Cell<Option<*const MailboxQueue>> = const { std::cell::Cell::new(None) };
}

/// Make the eventfd `fd` readable (a receiver leading wakes; see [`Leader`]).
pub(crate) fn signal(fd: &std::os::fd::OwnedFd) {
    crate::sys::eventfd_signal(std::os::fd::AsRawFd::as_raw_fd(fd));
}

/// Pushes in a row from one node before a receiver of the mailbox leads its connection.
const ONE_SOURCE: u32 = 16;

/// How long a mailbox must have had messages from one node only before its receiver
/// leads. With several nodes streaming at once (mperf: 4 nodes, each to all) a leader
/// reads one connection while the other connections' readers wake it for theirs: each
/// connection's reader thread reads better there (measured, mperf with receivers leading
/// whatever the sources: 0.87x at 100 B, 0.90x at 1 KB; with this rule 1.00x).
const MIXED_QUIET: Duration = Duration::from_millis(50);

/// Make the eventfd `fd` unreadable again (it counts signals; one read takes them all).
pub(crate) fn drain(fd: &std::os::fd::OwnedFd) {
    crate::sys::eventfd_drain(std::os::fd::AsRawFd::as_raw_fd(fd));
}

/// How far ahead a receiver that waits without a deadline reads before it looks again.
const LEAD_AHEAD: Duration = Duration::from_secs(60);

impl MailboxQueue {
    pub fn new(name: Name, capacity: usize, idle: IdleStrategy) -> Self {
        MailboxQueue {
            name,
            inner: Mutex::new(Inner {
                q: VecDeque::new(),
                bytes: 0,
                closed: false,
                wakers: Wakers::default(),
                room: Wakers::default(),
                replier: None,
                leader: None,
                leading: false,
                signalled: false,
                last_from: None,
                same_from: 0,
                mixed_at: None,
                pushers: Relay::default(),
                receivers: Sleepers::default(),
                yield_next: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            idle,
            claimed: std::sync::atomic::AtomicBool::new(false),
            wake_fd: std::sync::OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue an item. A local one (`wait` is `Some`) is admitted while the mailbox holds
    /// fewer than `capacity` bytes (so one larger than the capacity still fits), waiting for
    /// room as `wait` says; one from another node (`None`) is admitted at once: its sender's
    /// credit bounds it. Gives the item back with the reason if it was not queued.
    // The refused item goes back to the caller by value (no allocation on the hot path).
    #[allow(clippy::result_large_err)]
    fn push(&self, item: Item, cost: usize, wait: Option<Wait>) -> Result<(), (Item, Refused)> {
        let mut g = self.lock();
        if let Some(wait) = wait {
            let mut waited = false;
            while g.bytes >= self.capacity && !g.closed {
                if let Wait::No = wait {
                    return Err((item, Refused::Full));
                }
                g.pushers.park(());
                g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
                g.pushers.woke();
                waited = true;
            }
            if waited && !g.closed {
                // It found room after waiting: the next pusher may, too.
                g.pushers.pass_on(&self.not_full);
            }
        }
        if g.closed {
            return Err((item, Refused::Closed));
        }
        g.bytes += cost;
        let remote = match &item {
            Item::Run { from, .. } => Some(from),
            Item::One(e, Some(_)) => Some(&e.from.node),
            Item::One(_, None) => None,
        };
        if let Some(from) = remote {
            if g.last_from.as_ref() == Some(from) {
                g.same_from = g.same_from.saturating_add(1);
            } else {
                if g.last_from.is_some() {
                    g.mixed_at = Some(Instant::now());
                }
                g.last_from = Some(from.clone());
                g.same_from = 0;
            }
        }
        g.q.push_back(item);
        // Wake only what is asleep, once per burst: a notify is a syscall even with nobody
        // waiting, and a receiver that was woken takes everything queued when it runs.
        if g.receivers.any() {
            // A receiver of another mailbox that leads lets go of the connection: this
            // mailbox's receiver, busier, leads it next time it waits.
            HANDED_ON.set(true);
        }
        g.receivers.notify_all(&self.not_empty);
        // The leader's own pushes (it reads for this mailbox) need no signal: it looks
        // at the mailbox after every read.
        if g.leading && !LEADS.get().is_some_and(|q| std::ptr::eq(q, self)) {
            g.signalled = true;
            self.signal_leader();
        }
        g.wakers.wake_all();
        Ok(())
    }

    /// Queue a run of `count` validated, encoded messages from node `from` (a connection
    /// reader's path): never waits. `held` is the run's credit. Refused only if the mailbox
    /// was closed (dropped): then `held` comes back, for another queue of the same name or
    /// to be dropped (which gives the credit back).
    pub fn push_run(&self, from: &Name, data: Bytes, count: u32, held: Held) -> Result<(), Held> {
        let cost = data.len() + PER_MESSAGE * count as usize;
        let item = Item::Run {
            from: from.clone(),
            data,
            left: count,
            held,
        };
        self.push(item, cost, None).map_err(|(item, _)| match item {
            Item::Run { held, .. } => held,
            Item::One(..) => unreachable!("pushed a Run"),
        })
    }

    /// Queue one whole message from another node (reassembled from pieces, or sent in one
    /// piece): never waits. `held` is its credit.
    pub fn push_remote(&self, e: Envelope, held: Held) -> Result<(), Refused> {
        let cost = e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
        self.push(Item::One(e, Some(Box::new(held))), cost, None)
            .map_err(|(_, r)| r)
    }

    /// Queue one message (the local path), waiting for room if `block`. Gives it back with
    /// the reason if it was not queued.
    pub fn push_one(&self, e: Envelope, block: bool) -> Result<(), (Envelope, Refused)> {
        let cost = e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
        let wait = if block { Wait::Forever } else { Wait::No };
        self.push(Item::One(e, None), cost, Some(wait))
            .map_err(|(i, r)| match i {
                Item::One(e, _) => (e, r),
                Item::Run { .. } => unreachable!("pushed a One"),
            })
    }

    /// Its handle was dropped (no receiver is left): close it and drop what is queued, so
    /// the credit those messages hold goes back to their senders now, not when the last
    /// reference to the queue goes (a connection's reader keeps one to the mailbox it last
    /// delivered to, for as long as nothing else arrives for it). Returns how many
    /// messages were dropped, by sender: (node, mailbox, count).
    pub fn discard(&self) -> Vec<(Name, Name, u32)> {
        self.close();
        let items = {
            let mut g = self.lock();
            g.bytes = 0;
            g.room.wake_all();
            std::mem::take(&mut g.q)
        };
        // By sender, in a map: each request has a reply mailbox of its own, so a mailbox
        // full of small requests has as many senders as messages.
        let mut by_sender: HashMap<(Name, Name), u32> = HashMap::new();
        let mut count = |node: &Name, mailbox: Name| {
            let n = by_sender.entry((node.clone(), mailbox)).or_default();
            *n = n.saturating_add(1);
        };
        for item in &items {
            match item {
                Item::One(e, _) => count(&e.from.node, e.from.mailbox.clone()),
                Item::Run {
                    from, data, left, ..
                } => {
                    let mut data = data.clone();
                    for _ in 0..*left {
                        let Some((mailbox, _, _)) = frame::next_message(&mut data) else {
                            break;
                        };
                        count(from, mailbox);
                    }
                }
            }
        }
        // Their credit goes back here, with the queue's lock released.
        drop(items);
        by_sender.into_iter().map(|((n, m), c)| (n, m, c)).collect()
    }

    /// Close: wakes every waiter; receivers get what is queued, then `Closed`.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        self.not_empty.notify_all();
        if g.leading {
            g.signalled = true;
            self.signal_leader();
        }
        g.pushers.notify_all(&self.not_full);
        g.room.wake_all();
        g.wakers.wake_all();
    }

    /// Requests taken from here reply through `out`.
    pub fn set_replier(&self, out: Weak<dyn Outbound>) {
        self.lock().replier = Some(out);
    }

    /// A receiver with nothing to take may read a connection through `leader`.
    pub fn set_leader(&self, leader: Weak<dyn Leader>) {
        self.lock().leader = Some(leader);
    }

    /// The eventfd pushes signal while a receiver leads (made once; `None` if it cannot
    /// be made, and then no receiver leads).
    fn wake_fd(&self) -> Option<&Arc<std::os::fd::OwnedFd>> {
        self.wake_fd
            .get_or_init(|| {
                #[cfg(target_os = "linux")]
                if let Ok(fd) = crate::sys::eventfd() {
                    return Some(Arc::new(fd));
                }
                None
            })
            .as_ref()
    }

    /// A push while a receiver leads: make its eventfd readable.
    fn signal_leader(&self) {
        if let Some(fd) = self.wake_fd() {
            signal(fd);
        }
    }

    /// With nothing to take: read the connection the last message came on until one comes
    /// (see [`Leader`]), instead of parking. Call with the lock, which it gives back, with
    /// whether it led and whether it stopped because it woke another waiting receiver
    /// (then this one parks for the rest of its wait, and the other, busier, leads when it
    /// waits next).
    fn lead<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        left: Option<Duration>,
    ) -> (MutexGuard<'a, Inner>, bool, bool) {
        if g.leading
            || g.same_from < ONE_SOURCE
            || g.mixed_at.is_some_and(|t| t.elapsed() < MIXED_QUIET)
        {
            return (g, false, false);
        }
        let Some(leader) = g.leader.as_ref().and_then(Weak::upgrade) else {
            return (g, false, false);
        };
        let (Some(peer), Some(wake)) = (g.last_from.clone(), self.wake_fd()) else {
            return (g, false, false);
        };
        g.leading = true;
        drop(g);
        HANDED_ON.set(false);
        let done = || {
            if HANDED_ON.get() {
                return true;
            }
            let g = self.lock();
            !g.q.is_empty() || g.closed
        };
        let until = Instant::now() + left.unwrap_or(LEAD_AHEAD);
        LEADS.set(Some(self as *const MailboxQueue));
        let led = leader.lead_for(&peer, wake, &done, until);
        LEADS.set(None);
        let mut g = self.lock();
        g.leading = false;
        // No push signals it any more (they look at `leading` under the lock): empty it
        // if one did. (A caller asking for the turn, `Runtime::ask_for_turn`, signals
        // without the mark; the next lead's first poll returns at once and empties it.)
        if std::mem::take(&mut g.signalled) {
            drain(wake);
        }
        (g, led, HANDED_ON.get())
    }
}

thread_local! {
    /// Whether this thread's last take from a mailbox took more than one message or left
    /// some behind: it is serving a backlog, and what it sends meanwhile (replies) is left
    /// to the writer to bundle rather than written through (see
    /// `io::write::write_through`). A server thread that wrote replies itself would do a
    /// whole TCP send per reply, unbundled, and fall behind many calling threads.
    static BACKLOG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn note_backlog(b: bool) {
    BACKLOG.with(|c| c.set(b));
}

/// Whether the calling thread's last take from a mailbox took several or left some behind.
pub(crate) fn serving_backlog() -> bool {
    BACKLOG.with(|c| c.get())
}

/// How long `take` waits for a first message.
#[derive(Clone, Copy)]
enum TakeWait {
    No,
    Forever,
    Until(Instant),
    /// From the first time it has to wait.
    For(Duration),
}

#[cfg(test)]
mod tests;
