//! `per-destination`: one queue per destination, each drained on its own by its writer,
//! at most `max_size` bytes per write (JGroups' `PerDestinationBundler`, its default since
//! 5.5). Like `natural`, but a backlog goes out in writes of bounded size rather than one
//! write of everything queued.

use std::time::Instant;

use super::{Bundler, Decision, QueueLevel};

#[derive(Debug, Clone, Copy)]
pub struct PerDestination {
    /// Most bytes per write. Default 64 KiB.
    pub max_size: usize,
}

impl Bundler for PerDestination {
    fn name(&self) -> &'static str {
        "per-destination"
    }

    fn writes_when_idle(&self) -> bool {
        true
    }

    fn poll(&mut self, level: QueueLevel, _now: Instant) -> Decision {
        super::drain_up_to(level, self.max_size)
    }
}

#[cfg(test)]
mod tests {
    use super::super::FlushReason;
    use super::super::tests::level;
    use super::*;

    #[test]
    fn drains_up_to_max_size_and_says_why() {
        let now = Instant::now();
        let mut b = PerDestination { max_size: 1000 };
        assert_eq!(
            b.poll(level(3, 300, None), now),
            Decision::Flush {
                max_messages: usize::MAX,
                max_bytes: 1000,
                reason: FlushReason::Drained
            }
        );
        assert_eq!(
            b.poll(level(30, 3000, None), now),
            Decision::Flush {
                max_messages: usize::MAX,
                max_bytes: 1000,
                reason: FlushReason::SizeReached
            }
        );
    }
}
