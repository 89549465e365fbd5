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

impl Runtime {
    /// Bind, start every thread, return at once.
    pub fn start(config: NodeConfig) -> Result<Arc<Runtime>, Error> {
        config.validate()?;
        let name = node_name(&config.name)?;
        let mut peer_names: Vec<(Name, SocketAddr)> = Vec::new();
        for p in &config.peers {
            let pn = node_name(&p.name)?;
            if pn == name {
                return Err(Error::Config(format!("node {name} lists itself as a peer")));
            }
            if peer_names.iter().any(|(n, _)| *n == pn) {
                return Err(Error::Config(format!("peer {pn} is listed twice")));
            }
            peer_names.push((pn, p.addr));
        }
        let declared = config
            .mailboxes
            .iter()
            .map(|m| node_name(m))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = match &config.tls {
            Some(files) => Some(TlsConfigs::load(files, &config.name)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen).map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        let local_addr = listener.local_addr()?;
        // Membership datagrams on the same address and port number, over UDP.
        let udp = match &config.membership {
            Some(_) => Some(UdpSocket::bind(local_addr).map_err(|source| Error::Listen {
                addr: local_addr,
                source,
            })?),
            None => None,
        };
        // The incarnation is the start time in microseconds: a node restarted under the
        // same name has a later one, which the membership lets win over the old.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64)
            .max(1);
        let advertise = advertise_addr(&config, local_addr);

        let (shutdown, timer, threads, writers) = (
            Shutdown::default(),
            Timer::new(),
            Threads::default(),
            Threads::default(),
        );
        let events = Events::new(config.events_capacity);
        let idle = idle_strategy(&config);
        // Call ids start anywhere, so a restarted node's ids are not its predecessor's.
        let mut first_id = [0u8; 8];
        getrandom::fill(&mut first_id)
            .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
        let ctx = Arc::new(PeerCtx {
            node: name.clone(),
            events: events.clone(),
            timer: timer.clone(),
            conns: ConnWatch::default(),
            calls: Arc::new(Calls::new(
                config.max_pending_requests,
                u64::from_le_bytes(first_id),
            )),
            reassembly: ReassemblyBudget::new(config.reassembly_limit()),
            hooks: std::sync::OnceLock::new(),
        });
        let shared = config.bundler.kind.shared_queue();
        let shared_lane = shared.then(|| {
            let b = config.bundler.build();
            Arc::new(Lane::new(LaneCfg::new(&config, false), b.as_ref()))
        });
        let shared_done = shared.then(|| Arc::new(AtomicBool::new(false)));
        let peers = Peers::new(
            ctx.clone(),
            config.clone(),
            writers.clone(),
            shutdown.clone(),
            shared_done.clone(),
        );
        let mailboxes = Mailboxes::default();
        for n in declared {
            mailboxes.get_or_insert(&n, || {
                MailboxQueue::new(n.clone(), config.mailbox_bytes, idle)
            });
        }
        let (members, members_rx) = match &config.membership {
            Some(_) => {
                let (m, rx) = Members::new();
                (Some(m), Some(rx))
            }
            None => (None, None),
        };
        let dials: Arc<[Name]> = peer_names
            .iter()
            .filter(|(p, _)| name.as_str() < p.as_str())
            .map(|(p, _)| p.clone())
            .collect();
        let setup = Arc::new(Setup::new(
            name.clone(),
            incarnation,
            tls,
            dials,
            config.clone(),
            peers.clone(),
            mailboxes.clone(),
            events.clone(),
            shutdown.clone(),
            shared_lane.clone(),
            members.clone(),
            peer_names.clone(),
        ));
        let dialers = Dialers::new(
            setup.clone(),
            threads.clone(),
            peer_names.iter().map(|(n, _)| n.clone()).collect(),
            config.on_demand(),
        );
        let weak = dialers.downgrade();
        let _ = ctx.hooks.set(crate::io::peer::Hooks {
            spawn_writer: Box::new(peers.writer_spawner()),
            dial: config
                .on_demand()
                .then(|| Box::new(move |n: &Name| crate::io::dial::want(&weak, n)) as _),
        });
        let member_stats = Arc::new(MemberStats::default());
        for (pn, _) in &peer_names {
            peers
                .get_or_insert(pn)
                .map_err(|e| Error::Config(format!("peer {pn}: {e:?}")))?
                .pinned
                .store(true, Ordering::Release);
        }
        let rt = Arc::new(Runtime {
            name: name.clone(),
            local_addr,
            idle,
            setup: setup.clone(),
            ctx,
            peers: peers.clone(),
            mailboxes,
            events,
            shutdown: shutdown.clone(),
            timer: timer.clone(),
            threads: threads.clone(),
            writers,
            shared_lane: shared_lane.clone(),
            local_messages: AtomicU64::new(0),
            members: members.clone(),
            member_stats: member_stats.clone(),
            advertise,
            config,
            call_timer: AtomicBool::new(false),
            member_peers_for: AtomicU64::new(0),
        });
        info!(
            node = %name,
            addr = %local_addr,
            bundler = %rt.config.bundler.kind,
            tls = rt.config.tls.is_some(),
            membership = rt.config.membership.is_some(),
            peers = rt.config.peers.len(),
            "node started"
        );
        let (p, t, s) = (peers.clone(), timer, shutdown);
        threads.spawn(format!("bw-tick-{name}"), move || run_ticker(p, t, s))?;
        let (st, th) = (setup.clone(), threads.clone());
        threads.spawn(format!("bw-accept-{name}"), move || {
            run_acceptor(listener, st, th)
        })?;
        if let (Some(lane), Some(done)) = (shared_lane, shared_done) {
            let (p, b) = (peers, rt.config.bundler);
            threads.spawn(format!("bw-bundle-{name}"), move || {
                run_bundler(lane, p, b, done)
            })?;
        }
        for (pn, addr) in &peer_names {
            if name.as_str() < pn.as_str() {
                dialers.ensure(pn, *addr, 0);
            } else {
                debug!(node = %name, peer = %pn, "waiting for the peer to dial (the name that sorts first dials)");
            }
        }
        if let (Some(cfg), Some(m), Some(rx)) = (&rt.config.membership, members, members_rx) {
            let me = MemberId {
                name: name.clone(),
                addr: advertise,
                started: incarnation,
                bump: 0,
            };
            let mut seed = [0u8; 8];
            getrandom::fill(&mut seed)
                .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
            let machine =
                Membership::new(me, cfg.clone(), u64::from_le_bytes(seed), Instant::now())
                    .map_err(|e| Error::Config(e.to_string()))?;
            let udp = udp.expect("bound with membership on");
            let key = DatagramKey::from_secret(&rt.config.secret);
            let sender = Sender::new(
                udp.try_clone()?,
                &key,
                name.clone(),
                incarnation,
                member_stats.clone(),
            );
            // Other threads wake the membership thread with an empty datagram from its
            // own socket; without that (no descriptor to spare) it still looks at its
            // inbox every `IDLE` and at every datagram.
            let waker = match DatagramWaker::new(&udp, local_addr) {
                Ok(w) => {
                    let from = w.addr();
                    m.set_waker(w);
                    Some(from)
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "membership: no wake-up socket; inputs wait up to a second");
                    None
                }
            };
            let reader = DatagramReader::new(
                udp,
                key,
                name.clone(),
                member_stats.clone(),
                cfg.max_members.saturating_mul(2),
                waker,
            )?;
            let ctx = MembersCtx {
                udp: std::cell::RefCell::new(sender),
                members: m.clone(),
                peers: rt.peers.clone(),
                dialers,
                events: rt.events.clone(),
                shutdown: rt.shutdown.clone(),
                node: name.clone(),
                counters: member_stats,
                swept: std::cell::Cell::new(None),
                forgotten: Default::default(),
            };
            threads.spawn(format!("bw-members-{name}"), move || {
                run_members(machine, rx, reader, ctx)
            })?;
            // Seeds that are this node itself are skipped (a shared seed list is fine).
            if !rt.config.seeds.is_empty() {
                let st = setup.clone();
                let seeds = rt.config.seeds.clone();
                let skip = vec![advertise, local_addr];
                let th = threads.clone();
                threads.spawn(format!("bw-join-{name}"), move || {
                    run_joiner(st, m, th, seeds, skip, system_lookup())
                })?;
            }
        }
        Ok(rt)
    }

    /// Send `payload` to `to` from our mailbox `from`, in `class`; with `block`, wait for
    /// room and credit.
    pub fn send(
        &self,
        from: &Name,
        to: &Address,
        payload: Bytes,
        class: Class,
        block: bool,
    ) -> Result<(), Error> {
        self.check(&payload)?;
        let bulk = class == Class::Bulk;
        // Try without blocking; only a sender that must wait takes a reference and waits
        // outside the lookup.
        let first = |peer: &Arc<Peer>| -> Result<Option<Arc<Peer>>, Error> {
            if peer.state() == PeerState::Down {
                // On demand: dial once anyway, to learn it is back.
                peer.want_connection(true);
                return Err(Error::PeerDown(to.node.to_string()));
            }
            let m = Outgoing {
                dest: peer.id,
                to: &to.mailbox,
                from,
                payload: &payload,
                bulk,
            };
            match self.push_to(peer, m, false) {
                Ok(()) => Ok(None),
                Err(PushError::Full) if block => Ok(Some(peer.clone())),
                Err(PushError::Down) => Err(Error::PeerDown(to.node.to_string())),
                Err(e) => Err(self.push_error(e, to, payload.clone())),
            }
        };
        // The peer this thread sent to last, if this address names it (no hashing, and no
        // comparison with this node's own name: only a name past that check is
        // remembered), else the lookup, which remembers it.
        let waiting = match self.peers.last_found(to.node.as_bytes()) {
            Some(peer) => first(peer)?,
            None => {
                if to.node == self.name {
                    return self.deliver_local(from, &to.mailbox, payload, block);
                }
                let found = self
                    .peers
                    .with_remembered(to.node.as_bytes(), true, |peer| peer.map(first));
                match found {
                    Some(r) => r?,
                    // A live member that nothing was sent to yet: its peer now.
                    None => match self.member_peer(&to.node) {
                        Some(peer) => first(&peer)?,
                        None => return Err(Error::UnknownNode(to.node.to_string())),
                    },
                }
            }
        };
        let Some(peer) = waiting else {
            return Ok(());
        };
        let m = Outgoing {
            dest: peer.id,
            to: &to.mailbox,
            from,
            payload: &payload,
            bulk,
        };
        self.push_to(&peer, m, true).map_err(|e| match e {
            PushError::Down => Error::PeerDown(to.node.to_string()),
            PushError::Closed if !self.shutdown.is_shutting_down() => {
                Error::PeerDown(to.node.to_string())
            }
            e => self.push_error(e, to, payload.clone()),
        })
    }

    /// With connections on demand, the peer of member `name` if it is live in the view:
    /// made now if nothing was sent to it yet. A member costs no peer (no lane, window,
    /// session or queues) until something is sent to it or it connects: at a thousand
    /// members joining at once, making one per member as each joined was half of what a
    /// node did (1000 node processes converged in 28-31 s without it, 55 s with it,
    /// alternating on 2 vCPUs). Its dialer knows its address from the join.
    fn member_peer(&self, name: &Name) -> Option<Arc<Peer>> {
        let members = self.members.as_ref()?;
        if !self.config.on_demand() || !members.is_live(name.as_str()) {
            return None;
        }
        self.peers.get_or_insert_learnt(name).ok()
    }

    /// With connections on demand, a peer for every live member (what `send_all` and
    /// `send_others` reach): made once per change of the view.
    fn member_peers(&self) {
        let Some(members) = self.members.as_ref().filter(|_| self.config.on_demand()) else {
            return;
        };
        let g = members.generation() + 1;
        if self.member_peers_for.load(Ordering::Acquire) == g {
            return;
        }
        for name in members.live_names() {
            if self.peers.get(name.as_bytes()).is_none() {
                let _ = self.peers.get_or_insert_learnt(&name);
            }
        }
        self.member_peers_for.store(g, Ordering::Release);
    }

    /// Queue `m` toward `peer`: in its own lane, or (transfer-queue, ordinary) in the shared
    /// one after charging the peer's credit. With `block`, wait for room and credit.
    fn push_to(&self, peer: &Peer, m: Outgoing, block: bool) -> Result<(), PushError> {
        let r = self.push_inner(peer, m, block);
        // Its writer runs and a connection is on its way (see `peer::demand`).
        peer.after_push();
        r
    }

    fn push_inner(&self, peer: &Peer, m: Outgoing, block: bool) -> Result<(), PushError> {
        let Some(shared) = self
            .shared_lane
            .as_ref()
            .filter(|_| !peer.lane.bulk_by_itself(&m))
        else {
            // The writer is parked and the lane was quiet: write it from here (no thread
            // hand-off when there is nothing to bundle).
            let may_write = || !peer.window_full() && !crate::io::mailbox::serving_backlog();
            if peer.lane.push_direct(m, block, may_write)? == Pushed::Direct {
                crate::io::write::write_through(peer, &self.shutdown);
            }
            return Ok(());
        };
        // Transfer-queue: the sender waits at the door of a peer whose window is full, so
        // the shared queue never holds what only that peer could take.
        if peer.window_full() {
            if !block {
                return Err(PushError::Full);
            }
            if !peer.wait_room(&|| self.shutdown.is_shutting_down()) {
                return Err(PushError::Closed);
            }
        }
        // Behind a bulk message of its pair, it waits in the peer's bulk queue.
        let Some(charge) = peer.lane.charge_unless_bulk(&m, block)? else {
            return peer.lane.push(m, block);
        };
        shared
            .push(m, block)
            .inspect_err(|_| peer.lane.refund(m.to, charge))
    }

    /// Send to mailbox `mailbox` on every peer (and this node if `include_self`).
    pub fn send_all(
        &self,
        from: &Name,
        mailbox: &str,
        payload: Bytes,
        include_self: bool,
    ) -> Result<(), Error> {
        let mb = all_to(mailbox)
            .ok_or_else(|| Error::InvalidName(mailbox.into(), "longer than 255 bytes"))?;
        self.check(&payload)?;
        if include_self {
            self.deliver_local(from, &mb, payload.clone(), true)?;
        }
        self.member_peers();
        let to = |node: &Name| Address::from_names(node.clone(), mb.clone());
        let m = |p: &Peer| Outgoing {
            dest: p.id,
            to: &mb,
            from,
            payload: &payload,
            bulk: false,
        };
        if let Some(lane) = &self.shared_lane {
            let peers = self.peers.all();
            if peers.is_empty() {
                return Ok(());
            }
            if !peers.iter().any(|p| p.lane.routes_to_bulk(&m(p))) {
                return self.send_all_shared(lane, &peers, m(&peers[0]), &mb, &payload);
            }
        }
        let sent = self.peers.for_each(|p| {
            if p.state() == PeerState::Down {
                return ControlFlow::Continue(());
            }
            match self.push_to(p, m(p), true) {
                // Went down meanwhile: like the peers skipped above.
                Ok(()) | Err(PushError::Down) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(self.push_error(e, &to(&p.name), payload.clone())),
            }
        });
        match sent {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(e) => Err(e),
        }
    }

    /// Transfer-queue: one message to the null destination, written to every member
    /// (JGroups' dest == null), after charging every peer's credit; it waits for every peer
    /// whose window is full.
    fn send_all_shared(
        &self,
        lane: &Lane,
        peers: &[Arc<Peer>],
        m: Outgoing,
        mb: &Name,
        payload: &Bytes,
    ) -> Result<(), Error> {
        let stopping = || self.shutdown.is_shutting_down();
        let shut = || Error::ShutDown {
            payload: Some(payload.clone()),
        };
        let mut charged = Vec::with_capacity(peers.len());
        let refund = |charged: &[(&Arc<Peer>, u64)]| {
            for (p, c) in charged {
                p.lane.refund(mb, *c);
            }
        };
        for p in peers {
            if p.window_full() && !p.wait_room(&stopping) && stopping() {
                refund(&charged);
                return Err(shut());
            }
            match p.lane.charge(&Outgoing { dest: p.id, ..m }, true) {
                Ok(c) => charged.push((p, c)),
                Err(e) => {
                    refund(&charged);
                    let to = Address::from_names(p.name.clone(), mb.clone());
                    return Err(self.push_error(e, &to, payload.clone()));
                }
            }
        }
        lane.push(Outgoing { dest: ALL, ..m }, true)
            .map_err(|e| {
                refund(&charged);
                let to = Address::from_names(self.name.clone(), mb.clone());
                self.push_error(e, &to, payload.clone())
            })
            .map(|()| peers.iter().for_each(|p| p.after_push()))
    }

    fn check(&self, payload: &Bytes) -> Result<(), Error> {
        if payload.len() > self.config.max_payload {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if self.shutdown.is_shutting_down() {
            return Err(Error::ShutDown {
                payload: Some(payload.clone()),
            });
        }
        Ok(())
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
            PushError::Down => Error::PeerDown(to.node.to_string()),
            PushError::TooLarge(max) => Error::PayloadTooLarge {
                len: payload.len(),
                max: max as usize,
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
        if call::is_reply_inbox(to.as_bytes()) {
            self.ctx
                .calls
                .replies_from_wire(&self.name, std::iter::once((from.clone(), payload)));
            return Ok(());
        }
        let missing = |count| {
            if let Some((id, _)) = call::parse(from.as_bytes()) {
                let to = format!("{to}@{}", self.name);
                self.ctx
                    .calls
                    .fail_from(id, &self.name, Error::Undeliverable { to });
            }
            self.mailboxes.note_missing(to, &self.name, count);
            self.events.emit(Event::Undeliverable {
                to: Address::from_names(self.name.clone(), to.clone()),
                from: from.to_string(),
                count: count as u64,
            });
        };
        let mut mb = self.mailboxes.get_local(to.as_bytes());
        let mut e = Envelope::new(
            Address::from_names(self.name.clone(), from.clone()),
            payload,
        );
        for again in [false, true] {
            let Some(q) = mb.take() else { break };
            match q.push_one(e, block) {
                Ok(()) => {
                    self.local_messages.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err((e, _)) if self.shutdown.is_shutting_down() => {
                    return Err(Error::ShutDown {
                        payload: Some(e.payload),
                    });
                }
                Err((e, Refused::Full)) => {
                    return Err(Error::Full {
                        to: format!("{to}@{}", self.name),
                        payload: e.payload,
                    });
                }
                // Dropped since this thread last delivered to it, or while it waited for
                // room: a mailbox opened again under the name takes it (the table is
                // asked once more), else it has none.
                Err((back, Refused::Closed)) => {
                    e = back;
                    mb = (!again)
                        .then(|| self.mailboxes.get_again(to.as_bytes()))
                        .flatten()
                        .filter(|fresh| !Arc::ptr_eq(fresh, &q));
                }
            }
        }
        missing(1);
        Ok(())
    }

    /// The requests in flight.
    pub fn calls(&self) -> &Calls {
        &self.ctx.calls
    }

    /// Start the requests' timer thread if it is not running (async requests need it to
    /// time out; blocking ones time out by themselves).
    pub fn ensure_call_timer(&self) -> Result<(), Error> {
        // A plain load on every request after the first: no write to a shared line.
        if self.call_timer.load(Ordering::Acquire) || self.call_timer.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let calls = self.ctx.calls.clone();
        self.threads
            .spawn(format!("bw-calls-{}", self.name), move || run_timer(&calls))
            .map_err(|e| {
                self.call_timer.store(false, Ordering::Release);
                Error::Io(e)
            })
    }

    /// A slot for a request to `to`, and the sender field that carries its id.
    pub fn begin_request(
        &self,
        to: &Address,
        deadline: Instant,
        waiter: Waiter,
    ) -> Result<(u64, Name), Error> {
        let id = self.ctx.calls.begin(to, deadline, waiter)?;
        // The anonymous caller "": always short enough.
        let from = call::request_sender(id, "").unwrap_or_else(|| Name::from_static(""));
        Ok((id, from))
    }

    /// Send a request and wait (this thread) for its reply until `timeout`.
    pub fn request(
        &self,
        to: &Address,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Envelope, Error> {
        let deadline = Instant::now() + timeout;
        let (id, from) =
            self.begin_request(to, deadline, Waiter::Thread(std::thread::current()))?;
        self.ask_for_turn(&to.node);
        if let Err(e) = self.send(&from, to, payload, Class::Ordinary, true) {
            self.ctx.calls.forget(id);
            return Err(e);
        }
        self.lead_for_reply(to, id, deadline);
        self.ctx.calls.wait(id, deadline)
    }

    /// Read the connection the reply will come on while waiting for it, if no one else
    /// is reading it (see `Reader::lead`): the reply is then in this thread's hands when
    /// it arrives, with no wake-up by the reader thread in between. Only the node's one
    /// call in flight leads: with several, one caller would read for all the others (and
    /// keep the turn until its own reply, even while preempted), so their replies would
    /// wait on it; the reader thread serves them better.
    fn lead_for_reply(&self, to: &Address, id: u64, deadline: Instant) {
        let calls = &self.ctx.calls;
        if calls.pending() == 1 {
            self.lead_on(&to.node, &|| calls.is_answered(id), deadline, None);
        }
    }

    /// Before a call: a receiver reading the connection its reply will come on (leading
    /// while it waits for a mailbox) is asked to let go, so that the caller can read its
    /// reply itself. Receivers do not lead while calls wait (see `lead_for`).
    fn ask_for_turn(&self, node: &Name) {
        let wake = self
            .peers
            .with(node.as_bytes(), |p| p.and_then(|p| p.current()))
            .and_then(|c| c.lead_wake());
        if let Some(w) = wake {
            crate::io::mailbox::signal(&w);
        }
    }

    /// Lead the current connection to node `node` (see `Reader::lead`).
    fn lead_on(
        &self,
        node: &Name,
        done: &dyn Fn() -> bool,
        until: Instant,
        wake: Option<&Arc<std::os::fd::OwnedFd>>,
    ) -> bool {
        let Some(peer) = self.peers.with(node.as_bytes(), |p| p.cloned()) else {
            return false;
        };
        let Some(conn) = peer.current() else {
            return false;
        };
        Reader {
            peer: &peer,
            conn: &conn,
            mailboxes: &self.mailboxes,
            events: &self.events,
            shared: self.shared_lane.as_deref(),
            max_frame: self.config.max_frame(),
            max_payload: self.config.max_payload as u64,
            read_bytes: self.config.read_bytes,
        }
        .lead(done, until, wake)
    }

    /// The queue of mailbox `name`, new or declared; fails if a handle owns it already.
    pub fn claim_mailbox(&self, name: &str) -> Result<Arc<MailboxQueue>, Error> {
        let n = node_name(name)?;
        if call::is_reserved(n.as_bytes()) {
            return Err(Error::InvalidName(name.into(), RESERVED_NAME));
        }
        let q = self.mailboxes.get_or_insert(&n, || {
            MailboxQueue::new(n.clone(), self.config.mailbox_bytes, self.idle)
        });
        if q.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::MailboxExists(name.into()));
        }
        Ok(q)
    }

    /// A mailbox handle was dropped.
    pub fn release_mailbox(&self, q: &Arc<MailboxQueue>) {
        let left = self.mailboxes.remove(q);
        if left > 0 && !self.shutdown.is_shutting_down() {
            warn!(node = %self.name, mailbox = %q.name, left, "mailbox dropped with unreceived messages");
        }
    }

    /// Wait until every named peer is connected, up to `timeout`.
    /// With connections on demand, waiting for a peer asks for a connection to it (and
    /// the idle close ends it later if nothing is sent).
    pub fn wait_for_peers(&self, names: &[&str], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.config.on_demand() {
                for n in names {
                    let p = self
                        .peers
                        .get(n.as_bytes())
                        .or_else(|| Name::new(n).and_then(|name| self.member_peer(&name)));
                    if let Some(p) = p
                        && !p.is_connected()
                    {
                        p.want_connection(true);
                    }
                }
            }
            // A member learnt meanwhile is asked for at the next look.
            let look = (Instant::now() + Duration::from_millis(100)).min(deadline);
            let up = self.ctx.conns.wait_until(look, || {
                let up = self.connected_peers();
                names.iter().all(|n| up.iter().any(|u| u == n))
            });
            if up || Instant::now() >= deadline {
                return up;
            }
        }
    }

    /// Names of the peers with a live connection.
    pub fn connected_peers(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .peers
            .all()
            .iter()
            .filter(|p| p.current().is_some_and(|c| !c.is_closed()))
            .map(|p| p.name.to_string())
            .collect();
        v.sort();
        v
    }

    /// Close every connection now, as a network failure would. Returns how many.
    pub fn break_connections(&self) -> usize {
        let mut n = 0;
        for p in self.peers.all() {
            if let Some(c) = p.current() {
                c.close();
                n += 1;
            }
        }
        n
    }

    /// Threads running now.
    pub fn threads(&self) -> usize {
        self.threads.running() + self.writers.running()
    }

    pub fn stats(&self) -> NodeStats {
        let mut peers: Vec<PeerStats> = self
            .peers
            .all()
            .iter()
            .map(|p| {
                let connected = p.current().is_some_and(|c| !c.is_closed());
                let mut s = p.stats.snapshot(p.name.to_string(), connected);
                s.queue_high_water = p.lane.high_water.load(Ordering::Relaxed);
                s.blocked_us = p.lane.blocked_ns.load(Ordering::Relaxed) / 1000;
                s.queued = p.lane.queued() as u64;
                s.credit_stalls = p.lane.credit_stalls.load(Ordering::Relaxed);
                s.credit_mismatched = p.lane.credit_mismatched();
                s.unacked_bytes = p.session(|s, _| s.window_bytes()) as u64;
                s
            })
            .collect();
        if let Some(l) = &self.shared_lane {
            // One queue for all: its figures go to every peer.
            for s in &mut peers {
                s.queue_high_water = l.high_water.load(Ordering::Relaxed);
                s.blocked_us += l.blocked_ns.load(Ordering::Relaxed) / 1000;
                s.queued += l.queued() as u64;
            }
        }
        peers.sort_by(|a, b| a.peer.cmp(&b.peer));
        let sent = peers.iter().map(|p| p.bytes_sent).sum();
        self.node_stats(peers, sent)
    }

    /// `stats` without the peers' counters (`peers` empty, `bytes_sent` their sum): a
    /// load a peer, where `stats` builds each peer's whole snapshot.
    pub fn stats_brief(&self) -> NodeStats {
        let sent = self
            .peers
            .all()
            .iter()
            .map(|p| p.stats.bytes_sent.load(Ordering::Relaxed))
            .sum();
        self.node_stats(Vec::new(), sent)
    }

    /// The node's own counters around `peers`.
    fn node_stats(&self, peers: Vec<PeerStats>, bytes_sent: u64) -> NodeStats {
        NodeStats {
            node: self.name.to_string(),
            peers,
            bytes_sent,
            undeliverable: self.mailboxes.missing(),
            local_messages: self.local_messages.load(Ordering::Relaxed),
            handshakes: self.setup.security.snapshot(),
            events_dropped: self.events.dropped(),
            membership: self.membership_stats(),
            requests: self.request_stats(),
            reassembly_bytes: self.ctx.reassembly.used(),
        }
    }

    fn request_stats(&self) -> RequestStats {
        let c = &self.ctx.calls.counters;
        RequestStats {
            pending: self.ctx.calls.pending() as u64,
            sent: c.sent.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            late_replies: c.late_replies.load(Ordering::Relaxed),
            stray_replies: c.stray_replies.load(Ordering::Relaxed),
        }
    }

    fn membership_stats(&self) -> MembershipStats {
        let s = &self.member_stats;
        MembershipStats {
            packets_in: s.packets_in.load(Ordering::Relaxed),
            bytes_in: s.bytes_in.load(Ordering::Relaxed),
            packets_out: s.packets_out.load(Ordering::Relaxed),
            bytes_out: s.bytes_out.load(Ordering::Relaxed),
            rate_limited: s.rate_limited.load(Ordering::Relaxed),
            violations: s.violations.load(Ordering::Relaxed),
            inputs_dropped: self.members.as_ref().map_or(0, |m| m.dropped()),
            members_refused: s.members_refused.load(Ordering::Relaxed),
            datagrams_refused: s.refused.load(Ordering::Relaxed),
            send_errors: s.send_errors.load(Ordering::Relaxed),
        }
    }

    /// The membership view (empty with membership off).
    pub fn members(&self) -> Vec<crate::event::Member> {
        self.members
            .as_ref()
            .map(|m| m.view().to_vec())
            .unwrap_or_default()
    }

    /// Wait until `cond` holds for the view, up to `timeout` (polls every 10 ms).
    pub fn wait_for_members(
        &self,
        timeout: Duration,
        cond: impl Fn(&[crate::event::Member]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(&self.members()) {
                return true;
            }
            if Instant::now() >= deadline || !self.shutdown.sleep(Duration::from_millis(10)) {
                return false;
            }
        }
    }

    /// Drain (flush what is queued and say goodbye, up to `shutdown_timeout`), then stop
    /// every thread and join it. Runs once.
    pub fn shutdown(&self) {
        if self.shutdown.is_shutting_down() {
            return;
        }
        info!(node = %self.name, "shutting down");
        // 0. Tell the cluster we leave (before the writers say goodbye), so members
        //    remove this node at once instead of suspecting it.
        if let Some(m) = &self.members {
            m.leave(Duration::from_millis(500));
        }
        // 1. Drain: no new sends; each writer flushes its lane, waits for its peer's
        //    acknowledgements (or the deadline) and says goodbye. Connections that break
        //    meanwhile may come back (dialers and the acceptor still run).
        self.shutdown
            .drain(Instant::now() + self.config.shutdown_timeout);
        // Writers run only while their peer has a connection or something queued: a peer
        // holding something unacknowledged or queued needs one now to flush or hand it back.
        for p in self.peers.all() {
            if p.is_connected() || !p.is_quiet() {
                p.ensure_writer();
            }
        }
        if let Some(l) = &self.shared_lane {
            l.close();
        }
        for p in self.peers.all() {
            p.lane.close();
        }
        self.writers.join_all();
        // 2. Stop: wake the ticker, the dialers and the acceptor (with a connection of its
        //    own).
        self.shutdown.stop();
        self.timer.wake();
        // Requests still waiting fail now (their replies can no longer come).
        self.ctx.calls.stop();
        // The membership thread by a datagram from its own socket (`DatagramWaker`).
        if let Some(m) = &self.members {
            m.wake();
        }
        let wake = crate::io::reachable(self.local_addr);
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        // 3. Give peers a moment to answer our goodbye by closing; then close the rest.
        let peers = self.peers.all();
        self.ctx
            .conns
            .wait_until(Instant::now() + Duration::from_millis(500), || {
                peers.iter().all(|p| p.current().is_none())
            });
        self.mailboxes.close_all();
        for p in self.peers.all() {
            if let Some(c) = p.current() {
                c.close();
            }
        }
        self.threads.join_all();
        // Writers of peers that connected during the drain.
        self.writers.join_all();
        self.events.close();
        info!(node = %self.name, "shut down");
    }
}

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

    fn register(&self, to: &Address, w: &Waker) {
        if to.node == self.name {
            match self.mailboxes.get(to.mailbox.as_bytes()) {
                Some(mb) => mb.register_room(w),
                // Gone: the next try says so.
                None => w.wake_by_ref(),
            }
            return;
        }
        // Wherever the send may have found no room: the peer's lane (room or credit), its
        // window (transfer-queue) and the shared lane.
        self.peers.with(to.node.as_bytes(), |p| match p {
            Some(p) => {
                p.lane.register_room(w);
                p.register_room(w);
            }
            None => w.wake_by_ref(),
        });
        if let Some(l) = &self.shared_lane {
            l.register_room(w);
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
