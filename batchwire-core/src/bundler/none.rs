//! `none`: one frame and one write per message, the unbundled baseline (Erlang distribution
//! with `dist_nodelay`, Akka's classic remoting with TCP_NODELAY).

use std::time::Instant;

use super::{Bundler, Decision, FlushReason, QueueLevel};

#[derive(Debug, Default, Clone, Copy)]
pub struct NoBundling;

impl Bundler for NoBundling {
    fn name(&self) -> &'static str {
        "none"
    }

    fn writes_when_idle(&self) -> bool {
        true
    }

    /// Every message is a frame of its own.
    fn frame_bytes(&self, _default: usize) -> usize {
        0
    }

    fn poll(&mut self, level: QueueLevel, _now: Instant) -> Decision {
        if level.messages == 0 {
            Decision::IDLE
        } else {
            Decision::Flush {
                max_messages: 1,
                max_bytes: usize::MAX,
                reason: FlushReason::Single,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::level;
    use super::*;

    #[test]
    fn flushes_one_message_at_a_time_in_frames_of_one() {
        let now = Instant::now();
        let mut b = NoBundling;
        assert_eq!(b.frame_bytes(65536), 0);
        assert_eq!(
            b.poll(level(50, 5000, None), now),
            Decision::Flush {
                max_messages: 1,
                max_bytes: usize::MAX,
                reason: FlushReason::Single
            }
        );
    }
}
