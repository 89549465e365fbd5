//! The consumer's side of a lane: pokes, the epoch, closing, handing back, pieces, the next
//! batch.

use super::*;

impl Lane {
    /// The peer was declared down (`true`) or is back up: while down, sends (and senders
    /// waiting for room or credit) are refused.
    pub fn set_down(&self, down: bool) {
        let mut g = self.lock();
        g.down = down;
        g.senders.notify_all(&self.not_full);
        g.room.wake_all();
    }

    /// Make the consumer look up: `next_batch` returns `Wake`, `wait_epoch` returns.
    pub fn poke(&self) {
        self.nudge();
        if let Some(f) = self.on_poke.get() {
            f();
        }
    }

    /// A writer starts (`false`) or ended (`true`): see `Inner::writer_absent`.
    pub fn set_writer_absent(&self, absent: bool) {
        self.lock().writer_absent = absent;
    }

    /// A poke without the hook (the caller starts the writer itself, outside a session
    /// turn: `Peer::install`).
    pub fn nudge(&self) {
        let mut g = self.lock();
        self.bump(&mut g);
        self.not_empty.notify_all();
    }

    /// The current epoch (no lock: the writer reads it once per round).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Wait until the epoch moves past `epoch` (a poke) or `d` passes. Returns whether it
    /// moved.
    pub fn wait_epoch(&self, epoch: u64, d: Duration) -> bool {
        let g = self.lock();
        let (g, _) = self
            .not_empty
            .wait_timeout_while(g, d, |g| g.epoch == epoch)
            .unwrap_or_else(|p| p.into_inner());
        g.epoch != epoch
    }

    /// Refuse new messages; the writer drains what is queued, then sees `Drained`.
    pub fn close(&self) {
        let g = self.lock();
        self.close_locked(g);
    }

    /// Close it only if nothing is queued and nothing taken out of it is on its way into
    /// the send window (a sender's write-through batch, or the writer's batch or piece):
    /// then nothing more can ever come out of it. Returns whether it closed. (The peer's
    /// removal, under its session lock, so nothing is held in the window meanwhile.)
    pub fn close_if_at_rest(&self) -> bool {
        let mut g = self.lock();
        // `moves` is odd from a take (the writer's, or a sender's write-through) until
        // what was taken is held.
        let at_rest = g.outbox.is_empty()
            && g.bulk.is_empty()
            && self.moves.load(Ordering::Acquire).is_multiple_of(2);
        if at_rest {
            // Nothing more comes through it: its buffers go.
            g.outbox.release_buffers();
            g.direct = Batch::default();
            self.close_locked(g);
        }
        at_rest
    }

    fn close_locked(&self, mut g: MutexGuard<'_, Inner>) {
        g.closed = true;
        // A consumer waiting for a poke (`wait_epoch`) must look up too.
        self.bump(&mut g);
        self.not_empty.notify_all();
        g.senders.notify_all(&self.not_full);
        g.room.wake_all();
    }

    /// Take everything queued, to report it failed (it cannot be sent). Returns the
    /// messages and whether a message in pieces was among them (the session must tell the
    /// peer to drop what it has of it). A message whose last piece is on its way into the
    /// window is left to the writer, which reports it if it does not get there.
    pub fn take_failed(&self) -> (Vec<Message>, bool) {
        let mut g = self.lock();
        let mut batch = Batch::default();
        g.outbox.take(usize::MAX, usize::MAX, &mut batch, None);
        g.taken = g.pushed;
        let (bulk, in_pieces) = g.bulk.take_failed();
        g.senders.notify_all(&self.not_full);
        g.room.wake_all();
        drop(g);
        let mut msgs = batch.decode_messages();
        msgs.extend(bulk);
        (msgs, in_pieces)
    }

    /// Messages waiting (ordinary and bulk).
    pub fn queued(&self) -> usize {
        let g = self.lock();
        g.outbox.messages() + g.bulk.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        let g = self.lock();
        g.outbox.is_empty() && g.bulk.is_empty()
    }

    /// Whether nothing is queued and no sender is moving a batch into the window itself.
    pub fn is_at_rest(&self) -> bool {
        let g = self.lock();
        g.outbox.is_empty() && g.bulk.is_empty() && !g.direct_busy
    }

    /// Whether the lane is closed and empty: nothing more can come out of it.
    pub fn is_drained(&self) -> bool {
        let g = self.lock();
        g.closed && g.outbox.is_empty() && g.bulk.is_empty() && !g.direct_busy
    }

    /// Whether the bulk queue has a piece to offer now.
    pub fn bulk_ready(&self) -> bool {
        let g = self.lock();
        g.bulk.ready(g.taken)
    }

    /// The next piece to number (see `batchwire_core::bulk`): offered once, until
    /// `advance_piece`, `restart_piece` or `unreserve_piece`.
    pub fn next_piece(&self) -> Option<Piece> {
        let mut g = self.lock();
        let taken = g.taken;
        let p = g.bulk.peek(self.piece_bytes, taken);
        if p.is_some() {
            self.begin_move();
        }
        p
    }

    /// The writer took something to move into the window (under the lock).
    pub(super) fn begin_move(&self) {
        if self.charges_credit {
            self.moves.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The writer is done moving what it took (`next_batch`'s batch is held, or the piece
    /// from `next_piece` advanced, restarted or unreserved).
    pub fn end_move(&self) {
        if self.charges_credit {
            self.moves.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// See [`Lane::end_move`]: even when nothing is on its way into the window.
    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::Acquire)
    }

    /// The piece of item `serial` was numbered as part of message `id`. Returns whether it
    /// was the message's last.
    pub fn advance_piece(&self, serial: u64, id: u64) -> bool {
        let mut g = self.lock();
        let last = g.bulk.advance(serial, id);
        if last {
            self.room_freed(&mut g);
        }
        last
    }

    /// The peer restarted: item `serial` goes again from its first piece.
    pub fn restart_piece(&self, serial: u64) {
        self.lock().bulk.restart(serial);
    }

    /// The piece was not numbered. Returns false if its message is no longer queued (it
    /// was taken to be reported failed meanwhile, and the caller reports it).
    pub fn unreserve_piece(&self, serial: u64) -> bool {
        self.lock().bulk.unreserve(serial)
    }

    /// Wait (per the idle strategy) until the bundler says to flush, then move the frames
    /// to write into `batch`. Returns `Wake` as soon as the epoch moves past `epoch`, or if
    /// a piece is ready and `bulk_room` says it may go. While a piece is ready, a batch
    /// takes at most `ORDINARY_WEIGHT` pieces' worth of ordinary bytes (see
    /// `batchwire_core::bulk`). With `linger`, a writer parked with nothing to wait for
    /// returns `Idle` once that long went by with no message and no poke.
    pub fn next_batch(
        &self,
        bundler: &mut dyn Bundler,
        epoch: u64,
        batch: &mut Batch,
        bulk_room: bool,
        linger: Option<Duration>,
    ) -> Next {
        let mut g = self.lock();
        let mut idler = self.idle.idler_after(g.yield_next);
        loop {
            if g.epoch != epoch {
                return Next::Wake;
            }
            let bulk_ready = g.bulk.ready(g.taken);
            let now = Instant::now();
            // A sender is moving a batch into the window itself: nothing is taken (a later
            // batch must not overtake it) until it is done (`finish_direct` wakes this).
            let decision = if g.direct_busy {
                Decision::Wait { until: None }
            } else {
                bundler.poll(g.outbox.level(), now)
            };
            match decision {
                Decision::Flush {
                    max_messages,
                    max_bytes,
                    reason,
                } => {
                    let max_bytes = if bulk_ready {
                        max_bytes.min(ORDINARY_WEIGHT * self.piece_bytes)
                    } else {
                        max_bytes
                    };
                    let keep_time = self.track_time.then_some(now);
                    g.outbox.take(max_messages, max_bytes, batch, keep_time);
                    let n = batch.messages();
                    g.taken += n;
                    // Not after a lone message: with no company the writer parks at once,
                    // so the next lone one can be written through by its sender.
                    g.yield_next = n > 1 && idle::small_take(n, batch.wire_len());
                    // Two single-message takes in a row, with nothing left behind (`none`
                    // takes one at a time), before senders write through again; any
                    // company stops them.
                    let single = n == 1 && g.outbox.is_empty();
                    g.through_ok = single && g.single_take;
                    g.single_take = single;
                    g.probe = 0;
                    self.begin_move();
                    self.room_freed(&mut g);
                    return Next::Batch(reason);
                }
                Decision::Wait { until } => {
                    if bulk_ready && bulk_room {
                        return Next::Wake;
                    }
                    if g.closed && g.outbox.is_empty() && g.bulk.is_empty() {
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
                            g = match (until, linger) {
                                (None, None) => {
                                    self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner())
                                }
                                (None, Some(d)) => {
                                    let (g, r) = self
                                        .not_empty
                                        .wait_timeout(g, d)
                                        .unwrap_or_else(|p| p.into_inner());
                                    let mut g = g;
                                    if r.timed_out()
                                        && g.epoch == epoch
                                        && g.outbox.is_empty()
                                        && g.bulk.is_empty()
                                        && !g.direct_busy
                                    {
                                        g.writer_waiting = false;
                                        return Next::Idle;
                                    }
                                    g
                                }
                                (Some(t), _) => {
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
