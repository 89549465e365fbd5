//! The ticker thread: the sessions' timers. It sleeps until the earliest deadline any
//! session has (a delayed acknowledgement, a heartbeat, the failure detector, the shutdown
//! deadline) or until someone sets an earlier one, then lets each due session handle it.
//! An idle node wakes only for its heartbeats.
//!
//! The control frame a timer makes due (a heartbeat, a delayed acknowledgement) the ticker
//! writes itself, without waiting, when no one else is writing to that connection
//! (`write::write_control_through`; what the socket does not take at once goes to the
//! writer): so an idle peer needs no writer thread (see `write::run_writer`), and
//! one that has one is not woken for it.

use std::time::{Duration, Instant};

use crate::io::peer::{Peer, control};
use crate::io::peers::Peers;
use crate::io::shutdown::Shutdown;
use crate::io::timer::Timer;

/// Longest sleep when no session has a deadline (nothing connected).
const IDLE: Duration = Duration::from_secs(60);

/// How often the ticker looks at every session anyway (a safety net under the schedule:
/// every deadline change goes through `Peer::session`, which schedules it).
const SWEEP: Duration = Duration::from_secs(10);

pub(crate) fn run_ticker(peers: Peers, timer: Timer, shutdown: Shutdown) {
    let mut due = Vec::new();
    let mut sweep_at = Instant::now();
    while !shutdown.is_stopped() {
        timer.reset();
        let now = Instant::now();
        if now >= sweep_at {
            sweep_at = now + SWEEP;
            for p in peers.all() {
                p.unschedule();
                p.reschedule(tick(&p));
            }
        }
        // The peers due now; each handled once, then scheduled at its session's next
        // deadline (entries whose deadline moved later are looked at and scheduled anew).
        due.clear();
        timer.take_due(now, &mut due);
        for &id in &due {
            if let Some(p) = peers.by_id(id) {
                p.unschedule();
                p.reschedule(tick(&p));
            }
        }
        let next = timer.next_due().map_or(sweep_at, |t| t.min(sweep_at));
        timer.sleep_until(Some(next), IDLE);
    }
}

/// Let `p`'s session handle its timers if due, and write the control they made due (see
/// above). Returns the session's next deadline.
pub(crate) fn tick(p: &Peer) -> Option<Instant> {
    let outer = control::begin(p);
    let t = p.session(|s, now| {
        if s.poll_timeout().is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
        s.poll_timeout()
    });
    let due = control::take();
    control::end(outer);
    if due {
        crate::io::write::write_control_through(p);
    }
    t
}
