//! A lane: an outbound queue (an [`Outbox`] of encoded frames, bounded in bytes) and the
//! condvars its senders and its consumer wait on. Every peer has a lane of its own, which
//! its writer thread waits on (for data, and for a `poke`: a control frame is due, the
//! window has room, the connection changed); with `transfer-queue` one more lane, shared by
//! all peers, feeds the bundler thread. Only messages go through a lane: control frames
//! never queue behind data.
//!
//! The hot path (`push`) takes one mutex, encodes the message into the outbox and, only
//! when the writer is parked and has a reason to wake, notifies it: no syscall, allocation
//! (the buffer is reused) or clock read per message (the clock is read only when the
//! bundler needs enqueue times and the outbox was empty).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use batchwire_core::bundler::{Bundler, Decision, FlushReason};
use batchwire_core::codec::Name;
use batchwire_core::idle::{IdleStep, IdleStrategy};
use batchwire_core::outbox::{Batch, Dest, Outbox};

/// Why `push` did not queue a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The lane is at capacity and the caller asked not to block.
    Full,
    /// The node is shutting down.
    Closed,
}

/// What the writer should do after `next_batch`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The batch holds frames to write.
    Batch(FlushReason),
    /// The node is shutting down and the lane is empty.
    Drained,
    /// The writer was poked (control due, window room, connection changed); the batch is
    /// empty.
    Wake,
}

struct Inner {
    outbox: Outbox,
    closed: bool,
    writer_waiting: bool,
    senders_waiting: usize,
    /// Bumped whenever the consumer must look up (`poke`, `close`); mirrored in
    /// `Lane::epoch` for lock-free reads.
    epoch: u64,
}

pub(crate) struct Lane {
    inner: Mutex<Inner>,
    /// The writer waits here for messages.
    not_empty: Condvar,
    /// Senders wait here for room.
    not_full: Condvar,
    pub capacity: usize,
    track_time: bool,
    wake_bytes: usize,
    idle: IdleStrategy,
    /// Most bytes ever queued.
    pub high_water: AtomicU64,
    /// Nanoseconds senders spent blocked on a full lane.
    pub blocked_ns: AtomicU64,
    /// `Inner::epoch`, readable without the lock senders contend for (written under it).
    epoch: AtomicU64,
}

impl Lane {
    pub fn new(
        capacity: usize,
        bundler: &dyn Bundler,
        frame_bytes: usize,
        idle: IdleStrategy,
    ) -> Self {
        Lane {
            inner: Mutex::new(Inner {
                outbox: Outbox::new(bundler.frame_bytes(frame_bytes)),
                closed: false,
                writer_waiting: false,
                senders_waiting: 0,
                epoch: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            track_time: bundler.needs_enqueue_time(),
            wake_bytes: bundler.wake_bytes(),
            idle,
            high_water: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave `Inner` in a state that is worse
        // than losing the node, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encode a message into the lane. It is admitted while the lane holds fewer than
    /// `capacity` bytes, so one message larger than the capacity still goes through. With
    /// `block`, waits for room; otherwise returns `Full`.
    pub fn push(
        &self,
        dest: Dest,
        to: &Name,
        from: &Name,
        payload: &[u8],
        block: bool,
    ) -> Result<(), PushError> {
        let mut g = self.lock();
        if g.outbox.bytes() >= self.capacity && !g.closed {
            if !block {
                return Err(PushError::Full);
            }
            let start = Instant::now();
            g.senders_waiting += 1;
            while g.outbox.bytes() >= self.capacity && !g.closed {
                g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            g.senders_waiting -= 1;
            self.blocked_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if g.closed {
            return Err(PushError::Closed);
        }
        let was_empty = g.outbox.is_empty();
        let now = (was_empty && self.track_time).then(Instant::now);
        g.outbox.push_message(dest, to, from, payload, now);
        let bytes = g.outbox.bytes();
        if bytes as u64 > self.high_water.load(Ordering::Relaxed) {
            self.high_water.store(bytes as u64, Ordering::Relaxed);
        }
        if g.writer_waiting && (was_empty || bytes >= self.wake_bytes) {
            self.not_empty.notify_one();
        }
        Ok(())
    }

    /// Make the consumer look up: `next_batch` returns `Wake`, `wait_epoch` returns.
    pub fn poke(&self) {
        let mut g = self.lock();
        g.epoch += 1;
        self.epoch.store(g.epoch, Ordering::Release);
        self.not_empty.notify_all();
    }

    /// The current epoch (no lock: the writer reads it once per round).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Wait until the epoch moves past `epoch` (a poke) or `d` passes.
    pub fn wait_epoch(&self, epoch: u64, d: Duration) {
        let g = self.lock();
        let _ = self
            .not_empty
            .wait_timeout_while(g, d, |g| g.epoch == epoch)
            .unwrap_or_else(|p| p.into_inner());
    }

    /// Refuse new messages; the writer drains what is queued, then sees `Drained`.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        // A consumer waiting for a poke (`wait_epoch`) must look up too.
        g.epoch += 1;
        self.epoch.store(g.epoch, Ordering::Release);
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Take everything queued (to report it failed when it cannot be sent).
    pub fn take_all(&self, batch: &mut Batch) {
        let mut g = self.lock();
        g.outbox.take(usize::MAX, usize::MAX, batch, None);
        self.not_full.notify_all();
    }

    /// Messages waiting.
    pub fn queued(&self) -> usize {
        self.lock().outbox.messages()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.lock().outbox.is_empty()
    }

    /// Whether the lane is closed and empty: nothing more can come out of it.
    pub fn is_drained(&self) -> bool {
        let g = self.lock();
        g.closed && g.outbox.is_empty()
    }

    /// Wait (per the idle strategy) until the bundler says to flush, then move the frames
    /// to write into `batch`. Returns `Reconnect` as soon as the epoch moves past `epoch`.
    pub fn next_batch(&self, bundler: &mut dyn Bundler, epoch: u64, batch: &mut Batch) -> Next {
        let mut idler = self.idle.idler();
        let mut g = self.lock();
        loop {
            if g.epoch != epoch {
                return Next::Wake;
            }
            let now = Instant::now();
            match bundler.poll(g.outbox.level(), now) {
                Decision::Flush {
                    max_messages,
                    max_bytes,
                    reason,
                } => {
                    let keep_time = self.track_time.then_some(now);
                    g.outbox.take(max_messages, max_bytes, batch, keep_time);
                    if g.senders_waiting > 0 {
                        self.not_full.notify_all();
                    }
                    return Next::Batch(reason);
                }
                Decision::Wait { until } => {
                    if g.closed && g.outbox.is_empty() {
                        return Next::Drained;
                    }
                    let step = if until.is_some() {
                        IdleStep::Park
                    } else {
                        idler.step()
                    };
                    match step {
                        IdleStep::Spin | IdleStep::Yield => {
                            drop(g);
                            crate::io::pause(step);
                            g = self.lock();
                        }
                        IdleStep::Park => {
                            g.writer_waiting = true;
                            g = match until {
                                None => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                                Some(t) => {
                                    let d = t
                                        .saturating_duration_since(now)
                                        .max(Duration::from_micros(1));
                                    self.not_empty
                                        .wait_timeout(g, d)
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchwire_core::bundler::{BundlerConfig, BundlerKind};
    use std::sync::Arc;

    fn lane(kind: BundlerKind, cap: usize) -> (Lane, Box<dyn Bundler>) {
        let b = BundlerConfig {
            kind,
            ..Default::default()
        }
        .build();
        (
            Lane::new(cap, b.as_ref(), 64 << 10, IdleStrategy::default()),
            b,
        )
    }

    fn push(l: &Lane, n: u8, block: bool) -> Result<(), PushError> {
        l.push(
            0,
            &Name::from_static("to"),
            &Name::from_static("f"),
            &[n; 10],
            block,
        )
    }

    #[test]
    fn bounded_in_bytes_with_try_push_full() {
        let (l, _) = lane(BundlerKind::Natural, 40);
        // 17 bytes of frame header, then 19 per message: admitted while below 40.
        push(&l, 1, false).unwrap();
        push(&l, 2, false).unwrap();
        assert_eq!(push(&l, 3, false), Err(PushError::Full));
        assert_eq!(l.high_water.load(Ordering::Relaxed), 55);
    }

    #[test]
    fn natural_takes_everything_none_takes_one() {
        let (l, mut none) = lane(BundlerKind::None, 1 << 20);
        for i in 0..5 {
            push(&l, i, false).unwrap();
        }
        let mut b = Batch::default();
        assert_eq!(
            l.next_batch(none.as_mut(), 0, &mut b),
            Next::Batch(FlushReason::Single)
        );
        assert_eq!(b.messages(), 1);
        let mut nat = BundlerConfig::default().build();
        assert_eq!(
            l.next_batch(nat.as_mut(), 0, &mut b),
            Next::Batch(FlushReason::Drained)
        );
        assert_eq!(b.messages(), 4);
        l.close();
        assert_eq!(
            l.next_batch(nat.as_mut(), 0, &mut b),
            Next::Wake,
            "closing wakes a consumer waiting on an older epoch"
        );
        assert_eq!(l.next_batch(nat.as_mut(), l.epoch(), &mut b), Next::Drained);
        assert_eq!(push(&l, 9, true), Err(PushError::Closed));
    }

    #[test]
    fn blocked_sender_resumes_when_writer_drains() {
        let (l, mut b) = lane(BundlerKind::Natural, 20);
        let l = Arc::new(l);
        push(&l, 1, false).unwrap();
        let l2 = l.clone();
        let t = std::thread::spawn(move || push(&l2, 3, true).is_ok());
        std::thread::sleep(Duration::from_millis(20));
        let mut batch = Batch::default();
        l.next_batch(b.as_mut(), 0, &mut batch);
        assert!(t.join().unwrap());
        assert_eq!(l.queued(), 1);
        assert!(l.blocked_ns.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn a_parked_writer_wakes_for_a_message_and_for_a_poke() {
        for level in [1, 5] {
            let b = BundlerConfig::default().build();
            let l = Arc::new(Lane::new(
                1 << 20,
                b.as_ref(),
                64 << 10,
                IdleStrategy::from_level(level).unwrap(),
            ));
            let l2 = l.clone();
            let t = std::thread::spawn(move || {
                let mut b = BundlerConfig::default().build();
                let mut batch = Batch::default();
                let first = l2.next_batch(b.as_mut(), 0, &mut batch);
                let second = l2.next_batch(b.as_mut(), 0, &mut batch);
                (first, second)
            });
            std::thread::sleep(Duration::from_millis(20));
            push(&l, 1, false).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            l.poke();
            assert_eq!(
                t.join().unwrap(),
                (Next::Batch(FlushReason::Drained), Next::Wake),
                "level {level}"
            );
        }
    }

    #[test]
    fn linger_writer_sleeps_until_the_deadline_or_max_size() {
        let cfg = BundlerConfig {
            kind: BundlerKind::Linger,
            max_size: 1000,
            max_delay: Duration::from_millis(30),
        };
        let l = Lane::new(
            1 << 20,
            cfg.build().as_ref(),
            64 << 10,
            IdleStrategy::default(),
        );
        push(&l, 1, false).unwrap();
        let t0 = Instant::now();
        let mut batch = Batch::default();
        assert_eq!(
            l.next_batch(cfg.build().as_mut(), 0, &mut batch),
            Next::Batch(FlushReason::Timer)
        );
        assert!(t0.elapsed() >= Duration::from_millis(25));
        for i in 0..60 {
            push(&l, i, false).unwrap();
        }
        assert_eq!(
            l.next_batch(cfg.build().as_mut(), 0, &mut batch),
            Next::Batch(FlushReason::SizeReached)
        );
        assert_eq!(batch.messages(), 60);
    }
}
