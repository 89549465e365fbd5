//! A peer's outbound queue: bounded in bytes, shared by every sending thread and drained by
//! that peer's writer thread.
//!
//! The hot path (`push`) takes one uncontended mutex and, only when the writer is asleep and
//! the queue was empty, one condvar notify: no syscall, allocation or clock read per message
//! (the clock is read only when the bundler needs enqueue times and the queue was empty).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::core::bundler::{Bundler, Decision, FlushReason, QueueLevel};
use crate::core::codec::Name;
use crate::core::frame::{Frame, message_len};

/// One message waiting to be written.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub to: Name,
    pub from: Name,
    pub payload: Bytes,
}

impl Outgoing {
    /// What the message counts against the queue's byte bound: its encoded size.
    #[inline]
    pub fn cost(&self) -> usize {
        message_len(&self.to, &self.from, self.payload.len())
    }
}

/// Why `push` did not queue a message.
#[derive(Debug)]
pub(crate) enum PushError {
    /// The queue is at capacity and the caller asked not to block.
    Full(Bytes),
    /// The node is shutting down.
    Closed(Bytes),
}

/// What the writer should do after `next_batch`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// `items` holds a batch to write.
    Batch(FlushReason),
    /// The node is shutting down and the queue is empty.
    Drained,
    /// The writer's connection was closed; `items` is empty.
    Reconnect,
}

struct Inner {
    items: VecDeque<Outgoing>,
    bytes: usize,
    /// Control frames (undeliverable notices) to send before the next batch.
    control: Vec<Frame>,
    oldest: Option<Instant>,
    closed: bool,
    writer_waiting: bool,
    senders_waiting: usize,
    /// Bumped whenever the writer must re-check its connection.
    link_epoch: u64,
}

pub(crate) struct SendQueue {
    inner: Mutex<Inner>,
    /// The writer waits here for messages.
    not_empty: Condvar,
    /// Senders wait here for room.
    not_full: Condvar,
    capacity: usize,
    track_time: bool,
    /// Largest number of bytes ever queued.
    pub high_water: AtomicU64,
    /// Nanoseconds senders spent blocked on a full queue.
    pub blocked_ns: AtomicU64,
}

impl SendQueue {
    pub fn new(capacity: usize, track_time: bool) -> Self {
        SendQueue {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                bytes: 0,
                control: Vec::new(),
                oldest: None,
                closed: false,
                writer_waiting: false,
                senders_waiting: 0,
                link_epoch: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            track_time,
            high_water: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave `Inner` inconsistent in a way that
        // matters more than losing the node, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a message. A message is admitted while the queue holds fewer than `capacity`
    /// bytes, so one message larger than the capacity still goes through. With `block`,
    /// waits for room; otherwise returns `Full`.
    pub fn push(&self, msg: Outgoing, block: bool) -> Result<(), PushError> {
        let cost = msg.cost();
        let mut g = self.lock();
        if g.bytes >= self.capacity && !g.closed {
            if !block {
                return Err(PushError::Full(msg.payload));
            }
            let start = Instant::now();
            g.senders_waiting += 1;
            while g.bytes >= self.capacity && !g.closed {
                g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            g.senders_waiting -= 1;
            self.blocked_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if g.closed {
            return Err(PushError::Closed(msg.payload));
        }
        let was_empty = g.items.is_empty();
        if was_empty && self.track_time {
            g.oldest = Some(Instant::now());
        }
        g.items.push_back(msg);
        g.bytes += cost;
        if g.bytes as u64 > self.high_water.load(Ordering::Relaxed) {
            self.high_water.store(g.bytes as u64, Ordering::Relaxed);
        }
        if was_empty && g.writer_waiting {
            self.not_empty.notify_one();
        }
        Ok(())
    }

    /// Queue a control frame; it is written before the next batch of messages.
    pub fn push_control(&self, frame: Frame) {
        let mut g = self.lock();
        g.control.push(frame);
        self.not_empty.notify_one();
    }

    /// Put messages that were taken but never written back at the front, in order.
    pub fn unshift(&self, items: &mut VecDeque<Outgoing>) {
        let mut g = self.lock();
        for m in items.drain(..).rev() {
            g.bytes += m.cost();
            g.items.push_front(m);
        }
        if g.oldest.is_none() && self.track_time && !g.items.is_empty() {
            g.oldest = Some(Instant::now());
        }
    }

    /// Make the writer re-check its connection (a new one was installed or the old one died).
    pub fn poke(&self) {
        let mut g = self.lock();
        g.link_epoch += 1;
        self.not_empty.notify_all();
    }

    pub fn link_epoch(&self) -> u64 {
        self.lock().link_epoch
    }

    /// Refuse new messages; the writer drains what is queued, then sees `Drained`.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Take every queued message out (used to report them failed when they cannot be sent).
    pub fn take_all(&self) -> VecDeque<Outgoing> {
        let mut g = self.lock();
        g.bytes = 0;
        g.oldest = None;
        self.not_full.notify_all();
        std::mem::take(&mut g.items)
    }

    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Wait until the bundler says to flush; move the batch into `items` (which must be
    /// empty) and control frames into `control`. Returns `Reconnect` as soon as the link
    /// epoch moves past `epoch`.
    pub fn next_batch(
        &self,
        bundler: &mut dyn Bundler,
        epoch: u64,
        items: &mut VecDeque<Outgoing>,
        control: &mut Vec<Frame>,
    ) -> Next {
        debug_assert!(items.is_empty());
        let mut g = self.lock();
        loop {
            if g.link_epoch != epoch {
                return Next::Reconnect;
            }
            if !g.control.is_empty() {
                std::mem::swap(&mut g.control, control);
            }
            let level = QueueLevel {
                messages: g.items.len(),
                bytes: g.bytes,
                oldest: g.oldest,
            };
            match bundler.poll(level, Instant::now()) {
                Decision::Flush {
                    max_messages,
                    reason,
                } => {
                    if max_messages >= g.items.len() {
                        // Swap the whole queue out: O(1), and the two deques' buffers are
                        // reused back and forth, so nothing is allocated in steady state.
                        std::mem::swap(&mut g.items, items);
                        g.bytes = 0;
                        g.oldest = None;
                    } else {
                        let g = &mut *g;
                        for m in g.items.drain(..max_messages) {
                            g.bytes -= m.cost();
                            items.push_back(m);
                        }
                        if self.track_time {
                            g.oldest = Some(Instant::now());
                        }
                    }
                    if g.senders_waiting > 0 {
                        self.not_full.notify_all();
                    }
                    return Next::Batch(reason);
                }
                Decision::Wait { until } => {
                    if !control.is_empty() {
                        // Nothing to batch, but control frames to send.
                        return Next::Batch(FlushReason::Drained);
                    }
                    if g.closed && g.items.is_empty() {
                        return Next::Drained;
                    }
                    g.writer_waiting = true;
                    g = match until {
                        None => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(t) => {
                            let d = t.saturating_duration_since(Instant::now());
                            self.not_empty
                                .wait_timeout(g, d.max(Duration::from_micros(1)))
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                    };
                    g.writer_waiting = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::bundler::{Natural, NoBundling};
    use std::sync::Arc;

    fn msg(n: u8) -> Outgoing {
        Outgoing {
            to: Name::from_static("to"),
            from: Name::from_static("f"),
            payload: Bytes::from(vec![n; 10]),
        }
    }

    #[test]
    fn bounded_in_bytes_with_try_push_full() {
        let q = SendQueue::new(40, false);
        // Each message costs 6 + 2 + 1 + 10 = 19 bytes: admitted while below 40.
        q.push(msg(1), false).unwrap();
        q.push(msg(2), false).unwrap();
        q.push(msg(3), false).unwrap();
        assert!(matches!(q.push(msg(4), false), Err(PushError::Full(_))));
        assert_eq!(q.high_water.load(Ordering::Relaxed), 57);
    }

    #[test]
    fn natural_takes_everything_none_takes_one() {
        let q = SendQueue::new(1 << 20, false);
        for i in 0..5 {
            q.push(msg(i), false).unwrap();
        }
        let (mut items, mut ctl) = (VecDeque::new(), Vec::new());
        assert_eq!(
            q.next_batch(&mut NoBundling, 0, &mut items, &mut ctl),
            Next::Batch(FlushReason::Single)
        );
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].payload[0], 0);
        items.clear();
        assert_eq!(
            q.next_batch(&mut Natural, 0, &mut items, &mut ctl),
            Next::Batch(FlushReason::Drained)
        );
        assert_eq!(
            items.iter().map(|m| m.payload[0]).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        q.close();
        items.clear();
        assert_eq!(
            q.next_batch(&mut Natural, 0, &mut items, &mut ctl),
            Next::Drained
        );
    }

    #[test]
    fn blocked_sender_resumes_when_writer_drains() {
        let q = Arc::new(SendQueue::new(20, false));
        q.push(msg(1), false).unwrap();
        q.push(msg(2), false).unwrap();
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.push(msg(3), true).is_ok());
        std::thread::sleep(Duration::from_millis(20));
        let (mut items, mut ctl) = (VecDeque::new(), Vec::new());
        q.next_batch(&mut Natural, 0, &mut items, &mut ctl);
        assert!(t.join().unwrap());
        assert_eq!(q.len(), 1);
        assert!(q.blocked_ns.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn unshift_restores_order_and_poke_interrupts_the_writer() {
        let q = SendQueue::new(1 << 20, false);
        for i in 0..3 {
            q.push(msg(i), false).unwrap();
        }
        let (mut items, mut ctl) = (VecDeque::new(), Vec::new());
        q.next_batch(&mut NoBundling, 0, &mut items, &mut ctl);
        q.unshift(&mut items);
        q.poke();
        assert_eq!(
            q.next_batch(&mut Natural, 0, &mut items, &mut ctl),
            Next::Reconnect
        );
        assert_eq!(
            q.next_batch(&mut Natural, 1, &mut items, &mut ctl),
            Next::Batch(FlushReason::Drained)
        );
        assert_eq!(
            items.iter().map(|m| m.payload[0]).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }
}
