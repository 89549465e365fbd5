//! Errors of the node API. (The core has its own: `FrameError`, `HandshakeError`,
//! `SeqError`; connection failures are reported as events, not returned.)

use std::net::SocketAddr;

use bytes::Bytes;

/// What `send`, `mailbox` and `Node::start` can fail with. Every variant's message names
/// what failed (the node, mailbox, setting, file or address); variants that refuse a
/// payload hand it back. The enum is `#[non_exhaustive]`: match the cases you act on.
///
/// ```
/// # use batchwire::{Address, Error, Node, NodeConfig};
/// let node = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
/// match node.send(&Address::new("nobody", "inbox").unwrap(), "hi") {
///     Err(Error::UnknownNode(name)) => assert_eq!(name, "nobody"),
///     Err(Error::Full { payload, .. }) => drop(payload), // try again later, say
///     other => panic!("{other:?}"),
/// }
/// let e = Address::new("", "inbox").unwrap_err();
/// assert!(e.to_string().starts_with("invalid name"), "{e}");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No such node in this node's peer list, and none has connected under that name.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// The failure detector declared the node down; sends fail fast until it is back.
    #[error("node {0:?} is down")]
    PeerDown(String),
    /// The payload is above the configured `max_payload`.
    #[error("payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// The payload's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The outbound queue (or local mailbox) is full; the payload is handed back.
    #[error("queue full (sending to {to})")]
    Full {
        /// Where it was going.
        to: String,
        /// The payload, handed back.
        payload: Bytes,
    },
    /// The node is shutting down; the payload is handed back.
    #[error("node is shut down")]
    ShutDown {
        /// The payload, handed back (if there was one).
        payload: Option<Bytes>,
    },
    /// A node or mailbox name is empty, too long (over 255 bytes) or otherwise invalid.
    #[error("invalid name {0:?}: {1}")]
    InvalidName(String, &'static str),
    /// A mailbox with this name is already registered on this node.
    #[error("mailbox {0:?} is already registered")]
    MailboxExists(String),
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// TLS material could not be loaded (the message names the file).
    #[error("TLS: {0}")]
    Tls(String),
    /// `send_value` could not serialize.
    #[error("cannot encode value: {0}")]
    Encode(String),
    /// `Envelope::value` could not deserialize.
    #[error("cannot decode value: {0}")]
    Decode(String),
    /// A request got no reply within its timeout (a reply that comes later is counted as
    /// late and dropped: `NodeStats::requests`).
    #[error("request timed out")]
    Timeout,
    /// The table of requests in flight is full (`NodeConfig::max_pending_requests`).
    #[error("too many requests in flight (at most {max})")]
    TooManyRequests {
        /// The bound.
        max: usize,
    },
    /// A request's destination mailbox does not exist on its node (the node said so).
    #[error("no mailbox {to}")]
    Undeliverable {
        /// The address asked, `mailbox@node`.
        to: String,
    },
    /// `Envelope::reply` on a message that is not a request.
    #[error("not a request: only envelopes sent with `request` can be replied to")]
    NotARequest,
    /// An operating-system error (e.g. no thread could be started).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a receive returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// `try_recv`: nothing queued.
    #[error("mailbox is empty")]
    Empty,
    /// `recv_timeout`: nothing arrived in time.
    #[error("timed out waiting for a message")]
    Timeout,
    /// The node shut down and everything queued was received.
    #[error("mailbox closed (node shut down)")]
    Closed,
}
