//! One authenticated connection to a peer, and why connections fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use batchwire_core::credit::FlowError;
use batchwire_core::frame::FrameError;
use batchwire_core::handshake::HandshakeError;
use batchwire_core::reassembly::ReassemblyError;
use batchwire_core::reliable::SeqError;
use batchwire_core::session::ConnId;

use crate::event::{CloseReason, HandshakeFailure};
use crate::io::link::Link;

/// A connection serving a peer: its id in the peer's session, its transport, and whether
/// it was closed. Its reader owns it; the peer's writer (or a sender writing through, with
/// the write turn) uses it while it is current.
pub(crate) struct Conn {
    pub id: ConnId,
    pub link: Arc<Link>,
    closed: AtomicBool,
    /// Dialled by the node whose name sorts first (the tie-break's choice). A connection
    /// the other way (a join, or a member reaching one that does not know it yet) gives
    /// way to a live canonical one.
    pub canonical: bool,
    /// The rest of a write-through that the socket did not take at once (slices of the
    /// window's chunks, not copies): written (by the writer) before anything else on this
    /// connection. Touched only with the peer's write turn.
    carry: Mutex<Vec<Bytes>>,
}

impl Conn {
    pub fn new(id: ConnId, link: Arc<Link>) -> Conn {
        Conn {
            id,
            link,
            closed: AtomicBool::new(false),
            canonical: true,
            carry: Mutex::new(Vec::new()),
        }
    }

    /// Keep `rest` to be written before anything else (see `carry`).
    pub fn set_carry(&self, rest: Vec<Bytes>) {
        *self.carry.lock().unwrap_or_else(|p| p.into_inner()) = rest;
    }

    /// What a write-through left over (empty if nothing).
    pub fn take_carry(&self) -> Vec<Bytes> {
        std::mem::take(&mut *self.carry.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn has_carry(&self) -> bool {
        !self
            .carry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Close both directions: the reader's read and the writer's write fail at once, and
    /// a reader waiting for room in a mailbox gives up within its recheck.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.link.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Why a connection ended (or never got going).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("handshake timed out after {0:?}")]
    HandshakeTimeout(std::time::Duration),
    #[error("peer closed the connection")]
    Eof,
    #[error("a newer connection to the peer took over")]
    Replaced,
    #[error("unexpected {0} frame after the handshake")]
    Unexpected(&'static str),
    #[error("{0}")]
    Sequence(#[from] SeqError),
    #[error("{0}")]
    Flow(#[from] FlowError),
    #[error("{0}")]
    Pieces(#[from] ReassemblyError),
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    #[error("{reason}")]
    Certificate { peer: String, reason: String },
    #[error(
        "the peer speaks TLS and this node does not: configure --tls-cert, --tls-key and --tls-ca (NodeConfig::tls) on every node"
    )]
    PeerSpeaksTls,
    #[error("this node already has max_peers ({0}) peers")]
    Capacity(usize),
}

impl LinkError {
    /// The kind of handshake failure this error stands for (connection setup).
    pub fn kind(&self) -> HandshakeFailure {
        use HandshakeError as H;
        use LinkError as L;
        match self {
            L::Handshake(H::Secret { .. }) => HandshakeFailure::Secret,
            L::Handshake(H::Version { .. }) => HandshakeFailure::Version,
            L::Handshake(H::WrongPeer { .. } | H::SameName(_)) => HandshakeFailure::Name,
            L::Handshake(H::WrongDirection(_)) => HandshakeFailure::Direction,
            L::Handshake(H::Refused { .. }) => HandshakeFailure::Refused,
            L::Handshake(H::Unexpected { .. })
            | L::Frame(_)
            | L::Unexpected(_)
            | L::Sequence(_)
            | L::Flow(_)
            | L::Pieces(_) => HandshakeFailure::Protocol,
            L::HandshakeTimeout(_) => HandshakeFailure::Timeout,
            L::Io(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                HandshakeFailure::Timeout
            }
            L::Tls(_) | L::PeerSpeaksTls => HandshakeFailure::Tls,
            L::Certificate { .. } => HandshakeFailure::Certificate,
            L::Capacity(_) => HandshakeFailure::Capacity,
            L::Io(_) | L::Eof | L::Replaced => HandshakeFailure::Closed,
        }
    }

    /// Whether the peer broke the protocol (counted as a violation).
    pub fn is_violation(&self) -> bool {
        matches!(
            self,
            LinkError::Sequence(_)
                | LinkError::Frame(_)
                | LinkError::Unexpected(_)
                | LinkError::Flow(_)
                | LinkError::Pieces(_)
        )
    }

    /// Why an established connection closed, for `Event::Disconnected`.
    pub fn close_reason(&self) -> CloseReason {
        match self {
            LinkError::Eof => CloseReason::Closed,
            LinkError::Replaced => CloseReason::Replaced,
            e if e.is_violation() => CloseReason::Protocol(e.to_string()),
            LinkError::Handshake(HandshakeError::Refused { reason, .. }) => {
                CloseReason::Refused(reason.clone())
            }
            e => CloseReason::Io(e.to_string()),
        }
    }
}
