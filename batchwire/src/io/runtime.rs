//! The node's runtime: its parts, each with one owner, and the routing of sends.
//!
//! | part | owner | who else uses it |
//! | --- | --- | --- |
//! | `Peers` (sessions, lanes, connections) | this runtime | senders (the lane), setup threads (connections), writers (their peer), the ticker (timers) |
//! | `Mailboxes` | this runtime | readers (delivery), the API (receive) |
//! | `Events` | this runtime | anyone who reports; subscribers read |
//! | `Shutdown` | this runtime (one signal) | every thread, to know when to stop |
//! | `Timer` | the ticker | whoever sets an earlier deadline |
//! | `Setup` (secret, TLS, handshake slots) | the acceptor and the dialers | |
//!
//! Threads: one acceptor; one dialer per peer whose name sorts after ours (it also reads
//! its connection); one thread per accepted connection (handshake, then reading); one
//! writer per peer; one ticker; with `transfer-queue`, one bundler. `shutdown` joins them.
//!
//! This file holds the parts; `runtime/` the methods by what they do: `start.rs`,
//! `send.rs` (routing), `requests.rs`, `views.rs` (mailboxes, peers, members, stats) and
//! `stop.rs` (shutdown).

mod requests;
mod send;
mod start;
mod stop;
mod views;

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use batchwire_core::call;
use batchwire_core::codec::Name;
use batchwire_core::idle::IdleStrategy;
use batchwire_core::membership::{MemberId, Membership};
use batchwire_core::outbox::ALL;
use batchwire_core::session::PeerState;
use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::address::{Address, RESERVED_NAME, node_name};
use crate::class::Class;
use crate::config::NodeConfig;
use crate::error::Error;
use crate::event::Event;
use crate::io::bundle::run_bundler;
use crate::io::calls::{Calls, Waiter, run_timer};
use crate::io::datagrams::MemberStats;
use crate::io::datagrams::{DatagramReader, DatagramWaker, Sender};
use crate::io::dial::Dialers;
use crate::io::envelope::{Envelope, Outbound};
use crate::io::events::Events;
use crate::io::join::{run_joiner, system_lookup};
use crate::io::lane::{Lane, LaneCfg, Outgoing, PushError, Pushed};
use crate::io::link::TlsConfigs;
use crate::io::mailbox::{Leader, MailboxQueue, Mailboxes, Refused};
use crate::io::members::Members;
use crate::io::membership::{MembersCtx, run_members};
use crate::io::peer::{ConnWatch, Peer, PeerCtx, ReassemblyBudget};
use crate::io::peers::Peers;
use crate::io::read::Reader;
use crate::io::setup::Setup;
use crate::io::shutdown::Shutdown;
use crate::io::threads::Threads;
use crate::io::tick::run_ticker;
use crate::io::timer::Timer;
use crate::io::wakers::Ticket;
use crate::io::{accept::run_acceptor, idle_strategy};
use crate::stats::{MembershipStats, NodeStats, PeerStats, RequestStats};
use batchwire_core::membership::datagram::DatagramKey;

/// A running node's parts.
pub(crate) struct Runtime {
    pub name: Name,
    pub local_addr: SocketAddr,
    pub config: NodeConfig,
    pub idle: IdleStrategy,
    setup: Arc<Setup>,
    ctx: Arc<PeerCtx>,
    pub peers: Peers,
    pub mailboxes: Mailboxes,
    pub events: Events,
    pub shutdown: Shutdown,
    timer: Timer,
    threads: Threads,
    /// The writers, joined first at shutdown.
    writers: Threads,
    /// With `transfer-queue`: the one queue every peer shares.
    shared_lane: Option<Arc<Lane>>,
    local_messages: AtomicU64,
    /// The membership thread's handle (`None` with membership off).
    members: Option<Members>,
    member_stats: Arc<MemberStats>,
    /// Where members dial this node.
    pub advertise: SocketAddr,
    /// Whether the requests' timer thread was started (with the first async request).
    call_timer: AtomicBool,
    /// With connections on demand, a member gets its peer when something is first sent to
    /// it, not when it joins (see `member_peer`): the view's generation for which every
    /// live member was last given one (`send_all`), plus one (0: never).
    member_peers_for: AtomicU64,
}

/// The address members should dial: the configured one, else the listening one (a
/// wildcard becomes loopback: fine on one host; other hosts need `advertise`).
fn advertise_addr(config: &NodeConfig, local: SocketAddr) -> SocketAddr {
    if let Some(a) = config.advertise {
        return a;
    }
    let mut a = local;
    if a.ip().is_unspecified() {
        let lo: std::net::IpAddr = match a.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        a.set_ip(lo);
        if config.membership.is_some() {
            warn!(node = %config.name, listen = %local, advertised = %a, "listening on a wildcard address without `advertise`: members on other hosts cannot reach this node");
        }
    }
    a
}

impl Runtime {}

/// A receiver waiting on one of this node's mailboxes leads a connection (see
/// `MailboxQueue::lead`).
impl Leader for Runtime {
    /// Not while calls wait for their answers: their callers read (see `ask_for_turn`).
    fn lead_for(
        &self,
        peer: &Name,
        wake: &Arc<std::os::fd::OwnedFd>,
        done: &dyn Fn() -> bool,
        until: Instant,
    ) -> bool {
        let calls = &self.ctx.calls;
        if calls.pending() > 0 {
            return false;
        }
        self.lead_on(peer, &|| done() || calls.pending() > 0, until, Some(wake))
    }
}

impl Outbound for Runtime {
    fn send(
        &self,
        from: &Name,
        to: &Address,
        payload: Bytes,
        class: Class,
        block: bool,
    ) -> Result<(), Error> {
        Runtime::send(self, from, to, payload, class, block)
    }

    fn register(&self, to: &Address, w: &Waker, ticket: &mut Ticket) {
        if to.node == self.name {
            match self.mailboxes.get(to.mailbox.as_bytes()) {
                Some(mb) => mb.register_room(w, ticket),
                // Gone: the next try says so.
                None => w.wake_by_ref(),
            }
            return;
        }
        // Wherever the send may have found no room: the peer's lane (room or credit), its
        // window (transfer-queue) and the shared lane.
        self.peers.with(to.node.as_bytes(), |p| match p {
            Some(p) => {
                p.lane.register_room(w, ticket);
                p.register_room(w, ticket);
            }
            None => w.wake_by_ref(),
        });
        if let Some(l) = &self.shared_lane {
            l.register_room(w, ticket);
        }
    }
}

thread_local! {
    /// The mailbox name this thread last sent to with `send_all`, which takes a `&str`.
    static ALL_TO: std::cell::RefCell<Option<Name>> = const { std::cell::RefCell::new(None) };
}

/// `Name::new(mailbox)`, made once per thread and name rather than once per `send_all`: a
/// name made anew is read back in words while its bytes are still being stored, and each
/// such read waits for them (a failed store-to-load forward). Compared with the last one,
/// then a 32-byte copy. A thread whose thread-locals are being destroyed (a `send_all`
/// from some `Drop`) makes it anew and keeps nothing.
fn all_to(mailbox: &str) -> Option<Name> {
    let same = |n: &&Name| batchwire_core::codec::bytes_eq(n.as_bytes(), mailbox.as_bytes());
    let hit = ALL_TO
        .try_with(|last| last.borrow().as_ref().filter(same).cloned())
        .ok()
        .flatten();
    if hit.is_some() {
        return hit;
    }
    let n = Name::new(mailbox)?;
    let _ = ALL_TO.try_with(|last| *last.borrow_mut() = Some(n.clone()));
    Some(n)
}

#[cfg(test)]
mod tests;
