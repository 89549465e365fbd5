//! Inbound connections read on the acceptor's event loop: once RESUME is done, the
//! connection's thread hands it here ([`Reading::adopt`]) and ends, so an inbound peer
//! costs no reader thread. Each readiness of its socket gives the connection a
//! [`Reader::turn`](crate::io::read::Reader::turn): act on what was read, read on without
//! waiting, never wait for a consumer. A connection that still has bytes after
//! [`READS`] reads goes to the back of the line (the socket's edge will not come again
//! for them), so one busy peer cannot starve the others or the handshakes. A thread that
//! leads the connection (a caller waiting for its reply) has the read turn meanwhile and
//! asks for another look when it gives it back. When the reading ends, the loop runs the
//! connection's teardown (`Setup::teardown`), as the reader thread did.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token, Waker};

use crate::io::adopt::{Adopted, Msg};
use crate::io::conn::LinkError;
use crate::io::mailbox::MailboxQueue;
use crate::io::read::Turn;
use crate::io::setup::Setup;

/// Reads of one connection per turn (each up to `read_bytes`) before the others' turns.
pub(super) const READS: usize = 16;

/// Tokens of the connections read here start at this (below: the listener and the
/// handshakes).
pub(super) const BASE: usize = 1 << 30;

/// The event loop's own wake-up.
pub(super) const WAKE: Token = Token(usize::MAX - 1);

/// One connection being read.
struct Read1 {
    a: Adopted,
    generation: u64,
    cache: Option<Arc<MailboxQueue>>,
}

/// The connections the loop reads.
pub(super) struct Readers {
    rx: Receiver<Msg>,
    tx: Sender<Msg>,
    waker: Arc<Waker>,
    slots: Vec<Option<Read1>>,
    free: Vec<usize>,
    generation: u64,
    /// Connections with bytes left after their turn: they go again before the loop waits.
    again: VecDeque<(usize, u64)>,
}

impl Readers {
    pub(super) fn new(rx: Receiver<Msg>, tx: Sender<Msg>, waker: Arc<Waker>) -> Readers {
        Readers {
            rx,
            tx,
            waker,
            slots: Vec::new(),
            free: Vec::new(),
            generation: 0,
            again: VecDeque::new(),
        }
    }

    /// Whether a connection waits for another turn (the loop should not sleep).
    pub(super) fn busy(&self) -> bool {
        !self.again.is_empty()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// Take what other threads sent: new connections (registered, and read at once), and
    /// looks asked for by threads that led.
    pub(super) fn take_messages(&mut self, registry: &Registry, setup: &Setup) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Adopt(a)) => self.adopt(registry, setup, a),
                Ok(Msg::Look(i, g)) => self.turn(registry, setup, i, g),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
    }

    fn adopt(&mut self, registry: &Registry, setup: &Setup, a: Adopted) {
        self.generation += 1;
        let g = self.generation;
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        // A thread that leads asks for a look here when it is done.
        let (tx, waker) = (Mutex::new(self.tx.clone()), self.waker.clone());
        a.conn.set_on_turn_free(Box::new(move || {
            let sent = tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(Msg::Look(i, g))
                .is_ok();
            if sent {
                let _ = waker.wake();
            }
        }));
        let fd = a.conn.link.sock().as_raw_fd();
        let registered = registry.register(&mut SourceFd(&fd), Token(BASE + i), Interest::READABLE);
        self.slots[i] = Some(Read1 {
            a,
            generation: g,
            cache: None,
        });
        match registered {
            // What came with RESUME, and since, is read now.
            Ok(()) => self.turn(registry, setup, i, g),
            Err(e) => self.end(registry, setup, i, Err(e.into())),
        }
    }

    /// A readiness event for token `t`.
    pub(super) fn ready(&mut self, registry: &Registry, setup: &Setup, t: usize) {
        let i = t - BASE;
        if let Some(g) = self
            .slots
            .get(i)
            .and_then(|s| s.as_ref())
            .map(|r| r.generation)
        {
            self.turn(registry, setup, i, g);
        }
    }

    /// The connections left with bytes after their last turn, a turn each.
    pub(super) fn go_again(&mut self, registry: &Registry, setup: &Setup) {
        for _ in 0..self.again.len() {
            let Some((i, g)) = self.again.pop_front() else {
                return;
            };
            self.turn(registry, setup, i, g);
        }
    }

    /// Connection `i` (if still generation `g`): a turn of reading.
    fn turn(&mut self, registry: &Registry, setup: &Setup, i: usize, g: u64) {
        let Some(r) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if r.generation != g {
            return;
        }
        let reader = setup.reader(&r.a.peer, &r.a.conn);
        match reader.turn(&mut r.cache, READS) {
            Turn::Idle => {}
            Turn::More => self.again.push_back((i, g)),
            Turn::Ended(result) => self.end(registry, setup, i, result),
        }
    }

    /// Connection `i`'s reading ended with `result`: forget it, tear it down.
    fn end(&mut self, registry: &Registry, setup: &Setup, i: usize, result: Result<(), LinkError>) {
        let Some(r) = self.slots.get_mut(i).and_then(Option::take) else {
            return;
        };
        self.free.push(i);
        let _ = registry.deregister(&mut SourceFd(&r.a.conn.link.sock().as_raw_fd()));
        // No caller leads a connection whose reading stopped (a turn that ended left
        // nothing; never wait for a leader here).
        if let Some(mut t) = r.a.conn.try_read_turn() {
            *t = None;
        }
        let _span =
            tracing::info_span!("conn", node = %setup.name, peer = %r.a.name, addr = %r.a.addr)
                .entered();
        setup.teardown(&r.a.peer, &r.a.conn, &r.a.name, r.a.addr, result);
    }

    /// The loop ends (the node stopped, or its poll failed): no more hand-offs; every
    /// connection still here, or handed over and not yet taken, is closed and torn down.
    pub(super) fn end_all(&mut self, registry: &Registry, setup: &Setup) {
        if let Some(r) = setup.reading.get() {
            r.close();
        }
        while let Ok(m) = self.rx.try_recv() {
            if let Msg::Adopt(a) = m {
                a.conn.close();
                let _span =
                    tracing::info_span!("conn", node = %setup.name, peer = %a.name, addr = %a.addr)
                        .entered();
                setup.teardown(&a.peer, &a.conn, &a.name, a.addr, Err(LinkError::Eof));
            }
        }
        for i in 0..self.slots.len() {
            if let Some(r) = self.slots[i].as_ref() {
                r.a.conn.close();
                self.end(registry, setup, i, Err(LinkError::Eof));
            }
        }
    }

    /// The node stops: every connection read here is closed, and its reading ends (with
    /// the next events).
    pub(super) fn close_all(&self) {
        for r in self.slots.iter().flatten() {
            r.a.conn.close();
        }
    }
}
