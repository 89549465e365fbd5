//! Starting a node: the socket, the parts and their threads, each with one owner.

use super::*;

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
        grow_listen_backlog(&listener, &config.name);
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
            threads.clone(),
        ));
        let dialers = Dialers::new(
            setup.clone(),
            threads.clone(),
            peer_names.iter().map(|(n, _)| n.clone()).collect(),
            config.on_demand(),
        );
        let weak = dialers.downgrade();
        let lost = weak.clone();
        let _ = setup.on_lost.set(Box::new(move |n: &Name| {
            if let Some(d) = lost.upgrade() {
                crate::io::dial::Dialers::from_inner(d).redial(n);
            }
        }));
        let _ = ctx.hooks.set(crate::io::peer::Hooks {
            spawn_writer: Box::new(peers.writer_spawner()),
            dial: config
                .on_demand()
                .then(|| Box::new(move |n: &Name| crate::io::dial::want(&weak, n)) as _),
        });
        let member_stats = Arc::new(MemberStats::default());
        for (pn, _) in &peer_names {
            let p = peers
                .get_or_insert(pn)
                .map_err(|e| Error::Config(format!("peer {pn}: {e:?}")))?;
            p.pinned.store(true, Ordering::Release);
            // A configured peer may not have started yet: what is sent to it waits.
            p.session(|s, _| s.require_reach(None));
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
                (name.clone(), incarnation),
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
}

/// Connections the kernel queues for the acceptor before it refuses more. The standard
/// library listens with 128: when a thousand nodes joined through one seed on a loaded
/// host, its queue overflowed, the kernel dropped the joiners' SYNs and each waited a
/// second or more for its retransmission (`cannot reach the seed yet: connection timed
/// out`), which spread the join over half a minute. A queued connection costs the kernel
/// a socket; the acceptor's own bounds (handshakes in progress) apply once it is taken.
const LISTEN_BACKLOG: i32 = 1024;

/// Raise the listener's queue to `LISTEN_BACKLOG` (best effort: the node works with the
/// standard library's if the kernel refuses).
fn grow_listen_backlog(listener: &TcpListener, node: &str) {
    use std::os::fd::AsRawFd;
    if let Err(e) = crate::sys::set_listen_backlog(listener.as_raw_fd(), LISTEN_BACKLOG) {
        tracing::warn!(node, error = %e, backlog = LISTEN_BACKLOG, "listener: its queue of connections not yet accepted could not be grown (128 is used); many nodes joining at once may have to retry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// More connections than the standard library's 128 wait to be accepted: each
    /// completes its connect at once (with the queue at 128, the kernel dropped the SYNs
    /// past it and those connects waited a second for a retransmission).
    #[test]
    fn the_listener_queues_hundreds_of_connections_before_the_acceptor_takes_them() {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4096);
        let n = 300.min(somaxconn);
        if n <= 129 {
            // Only a host whose kernel caps every queue at 128 skips it.
            eprintln!(
                "net.core.somaxconn = {somaxconn} caps any queue at the standard one: not run"
            );
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        grow_listen_backlog(&listener, "n0");
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            let c = TcpStream::connect_timeout(&addr, Duration::from_millis(500));
            assert!(c.is_ok(), "connect {i} of {n} not queued: {c:?}");
            held.push(c.unwrap());
        }
    }
}
