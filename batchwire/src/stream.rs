//! [`EventStream`]: the node's events as an async `Stream`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::event::Event;
use crate::io::events::AsyncQueue;

/// The stream of `Node::event_stream`: every event from the moment it was made, in a
/// bounded queue (`events_capacity`). The node never waits for it: if it falls behind,
/// events are dropped and it receives one `Event::EventsDropped { count }` saying how many,
/// as soon as it has room again. It ends when the node has shut down and everything queued
/// was taken. Any number of streams (and `Node::events` receivers) may be open at once.
pub struct EventStream {
    q: Arc<AsyncQueue>,
}

impl EventStream {
    pub(crate) fn new(q: Arc<AsyncQueue>) -> EventStream {
        EventStream { q }
    }
}

impl Stream for EventStream {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.q.poll_next(cx)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.q.forget();
    }
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventStream")
    }
}
