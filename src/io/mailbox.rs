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

use crate::core::codec::Name;
use crate::error::{Error, RecvError};
use crate::io::node::{Address, Shared};

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The sending node and mailbox (the mailbox is "" for sends made through `Node`).
    pub from: Address,
    /// The payload, a slice of the receive buffer (no copy was made).
    pub payload: Bytes,
}

impl Envelope {
    /// Bytes this message counts against its mailbox's bound.
    fn cost(&self) -> usize {
        self.payload.len() + 32
    }

    /// Decode a payload sent with `send_value` (postcard).
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        postcard::from_bytes(&self.payload).map_err(|e| Error::Decode(e.to_string()))
    }
}

struct Inner {
    q: VecDeque<Envelope>,
    bytes: usize,
    closed: bool,
    wakers: Vec<Waker>,
    pushers_waiting: usize,
}

/// The state behind a mailbox, shared between the node (which pushes) and the handle.
pub(crate) struct MailboxQueue {
    pub name: Name,
    inner: Mutex<Inner>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

impl MailboxQueue {
    pub fn new(name: Name, capacity: usize) -> Self {
        MailboxQueue {
            name,
            inner: Mutex::new(Inner {
                q: VecDeque::new(),
                bytes: 0,
                closed: false,
                wakers: Vec::new(),
                pushers_waiting: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Push a batch, waiting for room as needed (if `block`). On return `batch` holds what
    /// was not pushed: empty unless the mailbox closed, or it was full and `!block`.
    pub fn push_batch(&self, batch: &mut Vec<Envelope>, block: bool) {
        let mut g = self.lock();
        while !batch.is_empty() && !g.closed {
            // Admit while below capacity (so a message larger than the capacity still fits).
            let (mut n, mut bytes) = (0, g.bytes);
            while n < batch.len() && bytes < self.capacity {
                bytes += batch[n].cost();
                n += 1;
            }
            if n > 0 {
                let was_empty = g.q.is_empty();
                g.bytes = bytes;
                g.q.extend(batch.drain(..n));
                if was_empty {
                    self.not_empty.notify_all();
                    for w in g.wakers.drain(..) {
                        w.wake();
                    }
                }
            }
            if !batch.is_empty() {
                if !block {
                    break;
                }
                g.pushers_waiting += 1;
                g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
                g.pushers_waiting -= 1;
            }
        }
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

    /// Take up to `max` messages into `out`, waiting until `deadline` (None: forever) for
    /// the first one. Returns how many were taken.
    fn take(
        &self,
        out: &mut Vec<Envelope>,
        max: usize,
        deadline: Option<Option<Instant>>,
    ) -> Result<usize, RecvError> {
        let mut g = self.lock();
        loop {
            if !g.q.is_empty() {
                let n = max.min(g.q.len());
                let mut freed = 0;
                for e in g.q.drain(..n) {
                    freed += e.cost();
                    out.push(e);
                }
                g.bytes -= freed;
                if g.pushers_waiting > 0 {
                    self.not_full.notify_all();
                }
                return Ok(n);
            }
            if g.closed {
                return Err(RecvError::Closed);
            }
            g = match deadline {
                None => return Err(RecvError::Empty),
                Some(None) => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(Some(t)) => {
                    let now = Instant::now();
                    if now >= t {
                        return Err(RecvError::Timeout);
                    }
                    self.not_empty
                        .wait_timeout(g, t - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    fn poll_one(&self, cx: &mut Context<'_>) -> Poll<Result<Envelope, RecvError>> {
        let mut g = self.lock();
        if let Some(e) = g.q.pop_front() {
            g.bytes -= e.cost();
            if g.pushers_waiting > 0 {
                self.not_full.notify_all();
            }
            return Poll::Ready(Ok(e));
        }
        if g.closed {
            return Poll::Ready(Err(RecvError::Closed));
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    pub fn len(&self) -> usize {
        self.lock().q.len()
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

    fn env(i: u8) -> Envelope {
        Envelope {
            from: Address::new("n", "m").unwrap(),
            payload: Bytes::from(vec![i; 8]),
        }
    }

    #[test]
    fn push_batch_respects_capacity_without_blocking() {
        let q = MailboxQueue::new(Name::from_static("m"), 80);
        let mut batch: Vec<_> = (0..5).map(env).collect();
        q.push_batch(&mut batch, false);
        // Each costs 40: admitted at 0 and 40, refused at 80.
        assert_eq!(q.len(), 2);
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0].payload[0], 2);
    }

    #[test]
    fn take_waits_until_a_push_and_returns_the_batch() {
        let q = Arc::new(MailboxQueue::new(Name::from_static("m"), 1 << 20));
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
        let mut batch: Vec<_> = (0..3).map(env).collect();
        q.push_batch(&mut batch, true);
        let (n, got) = t.join().unwrap();
        assert!(n.unwrap() >= 1 && got >= 1);
    }

    #[test]
    fn closed_mailbox_drains_then_reports_closed() {
        let q = MailboxQueue::new(Name::from_static("m"), 1 << 20);
        q.push_batch(&mut vec![env(1)], true);
        q.close();
        let mut out = Vec::new();
        assert_eq!(q.take(&mut out, 10, Some(None)), Ok(1));
        assert_eq!(q.take(&mut out, 10, Some(None)), Err(RecvError::Closed));
        let mut rest = vec![env(2)];
        q.push_batch(&mut rest, true);
        assert_eq!(rest.len(), 1, "a closed mailbox takes nothing");
    }

    #[test]
    fn timeout_is_reported() {
        let q = MailboxQueue::new(Name::from_static("m"), 1 << 20);
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
