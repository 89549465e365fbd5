//! Resting: a connection with nothing going either way needs no reader thread (see
//! [`Stopped::Rested`]); the node's thread for resting connections (`io::resting`) reads
//! what comes on it, here, while that is only heartbeats and acknowledgements.

use super::leading::DeferControl;
use super::*;

/// Most reads one wake-up of a resting connection serves before it gives the connection a
/// thread of its own (a heartbeat or a lone message is one read; a stream is more).
const SERVE_READS: u32 = 8;

impl Reader<'_> {
    /// What moves while the connection is in use: messages and pieces either way, and
    /// threads trying to lead it (someone waits for something on it).
    pub(super) fn activity(&self) -> u64 {
        let st = &self.peer.stats;
        [
            &st.messages_received,
            &st.messages_sent,
            &st.fragments_received,
            &st.fragments_sent,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .sum::<u64>()
        .wrapping_add(u64::from(self.conn.lead_tries.load(Relaxed)))
    }

    /// With the read turn, about to read again: whether this thread may rest, i.e. the
    /// connection can and `activity` has not moved for `linger` (as far as this thread saw:
    /// since the read after which it last found it moved; one clock read per read).
    pub(super) fn rest_due(&self, side: &ReadSide, seen: &mut (u64, Instant)) -> bool {
        let Some(linger) = self.linger else {
            return false;
        };
        let (now, t) = (self.activity(), Instant::now());
        if now != seen.0 {
            *seen = (now, t);
            return false;
        }
        self.can_rest(side) && t.duration_since(seen.1) >= linger
    }

    /// Whether the connection can be left without a reader thread: on Unix (plain TCP or
    /// TLS: a TLS link rests only with rustls holding nothing, since its reads take all
    /// there was before it rests), not ended or closed, no piece being read in place and
    /// no read cut short to a frame's end.
    fn can_rest(&self, side: &ReadSide) -> bool {
        cfg!(unix)
            && side.ended.is_none()
            && side.piece.is_none()
            && side.next_read.is_none()
            && !self.conn.is_closed()
    }

    /// A resting connection is readable (on the node's thread for resting connections):
    /// read and act on what is there, as a leader would (messages too), without waiting.
    /// Returns whether it may go on resting: false if it needs a reader thread again,
    /// because a thread leads it (the turn is taken), more came than a wake-up serves (a
    /// stream), a piece is to be read in place, or it ended (then its read side says how,
    /// for the reader thread to tear it down).
    pub fn serve_rested(&self) -> bool {
        let Some(mut turn) = self.conn.try_read_turn() else {
            return false;
        };
        let Some(side) = turn.as_mut() else {
            return false;
        };
        if !self.can_rest(side) {
            return false;
        }
        let control = DeferControl::new(self.peer);
        let mut cache: Option<Arc<MailboxQueue>> = None;
        for _ in 0..SERVE_READS {
            match self.act(side, &mut cache) {
                Ok(false) => {}
                Ok(true) => {
                    side.ended = Some(Ok(()));
                    return false;
                }
                Err(e) => {
                    side.ended = Some(Err(e));
                    return false;
                }
            }
            match self.read_once(side, false) {
                Ok(true) => {}
                Ok(false) => {
                    // All there was: acknowledge if a sender may wait for it, and write
                    // what that made due (`control`, when dropped).
                    side.drained = true;
                    self.say_idle(side);
                    drop(control);
                    return self.can_rest(side);
                }
                Err(e) => {
                    side.ended = Some(Err(e));
                    return false;
                }
            }
        }
        false
    }

    /// No thread could be started to read on (the connection is closed): let go of the
    /// read side, and of a piece being read in place (its message's room goes now, as
    /// when a connection ends). If a leader holds the turn, it finds the connection closed
    /// and leaves the rest to the connection's end.
    pub fn abandon(&self) {
        let Some(mut turn) = self.conn.try_read_turn() else {
            return;
        };
        let piece = turn.as_mut().and_then(|side| side.piece.take());
        self.drop_in_place(piece.as_ref().map(|p| &p.head));
        *turn = None;
    }
}
