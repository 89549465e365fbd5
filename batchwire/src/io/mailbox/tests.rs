use super::*;
use batchwire_core::frame::{Message, MessageList};
use std::time::Duration;

fn env(i: u8) -> Envelope {
    Envelope::new(Address::new("n", "m").unwrap(), Bytes::from(vec![i; 8]))
}

fn q(cap: usize) -> MailboxQueue {
    MailboxQueue::new(Name::from_static("m"), cap, IdleStrategy::default())
}

#[test]
fn push_respects_capacity_without_blocking() {
    let q = q(40);
    // Each costs 8 + 1 + 16 = 25: admitted at 0 and 25, refused at 50.
    assert!(q.push_one(env(0), false).is_ok());
    assert!(q.push_one(env(1), false).is_ok());
    let (back, why) = q.push_one(env(2), false).unwrap_err();
    assert_eq!((back.payload[0], why), (2, Refused::Full));
    assert_eq!(q.len(), 2);
}

#[test]
fn runs_are_decoded_by_the_receiver_in_order_across_partial_takes() {
    let q = q(1 << 20);
    let msgs: Vec<_> = (0..5u8)
        .map(|i| Message {
            to: Name::from_static("m"),
            from: Name::new(&format!("s{i}")).unwrap(),
            payload: Bytes::from(vec![i; 3]),
        })
        .collect();
    let list = MessageList::from_messages(&msgs);
    let (_, range, n) = list.runs().next().unwrap();
    let flow = crate::io::flow::testing::flow();
    let data = list.body().slice(range);
    let held = Held::new(flow.clone(), q.name.clone(), data.len() as u64);
    flow.charge(&q.name, data.len() as u64).unwrap();
    q.push_run(&Name::from_static("peer"), data, n, held)
        .unwrap();
    q.push_one(env(9), true).unwrap();
    assert_eq!(q.len(), 6);
    let mut out = Vec::new();
    assert_eq!(q.take(&mut out, 2, None), Ok(2));
    assert_eq!(q.take(&mut out, 10, None), Ok(4));
    let got: Vec<_> = out
        .iter()
        .map(|e| (e.from.to_string(), e.payload[0]))
        .collect();
    assert_eq!(got[0], ("s0@peer".to_string(), 0));
    assert_eq!(got[4], ("s4@peer".to_string(), 4));
    assert_eq!(got[5], ("m@n".to_string(), 9));
    assert_eq!(q.lock().bytes, 0);
    assert_eq!(flow.held(b"m"), 0, "all the credit went back");
}

#[test]
fn take_waits_until_a_push_and_returns_the_batch() {
    let q = Arc::new(q(1 << 20));
    let q2 = q.clone();
    let t = std::thread::spawn(move || {
        let mut out = Vec::new();
        let n = q2.take(
            &mut out,
            100,
            Some(Some(Instant::now() + Duration::from_secs(10))),
        );
        (n, out.len())
    });
    std::thread::sleep(Duration::from_millis(10));
    q.push_one(env(1), true).unwrap();
    let (n, got) = t.join().unwrap();
    assert!(n.unwrap() >= 1 && got >= 1);
}

#[test]
fn closed_mailbox_drains_then_reports_closed() {
    let q = q(1 << 20);
    q.push_one(env(1), true).unwrap();
    q.close();
    let mut out = Vec::new();
    assert_eq!(q.take(&mut out, 10, Some(None)), Ok(1));
    assert_eq!(q.take(&mut out, 10, Some(None)), Err(RecvError::Closed));
    assert!(
        q.push_one(env(2), true).is_err(),
        "a closed mailbox takes nothing"
    );
}

#[test]
fn messages_from_other_nodes_never_wait_and_their_credit_comes_back_as_taken() {
    let q = q(10);
    q.push_one(env(0), false).unwrap();
    assert!(q.push_one(env(1), false).is_err(), "full for local senders");
    let flow = crate::io::flow::testing::flow();
    // A run of four messages of `size` bytes for mailbox m, charged and queued.
    let run = |size: usize| {
        let msgs: Vec<_> = (0..4u8)
            .map(|i| Message {
                to: Name::from_static("m"),
                from: Name::from_static("s"),
                payload: Bytes::from(vec![i; size]),
            })
            .collect();
        let list = MessageList::from_messages(&msgs);
        let total = list.body().len() as u64;
        flow.charge(&q.name, total).unwrap();
        let held = Held::new(flow.clone(), q.name.clone(), total);
        // Full, and yet admitted at once: the sender's credit bounds it.
        q.push_run(&Name::from_static("p"), list.body().clone(), 4, held)
            .unwrap();
        total
    };
    let mut out = Vec::new();
    // Small messages taken a few at a time: their credit goes back in steps, so none
    // yet, and all of it once the run is taken.
    let total = run(10);
    q.take(&mut out, 3, None).unwrap();
    assert_eq!(flow.held(b"m"), total, "below one step: not yet");
    q.take(&mut out, 2, None).unwrap();
    assert_eq!(flow.held(b"m"), 0, "the run taken: all given back");
    // Large ones: two of them are more than a step, given back when taken.
    let total = run(10 << 10);
    q.take(&mut out, 2, None).unwrap();
    assert_eq!(
        flow.held(b"m"),
        total / 2,
        "two of the run taken, given back"
    );
    drop(q);
    assert_eq!(flow.held(b"m"), 0, "dropped with the mailbox: given back");
}

#[test]
fn timeout_is_reported() {
    let q = q(1 << 20);
    let mut out = Vec::new();
    let r = q.take(
        &mut out,
        1,
        Some(Some(Instant::now() + Duration::from_millis(5))),
    );
    assert_eq!(r, Err(RecvError::Timeout));
    assert_eq!(q.take(&mut out, 1, None), Err(RecvError::Empty));
}

/// A leader for tests: `act` runs in place of reading a connection.
struct FakeLeader<F>(F);

impl<F: Fn(&Arc<std::os::fd::OwnedFd>, Instant) -> bool + Send + Sync> Leader for FakeLeader<F> {
    fn lead_for(
        &self,
        _peer: &Name,
        wake: &Arc<std::os::fd::OwnedFd>,
        _done: &dyn Fn() -> bool,
        until: Instant,
    ) -> bool {
        (self.0)(wake, until)
    }
}

fn leading_queue(leader: &Arc<dyn Leader>) -> Arc<MailboxQueue> {
    let q = Arc::new(q(1 << 20));
    q.set_leader(Arc::downgrade(leader));
    {
        let mut g = q.lock();
        g.last_from = Some(Name::from_static("peer"));
        g.same_from = ONE_SOURCE;
    }
    q
}

#[cfg(target_os = "linux")]
#[test]
fn a_message_pushed_while_a_receiver_tried_to_lead_is_taken_not_slept_on() {
    // The receiver found nothing and tried to lead; meanwhile a push came (it saw the
    // receiver leading, so it signalled the eventfd rather than waking a sleeper), and
    // then the lead failed (someone else had the turn). The receiver must not park.
    let slot: Arc<std::sync::OnceLock<Arc<MailboxQueue>>> = Arc::default();
    let s2 = slot.clone();
    let leader: Arc<dyn Leader> = Arc::new(FakeLeader(move |_: &Arc<std::os::fd::OwnedFd>, _| {
        s2.get().unwrap().push_one(env(7), false).unwrap();
        false
    }));
    let q = leading_queue(&leader);
    slot.set(q.clone()).ok().unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    q.take_within(&mut got, 10, Duration::from_secs(5)).unwrap();
    assert_eq!(got[0].payload[0], 7);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(!q.lock().leading);
}

#[cfg(target_os = "linux")]
#[test]
fn a_receiver_that_leads_is_woken_by_a_push_from_elsewhere() {
    // The leader waits on the eventfd as `Reader::lead` would (with the socket).
    let leader: Arc<dyn Leader> = Arc::new(FakeLeader(
        |wake: &Arc<std::os::fd::OwnedFd>, until: Instant| {
            use std::os::fd::AsRawFd;
            let ms = until.saturating_duration_since(Instant::now()).as_millis() as i32;
            let _ = crate::sys::poll_readable([wake.as_raw_fd()], ms.max(1));
            true
        },
    ));
    let q = leading_queue(&leader);
    let q2 = q.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        q2.push_one(env(9), false).unwrap();
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    q.take_within(&mut got, 10, Duration::from_secs(10))
        .unwrap();
    assert_eq!(got[0].payload[0], 9);
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "woken by the eventfd"
    );
    pusher.join().unwrap();
    // The eventfd was emptied: a second wait with nothing pushed times out.
    let t1 = Instant::now();
    let r = q.take_within(&mut got, 10, Duration::from_millis(50));
    assert!(matches!(r, Err(RecvError::Timeout)), "{r:?}");
    assert!(t1.elapsed() >= Duration::from_millis(50));
}

#[cfg(target_os = "linux")]
#[test]
fn the_leaders_own_pushes_do_not_signal_its_eventfd() {
    // A receiver that leads pushes what it reads into its own mailbox, and looks at the
    // mailbox after every read: a signal to itself would be two system calls per push
    // (and a poll that returns at once). Pushes from other threads still signal.
    use std::os::fd::AsRawFd;
    let slot: Arc<std::sync::OnceLock<Arc<MailboxQueue>>> = Arc::default();
    let s2 = slot.clone();
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let seen2 = seen.clone();
    let leader: Arc<dyn Leader> =
        Arc::new(FakeLeader(move |wake: &Arc<std::os::fd::OwnedFd>, _| {
            let q = s2.get().unwrap();
            let readable = || crate::sys::poll_readable([wake.as_raw_fd()], 0).unwrap()[0];
            q.push_one(env(1), false).unwrap();
            seen2.lock().unwrap().push(readable());
            let q2 = q.clone();
            std::thread::spawn(move || q2.push_one(env(2), false).unwrap())
                .join()
                .unwrap();
            seen2.lock().unwrap().push(readable());
            true
        }));
    let q = leading_queue(&leader);
    slot.set(q.clone()).ok().unwrap();
    let mut got = Vec::new();
    q.take_within(&mut got, 10, Duration::from_secs(5)).unwrap();
    assert_eq!(got.iter().map(|e| e.payload[0]).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(
        *seen.lock().unwrap(),
        [false, true],
        "own push silent, other's signals"
    );
    // The other thread's signal was emptied when the lead ended.
    let fd = q.wake_fd().unwrap().as_raw_fd();
    assert!(!crate::sys::poll_readable([fd], 0).unwrap()[0]);
}

/// Queue one message from node `node` as a connection's reader would.
fn push_from(q: &MailboxQueue, node: &'static str, i: u8) {
    let flow = crate::io::flow::testing::flow();
    flow.charge(&q.name, 8).unwrap();
    let held = Held::new(flow, q.name.clone(), 8);
    let e = Envelope::new(Address::new(node, "m").unwrap(), Bytes::from(vec![i; 8]));
    q.push_remote(e, held).unwrap();
}

#[test]
fn a_receiver_leads_only_while_its_messages_come_from_one_node() {
    // Leads are counted; each gives up at once, so the receiver then waits as usual.
    let leads = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let l2 = leads.clone();
    let leader: Arc<dyn Leader> = Arc::new(FakeLeader(move |_: &Arc<std::os::fd::OwnedFd>, _| {
        l2.fetch_add(1, Ordering::Relaxed);
        false
    }));
    let q = Arc::new(q(1 << 20));
    q.set_leader(Arc::downgrade(&leader));
    let wait = |q: &MailboxQueue| {
        let mut out = Vec::new();
        while q.take(&mut out, 100, None).is_ok() {}
        let r = q.take_within(&mut out, 10, Duration::from_millis(5));
        assert!(matches!(r, Err(RecvError::Timeout)), "{r:?}");
    };
    // A stream from one node: it leads.
    (0..20).for_each(|i| push_from(&q, "n1", i));
    wait(&q);
    assert_eq!(leads.load(Ordering::Relaxed), 1);
    // One message from another node among them: not for a while.
    push_from(&q, "n2", 0);
    (0..20).for_each(|i| push_from(&q, "n1", i));
    wait(&q);
    assert_eq!(
        leads.load(Ordering::Relaxed),
        1,
        "led with two nodes sending"
    );
    // Once the other node has been quiet for MIXED_QUIET, it leads again.
    std::thread::sleep(MIXED_QUIET);
    wait(&q);
    assert_eq!(leads.load(Ordering::Relaxed), 2);
}

/// A waker that counts its wakes (each one distinct).
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn counter() -> Arc<Count> {
    Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)))
}

fn woken(c: &Arc<Count>) -> usize {
    c.0.load(Ordering::Relaxed)
}

/// Receive futures polled once on an idle mailbox and then dropped (tasks aborted, each
/// with its own waker) leave no waker behind for long: the list stays bounded, no task is
/// woken for it, and one that still waits is woken by the next push.
#[test]
fn wakers_of_receivers_that_went_away_are_forgotten() {
    use crate::io::wakers::{PRUNE_FROM, Ticket};
    let q = q(1 << 20);
    let waiting = counter();
    let mut its_ticket = Ticket::default();
    let w = Waker::from(waiting.clone());
    let mut out: Vec<Envelope> = Vec::new();
    let mut cx = Context::from_waker(&w);
    assert!(
        q.poll_batch(&mut cx, &mut out, 1, &mut its_ticket)
            .is_pending()
    );
    let gone: Vec<Arc<Count>> = (0..10 * PRUNE_FROM).map(|_| counter()).collect();
    for c in &gone {
        let w = Waker::from(c.clone());
        let mut cx = Context::from_waker(&w);
        let mut ticket = Ticket::default();
        assert!(q.poll_batch(&mut cx, &mut out, 1, &mut ticket).is_pending());
        drop(ticket);
        assert!(q.lock().wakers.len() <= PRUNE_FROM + 1);
    }
    assert!(
        gone.iter().all(|c| woken(c) == 0),
        "nobody woken to make room"
    );
    assert_eq!(woken(&waiting), 0);
    q.push_one(env(1), false).unwrap();
    assert_eq!(
        woken(&waiting),
        1,
        "the receiver that waits is woken by a push"
    );
    drop(its_ticket);
}
