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
