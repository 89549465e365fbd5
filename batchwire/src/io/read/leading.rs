//! Leading: a thread waiting for a message or a reply reads the connection itself while the
//! reader thread steps aside (plain TCP only).

use super::*;

impl Reader<'_> {
    /// Whether callers may lead this connection: plain TCP (a TLS link's reads go through
    /// rustls, whose state its reader thread keeps to itself).
    pub(super) fn leadable(&self) -> bool {
        #[cfg(unix)]
        return self.conn.link.plain_fd().is_some();
        #[cfg(not(unix))]
        return false;
    }

    /// Wait until the socket has something to read (or has ended, or failed), or `wake`
    /// is readable, at most `limit` if given. Only for a leadable link. Returns whether
    /// `wake` is readable.
    pub(super) fn wait_readable(
        &self,
        limit: Option<Duration>,
        wake: Option<i32>,
    ) -> std::io::Result<bool> {
        #[cfg(unix)]
        if let Some(fd) = self.conn.link.plain_fd() {
            let ms = limit.map_or(-1, |d| d.as_micros().div_ceil(1000).min(60_000) as i32);
            // The socket is the link's, open while `self.conn` is borrowed, and `wake` is
            // open while its owner waits here.
            return match crate::sys::poll_readable([fd, wake.unwrap_or(-1)], ms) {
                Ok([_, woken]) => Ok(wake.is_some() && woken),
                Err(e) if e.kind() == ErrorKind::Interrupted => Ok(false),
                Err(e) => Err(e),
            };
        }
        let _ = (limit, wake);
        Ok(false)
    }

    /// **Leading**: an application thread that waits for something that will most likely
    /// come on this connection reads the connection itself while it waits, if no one holds
    /// the read turn, instead of being woken by the reader thread once that has read it: a
    /// caller waiting for its reply (`Runtime::request`), or a receiver waiting for a
    /// message in its mailbox (`MailboxQueue::lead`; `wake`, a file descriptor that a push
    /// to the mailbox makes readable, wakes it for messages that come another way). On a
    /// machine with idle CPUs each hand-off costs a wake-up of a sleeping CPU, about half
    /// a loopback round trip, and an rpc call had two of them.
    ///
    /// The thread acts on everything it reads exactly as the reader thread would (every
    /// frame, for every mailbox and every waiting caller), never waits for a consumer
    /// (delivery does not), and keeps the turn until `done()`, `until`, or the connection
    /// ends. A caller waits for the socket at most [`LEAD_RECHECK`] at a time, so that a
    /// call ended some other way (the peer declared down, shutdown) is seen soon; a
    /// receiver is woken for all that through `wake`. The reader thread meanwhile looks at
    /// the socket a few times ([`LOOKS`]), then waits for the turn, and takes back what
    /// the thread leaves: how the connection ended, if it did (the thread shuts the
    /// socket's read side so the reader thread wakes to report it), and any part of a
    /// frame read.
    ///
    /// Returns whether it held the turn and waited with it: false, at once, if the turn
    /// was taken, the connection ended or is not plain TCP (a TLS link's reads go through
    /// rustls, which its reader keeps).
    pub fn lead(
        &self,
        done: &dyn Fn() -> bool,
        until: Instant,
        wake: Option<&Arc<OwnedFd>>,
    ) -> bool {
        if !self.leadable() {
            return false;
        }
        // Even if the turn is taken: the reader thread then leaves it free next time.
        self.conn.lead_tries.fetch_add(1, Relaxed);
        let Some(mut turn) = self.conn.try_read_turn() else {
            return false;
        };
        let Some(side) = turn.as_mut() else {
            return false;
        };
        if side.ended.is_some() || self.conn.is_closed() {
            // Nothing to lead: a receiver parks instead (the next connection's reader
            // wakes it), and the reader thread must not stand aside for it: it alone
            // tears the connection down.
            self.conn.led_drained.store(false, Relaxed);
            return false;
        }
        // A receiver leading can be asked for the turn (see `Runtime::request`).
        struct Leading<'a>(&'a Conn, bool);
        impl Drop for Leading<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.set_lead_wake(None);
                }
            }
        }
        let _leading = Leading(self.conn, wake.is_some());
        // Control this thread makes due while it leads (acknowledgements, mostly) is
        // written by it when it stops reading, not by the writer woken for each.
        let control = DeferControl::new(self.peer);
        if wake.is_some() {
            self.conn.set_lead_wake(wake.cloned());
        }
        let wake_fd = wake.map(|w| std::os::fd::AsRawFd::as_raw_fd(&**w));
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut recheck = LEAD_RECHECK;
        let end = loop {
            if side.ended.is_some() || self.conn.is_closed() {
                // It ended while this thread led: the reader thread takes it from here.
                self.conn.led_drained.store(false, Relaxed);
                return false;
            }
            match self.act(side, &mut cache) {
                Ok(false) => {}
                Ok(true) => break Ok(()),
                Err(e) => break Err(e),
            }
            let now = Instant::now();
            if done() || now >= until {
                return true;
            }
            // What the frames just acted on made due goes now: a leader reading on for
            // someone else's mailbox holds no acknowledgement back.
            control.flush();
            // Counted as led only if it returned bytes (`read_once` also says true for an
            // interrupted read and a look that found nothing): led reads are a share of
            // `reads`, which the holder of the turn counts.
            let reads = self.peer.stats.reads.load(Relaxed);
            match self.read_once(side, false) {
                Ok(true) => {
                    if self.peer.stats.reads.load(Relaxed) != reads {
                        self.peer.stats.reads_led.fetch_add(1, Relaxed);
                    }
                    self.conn.led_drained.store(side.drained, Relaxed);
                }
                Ok(false) => {
                    // The socket is empty now: acknowledge if a sender may be waiting for
                    // it, as the reader thread does before it waits.
                    side.drained = true;
                    self.conn.led_drained.store(true, Relaxed);
                    self.say_idle(side);
                    // A receiver is woken through `wake` for everything else it waits for
                    // (a push, its mailbox closing, a call asking for the turn): it sleeps
                    // until `until`, using no CPU while idle. A caller looks again after
                    // LEAD_RECHECK, then twice as long each time, up to LEAD_RECHECK_MAX.
                    let limit = match wake {
                        Some(_) => until - now,
                        None => (until - now).min(recheck),
                    };
                    recheck = (recheck * 2).min(LEAD_RECHECK_MAX);
                    control.flush();
                    match self.wait_readable(Some(limit), wake_fd) {
                        // Empty the eventfd before `done()` is asked again: left readable,
                        // every poll would return at once (a push another receiver of the
                        // mailbox took, a late request for the turn). Whoever signals
                        // changed what `done()` reads first, so nothing is missed.
                        Ok(true) => {
                            if let Some(w) = wake {
                                crate::io::mailbox::drain(w);
                            }
                        }
                        Ok(false) => {}
                        Err(e) => break Err(e.into()),
                    }
                }
                Err(e) => break Err(e),
            }
        };
        side.ended = Some(end);
        self.conn.led_drained.store(false, Relaxed);
        let _ = self.conn.link.shutdown(std::net::Shutdown::Read);
        true
    }

    /// Take a SYNC snapshot between two deliveries.
    pub(super) fn snapshot(&self) {
        let _turn = self.peer.delivery_turn();
        self.take_snapshot();
    }

    /// After a delivery (with the turn): a snapshot if the accounts asked for one.
    pub(super) fn snapshot_if_asked(&self) {
        if self.peer.flow.wants_sync() {
            self.take_snapshot();
        }
    }

    /// The snapshot (see `Peer::snapshot_credit`).
    pub(super) fn take_snapshot(&self) {
        self.peer.snapshot_credit();
    }
}

/// While a thread leads `peer`'s connection: control its session turns make due waits for
/// `flush` (before the thread waits for the socket) or the end of the lead, where the
/// thread writes it itself if no one is writing (`write_control_through`).
pub(super) struct DeferControl<'a> {
    peer: &'a Peer,
    outer: Option<(*const Peer, bool)>,
}

impl<'a> DeferControl<'a> {
    pub(super) fn new(peer: &'a Peer) -> Self {
        DeferControl {
            peer,
            outer: crate::io::peer::control::begin(peer),
        }
    }

    fn flush(&self) {
        use crate::io::peer::control;
        if control::take() {
            control::without(|| crate::io::write::write_control_through(self.peer));
        }
    }
}

impl Drop for DeferControl<'_> {
    fn drop(&mut self) {
        self.flush();
        crate::io::peer::control::end(self.outer);
    }
}
