//! The node's one thread for resting connections: connections (plain TCP or TLS) whose reader thread
//! ended because nothing moved either way for `thread_linger` (see `read::Stopped::Rested`).
//!
//! Each is registered with one `mio` poll (edge-triggered: a connection is parked only with
//! its socket read empty, and one that became readable meanwhile is reported when it is
//! registered). When one is readable this thread reads and acts on what came, as a leader
//! would (`Reader::serve_rested`: heartbeats, acknowledgements, a lone message), and leaves
//! it parked; a connection that needs more (a stream, a piece read in place, a thread
//! leading it, its end) is taken off the poll and given a reader thread again, which reads
//! on and, if it ended, tears it down as usual (`setup::Reading`). So an idle peer costs no
//! thread, and none is started for its heartbeats.
//!
//! The thread starts with the first connection that rests (a node whose connections never
//! rest has none), sleeps in `epoll_wait` until one is readable or it is woken, and at
//! shutdown gives every connection still parked a reader thread (which sees the node's last
//! sweep close it) and ends.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batchwire_core::codec::Name;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use tracing::warn;

use crate::io::shutdown::Shutdown;
use crate::io::threads::Threads;

/// The token of the thread's waker (connections have 1 and up).
const WAKE: Token = Token(0);
/// Most often the allocator is asked to give free pages back as connections come to rest.
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// A resting connection, as this thread sees it (`setup::Reading` is the one there is).
pub(crate) trait Rested: Send + Sized + 'static {
    /// Its socket.
    fn fd(&self) -> RawFd;
    /// It is readable: read what is there; whether it may go on resting.
    fn serve(&self) -> bool;
    /// It rests: let go of the buffers its reads need only while they run; whether any
    /// was let go.
    fn release(&self) -> bool;
    /// On a thread of its own: read on (and tear down at the end).
    fn go(self);
    /// No thread could be started for it: close it and tear it down.
    fn fail(self, e: std::io::Error);
}

/// A cheap handle on the node's resting connections.
pub(crate) struct Resting<T>(Arc<Inner<T>>);

impl<T> Clone for Resting<T> {
    fn clone(&self) -> Self {
        Resting(self.0.clone())
    }
}

struct Inner<T> {
    node: Name,
    registry: Registry,
    waker: Waker,
    /// The poll, until the thread takes it.
    poll: Mutex<Option<Poll>>,
    started: AtomicBool,
    parked: Mutex<Parked<T>>,
    threads: Threads,
    shutdown: Shutdown,
}

struct Parked<T> {
    by_token: HashMap<usize, T>,
    next: usize,
    /// The thread ended (shutdown): nothing parks any more.
    closed: bool,
    /// Buffers were let go as connections came to rest since the allocator last gave its
    /// free pages back (see `run`).
    to_trim: u8,
}

impl<T: Rested> Resting<T> {
    pub fn new(node: Name, threads: Threads, shutdown: Shutdown) -> std::io::Result<Self> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        Ok(Resting(Arc::new(Inner {
            node,
            registry,
            waker,
            poll: Mutex::new(Some(poll)),
            started: AtomicBool::new(false),
            parked: Mutex::new(Parked {
                by_token: HashMap::new(),
                next: 1,
                closed: false,
                to_trim: 0,
            }),
            threads,
            shutdown,
        })))
    }

    /// Park a connection whose reader thread rests (its socket `fd` read empty). Hands it
    /// back if it cannot rest here (the node stops, or the poll refused it): the caller
    /// reads on.
    pub fn park(&self, fd: RawFd, r: T) -> Result<(), T> {
        let inner = &self.0;
        if inner.shutdown.is_stopped() || !self.ensure_thread() {
            return Err(r);
        }
        let released = r.release();
        let token = {
            let mut g = inner.parked.lock().unwrap_or_else(|p| p.into_inner());
            if g.closed {
                return Err(r);
            }
            if released && g.to_trim == 0 {
                g.to_trim = 1;
                let _ = inner.waker.wake();
            }
            let t = g.next;
            g.next += 1;
            g.by_token.insert(t, r);
            t
        };
        // Registered after it is in the table: an event for it finds it there.
        if let Err(e) =
            inner
                .registry
                .register(&mut SourceFd(&fd), Token(token), Interest::READABLE)
        {
            warn!(node = %inner.node, error = %e, "cannot watch a resting connection; its reader goes on");
            let mut g = inner.parked.lock().unwrap_or_else(|p| p.into_inner());
            return match g.by_token.remove(&token) {
                Some(r) => Err(r),
                // The thread took it meanwhile (it stopped): it gave it a reader.
                None => Ok(()),
            };
        }
        Ok(())
    }

    /// The node stops: the thread gives every parked connection a reader and ends.
    pub fn stop(&self) {
        let _ = self.0.waker.wake();
    }

    fn ensure_thread(&self) -> bool {
        let inner = &self.0;
        if inner.started.load(Ordering::Acquire) {
            return true;
        }
        // One starter at a time, holding the poll: another thread that would park meanwhile
        // waits for it here, and a start that failed leaves the poll for the next try.
        let mut slot = inner.poll.lock().unwrap_or_else(|p| p.into_inner());
        if inner.started.load(Ordering::Acquire) {
            return true;
        }
        let Some(poll) = slot.take() else {
            return false;
        };
        let handover = Arc::new(Mutex::new(Some(poll)));
        let (me, h2) = (self.clone(), handover.clone());
        let spawned = inner
            .threads
            .spawn(format!("bw-rest-{}", inner.node), move || {
                let poll = h2.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(poll) = poll {
                    me.run(poll)
                }
            });
        match spawned {
            Ok(()) => {
                inner.started.store(true, Ordering::Release);
                true
            }
            Err(e) => {
                *slot = handover.lock().unwrap_or_else(|p| p.into_inner()).take();
                warn!(node = %inner.node, error = %e, "cannot start the thread for resting connections; readers stay");
                false
            }
        }
    }

    fn run(&self, mut poll: Poll) {
        let inner = &self.0;
        let mut events = Events::with_capacity(256);
        let mut trimmed: Option<Instant> = None;
        loop {
            if inner.shutdown.is_stopped() {
                break;
            }
            // Connections came to rest and let go of buffers: their pages go back to the
            // kernel, at most once every `TRIM_EVERY` (a thousand connections resting at
            // once are one trim).
            let wait = if inner
                .parked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .to_trim
                > 0
            {
                let now = Instant::now();
                match trimmed.map(|t| t + TRIM_EVERY).filter(|&due| due > now) {
                    Some(due) => Some(due - now),
                    None => {
                        inner
                            .parked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .to_trim = 0;
                        crate::sys::release_free_memory();
                        trimmed = Some(Instant::now());
                        None
                    }
                }
            } else {
                None
            };
            if let Err(e) = poll.poll(&mut events, wait) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                warn!(node = %inner.node, error = %e, "waiting for resting connections failed; they get their readers back");
                break;
            }
            for ev in events.iter() {
                let token = ev.token().0;
                if token == WAKE.0 {
                    continue;
                }
                let Some(r) = inner
                    .parked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .by_token
                    .remove(&token)
                else {
                    continue;
                };
                if r.serve() {
                    r.release();
                    let mut g = inner.parked.lock().unwrap_or_else(|p| p.into_inner());
                    g.by_token.insert(token, r);
                } else {
                    self.wake_reader(r);
                }
            }
        }
        let all: Vec<T> = {
            let mut g = inner.parked.lock().unwrap_or_else(|p| p.into_inner());
            g.closed = true;
            g.by_token.drain().map(|(_, r)| r).collect()
        };
        for r in all {
            self.wake_reader(r);
        }
    }

    /// Take `r` off the poll and give it a reader thread (or, if none can start, close it
    /// and tear it down here).
    fn wake_reader(&self, r: T) {
        let inner = &self.0;
        let _ = inner.registry.deregister(&mut SourceFd(&r.fd()));
        let slot = Arc::new(Mutex::new(Some(r)));
        let s2 = slot.clone();
        let spawned = inner
            .threads
            .spawn_inbound(format!("bw-read-{}", inner.node), move || {
                if let Some(r) = s2.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    r.go();
                }
            });
        if let Err(e) = spawned
            && let Some(r) = slot.lock().unwrap_or_else(|p| p.into_inner()).take()
        {
            warn!(node = %inner.node, error = %e, "cannot start a reader thread for a connection; closed it (it resumes on the next one)");
            r.fail(e);
        }
    }
}
