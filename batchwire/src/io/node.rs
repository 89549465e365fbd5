//! The node: peers, mailboxes, threads, and the public API.
//!
//! Threads a node runs:
//! - one acceptor, taking connections from peers that dial us;
//! - per peer we dial (our name sorts first): one dialer, which connects with back-off,
//!   handshakes, then reads the connection until it breaks, and starts over;
//! - per accepted connection: one thread that handshakes, then reads it;
//! - per peer: one writer, which drains that peer's outbound queue into whichever
//!   connection is current, as its bundler decides.
//!
//! Every thread is joined by `shutdown`.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::config::NodeConfig;
use crate::error::Error;
use crate::io::connection;
use crate::io::mailbox::{Envelope, Mailbox, MailboxQueue};
use crate::io::queue::{Lane, PushError};
use crate::stats::{HandshakeFailure, NodeStats, PeerCounters, SecurityCounters};
use batchwire_core::codec::Name;
use batchwire_core::idle::IdleStrategy;
use batchwire_core::outbox::{ALL, Dest};
use batchwire_core::reliable::{RecvWindow, SendWindow};

/// A mailbox on a node: where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub node: Name,
    pub mailbox: Name,
}

impl Address {
    /// The mailbox `mailbox` on node `node`. Names are 1..=255 bytes (the mailbox name may
    /// be empty only as a sender: "" is the anonymous sender used by `Node::send`).
    pub fn new(node: &str, mailbox: &str) -> Result<Address, Error> {
        Ok(Address {
            node: node_name(node)?,
            mailbox: Name::new(mailbox)
                .ok_or_else(|| Error::InvalidName(mailbox.into(), "longer than 255 bytes"))?,
        })
    }

    pub fn node(&self) -> &str {
        self.node.as_str()
    }

    pub fn mailbox(&self) -> &str {
        self.mailbox.as_str()
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.mailbox, self.node)
    }
}

fn node_name(s: &str) -> Result<Name, Error> {
    if s.is_empty() {
        return Err(Error::InvalidName(s.into(), "empty"));
    }
    Name::new(s).ok_or_else(|| Error::InvalidName(s.into(), "longer than 255 bytes"))
}

/// Something that happened on a node; subscribe with [`Node::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `peer` is up: connected for the first time, or again after being declared down.
    PeerUp { peer: String, incarnation: u64 },
    /// The failure detector declared `peer` down (silent for longer than `peer_timeout`,
    /// or it said goodbye). Sends to it fail with `Error::PeerDown` until it is back; what
    /// was pending for it is reported in a `SendFailed`.
    PeerDown { peer: String, reason: String },
    /// A connection to `peer` was established and authenticated (also after a break).
    Connected {
        peer: String,
        incarnation: u64,
        addr: SocketAddr,
    },
    /// A connection to `peer` closed. Unacknowledged messages are resent on the next one.
    Disconnected { peer: String, reason: String },
    /// A handshake failed (wrong secret, wrong version, wrong node...). `peer` is the name
    /// the other side claimed, when it got that far (or the node we dialled); `kind` says
    /// why in a form to match on, `reason` in words.
    HandshakeFailed {
        addr: SocketAddr,
        peer: Option<String>,
        kind: HandshakeFailure,
        reason: String,
    },
    /// `count` events were dropped because this subscriber did not keep up (the queue
    /// holds `NodeConfig::events_capacity` events); the node never waits for a subscriber.
    EventsDropped { count: u64 },
    /// `count` messages sent from our mailbox `from` to `to` found no such mailbox.
    Undeliverable {
        to: Address,
        from: String,
        count: u64,
    },
    /// `count` messages to `peer` will never be delivered: the peer was declared down,
    /// restarted (a new incarnation), or the node shut down first. They are handed back in
    /// `messages`. None of them was delivered twice; some may have been delivered once
    /// before the peer stopped acknowledging.
    SendFailed {
        peer: String,
        count: u64,
        reason: String,
        messages: Vec<FailedMessage>,
    },
}

/// A message handed back by `Event::SendFailed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMessage {
    pub to: Address,
    /// The sending mailbox on this node ("" for `Node::send`).
    pub from: String,
    pub payload: Bytes,
}

/// Where a peer stands, for the failure detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum PeerState {
    /// Never connected yet: sends queue.
    Connecting = 0,
    Up = 1,
    /// Declared down: sends fail fast.
    Down = 2,
}

/// The connection currently serving a peer.
pub(crate) struct Conn {
    /// The transport (plain or TLS), shared with the connection's reader.
    pub link: Arc<crate::io::tls::Link>,
    closed: AtomicBool,
}

impl Conn {
    pub fn new(link: Arc<crate::io::tls::Link>) -> Self {
        Conn {
            link,
            closed: AtomicBool::new(false),
        }
    }

    /// Close both directions; the reader and writer using it then fail and move on.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.link.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Everything the node knows about one peer.
pub(crate) struct Peer {
    /// Index in `Shared::by_id`; the destination tag of this peer's frames.
    pub id: Dest,
    pub name: Name,
    /// The lane this peer's messages queue in (its own, or the node's only one).
    pub lane: Arc<Lane>,
    link: Mutex<Option<Arc<Conn>>>,
    pub stats: PeerCounters,
    /// Our stream to the peer: sequence numbers and unacknowledged frames.
    pub send: Mutex<SendWindow>,
    /// The peer's stream to us. Held by a reader while it accepts and delivers a frame,
    /// so two readers (a dying connection's and its successor's) never interleave.
    pub recv: Mutex<RecvWindow>,
    /// The peer's incarnation when last connected.
    pub incarnation: Mutex<Option<u64>>,
    state: AtomicU8,
    /// Milliseconds since node start of the last bytes read from / written to the peer,
    /// and of the last disconnect.
    pub last_read: AtomicU64,
    pub last_write: AtomicU64,
    pub disconnected_at: AtomicU64,
    /// Undeliverable notices waiting for room in the lane (bounded; see `Notices`).
    notices: Mutex<Notices>,
}

/// Undeliverable notices for one peer, summed per (destination, sender) pair until they can
/// be queued. At most `NOTICE_PAIRS` pairs are kept apart; the counts of any further pairs
/// go into one summary notice (destination "", which no mailbox can have), so a peer that
/// sends to a million made-up names costs this node a fixed amount of memory.
#[derive(Default)]
struct Notices {
    pairs: Vec<(Name, Name, u32)>,
    summary: u32,
}

/// Distinct (destination, sender) pairs of undeliverable notices kept per peer.
const NOTICE_PAIRS: usize = 64;
/// Undeliverable notices queued in a lane at once; more wait (summed) in `Notices`.
const NOTICES_QUEUED: usize = 16;
/// Mailbox names logged as undeliverable, at most (further names are counted only).
const LOGGED_NAMES: usize = 1024;

impl Peer {
    pub fn state(&self) -> PeerState {
        match self.state.load(Ordering::Acquire) {
            1 => PeerState::Up,
            2 => PeerState::Down,
            _ => PeerState::Connecting,
        }
    }

    /// Set the state; returns the previous one.
    pub fn set_state(&self, s: PeerState) -> PeerState {
        match self.state.swap(s as u8, Ordering::AcqRel) {
            1 => PeerState::Up,
            2 => PeerState::Down,
            _ => PeerState::Connecting,
        }
    }

    /// Make `conn` the current connection, closing any previous one.
    pub fn install(&self, conn: Arc<Conn>) {
        let old = self
            .link
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(conn);
        if let Some(old) = old {
            old.close();
        }
        self.lane.poke();
    }

    /// Forget `conn` if it is still the current connection.
    pub fn uninstall(&self, conn: &Arc<Conn>) {
        let mut g = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *g = None;
        }
        drop(g);
        self.lane.poke();
    }

    pub fn current(&self) -> Option<Arc<Conn>> {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Tell the peer that `count` messages from its mailbox `from` to our mailbox `to` found
    /// no such mailbox: summed with earlier notices, and queued as room allows.
    pub fn report_undeliverable(&self, to: &Name, from: &Name, count: u32) {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        match n.pairs.iter().position(|(t, f, _)| t == to && f == from) {
            Some(i) => n.pairs[i].2 = n.pairs[i].2.saturating_add(count),
            None if n.pairs.len() < NOTICE_PAIRS => n.pairs.push((to.clone(), from.clone(), count)),
            None => n.summary = n.summary.saturating_add(count),
        }
        self.flush_notices_locked(&mut n);
    }

    /// Queue waiting undeliverable notices while the lane has room for them.
    pub fn flush_notices(&self) {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_notices_locked(&mut n);
    }

    fn flush_notices_locked(&self, n: &mut Notices) {
        use batchwire_core::frame::{Frame, Undeliverable};
        let empty = Name::from_static("");
        while let Some((to, from, count)) = n
            .pairs
            .last()
            .cloned()
            .or_else(|| (n.summary > 0).then(|| (empty.clone(), empty.clone(), n.summary)))
        {
            let f = Frame::Undeliverable(Undeliverable { count, to, from });
            if !self.lane.push_control(self.id, &f, NOTICES_QUEUED) {
                return;
            }
            if n.pairs.pop().is_none() {
                n.summary = 0;
            }
        }
    }
}

/// State shared by a node's handle, its mailboxes and its threads.
pub(crate) struct Shared {
    pub name: Name,
    pub incarnation: u64,
    pub config: NodeConfig,
    pub secret: Arc<[u8]>,
    pub local_addr: SocketAddr,
    pub idle: IdleStrategy,
    /// TLS configurations, when the node runs TLS.
    pub tls: Option<crate::io::tls::TlsConfigs>,
    /// Peers this node dials (their names sort after ours): an inbound connection claiming
    /// one of them is refused.
    pub dials: Arc<[Name]>,
    /// Inbound handshakes in progress, by source address (at most `max_handshakes` in all
    /// and `max_handshakes_per_address` each, so the map is bounded too).
    pub handshakes: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Counters of failed and refused connections.
    pub security: SecurityCounters,
    peers: RwLock<HashMap<Name, Arc<Peer>, NameHash>>,
    by_id: RwLock<Vec<Arc<Peer>>>,
    /// Every lane and its writer thread.
    lanes: Mutex<Vec<LaneThread>>,
    /// With `transfer-queue`: the one lane every peer shares.
    shared_lane: Option<Arc<Lane>>,
    mailboxes: RwLock<HashMap<Name, Arc<MailboxQueue>, NameHash>>,
    shutting_down: AtomicBool,
    /// When shutdown started (writers give up waiting for a connection after the timeout).
    shutdown_at: Mutex<Option<Instant>>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    events: Mutex<Option<EventSink>>,
    events_dropped: AtomicU64,
    /// Mailbox names already logged as undeliverable (at most `LOGGED_NAMES`).
    undeliverable_logged: Mutex<HashSet<Name>>,
    pub undeliverable: AtomicU64,
    local_messages: AtomicU64,
    /// The node's clock origin for the millisecond timestamps of the failure detector.
    started: Instant,
    /// Set once the writers are joined at shutdown: the ticker stops then.
    ticker_stop: AtomicBool,
}

impl Shared {
    /// True once the writers have finished at shutdown: the ticker, the dialers and the
    /// acceptor stop then (until then a broken connection may come back to flush).
    pub fn ticker_should_stop(&self) -> bool {
        self.ticker_stop.load(Ordering::Acquire)
    }

    /// Milliseconds since the node started.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// When shutdown gives up on unsent messages, if shutting down.
    pub fn shutdown_deadline(&self) -> Option<Instant> {
        self.shutdown_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t + self.config.shutdown_timeout)
    }

    /// Sleep `d`, or less if the node stops. Returns false if the node is stopping.
    pub fn sleep(&self, d: Duration) -> bool {
        let g = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .stop_cv
            .wait_timeout_while(g, d, |stop| !*stop)
            .unwrap_or_else(|p| p.into_inner());
        !*g
    }

    /// Hand an event to the subscriber, never waiting: when its queue is full the event is
    /// dropped and counted, and the subscriber gets one `EventsDropped` with the count as
    /// soon as there is room again.
    pub fn emit(&self, e: Event) {
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sink) = g.as_mut() else { return };
        if sink.missed > 0 {
            match sink
                .tx
                .try_send(Event::EventsDropped { count: sink.missed })
            {
                Ok(()) => sink.missed = 0,
                Err(mpsc::TrySendError::Full(_)) => {}
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    *g = None;
                    return;
                }
            }
        }
        let full = if sink.missed > 0 {
            true
        } else {
            match sink.tx.try_send(e) {
                Ok(()) => false,
                Err(mpsc::TrySendError::Full(_)) => true,
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    *g = None;
                    return;
                }
            }
        };
        if full {
            sink.missed += 1;
            self.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Start a thread running `f`. Handles of threads that have ended are dropped here (their
    /// resources are freed), so a node that accepts connections for years holds handles
    /// only for the threads that still run; `shutdown` joins those.
    pub fn spawn(
        self: &Arc<Self>,
        what: String,
        f: impl FnOnce(Arc<Shared>) + Send + 'static,
    ) -> std::io::Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name(what)
            .spawn(move || f(me))?;
        let mut g = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|h| !h.is_finished());
        g.push(h);
        Ok(())
    }

    /// Threads started with `spawn` that have not ended yet (or ended since the last spawn).
    pub fn threads(&self) -> usize {
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| !h.is_finished())
            .count()
    }

    pub fn peer(&self, name: &[u8]) -> Option<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The peer called `name`, created (with its writer) if it connected without being in
    /// our static list. `None` if the node already has `max_peers` peers or no writer
    /// thread could be started.
    pub fn peer_or_insert(self: &Arc<Self>, name: &Name) -> Option<Arc<Peer>> {
        if let Some(p) = self.peer(name.as_bytes()) {
            return Some(p);
        }
        let mut g = self.peers.write().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = g.get(name.as_bytes()) {
            return Some(p.clone());
        }
        if g.len() >= self.config.max_peers {
            warn!(node = %self.name, peer = %name, max = self.config.max_peers, "a peer not in the static list connected, but the node has max_peers peers; closing");
            return None;
        }
        info!(node = %self.name, peer = %name, "peer not in the static list connected; adding it");
        match self.add_peer(&mut g, name.clone()) {
            Ok(p) => Some(p),
            Err(e) => {
                warn!(node = %self.name, peer = %name, error = %e, "cannot start a writer thread for a new peer; closing");
                None
            }
        }
    }

    /// Create a peer (and, with a per-peer bundler, its lane and writer thread).
    fn add_peer(
        self: &Arc<Self>,
        map: &mut HashMap<Name, Arc<Peer>, NameHash>,
        name: Name,
    ) -> std::io::Result<Arc<Peer>> {
        let mut by_id = self.by_id.write().unwrap_or_else(|p| p.into_inner());
        let lane = match &self.shared_lane {
            Some(l) => l.clone(),
            None => {
                let b = self.config.bundler.build();
                let lane = Arc::new(Lane::new(
                    self.config.send_queue_bytes,
                    b.as_ref(),
                    self.config.frame_bytes,
                    self.idle,
                ));
                self.spawn_writer(lane.clone(), LaneMembers::One(by_id.len() as Dest))?;
                lane
            }
        };
        let p = Arc::new(Peer {
            id: by_id.len() as Dest,
            name: name.clone(),
            lane,
            link: Mutex::new(None),
            stats: PeerCounters::default(),
            send: Mutex::new(SendWindow::default()),
            recv: Mutex::new(RecvWindow::default()),
            incarnation: Mutex::new(None),
            state: AtomicU8::new(PeerState::Connecting as u8),
            last_read: AtomicU64::new(0),
            last_write: AtomicU64::new(0),
            disconnected_at: AtomicU64::new(0),
            notices: Mutex::new(Notices::default()),
        });
        by_id.push(p.clone());
        map.insert(name, p.clone());
        Ok(p)
    }

    /// Start the writer thread of a lane.
    fn spawn_writer(
        self: &Arc<Self>,
        lane: Arc<Lane>,
        members: LaneMembers,
    ) -> std::io::Result<()> {
        let (me, l) = (self.clone(), lane.clone());
        let name = match members {
            LaneMembers::One(id) => format!("bw-write-{}-{id}", self.name),
            LaneMembers::All => format!("bw-write-{}", self.name),
        };
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || crate::io::writer::run_writer(&me, &l, members))?;
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((lane, Some(h)));
        Ok(())
    }

    /// Close every lane (no new messages) and join its writer, which flushes it first. A
    /// writer stuck in a write to a peer that stopped reading is freed by closing the
    /// connections once `shutdown_timeout` (and a grace second) has passed.
    fn join_writers(&self) {
        let deadline = Instant::now() + self.config.shutdown_timeout + Duration::from_secs(1);
        loop {
            let lanes: Vec<_> = self
                .lanes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter_mut()
                .filter_map(|(l, h)| h.take().map(|h| (l.clone(), h)))
                .collect();
            if lanes.is_empty() {
                return;
            }
            for (l, _) in &lanes {
                l.close();
            }
            while lanes.iter().any(|(_, h)| !h.is_finished()) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if Instant::now() >= deadline {
                for p in self.all_peers() {
                    if let Some(c) = p.current() {
                        c.close();
                    }
                }
            }
            for (_, h) in lanes {
                let _ = h.join();
            }
        }
    }

    /// Writer threads still running.
    pub fn writers(&self) -> usize {
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, h)| h.as_ref().is_some_and(|h| !h.is_finished()))
            .count()
    }

    pub fn peer_by_id(&self, id: Dest) -> Option<Arc<Peer>> {
        self.by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id as usize)
            .cloned()
    }

    /// Every peer, in id order.
    pub fn all_peers(&self) -> Vec<Arc<Peer>> {
        self.by_id.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn mailbox(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        self.mailboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub fn unregister(&self, q: &Arc<MailboxQueue>) {
        let mut g = self.mailboxes.write().unwrap_or_else(|p| p.into_inner());
        if g.get(&q.name).is_some_and(|m| Arc::ptr_eq(m, q)) {
            g.remove(&q.name);
        }
        drop(g);
        q.close();
        let left = q.len();
        if left > 0 && !self.is_shutting_down() {
            warn!(node = %self.name, mailbox = %q.name, left, "mailbox dropped with unreceived messages");
        }
    }

    /// Count, log (once per mailbox name, for the first `LOGGED_NAMES` names) and report
    /// back undeliverable messages.
    pub fn undeliverable(&self, from_peer: Option<&Arc<Peer>>, to: &Name, from: &Name, count: u32) {
        self.undeliverable
            .fetch_add(count as u64, Ordering::Relaxed);
        let sender = from_peer
            .map(|p| p.name.as_str())
            .unwrap_or(self.name.as_str());
        {
            let mut logged = self
                .undeliverable_logged
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if logged.len() < LOGGED_NAMES {
                if logged.insert(to.clone()) {
                    warn!(node = %self.name, mailbox = %to, from_node = sender, "message for a mailbox that does not exist here; reporting it to the sender as undeliverable (logged once per name)");
                }
                if logged.len() == LOGGED_NAMES {
                    warn!(node = %self.name, names = LOGGED_NAMES, "undeliverable messages for so many mailbox names that further names are no longer logged; they are still counted and reported to their senders");
                }
            }
        }
        match from_peer {
            Some(p) => p.report_undeliverable(to, from, count),
            None => self.emit(Event::Undeliverable {
                to: Address {
                    node: self.name.clone(),
                    mailbox: to.clone(),
                },
                from: from.to_string(),
                count: count as u64,
            }),
        }
    }

    pub fn send(
        &self,
        from: &Name,
        to: &Address,
        payload: Bytes,
        block: bool,
    ) -> Result<(), Error> {
        if payload.len() > self.config.max_payload {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if self.is_shutting_down() {
            return Err(Error::ShutDown {
                payload: Some(payload),
            });
        }
        if to.node == self.name {
            return self.deliver_local(from, &to.mailbox, payload, block);
        }
        // Try without blocking under the read lock (no reference count touched); only a
        // sender that must wait for room takes a reference to the peer and waits outside it.
        let peer = {
            let g = self.peers.read().unwrap_or_else(|p| p.into_inner());
            let Some(peer) = g.get(to.node.as_bytes()) else {
                return Err(Error::UnknownNode(to.node.to_string()));
            };
            if peer.state() == PeerState::Down {
                return Err(Error::PeerDown(to.node.to_string()));
            }
            match peer.lane.push(peer.id, &to.mailbox, from, &payload, false) {
                Ok(()) => return Ok(()),
                Err(PushError::Full) if block => peer.clone(),
                Err(e) => return Err(self.push_error(e, to, payload)),
            }
        };
        peer.lane
            .push(peer.id, &to.mailbox, from, &payload, true)
            .map_err(|e| self.push_error(e, to, payload))
    }

    fn push_error(&self, e: PushError, to: &Address, payload: Bytes) -> Error {
        match e {
            PushError::Full => Error::Full {
                to: to.to_string(),
                payload,
            },
            PushError::Closed => Error::ShutDown {
                payload: Some(payload),
            },
        }
    }

    fn deliver_local(
        &self,
        from: &Name,
        to: &Name,
        payload: Bytes,
        block: bool,
    ) -> Result<(), Error> {
        let Some(mb) = self.mailbox(to.as_bytes()) else {
            self.undeliverable(None, to, from, 1);
            return Ok(());
        };
        let e = Envelope {
            from: Address {
                node: self.name.clone(),
                mailbox: from.clone(),
            },
            payload,
        };
        match mb.push_one(e, block) {
            Ok(()) => {
                self.local_messages.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if self.is_shutting_down() => Err(Error::ShutDown {
                payload: Some(e.payload),
            }),
            Err(e) if !block => Err(Error::Full {
                to: format!("{to}@{}", self.name),
                payload: e.payload,
            }),
            // The mailbox was dropped while we waited for room.
            Err(_) => {
                self.undeliverable(None, to, from, 1);
                Ok(())
            }
        }
    }

    pub fn send_all(
        &self,
        from: &Name,
        mailbox: &str,
        payload: Bytes,
        include_self: bool,
    ) -> Result<(), Error> {
        let mb = Name::new(mailbox)
            .ok_or_else(|| Error::InvalidName(mailbox.into(), "longer than 255 bytes"))?;
        if payload.len() > self.config.max_payload {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if include_self {
            self.deliver_local(from, &mb, payload.clone(), true)?;
        }
        let to = |node: &Name| Address {
            node: node.clone(),
            mailbox: mb.clone(),
        };
        if let Some(lane) = &self.shared_lane {
            // One queue for everyone: one message to the null destination, written to
            // every member (JGroups' dest == null).
            return lane
                .push(ALL, &mb, from, &payload, true)
                .map_err(|e| self.push_error(e, &to(&self.name), payload));
        }
        for peer in self.all_peers() {
            peer.lane
                .push(peer.id, &mb, from, &payload, true)
                .map_err(|e| self.push_error(e, &to(&peer.name), payload.clone()))?;
        }
        Ok(())
    }
}

/// The current event subscriber: a bounded queue, and how many events it missed since it
/// last had room.
pub(crate) struct EventSink {
    tx: mpsc::SyncSender<Event>,
    missed: u64,
}

/// A lane and its writer thread (taken when joined).
type LaneThread = (Arc<Lane>, Option<JoinHandle<()>>);

/// Which peers a lane's writer serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneMembers {
    One(Dest),
    All,
}

/// FNV-1a: node and mailbox names are short, and SipHash showed up in profiles of the send
/// path. The maps are keyed by names we chose or authenticated peers sent, not by
/// attacker-controlled keys in bulk.
#[derive(Default, Clone, Copy)]
pub(crate) struct NameHash;

impl std::hash::BuildHasher for NameHash {
    type Hasher = Fnv;
    fn build_hasher(&self) -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

pub(crate) struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// A running batchwire node. Dropping it shuts it down (see [`Node::shutdown`]).
pub struct Node {
    shared: Arc<Shared>,
    anonymous: Name,
}

impl Node {
    /// Start a node: bind the listen address, start connecting to peers, return at once.
    pub fn start(config: NodeConfig) -> Result<Node, Error> {
        config.validate()?;
        let name = node_name(&config.name)?;
        let mut peer_names = Vec::new();
        for p in &config.peers {
            let pn = node_name(&p.name)?;
            if pn == name {
                return Err(Error::Config(format!("node {name} lists itself as a peer")));
            }
            if peer_names.contains(&pn) {
                return Err(Error::Config(format!("peer {pn} is listed twice")));
            }
            peer_names.push(pn);
        }
        let declared = config
            .mailboxes
            .iter()
            .map(|m| node_name(m))
            .collect::<Result<Vec<_>, _>>()?;
        let idle = IdleStrategy::from_level(config.idle_cpu_level).map_err(Error::Config)?;
        let tls = match &config.tls {
            Some(files) => Some(crate::io::tls::TlsConfigs::load(files, &config.name)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen).map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        let local_addr = listener.local_addr()?;
        let mut inc = [0u8; 8];
        getrandom::fill(&mut inc).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
        let shared_lane = config.bundler.kind.shared_queue().then(|| {
            let b = config.bundler.build();
            Arc::new(Lane::new(
                config.send_queue_bytes,
                b.as_ref(),
                config.frame_bytes,
                idle,
            ))
        });
        let dials: Arc<[Name]> = peer_names
            .iter()
            .filter(|p| name.as_str() < p.as_str())
            .cloned()
            .collect();
        let shared = Arc::new(Shared {
            name,
            incarnation: u64::from_le_bytes(inc),
            secret: config.secret.clone().into(),
            local_addr,
            idle,
            tls,
            dials,
            handshakes: Mutex::new(HashMap::new()),
            security: SecurityCounters::default(),
            peers: RwLock::new(HashMap::default()),
            by_id: RwLock::new(Vec::new()),
            lanes: Mutex::new(Vec::new()),
            shared_lane,
            mailboxes: RwLock::new(HashMap::default()),
            shutting_down: AtomicBool::new(false),
            shutdown_at: Mutex::new(None),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            events: Mutex::new(None),
            events_dropped: AtomicU64::new(0),
            undeliverable_logged: Mutex::new(HashSet::new()),
            undeliverable: AtomicU64::new(0),
            local_messages: AtomicU64::new(0),
            started: Instant::now(),
            ticker_stop: AtomicBool::new(false),
            config,
        });
        if let Some(l) = &shared.shared_lane {
            shared.spawn_writer(l.clone(), LaneMembers::All)?;
        }
        {
            let mut g = shared.mailboxes.write().unwrap_or_else(|p| p.into_inner());
            for n in declared {
                let q = MailboxQueue::new(n.clone(), shared.config.mailbox_bytes, idle);
                g.insert(n, Arc::new(q));
            }
        }
        {
            let mut g = shared.peers.write().unwrap_or_else(|p| p.into_inner());
            for pn in peer_names {
                shared.add_peer(&mut g, pn)?;
            }
        }
        info!(node = %shared.name, addr = %local_addr, bundler = %shared.config.bundler.kind, "node started");
        shared.spawn(format!("bw-tick-{}", shared.name), move |s| {
            crate::io::detector::run_ticker(&s)
        })?;
        shared.spawn(format!("bw-accept-{}", shared.name), move |s| {
            connection::run_acceptor(&s, listener)
        })?;
        let specs = shared.config.peers.clone();
        for spec in specs {
            let peer = shared.peer(spec.name.as_bytes()).expect("inserted above");
            if shared.name.as_str() < spec.name.as_str() {
                shared.spawn(format!("bw-dial-{}", spec.name), move |s| {
                    connection::run_dialer(&s, &peer, spec.addr)
                })?;
            } else {
                debug!(node = %shared.name, peer = %spec.name, "waiting for the peer to dial (the name that sorts first dials)");
            }
        }
        Ok(Node {
            shared,
            anonymous: Name::from_static(""),
        })
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        self.shared.name.as_str()
    }

    /// The address the node listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Register a mailbox named `name` on this node, or take the handle of one declared in
    /// the config ([`NodeConfig::mailbox`]), with whatever arrived in it meanwhile.
    pub fn mailbox(&self, name: &str) -> Result<Mailbox, Error> {
        let n = node_name(name)?;
        let mut g = self
            .shared
            .mailboxes
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let q = g
            .entry(n.clone())
            .or_insert_with(|| {
                Arc::new(MailboxQueue::new(
                    n,
                    self.shared.config.mailbox_bytes,
                    self.shared.idle,
                ))
            })
            .clone();
        if q.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::MailboxExists(name.into()));
        }
        Ok(Mailbox {
            queue: q,
            node: self.shared.clone(),
        })
    }

    /// Send `payload` to `to` (from the anonymous sender ""). Blocks while the queue toward
    /// that node is full. Messages from one thread to one mailbox arrive in order.
    pub fn send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.shared.send(&self.anonymous, to, payload.into(), true)
    }

    /// Like [`Node::send`], but returns [`Error::Full`] (with the payload) instead of blocking.
    pub fn try_send(&self, to: &Address, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.shared.send(&self.anonymous, to, payload.into(), false)
    }

    /// Send to mailbox `mailbox` on every member, **this node included** (JGroups' null
    /// destination). See [`Node::send_others`] to leave this node out.
    pub fn send_all(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.shared
            .send_all(&self.anonymous, mailbox, payload.into(), true)
    }

    /// Send to mailbox `mailbox` on every member except this node.
    pub fn send_others(&self, mailbox: &str, payload: impl Into<Bytes>) -> Result<(), Error> {
        self.shared
            .send_all(&self.anonymous, mailbox, payload.into(), false)
    }

    /// Send a value serialized with postcard; decode it with [`Envelope::value`].
    pub fn send_value<T: serde::Serialize>(&self, to: &Address, value: &T) -> Result<(), Error> {
        let bytes = postcard::to_allocvec(value).map_err(|e| Error::Encode(e.to_string()))?;
        self.send(to, bytes)
    }

    /// Subscribe to events (peer up/down, handshake failures, undeliverable reports).
    /// Only the latest subscriber receives them; before anyone subscribes they are only
    /// logged and counted. The queue holds `NodeConfig::events_capacity` events: the node
    /// never waits for a subscriber, so one that falls behind loses events and is told how
    /// many (`Event::EventsDropped`).
    pub fn events(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::sync_channel(self.shared.config.events_capacity);
        *self.shared.events.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(EventSink { tx, missed: 0 });
        rx
    }

    /// Threads this node runs now (acceptor, ticker, dialers, writers, one per connection
    /// or handshake in progress). Threads that ended are not counted.
    pub fn threads(&self) -> usize {
        self.shared.threads() + self.shared.writers()
    }

    /// Names of the peers with a live connection.
    pub fn connected_peers(&self) -> Vec<String> {
        let g = self.shared.peers.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<String> = g
            .values()
            .filter(|p| p.current().is_some())
            .map(|p| p.name.to_string())
            .collect();
        v.sort();
        v
    }

    /// Wait until every named peer is connected, up to `timeout`. Returns whether they are.
    pub fn wait_for_peers(&self, peers: &[&str], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let up = self.connected_peers();
            if peers.iter().all(|p| up.iter().any(|u| u == p)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Close every connection now, as a network failure would (for chaos testing: see
    /// `batchwire bench throughput --break-every`). They reconnect and resume; nothing
    /// accepted by `send` is lost or delivered twice. Returns how many were closed.
    pub fn break_connections(&self) -> usize {
        let mut n = 0;
        for p in self.shared.all_peers() {
            if let Some(c) = p.current() {
                c.close();
                n += 1;
            }
        }
        n
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> NodeStats {
        let g = self.shared.peers.read().unwrap_or_else(|p| p.into_inner());
        let mut peers: Vec<_> = g
            .values()
            .map(|p| {
                let mut s = p.stats.snapshot(p.name.to_string(), p.current().is_some());
                s.queue_high_water = p.lane.high_water.load(Ordering::Relaxed);
                s.blocked_us = p.lane.blocked_ns.load(Ordering::Relaxed) / 1000;
                s.queued = p.lane.queued() as u64;
                s.unacked_bytes = p.send.lock().unwrap_or_else(|e| e.into_inner()).bytes() as u64;
                s
            })
            .collect();
        peers.sort_by(|a, b| a.peer.cmp(&b.peer));
        NodeStats {
            node: self.name().to_string(),
            peers,
            undeliverable: self.shared.undeliverable.load(Ordering::Relaxed),
            local_messages: self.shared.local_messages.load(Ordering::Relaxed),
            handshakes: self.shared.security.snapshot(),
            events_dropped: self.shared.events_dropped.load(Ordering::Relaxed),
        }
    }

    /// Flush what is queued (up to `shutdown_timeout`), say goodbye to every peer, close
    /// every connection and mailbox, and join every thread the node started. Messages that
    /// could not be written in time are reported as `SendFailed` and logged.
    pub fn shutdown(self) {
        // Drop does the work.
    }

    fn shutdown_inner(&self) {
        let s = &self.shared;
        if s.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        info!(node = %s.name, "shutting down");
        *s.shutdown_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        // 1. Let each writer flush its lane and say goodbye; bound blocked writes in time.
        let peers = s.all_peers();
        for p in &peers {
            if let Some(c) = p.current() {
                let _ = c.link.set_write_timeout(Some(s.config.shutdown_timeout));
            }
        }
        s.join_writers();
        // 3. Only now stop dialling and accepting (a connection that broke during the flush
        //    had to be able to come back), and the ticker: wake sleeping dialers and the
        //    acceptor.
        s.ticker_stop.store(true, Ordering::Release);
        *s.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        s.stop_cv.notify_all();
        let mut wake = s.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        // 4. Give peers a moment to answer our goodbye by closing; then close the rest.
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline && peers.iter().any(|p| p.current().is_some()) {
            std::thread::sleep(Duration::from_millis(2));
        }
        for mb in s
            .mailboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            mb.close();
        }
        for p in &peers {
            if let Some(c) = p.current() {
                c.close();
            }
        }
        // 5. Join everything (threads may still be registering; loop until none are left).
        loop {
            let hs: Vec<_> =
                std::mem::take(&mut *s.threads.lock().unwrap_or_else(|p| p.into_inner()));
            if hs.is_empty() {
                break;
            }
            for h in hs {
                let _ = h.join();
            }
        }
        // Lanes of peers that connected during shutdown (not in the static list).
        for p in s.all_peers() {
            if let Some(c) = p.current() {
                c.close();
            }
        }
        s.join_writers();
        info!(node = %s.name, "shut down");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Node({} on {})",
            self.shared.name, self.shared.local_addr
        )
    }
}
