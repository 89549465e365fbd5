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
//! | `batchwire_reads_led_total` (made by an application thread waiting for a reply or a message) | counter | node, peer |
//! | `batchwire_piece_bytes_in_place_total` (pieces read straight into their message's buffer) | counter | node, peer |
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
//!
//! [`Node::publish_metrics`]: crate::Node::publish_metrics

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics::{counter, gauge, histogram};

use crate::stats::NodeStats;

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
        self.publish_with_mailboxes(&[]);
    }

    /// [`NodeStats::publish_metrics`], and the depth of each mailbox.
    pub(crate) fn publish_with_mailboxes(&self, depths: &[(String, usize)]) {
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
            c("batchwire_reads_led_total", p.reads_led);
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
    }
}
