//! Tasks waiting for room: async senders park their waker beside the condvar that blocking
//! senders wait on, and whoever notifies that condvar wakes them too.

use std::task::Waker;

/// The wakers of tasks waiting for one thing. A task registers on a poll that finds no
/// room, and all are woken (and forgotten) at the next change, so the list holds the tasks
/// waiting now, plus any that were polled again for another reason meanwhile.
#[derive(Default)]
pub(crate) struct Wakers(Vec<Waker>);

impl Wakers {
    /// Add `w` (unless it was the last one added: a task polled twice in a row).
    pub fn register(&mut self, w: &Waker) {
        if !self.0.last().is_some_and(|x| x.will_wake(w)) {
            self.0.push(w.clone());
        }
    }

    /// Wake them all (each looks again; a waker is cheap to call and never blocks).
    pub fn wake_all(&mut self) {
        for w in self.0.drain(..) {
            w.wake();
        }
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
    pub fn notify_all(&mut self, cv: &std::sync::Condvar) {
        if self.asleep > 0 {
            self.asleep = 0;
            self.round = self.round.wrapping_add(1);
            cv.notify_all();
        }
    }

    /// Whether a thread is parked and not yet notified.
    #[cfg(test)]
    pub fn any(&self) -> bool {
        self.asleep > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

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
}
