//! Named mailboxes: the receiving end of batchwire.
//!
//! A mailbox's queue is bounded in bytes. The connection reader pushes a whole frame's worth
//! of messages for one mailbox under one lock (one wake-up per batch, not per message); when
//! the mailbox is full the reader waits, stops reading its socket, and TCP flow control
//! slows the senders down. Nothing is dropped.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::{Error, RecvError};
use crate::io::node::{Address, Shared};
use batchwire_core::codec::Name;
use batchwire_core::frame;
use batchwire_core::idle::{IdleStep, IdleStrategy};

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

    /// Queue an item, waiting for room if `block` (an item is admitted while the mailbox
    /// holds fewer than `capacity` bytes, so one larger than the capacity still fits).
    /// Gives the item back if the mailbox is closed, or full and `!block`.
    fn push(&self, item: Item, cost: usize, block: bool) -> Result<(), Item> {
        let mut g = self.lock();
        while g.bytes >= self.capacity && !g.closed {
            if !block {
                return Err(item);
            }
            g.pushers_waiting += 1;
            g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            g.pushers_waiting -= 1;
        }
        if g.closed {
            return Err(item);
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
    /// path). Blocks while the mailbox is full. Returns false if the mailbox is closed.
    pub fn push_run(&self, from: &Name, data: Bytes, count: u32) -> bool {
        let cost = data.len() + PER_MESSAGE * count as usize;
        let item = Item::Run {
            from: from.clone(),
            data,
            left: count,
        };
        self.push(item, cost, true).is_ok()
    }

    /// Queue one message (the local path). Gives it back if closed, or full and `!block`.
    pub fn push_one(&self, e: Envelope, block: bool) -> Result<(), Envelope> {
        let cost = e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
        self.push(Item::One(e), cost, block).map_err(|i| match i {
            Item::One(e) => e,
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
    fn take(
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

    fn poll_one(&self, cx: &mut Context<'_>) -> Poll<Result<Envelope, RecvError>> {
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

/// A registered mailbox. Receive with `recv*`; send from it with `send*` (the receiver sees
/// this mailbox as the sender). Dropping it unregisters the name; later messages to it are
/// reported to their senders as undeliverable.
pub struct Mailbox {
    pub(crate) queue: Arc<MailboxQueue>,
    pub(crate) node: Arc<Shared>,
}

impl Mailbox {
    /// This mailbox's name.
    pub fn name(&self) -> &str {
        self.queue.name.as_str()
    }

    /// This mailbox's address, to hand to other nodes.
    pub fn address(&self) -> Address {
        Address {
            node: self.node.name.clone(),
            mailbox: self.queue.name.clone(),
        }
    }

    /// Wait for the next message. `Err(Closed)` once the node shut down and the queue is empty.
    pub fn recv(&self) -> Result<Envelope, RecvError> {
        let mut v = Vec::with_capacity(1);
        self.queue.take(&mut v, 1, Some(None))?;
        v.pop().ok_or(RecvError::Closed)
    }

    /// Wait at most `timeout` for the next message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Envelope, RecvError> {
        let mut v = Vec::with_capacity(1);
        self.queue
            .take(&mut v, 1, Some(Some(Instant::now() + timeout)))?;
        v.pop().ok_or(RecvError::Closed)
    }

    /// The next message if one is queued, else `Err(Empty)`.
    pub fn try_recv(&self) -> Result<Envelope, RecvError> {
        let mut v = Vec::with_capacity(1);
        self.queue.take(&mut v, 1, None)?;
        v.pop().ok_or(RecvError::Empty)
    }

    /// Wait for at least one message, then return everything queued, up to `max`, in one
    /// call (one lock, one wake-up).
    pub fn recv_batch(&self, max: usize) -> Result<Vec<Envelope>, RecvError> {
        let mut v = Vec::new();
        self.queue.take(&mut v, max.max(1), Some(None))?;
        Ok(v)
    }

    /// Like [`Mailbox::recv_batch`], appending to `out` so its buffer is reused across
    /// calls; waits at most `timeout` for the first message. Returns how many were added.
    pub fn recv_batch_into(
        &self,
        out: &mut Vec<Envelope>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        self.queue
            .take(out, max.max(1), Some(Some(Instant::now() + timeout)))
    }

    /// Receive from async code: a future that never blocks the thread polling it, so it is
    /// safe on a tokio (or any) runtime thread.
    pub fn recv_async(&self) -> RecvFuture<'_> {
        RecvFuture { mb: self }
    }

    /// Messages waiting in this mailbox.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send `payload` to `to`, from this mailbox. Blocks while the outbound queue is full.
    pub fn send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.node.send(&self.queue.name, to, payload.into(), true)
    }

    /// Like [`Mailbox::send`] but returns `Error::Full` instead of blocking.
    pub fn try_send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.node.send(&self.queue.name, to, payload.into(), false)
    }

    /// Send to mailbox `mailbox` on every member, this node included.
    pub fn send_all(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.node
            .send_all(&self.queue.name, mailbox, payload.into(), true)
    }

    /// Send a value serialized with postcard; decode it with [`Envelope::value`].
    pub fn send_value<T: serde::Serialize>(&self, to: &Address, value: &T) -> Result<(), Error> {
        let bytes = postcard::to_allocvec(value).map_err(|e| Error::Encode(e.to_string()))?;
        self.send(to, bytes)
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.node.unregister(&self.queue);
    }
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mailbox({}/{})", self.node.name, self.queue.name)
    }
}

/// The future returned by [`Mailbox::recv_async`].
pub struct RecvFuture<'a> {
    mb: &'a Mailbox,
}

impl Future for RecvFuture<'_> {
    type Output = Result<Envelope, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.mb.queue.poll_one(cx)
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
        let back = q.push_one(env(2), false).unwrap_err();
        assert_eq!(back.payload[0], 2);
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
        assert!(q.push_run(&Name::from_static("peer"), list.body().slice(range), n));
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
