//! Dialing. A peer whose name sorts after ours is this node's to dial (the tie-break that
//! prevents simultaneous connects): its dialer thread connects, runs the connection until it
//! breaks (this thread is its reader), and connects again with exponential back-off, until
//! the node stops or the member leaves. [`Dialers`] keeps one per such peer: the static
//! peers from the start, members as the membership finds them.
//!
//! With connections on demand (`NodeConfig::idle_close`) members are not dialled when they
//! join: either end dials when it has something for the other ([`want`]), and the
//! connection closes when idle. Static peers are always dialled as above.
//!
//! Joining is the one exception to the tie-break: the joiner (`join.rs`) dials seed
//! addresses without knowing whose they are. Once the seed knows us, the
//! node whose name sorts first dials the other, and that connection replaces the join
//! connection if it was the other way round.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchwire_core::codec::Name;
use tracing::{debug, warn};

use crate::io::setup::{Setup, Side};
use crate::io::threads::Threads;

/// Where a dialer dials, and whether it should go on.
struct Target {
    addr: Mutex<SocketAddr>,
    keep: AtomicBool,
    running: AtomicBool,
}

/// The dialers, by peer name (a cheap handle).
#[derive(Clone)]
pub(crate) struct Dialers(Arc<DialersInner>);

pub(crate) struct DialersInner {
    setup: Arc<Setup>,
    threads: Threads,
    map: Mutex<HashMap<Name, Arc<Target>>>,
    /// Static peers: dialled for the node's lifetime whatever the membership says.
    fixed: Vec<Name>,
    /// Connections to members on demand (`NodeConfig::idle_close`): a member is dialled
    /// when a connection to it is wanted (see `peer::demand`), by either end, not when it
    /// joins.
    on_demand: bool,
}

impl Dialers {
    pub fn new(setup: Arc<Setup>, threads: Threads, fixed: Vec<Name>, on_demand: bool) -> Dialers {
        Dialers(Arc::new(DialersInner {
            setup,
            threads,
            map: Mutex::new(HashMap::new()),
            fixed,
            on_demand,
        }))
    }

    /// The handle of what [`Dialers::downgrade`] gave.
    pub fn from_inner(inner: Arc<DialersInner>) -> Dialers {
        Dialers(inner)
    }

    /// A cheap handle that does not keep the dialers alive (for the peers' hooks).
    pub fn downgrade(&self) -> std::sync::Weak<DialersInner> {
        Arc::downgrade(&self.0)
    }

    /// Whether connections are made on demand (then a member's peer is made by the first
    /// send to it, not by its join: see `Runtime::member_peer`).
    pub fn on_demand(&self) -> bool {
        self.0.on_demand
    }

    /// A member is at `addr`. In the mesh: dial it if that is this node's job (its name
    /// sorts after ours) and no dialer runs for it; a running one dials `addr` from its
    /// next attempt on. On demand: remember the address, and dial if a connection to it
    /// is wanted already, and let a session held down take sends again (it is back, as
    /// `incarnation`).
    pub fn ensure(&self, name: &Name, addr: SocketAddr, incarnation: u64) {
        let inner = &self.0;
        if inner.on_demand && !inner.fixed.contains(name) {
            let mut map = inner.map.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(name) {
                Some(t) => {
                    *t.addr.lock().unwrap_or_else(|p| p.into_inner()) = addr;
                    t.keep.store(true, Ordering::Release);
                }
                None => {
                    map.insert(
                        name.detached(),
                        Arc::new(Target {
                            addr: Mutex::new(addr),
                            keep: AtomicBool::new(true),
                            running: AtomicBool::new(false),
                        }),
                    );
                }
            }
            drop(map);
            // Down here and back in the cluster (a restart, a healed partition, a false
            // suspicion): its session takes sends again, and the first one dials (not
            // now: in a large cluster under load, dialing every member that comes back
            // would open connections nobody asked for). A connection already wanted is
            // dialled.
            if let Some(p) = inner.setup.peers.get(name.as_bytes())
                && !p.is_connected()
            {
                p.member_back(incarnation);
                if p.wants_connection() {
                    p.want_connection(false);
                }
            }
            return;
        }
        if inner.setup.name.as_str() >= name.as_str() {
            return;
        }
        let mut map = inner.map.lock().unwrap_or_else(|p| p.into_inner());
        // One target per member, kept while the member is: its dialer (whoever started
        // it) owns `running`, so there is never a second one.
        let t = map
            .entry(name.detached())
            .or_insert_with(|| {
                Arc::new(Target {
                    addr: Mutex::new(addr),
                    keep: AtomicBool::new(true),
                    running: AtomicBool::new(false),
                })
            })
            .clone();
        drop(map);
        *t.addr.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        t.keep.store(true, Ordering::Release);
        if let Err(e) = self.start_dialer(name, t) {
            debug!(node = %inner.setup.name, peer = %name, error = %e, "cannot start a dialer");
        }
    }

    /// Start the mesh dialer of `t` unless one runs (it owns `t.running` while it runs).
    fn start_dialer(&self, name: &Name, t: Arc<Target>) -> std::io::Result<()> {
        if t.running.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let (st, pn, t2) = (self.0.setup.clone(), name.detached(), t.clone());
        let spawned = self.0.threads.spawn(format!("bw-dial-{name}"), move || {
            // Down only if this dialer still owns it (it may have handed it over, see
            // `run_dialer`).
            if run_dialer(&st, &pn, &t2) {
                t2.running.store(false, Ordering::SeqCst);
            }
        });
        if spawned.is_err() {
            t.running.store(false, Ordering::SeqCst);
        }
        spawned
    }

    /// A connection to `name` ended: in the mesh, if this node dials it and no dialer runs
    /// (the one that made it ended once its reader rested, see `run_dialer`), start one.
    pub fn redial(&self, name: &Name) {
        let inner = &self.0;
        if inner.on_demand && !inner.fixed.contains(name) {
            return;
        }
        let map = inner.map.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = map.get(name).cloned() else {
            return;
        };
        drop(map);
        if !t.keep.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.start_dialer(name, t) {
            warn!(node = %inner.setup.name, peer = %name, error = %e, "cannot start a dialer again; the peer's next connection is its to make");
        }
    }

    /// Stop dialing `name` (it left the cluster), unless it is a static peer.
    pub fn stop(&self, name: &Name) {
        if self.0.fixed.contains(name) {
            return;
        }
        if let Some(t) = self
            .0
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            t.keep.store(false, Ordering::Release);
        }
    }

    /// Stop dialing every member `keep` rejects (forgotten by the membership), static
    /// peers excepted.
    /// Entries of members gone whose dialer has ended are dropped, so the table holds at
    /// most the members of the view plus the dialers still winding down (members that come
    /// and go, or that a member with the secret invents, do not pile up here).
    pub fn retain(&self, keep: impl Fn(&Name) -> bool) {
        let mut map = self.0.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|n, t| {
            if keep(n) || self.0.fixed.contains(n) {
                return true;
            }
            t.keep.store(false, Ordering::Release);
            t.running.load(Ordering::Acquire)
        });
    }
}

/// A connection to `name` is wanted (connections on demand; the peer asks once until the
/// dialer ends: see `peer::demand`): start its dialer unless one runs. A member whose address
/// is not known yet is dialled once it is (`Dialers::ensure`).
pub(crate) fn want(inner: &std::sync::Weak<DialersInner>, name: &Name) {
    let peer = |inner: &DialersInner| inner.setup.peers.get(name.as_bytes());
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let map = inner.map.lock().unwrap_or_else(|p| p.into_inner());
    let Some(t) = map
        .get(name)
        .filter(|t| t.keep.load(Ordering::Acquire))
        .cloned()
    else {
        drop(map);
        if let Some(p) = peer(&inner) {
            p.dial_unavailable();
        }
        return;
    };
    drop(map);
    if t.running.swap(true, Ordering::AcqRel) {
        return;
    }
    let (st, pn, t2) = (inner.setup.clone(), name.detached(), t.clone());
    let spawned = inner.threads.spawn(format!("bw-dial-{name}"), move || {
        run_on_demand(&st, &pn, &t2);
        t2.running.store(false, Ordering::Release);
        // Wanted again since it looked (or never connected): ask again.
        if let Some(p) = st.peers.get(pn.as_bytes())
            && p.dial_ended()
            && !st.shutdown.is_stopped()
            && t2.keep.load(Ordering::Acquire)
        {
            p.want_connection(false);
        }
    });
    if let Err(e) = spawned {
        t.running.store(false, Ordering::Release);
        debug!(node = %inner.setup.name, peer = %name, error = %e, "cannot start a dialer");
        if let Some(p) = peer(&inner) {
            p.dial_unavailable();
        }
    }
}

/// The dialer of a connection on demand: dial while the peer has no connection and wants
/// one (something pending, or asked for), with back-off; read each connection until it
/// ends. Ends when the peer is connected (perhaps by its own dial) or wants nothing.
fn run_on_demand(setup: &Arc<Setup>, name: &Name, target: &Target) {
    let mut backoff = Backoff::new(setup.config.reconnect_min, setup.config.reconnect_max);
    let mut failures = 0u32;
    loop {
        if setup.shutdown.is_stopped() || !target.keep.load(Ordering::Acquire) {
            return;
        }
        let Some(p) = setup.peers.get(name.as_bytes()) else {
            return;
        };
        if p.is_connected() || !p.wants_connection() {
            return;
        }
        drop(p);
        let addr = *target.addr.lock().unwrap_or_else(|p| p.into_inner());
        let connected = dial_once(setup, name, addr, &mut failures);
        if !setup.shutdown.sleep(backoff.after(connected)) {
            return;
        }
    }
}

/// One attempt: connect to `addr` and run the connection to its end (this thread is its
/// reader). Returns whether its handshake completed.
fn dial_once(setup: &Arc<Setup>, peer: &Name, addr: SocketAddr, failures: &mut u32) -> bool {
    match TcpStream::connect_timeout(&addr, setup.config.handshake_timeout) {
        Ok(s) => {
            let ok = setup.run(s, Side::Dial(peer.clone()));
            if ok {
                *failures = 0;
            }
            ok
        }
        Err(e) => {
            *failures += 1;
            // A member that cannot be reached again (refused: nothing listens; timed
            // out or no route: the host is gone): tell the membership at once (it
            // suspects the member, which refutes if it is alive), not at the
            // member's next probe. A connect aborted or reset on the way (a
            // middlebox, `ss -K`) says nothing about the member.
            if *failures == 1
                && says_unreachable(&e)
                && let Some(m) = &setup.members
            {
                m.unreachable(peer);
            }
            // Log the first failure and then rarely: a peer that is not up yet is normal.
            if *failures == 1 || failures.is_power_of_two() {
                debug!(node = %setup.name, %peer, %addr, error = %e, failures = *failures, "cannot connect yet; retrying with back-off");
            }
            false
        }
    }
}

/// The wait between connection attempts: from `min`, doubling after each attempt up to
/// `max`, and from `min` again after an attempt whose handshake completed (a connection
/// that keeps being re-established is never waited on longer and longer).
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// How long to wait after an attempt; `connected`: its handshake completed.
    pub(crate) fn after(&mut self, connected: bool) -> Duration {
        if connected {
            self.next = self.min;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.max).max(Duration::from_millis(1));
        wait
    }
}

/// The mesh dialer of `peer`. Returns whether it still owns `target.running` (false: it
/// handed the flag over, see below, and must not touch it).
fn run_dialer(setup: &Arc<Setup>, peer: &Name, target: &Target) -> bool {
    let mut backoff = Backoff::new(setup.config.reconnect_min, setup.config.reconnect_max);
    let mut failures = 0u32;
    let go_on = || !setup.shutdown.is_stopped() && target.keep.load(Ordering::Acquire);
    while go_on() {
        // A live canonical connection already serves the peer: the one this dialer made,
        // whose reader rests (see `io::resting`), or the one this node dialled to join
        // through it (our name sorts first, so it is canonical). Dialing again would
        // replace it, and what the peer wrote on it and does not send again on the new one
        // (an undeliverable notice) could be lost with it. This thread ends; the
        // connection's teardown starts a dialer again (`Dialers::redial`). The flag goes
        // down first and the connection is looked at again, so one of the two sees the
        // other.
        if let Some(p) = setup.peers.get(peer.as_bytes())
            && p.current_is_live_canonical()
        {
            target.running.store(false, Ordering::SeqCst);
            if p.current_is_live_canonical()
                || !go_on()
                || target.running.swap(true, Ordering::SeqCst)
            {
                return false;
            }
            continue;
        }
        let addr = *target.addr.lock().unwrap_or_else(|p| p.into_inner());
        let connected = dial_once(setup, peer, addr, &mut failures);
        if !setup.shutdown.sleep(backoff.after(connected)) {
            break;
        }
    }
    true
}

/// Whether a failed connect says the peer is not there (rather than that the attempt was
/// cut on the way).
fn says_unreachable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | TimedOut | HostUnreachable | NetworkUnreachable | AddrNotAvailable
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_bound_and_starts_over_after_a_handshake() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let waits: Vec<_> = (0..5).map(|_| b.after(false)).collect();
        assert_eq!(waits, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        assert_eq!(b.after(true), ms(50), "a completed handshake starts over");
        assert_eq!(b.after(false), ms(100));
        // A zero minimum still waits (no spinning).
        let mut z = Backoff::new(ms(0), ms(10));
        assert_eq!(z.after(false), ms(0));
        assert_eq!(z.after(false), ms(1));
    }
}
