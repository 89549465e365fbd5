//! What a node tells its application: [`Event`]s, with typed reasons to match on.

use std::net::SocketAddr;

use bytes::Bytes;

use crate::address::Address;

pub use batchwire_core::membership::MemberState;
pub use batchwire_core::session::{DownReason, FailReason};

/// Something that happened on a node; subscribe with `Node::events` (a channel) or
/// `Node::event_stream` (async). Each subscriber has a bounded queue: one that falls behind
/// gets [`Event::EventsDropped`], the node never waits for it.
///
/// ```
/// # use std::time::Duration;
/// # use batchwire::{Event, Node, NodeConfig};
/// let a = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
/// let events = a.events();
/// let b = Node::start(NodeConfig::new("b", "127.0.0.1:0".parse().unwrap(), "s").join(a.local_addr())).unwrap();
/// // Wait (bounded) for b to appear; match the events that matter, ignore the rest.
/// let joined = events.iter().take(50).find_map(|e| match e {
///     Event::MemberJoined { member } => Some(member.name),
///     Event::SendFailed { peer, messages, .. } => panic!("{} to {peer} failed", messages.len()),
///     _ => None,
/// });
/// assert_eq!(joined.as_deref(), Some("b"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// `peer` is up: connected for the first time, or again after being declared down.
    PeerUp {
        /// The peer.
        peer: String,
        /// Its incarnation (random per process start).
        incarnation: u64,
    },
    /// The failure detector declared `peer` down. Sends to it fail with `Error::PeerDown`
    /// until it is back; what was pending for it is reported in a `SendFailed`.
    PeerDown {
        /// The peer.
        peer: String,
        /// Why.
        reason: DownReason,
    },
    /// A connection to `peer` was established and authenticated (also after a break).
    Connected {
        /// The peer.
        peer: String,
        /// Its incarnation.
        incarnation: u64,
        /// The other end's address.
        addr: SocketAddr,
    },
    /// A connection to `peer` closed. Unacknowledged messages are resent on the next one.
    Disconnected {
        /// The peer.
        peer: String,
        /// Why.
        reason: CloseReason,
    },
    /// A connection failed before it carried messages (wrong secret, wrong version, wrong
    /// node, TLS...). At most 64 a second are emitted, so that strangers failing
    /// handshakes as fast as they connect cannot crowd other events out of a subscriber's
    /// queue; every failure is counted in `NodeStats::handshakes`.
    HandshakeFailed {
        /// The other end's address.
        addr: SocketAddr,
        /// The name the other side claimed, when it got that far (or the node we dialled).
        peer: Option<String>,
        /// Why, to match on.
        kind: HandshakeFailure,
        /// Why, in words.
        reason: String,
    },
    /// `count` messages sent from our mailbox `from` to `to` found no such mailbox. (A
    /// peer that reports more mailbox names than it tracks sums the rest under the
    /// mailbox name "".)
    Undeliverable {
        /// The mailbox that does not exist.
        to: Address,
        /// Our sending mailbox.
        from: String,
        /// How many messages.
        count: u64,
    },
    /// `count` messages to `peer` will never be delivered. They are handed back in
    /// `messages`. None of them was delivered twice; some may have been delivered once
    /// before the peer stopped acknowledging.
    SendFailed {
        /// The peer.
        peer: String,
        /// How many messages.
        count: u64,
        /// Why.
        reason: FailReason,
        /// The messages, with their payloads.
        messages: Vec<FailedMessage>,
    },
    /// `count` events were dropped because this subscriber did not keep up (its queue holds
    /// `events_capacity` events); the node never waits for a subscriber.
    EventsDropped {
        /// How many.
        count: u64,
    },
    /// A member appeared in this node's view (it proved the cluster secret to some member),
    /// or came back as a new incarnation (restarted under the same name).
    MemberJoined {
        /// The member.
        member: Member,
    },
    /// Some member could not reach `member`; it has the suspicion timeout to refute.
    /// Sends to it go on meanwhile.
    MemberSuspected {
        /// The member.
        member: Member,
    },
    /// A suspected member refuted the suspicion: it is alive.
    MemberAlive {
        /// The member.
        member: Member,
    },
    /// The failure detector declared `member` down (it crashed, or is cut off). Its
    /// session is declared down too (`PeerDown`, what was pending reported in
    /// `SendFailed`). It is still dialled with back-off, so a healed partition or a restart
    /// brings it back (`MemberJoined`).
    MemberDown {
        /// The member.
        member: Member,
    },
    /// `member` left gracefully (`Node::shutdown`). Its session is declared down and it is
    /// not dialled again.
    MemberLeft {
        /// The member.
        member: Member,
    },
}

/// An event with the moment the node emitted it (see `Node::timed_events`). For
/// `Event::EventsDropped` that is when the summary was sent, not when the events were lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedEvent {
    /// When the node emitted it.
    pub at: std::time::Instant,
    /// The event.
    pub event: Event,
}

/// A member in a node's view (see `Node::members`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node name.
    pub name: String,
    /// The address it advertises (where members dial it).
    pub addr: SocketAddr,
    /// Its incarnation: the one its connections present (it changes on every restart).
    pub incarnation: u64,
    /// Where it stands.
    pub state: MemberState,
}

/// A message handed back by `Event::SendFailed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMessage {
    /// Where it was going.
    pub to: Address,
    /// The sending mailbox on this node ("" for `Node::send`).
    pub from: String,
    /// The payload.
    pub payload: Bytes,
}

/// Why a connection closed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer said goodbye (it shut down).
    Goodbye,
    /// The peer closed the connection.
    Closed,
    /// A newer connection to the same peer took over.
    Replaced,
    /// The failure detector declared the peer down.
    Down,
    /// This node is shutting down.
    ShutDown,
    /// The peer broke the protocol (a forged acknowledgement, a gap, a malformed frame...).
    Protocol(String),
    /// The peer refused this node after the handshake (its reason).
    Refused(String),
    /// A socket or TLS error.
    Io(String),
    /// No message went either way for `NodeConfig::idle_close` and nothing was pending:
    /// closed by either end (connections on demand). The session stays: the next send
    /// dials again and goes on where it left off.
    Idle,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::Goodbye => write!(f, "the peer said goodbye"),
            CloseReason::Closed => write!(f, "the peer closed the connection"),
            CloseReason::Replaced => write!(f, "a newer connection took over"),
            CloseReason::Down => write!(f, "the peer was declared down"),
            CloseReason::ShutDown => write!(f, "this node is shutting down"),
            CloseReason::Protocol(s) => write!(f, "protocol violation: {s}"),
            CloseReason::Refused(s) => write!(f, "refused by the peer: {s}"),
            CloseReason::Io(s) => write!(f, "{s}"),
            CloseReason::Idle => write!(f, "idle (nothing to send either way)"),
        }
    }
}

/// Why a connection failed before it carried messages. Counted per node
/// (`NodeStats::handshakes`) and given with every `Event::HandshakeFailed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum HandshakeFailure {
    /// The peer's proof of the cluster secret did not verify.
    Secret,
    /// Another protocol version.
    Version,
    /// The wrong node at a dialled address, or a node claiming this node's name.
    Name,
    /// An inbound connection claiming a node that this node dials itself.
    Direction,
    /// Not the batchwire protocol: garbage, a malformed or unexpected frame, a length
    /// above the limit, or a RESUME that does not add up.
    Protocol,
    /// The handshake did not finish within `handshake_timeout`.
    Timeout,
    /// The TLS handshake failed (no certificate, another CA, TLS on one side only...).
    Tls,
    /// The peer's certificate does not name the node it claims to be.
    Certificate,
    /// The peer refused this node (its reason is in the event).
    Refused,
    /// The node already has `max_peers` peers (or cannot start a thread for a new one).
    Capacity,
    /// The connection closed or failed before the handshake ended.
    Closed,
}

impl HandshakeFailure {
    /// Every kind, in a fixed order (for counters).
    pub(crate) const ALL: [HandshakeFailure; 11] = [
        HandshakeFailure::Secret,
        HandshakeFailure::Version,
        HandshakeFailure::Name,
        HandshakeFailure::Direction,
        HandshakeFailure::Protocol,
        HandshakeFailure::Timeout,
        HandshakeFailure::Tls,
        HandshakeFailure::Certificate,
        HandshakeFailure::Refused,
        HandshakeFailure::Capacity,
        HandshakeFailure::Closed,
    ];
}
