//! [`SendFuture`]: a send from async code that waits for room without blocking the thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use batchwire_core::codec::Name;
use bytes::Bytes;

use crate::address::Address;
use crate::class::Class;
use crate::error::Error;
use crate::io::envelope::{Envelope, Outbound};
use crate::io::wakers::Ticket;

/// Try once without blocking; if there is no room, leave the waker where room will appear
/// and try once more (room may have come between the two), else wait.
pub(crate) fn poll_send(
    out: &dyn Outbound,
    from: &Name,
    to: &Address,
    payload: &Bytes,
    class: Class,
    cx: &mut Context<'_>,
    ticket: &mut Ticket,
) -> Poll<Result<(), Error>> {
    match out.send(from, to, payload.clone(), class, false) {
        Err(Error::Full { .. }) => {}
        r => return Poll::Ready(r),
    }
    out.register(to, cx.waker(), ticket);
    match out.send(from, to, payload.clone(), class, false) {
        Err(Error::Full { .. }) => Poll::Pending,
        r => Poll::Ready(r),
    }
}

/// The future of `Node::send_async`, `Mailbox::send_async` and `Envelope::reply_async`.
///
/// **Cancellation-safe**: the message is accepted (queued toward its destination, from then
/// on delivered exactly once in order, or reported failed like any send) at the moment the
/// future completes with `Ok(())`, and at no other moment. A future dropped before it
/// completed never queued its message, so nothing is lost or sent twice: the caller knows
/// from whether it saw `Ok` (and may send the same payload again).
///
/// While the queue toward the node (or the destination mailbox's credit) is full, it waits
/// without holding a thread: it is woken when room appears, the peer goes down, or the
/// node shuts down (each ends it with the matching error).
#[must_use = "futures do nothing unless polled or awaited"]
pub struct SendFuture {
    state: Result<Pending, Option<Error>>,
}

struct Pending {
    out: Arc<dyn Outbound>,
    from: Name,
    to: Address,
    payload: Bytes,
    class: Class,
    /// What the lists this future waits on know it by (they forget it once it is dropped).
    ticket: Ticket,
}

impl SendFuture {
    pub(crate) fn new(
        out: Arc<dyn Outbound>,
        from: Name,
        to: Address,
        payload: Bytes,
        class: Class,
    ) -> SendFuture {
        SendFuture {
            state: Ok(Pending {
                out,
                from,
                to,
                payload,
                class,
                ticket: Ticket::default(),
            }),
        }
    }

    /// A future that fails at once with `e`.
    pub(crate) fn failed(e: Error) -> SendFuture {
        SendFuture {
            state: Err(Some(e)),
        }
    }
}

impl Future for SendFuture {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            Ok(p) => poll_send(
                &*p.out,
                &p.from,
                &p.to,
                &p.payload,
                p.class,
                cx,
                &mut p.ticket,
            ),
            Err(e) => Poll::Ready(Err(e.take().unwrap_or(Error::ShutDown { payload: None }))),
        }
    }
}

impl std::fmt::Debug for SendFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            Ok(p) => write!(f, "SendFuture(to {}, {} bytes)", p.to, p.payload.len()),
            Err(_) => f.write_str("SendFuture(failed)"),
        }
    }
}

// Here rather than with the rest of `Envelope` (`io/envelope.rs`): a reply future is a
// send future, and the envelope sits below the sending side.
impl Envelope {
    /// Like [`Envelope::reply`], from async code: waits for room without blocking the
    /// thread (see `Node::send_async` for what dropping the future means).
    pub fn reply_async(&self, payload: impl Into<Bytes>) -> SendFuture {
        match self.reply_route() {
            Ok((out, from, to)) => SendFuture::new(out, from, to, payload.into(), Class::Ordinary),
            Err(e) => SendFuture::failed(e),
        }
    }
}
