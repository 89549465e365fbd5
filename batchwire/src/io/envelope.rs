//! A received message ([`Envelope`]), what makes one a request ([`CallRef`]), and the way
//! a request's reply goes back ([`Outbound`], the runtime's sending side).

use std::sync::{Arc, Weak};
use std::task::Waker;

use batchwire_core::call;
use batchwire_core::codec::Name;
use bytes::Bytes;

use crate::address::Address;
use crate::class::Class;
use crate::error::Error;
use crate::io::wakers::Ticket;

/// How a handle sends (the runtime): blocking or not, and where a task waits for room.
/// Envelopes that are requests keep a weak one to send their reply.
pub(crate) trait Outbound: Send + Sync {
    /// Send as `Node::send` does (`block`) or `try_send` does.
    fn send(
        &self,
        from: &Name,
        to: &Address,
        payload: Bytes,
        class: Class,
        block: bool,
    ) -> Result<(), Error>;
    /// Wake `w`, the waker of the future holding `ticket`, when room may have appeared for
    /// a send to `to`.
    fn register(&self, to: &Address, w: &Waker, ticket: &mut Ticket);
}

/// What makes a received envelope a request: its call id and the way back.
#[derive(Clone)]
pub(crate) struct CallRef {
    pub id: u64,
    pub replier: Option<Weak<dyn Outbound>>,
}

impl CallRef {
    /// The reply's sender field and destination, for the caller `node`.
    pub fn reply_route(&self, node: &Name) -> (Name, Address) {
        (
            call::reply_sender(self.id),
            Address::from_names(node.clone(), Name::from_static(call::REPLY_INBOX)),
        )
    }
}

impl PartialEq for CallRef {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id
    }
}

impl Eq for CallRef {}

impl std::fmt::Debug for CallRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call {:016x}", self.id)
    }
}

/// A received message, or a request (answer it with [`Envelope::reply`]).
///
/// `reply` fails with [`Error::NotARequest`] on a plain message, and otherwise as
/// `Node::send` does; a reply to a caller that stopped waiting is counted as late by the
/// caller's node and dropped there (not an error here). [`Envelope::value`] fails with
/// [`Error::Decode`] when the payload is not the type asked for.
///
/// ```
/// # use std::time::Duration;
/// # use batchwire::{Error, Node, NodeConfig};
/// let node = Node::start(NodeConfig::new("solo", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
/// let inbox = node.mailbox("inbox").unwrap();
/// node.send_value(&inbox.address(), &(7u8, "seven".to_string())).unwrap();
/// let e = inbox.recv_timeout(Duration::from_secs(5)).unwrap();
/// let (n, word): (u8, String) = e.value().unwrap();
/// assert_eq!((n, word.as_str()), (7, "seven"));
/// assert!(!e.is_request());
/// assert!(matches!(e.reply("no one asked"), Err(Error::NotARequest)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The sending node and mailbox (the mailbox is "" for sends made through `Node`).
    pub from: Address,
    /// The payload, a slice of the receive buffer (no copy was made).
    pub payload: Bytes,
    /// Set if this is a request: its id and the way back.
    pub(crate) call: Option<Box<CallRef>>,
}

impl Envelope {
    /// A received message from `from`. A sender field that carries a call tag (see
    /// `batchwire_core::call`) makes it a request: the tag is taken off the sender's name.
    #[inline(always)]
    pub(crate) fn new(from: Address, payload: Bytes) -> Envelope {
        Self::with_replier(from, payload, &None)
    }

    /// [`Envelope::new`], a request being given `replier` as its way back. A plain message
    /// (the common case) is one struct literal and the request path is out of line: the
    /// receiving thread's `drain` builds one per message. (It does not stop the compiler
    /// from building the Address in pieces and moving it in vectors, which still costs a
    /// wait per message there.)
    #[inline(always)]
    pub(crate) fn with_replier(
        from: Address,
        payload: Bytes,
        replier: &Option<Weak<dyn Outbound>>,
    ) -> Envelope {
        // One byte compared per message; only a reserved name is parsed.
        if call::is_reserved(from.mailbox.as_bytes()) {
            return Self::request(from, payload, replier);
        }
        Envelope {
            from,
            payload,
            call: None,
        }
    }

    /// A message whose sender field carries a call tag: a request (the tag is taken off).
    #[cold]
    #[inline(never)]
    fn request(
        mut from: Address,
        payload: Bytes,
        replier: &Option<Weak<dyn Outbound>>,
    ) -> Envelope {
        let mut call = None;
        if let Some((id, _)) = call::parse(from.mailbox.as_bytes()) {
            from.mailbox = from.mailbox.slice_from(call::CALL_TAG_LEN);
            call = Some(Box::new(CallRef {
                id,
                replier: replier.clone(),
            }));
        }
        Envelope {
            from,
            payload,
            call,
        }
    }

    /// Decode a payload sent with `send_value` (postcard).
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        postcard::from_bytes(&self.payload).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Whether this is a request (sent with `Node::request`), to answer with
    /// [`Envelope::reply`].
    pub fn is_request(&self) -> bool {
        self.call.is_some()
    }

    /// Answer this request with `payload`. Blocks like `Node::send` while the queue toward
    /// the caller is full. The reply reaches the caller only if it is still waiting (not
    /// timed out, not cancelled); otherwise the caller's node counts it as late and drops
    /// it. Fails with [`Error::NotARequest`] on a plain message.
    pub fn reply(&self, payload: impl Into<Bytes>) -> Result<(), Error> {
        let (out, from, to) = self.reply_route()?;
        out.send(&from, &to, payload.into(), Class::Ordinary, true)
    }

    /// Like [`Envelope::reply`] but returns [`Error::Full`] (the payload handed back)
    /// instead of blocking while the queue or the credit toward the caller is used up.
    pub fn try_reply(&self, payload: impl Into<Bytes>) -> Result<(), Error> {
        let (out, from, to) = self.reply_route()?;
        out.send(&from, &to, payload.into(), Class::Ordinary, false)
    }

    /// Answer this request with a value serialized with postcard (see
    /// `Node::request_value`).
    pub fn reply_value<T: serde::Serialize>(&self, value: &T) -> Result<(), Error> {
        self.reply(crate::value::encode(value)?)
    }

    #[allow(clippy::type_complexity)]
    pub(crate) fn reply_route(&self) -> Result<(Arc<dyn Outbound>, Name, Address), Error> {
        let c = self.call.as_ref().ok_or(Error::NotARequest)?;
        let out = c
            .replier
            .as_ref()
            .and_then(|w| w.upgrade())
            .ok_or(Error::ShutDown { payload: None })?;
        let (from, to) = c.reply_route(&self.from.node);
        Ok((out, from, to))
    }
}

/// Where a take puts what it takes: a `Vec`, or one slot (`Option`, with `max` 1), so a
/// single receive allocates nothing.
pub(crate) trait Sink {
    fn put(&mut self, e: Envelope);
}

impl Sink for Vec<Envelope> {
    #[inline]
    fn put(&mut self, e: Envelope) {
        self.push(e);
    }
}

impl Sink for Option<Envelope> {
    #[inline]
    fn put(&mut self, e: Envelope) {
        *self = Some(e);
    }
}
