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

    fn poll(&mut self, level: QueueLevel, _now: Instant) -> Decision {
        if level.messages == 0 {
            Decision::Wait { until: None }
        } else {
            Decision::Flush {
                max_messages: 1,
                reason: FlushReason::Single,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_one_message_at_a_time() {
        let now = Instant::now();
        let mut b = NoBundling;
        let lvl = QueueLevel {
            messages: 50,
            bytes: 5000,
            oldest: None,
        };
        assert_eq!(
            b.poll(lvl, now),
            Decision::Flush {
                max_messages: 1,
                reason: FlushReason::Single
            }
        );
        let empty = QueueLevel {
            messages: 0,
            bytes: 0,
            oldest: None,
        };
        assert_eq!(b.poll(empty, now), Decision::Wait { until: None });
    }
}
