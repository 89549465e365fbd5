//! The node's peers by name and by id, and how a peer comes to be: its session, its lane and
//! its writer thread. At most `max_peers`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use batchwire_core::codec::Name;
use batchwire_core::outbox::Dest;
use batchwire_core::session::{DownReason, PeerState, Session};

use crate::config::NodeConfig;
use crate::io::NameHash;
use crate::io::flow::Flow;
use crate::io::lane::{Lane, LaneCfg};
use crate::io::peer::{Peer, PeerCtx};
use crate::io::shutdown::Shutdown;
use crate::io::threads::Threads;
use crate::io::write::{WriterCfg, run_writer};

/// A cheap handle on the registry.
#[derive(Clone)]
pub(crate) struct Peers(Arc<Inner>);

struct Inner {
    /// This registry's own tag in [`LAST`] (unique in the process, never 0).
    tag: u32,
    map: RwLock<HashMap<Name, Arc<Peer>, NameHash>>,
    /// The first peers again, for the send path's lookup without a lock.
    index: Index<Arc<Peer>>,
    /// By id (a peer's `Dest`); a removed peer's slot is empty (ids are never reused).
    by_id: RwLock<Vec<Option<Arc<Peer>>>>,
    maker: Maker,
}

/// What it takes to make a peer.
struct Maker {
    ctx: Arc<PeerCtx>,
    config: NodeConfig,
    threads: Threads,
    shutdown: Shutdown,
    /// Transfer-queue: the bundler thread fills the windows; writers only write.
    shared: bool,
    /// Transfer-queue: set once the bundler has drained the shared lane at shutdown.
    shared_done: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Why a peer could not be added.
#[derive(Debug)]
pub(crate) enum AddError {
    /// `max_peers` reached.
    Full(usize),
}

impl Peers {
    pub fn new(
        ctx: Arc<PeerCtx>,
        config: NodeConfig,
        threads: Threads,
        shutdown: Shutdown,
        shared_done: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> Peers {
        let shared = config.bundler.kind.shared_queue();
        static TAGS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        Peers(Arc::new(Inner {
            tag: TAGS.fetch_add(1, Ordering::Relaxed).max(1),
            map: RwLock::new(HashMap::default()),
            index: Index::new(config.max_peers.min(INDEX_PEERS)),
            by_id: RwLock::new(Vec::new()),
            maker: Maker {
                ctx,
                config,
                threads,
                shutdown,
                shared,
                shared_done,
            },
        }))
    }

    /// The peer called `name`.
    pub fn get(&self, name: &[u8]) -> Option<Arc<Peer>> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .filter(|p| !p.is_removed())
            .cloned()
    }

    /// Run `f` on the peer called `name` (the send path): found in the index without a
    /// lock or a reference count, or, past the index's first peers, in the registry's map
    /// (a reference counted; no lock is held while `f` runs).
    pub fn with<R>(&self, name: &[u8], f: impl FnOnce(Option<&Arc<Peer>>) -> R) -> R {
        self.with_remembered(name, false, f)
    }

    /// The peer called `name` if it is the one this thread last found in this registry
    /// with `remember` (see [`LAST`]): the send path's lookup without hashing, for a
    /// thread that keeps sending to one node.
    #[inline]
    pub fn last_found(&self, name: &[u8]) -> Option<&Arc<Peer>> {
        let h = LAST.get();
        if (h >> 32) as u32 != self.0.tag {
            return None;
        }
        self.0
            .index
            .at(h as u32 as usize)
            .filter(|p| batchwire_core::codec::bytes_eq(p.key(), name) && !p.is_removed())
    }

    /// [`Peers::with`]; with `remember`, the peer found in the index is the one
    /// [`Peers::last_found`] gives this thread next. (The send path remembers only names
    /// it has checked are not this node's own.)
    pub fn with_remembered<R>(
        &self,
        name: &[u8],
        remember: bool,
        f: impl FnOnce(Option<&Arc<Peer>>) -> R,
    ) -> R {
        if let Some((i, p)) = self.0.index.find(name) {
            if remember {
                LAST.set(u64::from(self.0.tag) << 32 | i as u64);
            }
            return f(Some(p));
        }
        if !self.0.index.is_full() {
            // Every peer is in the index (one being added right now is not there yet, as
            // if looked up a moment earlier).
            return f(None);
        }
        // Cloned out, so no lock is held while `f` runs: the send path may look up a peer
        // again (a dial, with connections on demand), and a second read of an `RwLock` on
        // one thread can wait behind a writer that waits for the first.
        let p = self.get(name);
        f(p.as_ref())
    }

    pub fn by_id(&self, id: Dest) -> Option<Arc<Peer>> {
        self.0
            .by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id as usize)
            .cloned()
            .flatten()
    }

    /// Run `f` on every peer, in id order, until it breaks: without a lock or a reference
    /// count while the index holds every peer (the send-to-all path), else on a copy of the
    /// list. No lock is held while `f` runs, so it may wait.
    pub fn for_each<B>(
        &self,
        mut f: impl FnMut(&Arc<Peer>) -> std::ops::ControlFlow<B>,
    ) -> std::ops::ControlFlow<B> {
        if !self.0.index.is_full() {
            for p in self.0.index.in_order() {
                f(p)?;
            }
            // A peer added meanwhile past the index's capacity is left out, as if added
            // a moment later.
            return std::ops::ControlFlow::Continue(());
        }
        for p in &self.all() {
            f(p)?;
        }
        std::ops::ControlFlow::Continue(())
    }

    /// Every peer, in id order.
    pub fn all(&self) -> Vec<Arc<Peer>> {
        self.0
            .by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Remove the peers that are not pinned (configured), for which `keep` says no (not
    /// members any more: forgotten by the membership), and that hold nothing (see
    /// `Peer::remove_if_idle`): their writer threads end, and they no longer count
    /// against `max_peers`. Not with transfer-queue, whose shared lane may hold messages
    /// for any peer. Returns how many were removed.
    pub fn remove_forgotten(&self, keep: impl Fn(&Name) -> bool) -> usize {
        self.remove_where(|p| !keep(&p.name))
    }

    /// Remove the unpinned peers `gone` says yes to that hold nothing (see
    /// [`Peers::remove_forgotten`]).
    fn remove_where(&self, gone: impl Fn(&Peer) -> bool) -> usize {
        if self.0.maker.shared {
            return 0;
        }
        let candidates: Vec<Arc<Peer>> = self
            .all()
            .into_iter()
            .filter(|p| !p.pinned.load(Ordering::Acquire) && gone(p))
            .collect();
        let mut removed = 0;
        for p in candidates {
            // No registry lock while the peer's own locks are taken.
            if !p.remove_if_idle() {
                continue;
            }
            let mut map = self.0.map.write().unwrap_or_else(|e| e.into_inner());
            if map
                .get(p.name.as_bytes())
                .is_some_and(|q| Arc::ptr_eq(q, &p))
            {
                map.remove(p.name.as_bytes());
            }
            let mut by_id = self.0.by_id.write().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = by_id.get_mut(p.id as usize) {
                *slot = None;
            }
            removed += 1;
        }
        removed
    }

    /// The registry is full: remove the peers nobody configured that are not live members
    /// (`live`), whose nodes said goodbye (that incarnation ended: it never resumes, and a
    /// later start of the node is a new incarnation, which starts afresh anyway), and that
    /// hold nothing (see `Peer::remove_if_idle`), so that a node that connects, or a member
    /// sent to, finds room. Peers of nodes that came and went without being members
    /// (short-lived nodes without membership, members refused from a full view) would
    /// otherwise fill it for good. A peer merely disconnected, or declared down for
    /// silence, is kept: its node may still resume that incarnation, and what this node
    /// received from it but had not acknowledged would come again to a fresh session.
    /// Returns how many were removed.
    pub fn make_room(&self, live: impl Fn(&Name) -> bool) -> usize {
        self.remove_where(|p| {
            // The state is an atomic mirror: the session is locked only for those down.
            p.state() == PeerState::Down
                && !live(&p.name)
                && p.session(|s, _| s.down_reason()) == Some(DownReason::Left)
        })
    }

    /// How a peer's writer thread is started (see `Peer::ensure_writer`): it runs while the
    /// peer has a connection or something queued.
    pub fn writer_spawner(
        &self,
    ) -> impl Fn(Arc<Peer>) -> std::io::Result<()> + Send + Sync + use<> {
        let m = &self.0.maker;
        let (threads, shutdown, node) = (m.threads.clone(), m.shutdown.clone(), m.ctx.node.clone());
        let bundler = (!m.shared).then_some(m.config.bundler);
        let shared_done = m.shared_done.clone();
        let linger = m.config.thread_linger;
        let idle_close = m
            .config
            .on_demand()
            .then_some(m.config.idle_close)
            .flatten();
        move |p: Arc<Peer>| {
            let wcfg = WriterCfg {
                bundler,
                shared_done: shared_done.clone(),
                // Static peers stay connected.
                idle_close: idle_close.filter(|_| !p.pinned.load(Ordering::Acquire)),
                linger,
            };
            let (sd, node) = (shutdown.clone(), node.clone());
            threads.spawn(format!("bw-write-{node}-{}", p.name), move || {
                let _span = tracing::info_span!("writer", node = %node, peer = %p.name).entered();
                run_writer(p, wcfg, sd)
            })
        }
    }

    /// The peer called `name`, made if there is none yet (its writer starts with its first
    /// connection or message): a
    /// configured peer, or one that just proved it holds the secret (up to `max_peers`).
    pub fn get_or_insert(&self, name: &Name) -> Result<Arc<Peer>, AddError> {
        self.insert_within(name, self.0.maker.config.max_peers)
    }

    /// [`Peers::get_or_insert`] for a member learnt from membership, which nobody has
    /// authenticated yet (a member holding the secret can invent any): such peers fill at
    /// most three quarters of `max_peers`, so the rest stays for nodes that connect.
    pub fn get_or_insert_learnt(&self, name: &Name) -> Result<Arc<Peer>, AddError> {
        let max = self.0.maker.config.max_peers;
        self.insert_within(name, learnt_limit(max))
    }

    fn insert_within(&self, name: &Name, limit: usize) -> Result<Arc<Peer>, AddError> {
        if let Some(p) = self.get(name.as_bytes()) {
            return Ok(p);
        }
        let mut map = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(name.as_bytes()).filter(|p| !p.is_removed()) {
            return Ok(p.clone());
        }
        let m = &self.0.maker;
        if map.len() >= limit {
            return Err(AddError::Full(limit));
        }
        let mut by_id = self.0.by_id.write().unwrap_or_else(|p| p.into_inner());
        let cfg = &m.config;
        let bundler = cfg.bundler.build();
        let lane = Arc::new(Lane::new(LaneCfg::new(cfg, true), bundler.as_ref()));
        let flow = Arc::new(Flow::new(
            cfg.mailbox_bytes as u64,
            cfg.max_payload as u64,
            lane.clone(),
        ));
        // What is held for a peer never reached is handed back if no connection comes in
        // time (see `Session::require_reach`), unless it is configured (the node's start
        // clears it for those, which may simply not have started yet). The time covers a
        // whole first connection: the longer of `peer_timeout` and a handshake, and the
        // longest pause between dials.
        let mut session = Session::new(cfg.session.clone(), Instant::now());
        session.require_reach(Some(
            cfg.session.peer_timeout.max(cfg.handshake_timeout) + cfg.reconnect_max,
        ));
        let peer = Peer::new(
            by_id.len() as Dest,
            name.clone(),
            m.ctx.clone(),
            session,
            lane,
            flow,
        );
        by_id.push(Some(peer.clone()));
        // Under the map's write lock: one adder at a time.
        self.0.index.insert(&peer);
        map.insert(name.clone(), peer.clone());
        Ok(peer)
    }
}

/// How many peers members learnt from membership may fill (see
/// [`Peers::get_or_insert_learnt`]): three quarters of `max_peers`, all of a tiny table.
fn learnt_limit(max_peers: usize) -> usize {
    if max_peers < 4 {
        max_peers
    } else {
        max_peers - max_peers / 4
    }
}

thread_local! {
    /// Where this thread last found a peer in the index: the registry's tag in the high 32
    /// bits, the slot in the low ones (0: none). Only a hint: checked against the slot's
    /// peer name before use, and a slot never changes once set (see `Index`), so a hint
    /// from another registry or for another name only costs the ordinary lookup.
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The index holds at most this many peers (the others are looked up under the lock).
const INDEX_PEERS: usize = 4096;

/// An open-addressing table of peers by name that is read without a lock. Sound because a
/// slot, once set, holds the same peer for the registry's life, so a reader sees an empty
/// slot or a peer, never a peer being torn down. A peer removed from the registry (a
/// member forgotten) stays in its slot, skipped by lookups, until the registry goes: at
/// most `INDEX_PEERS` of them, each a shell (its removal let go of its queue's and
/// window's buffers, see `Peer::remove_if_idle`); a peer made again under the name takes
/// a new slot. At most half full, so a probe always ends at an empty slot.
struct Index<T> {
    slots: Box<[OnceLock<T>]>,
    /// The same entries in the order they were added (a peer's id order).
    order: Box<[OnceLock<T>]>,
    mask: usize,
    /// Peers in the index, at most `capacity`.
    len: AtomicUsize,
    capacity: usize,
}

/// What the index is keyed by.
trait Keyed {
    fn key(&self) -> &[u8];
    /// Removed from the registry: lookups go past it.
    fn is_removed(&self) -> bool {
        false
    }
}

impl Keyed for Arc<Peer> {
    fn key(&self) -> &[u8] {
        self.name.as_bytes()
    }
    fn is_removed(&self) -> bool {
        Peer::is_removed(self)
    }
}

impl<T: Keyed + Clone> Index<T> {
    fn new(capacity: usize) -> Index<T> {
        let size = (capacity * 2).next_power_of_two().max(2);
        Index {
            slots: (0..size).map(|_| OnceLock::new()).collect(),
            order: (0..capacity).map(|_| OnceLock::new()).collect(),
            mask: size - 1,
            len: AtomicUsize::new(0),
            capacity,
        }
    }

    fn home(&self, name: &[u8]) -> usize {
        let mut h = NameHash.build_hasher();
        h.write(name);
        h.finish() as usize & self.mask
    }

    /// The entry called `name` and its slot.
    fn find(&self, name: &[u8]) -> Option<(usize, &T)> {
        let mut i = self.home(name);
        // At most half the slots are set, so this ends; bounded anyway.
        for _ in 0..self.slots.len() {
            let p = self.slots[i].get()?;
            if batchwire_core::codec::bytes_eq(p.key(), name) && !p.is_removed() {
                return Some((i, p));
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// The entry in slot `i`, if any.
    #[inline]
    fn at(&self, i: usize) -> Option<&T> {
        self.slots.get(i)?.get()
    }

    fn is_full(&self) -> bool {
        self.len.load(Ordering::Acquire) >= self.capacity
    }

    /// Add `p` (not in the index yet) unless the index is full. One caller at a time.
    fn insert(&self, p: &T) {
        if self.is_full() {
            return;
        }
        let mut i = self.home(p.key());
        while self.slots[i].get().is_some() {
            i = (i + 1) & self.mask;
        }
        let _ = self.slots[i].set(p.clone());
        let n = self.len.load(Ordering::Relaxed);
        let _ = self.order[n].set(p.clone());
        self.len.store(n + 1, Ordering::Release);
    }

    /// The entries in the order they were added.
    fn in_order(&self) -> impl Iterator<Item = &T> {
        let n = self.len.load(Ordering::Acquire);
        self.order[..n]
            .iter()
            .filter_map(OnceLock::get)
            .filter(|p| !p.is_removed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Keyed for String {
        fn key(&self) -> &[u8] {
            self.as_bytes()
        }
    }

    #[test]
    fn the_index_finds_every_peer_it_took_and_stops_taking_at_its_capacity() {
        let ix: Index<String> = Index::new(100);
        assert!(ix.find(b"n0").is_none());
        for i in 0..150 {
            let name = format!("n{i}");
            ix.insert(&name);
            assert_eq!(ix.is_full(), i + 1 >= 100);
        }
        let order: Vec<&String> = ix.in_order().collect();
        assert_eq!(order.len(), 100);
        assert!(
            order
                .iter()
                .enumerate()
                .all(|(i, n)| **n == format!("n{i}"))
        );
        for i in 0..150 {
            let name = format!("n{i}");
            // The first 100 are found; the rest are left to the locked map.
            assert_eq!(ix.find(name.as_bytes()).is_some(), i < 100, "{name}");
        }
        assert!(ix.find(b"").is_none());
        assert!(ix.find(b"n1000").is_none());
        // At most half full: a probe always ends.
        assert!(ix.slots.len() >= 200);
        let tiny: Index<String> = Index::new(0);
        tiny.insert(&"a".to_string());
        assert!(tiny.find(b"a").is_none() && tiny.is_full());
    }
}
