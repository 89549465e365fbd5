//! The acceptor: one thread with an event loop (`mio`, epoll) that takes connections and
//! runs their setup, TLS and the batchwire handshake, without a thread per connection
//! ([`inbound`]). Only a peer that proved the cluster secret gets a thread (the
//! certificate check, RESUME, then its reader: `Setup::established`), so strangers, however
//! many and however slow, cost no thread: a pending handshake is a socket and a few KiB.
//!
//! At most `max_handshakes` inbound handshakes are pending at once
//! (`max_handshakes_per_address` from one address; known addresses have places of their
//! own, see `Setup::slot`): beyond that a new connection is closed at once and counted.
//! Each has the node's `handshake_timeout` to finish. Nothing ends the loop but the node
//! stopping (it wakes the loop with a connection of its own): a failure to accept is
//! logged, counted and retried after a pause; one to start an authenticated connection's
//! thread is logged and counted, and that connection closes (its peer dials again).

mod inbound;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use tracing::warn;

use crate::io::logs::warn_limited;
use crate::io::setup::{Setup, Turn};
use crate::io::threads::Threads;
use inbound::{Inbound, Progress};

/// Connections accepted per pass of the loop.
const ACCEPTS: usize = 64;

/// The pause after a failed accept (typically EMFILE) before the next.
const PAUSE: Duration = Duration::from_millis(50);

/// The listening socket's token; a pending connection's is its place in the table + 1.
const LISTENER: Token = Token(0);

/// The connections being set up, by token.
#[derive(Default)]
struct Table {
    slots: Vec<Option<Inbound>>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, c: Inbound) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(c);
                i
            }
            None => {
                self.slots.push(Some(c));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Option<Inbound> {
        let c = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        Some(c)
    }

    fn earliest(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|c| c.deadline).min()
    }
}

pub(crate) fn run_acceptor(listener: TcpListener, setup: Arc<Setup>, threads: Threads) {
    if let Err(e) = Acceptor::new(listener, setup.clone(), threads).and_then(|a| a.run()) {
        // Without its event loop the node takes no connections: say so loudly.
        warn!(node = %setup.name, error = %e, "the acceptor's event loop failed; no more inbound connections");
    }
}

struct Acceptor {
    listener: TcpListener,
    setup: Arc<Setup>,
    threads: Threads,
    poll: Poll,
    table: Table,
    /// After a failed accept: when to try again.
    accept_at: Option<Instant>,
    /// The last pass took its most connections: the next one goes on at once.
    accept_more: bool,
}

impl Acceptor {
    fn new(listener: TcpListener, setup: Arc<Setup>, threads: Threads) -> std::io::Result<Self> {
        let poll = Poll::new()?;
        listener.set_nonblocking(true)?;
        poll.registry().register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )?;
        Ok(Acceptor {
            listener,
            setup,
            threads,
            poll,
            table: Table::default(),
            accept_at: None,
            accept_more: false,
        })
    }

    fn run(mut self) -> std::io::Result<()> {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let next = self
                .table
                .earliest()
                .into_iter()
                .chain(self.accept_at)
                .min();
            let timeout = match self.accept_more {
                true => Some(Duration::ZERO),
                false => next.map(|t| t.saturating_duration_since(now)),
            };
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if self.setup.shutdown.is_stopped() {
                break;
            }
            let mut accept = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => accept = true,
                    Token(t) => self.drive(t - 1),
                }
            }
            let now = Instant::now();
            if self.accept_at.is_some_and(|t| t <= now) {
                self.accept_at = None;
                accept = true;
            }
            if (accept || self.accept_more) && self.accept_at.is_none() {
                self.accept_all(now);
            }
            self.expire(now);
        }
        // Stopped: pending handshakes close with the loop.
        for i in 0..self.table.slots.len() {
            if let Some(c) = self.table.remove(i) {
                self.forget(&c);
            }
        }
        Ok(())
    }

    /// Take the connections waiting (the listener is edge-triggered), at most
    /// [`ACCEPTS`] before the handshakes get their turns (then the next pass goes on
    /// without waiting): a flood of connects cannot hold them up.
    fn accept_all(&mut self, now: Instant) {
        let setup = self.setup.clone();
        self.accept_more = false;
        for _ in 0..ACCEPTS {
            let (s, from) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Typically EMFILE; back off a little rather than spin.
                    setup.security.accept_errors.fetch_add(1, Relaxed);
                    warn_limited!(node = %setup.name, error = %e, "accept failed; retrying in 50 ms");
                    self.accept_at = Some(now + PAUSE);
                    return;
                }
            };
            // The node wakes the loop with a connection of its own when it stops. (While it
            // drains, peers may still reconnect to finish.)
            if setup.shutdown.is_stopped() {
                return;
            }
            let Some(slot) = setup.slot(from.ip().to_canonical(), &s) else {
                // Too many handshakes in progress: close at once (dropping the socket).
                let n = setup.security.busy.fetch_add(1, Relaxed) + 1;
                if n.is_power_of_two() {
                    warn!(node = %setup.name, addr = %from.ip(), refused_so_far = n, max = setup.config.max_handshakes, per_address = setup.config.max_handshakes_per_address, "too many handshakes in progress; closing new connections at once");
                }
                continue;
            };
            let c = match Inbound::new(&setup, s, from, slot, now) {
                Ok(c) => c,
                Err(e) => {
                    setup.handshake_failed(from, None, &e);
                    continue;
                }
            };
            let fd = c.sock.as_raw_fd();
            let i = self.table.insert(c);
            match self.poll.registry().register(
                &mut SourceFd(&fd),
                Token(i + 1),
                Interest::READABLE,
            ) {
                // This end speaks first (its HELLO): that goes now, and whatever came
                // already is read.
                Ok(()) => self.drive(i),
                Err(e) => {
                    if let Some(c) = self.table.remove(i) {
                        setup.handshake_failed(c.addr, None, &e.into());
                    }
                }
            }
        }
        self.accept_more = true;
    }

    /// Run connection `i`'s setup as far as its socket allows.
    fn drive(&mut self, i: usize) {
        let Some(c) = self.table.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let setup = &self.setup;
        let progress = c.span.clone().in_scope(|| c.drive(setup));
        match progress {
            Progress::Waiting { writable } => {
                // All it could do for now is done (see `Turn`).
                if let Some(slot) = &c.slot {
                    slot.set_turn(c.turn(writable));
                }
                if writable != c.writable {
                    c.writable = writable;
                    let interest = if writable {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    let fd = c.sock.as_raw_fd();
                    if let Err(e) =
                        self.poll
                            .registry()
                            .reregister(&mut SourceFd(&fd), Token(i + 1), interest)
                    {
                        self.fail(i, e.into());
                    }
                }
            }
            Progress::Failed(e) => self.fail(i, e),
            Progress::Done => self.hand_over(i),
        }
    }

    /// The peer proved the secret: its connection gets a thread (certificate, RESUME,
    /// reader).
    fn hand_over(&mut self, i: usize) {
        let Some(c) = self.table.remove(i) else {
            return;
        };
        self.forget(&c);
        if let Some(slot) = &c.slot {
            slot.set_turn(Turn::Proved);
        }
        let (addr, span) = (c.addr, c.span.clone());
        let (h, slot) = match c.into_handshaken() {
            Ok(x) => x,
            Err(e) => {
                span.in_scope(|| self.setup.handshake_failed(addr, None, &e));
                return;
            }
        };
        let st = self.setup.clone();
        let spawned = self
            .threads
            .spawn_inbound(format!("bw-in-{}", self.setup.name), move || {
                st.established(h, slot.map(|s| Box::new(s) as crate::io::setup::Place));
            });
        if let Err(e) = spawned {
            // The closure (socket and slot) was dropped: the connection is closed.
            self.setup.security.spawn_errors.fetch_add(1, Relaxed);
            warn_limited!(node = %self.setup.name, %addr, error = %e, "cannot start a thread for an authenticated connection; closed it");
        }
    }

    /// Close connection `i` for `e`: counted, logged, reported.
    fn fail(&mut self, i: usize, e: crate::io::conn::LinkError) {
        let Some(c) = self.table.remove(i) else {
            return;
        };
        self.forget(&c);
        c.span
            .in_scope(|| self.setup.handshake_failed(c.addr, None, &e));
    }

    /// Connections past their deadline fail.
    fn expire(&mut self, now: Instant) {
        let timeout = self.setup.config.handshake_timeout;
        for i in 0..self.table.slots.len() {
            let late = self.table.slots[i]
                .as_mut()
                .filter(|c| c.deadline <= now)
                .map(|c| c.timed_out(timeout));
            if let Some(e) = late {
                self.fail(i, e);
            }
        }
    }

    /// Stop watching `c`'s socket (before it closes or leaves the loop: a copy of it kept
    /// to cut it, `Setup::slot`, would otherwise keep it registered).
    fn forget(&self, c: &Inbound) {
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&c.sock.as_raw_fd()));
    }
}
