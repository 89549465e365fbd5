//! `linger`: hold messages until `max_size` bytes are queued or `max_delay` has passed since
//! the oldest queued message, whichever comes first, then write everything queued. The
//! Erlang relay's "K messages or T ms", Kafka's batch.size / linger.ms, Nagle's algorithm.
//! Trades latency at low load for bigger batches.

use std::time::{Duration, Instant};

use super::{Bundler, Decision, FlushReason, QueueLevel};

#[derive(Debug, Clone, Copy)]
pub struct Linger {
    /// Bytes that trigger a flush before the timer. Default 64 KiB.
    pub max_size: usize,
    /// Longest a message waits. Default 1 ms.
    pub max_delay: Duration,
}

impl Bundler for Linger {
    fn name(&self) -> &'static str {
        "linger"
    }

    fn needs_enqueue_time(&self) -> bool {
        true
    }

    fn wake_bytes(&self) -> usize {
        self.max_size
    }

    fn poll(&mut self, level: QueueLevel, now: Instant) -> Decision {
        if level.messages == 0 {
            return Decision::IDLE;
        }
        if level.bytes >= self.max_size {
            return Decision::all(FlushReason::SizeReached);
        }
        let Some(oldest) = level.oldest else {
            // The time was not recorded (cannot happen with `needs_enqueue_time`): do not
            // hold a message without a deadline.
            return Decision::all(FlushReason::Timer);
        };
        let deadline = oldest + self.max_delay;
        if now >= deadline {
            Decision::all(FlushReason::Timer)
        } else {
            Decision::Wait {
                until: Some(deadline),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::level;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_for_the_delay_then_flushes_on_the_timer() {
        let t0 = Instant::now();
        let mut b = Linger {
            max_size: 1000,
            max_delay: MS,
        };
        assert_eq!(
            b.poll(level(1, 100, Some(t0)), t0),
            Decision::Wait {
                until: Some(t0 + MS)
            }
        );
        assert_eq!(
            b.poll(level(2, 200, Some(t0)), t0 + MS / 2),
            Decision::Wait {
                until: Some(t0 + MS)
            },
            "a later message does not move the deadline"
        );
        assert_eq!(
            b.poll(level(2, 200, Some(t0)), t0 + MS),
            Decision::all(FlushReason::Timer)
        );
    }

    #[test]
    fn flushes_early_when_max_size_is_reached() {
        let t0 = Instant::now();
        let mut b = Linger {
            max_size: 1000,
            max_delay: MS,
        };
        assert_eq!(
            b.poll(level(10, 1000, Some(t0)), t0),
            Decision::all(FlushReason::SizeReached)
        );
        assert_eq!(b.wake_bytes(), 1000);
        assert!(b.needs_enqueue_time());
    }
}
