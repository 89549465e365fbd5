//! Counters kept per peer and per node. Updated once per batch or frame, never per
//! message, and readable at any time with `Node::stats`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::event::HandshakeFailure;

/// One peer's counters (atomics; the IO threads add to them).
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    pub messages_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_sent: AtomicU64,
    pub writes: AtomicU64,
    /// Of `writes`, those a sending thread made itself (write-through).
    pub writes_through: AtomicU64,
    /// Reads of the peer's connections that returned bytes, by any thread.
    pub reads: AtomicU64,
    /// Reads made by an application thread waiting for a reply or a message (leading),
    /// not the reader thread.
    pub reads_led: AtomicU64,
    /// Writer threads started (a writer ends after `thread_linger` with nothing to write).
    pub writer_starts: AtomicU64,
    /// Times the connection's reader thread ended with the connection resting.
    pub reader_rests: AtomicU64,
    /// Bytes of pieces read straight into their message's reassembly buffer.
    pub piece_bytes_in_place: AtomicU64,
    pub send_failed: AtomicU64,
    pub messages_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub frames_received: AtomicU64,
    pub undeliverable_reported: AtomicU64,
    pub reassembly_refused: AtomicU64,
    pub connects: AtomicU64,
    /// Connections closed because the peer broke the protocol (forged acks, gaps...).
    pub violations: AtomicU64,
    pub acked: AtomicU64,
    pub resent: AtomicU64,
    /// Pieces (FRAGMENT frames) numbered for the peer, and received from it.
    pub fragments_sent: AtomicU64,
    pub fragments_received: AtomicU64,
    /// Flushes by reason, indexed by `FlushReason::index`.
    pub flushes: [AtomicU64; 4],
    /// Writes by messages per write: bucket i counts writes of 2^i ..= 2^(i+1)-1 messages.
    pub per_write: [AtomicU64; HIST_BUCKETS],
}

/// Buckets of the messages-per-write histogram (up to 2^24 messages per write).
const HIST_BUCKETS: usize = 25;

/// A snapshot of one peer's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PeerStats {
    /// The peer's name.
    pub peer: String,
    /// Whether a connection to it is up now.
    pub connected: bool,
    /// Messages written to the socket.
    pub messages_sent: u64,
    /// Bytes written (encoded, frame headers included).
    pub bytes_sent: u64,
    /// MESSAGES frames written.
    pub frames_sent: u64,
    /// `write` calls that carried messages (one per flushed batch).
    pub writes: u64,
    /// Messages handed back as failed (`Event::SendFailed`).
    pub send_failed: u64,
    /// Messages received from the peer.
    pub messages_received: u64,
    /// Bytes received from the peer.
    pub bytes_received: u64,
    /// Frames received from the peer.
    pub frames_received: u64,
    /// Messages this peer reported it could not deliver (no such mailbox).
    pub undeliverable_reported: u64,
    /// Messages in pieces from this peer not kept because the node's `reassembly_bytes`
    /// was committed (reported to it as undeliverable).
    pub reassembly_refused: u64,
    /// Times a connection to this peer was established.
    pub connects: u64,
    /// Connections closed because the peer broke the protocol: an acknowledgement or
    /// RESUME for messages never sent, a sequence gap or overflow, a malformed frame.
    pub protocol_violations: u64,
    /// Messages the peer acknowledged.
    pub acked: u64,
    /// Messages written again on a new connection after a break.
    pub resent: u64,
    /// Pieces of large (or bulk) messages sent: each is one FRAGMENT frame.
    pub fragments_sent: u64,
    /// Pieces received.
    pub fragments_received: u64,
    /// Sends that found their mailbox's credit at this peer used up (and waited, or got
    /// `Full`): the peer's application is not taking from that mailbox fast enough.
    pub credit_stalls: u64,
    /// Credit the peer gave back beyond what was charged (clamped; 0 unless it misbehaves).
    pub credit_mismatched: u64,
    /// Bytes held for the peer until it acknowledges them.
    pub unacked_bytes: u64,
    /// Flushes because the queue was drained.
    pub flushes_drained: u64,
    /// Flushes because the bundler's size limit was reached.
    pub flushes_size: u64,
    /// Flushes because the bundler's timer expired.
    pub flushes_timer: u64,
    /// One-message flushes (`none`).
    pub flushes_single: u64,
    /// Of `writes`, those the sending thread made itself because the writer was idle and
    /// nothing was queued (write-through: no thread hand-off for a lone message).
    pub writes_through: u64,
    /// Reads of this peer's connections that returned bytes (system calls; over TLS, reads
    /// of ciphertext), whoever made them.
    pub reads: u64,
    /// Of `reads`, those made by an application thread while it waited for
    /// the reply to its request or for a message in its mailbox (leading: the bytes were
    /// in its hands at once, with no wake-up by the reader thread), rather than by the
    /// connection's reader thread.
    pub reads_led: u64,
    /// Writer threads started for this peer: one per connection or burst of traffic after
    /// a pause of `thread_linger` (an idle peer has none).
    pub writer_starts: u64,
    /// Times the reader thread of this peer's connection ended because nothing moved for
    /// `thread_linger` (the node's thread for resting connections watched it meanwhile).
    pub reader_rests: u64,
    /// Bytes of large messages' pieces read from the socket straight into the message's
    /// reassembly buffer (not copied there from the receive buffer). The rest of a piece
    /// (what came with its fields, or all of it over TLS or when it arrived whole with
    /// what came before it) is copied once.
    pub piece_bytes_in_place: u64,
    /// Most bytes ever waiting in the outbound queue.
    pub queue_high_water: u64,
    /// Total time senders spent blocked on the full outbound queue (or used-up credit), in
    /// microseconds.
    pub blocked_us: u64,
    /// Messages waiting in the outbound queue now.
    pub queued: u64,
    /// (lower bound, writes): writes that carried lower bound ..= 2 x lower bound - 1
    /// messages. Empty buckets are left out.
    pub messages_per_write_histogram: Vec<(u64, u64)>,
}

impl PeerStats {
    /// Never connected, nothing sent, received, queued or failed: a member known only
    /// through membership (with connections on demand, nobody talked to it).
    pub fn is_untouched(&self) -> bool {
        !self.connected
            && self.connects == 0
            && self.frames_sent == 0
            && self.frames_received == 0
            && self.send_failed == 0
            && self.protocol_violations == 0
            && self.queued == 0
            && self.unacked_bytes == 0
    }

    /// Mean messages per write.
    pub fn messages_per_write(&self) -> f64 {
        if self.writes == 0 {
            0.0
        } else {
            self.messages_sent as f64 / self.writes as f64
        }
    }
}

impl PeerCounters {
    /// Count one write of `messages` messages (once per write, not per message).
    pub fn record_write(&self, messages: u64) {
        self.writes.fetch_add(1, Relaxed);
        let b = (63 - messages.max(1).leading_zeros() as usize).min(HIST_BUCKETS - 1);
        self.per_write[b].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self, peer: String, connected: bool) -> PeerStats {
        let f = |i: usize| self.flushes[i].load(Relaxed);
        PeerStats {
            peer,
            connected,
            messages_sent: self.messages_sent.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            frames_sent: self.frames_sent.load(Relaxed),
            writes: self.writes.load(Relaxed),
            send_failed: self.send_failed.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            frames_received: self.frames_received.load(Relaxed),
            undeliverable_reported: self.undeliverable_reported.load(Relaxed),
            reassembly_refused: self.reassembly_refused.load(Relaxed),
            connects: self.connects.load(Relaxed),
            protocol_violations: self.violations.load(Relaxed),
            acked: self.acked.load(Relaxed),
            resent: self.resent.load(Relaxed),
            fragments_sent: self.fragments_sent.load(Relaxed),
            fragments_received: self.fragments_received.load(Relaxed),
            flushes_drained: f(0),
            flushes_size: f(1),
            flushes_timer: f(2),
            flushes_single: f(3),
            writes_through: self.writes_through.load(Relaxed),
            reads: self.reads.load(Relaxed),
            reads_led: self.reads_led.load(Relaxed),
            writer_starts: self.writer_starts.load(Relaxed),
            reader_rests: self.reader_rests.load(Relaxed),
            piece_bytes_in_place: self.piece_bytes_in_place.load(Relaxed),
            messages_per_write_histogram: self
                .per_write
                .iter()
                .enumerate()
                .map(|(i, c)| (1u64 << i, c.load(Relaxed)))
                .filter(|(_, c)| *c > 0)
                .collect(),
            ..Default::default()
        }
    }
}

/// A snapshot of a node's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct NodeStats {
    /// The node's name.
    pub node: String,
    /// Per peer, sorted by name.
    pub peers: Vec<PeerStats>,
    /// Messages that arrived for a mailbox that does not exist here.
    pub undeliverable: u64,
    /// Messages delivered without leaving this node.
    pub local_messages: u64,
    /// Connections that never got past the handshake, and why.
    pub handshakes: HandshakeStats,
    /// Events dropped because a subscriber did not keep up (see `Node::events`).
    pub events_dropped: u64,
    /// The membership layer's traffic.
    pub membership: MembershipStats,
    /// Requests made from this node (`Node::request` and friends).
    pub requests: RequestStats,
    /// Bytes of messages in pieces the node holds room for now, every peer's (their
    /// announced lengths; bounded by `reassembly_bytes`).
    pub reassembly_bytes: u64,
    /// Bytes written to all peers (the sum of `peers`' `bytes_sent`; also filled in by
    /// [`crate::node::Node::stats_brief`], which leaves `peers` empty).
    pub bytes_sent: u64,
}

/// Requests made from this node, and the replies that came back.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RequestStats {
    /// Requests in flight now (slots in the pending table).
    pub pending: u64,
    /// Requests begun.
    pub sent: u64,
    /// Replies handed to their caller.
    pub answered: u64,
    /// Requests that timed out.
    pub timed_out: u64,
    /// Requests whose caller dropped the future before the reply.
    pub cancelled: u64,
    /// Requests failed: the node went down, no such mailbox, not sent, or shutdown.
    pub failed: u64,
    /// Requests refused because the table was full (`max_pending_requests`).
    pub refused: u64,
    /// Replies that came after their request timed out or was cancelled: dropped.
    pub late_replies: u64,
    /// Replies from a node other than the one asked, or with no valid call id: dropped.
    pub stray_replies: u64,
}

/// What the membership layer (SWIM) sent and took. Bytes are MEMBER bodies (add the
/// datagram's header and tag, 38 bytes and the sender's name each, and UDP/IP's).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MembershipStats {
    /// Packets taken from members.
    pub packets_in: u64,
    /// Their bytes.
    pub bytes_in: u64,
    /// Packets sent to members.
    pub packets_out: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// Of the packets sent, SWIM's probes and their answers (pings, acks, indirect
    /// probes)...
    pub probes_out: u64,
    /// ...its gossip of updates...
    pub gossip_out: u64,
    /// ...and the datagrams of full-state answers (push-pull). The rest are announces and
    /// their answers, state asks, leave and "you are down" notices.
    pub state_out: u64,
    /// Packets dropped by the per-peer rate limit (`frames_per_second`).
    pub rate_limited: u64,
    /// Packets that broke the rules (dropped): a SWIM sender field that is not the
    /// datagram's sender, a packet that does not decode.
    pub violations: u64,
    /// Packets dropped because the membership thread was behind.
    pub inputs_dropped: u64,
    /// Members not taken in because the view already held `max_members` (each name once).
    pub members_refused: u64,
    /// Packets from, and updates about, members SWIM did not list, dropped because its
    /// own list already held twice `max_members` live members (four times with down ones):
    /// invented members, or a cluster far larger than configured.
    pub swim_full: u64,
    /// Datagrams refused before anything in them was believed: not a membership
    /// datagram, forged or damaged (does not open with the cluster key), meant for another
    /// member, or replayed.
    pub datagrams_refused: u64,
    /// Datagrams the socket would not send (no route, a full buffer).
    pub send_errors: u64,
}

impl NodeStats {
    /// The counters of peer `name`, if it is a peer.
    pub fn peer(&self, name: &str) -> Option<&PeerStats> {
        self.peers.iter().find(|p| p.peer == name)
    }
}

/// Counters of connections refused or failed before they carried messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct HandshakeStats {
    /// Handshakes that failed, by why (kinds with a zero count are left out).
    pub failed: Vec<(HandshakeFailure, u64)>,
    /// Inbound connections closed at once because `max_handshakes` were in progress.
    pub busy: u64,
    /// Errors accepting a connection (e.g. out of file descriptors).
    pub accept_errors: u64,
    /// Authenticated inbound connections closed because no thread could be started for
    /// them (a handshake in progress has none: the acceptor's event loop runs it).
    pub spawn_errors: u64,
    /// Handshakes in progress cut to make room for one from an address holding fewer
    /// places (see `NodeConfig::max_handshakes`).
    pub evicted: u64,
    /// Inbound connections that took a place kept for known addresses (configured
    /// peers, seeds, members) because the strangers' places were all taken.
    pub reserved: u64,
    /// Inbound handshakes in progress now (each a socket and a few KiB, no thread).
    pub pending: u64,
}

impl HandshakeStats {
    /// Handshakes that failed for any reason (not counting `busy`).
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().map(|(_, n)| n).sum()
    }

    /// How many failed for `kind`.
    pub fn failed(&self, kind: HandshakeFailure) -> u64 {
        self.failed
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    }
}

/// The node's counters of unauthenticated clients.
#[derive(Debug, Default)]
pub(crate) struct SecurityCounters {
    failed: [AtomicU64; HandshakeFailure::ALL.len()],
    pub busy: AtomicU64,
    pub accept_errors: AtomicU64,
    pub spawn_errors: AtomicU64,
    pub evicted: AtomicU64,
    pub reserved: AtomicU64,
}

impl SecurityCounters {
    pub fn count(&self, kind: HandshakeFailure) {
        if let Some(i) = HandshakeFailure::ALL.iter().position(|k| *k == kind) {
            self.failed[i].fetch_add(1, Relaxed);
        }
    }

    /// The counters, with `pending` handshakes in progress (the acceptor's table knows).
    pub fn snapshot(&self, pending: u64) -> HandshakeStats {
        HandshakeStats {
            failed: HandshakeFailure::ALL
                .iter()
                .zip(&self.failed)
                .map(|(k, n)| (*k, n.load(Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            busy: self.busy.load(Relaxed),
            accept_errors: self.accept_errors.load(Relaxed),
            spawn_errors: self.spawn_errors.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            reserved: self.reserved.load(Relaxed),
            pending,
        }
    }
}

impl std::fmt::Display for NodeStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "node {}: {} local messages, {} undeliverable here",
            self.node, self.local_messages, self.undeliverable
        )?;
        let h = &self.handshakes;
        if h.failed_total() + h.busy + h.accept_errors + h.spawn_errors + self.events_dropped > 0 {
            let why: Vec<String> = h.failed.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
            writeln!(
                f,
                "  handshakes failed: {} ({}); closed at once (too many in progress): {}; accept errors {}; spawn errors {}; events dropped {}",
                h.failed_total(),
                why.join(", "),
                h.busy,
                h.accept_errors,
                h.spawn_errors,
                self.events_dropped,
            )?;
        }
        let m = &self.membership;
        let sent = self.bytes_sent;
        writeln!(
            f,
            "  membership: in {} packets / {} B, out {} packets / {} B ({} probes, {} gossip, {} state), rate-limited {}, violations {}, dropped {}, members refused {} (SWIM full {}), datagrams refused {}, unsent {}; all peers: sent {} B",
            m.packets_in,
            m.bytes_in,
            m.packets_out,
            m.bytes_out,
            m.probes_out,
            m.gossip_out,
            m.state_out,
            m.rate_limited,
            m.violations,
            m.inputs_dropped,
            m.members_refused,
            m.swim_full,
            m.datagrams_refused,
            m.send_errors,
            sent,
        )?;
        let r = &self.requests;
        if r.sent > 0 {
            writeln!(
                f,
                "  requests: {} sent, {} answered, {} pending, {} timed out, {} cancelled, {} failed, {} refused; replies late {}, stray {}",
                r.sent,
                r.answered,
                r.pending,
                r.timed_out,
                r.cancelled,
                r.failed,
                r.refused,
                r.late_replies,
                r.stray_replies,
            )?;
        }
        // A member never talked to (connections on demand) is one line of zeros: a
        // thousand of them would bury the few that carry traffic, so they are counted.
        let untouched = self.peers.iter().filter(|p| p.is_untouched()).count();
        if untouched > 0 {
            writeln!(
                f,
                "  {untouched} more peer(s) never connected and never sent to (not listed)"
            )?;
        }
        for p in self.peers.iter().filter(|p| !p.is_untouched()) {
            writeln!(
                f,
                "  {:<12} {:<4} sent {} msgs / {} B in {} frames, {} writes ({} through; {:.1} msgs/write; flushes drained {} size {} timer {} single {}), recv {} msgs / {} B in {} frames ({} reads, {} led), queue high-water {} B, senders blocked {} us, failed {}, undeliverable at peer {}, protocol violations {}",
                p.peer,
                if p.connected { "up" } else { "down" },
                p.messages_sent,
                p.bytes_sent,
                p.frames_sent,
                p.writes,
                p.writes_through,
                p.messages_per_write(),
                p.flushes_drained,
                p.flushes_size,
                p.flushes_timer,
                p.flushes_single,
                p.messages_received,
                p.bytes_received,
                p.frames_received,
                p.reads,
                p.reads_led,
                p.queue_high_water,
                p.blocked_us,
                p.send_failed,
                p.undeliverable_reported,
                p.protocol_violations,
            )?;
            if !p.messages_per_write_histogram.is_empty() {
                let h: Vec<String> = p
                    .messages_per_write_histogram
                    .iter()
                    .map(|(lo, n)| format!("{lo}+:{n}"))
                    .collect();
                writeln!(f, "  {:<12}      messages per write: {}", "", h.join(" "))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str) -> PeerStats {
        PeerStats {
            peer: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn members_never_talked_to_are_counted_not_listed() {
        let mut s = NodeStats {
            node: "a".into(),
            ..Default::default()
        };
        s.peers = (0..1000).map(|i| peer(&format!("m{i}"))).collect();
        s.peers[7].connected = true;
        s.peers[9].frames_received = 1;
        s.peers[11].send_failed = 1;
        let text = s.to_string();
        assert!(text.contains("997 more peer(s) never connected"), "{text}");
        let listed: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("m") && !l.contains("membership:"))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(listed, ["m7", "m9", "m11"]);
        // A node with nothing untouched says nothing about it.
        s.peers.retain(|p| !p.is_untouched());
        assert!(!s.to_string().contains("more peer(s)"));
    }
}
