//! [`Mailbox`]: a named mailbox's handle: receive (blocking, batched or async) and send
//! from it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;

use crate::address::Address;
use crate::class::Class;
use crate::error::{Error, RecvError};
use crate::io::envelope::{Envelope, Outbound};
use crate::io::mailbox::{Leader, MailboxQueue};
use crate::io::runtime::Runtime;
use crate::io::wakers::Ticket;
use crate::send::SendFuture;

/// A registered mailbox. Receive with `recv*` (blocking), `recv_async`,
/// `recv_batch_async` or as a [`Stream`] of envelopes; send from it with `send*` (the
/// receiver sees this mailbox as the sender). Requests among the envelopes are answered
/// with [`Envelope::reply`]. Dropping it unregisters the name; messages still queued in it,
/// and later ones to it, are reported to their senders as undeliverable.
///
/// Receiving fails only with [`RecvError`]: `Empty` (`try_recv`), `Timeout`
/// (`recv_timeout`) or `Closed` (the node shut down and everything queued was taken).
/// Sending fails as [`crate::node::Node::send`] does.
///
/// ```
/// # use std::time::Duration;
/// # use batchwire::{Node, NodeConfig, RecvError};
/// let node = Node::start(NodeConfig::new("solo", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
/// let inbox = node.mailbox("inbox").unwrap();
/// let me = node.mailbox("me").unwrap();
/// me.send(&inbox.address(), "one").unwrap(); // to a mailbox of the same node
/// let first = inbox.recv_timeout(Duration::from_secs(5)).unwrap();
/// assert_eq!(first.from, me.address());
/// assert!(matches!(inbox.try_recv(), Err(RecvError::Empty)));
/// assert!(matches!(
///     inbox.recv_timeout(Duration::from_millis(10)),
///     Err(RecvError::Timeout)
/// ));
/// ```
pub struct Mailbox {
    queue: Arc<MailboxQueue>,
    rt: Arc<Runtime>,
    /// What the queue's list of waiting tasks knows the mailbox's [`Stream`] by.
    ticket: Ticket,
}

impl Mailbox {
    pub(crate) fn new(queue: Arc<MailboxQueue>, rt: Arc<Runtime>) -> Mailbox {
        let out: Arc<dyn Outbound> = rt.clone();
        queue.set_replier(Arc::downgrade(&out));
        let leader: Arc<dyn Leader> = rt.clone();
        queue.set_leader(Arc::downgrade(&leader));
        Mailbox {
            queue,
            rt,
            ticket: Ticket::default(),
        }
    }

    /// This mailbox's name.
    pub fn name(&self) -> &str {
        self.queue.name.as_str()
    }

    /// This mailbox's address, to hand to other nodes.
    pub fn address(&self) -> Address {
        Address::from_names(self.rt.name.clone(), self.queue.name.clone())
    }

    /// Wait for the next message. `Err(Closed)` once the node shut down and the queue is
    /// empty.
    pub fn recv(&self) -> Result<Envelope, RecvError> {
        let mut one = None;
        self.queue.take(&mut one, 1, Some(None))?;
        one.ok_or(RecvError::Closed)
    }

    /// Wait at most `timeout` for the next message (`Duration::MAX`: no limit).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Envelope, RecvError> {
        let mut one = None;
        self.queue.take_within(&mut one, 1, timeout)?;
        one.ok_or(RecvError::Closed)
    }

    /// The next message if one is queued, else `Err(Empty)`.
    pub fn try_recv(&self) -> Result<Envelope, RecvError> {
        let mut one = None;
        self.queue.take(&mut one, 1, None)?;
        one.ok_or(RecvError::Empty)
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
        self.queue.take_within(out, max.max(1), timeout)
    }

    /// Receive from async code: a future that never blocks the thread polling it, so it is
    /// safe on a tokio (or any) runtime thread. `Err(Closed)` once the node shut down and
    /// the queue is empty. Cancellation-safe: a message is taken only by the poll that
    /// returns it.
    pub fn recv_async(&self) -> RecvFuture<'_> {
        RecvFuture {
            mb: self,
            ticket: Ticket::default(),
        }
    }

    /// [`Mailbox::recv_batch`] from async code: waits (without blocking the thread) for at
    /// least one message, then returns everything queued, up to `max`. Cancellation-safe
    /// like [`Mailbox::recv_async`].
    pub fn recv_batch_async(&self, max: usize) -> RecvBatchFuture<'_> {
        RecvBatchFuture {
            mb: self,
            max,
            ticket: Ticket::default(),
        }
    }

    /// Messages waiting in this mailbox.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send `payload` to `to`, from this mailbox. Blocks while the outbound queue is full
    /// or the destination mailbox's credit is used up (see [`crate::node::Node::send`]).
    pub fn send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send(&self.queue.name, to, payload.into(), Class::Ordinary, true)
    }

    /// Like [`Mailbox::send`], from async code: waits for room without blocking the thread
    /// (see [`SendFuture`] for what dropping it means).
    pub fn send_async(&self, to: &Address, payload: impl Into<Bytes>) -> SendFuture {
        let out: Arc<dyn Outbound> = self.rt.clone();
        SendFuture::new(
            out,
            self.queue.name.clone(),
            to.clone(),
            payload.into(),
            Class::Ordinary,
        )
    }

    /// Like [`Mailbox::send`] but returns `Error::Full` instead of blocking.
    pub fn try_send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send(&self.queue.name, to, payload.into(), Class::Ordinary, false)
    }

    /// Like [`Mailbox::send`], in lane `class` (see [`Class`]).
    pub fn send_with(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        class: Class,
    ) -> Result<(), Error> {
        self.rt
            .send(&self.queue.name, to, payload.into(), class, true)
    }

    /// Like [`Mailbox::try_send`], in lane `class`.
    pub fn try_send_with(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        class: Class,
    ) -> Result<(), Error> {
        self.rt
            .send(&self.queue.name, to, payload.into(), class, false)
    }

    /// Send to mailbox `mailbox` on every member, this node included.
    pub fn send_all(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send_all(&self.queue.name, mailbox, payload.into(), true)
    }

    /// Send a value serialized with postcard; decode it with [`Envelope::value`].
    pub fn send_value<T: serde::Serialize>(&self, to: &Address, value: &T) -> Result<(), Error> {
        self.send(to, crate::value::encode(value)?)
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.rt.release_mailbox(&self.queue);
    }
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mailbox({}/{})", self.rt.name, self.queue.name)
    }
}

/// The future returned by [`Mailbox::recv_async`].
pub struct RecvFuture<'a> {
    mb: &'a Mailbox,
    ticket: Ticket,
}

impl Future for RecvFuture<'_> {
    type Output = Result<Envelope, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut one = None;
        match this.mb.queue.poll_batch(cx, &mut one, 1, &mut this.ticket) {
            Poll::Ready(Ok(_)) => match one {
                Some(e) => Poll::Ready(Ok(e)),
                // Nothing whole was queued after all: look again.
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            },
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The future returned by [`Mailbox::recv_batch_async`].
pub struct RecvBatchFuture<'a> {
    mb: &'a Mailbox,
    max: usize,
    ticket: Ticket,
}

impl Future for RecvBatchFuture<'_> {
    type Output = Result<Vec<Envelope>, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut v = Vec::new();
        match this
            .mb
            .queue
            .poll_batch(cx, &mut v, this.max, &mut this.ticket)
        {
            Poll::Ready(Ok(_)) if v.is_empty() => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            r => r.map_ok(|_| v),
        }
    }
}

/// A mailbox is a stream of its envelopes (requests among them), ending when the node has
/// shut down and everything queued was taken. With `futures::StreamExt`:
/// `while let Some(e) = mailbox.next().await { ... }`.
impl Stream for Mailbox {
    type Item = Envelope;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Envelope>> {
        let this = self.get_mut();
        let mut one = None;
        match this.queue.poll_batch(cx, &mut one, 1, &mut this.ticket) {
            Poll::Ready(Ok(_)) => match one {
                Some(e) => Poll::Ready(Some(e)),
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            },
            Poll::Ready(Err(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;
    use crate::io::wakers::PRUNE_FROM;
    use crate::{Node, NodeConfig};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A node alone whose mailboxes hold 64 bytes (a few messages fill one).
    fn small_node() -> Node {
        Node::start(
            NodeConfig::new("solo", "127.0.0.1:0".parse().unwrap(), "s")
                .mailbox_bytes(64)
                .without_membership(),
        )
        .unwrap()
    }

    /// Poll `f` once with a waker of its own (a task of its own), then drop it.
    fn poll_once_and_drop<F: Future>(f: F) -> bool {
        let w = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut Context::from_waker(&w)).is_pending()
    }

    /// Receive and send futures given up while they wait (tasks aborted, each with its
    /// own waker) leave their wakers behind only until the list is next pruned, through
    /// the real futures and the node's send path; and a `select!` loop's receive (a new
    /// future each turn, same task) is woken once by a message.
    #[test]
    fn futures_given_up_while_waiting_leave_no_growing_list() {
        let node = small_node();
        let idle = node.mailbox("idle").unwrap();
        let full = node.mailbox("full").unwrap();
        let to_full = Address::new("solo", "full").unwrap();
        while node.try_send(&to_full, vec![0u8; 16]).is_ok() {}
        for _ in 0..10 * PRUNE_FROM {
            assert!(poll_once_and_drop(idle.recv_async()));
            assert!(poll_once_and_drop(idle.recv_batch_async(4)));
            assert!(poll_once_and_drop(node.send_async(&to_full, vec![1u8; 16])));
            assert!(poll_once_and_drop(idle.send_async(&to_full, vec![1u8; 16])));
            let (recv, _) = idle.queue.wakers_kept();
            let (_, room) = full.queue.wakers_kept();
            assert!(recv <= PRUNE_FROM && room <= PRUNE_FROM, "{recv} {room}");
        }
        // Two tasks whose futures wait on, polled in turn (each wake-up of theirs from
        // something else, a timer in their `select!`).
        let ws: Vec<Waker> = (0..2)
            .map(|_| Waker::from(Arc::new(Count(AtomicUsize::new(0)))))
            .collect();
        let mut recvs = [Box::pin(idle.recv_async()), Box::pin(idle.recv_async())];
        let mut sends = [
            Box::pin(node.send_async(&to_full, "a")),
            Box::pin(node.send_async(&to_full, "b")),
        ];
        for i in 0..10 * PRUNE_FROM {
            let cx = &mut Context::from_waker(&ws[i % 2]);
            assert!(recvs[i % 2].as_mut().poll(cx).is_pending());
            assert!(sends[i % 2].as_mut().poll(cx).is_pending());
            let (recv, _) = idle.queue.wakers_kept();
            let (_, room) = full.queue.wakers_kept();
            assert!(recv <= PRUNE_FROM && room <= PRUNE_FROM, "{recv} {room}");
        }
        drop((recvs, sends));
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(task.clone());
        for _ in 0..100 {
            let mut f = std::pin::pin!(idle.recv_async());
            assert!(f.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
        }
        node.try_send(&Address::new("solo", "idle").unwrap(), "x")
            .unwrap();
        assert_eq!(task.0.load(Ordering::Relaxed), 1);
    }

    /// An async request that waited for room past its deadline ends with `Timeout` and is
    /// not queued when room appears after that.
    #[test]
    fn a_request_that_timed_out_waiting_for_room_is_not_sent() {
        let node = small_node();
        let svc = node.mailbox("svc").unwrap();
        let to = Address::new("solo", "svc").unwrap();
        let mut filled = 0;
        while node.try_send(&to, vec![0u8; 16]).is_ok() {
            filled += 1;
        }
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(task.clone());
        let mut req = std::pin::pin!(node.request_async(&to, "q", Duration::from_millis(50)));
        assert!(req.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
        // The node's timer wakes it at the deadline.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while task.0.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(task.0.load(Ordering::Relaxed) > 0, "woken at its deadline");
        for _ in 0..filled {
            svc.recv_timeout(Duration::from_secs(1)).unwrap();
        }
        let r = req.as_mut().poll(&mut Context::from_waker(&w));
        assert!(matches!(r, Poll::Ready(Err(Error::Timeout))), "{r:?}");
        assert!(
            svc.recv_timeout(Duration::from_millis(100)).is_err(),
            "the request was not queued"
        );
    }
}
