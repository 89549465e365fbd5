//! Taking messages out of a mailbox: a run at a time, waiting (or leading) for them, or
//! polled from async code.

use super::*;

impl MailboxQueue {
    /// Move up to `max` messages from the queue to `out`, giving the requests among them
    /// their way back; returns how many. Their credit goes back to their senders.
    pub(super) fn drain<S: Sink>(g: &mut Inner, out: &mut S, max: usize) -> usize {
        // A request gets its way back; the envelope is built where it goes, not moved.
        let with_replier = |e: &mut Envelope, r: &Option<Weak<dyn Outbound>>| {
            if let Some(c) = &mut e.call {
                c.replier = r.clone();
            }
        };
        let mut n = 0;
        let mut freed = 0;
        while n < max {
            let Some(front) = g.q.front_mut() else { break };
            match front {
                Item::One(..) => {
                    if let Some(Item::One(mut e, held)) = g.q.pop_front() {
                        freed += e.payload.len() + e.from.mailbox.len() + PER_MESSAGE;
                        with_replier(&mut e, &g.replier);
                        out.put(e);
                        drop(held);
                        n += 1;
                    }
                }
                Item::Run {
                    from,
                    data,
                    left,
                    held,
                } => {
                    let (mut taken, mut k) = (0, 0);
                    while n < max && *left > 0 {
                        let Some((mailbox, payload, used)) = frame::next_message(data) else {
                            *left = 0;
                            break;
                        };
                        out.put(Envelope::with_replier(
                            Address::from_names(from.clone(), mailbox),
                            payload,
                            &g.replier,
                        ));
                        taken += used;
                        k += 1;
                        *left -= 1;
                        n += 1;
                    }
                    freed += taken + PER_MESSAGE * k;
                    if *left == 0 {
                        // Whatever the run's cost was beyond what was counted (nothing, for
                        // a well-formed run) is released with it, and so is its credit.
                        freed += data.len();
                        g.q.pop_front();
                    } else {
                        held.release(taken as u64);
                    }
                }
            }
        }
        g.bytes = g.bytes.saturating_sub(freed);
        if g.q.is_empty() {
            g.bytes = 0;
        }
        g.yield_next = idle::small_take(n as u64, freed);
        n
    }

    /// Take up to `max` messages into `out`, waiting until `deadline` (None: forever) for
    /// the first one. Returns how many were taken.
    pub fn take<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        deadline: Option<Option<Instant>>,
    ) -> Result<usize, RecvError> {
        let wait = match deadline {
            None => TakeWait::No,
            Some(None) => TakeWait::Forever,
            Some(Some(t)) => TakeWait::Until(t),
        };
        self.take_waiting(out, max, wait)
    }

    /// [`MailboxQueue::take`] waiting at most `timeout` for the first message; the clock is
    /// read only if it has to wait (a receiver taking one message per call from a full
    /// mailbox would otherwise read the clock once per message, for nothing).
    pub fn take_within<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        self.take_waiting(out, max, TakeWait::For(timeout))
    }

    pub(super) fn take_waiting<S: Sink>(
        &self,
        out: &mut S,
        max: usize,
        mut wait: TakeWait,
    ) -> Result<usize, RecvError> {
        let mut g = self.lock();
        let mut idler = self.idle.idler_after(g.yield_next);
        // Cleared once this wait handed a message on to another receiver (see `lead`).
        let mut may_lead = true;
        loop {
            if !g.q.is_empty() {
                let n = Self::drain(&mut g, out, max);
                note_backlog(n > 1 || !g.q.is_empty());
                self.room_freed(&mut g);
                return Ok(n);
            }
            if g.closed {
                return Err(RecvError::Closed);
            }
            let now = Instant::now();
            if let TakeWait::For(d) = wait {
                wait = TakeWait::Until(
                    now.checked_add(d)
                        .unwrap_or_else(|| crate::io::deadline_after(d)),
                );
            }
            let left = match wait {
                TakeWait::No => return Err(RecvError::Empty),
                TakeWait::Forever | TakeWait::For(_) => None,
                TakeWait::Until(t) if now >= t => return Err(RecvError::Timeout),
                TakeWait::Until(t) => Some(t - now),
            };
            let step = idler.step();
            match step {
                IdleStep::Spin | IdleStep::Yield => {
                    drop(g);
                    crate::io::pause(step);
                    g = self.lock();
                }
                IdleStep::Park => {
                    // Read a connection meanwhile, if it can, then look again; so too if
                    // it could not but something came while it tried (a push saw it
                    // leading, so signalled it rather than waking a sleeper).
                    if may_lead {
                        let (led, handed);
                        (g, led, handed) = self.lead(g, left);
                        may_lead = !handed;
                        if led || !g.q.is_empty() || g.closed {
                            continue;
                        }
                    }
                    let ticket = g.receivers.park();
                    g = match left {
                        None => self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(d) => {
                            self.not_empty
                                .wait_timeout(g, d)
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                    };
                    g.receivers.woke(ticket);
                }
            }
        }
    }

    /// Take up to `max` messages into `out` if any is queued (returns how many); otherwise
    /// leave `cx`'s waker for the next push.
    pub fn poll_batch<S: Sink>(
        &self,
        cx: &mut Context<'_>,
        out: &mut S,
        max: usize,
        ticket: &mut Ticket,
    ) -> Poll<Result<usize, RecvError>> {
        let mut g = self.lock();
        if !g.q.is_empty() {
            let n = Self::drain(&mut g, out, max.max(1));
            note_backlog(n > 1 || !g.q.is_empty());
            self.room_freed(&mut g);
            return Poll::Ready(Ok(n));
        }
        if g.closed {
            return Poll::Ready(Err(RecvError::Closed));
        }
        g.wakers.register(cx.waker(), ticket);
        Poll::Pending
    }

    /// Wake `w` when a local push may find room.
    pub fn register_room(&self, w: &Waker, ticket: &mut Ticket) {
        let mut g = self.lock();
        if g.bytes < self.capacity || g.closed {
            w.wake_by_ref();
        } else {
            g.room.register(w, ticket);
        }
    }

    /// Room was freed: wake the local pushers waiting for it, threads and tasks.
    pub(super) fn room_freed(&self, g: &mut Inner) {
        g.pushers.notify(&self.not_full);
        g.room.wake_all();
    }

    /// The wakers kept: of tasks waiting for a message, and for room.
    #[cfg(test)]
    pub fn wakers_kept(&self) -> (usize, usize) {
        let g = self.lock();
        (g.wakers.len(), g.room.len())
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock()
            .q
            .iter()
            .map(|i| match i {
                Item::One(..) => 1,
                Item::Run { left, .. } => *left as usize,
            })
            .sum()
    }
}
