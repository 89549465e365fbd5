//! The echo service of `batchwire node`: every message goes back to its sender, every
//! request gets its payload as the reply. One thread answers everyone, so it never waits
//! for one client: an answer that finds no room (the client withholds credit, or its
//! queue is full) waits in that client's backlog, retried in order, while others are
//! answered. A backlog holds at most [`BACKLOG_BYTES`]; past that, answers to that client
//! are dropped, counted and logged (at most a line per 10 s).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use batchwire::{Address, Envelope, Error, Mailbox};
use bytes::Bytes;

/// Most bytes of answers waiting for one client.
pub const BACKLOG_BYTES: usize = 16 << 20;

/// An answer waiting for room: the envelope it answers and the payload.
struct Waiting {
    e: Envelope,
    payload: Bytes,
}

/// What the echo owes each client (by address), oldest first.
#[derive(Default)]
pub struct Echo {
    backlog: HashMap<Address, (VecDeque<Waiting>, usize)>,
    /// Answers dropped because their client's backlog was full.
    pub dropped: u64,
    /// Answers that could not go at all (the client's node down, the node shutting down).
    pub failed: u64,
    last_log: Option<Instant>,
    last_fail_log: Option<Instant>,
}

impl Echo {
    /// Whether answers are waiting (the caller then polls more often).
    pub fn is_waiting(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Answers waiting for room, for every client.
    pub fn waiting(&self) -> usize {
        self.backlog.values().map(|(q, _)| q.len()).sum()
    }

    /// Answer `e`: at once if there is room and nothing older waits for its client,
    /// otherwise later.
    pub fn answer(&mut self, echo: &Mailbox, e: Envelope) {
        let payload = e.payload.clone();
        if let Some((q, bytes)) = self.backlog.get_mut(&e.from) {
            if *bytes + payload.len() > BACKLOG_BYTES {
                self.drop_one(&e.from);
                return;
            }
            *bytes += payload.len();
            q.push_back(Waiting { e, payload });
            return;
        }
        if let Some(payload) = self.try_answer(echo, &e, payload) {
            let to = e.from.clone();
            let len = payload.len();
            let mut q = VecDeque::new();
            q.push_back(Waiting { e, payload });
            self.backlog.insert(to, (q, len));
        }
    }

    /// Retry every backlog in order, until each is empty or finds no room.
    pub fn retry(&mut self, echo: &Mailbox) {
        let mut backlog = std::mem::take(&mut self.backlog);
        backlog.retain(|_, (q, bytes)| {
            while let Some(w) = q.pop_front() {
                let len = w.payload.len();
                match self.try_answer(echo, &w.e, w.payload) {
                    None => *bytes -= len,
                    Some(payload) => {
                        q.push_front(Waiting { e: w.e, payload });
                        return true;
                    }
                }
            }
            false
        });
        self.backlog = backlog;
    }

    fn drop_one(&mut self, to: &Address) {
        self.dropped += 1;
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(%to, dropped_so_far = self.dropped, backlog_bytes = BACKLOG_BYTES, "echo: a client takes no answers; answers past its backlog are dropped");
            self.last_log = Some(Instant::now());
        }
    }

    /// Send the answer to `e` without waiting: `None` if it went (or cannot go at all:
    /// counted, and logged at most once per 10 s), the payload back if there was no room.
    fn try_answer(&mut self, echo: &Mailbox, e: &Envelope, payload: Bytes) -> Option<Bytes> {
        let r = if e.is_request() {
            e.try_reply(payload)
        } else {
            echo.try_send(&e.from, payload)
        };
        match r {
            Ok(()) => None,
            Err(Error::Full { payload, .. }) => Some(payload),
            Err(err) => {
                self.failed += 1;
                if self
                    .last_fail_log
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                {
                    tracing::warn!(to = %e.from, error = %err, failed_so_far = self.failed, "echo failed");
                    self.last_fail_log = Some(Instant::now());
                }
                None
            }
        }
    }
}
