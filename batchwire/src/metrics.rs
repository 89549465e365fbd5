//! A node's counters through the [`metrics`] facade (feature `metrics`), for whatever
//! exporter the application installed (Prometheus, OpenTelemetry, StatsD...).
//!
//! Nothing is recorded on the hot path: the node already counts everything with one atomic
//! per batch or per event, and [`Node::publish_metrics`] copies those counters into the
//! facade when called (`batchwire node --metrics-listen` calls it every second). Names are
//! stable; labels are `node`, and `peer` where it matters:
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `batchwire_messages_sent_total`, `_received_total` | counter | node, peer |
//! | `batchwire_bytes_sent_total`, `_received_total` | counter | node, peer |
//! | `batchwire_frames_sent_total`, `_received_total` | counter | node, peer |
//! | `batchwire_writes_total`, `batchwire_writes_through_total` (made by a sending thread) | counter | node, peer |
//! | `batchwire_reads_total`, `batchwire_reads_led_total` (made by an application thread waiting for a reply or a message) | counter | node, peer |
//! | `batchwire_piece_bytes_in_place_total` (pieces read straight into their message's buffer) | counter | node, peer |
//! | `batchwire_writer_starts_total`, `batchwire_reader_rests_total` (threads ended and started again around idle time, see `NodeConfig::thread_linger`) | counter | node, peer |
//! | `batchwire_flushes_total` | counter | node, peer, reason (drained, size, timer, single) |
//! | `batchwire_resent_total`, `batchwire_acked_total` | counter | node, peer |
//! | `batchwire_connects_total` | counter | node, peer |
//! | `batchwire_send_failed_total` | counter | node, peer |
//! | `batchwire_protocol_violations_total` | counter | node, peer |
//! | `batchwire_undeliverable_reported_total` | counter | node, peer |
//! | `batchwire_fragments_sent_total`, `_received_total` | counter | node, peer |
//! | `batchwire_credit_stalls_total` | counter | node, peer |
//! | `batchwire_sender_blocked_microseconds_total` | counter | node, peer |
//! | `batchwire_peer_connected` | gauge (0, 1) | node, peer |
//! | `batchwire_unacked_bytes`, `batchwire_queued_messages`, `batchwire_queue_high_water_bytes` | gauge | node, peer |
//! | `batchwire_messages_per_write` | histogram (writes by messages carried, power-of-two buckets: each is recorded at its lower bound) | node, peer |
//! | `batchwire_disconnects_total` | counter (connections that ended) | node, peer |
//! | `batchwire_mailbox_depth` | gauge (messages waiting) | node, mailbox |
//! | `batchwire_handshakes_failed_total` | counter | node, reason |
//! | `batchwire_handshakes_busy_total`, `batchwire_accept_errors_total` | counter | node |
//! | `batchwire_undeliverable_total`, `batchwire_events_dropped_total` | counter | node |
//! | `batchwire_requests_pending` | gauge | node |
//! | `batchwire_requests_total` | counter | node, outcome (answered, timed_out, cancelled, failed, refused) |
//! | `batchwire_late_replies_total`, `batchwire_stray_replies_total` | counter | node |
//! | `batchwire_members` | gauge (members in this node's view) | node, state (alive, suspect, down, left) |
//! | `batchwire_membership_packets_total`, `batchwire_membership_bytes_total` | counter | node, direction (in, out) |
//! | `batchwire_membership_packets_sent_by_kind_total` | counter | node, kind (probe, gossip, state) |
//! | `batchwire_membership_dropped_total` | counter | node, reason (rate_limited, violation, behind, view_full, swim_full, refused, send_failed) |
//! | `batchwire_build_info` | gauge, always 1 | node, version |
//!
//! Every name is described (`# HELP` in Prometheus). The exporter decides how a histogram
//! is exposed: `batchwire node` gives `batchwire_messages_per_write` the power-of-two
//! buckets above (a Prometheus histogram, which aggregates across nodes); an exporter left
//! to its defaults may expose it as a summary.
//!
//! [`Node::publish_metrics`]: crate::node::Node::publish_metrics

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::event::{Member, MemberState};
use crate::stats::NodeStats;

/// The upper bounds of `batchwire_messages_per_write`'s buckets (powers of two, as the
/// node counts them): for an exporter that takes buckets, such as Prometheus's.
pub const MESSAGES_PER_WRITE_BUCKETS: [f64; 17] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0,
];

/// Describe every metric once per recorder (the `# HELP` lines).
fn describe() {
    let c = |name: &'static str, help: &'static str| describe_counter!(name, help);
    let g = |name: &'static str, help: &'static str| describe_gauge!(name, help);
    c(
        "batchwire_messages_sent_total",
        "Messages sent to the peer (accepted by send).",
    );
    c(
        "batchwire_messages_received_total",
        "Messages received from the peer.",
    );
    describe_counter!(
        "batchwire_bytes_sent_total",
        Unit::Bytes,
        "Payload bytes sent to the peer."
    );
    describe_counter!(
        "batchwire_bytes_received_total",
        Unit::Bytes,
        "Payload bytes received from the peer."
    );
    c("batchwire_frames_sent_total", "Frames written to the peer.");
    c(
        "batchwire_frames_received_total",
        "Frames read from the peer.",
    );
    c("batchwire_writes_total", "Socket writes toward the peer.");
    c(
        "batchwire_writes_through_total",
        "Of the writes, those a sending thread made itself (write-through).",
    );
    c(
        "batchwire_reads_total",
        "Reads of the peer's connections that returned bytes, by any thread.",
    );
    c(
        "batchwire_reads_led_total",
        "Reads of the peer's connection made by an application thread waiting for a reply or a message.",
    );
    c(
        "batchwire_writer_starts_total",
        "Writer threads started for the peer (one ends after thread_linger with nothing to write).",
    );
    c(
        "batchwire_reader_rests_total",
        "Times the reader thread of the peer's connection ended because the connection went idle.",
    );
    describe_counter!(
        "batchwire_piece_bytes_in_place_total",
        Unit::Bytes,
        "Bytes of large messages' pieces read straight into their message's buffer."
    );
    c("batchwire_flushes_total", "Bundler flushes, by reason.");
    c(
        "batchwire_resent_total",
        "Messages written again on a new connection after a break.",
    );
    c("batchwire_acked_total", "Messages the peer acknowledged.");
    c(
        "batchwire_connects_total",
        "Connections to the peer established.",
    );
    c(
        "batchwire_disconnects_total",
        "Connections to the peer that ended.",
    );
    c(
        "batchwire_send_failed_total",
        "Messages to the peer reported failed (SendFailed).",
    );
    c(
        "batchwire_protocol_violations_total",
        "Connections closed because the peer broke the protocol.",
    );
    c(
        "batchwire_undeliverable_reported_total",
        "Messages the peer reported undeliverable (no such mailbox).",
    );
    c(
        "batchwire_fragments_sent_total",
        "Pieces of large messages sent.",
    );
    c(
        "batchwire_fragments_received_total",
        "Pieces of large messages received.",
    );
    c(
        "batchwire_credit_stalls_total",
        "Sends that found their mailbox's credit at the peer used up.",
    );
    describe_counter!(
        "batchwire_sender_blocked_microseconds_total",
        Unit::Microseconds,
        "Time senders spent blocked on a full queue or used-up credit."
    );
    g(
        "batchwire_peer_connected",
        "1 while a connection to the peer is up.",
    );
    describe_gauge!(
        "batchwire_unacked_bytes",
        Unit::Bytes,
        "Bytes held for the peer until it acknowledges them."
    );
    g(
        "batchwire_queued_messages",
        "Messages waiting in the outbound queue.",
    );
    describe_gauge!(
        "batchwire_queue_high_water_bytes",
        Unit::Bytes,
        "Most bytes ever waiting in the outbound queue."
    );
    describe_histogram!(
        "batchwire_messages_per_write",
        "Messages carried by one socket write."
    );
    g(
        "batchwire_mailbox_depth",
        "Messages waiting in the mailbox.",
    );
    c(
        "batchwire_handshakes_failed_total",
        "Connections that failed their handshake, by reason.",
    );
    c(
        "batchwire_handshakes_busy_total",
        "Inbound connections closed because too many handshakes were in progress.",
    );
    c(
        "batchwire_accept_errors_total",
        "Failed accept calls (out of file descriptors, say).",
    );
    c(
        "batchwire_undeliverable_total",
        "Messages that arrived for a mailbox that does not exist here.",
    );
    c(
        "batchwire_events_dropped_total",
        "Events dropped because a subscriber did not keep up.",
    );
    g(
        "batchwire_requests_pending",
        "Requests waiting for their reply.",
    );
    c(
        "batchwire_requests_total",
        "Requests made from this node, by outcome.",
    );
    c(
        "batchwire_late_replies_total",
        "Replies that came after their request timed out or was cancelled.",
    );
    c(
        "batchwire_stray_replies_total",
        "Replies to requests this node never made.",
    );
    g(
        "batchwire_members",
        "Members in this node's view, by state.",
    );
    c(
        "batchwire_membership_packets_total",
        "Membership packets, by direction.",
    );
    c(
        "batchwire_membership_packets_sent_by_kind_total",
        "Membership packets sent: probes and their answers, gossip, full-state answers.",
    );
    describe_counter!(
        "batchwire_membership_bytes_total",
        Unit::Bytes,
        "Membership bytes, by direction."
    );
    c(
        "batchwire_membership_dropped_total",
        "Membership packets (or members) not taken, by reason.",
    );
    g("batchwire_build_info", "Always 1; the version in a label.");
}

/// Whether this process described the metrics (once: a recorder installed later by the
/// application misses the descriptions, not the values).
static DESCRIBED: OnceLock<()> = OnceLock::new();

/// Per (node, peer): the messages-per-write buckets already published (the facade takes
/// histogram samples, the node keeps counts: what is new since is recorded).
type Published = Mutex<HashMap<(String, String), Vec<(u64, u64)>>>;

fn published() -> &'static Published {
    static P: OnceLock<Published> = OnceLock::new();
    P.get_or_init(Default::default)
}

impl NodeStats {
    /// Copy these figures into the `metrics` facade (see the module documentation).
    pub fn publish_metrics(&self) {
        self.publish_with(&[], &[]);
    }

    /// [`NodeStats::publish_metrics`], the depth of each mailbox and the members by state.
    pub(crate) fn publish_with(&self, depths: &[(String, usize)], members: &[Member]) {
        DESCRIBED.get_or_init(describe);
        for (mailbox, n) in depths {
            let l = [("node", self.node.clone()), ("mailbox", mailbox.clone())];
            gauge!("batchwire_mailbox_depth", &l).set(*n as f64);
        }
        let node = self.node.clone();
        for p in &self.peers {
            let l = [("node", node.clone()), ("peer", p.peer.clone())];
            let c = |name: &'static str, v: u64| counter!(name, &l).absolute(v);
            c("batchwire_messages_sent_total", p.messages_sent);
            c("batchwire_messages_received_total", p.messages_received);
            c("batchwire_bytes_sent_total", p.bytes_sent);
            c("batchwire_bytes_received_total", p.bytes_received);
            c("batchwire_frames_sent_total", p.frames_sent);
            c("batchwire_frames_received_total", p.frames_received);
            c("batchwire_writes_total", p.writes);
            c("batchwire_resent_total", p.resent);
            c("batchwire_acked_total", p.acked);
            c("batchwire_connects_total", p.connects);
            c("batchwire_send_failed_total", p.send_failed);
            c("batchwire_protocol_violations_total", p.protocol_violations);
            c(
                "batchwire_undeliverable_reported_total",
                p.undeliverable_reported,
            );
            c("batchwire_fragments_sent_total", p.fragments_sent);
            c("batchwire_fragments_received_total", p.fragments_received);
            c("batchwire_credit_stalls_total", p.credit_stalls);
            c("batchwire_writes_through_total", p.writes_through);
            c("batchwire_reads_total", p.reads);
            c("batchwire_reads_led_total", p.reads_led);
            c("batchwire_writer_starts_total", p.writer_starts);
            c("batchwire_reader_rests_total", p.reader_rests);
            c(
                "batchwire_piece_bytes_in_place_total",
                p.piece_bytes_in_place,
            );
            for (reason, v) in [
                ("drained", p.flushes_drained),
                ("size", p.flushes_size),
                ("timer", p.flushes_timer),
                ("single", p.flushes_single),
            ] {
                let l = [
                    ("node", node.clone()),
                    ("peer", p.peer.clone()),
                    ("reason", reason.to_string()),
                ];
                counter!("batchwire_flushes_total", &l).absolute(v);
            }
            counter!("batchwire_sender_blocked_microseconds_total", &l).absolute(p.blocked_us);
            gauge!("batchwire_peer_connected", &l).set(if p.connected { 1.0 } else { 0.0 });
            gauge!("batchwire_unacked_bytes", &l).set(p.unacked_bytes as f64);
            gauge!("batchwire_queued_messages", &l).set(p.queued as f64);
            gauge!("batchwire_queue_high_water_bytes", &l).set(p.queue_high_water as f64);
            counter!("batchwire_disconnects_total", &l)
                .absolute(p.connects.saturating_sub(p.connected as u64));
            let h = histogram!("batchwire_messages_per_write", &l);
            let mut last = published().lock().unwrap_or_else(|e| e.into_inner());
            let seen = last.entry((node.clone(), p.peer.clone())).or_default();
            for &(bucket, count) in &p.messages_per_write_histogram {
                let before = seen.iter().find(|(b, _)| *b == bucket).map_or(0, |x| x.1);
                if count > before {
                    h.record_many(bucket as f64, (count - before) as usize);
                }
            }
            *seen = p.messages_per_write_histogram.clone();
        }
        let l = [("node", node.clone())];
        for (kind, v) in &self.handshakes.failed {
            let l = [
                ("node", node.clone()),
                ("reason", format!("{kind:?}").to_lowercase()),
            ];
            counter!("batchwire_handshakes_failed_total", &l).absolute(*v);
        }
        counter!("batchwire_handshakes_busy_total", &l).absolute(self.handshakes.busy);
        counter!("batchwire_accept_errors_total", &l).absolute(self.handshakes.accept_errors);
        counter!("batchwire_undeliverable_total", &l).absolute(self.undeliverable);
        counter!("batchwire_events_dropped_total", &l).absolute(self.events_dropped);
        let r = &self.requests;
        gauge!("batchwire_requests_pending", &l).set(r.pending as f64);
        for (outcome, v) in [
            ("answered", r.answered),
            ("timed_out", r.timed_out),
            ("cancelled", r.cancelled),
            ("failed", r.failed),
            ("refused", r.refused),
        ] {
            let l = [("node", node.clone()), ("outcome", outcome.to_string())];
            counter!("batchwire_requests_total", &l).absolute(v);
        }
        counter!("batchwire_late_replies_total", &l).absolute(r.late_replies);
        counter!("batchwire_stray_replies_total", &l).absolute(r.stray_replies);
        let m = &self.membership;
        for (dir, packets, bytes) in [
            ("in", m.packets_in, m.bytes_in),
            ("out", m.packets_out, m.bytes_out),
        ] {
            let l = [("node", node.clone()), ("direction", dir.to_string())];
            counter!("batchwire_membership_packets_total", &l).absolute(packets);
            counter!("batchwire_membership_bytes_total", &l).absolute(bytes);
        }
        for (kind, v) in [
            ("probe", m.probes_out),
            ("gossip", m.gossip_out),
            ("state", m.state_out),
        ] {
            let l = [("node", node.clone()), ("kind", kind.to_string())];
            counter!("batchwire_membership_packets_sent_by_kind_total", &l).absolute(v);
        }
        for (reason, v) in [
            ("rate_limited", m.rate_limited),
            ("violation", m.violations),
            ("behind", m.inputs_dropped),
            ("view_full", m.members_refused),
            ("swim_full", m.swim_full),
            ("refused", m.datagrams_refused),
            ("send_failed", m.send_errors),
        ] {
            let l = [("node", node.clone()), ("reason", reason.to_string())];
            counter!("batchwire_membership_dropped_total", &l).absolute(v);
        }
        for state in MemberState::ALL {
            let n = members.iter().filter(|x| x.state == state).count();
            let l = [("node", node.clone()), ("state", state.name().to_string())];
            gauge!("batchwire_members", &l).set(n as f64);
        }
        let l = [
            ("node", node.clone()),
            ("version", env!("CARGO_PKG_VERSION").to_string()),
        ];
        gauge!("batchwire_build_info", &l).set(1.0);
    }
}
