//! Requests: the pending-call table, and a caller that reads its reply's connection itself
//! (leading).

use super::*;

impl Runtime {
    /// The requests in flight.
    pub fn calls(&self) -> &Calls {
        &self.ctx.calls
    }

    /// Start the requests' timer thread if it is not running (async requests need it to
    /// time out; blocking ones time out by themselves).
    pub fn ensure_call_timer(&self) -> Result<(), Error> {
        // A plain load on every request after the first: no write to a shared line.
        if self.call_timer.load(Ordering::Acquire) || self.call_timer.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let calls = self.ctx.calls.clone();
        self.threads
            .spawn(format!("bw-calls-{}", self.name), move || run_timer(&calls))
            .map_err(|e| {
                self.call_timer.store(false, Ordering::Release);
                Error::Io(e)
            })
    }

    /// A slot for a request to `to`, and the sender field that carries its id.
    pub fn begin_request(
        &self,
        to: &Address,
        deadline: Instant,
        waiter: Waiter,
    ) -> Result<(u64, Name), Error> {
        let id = self.ctx.calls.begin(to, deadline, waiter)?;
        // The anonymous caller "": always short enough.
        let from = call::request_sender(id, "").unwrap_or_else(|| Name::from_static(""));
        Ok((id, from))
    }

    /// Send a request and wait (this thread) for its reply until `timeout`.
    pub fn request(
        &self,
        to: &Address,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Envelope, Error> {
        let deadline = crate::io::deadline_after(timeout);
        let (id, from) =
            self.begin_request(to, deadline, Waiter::Thread(std::thread::current()))?;
        self.ask_for_turn(&to.node);
        if let Err(e) = self.send(&from, to, payload, Class::Ordinary, true) {
            self.ctx.calls.forget(id);
            return Err(e);
        }
        self.lead_for_reply(to, id, deadline);
        self.ctx.calls.wait(id, deadline)
    }

    /// Read the connection the reply will come on while waiting for it, if no one else
    /// is reading it (see `Reader::lead`): the reply is then in this thread's hands when
    /// it arrives, with no wake-up by the reader thread in between. Only the node's one
    /// call in flight leads: with several, one caller would read for all the others (and
    /// keep the turn until its own reply, even while preempted), so their replies would
    /// wait on it; the reader thread serves them better.
    pub(super) fn lead_for_reply(&self, to: &Address, id: u64, deadline: Instant) {
        let calls = &self.ctx.calls;
        if calls.pending() == 1 {
            self.lead_on(&to.node, &|| calls.is_answered(id), deadline, None);
        }
    }

    /// Before a call: a receiver reading the connection its reply will come on (leading
    /// while it waits for a mailbox) is asked to let go, so that the caller can read its
    /// reply itself. Receivers do not lead while calls wait (see `lead_for`).
    pub(super) fn ask_for_turn(&self, node: &Name) {
        let wake = self
            .peers
            .with(node.as_bytes(), |p| p.and_then(|p| p.current()))
            .and_then(|c| c.lead_wake());
        if let Some(w) = wake {
            crate::io::mailbox::signal(&w);
        }
    }

    /// Lead the current connection to node `node` (see `Reader::lead`).
    pub(super) fn lead_on(
        &self,
        node: &Name,
        done: &dyn Fn() -> bool,
        until: Instant,
        wake: Option<&Arc<std::os::fd::OwnedFd>>,
    ) -> bool {
        let Some(peer) = self.peers.with(node.as_bytes(), |p| p.cloned()) else {
            return false;
        };
        let Some(conn) = peer.current() else {
            return false;
        };
        Reader {
            peer: &peer,
            conn: &conn,
            mailboxes: &self.mailboxes,
            events: &self.events,
            shared: self.shared_lane.as_deref(),
            max_frame: self.config.max_frame(),
            max_payload: self.config.max_payload as u64,
            read_bytes: self.config.read_bytes,
            linger: None,
        }
        .lead(done, until, wake)
    }
}
