//! Named mailboxes' queues, and the registry of a node's mailboxes.
//!
//! A mailbox's queue is bounded in bytes. The connection reader pushes a whole frame's worth
//! of messages for one mailbox under one lock (one wake-up per batch, not per message); when
//! the mailbox is full the reader waits, stops reading its socket, and TCP flow control
//! slows the senders down. Nothing is dropped. A waiting reader looks up every
//! [`RECHECK`] whether to give up (its connection was replaced, the node is stopping).

use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::address::Address;
use crate::error::{Error, RecvError};
use crate::io::NameHash;
use batchwire_core::codec::Name;
use batchwire_core::frame;
use batchwire_core::idle::{IdleStep, IdleStrategy};
use tracing::warn;

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The sending node and mailbox (the mailbox is "" for sends made through `Node`).
    pub from: Address,
    /// The payload, a slice of the receive buffer (no copy was made).
    pub payload: Bytes,
}

impl Envelope {
    /// Decode a payload sent with `send_value` (postcard).
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        postcard::from_bytes(&self.payload).map_err(|e| Error::Decode(e.to_string()))
    }
}

/// Bytes a message counts against its mailbox's bound beyond its encoded size.
const PER_MESSAGE: usize = 16;

/// How often a pusher waiting for room looks up whether to give up.
pub(crate) const RECHECK: Duration = Duration::from_millis(50);

/// How a push waits for room.
pub(crate) enum Wait<'a> {
    /// Not at all: a full mailbox refuses.
    No,
    /// Until there is room, the mailbox closes, or `give_up()` says so (checked every
    /// [`RECHECK`]).
    Until(&'a dyn Fn() -> bool),
    /// Until there is room or the mailbox closes (an application thread).
    Forever,
}

/// Why a push did not queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Full,
    Closed,
    GaveUp,
}

/// What a mailbox queue holds.
enum Item {
    /// A run of encoded messages from one frame, all for this mailbox, still in the receive
    /// buffer. They are decoded by the receiving thread, so the reference counts of the
    /// shared receive buffer are touched by that thread alone, not bounced between the
    /// connection reader and the application.
    Run { from: Name, data: Bytes, left: u32 },
    /// One message delivered locally.
    One(Envelope),
}

struct Inner {
    q: VecDeque<Item>,
    bytes: usize,
    closed: bool,
    wakers: Vec<Waker>,
    pushers_waiting: usize,
    receivers_waiting: usize,
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
}

impl MailboxQueue {
    pub fn new(name: Name, capacity: usize, idle: IdleStrategy) -> Self {
        MailboxQueue {
            name,
            inner: Mutex::new(Inner {
                q: VecDeque::new(),
                bytes: 0,
                closed: false,
                wakers: Vec::new(),
                pushers_waiting: 0,
                receivers_waiting: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            idle,
            claimed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue an item, waiting for room as `wait` says (an item is admitted while the mailbox
    /// holds fewer than `capacity` bytes, so one larger than the capacity still fits).
    /// Gives the item back with the reason if it was not queued.
    fn push(&self, item: Item, cost: usize, wait: Wait) -> Result<(), (Item, Refused)> {
        let mut g = self.lock();
        while g.bytes >= self.capacity && !g.closed {
            g.pushers_waiting += 1;
            g = match wait {
                Wait::No => {
                    g.pushers_waiting -= 1;
                    return Err((item, Refused::Full));
                }
                Wait::Until(give_up) => {
                    if give_up() {
                        g.pushers_waiting -= 1;
                        return Err((item, Refused::GaveUp));
                    }
                    self.not_full
                        .wait_timeout(g, RECHECK)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                Wait::Forever => self.not_full.wait(g).unwrap_or_else(|p| p.into_inner()),
            };
            g.pushers_waiting -= 1;
        }
        if g.closed {
            return Err((item, Refused::Closed));
        }
        g.bytes += cost;
        g.q.push_back(item);
        // Wake only what is asleep: a notify is a syscall even with nobody waiting.
        if g.receivers_waiting > 0 {
            self.not_empty.notify_all();
        }
        for w in g.wakers.drain(..) {
            w.wake();
        }
        Ok(())
    }

    /// Queue a run of `count` validated, encoded messages from node `from` (the reader's
    /// path), waiting as `wait` says.
    pub fn push_run(
        &self,
        from: &Name,
        data: Bytes,
        count: u32,
        wait: Wait,
    ) -> Result<(), Refused> {
        let cost = data.len() + PER_MESSAGE * count as usize;
        let item = Item::Run {
            from: from.clone(),
            data,
            left: count,
        };
        self.push(item, cost, wait).map_err(|(_, r)| r)
    }

    /// Queue one message (the local path), waiting for room if `block`. Gives it back with
    /// the reason if it was not queued.
    pub fn push_one(&self, e: Envelope, block: bool) -> Result<(), (Envelope, Refused)> {
        let cost = e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
        let wait = if block { Wait::Forever } else { Wait::No };
        self.push(Item::One(e), cost, wait)
            .map_err(|(i, r)| match i {
                Item::One(e) => (e, r),
                Item::Run { .. } => unreachable!("pushed a One"),
            })
    }

    /// Close: wakes every waiter; receivers get what is queued, then `Closed`.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
        for w in g.wakers.drain(..) {
            w.wake();
        }
    }

    /// Move up to `max` messages from the queue to `out`; returns how many.
    fn drain(g: &mut Inner, out: &mut Vec<Envelope>, max: usize) -> usize {
        let mut n = 0;
        let mut freed = 0;
        while n < max {
            let Some(front) = g.q.front_mut() else { break };
            match front {
                Item::One(_) => {
                    if let Some(Item::One(e)) = g.q.pop_front() {
                        freed += e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
                        out.push(e);
                        n += 1;
                    }
                }
                Item::Run { from, data, left } => {
                    while n < max && *left > 0 {
                        let Some((mailbox, payload, used)) = frame::next_message(data) else {
                            *left = 0;
                            break;
                        };
                        out.push(Envelope {
                            from: Address {
                                node: from.clone(),
                                mailbox,
                            },
                            payload,
                        });
                        freed += used + PER_MESSAGE;
                        *left -= 1;
                        n += 1;
                    }
                    if *left == 0 {
                        // Whatever the run's cost was beyond what was counted (nothing, for
                        // a well-formed run) is released with it.
                        freed += data.len();
                        g.q.pop_front();
                    }
                }
            }
        }
        g.bytes = g.bytes.saturating_sub(freed);
        if g.q.is_empty() {
            g.bytes = 0;
        }
        n
    }

    /// Take up to `max` messages into `out`, waiting until `deadline` (None: forever) for
    /// the first one. Returns how many were taken.
    pub fn take(
        &self,
        out: &mut Vec<Envelope>,
        max: usize,
        deadline: Option<Option<Instant>>,
    ) -> Result<usize, RecvError> {
        let mut idler = self.idle.idler();
        let mut g = self.lock();
        loop {
            if !g.q.is_empty() {
                let n = Self::drain(&mut g, out, max);
                if g.pushers_waiting > 0 {
                    self.not_full.notify_all();
                }
                return Ok(n);
            }
            if g.closed {
                return Err(RecvError::Closed);
            }
            let now = Instant::now();
            let left = match deadline {
                None => return Err(RecvError::Empty),
                Some(None) => None,
                Some(Some(t)) if now >= t => return Err(RecvError::Timeout),
                Some(Some(t)) => Some(t - now),
            };
            let step = idler.step();
            match step {
                IdleStep::Spin | IdleStep::Yield => {
                    drop(g);
                    crate::io::pause(step);
                    g = self.lock();
                }
                IdleStep::Park => {
                    g.receivers_waiting += 1;
                    g = match left {
                        None => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(d) => {
                            self.not_empty
                                .wait_timeout(g, d)
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                    };
                    g.receivers_waiting -= 1;
                }
            }
        }
    }

    pub fn poll_one(&self, cx: &mut Context<'_>) -> Poll<Result<Envelope, RecvError>> {
        let mut g = self.lock();
        let mut out = Vec::with_capacity(1);
        if Self::drain(&mut g, &mut out, 1) == 1 {
            if g.pushers_waiting > 0 {
                self.not_full.notify_all();
            }
            if let Some(e) = out.pop() {
                return Poll::Ready(Ok(e));
            }
        }
        if g.closed {
            return Poll::Ready(Err(RecvError::Closed));
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock()
            .q
            .iter()
            .map(|i| match i {
                Item::One(_) => 1,
                Item::Run { left, .. } => *left as usize,
            })
            .sum()
    }
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

impl Mailboxes {
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
    /// Returns how many messages were left in it.
    pub fn remove(&self, q: &Arc<MailboxQueue>) -> usize {
        let mut g = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if g.get(&q.name).is_some_and(|m| Arc::ptr_eq(m, q)) {
            g.remove(&q.name);
        }
        drop(g);
        q.close();
        q.len()
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
mod tests {
    use super::*;
    use batchwire_core::frame::{Message, MessageList};

    fn env(i: u8) -> Envelope {
        Envelope {
            from: Address::new("n", "m").unwrap(),
            payload: Bytes::from(vec![i; 8]),
        }
    }

    fn q(cap: usize) -> MailboxQueue {
        MailboxQueue::new(Name::from_static("m"), cap, IdleStrategy::default())
    }

    #[test]
    fn push_respects_capacity_without_blocking() {
        let q = q(40);
        // Each costs 8 + 1 + 16 = 25: admitted at 0 and 25, refused at 50.
        assert!(q.push_one(env(0), false).is_ok());
        assert!(q.push_one(env(1), false).is_ok());
        let (back, why) = q.push_one(env(2), false).unwrap_err();
        assert_eq!((back.payload[0], why), (2, Refused::Full));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn runs_are_decoded_by_the_receiver_in_order_across_partial_takes() {
        let q = q(1 << 20);
        let msgs: Vec<_> = (0..5u8)
            .map(|i| Message {
                to: Name::from_static("m"),
                from: Name::new(&format!("s{i}")).unwrap(),
                payload: Bytes::from(vec![i; 3]),
            })
            .collect();
        let list = MessageList::from_messages(&msgs);
        let (_, range, n) = list.runs().next().unwrap();
        q.push_run(
            &Name::from_static("peer"),
            list.body().slice(range),
            n,
            Wait::No,
        )
        .unwrap();
        q.push_one(env(9), true).unwrap();
        assert_eq!(q.len(), 6);
        let mut out = Vec::new();
        assert_eq!(q.take(&mut out, 2, None), Ok(2));
        assert_eq!(q.take(&mut out, 10, None), Ok(4));
        let got: Vec<_> = out
            .iter()
            .map(|e| (e.from.to_string(), e.payload[0]))
            .collect();
        assert_eq!(got[0], ("s0@peer".to_string(), 0));
        assert_eq!(got[4], ("s4@peer".to_string(), 4));
        assert_eq!(got[5], ("m@n".to_string(), 9));
        assert_eq!(q.lock().bytes, 0);
    }

    #[test]
    fn take_waits_until_a_push_and_returns_the_batch() {
        let q = Arc::new(q(1 << 20));
        let q2 = q.clone();
        let t = std::thread::spawn(move || {
            let mut out = Vec::new();
            let n = q2.take(
                &mut out,
                100,
                Some(Some(Instant::now() + Duration::from_secs(10))),
            );
            (n, out.len())
        });
        std::thread::sleep(Duration::from_millis(10));
        q.push_one(env(1), true).unwrap();
        let (n, got) = t.join().unwrap();
        assert!(n.unwrap() >= 1 && got >= 1);
    }

    #[test]
    fn closed_mailbox_drains_then_reports_closed() {
        let q = q(1 << 20);
        q.push_one(env(1), true).unwrap();
        q.close();
        let mut out = Vec::new();
        assert_eq!(q.take(&mut out, 10, Some(None)), Ok(1));
        assert_eq!(q.take(&mut out, 10, Some(None)), Err(RecvError::Closed));
        assert!(
            q.push_one(env(2), true).is_err(),
            "a closed mailbox takes nothing"
        );
    }

    #[test]
    fn a_waiting_reader_gives_up_when_told_within_the_recheck() {
        let q = q(10);
        q.push_one(env(0), false).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                let t0 = Instant::now();
                let r = q.push_run(
                    &Name::from_static("p"),
                    Bytes::from_static(b"x"),
                    1,
                    Wait::Until(&|| stop.load(std::sync::atomic::Ordering::Relaxed)),
                );
                (r, t0.elapsed())
            });
            std::thread::sleep(Duration::from_millis(30));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let (r, waited) = t.join().unwrap();
            assert_eq!(r, Err(Refused::GaveUp));
            assert!(waited < Duration::from_secs(2), "{waited:?}");
        });
    }

    #[test]
    fn timeout_is_reported() {
        let q = q(1 << 20);
        let mut out = Vec::new();
        let r = q.take(
            &mut out,
            1,
            Some(Some(Instant::now() + Duration::from_millis(5))),
        );
        assert_eq!(r, Err(RecvError::Timeout));
        assert_eq!(q.take(&mut out, 1, None), Err(RecvError::Empty));
    }
}
