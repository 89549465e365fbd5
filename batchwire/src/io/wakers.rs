//! Who waits, and how they are woken: tasks waiting for room ([`Wakers`]: async senders
//! park their waker beside the condvar that blocking senders wait on, and whoever notifies
//! that condvar wakes them too); threads asleep on a condvar, woken with one notify per
//! burst of changes ([`Sleepers`], a mailbox's receivers); and blocked senders, woken one
//! at a time while they wait for the same thing ([`Relay`], a lane's senders and a
//! mailbox's local pushers).

use std::sync::{Arc, Condvar, Weak};
use std::task::Waker;

/// What one future shows the lists it waits on: made at its first wait, kept until it is
/// dropped. A list keeps a weak reference beside each waker, so it can tell the wakers of
/// futures dropped since (a task aborted, a `select!` branch given up) from those that
/// still wait, and forget them without waking anyone.
#[derive(Debug, Default)]
pub(crate) struct Ticket(Option<Arc<()>>);

impl Ticket {
    fn weak(&mut self) -> Weak<()> {
        Arc::downgrade(self.0.get_or_insert_with(|| Arc::new(())))
    }
}

/// The wakers of tasks waiting for one thing. A task registers on a poll that finds no
/// room, and all are woken (and forgotten) at the next change, so the list holds the tasks
/// waiting now, plus any that were polled again meanwhile and the futures dropped since.
/// Those are forgotten without waking anyone: the last entry when it belongs to a dropped
/// future (a `select!` loop makes a new future each turn and drops the last), and all of
/// them whenever the list has doubled since it was last pruned (and holds at least
/// [`PRUNE_FROM`]). So the list holds at most twice the most futures that waited at once
/// since the last change, or `PRUNE_FROM`; futures dropped after the last prune keep their
/// wakers (and so their tasks) until the next change or prune.
#[derive(Default)]
pub(crate) struct Wakers {
    list: Vec<(Weak<()>, Waker)>,
    /// The length at which the list is next pruned.
    prune_at: usize,
}

/// The smallest list that is pruned.
pub(crate) const PRUNE_FROM: usize = 64;

impl Wakers {
    /// Add `w`, the waker of the future holding `ticket` (unless they were the last ones
    /// added: a future polled twice in a row).
    pub fn register(&mut self, w: &Waker, ticket: &mut Ticket) {
        let t = ticket.weak();
        if let Some((lt, lw)) = self.list.last_mut() {
            if lt.ptr_eq(&t) && lw.will_wake(w) {
                return;
            }
            if lt.strong_count() == 0 {
                // Its future is gone: this one takes its place.
                *lt = t;
                lw.clone_from(w);
                return;
            }
        }
        if self.list.len() >= self.prune_at.max(PRUNE_FROM) {
            self.prune();
        }
        self.list.push((t, w.clone()));
    }

    /// Forget the wakers of futures dropped since they registered, and all but the last
    /// waker of each future that registered more than once.
    fn prune(&mut self) {
        let mut seen = std::collections::HashSet::with_capacity(self.list.len());
        let mut kept = Vec::with_capacity(self.list.len());
        for (t, w) in self.list.drain(..).rev() {
            if t.strong_count() > 0 && seen.insert(t.as_ptr()) {
                kept.push((t, w));
            }
        }
        kept.reverse();
        self.list = kept;
        self.prune_at = 2 * self.list.len();
    }

    /// Wake them all (each looks again; a waker is cheap to call and never blocks).
    pub fn wake_all(&mut self) {
        for (_, w) in self.list.drain(..) {
            w.wake();
        }
        self.prune_at = 0;
    }

    /// Wakers kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

/// The threads asleep on one condvar, counted so that a change wakes them with one notify,
/// not one per change: the first notify after they park wakes them all and clears the
/// count, so the pushes that follow before they run (a burst) make no syscall. A thread
/// that wakes without a notify (a timeout) takes itself off the count.
///
/// Kept under the same lock as the condition the condvar waits for.
#[derive(Default)]
pub(crate) struct Sleepers {
    asleep: usize,
    /// Moves at each notify: a thread that parked before it was counted off by it.
    round: u64,
}

impl Sleepers {
    /// A thread is about to wait: returns its ticket for [`Sleepers::woke`].
    pub fn park(&mut self) -> u64 {
        self.asleep += 1;
        self.round
    }

    /// The thread holding `ticket` is awake again (notified, timed out or spurious).
    pub fn woke(&mut self, ticket: u64) {
        if self.round == ticket {
            // Not counted off by a notify: it still counts itself.
            self.asleep -= 1;
        }
    }

    /// Wake every thread parked on `cv`, if any has not been notified yet.
    pub fn notify_all(&mut self, cv: &Condvar) {
        if self.asleep > 0 {
            self.asleep = 0;
            self.round = self.round.wrapping_add(1);
            cv.notify_all();
        }
    }

    /// Whether a thread is parked and not yet notified.
    pub fn any(&self) -> bool {
        self.asleep > 0
    }
}

/// The threads blocked on one condvar until something they wait for is freed (a lane's
/// senders waiting for room or credit), woken one at a time while they all wait for the
/// same thing: a change wakes one, and a woken thread that gets what it waited for passes
/// the turn on to the next ([`Relay::pass_on`]), so the turn travels only while there is
/// something to take. Waking them all at each change (1000 sending threads to one
/// mailbox, a batch taken every few hundred microseconds) woke hundreds of threads to find
/// nothing, each with a context switch and a fight for the lock.
///
/// Threads that wait for the same key wait for the same condition: if the one woken cannot
/// go on, none of them could. While the sleepers' keys differ, every change wakes them all;
/// a thread that gets through then wakes them all only if a turn was left to a woken thread
/// (`turn`) since the last time all were woken: otherwise each sender that got through
/// would wake every sleeper again, and a mailbox nobody reads would have its senders woken
/// by every other sender's progress. Kept under the same lock as the condition.
pub(crate) struct Relay<K> {
    /// Parked and not notified.
    asleep: usize,
    /// Notified and not awake yet.
    notified: usize,
    /// What the sleepers wait for, while it is one thing.
    key: Option<K>,
    /// The sleepers wait for different things.
    mixed: bool,
    /// A change was left to a woken thread to pass on (one was woken for it, or one
    /// notified and not yet running was trusted with it) since all were last woken.
    turn: bool,
}

impl<K> Default for Relay<K> {
    fn default() -> Self {
        Relay {
            asleep: 0,
            notified: 0,
            key: None,
            mixed: false,
            turn: false,
        }
    }
}

impl<K: PartialEq> Relay<K> {
    /// A thread is about to wait for `key`.
    pub fn park(&mut self, key: K) {
        if self.asleep + self.notified == 0 {
            self.key = Some(key);
            self.mixed = false;
            self.turn = false;
        } else if self.key.as_ref() != Some(&key) {
            self.mixed = true;
        }
        self.asleep += 1;
    }

    /// A thread is awake again (notified, or for no reason: then it counts as a sleeper
    /// woken, and a notified one still asleep is counted as such: the counts may overstate
    /// the sleepers, causing a spare notify, never understate them).
    pub fn woke(&mut self) {
        if self.notified > 0 {
            self.notified -= 1;
        } else {
            self.asleep = self.asleep.saturating_sub(1);
        }
    }

    /// Something was freed: wake one sleeper (all, while they wait for different things).
    /// While a notified one has not run yet, it is the one to look.
    pub fn notify(&mut self, cv: &Condvar) {
        if self.asleep == 0 {
            return;
        }
        if self.mixed {
            self.notify_all(cv);
            return;
        }
        if self.notified == 0 {
            self.asleep -= 1;
            self.notified += 1;
            cv.notify_one();
        }
        self.turn = true;
    }

    /// A woken thread got what it waited for: there may be more, wake the next (all,
    /// while they wait for different things, if a turn may have been left with it).
    pub fn pass_on(&mut self, cv: &Condvar) {
        if !self.mixed || self.turn {
            self.notify(cv);
        }
    }

    /// Wake every sleeper (closed, down, failed: they all must look).
    pub fn notify_all(&mut self, cv: &Condvar) {
        if self.asleep > 0 {
            self.notified += self.asleep;
            self.asleep = 0;
            self.turn = false;
            cv.notify_all();
        }
    }

    /// Parked and not yet notified.
    #[cfg(test)]
    pub fn asleep(&self) -> usize {
        self.asleep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn counted(n: usize) -> Vec<(Arc<Count>, Waker)> {
        (0..n)
            .map(|_| {
                let c = Arc::new(Count(Default::default()));
                (c.clone(), Waker::from(c))
            })
            .collect()
    }

    fn woken(c: &Count) -> usize {
        c.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Many futures that really wait are all kept and none is woken until the change,
    /// which wakes each (a bound that woke a full list to make room turned 2000 waiting
    /// tasks into a busy loop). A future polled again is woken at most once per poll.
    #[test]
    fn every_future_that_waits_is_kept_and_woken_once() {
        let mut l = Wakers::default();
        let tasks = counted(2000);
        let mut tickets: Vec<Ticket> = (0..tasks.len()).map(|_| Ticket::default()).collect();
        for _ in 0..3 {
            for ((_, w), t) in tasks.iter().zip(&mut tickets) {
                l.register(w, t);
            }
        }
        assert!(tasks.iter().all(|(c, _)| woken(c) == 0));
        assert!(l.len() <= 2 * tasks.len(), "{}", l.len());
        l.wake_all();
        // Once each: registered three times in turn, then pruned once the list doubled.
        assert!(tasks.iter().all(|(c, _)| (1..=2).contains(&woken(c))));
        assert_eq!(l.len(), 0);
    }

    /// Futures dropped before the change leave their wakers only until the list is next
    /// pruned; two futures polled in turn (each `select!` loop's send to a stalled peer)
    /// do not grow it either; and the future that still waits keeps its place.
    #[test]
    fn dropped_and_repolled_futures_keep_the_list_bounded() {
        let mut l = Wakers::default();
        let waiting = counted(1);
        let mut its = Ticket::default();
        l.register(&waiting[0].1, &mut its);
        for (_, w) in counted(50 * PRUNE_FROM) {
            let mut t = Ticket::default();
            l.register(&w, &mut t);
            assert!(l.len() <= PRUNE_FROM);
        }
        let two = counted(2);
        let mut tickets = [Ticket::default(), Ticket::default()];
        for i in 0..50 * PRUNE_FROM {
            l.register(&two[i % 2].1, &mut tickets[i % 2]);
            assert!(l.len() <= PRUNE_FROM);
        }
        assert_eq!(woken(&waiting[0].0), 0);
        l.wake_all();
        assert_eq!(woken(&waiting[0].0), 1);
        assert!(woken(&two[0].0) >= 1 && woken(&two[1].0) >= 1);
    }

    /// A future polled again with another waker is woken with its latest, and a prune
    /// keeps that one (only the waker of the last poll must be woken).
    #[test]
    fn the_latest_waker_of_a_future_is_the_one_woken() {
        let mut l = Wakers::default();
        let ab = counted(2);
        let mut t = Ticket::default();
        let other = counted(1);
        let mut other_t = Ticket::default();
        l.register(&ab[0].1, &mut t);
        l.register(&other[0].1, &mut other_t);
        l.register(&ab[1].1, &mut t);
        // Enough dropped futures to prune, each after a live entry so none is reused.
        let mut keep = Vec::new();
        for (_, w) in counted(2 * PRUNE_FROM) {
            let mut gone = Ticket::default();
            l.register(&w, &mut gone);
            drop(gone);
            keep.push(Ticket::default());
            l.register(&other[0].1, keep.last_mut().unwrap());
        }
        assert!(l.len() < 3 * PRUNE_FROM, "{}", l.len());
        l.wake_all();
        assert_eq!((woken(&ab[0].0), woken(&ab[1].0)), (0, 1));
    }

    /// A `select!` loop's receive: a new future each turn with the same waker, the last one
    /// dropped before the next registers. One entry, one wake.
    #[test]
    fn a_new_future_each_turn_takes_the_place_of_the_dropped_one() {
        let mut l = Wakers::default();
        let task = counted(1);
        for _ in 0..1000 {
            let mut t = Ticket::default();
            l.register(&task[0].1, &mut t);
        }
        assert_eq!(l.len(), 1);
        l.wake_all();
        assert_eq!(woken(&task[0].0), 1);
    }

    #[test]
    fn a_burst_notifies_once_and_a_timeout_counts_itself_off() {
        let mut s = Sleepers::default();
        let cv = Condvar::new();
        let a = s.park();
        let b = s.park();
        assert!(s.any());
        s.notify_all(&cv);
        assert!(!s.any(), "one notify counts every sleeper off");
        // Both wake after the notify: neither changes the count again.
        s.woke(a);
        s.woke(b);
        let c = s.park();
        assert!(s.any());
        // Timed out, no notify: it takes itself off.
        s.woke(c);
        assert!(!s.any());
    }

    #[test]
    fn a_parked_thread_is_woken_by_the_first_change_of_a_burst() {
        struct Shared {
            items: u32,
            sleepers: Sleepers,
        }
        let m = Arc::new((
            Mutex::new(Shared {
                items: 0,
                sleepers: Sleepers::default(),
            }),
            Condvar::new(),
        ));
        let m2 = m.clone();
        let consumer = std::thread::spawn(move || {
            let (lock, cv) = &*m2;
            let mut g = lock.lock().unwrap();
            let (mut seen, mut timeouts) = (0, 0);
            while seen < 100 && timeouts < 3 {
                if g.items > 0 {
                    seen += g.items;
                    g.items = 0;
                    continue;
                }
                let t = g.sleepers.park();
                let (g2, r) = cv.wait_timeout(g, Duration::from_secs(20)).unwrap();
                g = g2;
                g.sleepers.woke(t);
                timeouts += r.timed_out() as u32;
            }
            (seen, timeouts)
        });
        for i in 0..100 {
            let (lock, cv) = &*m;
            let mut g = lock.lock().unwrap();
            g.items += 1;
            g.sleepers.notify_all(cv);
            drop(g);
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // A lost wake-up would show as a 20 s timeout.
        assert_eq!(consumer.join().unwrap(), (100, 0));
    }

    #[test]
    fn a_relay_wakes_one_while_all_wait_for_the_same_and_all_once_they_differ() {
        let cv = Condvar::new();
        let mut r = Relay::default();
        r.park(1);
        r.park(1);
        r.park(1);
        r.notify(&cv);
        assert_eq!(r.asleep(), 2, "one woken");
        r.notify(&cv);
        assert_eq!(
            r.asleep(),
            2,
            "the one notified and not yet awake is the one to look"
        );
        r.woke();
        r.pass_on(&cv);
        assert_eq!(r.asleep(), 1, "it got through: the next one");
        r.woke();
        // A sleeper for something else: every change now wakes them all.
        r.park(2);
        r.notify(&cv);
        assert_eq!(r.asleep(), 0);
        r.woke();
        r.woke();
        // Still mixed, and all were woken since the last turn: one getting through wakes
        // nobody (each sleeper saw every change).
        r.park(1);
        r.park(2);
        r.pass_on(&cv);
        assert_eq!(r.asleep(), 2, "no turn was left to anyone");
        // A change wakes them all.
        r.notify(&cv);
        assert_eq!(r.asleep(), 0);
        r.woke();
        r.woke();
        // One at a time, then mixed: the turn left with the woken one is passed to all.
        r.park(1);
        r.park(1);
        r.notify(&cv);
        r.park(2);
        assert_eq!(r.asleep(), 2);
        r.woke();
        r.pass_on(&cv);
        assert_eq!(r.asleep(), 0, "the turn it held reaches every sleeper");
        r.woke();
        r.woke();
        // Everyone is awake: the next sleeper sets the key again.
        r.park(3);
        r.notify(&cv);
        assert_eq!(r.asleep(), 0);
    }

    /// Threads that each take one unit of one of two resources, freed one unit at a time:
    /// a lost wake-up (the relay stopping while a thread could go on) shows as a thread
    /// still waiting when every unit was freed, i.e. a 20 s timeout.
    #[test]
    fn a_relay_loses_no_wake_up() {
        struct Shared {
            free: [u32; 2],
            relay: Relay<usize>,
        }
        let m = Arc::new((
            Mutex::new(Shared {
                free: [0, 0],
                relay: Relay::default(),
            }),
            Condvar::new(),
        ));
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let m = m.clone();
                // Twelve want resource 0, four resource 1: both the one-at-a-time and the
                // mixed case occur.
                let key = usize::from(i >= 12);
                std::thread::spawn(move || {
                    let (lock, cv) = &*m;
                    let mut g = lock.lock().unwrap();
                    let mut waited = false;
                    while g.free[key] == 0 {
                        g.relay.park(key);
                        let (g2, r) = cv.wait_timeout(g, Duration::from_secs(20)).unwrap();
                        g = g2;
                        g.relay.woke();
                        assert!(!r.timed_out(), "thread {i} was never woken");
                        waited = true;
                    }
                    g.free[key] -= 1;
                    if waited {
                        g.relay.pass_on(cv);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        for n in 0..16 {
            let (lock, cv) = &*m;
            let mut g = lock.lock().unwrap();
            g.free[usize::from(n >= 12)] += 1;
            g.relay.notify(cv);
            drop(g);
            if n % 3 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for t in threads {
            t.join().expect("a waiting thread failed");
        }
        assert_eq!(m.0.lock().unwrap().free, [0, 0]);
    }
}
