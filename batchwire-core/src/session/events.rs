//! What a session reports: why a peer went down, why messages failed, and the events the
//! IO layer acts on.

use std::time::Duration;

use crate::frame::Message;

/// One connection of a session. Frames from a connection that is no longer current are
/// ignored (their content is resent on the current one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(u64);

impl ConnId {
    pub(crate) fn new(n: u64) -> ConnId {
        ConnId(n)
    }

    #[cfg(test)]
    pub(crate) const fn for_tests(n: u64) -> ConnId {
        ConnId(n)
    }
}

/// Why a peer was declared down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DownReason {
    /// Connected, but nothing was heard from it for `after` (while this node listened).
    Silent {
        /// The `peer_timeout` that passed.
        after: Duration,
    },
    /// Not connected for `after`.
    Unreachable {
        /// The `peer_timeout` that passed.
        after: Duration,
    },
    /// It said goodbye (it shut down).
    Left,
    /// The cluster's failure detector (SWIM membership) declared it down, or it left the
    /// cluster.
    Membership,
}

impl std::fmt::Display for DownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownReason::Silent { after } => write!(f, "silent for more than {after:?}"),
            DownReason::Unreachable { after } => write!(f, "unreachable for more than {after:?}"),
            DownReason::Left => write!(f, "the peer shut down"),
            DownReason::Membership => {
                write!(f, "declared down (or left) in the cluster membership")
            }
        }
    }
}

/// Why messages are handed back as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailReason {
    /// The peer was declared down before acknowledging them.
    Down(DownReason),
    /// The peer restarted (a new incarnation) before acknowledging them.
    Restarted,
    /// This node shut down before the peer acknowledged them.
    ShutDown,
    /// Unsequenced mode: the connection broke before they were written.
    ConnectionLost,
    /// The session could not be resumed (the two ends' numbering disagreed: a RESUME
    /// claimed more than was sent) and was reset to a new one before they were
    /// acknowledged.
    Reset,
    /// No connection reached the peer within `after` of the first message held for it
    /// while it was never up (see `Session::require_reach`). It is not declared down:
    /// what is sent next is held again, with a clock of its own.
    Unreached {
        /// The time given.
        after: std::time::Duration,
    },
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailReason::Down(r) => write!(f, "the peer was declared down ({r})"),
            FailReason::Restarted => {
                write!(
                    f,
                    "the peer restarted (new incarnation) before acknowledging"
                )
            }
            FailReason::ShutDown => write!(f, "this node shut down before the peer acknowledged"),
            FailReason::Reset => write!(
                f,
                "the session could not be resumed and was reset before the peer acknowledged"
            ),
            FailReason::ConnectionLost => {
                write!(
                    f,
                    "the connection broke before they were written (unsequenced mode)"
                )
            }
            FailReason::Unreached { after } => write!(
                f,
                "no connection reached the peer within {after:?} of the first of them"
            ),
        }
    }
}

/// Something the IO layer must act on or report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// The peer is up (first connection, or back after being declared down).
    Up {
        /// Its incarnation.
        incarnation: u64,
    },
    /// The peer restarted: numbering starts again both ways.
    Restarted {
        /// Its new incarnation.
        incarnation: u64,
    },
    /// The session could not be resumed and was reset (see [`Session::handle_reset`]):
    /// numbering starts again both ways, what was pending was failed.
    ///
    /// [`Session::handle_reset`]: crate::session::Session::handle_reset
    Reset,
    /// The peer was declared down. Fail what is still queued for it.
    Down {
        /// Why.
        reason: DownReason,
    },
    /// These messages will never be delivered (none was delivered twice; some may have
    /// been delivered once before the peer stopped acknowledging).
    Failed {
        /// The messages, with their payloads.
        messages: Vec<Message>,
        /// Why.
        reason: FailReason,
    },
    /// Close this connection (the peer was declared down while it was current).
    Close {
        /// The connection.
        conn: ConnId,
    },
}
