//! The registry of a node's mailboxes: by name, with a per-thread cache of the last one
//! found, and the names of missing ones logged once.

use super::*;

/// The node's mailboxes by name, and the count of messages that found none.
#[derive(Clone, Default)]
pub(crate) struct Mailboxes(Arc<Registry>);

#[derive(Default)]
pub(super) struct Registry {
    map: RwLock<HashMap<Name, Arc<MailboxQueue>, NameHash>>,
    /// Messages that arrived for a mailbox that does not exist here.
    missing: AtomicU64,
    /// Mailbox names already logged as missing (at most `LOGGED_NAMES`).
    logged: Mutex<HashSet<Name>>,
}

/// Mailbox names logged as missing, at most (further names are counted only).
pub(super) const LOGGED_NAMES: usize = 1024;

/// A mailbox a thread delivered to locally, and the node's table it came from: weak
/// references both, so the cache keeps no dropped mailbox's messages and no stopped node's
/// table alive (only their allocations, so a cached address cannot be another node's or
/// another mailbox's meanwhile).
pub(super) type LocalEntry = (Weak<Registry>, Weak<MailboxQueue>);

thread_local! {
    /// The two mailboxes this thread last delivered to locally, the latest first (see
    /// [`Mailboxes::get_local`]): two, so that a thread alternating between two local
    /// mailboxes, or between two nodes of one process, still finds them.
    static LAST_LOCAL: std::cell::RefCell<[Option<LocalEntry>; 2]> =
        const { std::cell::RefCell::new([None, None]) };
}

impl Mailboxes {
    /// The queue called `name` for a local send: one this thread delivered to lately, if it
    /// has that name, is this node's and is still alive, without the table's lock and hash
    /// (which every `send_all` would otherwise pay once per message for its local copy).
    /// It may have been dropped (closed) since: a push it refuses as closed asks again
    /// with [`Mailboxes::get_again`]. (A queue leaves the table closed, under the table's
    /// lock, so one that is open is still the table's.)
    pub fn get_local(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        let hit = LAST_LOCAL
            .try_with(|c| {
                c.borrow().iter().flatten().find_map(|(reg, q)| {
                    if !std::ptr::eq(reg.as_ptr(), Arc::as_ptr(&self.0)) {
                        return None;
                    }
                    q.upgrade()
                        .filter(|q| batchwire_core::codec::bytes_eq(q.name.as_bytes(), name))
                })
            })
            .ok()
            .flatten();
        hit.or_else(|| self.get_again(name))
    }

    /// The queue called `name` from the table, remembered for this thread's next
    /// [`Mailboxes::get_local`] (unless the thread is exiting: then only looked up).
    pub fn get_again(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        let q = self.get(name)?;
        let _ = LAST_LOCAL.try_with(|c| {
            let mut c = c.borrow_mut();
            c[1] = c[0].take();
            c[0] = Some((Arc::downgrade(&self.0), Arc::downgrade(&q)));
        });
        Some(q)
    }

    pub fn get(&self, name: &[u8]) -> Option<Arc<MailboxQueue>> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The queue called `name`, made with `make` if there is none.
    pub fn get_or_insert(
        &self,
        name: &Name,
        make: impl FnOnce() -> MailboxQueue,
    ) -> Arc<MailboxQueue> {
        let mut g = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        g.entry(name.clone())
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }

    /// Forget `q` (if it is still the one registered under its name), close it and drop
    /// what it held (see [`MailboxQueue::discard`]). Returns the messages that were left
    /// in it, by sender (node, mailbox, count). It is closed before the table is let go:
    /// a local sender that kept it (see [`Mailboxes::get_local`]) finds it closed and asks
    /// the table, which may hold a mailbox opened again under the name, rather than
    /// pushing into one that is gone.
    pub fn remove(&self, q: &Arc<MailboxQueue>) -> Vec<(Name, Name, u32)> {
        let mut g = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if g.get(&q.name).is_some_and(|m| Arc::ptr_eq(m, q)) {
            g.remove(&q.name);
        }
        q.close();
        drop(g);
        q.discard()
    }

    /// Each mailbox's name and the messages waiting in it (for metrics).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub fn depths(&self) -> Vec<(String, usize)> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, q)| (n.to_string(), q.len()))
            .collect()
    }

    /// Close every mailbox (the node stopped).
    pub fn close_all(&self) {
        for q in self
            .0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            q.close();
        }
    }

    /// `count` messages from node `from` found no mailbox `to`: count them, and log the
    /// name the first time (for the first `LOGGED_NAMES` names).
    pub fn note_missing(&self, to: &Name, from: &Name, count: u32) {
        self.0.missing.fetch_add(count as u64, Ordering::Relaxed);
        let mut logged = self.0.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.len() < LOGGED_NAMES && logged.insert(to.clone()) {
            warn!(mailbox = %to, from_node = %from, "message for a mailbox that does not exist here; reporting it to the sender as undeliverable (logged once per name)");
            if logged.len() == LOGGED_NAMES {
                warn!(
                    names = LOGGED_NAMES,
                    "undeliverable messages for so many mailbox names that further names are no longer logged; they are still counted and reported to their senders"
                );
            }
        }
    }

    /// Messages that found no mailbox.
    pub fn missing(&self) -> u64 {
        self.0.missing.load(Ordering::Relaxed)
    }
}
