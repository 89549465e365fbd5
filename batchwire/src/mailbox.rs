//! [`Mailbox`]: a named mailbox's handle: receive (blocking, batched or async) and send
//! from it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::address::Address;
use crate::class::Class;
use crate::error::{Error, RecvError};
use crate::io::mailbox::{Envelope, MailboxQueue};
use crate::io::runtime::Runtime;

/// A registered mailbox. Receive with `recv*`; send from it with `send*` (the receiver sees
/// this mailbox as the sender). Dropping it unregisters the name; later messages to it are
/// reported to their senders as undeliverable.
pub struct Mailbox {
    queue: Arc<MailboxQueue>,
    rt: Arc<Runtime>,
}

impl Mailbox {
    pub(crate) fn new(queue: Arc<MailboxQueue>, rt: Arc<Runtime>) -> Mailbox {
        Mailbox { queue, rt }
    }

    /// This mailbox's name.
    pub fn name(&self) -> &str {
        self.queue.name.as_str()
    }

    /// This mailbox's address, to hand to other nodes.
    pub fn address(&self) -> Address {
        Address {
            node: self.rt.name.clone(),
            mailbox: self.queue.name.clone(),
        }
    }

    /// Wait for the next message. `Err(Closed)` once the node shut down and the queue is
    /// empty.
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

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send `payload` to `to`, from this mailbox. Blocks while the outbound queue is full
    /// or the destination mailbox's credit is used up (see [`crate::Node::send`]).
    pub fn send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send(&self.queue.name, to, payload.into(), Class::Ordinary, true)
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
        let bytes = postcard::to_allocvec(value).map_err(|e| Error::Encode(e.to_string()))?;
        self.send(to, bytes)
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
}

impl Future for RecvFuture<'_> {
    type Output = Result<Envelope, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.mb.queue.poll_one(cx)
    }
}
