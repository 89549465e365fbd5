//! [`RequestFuture`]: a request from async code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use batchwire_core::codec::Name;
use bytes::Bytes;

use crate::address::Address;
use crate::class::Class;
use crate::error::Error;
use crate::io::calls::Waiter;
use crate::io::envelope::Envelope;
use crate::io::runtime::Runtime;
use crate::io::wakers::Ticket;
use crate::send::poll_send;

/// The future of `Node::request_async`: resolves to the reply, or to `Timeout`, `PeerDown`
/// (at once, when the node is declared down), `Undeliverable` (no such mailbox there),
/// `TooManyRequests` or `ShutDown`.
///
/// Dropping it cancels the request: its slot leaves the pending table at once, and a reply
/// that comes later is counted as late (`NodeStats::requests`) and dropped, never handed to
/// another caller. Whether the request itself was sent depends on how far it got (as with
/// any message, once queued it is delivered).
#[must_use = "futures do nothing unless polled or awaited"]
pub struct RequestFuture {
    rt: Arc<Runtime>,
    state: State,
    /// What the lists of tasks waiting for room know it by (see `send::poll_send`).
    ticket: Ticket,
}

enum State {
    Start {
        to: Address,
        payload: Bytes,
        deadline: Instant,
    },
    /// Waiting for room to queue the request.
    Sending {
        id: u64,
        from: Name,
        to: Address,
        payload: Bytes,
    },
    /// Queued; waiting for the reply.
    Waiting {
        id: u64,
    },
    Done,
}

impl RequestFuture {
    pub(crate) fn new(rt: Arc<Runtime>, to: Address, payload: Bytes, deadline: Instant) -> Self {
        RequestFuture {
            rt,
            state: State::Start {
                to,
                payload,
                deadline,
            },
            ticket: Ticket::default(),
        }
    }
}

impl Future for RequestFuture {
    type Output = Result<Envelope, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let rt = &this.rt;
        loop {
            match std::mem::replace(&mut this.state, State::Done) {
                State::Start {
                    to,
                    payload,
                    deadline,
                } => {
                    if let Err(e) = rt.ensure_call_timer() {
                        return Poll::Ready(Err(e));
                    }
                    let waiter = Waiter::Task(Some(cx.waker().clone()));
                    match rt.begin_request(&to, deadline, waiter) {
                        Ok((id, from)) => {
                            this.state = State::Sending {
                                id,
                                from,
                                to,
                                payload,
                            }
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                State::Sending {
                    id,
                    from,
                    to,
                    payload,
                } => {
                    // Its deadline (or the peer's failure) may have come while it waited
                    // for room: then it ends so, and is not queued after all.
                    if let Poll::Ready(r) = rt.calls().poll(id, cx) {
                        return Poll::Ready(r);
                    }
                    match poll_send(
                        &**rt,
                        &from,
                        &to,
                        &payload,
                        Class::Ordinary,
                        cx,
                        &mut this.ticket,
                    ) {
                        Poll::Ready(Ok(())) => this.state = State::Waiting { id },
                        Poll::Ready(Err(e)) => {
                            rt.calls().forget(id);
                            return Poll::Ready(Err(e));
                        }
                        Poll::Pending => {
                            this.state = State::Sending {
                                id,
                                from,
                                to,
                                payload,
                            };
                            return Poll::Pending;
                        }
                    }
                }
                State::Waiting { id } => {
                    return match rt.calls().poll(id, cx) {
                        Poll::Ready(r) => Poll::Ready(r),
                        Poll::Pending => {
                            this.state = State::Waiting { id };
                            Poll::Pending
                        }
                    };
                }
                State::Done => return Poll::Ready(Err(Error::ShutDown { payload: None })),
            }
        }
    }
}

impl Drop for RequestFuture {
    fn drop(&mut self) {
        if let State::Sending { id, .. } | State::Waiting { id } = self.state {
            self.rt.calls().cancel(id);
        }
    }
}

impl std::fmt::Debug for RequestFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match &self.state {
            State::Start { .. } => "not started",
            State::Sending { .. } => "waiting for room",
            State::Waiting { .. } => "waiting for the reply",
            State::Done => "done",
        };
        write!(f, "RequestFuture({s})")
    }
}
