//! The ticker thread: the sessions' timers. It sleeps until the earliest deadline any
//! session has (a delayed acknowledgement, a heartbeat, the failure detector, the shutdown
//! deadline) or until someone sets an earlier one, then lets each due session handle it.
//! An idle node wakes only for its heartbeats.

use std::time::{Duration, Instant};

use crate::io::peers::Peers;
use crate::io::shutdown::Shutdown;
use crate::io::timer::Timer;

/// Longest sleep when no session has a deadline (nothing connected).
const IDLE: Duration = Duration::from_secs(60);

pub(crate) fn run_ticker(peers: Peers, timer: Timer, shutdown: Shutdown) {
    while !shutdown.is_stopped() {
        timer.reset();
        let mut next: Option<Instant> = None;
        for p in peers.all() {
            let t = p.session(|s, now| {
                if s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
                s.poll_timeout()
            });
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        timer.sleep_until(next, IDLE);
    }
}
