//! `natural`: the writer takes everything queued and writes it as one batch, then repeats.
//!
//! There is no timer: at low load a message is written as soon as the writer is free, so
//! latency equals the `none` bundler's; under backlog, messages that queued up while the
//! previous write was in progress go out together, so batches grow exactly as fast as load
//! does. This is what JGroups' bundlers, Aeron and ZeroMQ do today.

use std::time::Instant;

use super::{Bundler, Decision, FlushReason, QueueLevel};

#[derive(Debug, Default, Clone, Copy)]
pub struct Natural;

impl Bundler for Natural {
    fn name(&self) -> &'static str {
        "natural"
    }

    fn writes_when_idle(&self) -> bool {
        true
    }

    fn poll(&mut self, level: QueueLevel, _now: Instant) -> Decision {
        if level.messages == 0 {
            Decision::IDLE
        } else {
            Decision::all(FlushReason::Drained)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::level;
    use super::*;

    #[test]
    fn flushes_everything_at_once_and_never_sets_a_timer() {
        let now = Instant::now();
        let mut b = Natural;
        for n in [1, 7, 100_000] {
            assert_eq!(
                b.poll(level(n, n * 100, None), now),
                Decision::all(FlushReason::Drained)
            );
        }
    }
}
