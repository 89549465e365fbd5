//! Local health (Lifeguard's multiplier): a node whose own timers run late was starved of
//! CPU, so the silence of a probe says little; it stretches its probes instead of
//! suspecting live members because of its own slowness.

use super::*;

/// Most a starved node stretches its probes: `1 + MAX_SLOWNESS` times (Lifeguard's 8).
pub(super) const MAX_SLOWNESS: u32 = 8;

/// A probe's own timers: its start (which also gives up on the last one) and the
/// indirect probe. Local health stretches them and measures lateness by them.
pub(super) fn is_probe_timer(t: &Timer<MemberId>) -> bool {
    matches!(
        t,
        Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. }
    )
}

impl Membership {
    /// Local health: a timer due more than a third of `probe_rtt` ago means this node ran
    /// late (a thousand processes on two CPUs wait hundreds of milliseconds for their
    /// turn); then it waits longer for acks before it suspects anyone, and probes less
    /// often, instead of raising suspicions that its own slowness caused (each one a
    /// refutation gossiped to everyone: a storm that fed itself).
    pub(super) fn note_lateness(&mut self, now: Instant) {
        // The probe's own timers: always waited for (periodic gossip may wait for news).
        let Some(due) = self
            .timers
            .iter()
            .take_while(|((at, _), _)| *at <= now)
            .find(|(_, t)| is_probe_timer(t))
            .map(|((at, _), _)| *at)
        else {
            return;
        };
        if now - due > self.cfg.probe_rtt / 3 {
            self.counters.late_timers += 1;
            self.slowness = (self.slowness + 1).min(MAX_SLOWNESS);
            self.slowness_at = now + self.cfg.probe_period;
        } else if self.slowness > 0 && now >= self.slowness_at {
            self.slowness -= 1;
            self.slowness_at = now + self.cfg.probe_period;
        }
    }
}
