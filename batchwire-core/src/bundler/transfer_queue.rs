//! `transfer-queue`: JGRP-1540's TransferQueueBundler. One bounded queue for all
//! destinations and one writer thread for the node. The writer drains when `max_size` bytes
//! are queued or the queue is empty (it never waits with messages queued), taking at most
//! `max_size` bytes; each run of consecutive messages with the same destination is one
//! message list and one write (send-to-all messages are the null destination and go to
//! every member). The grouping itself is the outbox's; see `outbox.rs` for the seed's
//! example as a test.

use std::time::Instant;

use super::{Bundler, Decision, QueueLevel};

#[derive(Debug, Clone, Copy)]
pub struct TransferQueue {
    /// Most bytes per drain. Default 64 KiB.
    pub max_size: usize,
}

impl Bundler for TransferQueue {
    fn name(&self) -> &'static str {
        "transfer-queue"
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
    fn drains_at_max_size_or_when_the_queue_empties() {
        let now = Instant::now();
        let mut b = TransferQueue { max_size: 64 << 10 };
        let Decision::Flush {
            max_bytes, reason, ..
        } = b.poll(level(1, 100, None), now)
        else {
            panic!("must not wait with a message queued")
        };
        assert_eq!((max_bytes, reason), (64 << 10, FlushReason::Drained));
        let Decision::Flush { reason, .. } = b.poll(level(1000, 100 << 10, None), now) else {
            panic!()
        };
        assert_eq!(reason, FlushReason::SizeReached);
    }
}
