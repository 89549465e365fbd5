//! A connection that carries messages: read (by a reader thread, or resting, see
//! `io::resting`) until it ends, then torn down.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use batchwire_core::handshake::PeerInfo;
use tracing::{debug, info};

use super::Setup;
use crate::event::{CloseReason, Event};
use crate::io::conn::{Conn, LinkError};
use crate::io::logs::warn_limited;
use crate::io::peer::Peer;
use crate::io::read::{Reader, Stopped};
use crate::io::resting::Rested;

/// A connection past RESUME and what its reader needs; moves between threads while it
/// rests (see `io::resting`).
pub(crate) struct Reading {
    pub(super) setup: Arc<Setup>,
    pub(super) peer: Arc<Peer>,
    pub(super) conn: Arc<Conn>,
    pub(super) info: PeerInfo,
    pub(super) addr: SocketAddr,
    /// Whether its reader may rest (not a join connection: the joiner counts it as
    /// dialled until its reader returns, so it does not dial the address again).
    pub(super) rests: bool,
}

impl Reading {
    fn reader(&self) -> Reader<'_> {
        let s = &self.setup;
        Reader {
            peer: &self.peer,
            conn: &self.conn,
            mailboxes: &s.mailboxes,
            events: &s.events,
            shared: s.shared.as_deref(),
            max_frame: s.config.max_frame(),
            max_payload: s.config.max_payload as u64,
            read_bytes: s.config.read_bytes,
            linger: (self.rests && s.resting.is_some()).then_some(s.config.thread_linger),
        }
    }

    /// Set up the read side of the new connection (see `Reader::start`).
    pub(super) fn start(&self, buf: bytes::BytesMut) {
        self.reader().start(buf);
    }
}

impl Rested for Reading {
    /// The connection's socket (plain TCP or TLS).
    fn fd(&self) -> RawFd {
        self.conn.link.fd()
    }

    /// Resting and readable: read what is there (see `Reader::serve_rested`). Returns
    /// whether it may go on resting.
    fn serve(&self) -> bool {
        self.reader().serve_rested()
    }

    /// Resting: the ciphertext buffer of a TLS link goes (see `Link::release_read_buffer`).
    fn release(&self) -> bool {
        self.conn.link.release_read_buffer()
    }

    /// On this thread, read until the connection ends (then tear it down) or rests (then
    /// park it with the node's thread for resting connections and return).
    fn go(self) {
        let _span = tracing::info_span!(
            "conn",
            node = %self.setup.name,
            peer = %self.info.name,
            addr = %self.addr,
            incarnation = self.info.incarnation
        )
        .entered();
        let mut me = self;
        loop {
            let stopped = me.reader().read_on();
            match stopped {
                Stopped::Ended(r) => return me.teardown(r),
                Stopped::Rested => {
                    let Some(resting) = me.setup.resting.clone() else {
                        continue;
                    };
                    let fd = me.fd();
                    let peer = me.peer.clone();
                    match resting.park(fd, me) {
                        Ok(()) => {
                            peer.stats.reader_rests.fetch_add(1, Relaxed);
                            return;
                        }
                        // It cannot rest now: read on here.
                        Err(back) => me = back,
                    }
                }
            }
        }
    }

    /// No thread could be started to read it: close it and tear it down (the session
    /// resumes on the next connection).
    fn fail(self, e: std::io::Error) {
        self.conn.close();
        self.reader().abandon();
        self.teardown(Err(LinkError::Io(e)));
    }
}

impl Reading {
    fn teardown(self, result: Result<(), LinkError>) {
        let s = &*self.setup;
        let (peer, conn, info, addr) = (&self.peer, &self.conn, &self.info, self.addr);
        // 5. Tear down: close both halves (the writer notices) and forget the connection.
        //    One that another connection of the peer had already superseded (the join
        //    connection once the canonical one is up, or a redundant one) ends quietly,
        //    whoever closed it: nothing of the session depended on it.
        let superseded = peer.current().is_some_and(|c| c.id != conn.id);
        conn.close();
        peer.session(|s, now| s.handle_disconnect(now, conn.id));
        peer.uninstall(conn);
        // Connections on demand (not static peers): with nothing pending either way the
        // session parks (closed for idleness, by either end, or broken while quiet); else
        // a connection is wanted back at once.
        let parked = s.config.on_demand()
            && !peer.pinned.load(Relaxed)
            && !superseded
            && !s.shutdown.is_shutting_down()
            && result.is_err()
            && peer.park_or_redial();
        let reason = match &result {
            Ok(()) => CloseReason::Goodbye,
            Err(e) => {
                if e.is_violation() {
                    peer.stats.violations.fetch_add(1, Relaxed);
                }
                e.close_reason()
            }
        };
        let reason = match reason {
            _ if s.shutdown.is_shutting_down() && result.is_err() => CloseReason::ShutDown,
            CloseReason::Closed | CloseReason::Io(_) if superseded => CloseReason::Replaced,
            // Closed by this end for idleness, or by the other (a clean close with nothing
            // pending here either).
            CloseReason::Closed | CloseReason::Io(_) if parked && conn.closed_idle() => {
                CloseReason::Idle
            }
            CloseReason::Closed if parked => CloseReason::Idle,
            CloseReason::Closed if peer.state() == batchwire_core::session::PeerState::Down => {
                CloseReason::Down
            }
            r => r,
        };
        match &reason {
            CloseReason::Goodbye => {
                info!(node = %s.name, peer = %info.name, "peer said goodbye")
            }
            CloseReason::ShutDown | CloseReason::Replaced | CloseReason::Idle => {
                debug!(node = %s.name, peer = %info.name, %reason, "connection closed")
            }
            CloseReason::Protocol(_) => {
                warn_limited!(node = %s.name, peer = %info.name, %addr, %reason, "protocol violation; connection closed, nothing skipped")
            }
            _ => {
                warn_limited!(node = %s.name, peer = %info.name, %addr, %reason, "connection lost; will resume")
            }
        }
        s.events.emit(Event::Disconnected {
            peer: info.name.to_string(),
            reason,
        });
        if let Some(f) = s.on_lost.get() {
            f(&info.name);
        }
    }
}
