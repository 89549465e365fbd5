//! Named mailboxes' queues, and the registry of a node's mailboxes.
//!
//! A mailbox's queue is bounded in bytes, two ways. Messages from other nodes are admitted
//! by credit (see `batchwire_core::credit`): each sending node may have `mailbox_bytes` of
//! them here at once, so a connection's reader hands what arrives over without ever waiting
//! for the consumer, and a mailbox nobody reads holds back only its own senders. Each such
//! message carries its credit ([`Held`]), given back to its sender as the application takes
//! it. Messages from this node wait for room (or are refused with `try_send`) while the
//! mailbox holds `mailbox_bytes` or more.

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
use crate::io::wakers::{Relay, Sleepers, Wakers};
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
    wakers: Vec<Waker>,
    /// Tasks waiting for room (local async sends).
    room: Wakers,
    /// The way back for the requests taken from here (set by the handle that claims it).
    replier: Option<Weak<dyn Outbound>>,
    /// Who may read a connection for a receiver with nothing to take (set with the
    /// replier; see [`Leader`]).
    leader: Option<Weak<dyn Leader>>,
    /// A receiver is reading a connection while it waits: a push signals `wake_fd`.
    leading: bool,
    /// The node the last message from another node came from: the connection a waiting
    /// receiver reads, since its next message most likely comes on it too...
    last_from: Option<Name>,
    /// ...if the last [`ONE_SOURCE`] did (pushes from it in a row). Messages from several
    /// nodes at once are better left to their readers: a receiver reading one connection
    /// would be woken through its eventfd for the others' (a wake-up per message).
    same_from: u32,
    /// The last take was one message of at most [`LONE_BYTES`] and left none: a receiver
    /// answering one message at a time (a server), not one working through a stream. Only
    /// such a receiver leads: reading a stream itself, a receiver would serialise reading
    /// with its own work, where the reader thread overlaps them.
    lone: bool,
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
}

/// Make the eventfd `fd` readable (a receiver leading wakes; see [`Leader`]).
pub(crate) fn signal(fd: &std::os::fd::OwnedFd) {
    crate::sys::eventfd_signal(std::os::fd::AsRawFd::as_raw_fd(fd));
}

/// The largest message after which its receiver may lead (see `Inner::lone`): larger ones
/// come in pieces, a stream the reader thread reads best.
const LONE_BYTES: usize = 64 << 10;

/// Pushes in a row from one node before a receiver of the mailbox leads its connection.
const ONE_SOURCE: u32 = 16;

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
                wakers: Vec::new(),
                room: Wakers::default(),
                replier: None,
                leader: None,
                leading: false,
                last_from: None,
                same_from: 0,
                lone: false,
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
        if g.leading {
            self.signal_leader();
        }
        for w in g.wakers.drain(..) {
            w.wake();
        }
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

    /// Close: wakes every waiter; receivers get what is queued, then `Closed`.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        self.not_empty.notify_all();
        if g.leading {
            self.signal_leader();
        }
        g.pushers.notify_all(&self.not_full);
        g.room.wake_all();
        for w in g.wakers.drain(..) {
            w.wake();
        }
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
        if g.leading || !g.lone || g.same_from < ONE_SOURCE {
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
        let led = leader.lead_for(&peer, wake, &done, until);
        let mut g = self.lock();
        g.leading = false;
        // No push signals it any more (they look at `leading` under the lock): empty it.
        drain(wake);
        (g, led, HANDED_ON.get())
    }

    /// Move up to `max` messages from the queue to `out`, giving the requests among them
    /// their way back; returns how many. Their credit goes back to their senders.
    fn drain<S: Sink>(g: &mut Inner, out: &mut S, max: usize) -> usize {
        // A request gets its way back; the envelope is built where it goes, not moved.
        let with_replier = |e: &mut Envelope, r: &Option<Weak<dyn Outbound>>| {
            if let Some(c) = &mut e.call {
                c.replier = r.clone();
            }
        };
        let mut n = 0;
        let mut freed = 0;
        while n < max {
            let Some(front) = g.q.front_mut() else { break };
            match front {
                Item::One(..) => {
                    if let Some(Item::One(mut e, held)) = g.q.pop_front() {
                        freed += e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
                        with_replier(&mut e, &g.replier);
                        out.put(e);
                        drop(held);
                        n += 1;
                    }
                }
                Item::Run {
                    from,
                    data,
                    left,
                    held,
                } => {
                    let (mut taken, mut k) = (0, 0);
                    while n < max && *left > 0 {
                        let Some((mailbox, payload, used)) = frame::next_message(data) else {
                            *left = 0;
                            break;
                        };
                        out.put(Envelope::with_replier(
                            Address::from_names(from.clone(), mailbox),
                            payload,
                            &g.replier,
                        ));
                        taken += used;
                        k += 1;
                        *left -= 1;
                        n += 1;
                    }
                    freed += taken + PER_MESSAGE * k;
                    if *left == 0 {
                        // Whatever the run's cost was beyond what was counted (nothing, for
                        // a well-formed run) is released with it, and so is its credit.
                        freed += data.len();
                        g.q.pop_front();
                    } else {
                        held.release(taken as u64);
                    }
                }
            }
        }
        g.bytes = g.bytes.saturating_sub(freed);
        if g.q.is_empty() {
            g.bytes = 0;
        }
        g.yield_next = idle::small_take(n as u64, freed);
        g.lone = n == 1 && freed <= LONE_BYTES && g.q.is_empty();
        n
    }

    /// Take up to `max` messages into `out`, waiting until `deadline` (None: forever) for
    /// the first one. Returns how many were taken.
    pub fn take<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        deadline: Option<Option<Instant>>,
    ) -> Result<usize, RecvError> {
        let wait = match deadline {
            None => TakeWait::No,
            Some(None) => TakeWait::Forever,
            Some(Some(t)) => TakeWait::Until(t),
        };
        self.take_waiting(out, max, wait)
    }

    /// [`MailboxQueue::take`] waiting at most `timeout` for the first message; the clock is
    /// read only if it has to wait (a receiver taking one message per call from a full
    /// mailbox would otherwise read the clock once per message, for nothing).
    pub fn take_within<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        self.take_waiting(out, max, TakeWait::For(timeout))
    }

    fn take_waiting<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        mut wait: TakeWait,
    ) -> Result<usize, RecvError> {
        let mut g = self.lock();
        let mut idler = self.idle.idler_after(g.yield_next);
        // Cleared once this wait handed a message on to another receiver (see `lead`).
        let mut may_lead = true;
        loop {
            if !g.q.is_empty() {
                let n = Self::drain(&mut g, out, max);
                note_backlog(n > 1 || !g.q.is_empty());
                self.room_freed(&mut g);
                return Ok(n);
            }
            if g.closed {
                return Err(RecvError::Closed);
            }
            let now = Instant::now();
            if let TakeWait::For(d) = wait {
                wait = TakeWait::Until(now + d);
            }
            let left = match wait {
                TakeWait::No => return Err(RecvError::Empty),
                TakeWait::Forever | TakeWait::For(_) => None,
                TakeWait::Until(t) if now >= t => return Err(RecvError::Timeout),
                TakeWait::Until(t) => Some(t - now),
            };
            let step = idler.step();
            match step {
                IdleStep::Spin | IdleStep::Yield => {
                    drop(g);
                    crate::io::pause(step);
                    g = self.lock();
                }
                IdleStep::Park => {
                    // Read a connection meanwhile, if it can, then look again; so too if
                    // it could not but something came while it tried (a push saw it
                    // leading, so signalled it rather than waking a sleeper).
                    if may_lead {
                        let (led, handed);
                        (g, led, handed) = self.lead(g, left);
                        may_lead = !handed;
                        if led || !g.q.is_empty() || g.closed {
                            continue;
                        }
                    }
                    let ticket = g.receivers.park();
                    g = match left {
                        None => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(d) => {
                            self.not_empty
                                .wait_timeout(g, d)
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                    };
                    g.receivers.woke(ticket);
                }
            }
        }
    }

    /// Take up to `max` messages into `out` if any is queued (returns how many); otherwise
    /// leave `cx`'s waker for the next push.
    pub fn poll_batch<S: Sink>(
        &self,
        cx: &mut Context<'_>,
        out: &mut S,
        max: usize,
    ) -> Poll<Result<usize, RecvError>> {
        let mut g = self.lock();
        if !g.q.is_empty() {
            let n = Self::drain(&mut g, out, max.max(1));
            note_backlog(n > 1 || !g.q.is_empty());
            self.room_freed(&mut g);
            return Poll::Ready(Ok(n));
        }
        if g.closed {
            return Poll::Ready(Err(RecvError::Closed));
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Wake `w` when a local push may find room.
    pub fn register_room(&self, w: &Waker) {
        let mut g = self.lock();
        if g.bytes < self.capacity || g.closed {
            w.wake_by_ref();
        } else {
            g.room.register(w);
        }
    }

    /// Room was freed: wake the local pushers waiting for it, threads and tasks.
    fn room_freed(&self, g: &mut Inner) {
        g.pushers.notify(&self.not_full);
        g.room.wake_all();
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock()
            .q
            .iter()
            .map(|i| match i {
                Item::One(..) => 1,
                Item::Run { left, .. } => *left as usize,
            })
            .sum()
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

/// The node's mailboxes by name, and the count of messages that found none.
#[derive(Clone, Default)]
pub(crate) struct Mailboxes(Arc<Registry>);

#[derive(Default)]
struct Registry {
    map: RwLock<HashMap<Name, Arc<MailboxQueue>, NameHash>>,
    /// Messages that arrived for a mailbox that does not exist here.
    missing: AtomicU64,
    /// Mailbox names already logged as missing (at most `LOGGED_NAMES`).
    logged: Mutex<HashSet<Name>>,
}

/// Mailbox names logged as missing, at most (further names are counted only).
const LOGGED_NAMES: usize = 1024;

/// A mailbox a thread delivered to locally, and the node's table it came from: weak
/// references both, so the cache keeps no dropped mailbox's messages and no stopped node's
/// table alive (only their allocations, so a cached address cannot be another node's or
/// another mailbox's meanwhile).
type LocalEntry = (Weak<Registry>, Weak<MailboxQueue>);

thread_local! {
    /// The two mailboxes this thread last delivered to locally, the latest first (see
    /// [`Mailboxes::get_local`]): two, so that a thread alternating between two local
    /// mailboxes, or between two nodes of one process, still finds them.
    static LAST_LOCAL: std::cell::RefCell<[Option<LocalEntry>; 2]> =
        const { std::cell::RefCell::new([None, None]) };
}

impl Mailboxes {
    /// The queue called `name` for a local send: one this thread delivered to lately, if it
    /// has that name, is this node's and is still alive, without the table's lock and hash
    /// (which every `send_all` would otherwise pay once per message for its local copy).
    /// It may have been dropped (closed) since: a push it refuses as closed asks again
    /// with [`Mailboxes::get_again`]. (A queue leaves the table closed, under the table's
    /// lock, so one that is open is still the table's.)
    pub fn get_local(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        let hit = LAST_LOCAL
            .try_with(|c| {
                c.borrow().iter().flatten().find_map(|(reg, q)| {
                    if !std::ptr::eq(reg.as_ptr(), Arc::as_ptr(&self.0)) {
                        return None;
                    }
                    q.upgrade()
                        .filter(|q| batchwire_core::codec::bytes_eq(q.name.as_bytes(), name))
                })
            })
            .ok()
            .flatten();
        hit.or_else(|| self.get_again(name))
    }

    /// The queue called `name` from the table, remembered for this thread's next
    /// [`Mailboxes::get_local`] (unless the thread is exiting: then only looked up).
    pub fn get_again(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        let q = self.get(name)?;
        let _ = LAST_LOCAL.try_with(|c| {
            let mut c = c.borrow_mut();
            c[1] = c[0].take();
            c[0] = Some((Arc::downgrade(&self.0), Arc::downgrade(&q)));
        });
        Some(q)
    }

    pub fn get(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The queue called `name`, made with `make` if there is none.
    pub fn get_or_insert(
        &self,
        name: &Name,
        make: impl FnOnce() -> MailboxQueue,
    ) -> Arc<MailboxQueue> {
        let mut g = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        g.entry(name.clone())
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }

    /// Forget `q` (if it is still the one registered under its name) and close it.
    /// Returns how many messages were left in it. It is closed before the table is let go:
    /// a local sender that kept it (see [`Mailboxes::get_local`]) finds it closed and asks
    /// the table, which may hold a mailbox opened again under the name, rather than
    /// pushing into one that is gone.
    pub fn remove(&self, q: &Arc<MailboxQueue>) -> usize {
        let mut g = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if g.get(&q.name).is_some_and(|m| Arc::ptr_eq(m, q)) {
            g.remove(&q.name);
        }
        q.close();
        drop(g);
        q.len()
    }

    /// Each mailbox's name and the messages waiting in it (for metrics).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub fn depths(&self) -> Vec<(String, usize)> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, q)| (n.to_string(), q.len()))
            .collect()
    }

    /// Close every mailbox (the node stopped).
    pub fn close_all(&self) {
        for q in self
            .0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            q.close();
        }
    }

    /// `count` messages from node `from` found no mailbox `to`: count them, and log the
    /// name the first time (for the first `LOGGED_NAMES` names).
    pub fn note_missing(&self, to: &Name, from: &Name, count: u32) {
        self.0.missing.fetch_add(count as u64, Ordering::Relaxed);
        let mut logged = self.0.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.len() < LOGGED_NAMES && logged.insert(to.clone()) {
            warn!(mailbox = %to, from_node = %from, "message for a mailbox that does not exist here; reporting it to the sender as undeliverable (logged once per name)");
            if logged.len() == LOGGED_NAMES {
                warn!(
                    names = LOGGED_NAMES,
                    "undeliverable messages for so many mailbox names that further names are no longer logged; they are still counted and reported to their senders"
                );
            }
        }
    }

    /// Messages that found no mailbox.
    pub fn missing(&self) -> u64 {
        self.0.missing.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
