//! The event bus: every subscriber has a bounded queue. The node never waits for one: an
//! event that finds a queue full is dropped and counted, and that subscriber gets one
//! `Event::EventsDropped` with the count as soon as it has room again.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use crate::event::Event;

/// A cheap handle on the bus.
#[derive(Clone)]
pub(crate) struct Events(Arc<Inner>);

struct Inner {
    subscribers: Mutex<Vec<Sink>>,
    capacity: usize,
    dropped: AtomicU64,
}

struct Sink {
    tx: SyncSender<Event>,
    missed: u64,
}

impl Events {
    pub fn new(capacity: usize) -> Events {
        Events(Arc::new(Inner {
            subscribers: Mutex::new(Vec::new()),
            capacity,
            dropped: AtomicU64::new(0),
        }))
    }

    /// A new subscriber, with a queue of `capacity` events.
    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = mpsc::sync_channel(self.0.capacity);
        let mut g = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        g.push(Sink { tx, missed: 0 });
        rx
    }

    /// Events dropped because a subscriber's queue was full.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Relaxed)
    }

    /// Hand `e` to every subscriber, never waiting. Subscribers that went away are
    /// forgotten.
    pub fn emit(&self, e: Event) {
        let mut g = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        g.retain_mut(|s| {
            if s.missed > 0 {
                match s.tx.try_send(Event::EventsDropped { count: s.missed }) {
                    Ok(()) => s.missed = 0,
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            if s.missed == 0 {
                match s.tx.try_send(e.clone()) {
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
}
