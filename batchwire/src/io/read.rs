//! A connection's reader: frames off the socket into the session and the mailboxes.
//!
//! Messages are delivered a run at a time (consecutive messages for one mailbox: one lock,
//! at most one wake-up), and **never wait for a consumer**: each is charged to its
//! mailbox's credit for this peer (see `batchwire_core::credit`), which the sender
//! respected, so it fits. A peer that sends past its credit broke the protocol. Pieces of
//! large messages are reassembled (each charged as it arrives) and delivered whole. On
//! plain TCP a piece whose fields have arrived but not yet (at least [`IN_PLACE_MIN`]
//! bytes of) its data is read **in place**: the rest of its data goes from the socket
//! straight into its message's reassembly buffer (`Reassembly::direct_room`), not through
//! the receive buffer, so a large message is not copied on the way in (only what arrived
//! with a piece's fields is).
//!
//! The reader also applies what the peer says about credit toward *its* mailboxes: CREDIT
//! grants and SYNC recounts go to this peer's lane, where senders wait for them. And it
//! takes this side's SYNC snapshots: when the connection starts (so the first thing the
//! writer sends is where credit stands) and whenever the accounts ask for one, always
//! between two frames with the delivery turn, so that the snapshot covers exactly the
//! messages below its sequence number. What was delivered is committed to the session;
//! the rest comes again on the next connection and is delivered then, exactly once.
//!
//! On plain TCP the reader thread is not the only one that reads: what it reads into and
//! how far it got sit behind the connection's read turn (`Conn::read_turn`), and an
//! application thread waiting for a reply or a message may take the turn and read the
//! connection itself ("leading", [`Reader::lead`]); everything above holds for whichever
//! thread has the turn. While threads try to lead, the reader thread stands aside (it
//! sleeps a millisecond at a time without the turn) or waits for the socket without it
//! (otherwise in `recv(2)` with it, see `read_until_end`), and it alone tears the
//! connection down, whoever found that it ended.
//!
//! On Unix (plain TCP or TLS) the reader thread also **rests** once nothing moved either way for a while
//! (see [`Stopped::Rested`]): the connection then costs no thread while it is idle.
//!
//! This file holds the reader's loop; `read/` its parts: `in_place.rs` (one read, and
//! pieces read in place), `leading.rs`, `resting.rs` and `frames.rs` (what each frame
//! does).

mod frames;
mod in_place;
mod leading;
mod resting;

use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::call;
use batchwire_core::codec::{Name, NameMap};
use batchwire_core::frame::{self, Fragment, FragmentHead, Frame, MessageList, Sync};
use batchwire_core::handshake::HandshakeError;
use batchwire_core::reassembly::{Added, ReassemblyError};
use bytes::{Bytes, BytesMut};

use crate::address::Address;
use crate::error::Error;
use crate::event::Event;
use crate::io::conn::{Conn, InPlace, LinkError, ReadSide, RecvRing};
use crate::io::envelope::Envelope;
use crate::io::events::Events;
use crate::io::flow::Held;
use crate::io::lane::Lane;
use crate::io::mailbox::{MailboxQueue, Mailboxes};
use crate::io::peer::Peer;

/// How long a caller that leads waits for its socket before it looks whether its call
/// ended some other way (see [`Reader::lead`]); then twice as long each time, up to
/// `LEAD_RECHECK_MAX`.
const LEAD_RECHECK: Duration = Duration::from_millis(5);
const LEAD_RECHECK_MAX: Duration = Duration::from_millis(80);

/// Reads by the reader thread with no one trying to lead, after which it waits for the
/// socket in `recv(2)`, with the turn (see `read_until_end`).
const QUIET_READS: u32 = 64;

/// How often in a row the reader thread finds a caller leading before it queues for the
/// read turn (see `read_until_end`).
const LOOKS: u32 = 4;

/// How long the reader thread stands aside, without the read turn, once a thread tried to
/// lead (see `read_until_end`); it looks again after each such pause.
const ASIDE: Duration = Duration::from_millis(1);

/// A piece with at least this many bytes of data still to come is read in place (below
/// it, the copy costs less than the extra read).
const IN_PLACE_MIN: usize = 8 << 10;

/// A read into the receive buffer that ends a piece asks for this much more: the next
/// frame's fields (most likely the next piece's), not its data, so that the data can go
/// in place. (Reads of `read_bytes` end anywhere in a piece, so the next piece's fields
/// came with most of its data and it could not.)
const HEAD_READ: usize = 512;

/// What a reader uses.
pub(crate) struct Reader<'a> {
    pub peer: &'a Peer,
    pub conn: &'a Conn,
    pub mailboxes: &'a Mailboxes,
    pub events: &'a Events,
    /// With transfer-queue: the shared lane (part of a SYNC recount).
    pub shared: Option<&'a Lane>,
    pub max_frame: usize,
    pub max_payload: u64,
    pub read_bytes: usize,
    /// The reader thread may rest after this long with no message either way and no one
    /// leading (`None`: never). See [`Stopped::Rested`].
    pub linger: Option<Duration>,
}

/// How [`Reader::read_on`] stopped.
pub(crate) enum Stopped {
    /// The connection ended: `Ok` on GOODBYE, else why. The read side is gone.
    Ended(Result<(), LinkError>),
    /// **Resting**: no message came or went and no thread tried to lead for `linger`, and
    /// the socket is empty. The read side stays on the connection (behind its read turn)
    /// for whoever reads next: a leader, the node's thread for resting connections
    /// (`io::resting`, which reads what comes without a thread of its own while it is only
    /// heartbeats, see [`Reader::serve_rested`]), or a reader thread started again.
    Rested,
}

impl Reader<'_> {
    /// Bytes one read asks for (`read_bytes`, less over TLS: `Link::read_size`).
    fn read_size(&self) -> usize {
        self.conn.link.read_size(self.read_bytes)
    }

    /// Read frames and act on them until the peer says goodbye (`Ok`) or something breaks
    /// (with `linger`, the thread may rest on the way: see [`Reader::read_on`]).
    #[cfg(test)]
    pub fn run(&self, buf: BytesMut) -> Result<(), LinkError> {
        self.start(buf);
        loop {
            if let Stopped::Ended(r) = self.read_on() {
                return r;
            }
        }
    }

    /// A new connection: say where credit stands, and set up its read side.
    pub fn start(&self, buf: BytesMut) {
        // Where credit stands, as of what was delivered before this connection: the first
        // thing this side says on it (after RESUME).
        self.snapshot();
        *self.conn.read_turn() = Some(ReadSide {
            ring: RecvRing::new(buf, self.read_size()),
            // Nothing read yet: the first read looks without waiting (see below).
            drained: true,
            idle_said: true,
            ended: None,
            piece: None,
            next_read: None,
            look: false,
        });
    }

    /// Read frames and act on them (after [`Reader::start`], on any thread) until the
    /// connection ends or the thread may rest.
    pub fn read_on(&self) -> Stopped {
        let r = self.read_until_end();
        if matches!(r, Stopped::Ended(_)) {
            // No caller leads a connection whose reader stopped.
            *self.conn.read_turn() = None;
        }
        r
    }

    /// The reader thread's loop: with the read turn, act on what was read and read more.
    /// If a thread tried to lead within its last [`QUIET_READS`] reads
    /// (`Conn::lead_tries`), and the last read took all there was, it looks without
    /// waiting and, if nothing is there, waits for the socket **without the turn**, so that
    /// a thread waiting for a reply or a message may take it meanwhile (see
    /// [`Reader::lead`]). Otherwise (a stream, or no one leads, or TLS) it waits in
    /// `recv(2)` with the turn: one system call per wait rather than three, which would
    /// slow a stream down. A thread that then tries to lead finds the turn taken (its wait
    /// goes as before, with a hand-off), and the reader thread leaves the turn free from
    /// its next read on. A thread that leads returns the turn once it has what it waited
    /// for, and leaves in `ended` how the connection ended if it found out.
    ///
    /// **Standing aside**: whenever a thread tried to lead since the last look and the
    /// last read a leader made took all there was (`Conn::led_drained`: the receiver keeps
    /// up with what comes), this thread sleeps [`ASIDE`] without the turn and looks again;
    /// it reads again once a whole pause went by with no try, or once the connection is
    /// closed or a leader found it over (which clears `led_drained`). A try that failed
    /// because this thread had the turn counts too: it is how a receiver gets the turn
    /// in the middle of a stream (at the price of a pause of at most [`ASIDE`] if it then
    /// waits without leading). So while a receiver keeps coming back for more (a stream),
    /// it reads the connection alone and what it reads is in its hands at once; when it
    /// stops (it works on something else, or waits on another mailbox) this thread reads
    /// within about a millisecond, so acknowledgements, credit and other mailboxes'
    /// messages never wait on it for longer. A receiver that is behind (its read filled
    /// all it asked for) gets no such pause: this thread reads beside it, on another CPU
    /// if there is one.
    fn read_until_end(&self) -> Stopped {
        let mut cache: Option<Arc<MailboxQueue>> = None;
        let mut missed = 0;
        // Activity seen, and since when it has not moved (see `rest_due`).
        let mut activity = (self.activity(), Instant::now());
        // Lead tries seen, and reads since they last moved.
        let (mut seen, mut quiet) = (0u32, 0u32);
        let mut aside_seen = self.conn.lead_tries.load(Relaxed);
        loop {
            // Stand aside while threads lead and keep up: a receiver working through a
            // stream reads each time its mailbox runs dry, as a one-thread event loop
            // would. Reading it here too would hand every read over to it with a wake-up
            // (and on two CPUs the four busy threads of a stream preempt each other).
            if self.leadable() && !self.conn.is_closed() {
                let t = self.conn.lead_tries.load(Relaxed);
                if t != aside_seen {
                    aside_seen = t;
                    if self.conn.led_drained.load(Relaxed) {
                        std::thread::sleep(ASIDE);
                        continue;
                    }
                }
            }
            let mut turn = match self.conn.try_read_turn() {
                Some(t) => t,
                // A thread leads. Woken by the same bytes as it was, this thread looks
                // again instead of queueing for the turn: the leader reads them at once,
                // so the socket is soon empty and this thread sleeps in `poll` without
                // having to be woken when the leader is done (that wake-up preempted the
                // leader just as it had its reply). Past a few looks (the leader is busy
                // reading a stream), it queues for the turn.
                None if missed < LOOKS => {
                    missed += 1;
                    std::thread::yield_now();
                    if let Err(e) = self.wait_readable(None, None) {
                        return Stopped::Ended(Err(e.into()));
                    }
                    continue;
                }
                None => self.conn.read_turn(),
            };
            missed = 0;
            let Some(side) = turn.as_mut() else {
                return Stopped::Ended(Err(LinkError::Eof));
            };
            let step = (|| {
                if let Some(end) = side.ended.take() {
                    return Err(Stopped::Ended(end));
                }
                let end = |e| Stopped::Ended(Err(e));
                if self.act(side, &mut cache).map_err(end)? {
                    return Err(Stopped::Ended(Ok(())));
                }
                if self.rest_due(side, &mut activity) {
                    // Only if the socket is empty now.
                    return match self.read_once(side, false).map_err(end)? {
                        false => Err(Stopped::Rested),
                        true => Ok(true),
                    };
                }
                let tries = self.conn.lead_tries.load(Relaxed);
                if tries != seen {
                    (seen, quiet) = (tries, 0);
                }
                let wait =
                    (!side.drained || !self.leadable() || quiet >= QUIET_READS) && !side.look;
                self.read_once(side, wait).map_err(end)
            })();
            match step {
                Ok(true) => quiet = quiet.saturating_add(1),
                Ok(false) => {
                    drop(turn);
                    if let Err(e) = self.wait_readable(None, None) {
                        return Stopped::Ended(Err(e.into()));
                    }
                }
                // The read side stays for whoever reads next.
                Err(Stopped::Rested) => return Stopped::Rested,
                // The end, found here or by a leader: no one leads from now on (cleared
                // with the turn still held, so no thread slips in before `run` does).
                Err(end) => {
                    // A piece being read in place will not be committed on this
                    // connection: its bytes go now, not when the piece comes again.
                    let piece = turn.as_mut().and_then(|side| side.piece.take());
                    self.drop_in_place(piece.as_ref().map(|p| &p.head));
                    *turn = None;
                    return end;
                }
            }
        }
    }

    /// With the read turn: act on every whole frame read. Returns true on GOODBYE.
    fn act(
        &self,
        side: &mut ReadSide,
        cache: &mut Option<Arc<MailboxQueue>>,
    ) -> Result<bool, LinkError> {
        let buf = side.ring.buf();
        while let Some(frame) = frame::decode(buf, self.max_frame)? {
            self.peer.stats.frames_received.fetch_add(1, Relaxed);
            if self.handle(frame, cache)? {
                return Ok(true);
            }
        }
        if side.piece.is_none() {
            self.begin_in_place(side)?;
        }
        self.say_idle(side);
        Ok(false)
    }
}

/// What became of a run [`Reader::push_run`] was given.
enum Pushed {
    Queued,
    /// No mailbox of that name: its credit is still to be given back.
    NoMailbox,
    /// Its mailbox was dropped while the run was pushed, and none of that name is open
    /// now: its credit was given back (once) before this returned.
    Closed,
}

/// One read from a plain link's socket, without waiting (`WouldBlock` if nothing is
/// there): at most `first.1` bytes into `first.0`'s spare capacity, then at most `then.1`
/// into `then.0`'s (each has room for them). Returns how many in all; the first buffer
/// is filled first.
fn recv_pair(
    link: &crate::io::link::Link,
    first: (&mut Vec<u8>, usize),
    then: (&mut BytesMut, usize),
) -> std::io::Result<usize> {
    #[cfg(unix)]
    if let Some(fd) = link.plain_fd() {
        // The fd is the link's socket, open while `link` is borrowed.
        return crate::sys::recv_pair(fd, first, then);
    }
    let _ = (link, first, then);
    Err(ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests;
