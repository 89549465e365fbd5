//! One authenticated connection to a peer, and why connections fail.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use bytes::{Bytes, BytesMut};

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
    /// Closed by this node because it carried nothing (connections on demand).
    idle: AtomicBool,
    /// Dialled by the node whose name sorts first (the tie-break's choice). A connection
    /// the other way (a join, or a member reaching one that does not know it yet) gives
    /// way to a live canonical one.
    pub canonical: bool,
    /// The rest of a write-through that the socket did not take at once (slices of the
    /// window's chunks, not copies): written (by the writer) before anything else on this
    /// connection. Touched only with the peer's write turn.
    carry: Mutex<Vec<Bytes>>,
    /// The read turn (plain TCP): what was read and not yet acted on, and how far reading
    /// got. Taken by whoever reads: the connection's reader thread, or an application
    /// thread waiting for a reply or a message on it that found the turn free (see
    /// `read.rs`, "leading"). `None` until the reader thread starts reading (after its
    /// first SYNC snapshot) and once it stopped.
    read: Mutex<Option<ReadSide>>,
    /// While a receiver waiting for a mailbox leads (see `read.rs`): what wakes it, so
    /// that a caller about to wait for a reply on this connection can ask for the turn.
    lead_wake: Mutex<Option<Arc<OwnedFd>>>,
    /// Tries to lead, ever: while they go on, the reader thread waits for the socket
    /// without the turn rather than in `recv(2)` with it (see `read.rs`).
    pub lead_tries: std::sync::atomic::AtomicU32,
    /// A leader's last read took all there was (the receiver keeps up with what comes):
    /// only then does the reader thread stand aside. Cleared by a lead that found the
    /// connection over.
    pub led_drained: std::sync::atomic::AtomicBool,
}

/// A connection's read state, with the read turn.
pub(crate) struct ReadSide {
    pub ring: RecvRing,
    /// The last read took all there was (it did not fill its buffer).
    pub drained: bool,
    /// Since the last read, the session was told the connection went quiet.
    pub idle_said: bool,
    /// How the connection ended, found by a caller leading: the reader thread, the one
    /// that tears connections down, returns it as if it had found it.
    pub ended: Option<Result<(), LinkError>>,
    /// A piece whose data is being read straight into its message's buffer (the ring
    /// holds nothing of it): reads go there until it is whole.
    pub piece: Option<InPlace>,
    /// How much the next read into the ring asks for, if not `read_bytes`: up to the end
    /// of a piece (and the next frame's fields), so that a piece after it can be read in
    /// place (see `read.rs`).
    pub next_read: Option<usize>,
    /// The last read got all it asked for after being cut short to a frame's end, or over
    /// TLS: whether more is waiting is not known, so the next read looks without waiting.
    pub look: bool,
}

/// A piece being read in place (see `read.rs`): its fields, and how much of its data
/// is in its message's buffer.
pub(crate) struct InPlace {
    pub head: batchwire_core::frame::FragmentHead,
    pub read: usize,
}

impl Conn {
    pub fn new(id: ConnId, link: Arc<Link>) -> Conn {
        Conn {
            id,
            link,
            closed: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            canonical: true,
            carry: Mutex::new(Vec::new()),
            read: Mutex::new(None),
            lead_wake: Mutex::new(None),
            lead_tries: std::sync::atomic::AtomicU32::new(0),
            led_drained: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A receiver leads with `wake` (`None`: it stopped).
    pub fn set_lead_wake(&self, wake: Option<Arc<OwnedFd>>) {
        *self.lead_wake.lock().unwrap_or_else(|p| p.into_inner()) = wake;
    }

    /// What wakes the receiver leading, if one does.
    pub fn lead_wake(&self) -> Option<Arc<OwnedFd>> {
        self.lead_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Take the read turn, waiting for a caller that leads to give it back.
    pub fn read_turn(&self) -> MutexGuard<'_, Option<ReadSide>> {
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The read turn if no one has it.
    pub fn try_read_turn(&self) -> Option<MutexGuard<'_, Option<ReadSide>>> {
        match self.read.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
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

    /// Close both directions: the reader's read (and a leader's) and the writer's write
    /// fail at once.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.link.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Close it because it carried nothing for the idle time (see `peer::demand`).
    pub fn close_idle(&self) {
        self.idle.store(true, Ordering::Release);
        self.close();
    }

    /// Whether [`Conn::close_idle`] closed it.
    pub fn closed_idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A reader's receive buffers. Frames are split off the current buffer and their messages
/// handed out as slices of it, so a buffer is free again only once the application has
/// dropped every message cut from it. Letting `BytesMut::reserve` allocate a new one
/// whenever the current one is still shared (nearly always, at speed) cost a fresh block
/// from the allocator per read, which it took from and gave back to the kernel: page faults
/// and `madvise` were a tenth of the reader's time at 10 KB messages. Instead the reader
/// keeps a few full buffers ([`RETIRED_BYTES`] of blocks, at least one, at most
/// [`RETIRED_MAX`]) and takes one back once its messages are gone. Memory: the current
/// block and at most that many retired ones, blocks being about `4 x read_bytes` (at most
/// 1 MiB, or one read if that is larger; a block may be bigger by the part of a frame
/// moved along), per connection; plus blocks the application still holds messages of
/// (those it frees itself).
pub(crate) struct RecvRing {
    cur: BytesMut,
    retired: std::collections::VecDeque<BytesMut>,
    block: usize,
    /// How many retired blocks are kept.
    keep: usize,
}

/// Bytes of full receive buffers kept per connection to be reused (four blocks of four
/// 64 KiB reads; one block of four 256 KiB reads, which did as well in the bench).
const RETIRED_BYTES: usize = 1 << 20;
/// Most retired blocks kept, however small (a small `read_bytes` must not mean hundreds of
/// blocks, each its own allocation, looked through at every change of block).
const RETIRED_MAX: usize = 4;

impl RecvRing {
    pub fn new(mut cur: BytesMut, want: usize) -> Self {
        // Four reads per block, but no block over 1 MiB beyond one read (a large
        // `read_bytes` must not multiply the memory a connection keeps).
        let block = want.saturating_mul(4).min(want.max(1 << 20));
        if cur.capacity() - cur.len() < want {
            cur.reserve(block);
        }
        RecvRing {
            cur,
            retired: Default::default(),
            block,
            keep: (RETIRED_BYTES / block.max(1)).clamp(1, RETIRED_MAX),
        }
    }

    /// The bytes read and not yet decoded.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.cur
    }

    /// How many bytes to read next, given that a read takes up to `want`: `want`, unless
    /// the unread bytes start a frame whose length is known, whose rest fits in the
    /// current buffer, and after which a read of `want` would not. Then only that rest:
    /// the buffer ends at a frame boundary and the next frame starts in the next buffer,
    /// with nothing to move along. (Moving the part of a frame read so far, whenever a
    /// buffer filled up, would copy those bytes a second time, and a frame of the natural
    /// bundler is up to 64 KiB.)
    pub fn read_size(&self, want: usize) -> usize {
        let (len, spare) = (self.cur.len(), self.cur.capacity() - self.cur.len());
        let Some(&[a, b, c, d]) = self.cur.get(..4) else {
            return want;
        };
        let frame = u32::from_le_bytes([a, b, c, d]) as usize + 4;
        match frame.checked_sub(len) {
            Some(rest) if rest > 0 && rest <= spare && spare < rest.saturating_add(want) => {
                rest.min(want)
            }
            _ => want,
        }
    }

    /// The current buffer, with room for `want` more bytes: if it has none and its
    /// messages are still held, the unread tail (at most part of one frame) moves to a
    /// retired buffer whose messages are all dropped, or to a new one.
    pub fn room(&mut self, want: usize) -> &mut BytesMut {
        // Nothing left to decode and every message cut from the buffer gone (an idle
        // connection's heartbeats): back to the buffer's start, so an idle connection keeps
        // touching the same page. (Reading on from where the last read ended, its
        // heartbeats alone walked through the whole block, 1 MiB resident per connection
        // after about half a day.) With messages still held this only looks.
        if self.cur.is_empty() && self.cur.capacity() < self.block {
            let _ = self.cur.try_reclaim(self.cur.capacity() + 1);
        }
        // Room left, or every message cut from the buffer is gone (light load): in place.
        if self.cur.capacity() - self.cur.len() >= want || self.cur.try_reclaim(want) {
            return &mut self.cur;
        }
        let need = self.cur.len() + want;
        let reuse = (0..self.retired.len()).find(|&i| self.retired[i].try_reclaim(need));
        let mut next = match reuse {
            Some(i) => self.retired.remove(i).unwrap_or_default(),
            None => BytesMut::with_capacity(need.max(self.block)),
        };
        next.extend_from_slice(&self.cur);
        let mut old = std::mem::replace(&mut self.cur, next);
        old.clear();
        if self.retired.len() >= self.keep {
            self.retired.pop_front();
        }
        self.retired.push_back(old);
        &mut self.cur
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
    #[error(
        "{peer:?} is already connected as incarnation {live}: another node claiming the name (incarnation {claimed}) is refused while that connection is live"
    )]
    NameTaken {
        peer: String,
        live: u64,
        claimed: u64,
    },
    #[error(
        "the session could not be resumed ({0}); it was reset: what was pending was reported failed, numbering starts again"
    )]
    SessionReset(String),
}

impl LinkError {
    /// The kind of handshake failure this error stands for (connection setup).
    pub fn kind(&self) -> HandshakeFailure {
        use HandshakeError as H;
        use LinkError as L;
        match self {
            L::Handshake(H::Secret { .. }) => HandshakeFailure::Secret,
            L::Handshake(H::Version { .. }) => HandshakeFailure::Version,
            L::Handshake(H::WrongPeer { .. } | H::SameName(_)) | L::NameTaken { .. } => {
                HandshakeFailure::Name
            }
            L::Handshake(H::WrongDirection(_)) => HandshakeFailure::Direction,
            L::Handshake(H::Refused { .. }) => HandshakeFailure::Refused,
            L::Handshake(H::Timeout { .. }) | L::HandshakeTimeout(_) => HandshakeFailure::Timeout,
            L::Handshake(H::Unexpected { .. } | _)
            | L::Frame(_)
            | L::Unexpected(_)
            | L::Sequence(_)
            | L::Flow(_)
            | L::Pieces(_)
            | L::SessionReset(_) => HandshakeFailure::Protocol,
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
            e @ LinkError::SessionReset(_) => CloseReason::Protocol(e.to_string()),
            e if e.is_violation() => CloseReason::Protocol(e.to_string()),
            LinkError::Handshake(HandshakeError::Refused { reason, .. }) => {
                CloseReason::Refused(reason.clone())
            }
            e => CloseReason::Io(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `wire` bytes on the wire, of which the first `part` (its header first).
    fn frame_start(wire: usize, part: usize) -> Vec<u8> {
        let mut f = ((wire - 4) as u32).to_le_bytes().to_vec();
        f.resize(part, 4);
        f
    }

    /// An idle connection (a heartbeat at a time, each decoded and dropped) reads into the
    /// same few bytes of its buffer, not on through it; one whose messages are still held
    /// reads on (they are not moved).
    #[test]
    fn an_idle_connection_reads_into_the_start_of_its_buffer() {
        let mut ring = RecvRing::new(BytesMut::new(), 256 << 10);
        let start = ring.buf().as_ptr() as usize;
        for _ in 0..10_000 {
            ring.room(256 << 10).extend_from_slice(&[0u8; 13]);
            drop(ring.buf().split_to(13).freeze());
        }
        let at = ring.room(256 << 10).as_ptr() as usize;
        assert_eq!(at, start, "walked {} bytes on", at - start);
        let held: Vec<_> = (0..100)
            .map(|_| {
                ring.room(256 << 10).extend_from_slice(&[0u8; 13]);
                ring.buf().split_to(13).freeze()
            })
            .collect();
        assert_eq!(ring.room(256 << 10).as_ptr() as usize, start + 1300);
        drop(held);
    }

    #[test]
    fn near_the_end_of_a_buffer_a_read_stops_at_the_frame_boundary() {
        // Reads of 1000 bytes into blocks of 4000; 3000 bytes of frames taken (and held).
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        let start = ring.buf().as_ptr();
        ring.room(1000).extend_from_slice(&[0u8; 3000]);
        let _held = ring.buf().split_to(3000).freeze();
        // Nothing of the next frame yet: a full read.
        assert_eq!(ring.read_size(1000), 1000);
        // 300 of an 800-byte frame: 700 bytes left in the buffer, the frame's rest (500)
        // fits but a full read after it would not: read the rest only, in place.
        ring.buf().extend_from_slice(&frame_start(800, 300));
        assert_eq!(ring.read_size(1000), 500);
        let b = ring.room(500);
        assert_eq!(
            b.as_ptr() as usize,
            start as usize + 3000,
            "in place, nothing moved"
        );
        // A frame whose rest does not fit: a full read, and the part read moves along.
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        ring.room(1000).extend_from_slice(&[0u8; 3000]);
        let _held = ring.buf().split_to(3000).freeze();
        ring.buf().extend_from_slice(&frame_start(2000, 300));
        assert_eq!(ring.read_size(1000), 1000);
        assert_eq!(ring.room(1000).len(), 300, "moved to the next buffer");
        // Room for the rest and a full read after it: a full read.
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        ring.buf().extend_from_slice(&frame_start(800, 300));
        assert_eq!(ring.read_size(1000), 1000);
        // Fewer than 4 bytes: the length is not known yet.
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        ring.room(1000).extend_from_slice(&[0u8; 3600]);
        let _held = ring.buf().split_to(3597).freeze();
        assert_eq!(ring.read_size(1000), 1000);
    }

    #[test]
    fn a_receive_buffer_is_taken_back_once_its_messages_are_dropped_and_a_tail_moves_along() {
        // Reads of 1000 bytes into blocks of 4000.
        let mut ring = RecvRing::new(BytesMut::new(), 1000);
        ring.room(1000).extend_from_slice(&[7u8; 3500]);
        let first = ring.buf().as_ptr();
        // A message the application keeps; 500 bytes of a frame left unread.
        let kept = ring.buf().split_to(3000).freeze();
        // No room for another read: the tail moves to a new buffer (the first is shared).
        let b = ring.room(1000);
        assert_ne!(b.as_ptr(), first);
        assert_eq!(&b[..], &[7u8; 500][..], "the unread tail moved along");
        assert_eq!(ring.retired.len(), 1);
        // Fill the second buffer too, while the application still holds `kept`...
        ring.buf().extend_from_slice(&[8u8; 3000]);
        let second = ring.buf().split_to(3400).freeze();
        let _ = ring.room(1000);
        assert!(
            ring.buf().as_ptr() != first,
            "not taken back while a message lives"
        );
        assert_eq!(&ring.buf()[..], &[8u8; 100][..]);
        // ...then it drops both. The current buffer's messages are gone too (light load):
        // it is reused in place, the tail moved to its front.
        drop((kept, second));
        let third = ring.buf().as_ptr();
        ring.buf().extend_from_slice(&[9u8; 3500]);
        drop(ring.buf().split_to(3550));
        let b = ring.room(1000);
        assert_eq!(b.as_ptr(), third, "reused in place");
        assert_eq!(&b[..], &[9u8; 50][..]);
        // Under load (a message of the current buffer still held) the next change takes
        // the oldest retired buffer back instead of allocating.
        ring.buf().extend_from_slice(&[3u8; 3000]);
        let held = ring.buf().split_to(3040).freeze();
        let b = ring.room(1000);
        assert_eq!(b.as_ptr(), first, "the oldest retired buffer is reused");
        assert_eq!(&b[..], &[3u8; 10][..]);
        assert_eq!(ring.retired.len(), 2);
        assert_eq!(ring.retired[1].as_ptr() as usize, third as usize + 3040);
        drop(held);
        // Kept: at most RETIRED_BYTES of full buffers.
        for _ in 0..300 {
            let b = ring.room(1000);
            b.extend_from_slice(&[1u8; 3990]);
            let _keep_shared = b.split_to(3990).freeze();
        }
        assert!(ring.retired.len() <= ring.keep);
    }

    /// What a connection keeps is bounded: four blocks of four 64 KiB reads, one of four
    /// 256 KiB reads (the default), one of a single 1 MiB read, and never more than four
    /// blocks, however small (here reads of 1000 bytes).
    #[test]
    fn full_buffers_kept_for_reuse_come_to_at_most_a_mebibyte_or_one_block() {
        for (read, keep) in [(64 << 10, 4), (256 << 10, 1), (1 << 20, 1), (1000, 4)] {
            let mut ring = RecvRing::new(BytesMut::new(), read);
            // The application holds every message: six blocks' worth.
            let mut held = Vec::new();
            for _ in 0..6 * ring.block / read {
                let b = ring.room(read);
                b.extend_from_slice(&vec![1u8; read]);
                held.push(b.split_to(read).freeze());
            }
            assert_eq!(ring.retired.len(), keep, "reads of {read}");
            let kept = ring.retired.len() * ring.block;
            assert!(
                kept <= RETIRED_BYTES.max(ring.block),
                "{kept} kept with reads of {read}"
            );
        }
    }
}
