//! A peer's place in the ticker's schedule (see `io::timer`): its session's deadline, given
//! to the ticker only when it is earlier than the one the ticker already has for it.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use super::Peer;

impl Peer {
    /// The session's next deadline is `t` (after a session turn): schedule the peer unless
    /// the ticker already looks at it by then.
    pub(super) fn schedule(&self, t: Instant) {
        let ns = self.ctx.timer.ns(t);
        if ns < self.scheduled.fetch_min(ns, SeqCst) {
            self.ctx.timer.schedule(self.id, t);
        }
    }

    /// The ticker took this peer from its schedule: any deadline from now on is scheduled
    /// again (the ticker schedules the one it finds after handling the session).
    pub fn unschedule(&self) {
        self.scheduled.store(u64::MAX, SeqCst);
    }

    /// The ticker handled the session: schedule its next deadline.
    pub fn reschedule(&self, t: Option<Instant>) {
        if let Some(t) = t {
            self.schedule(t);
        }
    }
}
