//! Node configuration: [`NodeConfig`], built with [`NodeConfig::new`] and builder methods,
//! and its defaults (each builder method says its own, and why).

mod validate;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use batchwire_core::bundler::{BundlerConfig, BundlerKind};
use batchwire_core::membership::MembershipConfig;
use batchwire_core::session::SessionConfig;

use crate::certs::TlsFiles;
use crate::error::Error;
use crate::seed::Seed;

/// The largest `max_payload` a node may be configured with.
const MAX_PAYLOAD_LIMIT: u64 = 16 << 30;

/// One peer in the static member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// The peer's node name.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl std::str::FromStr for PeerSpec {
    type Err = String;
    /// Parses `name=host:port`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, addr) = s
            .split_once('=')
            .ok_or_else(|| format!("peer {s:?} is not NAME=HOST:PORT"))?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| format!("peer {s:?}: cannot resolve {addr:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("peer {s:?}: {addr:?} resolves to nothing"))?;
        Ok(PeerSpec {
            name: name.to_string(),
            addr,
        })
    }
}

/// Everything a node needs. Start from [`NodeConfig::new`] (name, listen address, cluster
/// secret) and change what differs from the defaults with the builder methods; each says
/// its default.
///
/// Connections: of two peers, the one whose name sorts first dials the other; the other
/// waits for it. List each peer on both sides (a static cluster), so every pair connects.
///
/// ```
/// use std::time::Duration;
/// use batchwire::{BundlerKind, NodeConfig};
/// let cfg = NodeConfig::new("a", "127.0.0.1:7001".parse().unwrap(), "secret")
///     .peer("b", "127.0.0.1:7002".parse().unwrap())
///     .bundler(BundlerKind::TransferQueue)
///     .peer_timeout(Duration::from_secs(5));
/// assert_eq!(cfg.name(), "a");
/// ```
#[derive(Clone)]
pub struct NodeConfig {
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    pub(crate) peers: Vec<PeerSpec>,
    pub(crate) secret: Vec<u8>,
    pub(crate) mailboxes: Vec<String>,
    pub(crate) bundler: BundlerConfig,
    pub(crate) idle_cpu_level: u8,
    pub(crate) send_queue_bytes: usize,
    pub(crate) mailbox_bytes: usize,
    pub(crate) max_payload: usize,
    pub(crate) frame_bytes: usize,
    pub(crate) fragment_bytes: usize,
    pub(crate) by_reference_bytes: usize,
    pub(crate) read_bytes: usize,
    pub(crate) reassembly_bytes: Option<usize>,
    pub(crate) reconnect_min: Duration,
    pub(crate) reconnect_max: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_handshakes: usize,
    pub(crate) max_handshakes_per_address: usize,
    pub(crate) max_peers: usize,
    pub(crate) events_capacity: usize,
    pub(crate) max_pending_requests: usize,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) write_check: Duration,
    pub(crate) thread_linger: Duration,
    pub(crate) session: SessionConfig,
    pub(crate) tls: Option<TlsFiles>,
    pub(crate) seeds: Vec<Seed>,
    pub(crate) join_refresh: Duration,
    pub(crate) idle_close: Option<Duration>,
    pub(crate) advertise: Option<SocketAddr>,
    pub(crate) membership: Option<MembershipConfig>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("name", &self.name)
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("secret", &"<redacted>")
            .field("bundler", &self.bundler)
            .field("idle_cpu_level", &self.idle_cpu_level)
            .field("send_queue_bytes", &self.send_queue_bytes)
            .field("mailbox_bytes", &self.mailbox_bytes)
            .field("max_payload", &self.max_payload)
            .field("fragment_bytes", &self.fragment_bytes)
            .field("by_reference_bytes", &self.by_reference_bytes)
            .field("session", &self.session)
            .field("tls", &self.tls)
            .field("seeds", &self.seeds)
            .field("advertise", &self.advertise)
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl NodeConfig {
    /// A node named `name` (unique in the cluster, 1..=255 bytes of UTF-8) listening on
    /// `listen` (port 0 picks a free port, see `Node::local_addr`), with the cluster
    /// `secret` shared by every node (never sent over the wire), and every default.
    pub fn new(name: impl Into<String>, listen: SocketAddr, secret: impl Into<Vec<u8>>) -> Self {
        NodeConfig {
            name: name.into(),
            listen,
            peers: Vec::new(),
            secret: secret.into(),
            mailboxes: Vec::new(),
            bundler: BundlerConfig::default(),
            idle_cpu_level: batchwire_core::idle::DEFAULT_LEVEL,
            send_queue_bytes: 4 << 20,
            mailbox_bytes: 16 << 20,
            max_payload: 64 << 20,
            frame_bytes: 64 << 10,
            fragment_bytes: 64 << 10,
            by_reference_bytes: 512,
            read_bytes: 256 << 10,
            reassembly_bytes: None,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 64,
            max_handshakes_per_address: 16,
            max_peers: 2048,
            events_capacity: 4096,
            max_pending_requests: 65_536,
            shutdown_timeout: Duration::from_secs(5),
            write_check: Duration::from_millis(100),
            thread_linger: Duration::from_secs(2),
            session: SessionConfig::default(),
            tls: None,
            seeds: Vec::new(),
            join_refresh: Duration::from_secs(30),
            idle_close: Some(Duration::from_secs(60)),
            advertise: None,
            membership: Some(MembershipConfig::default()),
        }
    }

    /// Join the cluster that the node listening at `seed` belongs to (repeatable: the
    /// seeds are tried in turn until one answers). Knowing one member is enough: the
    /// membership layer (SWIM) brings the rest, and connections to members are opened as
    /// needed. The seed's node must prove the cluster secret like any peer; this node must
    /// prove it (and with TLS show a certificate naming it) before it appears in any view.
    /// A seed that is this node itself is skipped.
    ///
    /// A seed is an address or a DNS name with a port ([`Seed`], parsed from
    /// `HOST:PORT`). A name is resolved through the system resolver when the node starts
    /// and again every [`NodeConfig::join_refresh`], for as long as the node runs; every
    /// address it resolves to is a seed. So the nodes behind one name (a Kubernetes
    /// headless Service) find each other with no list of peers, a node started before the
    /// name listed anyone joins once it does, and two groups that formed apart merge once
    /// the name lists a member of the other.
    ///
    /// ```
    /// # use batchwire::{NodeConfig, Seed};
    /// let seed: Seed = "batchwire.default.svc.cluster.local:7000".parse().unwrap();
    /// let cfg = NodeConfig::new("a", "0.0.0.0:7000".parse().unwrap(), "secret")
    ///     .advertise("10.1.2.3:7000".parse().unwrap())
    ///     .join(seed)
    ///     .join("10.1.2.4:7000".parse::<std::net::SocketAddr>().unwrap());
    /// assert_eq!(cfg.seeds().len(), 2);
    /// ```
    pub fn join(mut self, seed: impl Into<Seed>) -> Self {
        self.seeds.push(seed.into());
        self
    }

    /// The seeds given with [`NodeConfig::join`].
    pub fn seeds(&self) -> &[Seed] {
        &self.seeds
    }

    /// How often the DNS names among the seeds are resolved again once the node has
    /// joined (default 30 s; 100 ms ..= 1 h). An address the name gained that is no live
    /// member's is dialled, which merges two groups that formed apart. While the node is
    /// alone, names are resolved before every round of dialling (with the reconnect
    /// back-off, [`NodeConfig::reconnect`]).
    pub fn join_refresh(mut self, every: Duration) -> Self {
        self.join_refresh = every;
        self
    }

    /// Connections to members on demand (membership on): `Some(idle)` makes a connection to
    /// a member only when there is something to send to it (either end dials), and closes
    /// it once no message went either way for `idle` with nothing pending (nothing queued,
    /// unacknowledged or owed). The session survives the close: the next send dials again
    /// and resumes it, exactly once and in order; while closed, neither end holds the other
    /// unreachable (whether a member lives is the membership's call). A member nobody
    /// talks to then costs no connection, no thread and no heartbeat, which is what lets a
    /// cluster grow to hundreds of nodes. Default: 60 s. `None`: every member is dialled
    /// when it joins and its connection kept (the full mesh: the first message to a member
    /// finds a connection ready, at the cost of a connection, two threads and heartbeats
    /// per member). Static peers ([`NodeConfig::peer`]) are always kept connected.
    /// 100 ms ..= 1 day.
    ///
    /// ```
    /// # use batchwire::NodeConfig;
    /// # use std::time::Duration;
    /// let cfg = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "secret")
    ///     .idle_close(Some(Duration::from_secs(30)));
    /// assert_eq!(cfg.idle_close_after(), Some(Duration::from_secs(30)));
    /// ```
    pub fn idle_close(mut self, idle: Option<Duration>) -> Self {
        self.idle_close = idle;
        self
    }

    /// [`NodeConfig::idle_close`]'s setting.
    pub fn idle_close_after(&self) -> Option<Duration> {
        self.idle_close
    }

    /// Whether connections to members are made on demand (idle close set, membership on).
    pub(crate) fn on_demand(&self) -> bool {
        self.idle_close.is_some() && self.membership.is_some()
    }

    /// The address other members should dial to reach this node. Default: the address it
    /// listens on, which must then not be a wildcard (`0.0.0.0` or `[::]`) if other nodes
    /// are to find it through the membership.
    pub fn advertise(mut self, addr: SocketAddr) -> Self {
        self.advertise = Some(addr);
        self
    }

    /// Membership settings (probe period, suspicion timeout...; see [`MembershipConfig`]).
    /// Membership is on by default, with its defaults.
    pub fn membership(mut self, m: MembershipConfig) -> Self {
        self.membership = Some(m);
        self
    }

    /// Turn the membership layer off: only the static peers are known, nothing is
    /// probed or gossiped, and `join` cannot be used.
    pub fn without_membership(mut self) -> Self {
        self.membership = None;
        self
    }

    /// The membership settings, `None` when membership is off.
    pub fn membership_config(&self) -> Option<&MembershipConfig> {
        self.membership.as_ref()
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address the node listens on.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The static peers.
    pub fn peers(&self) -> &[PeerSpec] {
        &self.peers
    }

    /// Add a peer to the static list. Default: none.
    pub fn peer(mut self, name: impl Into<String>, addr: SocketAddr) -> Self {
        self.peers.push(PeerSpec {
            name: name.into(),
            addr,
        });
        self
    }

    /// Add every peer in `peers` to the static list.
    pub fn with_peers(mut self, peers: impl IntoIterator<Item = PeerSpec>) -> Self {
        self.peers.extend(peers);
        self
    }

    /// Declare a mailbox that exists from the start, before any connection: messages that
    /// arrive before the application calls `Node::mailbox(name)` wait in it instead of being
    /// reported undeliverable. Default: none.
    pub fn mailbox(mut self, name: impl Into<String>) -> Self {
        self.mailboxes.push(name.into());
        self
    }

    /// How outbound messages are grouped into writes. Default: `natural`.
    pub fn bundler(mut self, b: BundlerKind) -> Self {
        self.bundler.kind = b;
        self
    }

    /// The bundler's size limit (`per-destination`, `transfer-queue`, `linger`). Default
    /// 64 KiB.
    pub fn bundler_max_size(mut self, bytes: usize) -> Self {
        self.bundler.max_size = bytes;
        self
    }

    /// `linger`'s timer. Default 1 ms.
    pub fn bundler_max_delay(mut self, d: Duration) -> Self {
        self.bundler.max_delay = d;
        self
    }

    /// How writer threads and waiting receivers idle, as Akka Artery's `idle-cpu-level`:
    /// 1 parks at once (no CPU when idle), 10 busy-spins. Default 1.
    pub fn idle_cpu_level(mut self, level: u8) -> Self {
        self.idle_cpu_level = level;
        self
    }

    /// Bound of each of a peer's outbound queues (ordinary and bulk), in bytes. When full,
    /// `send` blocks and `try_send` returns `Full`. Default 4 MiB.
    pub fn send_queue_bytes(mut self, bytes: usize) -> Self {
        self.send_queue_bytes = bytes;
        self
    }

    /// Each mailbox's budget per sender, in bytes: the credit each other node gets in it. A
    /// node may have this many bytes of messages on their way to one mailbox here or waiting
    /// in it; past that its sends to that mailbox wait (`try_send` returns `Full`) until the
    /// application takes some, while its sends to other mailboxes go on. The connection's
    /// reader never waits for a mailbox. Sends from this node's own threads wait while the
    /// mailbox holds this much. So a mailbox holds at most `mailbox_bytes` per sending node
    /// (plus one message each), and a node that sends past twice that plus `max_payload` is
    /// disconnected. It is also what one sender can have in flight to one mailbox: below
    /// ~8 MiB, 100 B streams stall on the loop of grants on a busy 2-core machine. Default
    /// 16 MiB.
    pub fn mailbox_bytes(mut self, bytes: usize) -> Self {
        self.mailbox_bytes = bytes;
        self
    }

    /// Largest payload `send` accepts (`Error::PayloadTooLarge` beyond it); once connected,
    /// also no larger than the peer accepts. Up to 16 GiB. A message this large needs that
    /// much memory at the receiver while it is reassembled. Default 64 MiB.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// A MESSAGES frame is closed once it holds this many bytes (at most 1 MiB). Default
    /// 64 KiB.
    pub fn frame_bytes(mut self, bytes: usize) -> Self {
        self.frame_bytes = bytes;
        self
    }

    /// Messages larger than this are sent in pieces of this size (at most 1 MiB),
    /// interleaved with other traffic to the same peer and reassembled at the receiver, so
    /// a large message never holds up small ones. Default 64 KiB.
    pub fn fragment_bytes(mut self, bytes: usize) -> Self {
        self.fragment_bytes = bytes;
        self
    }

    /// Payloads of at least this many bytes are not copied into the send queue: the node
    /// keeps the `Bytes` you pass (a reference count) and writes from it until the peer
    /// acknowledges the message, so a slice keeps its whole buffer alive until then.
    /// Smaller payloads are copied at once. Default 512 B; `usize::MAX` (in a node file,
    /// any value above `max_payload`) copies every payload. With the transfer-queue
    /// bundler every payload is copied (its shared queue's batches are split among the
    /// peers); over TLS the payload is copied once more, to be encrypted. A payload that
    /// is itself a slice of a received message keeps that message's receive buffer (up to
    /// 256 KiB) alive too, while it is held. The copy is made under the lock of the
    /// peer's queue, so a large copy holds up every other sender to that peer; taking a
    /// reference costs a reference count and a slot instead, which is cheaper from about
    /// this size on (the commit that chose it has the measurements).
    pub fn by_reference_bytes(mut self, bytes: usize) -> Self {
        self.by_reference_bytes = bytes;
        self
    }

    /// Most bytes of pieces (large and bulk messages) in flight to one peer, unacknowledged,
    /// while ordinary messages flow too: they never wait behind more bulk data than this,
    /// and bulk keeps this much in flight however many ordinary messages are sent. Default
    /// 128 KiB. When bulk has the connection to itself the budget is
    /// [`bulk_stream_bytes`](Self::bulk_stream_bytes).
    ///
    /// A trade-off: an ordinary message sent while a bulk stream runs waits behind up to
    /// this many bytes in the socket, and one peer's bulk stream moves at most this much
    /// per round trip. Raising it moves bulk faster and makes small messages wait longer
    /// behind it (`batchwire bench hol` shows both, with `--bulk-inflight-bytes`). On a
    /// link with a long round trip, raise it toward bandwidth x round trip (1 Gbit/s x
    /// 10 ms is about 1.2 MiB).
    pub fn bulk_inflight_bytes(mut self, bytes: usize) -> Self {
        self.session.bulk_inflight = bytes;
        self
    }

    /// The bulk budget once bulk has the connection to itself: after this many bytes of
    /// pieces went to a peer with no ordinary message between them, up to this many are
    /// in flight, until the next ordinary message brings the budget back to
    /// [`bulk_inflight_bytes`](Self::bulk_inflight_bytes). Default 2 MiB (no lower than
    /// `bulk_inflight_bytes`).
    ///
    /// So a stream of large messages is not held to 128 KiB per acknowledgement round
    /// trip, while a small message sent beside bulk still waits behind at most
    /// `bulk_inflight_bytes`, except the first one after a bulk-only stretch, which may
    /// wait behind up to this many bytes (about 1 ms at 2 GB/s). Pieces are never copied
    /// on the way out, so this costs no memory beyond the messages themselves.
    pub fn bulk_stream_bytes(mut self, bytes: usize) -> Self {
        self.session.bulk_stream = bytes;
        self
    }

    /// Bytes a reader asks the socket for at once. Default 256 KiB (with 64 KiB, 1 KB and
    /// 10 KB messages went at about 0.9x the rate: more reads, and more hand-offs to the
    /// application, for the same bytes). Over TLS a read hands on at most 64 KiB of
    /// plaintext (decrypting is the slow part; the application starts on a read's messages
    /// only once it returns). Each connection reads into blocks of four reads (at most
    /// 1 MiB, or one read if larger) and keeps up to 1 MiB of full blocks (at least one,
    /// at most four) for reuse while the application holds messages cut from them.
    pub fn read_bytes(mut self, bytes: usize) -> Self {
        self.read_bytes = bytes;
        self
    }

    /// Most bytes of messages in pieces held at once, node-wide (every peer's, counted at
    /// each message's announced length). A message that would start past it is followed
    /// to its end without keeping its data and reported to its sender as undeliverable.
    /// Default 256 MiB or twice `max_payload`, whichever is more; at least `max_payload`.
    pub fn reassembly_bytes(mut self, bytes: usize) -> Self {
        self.reassembly_bytes = Some(bytes);
        self
    }

    /// The node-wide bound on reassembly memory (see [`NodeConfig::reassembly_bytes`]).
    pub(crate) fn reassembly_limit(&self) -> u64 {
        self.reassembly_bytes
            .unwrap_or_else(|| (256 << 20).max(self.max_payload.saturating_mul(2))) as u64
    }

    /// First and largest pause between connection attempts. Default 50 ms and 2 s.
    pub fn reconnect(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// How long a connection may take from accept (or connect) to carrying messages: TLS,
    /// the handshake and the RESUME exchange, all together. Default 5 s.
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }

    /// Most inbound handshakes from strangers in progress at once. Each costs a socket and
    /// a few KiB on the acceptor's event loop (no thread: only a peer that proved the
    /// cluster secret gets one) until it ends. When they are all taken, a connection from
    /// an address this node knows (a configured peer, a seed, a member) takes one of as
    /// many places again kept for those, and one from another address takes the oldest
    /// place of the address holding the most, if that holds at least two more than it;
    /// otherwise it is closed at once (and counted). Default 64.
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n;
        self
    }

    /// Most of those from one source address, so that one client cannot take every place.
    /// A known address gets as many again among the kept places; past that its oldest
    /// handshake that waits on its peer (silent, or on plain TCP trickling a frame) gives
    /// way, or, if the node is behind on all of them, the oldest once it has waited half
    /// the handshake timeout (until then the newcomer is closed at once and dials again).
    /// Default 16.
    pub fn max_handshakes_per_address(mut self, n: usize) -> Self {
        self.max_handshakes_per_address = n;
        self
    }

    /// Most peers a node keeps, counting those not in the static list that connect with the
    /// cluster secret. Default 2048.
    pub fn max_peers(mut self, n: usize) -> Self {
        self.max_peers = n;
        self
    }

    /// Events queued for each subscriber at most; beyond it they are dropped and counted
    /// (see `Node::events`). Default 4096.
    pub fn events_capacity(mut self, n: usize) -> Self {
        self.events_capacity = n;
        self
    }

    /// Requests in flight at most (`Node::request` and friends); one more fails with
    /// [`Error::TooManyRequests`]. A slot costs about 100 bytes. Default 65,536.
    pub fn max_pending_requests(mut self, n: usize) -> Self {
        self.max_pending_requests = n;
        self
    }

    /// How long `shutdown` waits for queued messages to be written and acknowledged.
    /// Default 5 s.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }

    /// How long one write to a socket may block before the writer looks up (is the
    /// connection still current, is the node shutting down?) and goes on. A peer that stops
    /// reading is dealt with by the failure detector, not by this. Default 100 ms.
    pub fn write_check(mut self, d: Duration) -> Self {
        self.write_check = d;
        self
    }

    /// How long a peer's writer thread (and its connection's reader thread) stays with
    /// nothing to do before it ends. An idle peer then costs no thread: its heartbeats
    /// are written by the node's ticker, its connection is watched by the node's one
    /// thread for resting connections, and the next burst either way starts a thread again
    /// (a lone message starts none: its sender writes it, the resting thread reads it).
    /// Raise it for traffic that pauses often for about this long. Default 2 s.
    pub fn thread_linger(mut self, d: Duration) -> Self {
        self.thread_linger = d;
        self
    }

    /// Keep every message until the peer acknowledges it, and resend after a connection
    /// break (exactly once, in order). `false` is the unsequenced baseline, kept to measure
    /// what reliability costs: messages in flight when a connection breaks are lost. Use
    /// the same value on every node. Default true.
    pub fn reliable(mut self, on: bool) -> Self {
        self.session.reliable = on;
        self
    }

    /// Most unacknowledged bytes held per peer (the send window); past it the writer takes
    /// no more from its queue, which fills, so `send` blocks. Default 16 MiB.
    pub fn unacked_bytes(mut self, bytes: usize) -> Self {
        self.session.unacked_bytes = bytes;
        self
    }

    /// A receiver acknowledges after `messages` messages, or `bytes` bytes, or `delay`
    /// after the first unacknowledged one, whichever comes first. Defaults 4096, 1 MiB and
    /// 5 ms.
    pub fn ack_every(mut self, messages: u64, bytes: usize, delay: Duration) -> Self {
        self.session.ack_every = messages;
        self.session.ack_every_bytes = bytes;
        self.session.ack_delay = delay;
        self
    }

    /// A connection carries a heartbeat when nothing else was written for this long.
    /// Default 500 ms.
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.session.heartbeat_interval = d;
        self
    }

    /// A peer silent for longer than this (while this node listens), or unreachable that
    /// long, is declared down. Default 3 s.
    pub fn peer_timeout(mut self, d: Duration) -> Self {
        self.session.peer_timeout = d;
        self
    }

    /// Mutually authenticated TLS on every connection, on top of the cluster-secret
    /// handshake. All nodes of a cluster must agree. Default: none (plain TCP).
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Whether the node runs TLS.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }
}

#[cfg(test)]
mod tests;
