//! The membership thread's handle: how readers, connections and the API talk to the
//! thread (a bounded channel that never blocks them) and read its view. The thread itself
//! is in `membership.rs`.
//!
//! What the thread does: it owns the SWIM state machine (`core::membership::Membership`) and nothing
//! else touches it. It takes inputs from a bounded channel: MEMBER bodies (from the
//! datagram reader, which never waits: a full channel drops the body and counts it, SWIM
//! tolerates loss),
//! joins (from `Setup`, once a connection to a seed or a static peer is up), the dialers'
//! "unreachable" hints, and the leave at shutdown. It acts on what the machine says:
//! packets go out as sealed datagrams (`datagrams.rs`), never on a data connection; new
//! members get a peer and (if our name sorts first) a
//! dialer, departed members have their session declared down (what was pending for them
//! is reported failed) and, once they left or were forgotten, their dialer stopped; every
//! change is an event, and the view is published as a snapshot for `Node::members`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use batchwire_core::codec::Name;
use batchwire_core::membership::{MemberId, MemberState};
use bytes::Bytes;

use crate::event::Member;

/// Inputs waiting for the thread, at most this many (then frames are dropped).
const INBOX: usize = 4096;

pub(crate) enum Input {
    Frame {
        from: Name,
        body: Bytes,
    },
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
    ids: Vec<(MemberId, MemberState)>,
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
}

impl Members {
    /// A handle and the receiving end for the thread.
    pub fn new() -> (Members, Receiver<Input>) {
        let (tx, rx) = sync_channel(INBOX);
        let m = Members {
            tx,
            view: Arc::new(RwLock::new(View::default())),
            dropped: Arc::default(),
        };
        (m, rx)
    }

    fn offer(&self, i: Input) {
        match self.tx.try_send(i) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// A MEMBER body from `from` (its datagram opened with the cluster key; never waits).
    pub fn frame(&self, from: &Name, body: Bytes) {
        self.offer(Input::Frame {
            from: from.detached(),
            body,
        });
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
        let deadline = std::time::Instant::now() + timeout;
        let (tx, rx) = sync_channel(1);
        let mut leave = Input::Leave(tx);
        // The inbox may be full for a moment: retry until the deadline, never block on it.
        loop {
            match self.tx.try_send(leave) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
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
                let mut v: Vec<Member> = ids.iter().map(|(id, st)| member(id, *st)).collect();
                v.sort_by(|a, b| a.name.cmp(&b.name));
                Arc::from(v)
            })
            .clone()
    }

    /// Publish a new view (the membership thread, after a change): the public form is
    /// built when first read. A thousand members joining at once change the view at
    /// nearly every packet, and building it each time (a `String` a member, sorted) was
    /// most of what each node did during the join.
    pub(crate) fn publish(&self, ids: Vec<(MemberId, MemberState)>) {
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = View { ids, built: None };
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
        for (id, _) in &self.view.read().unwrap_or_else(|p| p.into_inner()).ids {
            f(&id.name);
        }
    }

    /// Whether `name` is a live member (alive or suspect).
    pub fn is_live(&self, name: &str) -> bool {
        self.view()
            .iter()
            .any(|m| m.name == name && m.state.is_live())
    }

    /// Inputs dropped because the thread was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// The membership's own counters, shared with `stats()`.
#[derive(Default)]
pub(crate) struct MemberStats {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub packets_in: AtomicU64,
    pub packets_out: AtomicU64,
    pub rate_limited: AtomicU64,
    pub violations: AtomicU64,
    pub members_refused: AtomicU64,
    /// Datagrams refused: not ours, forged, damaged, for another member, replayed.
    pub refused: AtomicU64,
    /// Datagrams the socket would not send.
    pub send_errors: AtomicU64,
}
