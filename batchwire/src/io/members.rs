//! The membership thread's handle: how readers, connections and the API talk to the
//! thread (a bounded channel that never blocks them) and read its view. The thread itself
//! is in `membership.rs`.
//!
//! What the thread does: it owns the SWIM state machine (`core::membership::Membership`)
//! and nothing else touches it. It reads the membership datagrams itself
//! (`datagrams::DatagramReader`), and takes the other inputs from a bounded channel, each
//! followed by a wake-up datagram:
//! joins (from `Setup`, once a connection to a seed or a static peer is up), the dialers'
//! "unreachable" hints, and the leave at shutdown. It acts on what the machine says:
//! packets go out as sealed datagrams (`datagrams.rs`), never on a data connection; new
//! members get a peer and (if our name sorts first) a
//! dialer, departed members have their session declared down (what was pending for them
//! is reported failed) and, once they left or were forgotten, their dialer stopped; every
//! change is an event, and the view is published as a snapshot for `Node::members`.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use batchwire_core::codec::{Name, NameMap};
use batchwire_core::membership::{MemberId, MemberState};

use crate::event::Member;
use crate::io::datagrams::DatagramWaker;

/// Inputs waiting for the thread, at most this many (then they are dropped and counted).
const INBOX: usize = 4096;

pub(crate) enum Input {
    Join(MemberId),
    /// A handshake completed with this node (its name, its incarnation).
    Heard(Name, u64),
    Unreachable(Name),
    Leave(SyncSender<()>),
    /// Look at the shutdown signal now.
    Wake,
}

/// The published view: the members as the membership machine reports them, and their
/// public form once someone asked for it.
#[derive(Default)]
struct View {
    ids: NameMap<(MemberId, MemberState)>,
    built: Option<Arc<[Member]>>,
}

/// The public form of a member.
pub(crate) fn member(id: &MemberId, state: MemberState) -> Member {
    Member {
        name: id.name.to_string(),
        addr: id.addr,
        incarnation: id.started,
        state,
    }
}

/// A cheap handle: how the rest of the node talks to the membership thread, and the view.
#[derive(Clone)]
pub(crate) struct Members {
    tx: SyncSender<Input>,
    /// Written by the membership thread only.
    view: Arc<RwLock<View>>,
    dropped: Arc<AtomicU64>,
    /// Wakes the thread, which waits on its socket (set once the socket is bound).
    waker: Arc<std::sync::OnceLock<DatagramWaker>>,
    /// Moves on at every change of the view (see `Runtime::member_peers`).
    generation: Arc<AtomicU64>,
}

impl Members {
    /// A handle and the receiving end for the thread.
    pub fn new() -> (Members, Receiver<Input>) {
        let (tx, rx) = sync_channel(INBOX);
        let m = Members {
            tx,
            view: Arc::new(RwLock::new(View::default())),
            dropped: Arc::default(),
            waker: Arc::default(),
            generation: Arc::default(),
        };
        (m, rx)
    }

    /// How the thread is woken from now on (once; see `datagrams::DatagramWaker`).
    pub fn set_waker(&self, w: DatagramWaker) {
        let _ = self.waker.set(w);
        self.kick();
    }

    fn kick(&self) {
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }

    fn offer(&self, i: Input) {
        match self.tx.try_send(i) {
            Ok(()) => self.kick(),
            Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// A connection to `seed` is up: announce ourselves to it.
    pub fn join(&self, seed: MemberId) {
        self.offer(Input::Join(seed));
    }

    /// A handshake completed with `name`, whose process started at `incarnation`: direct
    /// evidence that it is alive (see `core::membership::Membership`).
    pub fn heard(&self, name: &Name, incarnation: u64) {
        self.offer(Input::Heard(name.detached(), incarnation));
    }

    /// A dialer lost its member and cannot reach it again.
    pub fn unreachable(&self, name: &Name) {
        self.offer(Input::Unreachable(name.clone()));
    }

    /// Announce our leave; returns once the leave datagrams are sent (or
    /// after `timeout`).
    pub fn leave(&self, timeout: Duration) {
        let deadline = crate::io::deadline_after(timeout);
        let (tx, rx) = sync_channel(1);
        let mut leave = Input::Leave(tx);
        // The inbox may be full for a moment: retry until the deadline, never block on it.
        loop {
            match self.tx.try_send(leave) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
                    self.kick();
                    leave = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
        let _ = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
    }

    /// Wake the thread (it then sees the node stopped).
    pub fn wake(&self) {
        let _ = self.tx.try_send(Input::Wake);
        self.kick();
    }

    /// The current view (other members, with their states), sorted by name.
    pub fn view(&self) -> Arc<[Member]> {
        if let Some(v) = &self.view.read().unwrap_or_else(|p| p.into_inner()).built {
            return v.clone();
        }
        let mut w = self.view.write().unwrap_or_else(|p| p.into_inner());
        let View { ids, built } = &mut *w;
        built
            .get_or_insert_with(|| {
                let mut v: Vec<Member> = ids.values().map(|(id, st)| member(id, *st)).collect();
                v.sort_by(|a, b| a.name.cmp(&b.name));
                Arc::from(v)
            })
            .clone()
    }

    /// Publish a new view, whole (the membership thread, when members left it): the
    /// public form is built when first read.
    pub(crate) fn publish(&self, view: Vec<(MemberId, MemberState)>) {
        let ids = view.into_iter().map(|e| (e.0.name.detached(), e)).collect();
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = View { ids, built: None };
        self.generation.fetch_add(1, Release);
    }

    /// Publish changed entries (the membership thread, after a change with no member
    /// leaving). A thousand members joining at once change the view at nearly every
    /// packet: a copy of the whole view each time, or its public form (a `String` a
    /// member, sorted), was most of what each node did during the join.
    pub(crate) fn update(&self, changed: Vec<(MemberId, MemberState)>) {
        let mut w = self.view.write().unwrap_or_else(|p| p.into_inner());
        w.built = None;
        // Room for `PRESIZE` members at the first growth, not a doubling at a time (each
        // a fresh allocation faulted in page by page: see `core::membership::presized`).
        let need = w.ids.len() + changed.len();
        if need > w.ids.capacity() {
            let len = w.ids.len();
            w.ids
                .reserve(need.max(batchwire_core::membership::PRESIZE) - len);
        }
        for e in changed {
            w.ids.insert(e.0.name.detached(), e);
        }
        drop(w);
        self.generation.fetch_add(1, Release);
    }

    /// A number that moves on whenever the view changes (read before the view, it says
    /// whether what was read since may be stale).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Acquire)
    }

    /// The names of the live members (alive or suspect) in the published view.
    pub(crate) fn live_names(&self) -> Vec<Name> {
        self.view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .iter()
            .filter(|(_, (_, s))| s.is_live())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Members in the published view.
    pub(crate) fn len(&self) -> usize {
        self.view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .len()
    }

    /// Call `f` with each name in the published view.
    pub(crate) fn for_each_name(&self, mut f: impl FnMut(&Name)) {
        for name in self
            .view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .keys()
        {
            f(name);
        }
    }

    /// Whether `name` is a live member (alive or suspect).
    pub fn is_live(&self, name: &str) -> bool {
        self.view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .get(name.as_bytes())
            .is_some_and(|(_, s)| s.is_live())
    }

    /// Inputs dropped because the thread was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}
