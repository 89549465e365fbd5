//! The node's one shutdown signal, in two steps: **draining** (no new sends; writers flush,
//! wait for acknowledgements until the deadline and say goodbye, while dialers and the
//! acceptor still let broken connections come back to finish) and **stopped** (every
//! thread ends). Threads that wait use [`Shutdown::sleep`], which the signal cuts short.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const RUNNING: u8 = 0;
const DRAINING: u8 = 1;
const STOPPED: u8 = 2;

/// A cheap handle on the signal.
#[derive(Clone, Default)]
pub(crate) struct Shutdown(Arc<Inner>);

#[derive(Default)]
struct Inner {
    /// Read on every send, so an atomic; changed only under `deadline`'s lock.
    phase: AtomicU8,
    deadline: Mutex<Option<Instant>>,
    cv: Condvar,
}

impl Shutdown {
    /// Start draining: queued messages have until `deadline`.
    pub fn drain(&self, deadline: Instant) {
        let mut g = self.0.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.phase.load(Ordering::Acquire) == RUNNING {
            *g = Some(deadline);
            self.0.phase.store(DRAINING, Ordering::Release);
        }
        self.0.cv.notify_all();
    }

    /// Stop: every thread ends.
    pub fn stop(&self) {
        let _g = self.0.deadline.lock().unwrap_or_else(|p| p.into_inner());
        self.0.phase.store(STOPPED, Ordering::Release);
        self.0.cv.notify_all();
    }

    /// Draining or stopped.
    pub fn is_shutting_down(&self) -> bool {
        self.0.phase.load(Ordering::Acquire) != RUNNING
    }

    pub fn is_stopped(&self) -> bool {
        self.0.phase.load(Ordering::Acquire) == STOPPED
    }

    /// The drain deadline, once draining.
    pub fn deadline(&self) -> Option<Instant> {
        if !self.is_shutting_down() {
            return None;
        }
        *self.0.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleep `d`, or less if the node stops. Returns false if the node has stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        let g = self.0.deadline.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .0
            .cv
            .wait_timeout_while(g, d, |_| self.0.phase.load(Ordering::Acquire) != STOPPED)
            .unwrap_or_else(|p| p.into_inner());
        !self.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_an_interrupted_sleep() {
        let s = Shutdown::default();
        assert!(!s.is_shutting_down() && s.deadline().is_none());
        let t = Instant::now() + Duration::from_secs(1);
        s.drain(t);
        assert!(s.is_shutting_down() && !s.is_stopped());
        assert_eq!(s.deadline(), Some(t));
        let s2 = s.clone();
        let sleeper = std::thread::spawn(move || {
            let t0 = Instant::now();
            (s2.sleep(Duration::from_secs(30)), t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        s.stop();
        let (running, slept) = sleeper.join().unwrap();
        assert!(!running && slept < Duration::from_secs(5));
        assert!(
            !s.sleep(Duration::from_secs(30)),
            "a stopped node does not sleep"
        );
    }
}
