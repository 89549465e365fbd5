//! The ticker's alarm clock. The ticker sleeps until the earliest session deadline; anyone
//! who gives a session an earlier deadline (a delayed acknowledgement, say) calls
//! [`Timer::wake_at`], which costs one atomic load unless it is earlier than the alarm.
//!
//! And its schedule: which peer is due when ([`Timer::schedule`], [`Timer::take_due`]), so
//! that a wake-up handles the peers due then, not every peer (at a thousand peers, two
//! thousand heartbeats a second each looked at every session).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A cheap handle on the alarm.
#[derive(Clone)]
pub(crate) struct Timer(Arc<Inner>);

struct Inner {
    origin: Instant,
    /// The alarm, in nanoseconds since `origin` (`u64::MAX`: none).
    alarm: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
    /// (nanoseconds since `origin`, peer): a peer whose session has a deadline then. An
    /// entry may be stale (the deadline moved): the ticker looks at the session anyway.
    due: Mutex<BinaryHeap<Reverse<(u64, u32)>>>,
}

impl Timer {
    pub fn new() -> Timer {
        Timer(Arc::new(Inner {
            origin: Instant::now(),
            alarm: AtomicU64::new(u64::MAX),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            due: Mutex::new(BinaryHeap::new()),
        }))
    }

    /// `t` in nanoseconds since the timer's origin.
    pub fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.0.origin).as_nanos() as u64
    }

    /// Peer `id`'s session has a deadline at `t`: the ticker looks at it then.
    pub fn schedule(&self, id: u32, t: Instant) {
        let ns = self.ns(t);
        self.0
            .due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Reverse((ns, id)));
        self.wake_at(t);
    }

    /// The ticker: take the peers due by `now` (each once) into `out`.
    pub fn take_due(&self, now: Instant, out: &mut Vec<u32>) {
        let now = self.ns(now);
        let mut g = self.0.due.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&Reverse((t, id))) = g.peek() {
            if t > now {
                break;
            }
            g.pop();
            out.push(id);
        }
        drop(g);
        out.sort_unstable();
        out.dedup();
    }

    /// When the next scheduled peer is due.
    pub fn next_due(&self) -> Option<Instant> {
        let g = self.0.due.lock().unwrap_or_else(|p| p.into_inner());
        g.peek()
            .map(|Reverse((t, _))| self.0.origin + Duration::from_nanos(*t))
    }

    /// Make sure the ticker is awake at `t`.
    pub fn wake_at(&self, t: Instant) {
        let ns = self.ns(t);
        if ns >= self.0.alarm.load(Ordering::Acquire) {
            return;
        }
        let _g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        if ns < self.0.alarm.load(Ordering::Acquire) {
            self.0.alarm.store(ns, Ordering::Release);
            self.0.cv.notify_one();
        }
    }

    /// Wake the ticker now (the node is stopping).
    pub fn wake(&self) {
        self.wake_at(self.0.origin);
    }

    /// The ticker, before it looks at the sessions: forget the alarm (a `wake_at` from now
    /// on sets it again and is seen by [`Timer::sleep_until`]).
    pub fn reset(&self) {
        let _g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.0.alarm.store(u64::MAX, Ordering::Release);
    }

    /// The ticker: sleep until `t` (`None`: until woken), or the alarm if that is earlier.
    /// `limit` bounds the sleep in any case.
    pub fn sleep_until(&self, t: Option<Instant>, limit: Duration) {
        let g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut until = now + limit;
        if let Some(t) = t {
            until = until.min(t);
        }
        let alarm = self.0.alarm.load(Ordering::Acquire);
        if alarm != u64::MAX {
            until = until.min(self.0.origin + Duration::from_nanos(alarm));
        }
        if until <= now {
            return;
        }
        let ns = self.ns(until);
        if ns < alarm {
            self.0.alarm.store(ns, Ordering::Release);
        }
        let _ = self
            .0
            .cv
            .wait_timeout(g, until - now)
            .unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_gives_the_peers_due_each_once_and_the_next_time() {
        let timer = Timer::new();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        timer.schedule(5, ms(10));
        timer.schedule(3, ms(5));
        timer.schedule(5, ms(1));
        timer.schedule(9, ms(30));
        let mut due = Vec::new();
        timer.take_due(ms(6), &mut due);
        assert_eq!(due, [3, 5]);
        let next = timer.next_due().unwrap();
        assert!(next >= ms(10) - Duration::from_micros(1) && next <= ms(10));
        due.clear();
        timer.take_due(ms(10), &mut due);
        assert_eq!(due, [5], "a stale entry is given too: the ticker looks");
        due.clear();
        timer.take_due(ms(29), &mut due);
        assert!(due.is_empty());
        timer.take_due(ms(30), &mut due);
        assert_eq!(due, [9]);
        assert_eq!(timer.next_due(), None);
    }

    #[test]
    fn an_earlier_deadline_wakes_the_sleeper() {
        let timer = Timer::new();
        let t2 = timer.clone();
        let sleeper = std::thread::spawn(move || {
            let t0 = Instant::now();
            t2.reset();
            t2.sleep_until(None, Duration::from_secs(30));
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        timer.wake_at(Instant::now() + Duration::from_millis(10));
        assert!(sleeper.join().unwrap() < Duration::from_secs(5));
    }

    #[test]
    fn a_later_deadline_costs_nothing_and_a_past_one_does_not_sleep() {
        let timer = Timer::new();
        timer.reset();
        timer.wake_at(Instant::now() + Duration::from_millis(5));
        let t0 = Instant::now();
        timer.sleep_until(
            Some(Instant::now() + Duration::from_secs(30)),
            Duration::from_secs(30),
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the alarm is earlier"
        );
        let t0 = Instant::now();
        timer.sleep_until(
            Some(Instant::now() - Duration::from_millis(1)),
            Duration::from_secs(30),
        );
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
