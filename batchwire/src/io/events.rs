//! The event bus: every subscriber has a bounded queue. The node never waits for one: an
//! event that finds a queue full is dropped and counted, and that subscriber gets one
//! `Event::EventsDropped` with the count as soon as it has room again.
//!
//! A subscriber is a std channel (`Node::events`, or `Node::timed_events` with the time of
//! each event) or an async queue (`Node::event_stream`, a `Stream`); all are bounded the
//! same way, and all end once the node has shut down, after its last event.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::event::{Event, TimedEvent};

/// A cheap handle on the bus.
#[derive(Clone)]
pub(crate) struct Events(Arc<Inner>);

struct Inner {
    subscribers: Mutex<Vec<Sink>>,
    capacity: usize,
    dropped: AtomicU64,
    /// Set by `close`: later subscribers end at once.
    closed: std::sync::atomic::AtomicBool,
}

struct Sink {
    tx: Tx,
    missed: u64,
}

/// Where a subscriber's events go.
enum Tx {
    Std(SyncSender<Event>),
    /// With the time the event was emitted.
    Timed(SyncSender<TimedEvent>),
    Async(Arc<AsyncQueue>),
}

impl Tx {
    fn try_send(&self, e: Event, now: Instant) -> Result<(), TrySendError<Event>> {
        match self {
            Tx::Std(tx) => tx.try_send(e),
            Tx::Timed(tx) => {
                tx.try_send(TimedEvent { at: now, event: e })
                    .map_err(|err| match err {
                        TrySendError::Full(t) => TrySendError::Full(t.event),
                        TrySendError::Disconnected(t) => TrySendError::Disconnected(t.event),
                    })
            }
            Tx::Async(q) => q.try_push(e),
        }
    }
}

/// An async subscriber's queue.
pub(crate) struct AsyncQueue {
    inner: Mutex<AsyncInner>,
    capacity: usize,
}

struct AsyncInner {
    q: VecDeque<Event>,
    waker: Option<Waker>,
    /// The node shut down (after its last event).
    closed: bool,
    /// The stream was dropped: the bus forgets this subscriber.
    gone: bool,
}

impl AsyncQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, AsyncInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn try_push(&self, e: Event) -> Result<(), TrySendError<Event>> {
        let mut g = self.lock();
        if g.gone {
            return Err(TrySendError::Disconnected(e));
        }
        if g.q.len() >= self.capacity {
            return Err(TrySendError::Full(e));
        }
        g.q.push_back(e);
        if let Some(w) = g.waker.take() {
            drop(g);
            w.wake();
        }
        Ok(())
    }

    fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        if let Some(w) = g.waker.take() {
            drop(g);
            w.wake();
        }
    }

    /// The next event; `None` once the node shut down and all were taken.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let mut g = self.lock();
        if let Some(e) = g.q.pop_front() {
            return Poll::Ready(Some(e));
        }
        if g.closed {
            return Poll::Ready(None);
        }
        if !g.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            g.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The stream is dropped: its events and its task's waker go now, and the bus
    /// forgets it at the next event or subscriber.
    pub fn forget(&self) {
        let mut g = self.lock();
        g.gone = true;
        g.q.clear();
        g.waker = None;
    }

    fn is_gone(&self) -> bool {
        self.lock().gone
    }
}

impl Events {
    pub fn new(capacity: usize) -> Events {
        Events(Arc::new(Inner {
            subscribers: Mutex::new(Vec::new()),
            capacity,
            dropped: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// A new subscriber, with a queue of `capacity` events.
    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = mpsc::sync_channel(self.0.capacity);
        self.add(Tx::Std(tx));
        rx
    }

    /// A new subscriber whose events come with the time each was emitted.
    pub fn subscribe_timed(&self) -> Receiver<TimedEvent> {
        let (tx, rx) = mpsc::sync_channel(self.0.capacity);
        self.add(Tx::Timed(tx));
        rx
    }

    /// A new async subscriber, with a queue of `capacity` events.
    pub fn subscribe_async(&self) -> Arc<AsyncQueue> {
        let q = Arc::new(AsyncQueue {
            inner: Mutex::new(AsyncInner {
                q: VecDeque::new(),
                waker: None,
                closed: false,
                gone: false,
            }),
            capacity: self.0.capacity,
        });
        self.add(Tx::Async(q.clone()));
        q
    }

    fn add(&self, tx: Tx) {
        let mut g = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.closed.load(Relaxed) {
            // After the shutdown: a subscriber that ends at once.
            if let Tx::Async(q) = &tx {
                q.close();
            }
            return;
        }
        // Async streams dropped since the last event (made and dropped in a loop on a
        // quiet node) are forgotten here too, not only by the next event.
        g.retain(|s| !matches!(&s.tx, Tx::Async(q) if q.is_gone()));
        g.push(Sink { tx, missed: 0 });
    }

    /// The node shut down (every thread that emits has ended): each subscriber ends after
    /// what it has queued. A std receiver sees its channel disconnected once it has taken
    /// the last event (it waited for the node's last handle to go, which threads of the
    /// node could hold past the shutdown: the CLI's event printer then waited its full
    /// grace at every exit).
    pub fn close(&self) {
        let mut g = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        self.0.closed.store(true, Relaxed);
        for s in g.drain(..) {
            if let Tx::Async(q) = &s.tx {
                q.close();
            }
        }
    }

    /// Events dropped because a subscriber's queue was full.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Relaxed)
    }

    /// Hand `e` to every subscriber, never waiting. Subscribers that went away are
    /// forgotten.
    pub fn emit(&self, e: Event) {
        let mut g = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the lock: events emitted by several threads at once are timed in the
        // order every subscriber gets them.
        let now = Instant::now();
        g.retain_mut(|s| {
            if s.missed > 0 {
                match s.tx.try_send(Event::EventsDropped { count: s.missed }, now) {
                    Ok(()) => s.missed = 0,
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            if s.missed == 0 {
                match s.tx.try_send(e.clone(), now) {
                    Ok(()) => return true,
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            s.missed += 1;
            self.0.dropped.fetch_add(1, Relaxed);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_subscriber_loses_events_and_is_told_how_many() {
        let bus = Events::new(2);
        let slow = bus.subscribe();
        let fast = bus.subscribe();
        for count in 0..5 {
            bus.emit(Event::EventsDropped { count });
            assert!(matches!(fast.try_recv(), Ok(Event::EventsDropped { count: c }) if c == count));
        }
        assert_eq!(bus.dropped(), 3);
        assert!(matches!(
            slow.try_recv(),
            Ok(Event::EventsDropped { count: 0 })
        ));
        assert!(matches!(
            slow.try_recv(),
            Ok(Event::EventsDropped { count: 1 })
        ));
        // Room again: the next event brings the count of the missed ones first.
        bus.emit(Event::EventsDropped { count: 99 });
        assert!(matches!(
            slow.try_recv(),
            Ok(Event::EventsDropped { count: 3 })
        ));
        assert!(matches!(
            slow.try_recv(),
            Ok(Event::EventsDropped { count: 99 })
        ));
        drop(slow);
        bus.emit(Event::EventsDropped { count: 7 });
        assert_eq!(
            bus.0.subscribers.lock().unwrap().len(),
            1,
            "gone subscribers are forgotten"
        );
    }

    /// Async streams made and dropped while no event comes are forgotten by the next
    /// subscriber, with their task's waker.
    #[test]
    fn async_subscribers_dropped_on_a_quiet_bus_are_forgotten() {
        let bus = Events::new(4);
        let keep = bus.subscribe_async();
        for _ in 0..1000 {
            let q = bus.subscribe_async();
            let w = std::task::Waker::noop();
            assert!(q.poll_next(&mut Context::from_waker(w)).is_pending());
            q.forget();
            assert!(q.lock().waker.is_none());
        }
        assert!(bus.0.subscribers.lock().unwrap().len() <= 2);
        bus.emit(Event::EventsDropped { count: 1 });
        let w = std::task::Waker::noop();
        assert!(keep.poll_next(&mut Context::from_waker(w)).is_ready());
    }

    #[test]
    fn a_timed_subscriber_gets_each_event_with_when_it_was_emitted() {
        let bus = Events::new(2);
        let timed = bus.subscribe_timed();
        let before = Instant::now();
        bus.emit(Event::EventsDropped { count: 1 });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let middle = Instant::now();
        bus.emit(Event::EventsDropped { count: 2 });
        bus.emit(Event::EventsDropped { count: 3 });
        let after = Instant::now();
        let TimedEvent { at: t1, event: e1 } = timed.try_recv().expect("first");
        let TimedEvent { at: t2, event: e2 } = timed.try_recv().expect("second");
        assert_eq!(e1, Event::EventsDropped { count: 1 });
        assert_eq!(e2, Event::EventsDropped { count: 2 });
        assert!(
            before <= t1 && t1 <= middle,
            "stamped when emitted, not when taken"
        );
        assert!(middle <= t2 && t2 <= after);
        assert!(
            timed.try_recv().is_err(),
            "bounded like the others: the third is lost"
        );
        assert_eq!(bus.dropped(), 1);
        bus.emit(Event::EventsDropped { count: 4 });
        let told: Vec<Event> = timed.try_iter().map(|t| t.event).collect();
        assert_eq!(
            told,
            [
                Event::EventsDropped { count: 1 },
                Event::EventsDropped { count: 4 }
            ],
            "told how many it lost, then the next"
        );
        drop(timed);
        bus.emit(Event::EventsDropped { count: 5 });
        assert!(
            bus.0.subscribers.lock().unwrap().is_empty(),
            "forgotten when dropped"
        );
    }

    /// At shutdown every subscriber ends after its last event, so a thread that waits on
    /// one is not left waiting on the node's last handle; so does one that comes later.
    #[test]
    fn a_closed_bus_ends_every_subscriber_after_its_queued_events() {
        let bus = Events::new(4);
        let std_rx = bus.subscribe();
        let timed = bus.subscribe_timed();
        let q = bus.subscribe_async();
        bus.emit(Event::EventsDropped { count: 1 });
        let keep = bus.clone();
        bus.close();
        assert!(matches!(
            std_rx.recv(),
            Ok(Event::EventsDropped { count: 1 })
        ));
        let gone = Err(mpsc::RecvTimeoutError::Disconnected);
        let t = std::time::Duration::from_secs(2);
        assert_eq!(std_rx.recv_timeout(t), gone, "ended after its last event");
        assert_eq!(
            timed.recv().map(|t| t.event),
            Ok(Event::EventsDropped { count: 1 })
        );
        assert_eq!(timed.recv_timeout(t).map(|t| t.event), gone);
        assert!(q.lock().closed);
        assert_eq!(
            keep.subscribe().recv_timeout(t),
            gone,
            "one that comes later ends at once"
        );
        assert!(keep.subscribe_async().lock().closed);
    }
}
