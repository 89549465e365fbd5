//! [`Node`]: start a node, send, subscribe to events, shut down.

use std::net::SocketAddr;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use batchwire_core::codec::Name;
use bytes::Bytes;

use crate::address::Address;
use crate::class::Class;
use crate::config::NodeConfig;
use crate::error::Error;
use crate::event::{Event, Member, TimedEvent};
use crate::io::envelope::{Envelope, Outbound};
use crate::io::runtime::Runtime;
use crate::mailbox::Mailbox;
use crate::request::RequestFuture;
use crate::send::SendFuture;
use crate::stats::NodeStats;
use crate::stream::EventStream;

/// A running batchwire node. Dropping it shuts it down (see [`Node::shutdown`]).
pub struct Node {
    rt: Arc<Runtime>,
    anonymous: Name,
}

impl Node {
    /// Start a node: bind the listen address, start connecting to peers, return at once.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a setting out of range or a secret that is empty (the
    /// message names the setting), [`Error::InvalidName`] for a bad node or mailbox name,
    /// [`Error::Listen`] when the address cannot be bound (in use, not local), and
    /// [`Error::Tls`] when a certificate, key or CA cannot be read or does not name this
    /// node. Nothing is started when it fails. Peers that cannot be reached are not an
    /// error: the node keeps dialling them and reports what happens as [`Event`]s.
    ///
    /// ```
    /// # use batchwire::{Error, Node, NodeConfig};
    /// let a = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
    /// // The same address again: refused, naming it.
    /// let again = Node::start(NodeConfig::new("b", a.local_addr(), "s"));
    /// assert!(matches!(again, Err(Error::Listen { addr, .. }) if addr == a.local_addr()));
    /// ```
    pub fn start(config: NodeConfig) -> Result<Node, Error> {
        Ok(Node {
            rt: Runtime::start(config)?,
            anonymous: Name::from_static(""),
        })
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        self.rt.name.as_str()
    }

    /// The address the node listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.rt.local_addr
    }

    /// Register a mailbox named `name` on this node, or take the handle of one declared in
    /// the config ([`NodeConfig::mailbox`]), with whatever arrived in it meanwhile.
    ///
    /// # Errors
    ///
    /// [`Error::MailboxExists`] if a handle to it is already held, [`Error::InvalidName`]
    /// for an empty or over-long name (or one beginning with NUL).
    pub fn mailbox(&self, name: &str) -> Result<Mailbox, Error> {
        Ok(Mailbox::new(self.rt.claim_mailbox(name)?, self.rt.clone()))
    }

    /// Send `payload` to `to` (from the anonymous sender ""). Blocks while the queue toward
    /// that node is full, or while the destination mailbox's credit is used up (its
    /// application is not taking messages fast enough; sends to other mailboxes go on).
    /// Messages from one thread to one mailbox arrive in order. Payloads larger than
    /// `fragment_bytes` go in pieces (see [`Class`]).
    ///
    /// A payload of 512 bytes or more ([`NodeConfig::by_reference_bytes`]) is not copied:
    /// batchwire keeps the `Bytes` (a reference count) and writes from it until the peer
    /// acknowledges it, so a slice keeps its whole buffer alive until then. Smaller
    /// payloads are copied into the queue at once (so is every payload with the
    /// transfer-queue bundler; over TLS, encrypting copies it once more).
    ///
    /// # Errors
    ///
    /// Returned at once, the message not accepted: [`Error::UnknownNode`] (no such peer or
    /// member), [`Error::PeerDown`] (declared down; sends fail fast until it is back),
    /// [`Error::PayloadTooLarge`] (above `max_payload`), [`Error::ShutDown`] (the payload
    /// handed back). Once accepted, a message that cannot be delivered is reported later,
    /// as [`Event::SendFailed`] (with its payload) or [`Event::Undeliverable`] (no such
    /// mailbox there), never silently dropped.
    pub fn send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send(&self.anonymous, to, payload.into(), Class::Ordinary, true)
    }

    /// [`Node::send`] from async code: waits for room without blocking the thread, so it
    /// is safe on any runtime's worker. Cancellation-safe: the message is accepted exactly
    /// when the future completes with `Ok(())`; a future dropped before that never queued
    /// it (see [`SendFuture`]).
    pub fn send_async(&self, to: &Address, payload: impl Into<Bytes>) -> SendFuture {
        self.send_async_with(to, payload, Class::Ordinary)
    }

    /// Like [`Node::send_async`], in lane `class`.
    pub fn send_async_with(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        class: Class,
    ) -> SendFuture {
        let out: Arc<dyn Outbound> = self.rt.clone();
        SendFuture::new(
            out,
            self.anonymous.clone(),
            to.clone(),
            payload.into(),
            class,
        )
    }

    /// Send a request to mailbox `to` and wait (blocking this thread) up to `timeout` for
    /// its reply, which the receiver sends with [`Envelope::reply`]. The reply comes back
    /// as an envelope from `to`. A `timeout` too long for the clock (`Duration::MAX`) waits
    /// without a limit.
    ///
    /// Fails with [`Error::Timeout`] (a reply that comes later is counted as late in
    /// `NodeStats::requests` and dropped), [`Error::PeerDown`] as soon as the node is
    /// declared down, [`Error::Undeliverable`] if it has no such mailbox, or
    /// [`Error::TooManyRequests`] past `max_pending_requests`. Like `send`, it waits for
    /// room to queue the request first (that wait is not bounded by `timeout`).
    ///
    /// # Errors
    ///
    /// Those above, and those of [`Node::send`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use batchwire::{Address, Error, Node, NodeConfig};
    /// # let a = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s")).unwrap();
    /// # let b = Node::start(NodeConfig::new("b", "127.0.0.1:0".parse().unwrap(), "s").join(a.local_addr())).unwrap();
    /// # assert!(a.wait_for_members(Duration::from_secs(10), |m| m.iter().any(|m| m.name == "b")));
    /// let service = b.mailbox("upper").unwrap();
    /// std::thread::spawn(move || {
    ///     let req = service.recv_timeout(Duration::from_secs(10)).unwrap();
    ///     req.reply(req.payload.to_ascii_uppercase()).unwrap();
    /// });
    /// let answer = a.request(&Address::new("b", "upper").unwrap(), "hi", Duration::from_secs(5));
    /// assert_eq!(&answer.unwrap().payload[..], b"HI");
    /// // A mailbox that does not exist there: said, not waited for.
    /// let none = a.request(&Address::new("b", "nobody").unwrap(), "hi", Duration::from_secs(5));
    /// assert!(matches!(none, Err(Error::Undeliverable { .. })));
    /// ```
    pub fn request(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Envelope, Error> {
        self.rt.request(to, payload.into(), timeout)
    }

    /// [`Node::request`] from async code (no thread is blocked; the timeout runs on the
    /// node's own timer, whatever the runtime). Dropping the future cancels the request
    /// (see [`RequestFuture`]). Unlike the blocking call, the wait for room to queue the
    /// request is bounded by `timeout` too (counted from this call): a request that found
    /// no room before its deadline ends with [`Error::Timeout`] and is not sent.
    pub fn request_async(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> RequestFuture {
        let deadline = crate::io::deadline_after(timeout);
        RequestFuture::new(self.rt.clone(), to.clone(), payload.into(), deadline)
    }

    /// A typed request: `request` with values serialized with postcard; the receiver
    /// decodes with [`Envelope::value`] and answers with [`Envelope::reply_value`].
    pub fn request_value<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        to: &Address,
        request: &Q,
        timeout: Duration,
    ) -> Result<R, Error> {
        self.request(to, crate::value::encode(request)?, timeout)?
            .value()
    }

    /// [`Node::request_value`] from async code.
    pub async fn request_value_async<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        to: &Address,
        request: &Q,
        timeout: Duration,
    ) -> Result<R, Error> {
        let payload = crate::value::encode(request)?;
        self.request_async(to, payload, timeout).await?.value()
    }

    /// Like [`Node::send`], but returns [`Error::Full`] (with the payload) instead of
    /// blocking.
    pub fn try_send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send(&self.anonymous, to, payload.into(), Class::Ordinary, false)
    }

    /// Like [`Node::send`], in lane `class`: [`Class::Bulk`] for large transfers that
    /// should never hold up small messages to the same node.
    pub fn send_with(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        class: Class,
    ) -> Result<(), Error> {
        self.rt
            .send(&self.anonymous, to, payload.into(), class, true)
    }

    /// Like [`Node::try_send`], in lane `class`.
    pub fn try_send_with(
        &self,
        to: &Address,
        payload: impl Into<Bytes>,
        class: Class,
    ) -> Result<(), Error> {
        self.rt
            .send(&self.anonymous, to, payload.into(), class, false)
    }

    /// Send to mailbox `mailbox` on every member, **this node included** (JGroups' null
    /// destination). See [`Node::send_others`] to leave this node out.
    pub fn send_all(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send_all(&self.anonymous, mailbox, payload.into(), true)
    }

    /// Send to mailbox `mailbox` on every member except this node.
    pub fn send_others(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.rt
            .send_all(&self.anonymous, mailbox, payload.into(), false)
    }

    /// Send a value serialized with postcard; decode it with `Envelope::value`.
    pub fn send_value<T: serde::Serialize>(&self, to: &Address, value: &T) -> Result<(), Error> {
        self.send(to, crate::value::encode(value)?)
    }

    /// Subscribe to events (peer up/down, connections, handshake failures, undeliverable
    /// reports, failed sends). Every subscriber gets every event from now on, in a queue of
    /// `events_capacity` events: the node never waits for a subscriber, so one that falls
    /// behind loses events and is told how many (`Event::EventsDropped`). A subscriber that
    /// drops its receiver is forgotten. The channel ends (disconnects) once the node has
    /// shut down, after its last event.
    pub fn events(&self) -> mpsc::Receiver<Event> {
        self.rt.events.subscribe()
    }

    /// Like [`Node::events`], each event with the moment the node emitted it. For a
    /// subscriber that takes its events late or in batches (to wake up less often) and
    /// still needs to know when each happened, such as a recorder of membership changes.
    /// Events emitted by several threads at once come in the order of their times.
    pub fn timed_events(&self) -> mpsc::Receiver<TimedEvent> {
        self.rt.events.subscribe_timed()
    }

    /// Subscribe to events from async code: a `Stream` of every event from now on, bounded
    /// like [`Node::events`] (a stream that falls behind gets `Event::EventsDropped` with
    /// the count; the node never waits for it). It ends after the node shut down. Any
    /// number of streams and receivers may be open at once.
    pub fn event_stream(&self) -> EventStream {
        EventStream::new(self.rt.events.subscribe_async())
    }

    /// Threads this node runs now (acceptor, ticker, dialers, writers, one per
    /// authenticated connection; inbound handshakes in progress run on the acceptor's).
    pub fn threads(&self) -> usize {
        self.rt.threads()
    }

    /// Names of the peers with a live connection whose session is up: a send to one of
    /// them is taken (not refused as down) from the moment it is listed here.
    pub fn connected_peers(&self) -> Vec<String> {
        self.rt.connected_peers()
    }

    /// Wait until every named peer is connected, up to `timeout`. Returns whether they are.
    pub fn wait_for_peers(&self, peers: &[&str], timeout: Duration) -> bool {
        self.rt.wait_for_peers(peers, timeout)
    }

    /// The cluster membership view: every other member this node knows of, with its
    /// address, incarnation and state (alive, suspect, down, left; down and left members
    /// stay listed for `forget_down_after`). Empty with membership off.
    /// [`Node::send_all`] and [`Node::send_others`] address the live ones.
    ///
    /// Events only reach subscribers from the moment they subscribe, and a node starts
    /// joining at once: to follow the view without a gap, subscribe ([`Node::events`])
    /// first, then read this.
    pub fn members(&self) -> Vec<Member> {
        self.rt.members()
    }

    /// The address other members dial to reach this node (`NodeConfig::advertise`, else
    /// the listening address).
    pub fn advertised_addr(&self) -> SocketAddr {
        self.rt.advertise
    }

    /// This node's incarnation: its start time in microseconds, presented by its
    /// connections and in its membership identity (what other members see as
    /// [`Member::incarnation`]); a restart gives a new one.
    pub fn incarnation(&self) -> u64 {
        self.rt.incarnation()
    }

    /// Wait until `cond` holds for the membership view, up to `timeout`. Returns whether it
    /// does. E.g. `node.wait_for_members(t, |v| v.iter().filter(|m| m.state.is_live()).count() == 2)`.
    pub fn wait_for_members(&self, timeout: Duration, cond: impl Fn(&[Member]) -> bool) -> bool {
        self.rt.wait_for_members(timeout, cond)
    }

    /// Close every connection now, as a network failure would (for chaos testing: see
    /// `batchwire bench throughput --break-every`). They reconnect and resume; nothing
    /// accepted by `send` is lost or delivered twice. Returns how many were closed.
    pub fn break_connections(&self) -> usize {
        self.rt.break_connections()
    }

    /// Copy this node's counters into the `metrics` facade, for the exporter the
    /// application installed (feature `metrics`; names in docs/guide.md, "Operating a cluster").
    /// Nothing is recorded per message: this reads the counters the node keeps anyway.
    #[cfg(feature = "metrics")]
    pub fn publish_metrics(&self) {
        self.stats()
            .publish_with(&self.rt.mailboxes.depths(), &self.members());
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> NodeStats {
        self.rt.stats()
    }

    /// The node's own counters without every peer's: `peers` is empty and `bytes_sent`
    /// is their sum. Cheap at any cluster size (`stats` builds a snapshot of each peer,
    /// which for a thousand members is most of what an idle node does if printed every
    /// second).
    pub fn stats_brief(&self) -> NodeStats {
        self.rt.stats_brief()
    }

    /// Flush what is queued (up to `shutdown_timeout`), say goodbye to every peer, close
    /// every connection and mailbox, and join every thread the node started. Messages that
    /// could not be delivered in time are reported as `SendFailed` and logged.
    pub fn shutdown(self) {
        // Drop does the work.
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.rt.shutdown();
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({} on {})", self.rt.name, self.rt.local_addr)
    }
}
