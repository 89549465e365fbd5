//! A connection from its first byte to its last: TLS (if configured), the batchwire
//! handshake and the RESUME exchange, all within one deadline; then the reader; then the
//! teardown. Dialers run [`Setup::run`]; inbound connections are set up by the acceptor's
//! event loop (`io::accept`), and their thread goes on at [`Setup::established`]. Every
//! step is commented, in the manner of mini-redis' `connection.rs`.

mod places;
mod reading;
mod steps;

use places::Slots;
pub(crate) use places::{HandshakeSlot, Turn};
pub(crate) use reading::Reading;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, Resume};
use batchwire_core::handshake::{Handshake, HandshakeConfig, HandshakeError, PeerInfo, Role};
use batchwire_core::membership::MemberId;
use bytes::BytesMut;
use tracing::{debug, info};

use crate::certs::cert_names;
use crate::config::NodeConfig;
use crate::event::Event;
use crate::io::conn::{Conn, LinkError};
use crate::io::events::Events;
use crate::io::lane::Lane;
use crate::io::link::{JOIN_SERVER_NAME, Link, TlsConfigs};
use crate::io::mailbox::Mailboxes;
use crate::io::members::Members;
use crate::io::peer::Peer;
use crate::io::peers::{AddError, Peers};
use crate::io::resting::Resting;
use crate::io::shutdown::Shutdown;
use crate::io::threads::Threads;
use crate::stats::SecurityCounters;

/// Handshake frames are small; anything bigger than this before authentication is refused.
pub(crate) const HANDSHAKE_MAX_FRAME: usize = 4096;

/// Whether bytes where a HELLO should be are a TLS record (handshake 0x16 or alert 0x15,
/// version 3.x): the peer runs TLS and this node does not.
pub(crate) fn looks_like_tls(buf: &[u8]) -> bool {
    buf.len() >= 2 && matches!(buf[0], 0x15 | 0x16) && buf[1] == 3
}

/// Told the name of a peer whose connection ended (see [`Setup::on_lost`]).
pub(crate) type LostHook = Box<dyn Fn(&Name) + Send + Sync>;

/// Most `Event::HandshakeFailed` a node emits a second (see `Setup::failed_event_due`).
const FAILED_EVENTS_PER_SECOND: u32 = 64;

/// What connections need, shared by the acceptor's threads and the dialers.
pub(crate) struct Setup {
    pub name: Name,
    pub incarnation: u64,
    secret: Arc<[u8]>,
    tls: Option<TlsConfigs>,
    /// Peers this node dials (their names sort after ours): an inbound connection claiming
    /// one of them is refused.
    dials: Arc<[Name]>,
    pub config: NodeConfig,
    /// Inbound handshakes in progress, by source address.
    slots: Mutex<Slots>,
    pub security: SecurityCounters,
    pub peers: Peers,
    pub mailboxes: Mailboxes,
    pub events: Events,
    pub shutdown: Shutdown,
    /// With transfer-queue, the shared lane (readers count it in credit recounts).
    pub shared: Option<Arc<Lane>>,
    /// The membership thread's handle (`None` with membership off).
    pub members: Option<Members>,
    /// The static peers' addresses: a connection with one of them announces this node
    /// to its membership (static peers become members).
    statics: Vec<(Name, SocketAddr)>,
    /// The seeds' addresses as last resolved (the joiner's, at most `join::MAX_ADDRS`).
    seed_addrs: Mutex<Vec<SocketAddr>>,
    /// The node's thread for resting connections (`None` if its poll could not be made:
    /// reader threads then never rest).
    pub resting: Option<Resting<Reading>>,
    /// Called with a peer's name when one of its connections ended (the dialers start a
    /// dialer again if the mesh needs one: `Dialers::redial`).
    pub on_lost: std::sync::OnceLock<LostHook>,
    /// `Event::HandshakeFailed` emitted in the current second, and when it began (see
    /// `FAILED_EVENTS_PER_SECOND`).
    failed_events: Mutex<(Instant, u32)>,
}

/// A connection whose batchwire handshake is done: the peer proved the cluster secret
/// (its certificate, with TLS, is checked next).
pub(crate) struct Handshaken {
    pub link: Link,
    pub info: PeerInfo,
    /// Bytes read past the handshake.
    pub buf: BytesMut,
    pub addr: SocketAddr,
    /// The connection's one deadline for everything before it carries messages.
    pub deadline: Instant,
    /// This node dialled it.
    pub dialled: bool,
    /// Dialled to join through a seed.
    pub joining: bool,
}

/// Which dialled connection this is (inbound ones are set up by the acceptor's event
/// loop, `io::accept`, then go on at [`Setup::established`]).
pub(crate) enum Side {
    /// Dialled the peer called so.
    Dial(Name),
    /// Dialled a seed's address, not knowing its name. `place` is dropped once the
    /// connection is established (the joiner then no longer counts it among the few
    /// connects it makes at once: a join connection may be the canonical one and last).
    Join { place: Box<dyn Send> },
}

/// What a connection in setup holds until it is established (see [`Setup::established`]),
/// released when dropped: an inbound handshake's place, or a join's.
pub(crate) type Place = Box<dyn Send>;

impl Setup {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: Name,
        incarnation: u64,
        tls: Option<TlsConfigs>,
        dials: Arc<[Name]>,
        config: NodeConfig,
        peers: Peers,
        mailboxes: Mailboxes,
        events: Events,
        shutdown: Shutdown,
        shared: Option<Arc<Lane>>,
        members: Option<Members>,
        statics: Vec<(Name, SocketAddr)>,
        threads: Threads,
    ) -> Setup {
        let resting = match Resting::new(name.clone(), threads, shutdown.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "cannot make a poll for resting connections; reader threads stay");
                None
            }
        };
        let seed_addrs = config
            .seeds()
            .iter()
            .filter_map(|s| match s {
                crate::seed::Seed::Addr(a) => Some(*a),
                _ => None,
            })
            .collect();
        Setup {
            name,
            incarnation,
            secret: config.secret.clone().into(),
            tls,
            dials,
            config,
            slots: Mutex::new(Slots::default()),
            security: SecurityCounters::default(),
            peers,
            mailboxes,
            events,
            shutdown,
            shared,
            members,
            statics,
            seed_addrs: Mutex::new(seed_addrs),
            resting,
            on_lost: std::sync::OnceLock::new(),
            failed_events: Mutex::new((Instant::now(), 0)),
        }
    }

    /// The REFUSE that answers a handshake frame that does not decode.
    pub fn bad_frame_refusal(&self, e: &frame::FrameError) -> Frame {
        Frame::Refuse(frame::Refuse {
            code: frame::RefuseCode::Protocol,
            reason: format!("node {:?}: bad handshake frame: {e}", self.name.as_str()),
        })
    }

    /// The seeds' addresses as the joiner resolved them last.
    pub fn set_seed_addrs(&self, addrs: &[SocketAddr]) {
        let mut g = self.seed_addrs.lock().unwrap_or_else(|p| p.into_inner());
        g.clear();
        g.extend_from_slice(addrs);
    }

    /// Run a dialled connection to its end (on the dialler's thread). Returns whether the
    /// handshake succeeded.
    pub fn run(self: &Arc<Self>, stream: TcpStream, side: Side) -> bool {
        let Ok(addr) = stream.peer_addr() else {
            return false; // already gone
        };
        let (expect, joining, place) = match side {
            Side::Dial(name) => (Some(name), false, None),
            Side::Join { place } => (None, true, Some(place)),
        };
        // Every log line of this connection says which it is: its handshake first, then
        // (once the peer proved who it is) the connection with the peer's name and
        // incarnation.
        let hs_span =
            tracing::info_span!("handshake", node = %self.name, %addr, dialled = true).entered();
        // Small messages must not wait for Nagle: batching is the bundler's job.
        let _ = stream.set_nodelay(true);
        // One deadline for everything before the connection carries messages.
        let deadline = Instant::now() + self.config.handshake_timeout;

        // 1. TLS first if configured (mutual), then the batchwire handshake inside it (both
        //    sides prove the cluster secret; see core::handshake), and with TLS a check that
        //    the peer's certificate names the node it claims to be.
        let setup = self
            .open(stream, expect.as_ref(), joining, deadline)
            .and_then(|link| {
                let (info, buf) = self.handshake(&link, expect.clone(), deadline)?;
                Ok((link, info, buf))
            });
        let (link, info, buf) = match setup {
            Ok(x) => x,
            Err(e) => {
                self.handshake_failed(addr, expect.map(|n| n.to_string()), &e);
                return false;
            }
        };
        drop(hs_span);
        let h = Handshaken {
            link,
            info,
            buf,
            addr,
            deadline,
            dialled: true,
            joining,
        };
        self.established(h, place)
    }

    /// The registry of peers is full: remove idle peers of nodes that are not live members
    /// (see `Peers::make_room`). Returns how many were removed.
    pub fn make_room(&self) -> usize {
        let members = self.members.as_ref();
        let removed = self
            .peers
            .make_room(|n| members.is_some_and(|m| m.is_live(n.as_str())));
        if removed > 0 {
            info!(node = %self.name, removed, "peer registry full: idle peers of nodes that are not members removed");
        }
        removed
    }

    /// A handshake failed: count, log and report it, naming the peer if it got that far
    /// (else `expect`, the peer dialled).
    pub fn handshake_failed(&self, addr: SocketAddr, expect: Option<String>, e: &LinkError) {
        let peer = match e {
            LinkError::Handshake(h) => h.peer().map(|p| p.to_string()),
            LinkError::Certificate { peer, .. } => Some(peer.clone()),
            _ => None,
        };
        self.failed(addr, peer.or(expect), e);
    }

    /// Run a connection whose handshake is done to its end: with TLS the certificate's
    /// name first, then (the inbound handshake's or the join's `place` freed) RESUME, the
    /// reader and the teardown. Returns whether the peer was authenticated.
    pub fn established(self: &Arc<Self>, h: Handshaken, place: Option<Place>) -> bool {
        let (link, info, buf, addr) = (h.link, h.info, h.buf, h.addr);
        let (deadline, dialled, joining) = (h.deadline, h.dialled, h.joining);
        if let Err(e) = self.check_certificate(&link, &info) {
            self.handshake_failed(addr, None, &e);
            return false;
        }
        let link = Arc::new(link);
        drop(place);
        let span = tracing::info_span!(
            "conn",
            node = %self.name,
            peer = %info.name,
            %addr,
            incarnation = info.incarnation
        )
        .entered();

        // 2. The peer's handles (made, with its writer, if it is not in the static list).
        let mut peer = self.peers.get_or_insert(&info.name);
        if matches!(peer, Err(AddError::Full(_))) {
            // Again even if this look removed none: another may have made room meanwhile.
            self.make_room();
            peer = self.peers.get_or_insert(&info.name);
        }
        let peer = match peer {
            Ok(p) => p,
            Err(AddError::Full(n)) => {
                self.failed(addr, Some(info.name.to_string()), &LinkError::Capacity(n));
                return false;
            }
        };

        // Removed from the registry meanwhile (forgotten by the membership): the dialer
        // or the peer tries again, and finds a new one.
        if peer.is_removed() {
            return false;
        }

        // A live node holds the name: another incarnation claiming it (a second node
        // started with the same name by mistake, or an impostor) is refused while that
        // connection lasts, with one line. A restarted node's old connection ends with its
        // process, so the new one gets in.
        if let Some(live) = peer.session(|s, now| s.live_incarnation(now))
            && live != info.incarnation
            && peer.current().is_some_and(|c| !c.is_closed())
        {
            let e = LinkError::NameTaken {
                peer: info.name.to_string(),
                live,
                claimed: info.incarnation,
            };
            refuse(
                &link,
                frame::RefuseCode::Name,
                format!("node {:?}: {e}", self.name.as_str()),
            );
            self.failed(addr, Some(info.name.to_string()), &e);
            return false;
        }

        // 3. RESUME each way: what each side received, and the oldest it still holds. The
        //    session checks the peer's values and makes this the current connection (a
        //    restarted peer, a new incarnation, starts both streams from 0). A connection
        //    against the tie-break (the larger name dialled) is redundant beside a live one
        //    the tie-break asked for, to the same incarnation: it closes before RESUME, so
        //    neither side installs it.
        let canonical = if dialled {
            self.name.as_str() < info.name.as_str()
        } else {
            info.name.as_str() < self.name.as_str()
        };
        // A join connection is never needed beside a live canonical one either (the
        // joiner found a member it is already connected to, e.g. under an address the
        // member does not advertise): replacing that would cut what is in flight on it.
        if (!canonical || joining) && peer.has_live_canonical(info.incarnation) {
            debug!(node = %self.name, peer = %info.name, %addr, "redundant connection (a canonical one is live); closed");
            return true;
        }
        let conn = match self.resume(&peer, link, &info, buf, deadline, canonical) {
            Ok(Some(c)) => c,
            Ok(None) => {
                debug!(node = %self.name, peer = %info.name, %addr, "redundant connection (a canonical one came first); closed");
                return true;
            }
            Err(e) => {
                if e.is_violation() {
                    peer.stats.violations.fetch_add(1, Relaxed);
                }
                self.failed(addr, Some(info.name.to_string()), &e);
                return true;
            }
        };
        let (conn, buf) = conn;
        // Its writer runs while it is connected (started here, outside the session turn in
        // which the connection was installed).
        peer.ensure_writer();
        if peer.is_removed() {
            conn.close();
            peer.uninstall(&conn);
            return false;
        }
        // Stopped meanwhile: the node's last sweep of its connections may already be past,
        // so this one closes itself (its reader then ends at once).
        if self.shutdown.is_stopped() {
            conn.close();
        }
        peer.stats.connects.fetch_add(1, Relaxed);
        info!(node = %self.name, peer = %info.name, %addr, "connected");
        self.events.emit(Event::Connected {
            peer: info.name.to_string(),
            incarnation: info.incarnation,
            addr,
        });
        self.announce(&info, dialled.then_some(addr));

        // 4. Read until the connection ends one way or another (on this thread, and
        //    while it rests on the node's thread for resting connections and the threads
        //    that one starts), then tear it down.
        let reading = Reading {
            setup: self.clone(),
            peer,
            conn,
            info,
            addr,
            rests: !joining,
        };
        reading.start(buf);
        drop(span);
        crate::io::resting::Rested::go(reading);
        true
    }

    /// A connection is up with a seed we dialled (`dialled` is its address) or with a
    /// static peer: if it is not a live member yet, announce this node to it (the
    /// membership then brings the rest of the cluster, both ways).
    fn announce(&self, info: &PeerInfo, dialled: Option<SocketAddr>) {
        let Some(m) = &self.members else {
            return;
        };
        // A completed handshake is direct evidence that the peer is alive.
        m.heard(&info.name, info.incarnation);
        let addr = dialled.or_else(|| {
            self.statics
                .iter()
                .find(|(n, _)| *n == info.name)
                .map(|(_, a)| *a)
        });
        if let Some(addr) = addr
            && !m.is_live(info.name.as_str())
        {
            m.join(MemberId {
                name: info.name.detached(),
                addr,
                started: info.incarnation,
                bump: 0,
            });
        }
    }

    /// Count, log and report a connection that failed before carrying messages.
    fn failed(&self, addr: std::net::SocketAddr, peer: Option<String>, e: &LinkError) {
        if self.shutdown.is_shutting_down() {
            return;
        }
        let kind = e.kind();
        self.security.count(kind);
        warn_limited!(node = %self.name, %addr, peer = ?peer, ?kind, error = %e, "handshake failed; connection closed");
        if self.failed_event_due() {
            self.events.emit(Event::HandshakeFailed {
                addr,
                peer,
                kind,
                reason: e.to_string(),
            });
        }
    }

    /// Whether one more `Event::HandshakeFailed` may go out this second: strangers fail
    /// handshakes as fast as they connect, and their events must not crowd a subscriber's
    /// bounded queue so that the events that matter (a peer or member down) are dropped.
    /// Every failure is counted in `NodeStats::handshakes` all the same.
    fn failed_event_due(&self) -> bool {
        let mut g = self.failed_events.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now.duration_since(g.0) >= Duration::from_secs(1) {
            *g = (now, 0);
        }
        g.1 += 1;
        g.1 <= FAILED_EVENTS_PER_SECOND
    }
}

/// Send a REFUSE with `reason`, best effort (the connection is about to close).
fn refuse(link: &Link, code: frame::RefuseCode, reason: String) {
    let mut out = Vec::new();
    Frame::Refuse(frame::Refuse { code, reason }).encode(&mut out);
    let _ = link.write_all(&out);
}
