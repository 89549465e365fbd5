//! The pending-request table: one slot per request in flight, found by its correlation id
//! (see `batchwire_core::call` for how ids travel).
//!
//! Rules, each with a test below or in `tests/requests.rs`:
//! - ids are never reused while the node runs (a 64-bit counter from a random start), so a
//!   reply can only ever complete the request that asked for it;
//! - a reply completes a slot only if it comes from the node the request went to; one for
//!   no slot (timed out, cancelled, or never asked) is counted as late and dropped, one from
//!   another node is counted as stray and dropped;
//! - the table is bounded (`max_pending_requests`); a slot leaves it when its caller takes
//!   the answer, gives up (timeout) or drops the future (cancel), never later;
//! - a peer declared down fails every request to it at once, and shutdown fails them all.
//!
//! Blocking callers park their thread; async callers leave a waker, and the timer thread
//! (`run_timer`, started with the first async request) fails them at their deadline.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use batchwire_core::call;
use batchwire_core::codec::Name;
use bytes::Bytes;

use crate::address::Address;
use crate::error::Error;
use crate::io::envelope::Envelope;

/// What a blocking caller does next ([`Calls::wait_step`]).
#[derive(Debug)]
enum Step {
    Answer(Result<Envelope, Error>),
    Park(Duration),
}

/// Who waits for a slot's answer.
pub(crate) enum Waiter {
    Thread(Thread),
    Task(Option<Waker>),
}

enum State {
    Waiting(Waiter),
    Done(Result<Envelope, Error>),
}

struct Slot {
    node: Name,
    mailbox: Name,
    /// Async slots are in `Table::deadlines` under this.
    deadline: Option<Instant>,
    state: State,
}

struct Table {
    next: u64,
    slots: HashMap<u64, Slot>,
    deadlines: BTreeSet<(Instant, u64)>,
    stopped: bool,
}

/// Counters of the table (`NodeStats::requests`).
#[derive(Default)]
pub(crate) struct CallCounters {
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub timed_out: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    pub late_replies: AtomicU64,
    pub stray_replies: AtomicU64,
}

/// The table, shared by callers, connection readers (replies), peers (down) and the timer.
pub(crate) struct Calls {
    t: Mutex<Table>,
    /// The timer thread waits here for an earlier deadline or the stop.
    timer: Condvar,
    max: usize,
    pub counters: CallCounters,
}

fn wake(w: Waiter) {
    match w {
        Waiter::Thread(t) => t.unpark(),
        Waiter::Task(Some(w)) => w.wake(),
        Waiter::Task(None) => {}
    }
}

impl Calls {
    pub fn new(max: usize, first_id: u64) -> Calls {
        Calls {
            t: Mutex::new(Table {
                next: first_id,
                slots: HashMap::new(),
                deadlines: BTreeSet::new(),
                stopped: false,
            }),
            timer: Condvar::new(),
            max,
            counters: CallCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a request to `to`; async ones (`Waiter::Task`) fail with `Timeout` at
    /// `deadline`. Returns its id.
    pub fn begin(&self, to: &Address, deadline: Instant, waiter: Waiter) -> Result<u64, Error> {
        let mut t = self.lock();
        if t.stopped {
            return Err(Error::ShutDown { payload: None });
        }
        if t.slots.len() >= self.max {
            self.counters.refused.fetch_add(1, Relaxed);
            return Err(Error::TooManyRequests { max: self.max });
        }
        let id = t.next;
        t.next = t.next.wrapping_add(1);
        let timed = matches!(waiter, Waiter::Task(_));
        if timed {
            let earliest = t.deadlines.first().is_none_or(|(d, _)| deadline < *d);
            t.deadlines.insert((deadline, id));
            if earliest {
                self.timer.notify_one();
            }
        }
        t.slots.insert(
            id,
            Slot {
                node: to.node.clone(),
                mailbox: to.mailbox.clone(),
                deadline: timed.then_some(deadline),
                state: State::Waiting(waiter),
            },
        );
        self.counters.sent.fetch_add(1, Relaxed);
        Ok(id)
    }

    /// Settle slot `id` with `r` if it is still waiting; returns whether it was.
    fn settle(t: &mut Table, id: u64, r: Result<Envelope, Error>) -> Option<Waiter> {
        let s = t.slots.get_mut(&id)?;
        if !matches!(s.state, State::Waiting(_)) {
            return None;
        }
        if let Some(d) = s.deadline.take() {
            t.deadlines.remove(&(d, id));
        }
        match std::mem::replace(&mut s.state, State::Done(r)) {
            State::Waiting(w) => Some(w),
            State::Done(_) => None,
        }
    }

    /// A reply to call `id` arrived from node `from`. Returns who to wake (the caller
    /// wakes them after dropping the lock).
    fn reply_locked(&self, t: &mut Table, id: u64, from: &Name, payload: Bytes) -> Option<Waiter> {
        let Some(s) = t.slots.get(&id) else {
            self.counters.late_replies.fetch_add(1, Relaxed);
            return None;
        };
        if s.node != *from {
            self.counters.stray_replies.fetch_add(1, Relaxed);
            return None;
        }
        let e = Envelope::new(
            Address::from_names(s.node.clone(), s.mailbox.clone()),
            payload,
        );
        let w = Self::settle(t, id, Ok(e));
        if w.is_none() {
            self.counters.late_replies.fetch_add(1, Relaxed);
        }
        w
    }

    /// A reply to call `id` arrived from node `from`.
    #[cfg(test)]
    pub fn reply(&self, id: u64, from: &Name, payload: Bytes) {
        let w = self.reply_locked(&mut self.lock(), id, from, payload);
        w.into_iter().for_each(wake);
    }

    /// Replies from node `node`, as (sender field, payload) pairs straight off the wire
    /// (unchecked): one lock for the lot, callers woken after it.
    pub fn replies_from_wire(&self, node: &Name, replies: impl Iterator<Item = (Name, Bytes)>) {
        let mut woken = Vec::new();
        let mut t = self.lock();
        for (sender, payload) in replies {
            match call::parse(sender.as_bytes()) {
                Some((id, _)) => woken.extend(self.reply_locked(&mut t, id, node, payload)),
                None => {
                    self.counters.stray_replies.fetch_add(1, Relaxed);
                }
            }
        }
        drop(t);
        woken.into_iter().for_each(wake);
    }

    /// Node `node` says call `id` failed (`e`): it fails if it is still waiting and went
    /// to that node (another node cannot fail it).
    pub fn fail_from(&self, id: u64, node: &Name, e: Error) {
        let mut t = self.lock();
        if t.slots.get(&id).is_none_or(|s| s.node != *node) {
            return;
        }
        if let Some(w) = Self::settle(&mut t, id, Err(e)) {
            self.counters.failed.fetch_add(1, Relaxed);
            drop(t);
            wake(w);
        }
    }

    /// Node `node` went down: fail every request to it.
    pub fn fail_node(&self, node: &Name) {
        let mut t = self.lock();
        let ids: Vec<u64> = t
            .slots
            .iter()
            .filter(|(_, s)| s.node == *node && matches!(s.state, State::Waiting(_)))
            .map(|(id, _)| *id)
            .collect();
        let mut woken = Vec::with_capacity(ids.len());
        for id in ids {
            woken.extend(Self::settle(
                &mut t,
                id,
                Err(Error::PeerDown(node.to_string())),
            ));
        }
        self.counters.failed.fetch_add(woken.len() as u64, Relaxed);
        drop(t);
        woken.into_iter().for_each(wake);
    }

    /// The answer of call `id` if it is in (taking it out of the table); otherwise leave
    /// `cx`'s waker.
    pub fn poll(&self, id: u64, cx: &mut Context<'_>) -> Poll<Result<Envelope, Error>> {
        let mut t = self.lock();
        match t.slots.get_mut(&id).map(|s| &mut s.state) {
            Some(State::Waiting(Waiter::Task(w))) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Some(State::Waiting(Waiter::Thread(_))) => Poll::Pending,
            Some(State::Done(_)) => Poll::Ready(self.take(&mut t, id)),
            None => Poll::Ready(Err(Error::ShutDown { payload: None })),
        }
    }

    fn take(&self, t: &mut Table, id: u64) -> Result<Envelope, Error> {
        match t.slots.remove(&id).map(|s| s.state) {
            Some(State::Done(r)) => {
                if r.is_ok() {
                    self.counters.answered.fetch_add(1, Relaxed);
                }
                r
            }
            _ => Err(Error::ShutDown { payload: None }),
        }
    }

    /// Wait (parking this thread) for call `id`'s answer until `deadline`; the slot is gone
    /// when this returns.
    pub fn wait(&self, id: u64, deadline: Instant) -> Result<Envelope, Error> {
        loop {
            let mut t = self.lock();
            match self.wait_step(&mut t, id, Instant::now(), deadline) {
                Step::Answer(r) => return r,
                Step::Park(d) => {
                    drop(t);
                    std::thread::park_timeout(d);
                }
            }
        }
    }

    /// One look at a blocking call at time `now`: its answer if it is in (even if `now`
    /// is past the deadline: it came), else `Timeout` at or past `deadline` (the slot is
    /// gone), else how long to park.
    fn wait_step(&self, t: &mut Table, id: u64, now: Instant, deadline: Instant) -> Step {
        match t.slots.get(&id).map(|s| &s.state) {
            Some(State::Done(_)) | None => return Step::Answer(self.take(t, id)),
            Some(State::Waiting(_)) => {}
        }
        if now >= deadline {
            t.slots.remove(&id);
            self.counters.timed_out.fetch_add(1, Relaxed);
            return Step::Answer(Err(Error::Timeout));
        }
        Step::Park(deadline - now)
    }

    /// Whether call `id` has its answer (or is gone: taken, timed out, failed).
    pub fn is_answered(&self, id: u64) -> bool {
        !matches!(
            self.lock().slots.get(&id).map(|s| &s.state),
            Some(State::Waiting(_))
        )
    }

    /// The caller gave up on call `id` (dropped its future, or its send failed): forget it.
    pub fn cancel(&self, id: u64) {
        let mut t = self.lock();
        if let Some(s) = t.slots.remove(&id) {
            if let Some(d) = s.deadline {
                t.deadlines.remove(&(d, id));
            }
            if matches!(s.state, State::Waiting(_)) {
                self.counters.cancelled.fetch_add(1, Relaxed);
            }
        }
    }

    /// The request of call `id` could not be sent: forget it (counted as failed).
    pub fn forget(&self, id: u64) {
        let mut t = self.lock();
        if let Some(s) = t.slots.remove(&id) {
            if let Some(d) = s.deadline {
                t.deadlines.remove(&(d, id));
            }
            self.counters.failed.fetch_add(1, Relaxed);
        }
    }

    /// Fail the async calls whose deadline passed; returns the next deadline.
    fn expire(&self, t: &mut Table, now: Instant, woken: &mut Vec<Waiter>) -> Option<Instant> {
        while let Some(&(d, id)) = t.deadlines.first() {
            if d > now {
                return Some(d);
            }
            t.deadlines.pop_first();
            if let Some(s) = t.slots.get_mut(&id) {
                s.deadline = None;
                if let State::Waiting(w) =
                    std::mem::replace(&mut s.state, State::Done(Err(Error::Timeout)))
                {
                    self.counters.timed_out.fetch_add(1, Relaxed);
                    woken.push(w);
                }
            }
        }
        None
    }

    /// Requests in flight (slots in the table).
    pub fn pending(&self) -> usize {
        self.lock().slots.len()
    }

    /// Shutdown: fail every request in flight, refuse new ones, stop the timer.
    pub fn stop(&self) {
        let mut t = self.lock();
        t.stopped = true;
        let ids: Vec<u64> = t.slots.keys().copied().collect();
        let mut woken = Vec::new();
        for id in ids {
            woken.extend(Self::settle(
                &mut t,
                id,
                Err(Error::ShutDown { payload: None }),
            ));
        }
        self.timer.notify_all();
        drop(t);
        woken.into_iter().for_each(wake);
    }
}

/// The timer thread's body: fail async requests at their deadline, until `stop`.
pub(crate) fn run_timer(calls: &Calls) {
    let mut t = calls.lock();
    let mut woken = Vec::new();
    while !t.stopped {
        let next = calls.expire(&mut t, Instant::now(), &mut woken);
        if !woken.is_empty() {
            drop(t);
            woken.drain(..).for_each(wake);
            t = calls.lock();
            continue;
        }
        // No deadline: sleep until a request brings one (`begin` notifies) or the stop.
        let d = next.map_or(Duration::from_secs(3600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        t = calls
            .timer
            .wait_timeout(t, d)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Relaxed);
        }
    }

    fn to(node: &str) -> Address {
        Address::new(node, "svc").unwrap()
    }

    fn n(s: &str) -> Name {
        Name::new(s).unwrap()
    }

    #[test]
    fn a_reply_completes_only_its_own_call_from_the_node_it_asked() {
        let c = Calls::new(8, u64::MAX - 1);
        let far = Instant::now() + Duration::from_secs(60);
        let a = c.begin(&to("b"), far, Waiter::Task(None)).unwrap();
        let b = c.begin(&to("b"), far, Waiter::Task(None)).unwrap();
        assert_ne!(a, b, "ids wrap around without repeating");
        // Forged: right id, wrong node.
        c.reply(a, &n("evil"), Bytes::from_static(b"x"));
        assert_eq!(c.counters.stray_replies.load(Relaxed), 1);
        c.reply(a, &n("b"), Bytes::from_static(b"yes"));
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let Poll::Ready(Ok(e)) = c.poll(a, &mut cx) else {
            panic!("answered")
        };
        assert_eq!(&e.payload[..], b"yes");
        assert_eq!(e.from.to_string(), "svc@b");
        assert!(c.poll(b, &mut cx).is_pending());
        // Cancelled: its reply is late, and nothing is left.
        c.cancel(b);
        c.reply(b, &n("b"), Bytes::from_static(b"late"));
        c.replies_from_wire(&n("b"), std::iter::once((n("\0zz"), Bytes::new())));
        // Only the node asked can fail a call.
        let d = c.begin(&to("b"), far, Waiter::Task(None)).unwrap();
        c.fail_from(d, &n("evil"), Error::Timeout);
        assert!(c.poll(d, &mut cx).is_pending());
        c.cancel(d);
        assert_eq!(c.counters.late_replies.load(Relaxed), 1);
        assert_eq!(c.counters.stray_replies.load(Relaxed), 2);
        assert_eq!(c.counters.cancelled.load(Relaxed), 2);
        assert_eq!(c.pending(), 0);
        assert!(c.lock().deadlines.is_empty());
    }

    #[test]
    fn the_table_is_bounded_and_down_nodes_fail_their_calls() {
        let c = Calls::new(2, 0);
        let far = Instant::now() + Duration::from_secs(60);
        let a = c.begin(&to("b"), far, Waiter::Task(None)).unwrap();
        let x = c.begin(&to("c"), far, Waiter::Task(None)).unwrap();
        assert!(matches!(
            c.begin(&to("b"), far, Waiter::Task(None)),
            Err(Error::TooManyRequests { max: 2 })
        ));
        c.fail_node(&n("b"));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(c.poll(a, &mut cx), Poll::Ready(Err(Error::PeerDown(p))) if p == "b"));
        assert!(c.poll(x, &mut cx).is_pending());
        c.stop();
        assert!(matches!(
            c.poll(x, &mut cx),
            Poll::Ready(Err(Error::ShutDown { .. }))
        ));
        assert!(matches!(
            c.begin(&to("b"), far, Waiter::Task(None)),
            Err(Error::ShutDown { .. })
        ));
        assert_eq!(c.pending(), 0);
    }

    /// Request timeouts on a fake clock: a blocking call parks exactly until its deadline
    /// and times out at it, not a nanosecond before; an answer that is in wins even when
    /// looked at late. The timer fails async calls at their deadline, in deadline order,
    /// and says when to look next.
    #[test]
    fn requests_time_out_at_their_deadline_not_before() {
        let c = Calls::new(8, 0);
        let t0 = Instant::now();
        let ns = Duration::from_nanos(1);
        let d = t0 + Duration::from_millis(100);
        let me = || Waiter::Thread(std::thread::current());
        let a = c.begin(&to("b"), d, me()).unwrap();
        let mut t = c.lock();
        assert!(matches!(c.wait_step(&mut t, a, t0, d), Step::Park(p) if p == d - t0));
        assert!(matches!(c.wait_step(&mut t, a, d - ns, d), Step::Park(p) if p == ns));
        assert!(matches!(
            c.wait_step(&mut t, a, d, d),
            Step::Answer(Err(Error::Timeout))
        ));
        assert!(t.slots.is_empty(), "timed out: the slot is gone");
        drop(t);
        assert_eq!(c.counters.timed_out.load(Relaxed), 1);
        // Past the deadline, too; and its late reply is counted and dropped.
        let b = c.begin(&to("b"), d, me()).unwrap();
        let mut t = c.lock();
        assert!(matches!(
            c.wait_step(&mut t, b, d + Duration::from_secs(9), d),
            Step::Answer(Err(Error::Timeout))
        ));
        drop(t);
        c.reply(b, &n("b"), Bytes::from_static(b"late"));
        assert_eq!(c.counters.late_replies.load(Relaxed), 1);
        // Answered before the caller looked: the answer, however late it looks.
        let e = c.begin(&to("b"), d, me()).unwrap();
        c.reply(e, &n("b"), Bytes::from_static(b"yes"));
        let mut t = c.lock();
        assert!(matches!(
            c.wait_step(&mut t, e, d + Duration::from_secs(9), d),
            Step::Answer(Ok(ref m)) if &m.payload[..] == b"yes"
        ));
        drop(t);
        assert_eq!(c.counters.timed_out.load(Relaxed), 2);
        // Async calls: the timer's `expire`.
        let d1 = t0 + Duration::from_millis(10);
        let d2 = t0 + Duration::from_millis(20);
        let x = c.begin(&to("b"), d2, Waiter::Task(None)).unwrap();
        let y = c.begin(&to("b"), d1, Waiter::Task(None)).unwrap();
        let mut woken = Vec::new();
        let mut t = c.lock();
        assert_eq!(c.expire(&mut t, t0, &mut woken), Some(d1));
        assert_eq!(c.expire(&mut t, d1 - ns, &mut woken), Some(d1));
        assert!(woken.is_empty());
        assert_eq!(
            c.expire(&mut t, d1, &mut woken),
            Some(d2),
            "y at its deadline"
        );
        assert_eq!(woken.len(), 1);
        assert_eq!(c.expire(&mut t, d2 - ns, &mut woken), Some(d2));
        assert_eq!(c.expire(&mut t, d2 + ns, &mut woken), None, "x past it");
        assert_eq!(woken.len(), 2);
        drop(t);
        let mut cx = Context::from_waker(Waker::noop());
        for id in [x, y] {
            assert!(matches!(
                c.poll(id, &mut cx),
                Poll::Ready(Err(Error::Timeout))
            ));
        }
        assert_eq!(c.counters.timed_out.load(Relaxed), 4);
        assert_eq!(c.pending(), 0);
        assert!(c.lock().deadlines.is_empty());
    }

    #[test]
    fn deadlines_fail_async_calls_and_blocking_calls_time_out_themselves() {
        let c = Arc::new(Calls::new(8, 7));
        let soon = Instant::now() + Duration::from_millis(20);
        let flag = Arc::new(Flag(false.into()));
        let a = c
            .begin(
                &to("b"),
                soon,
                Waiter::Task(Some(Waker::from(flag.clone()))),
            )
            .unwrap();
        let c2 = c.clone();
        let timer = std::thread::spawn(move || run_timer(&c2));
        let b = c
            .begin(&to("b"), soon, Waiter::Thread(std::thread::current()))
            .unwrap();
        assert!(matches!(c.wait(b, soon), Err(Error::Timeout)));
        let t0 = Instant::now();
        while !flag.0.load(Relaxed) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(flag.0.load(Relaxed), "the timer woke the task");
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(
            c.poll(a, &mut cx),
            Poll::Ready(Err(Error::Timeout))
        ));
        assert_eq!(c.counters.timed_out.load(Relaxed), 2);
        assert_eq!(c.pending(), 0);
        c.stop();
        timer.join().unwrap();
    }
}
