//! Reading the secret, and checking a whole configuration: every value in range, every
//! pair of values that must agree.

use super::*;

impl NodeConfig {
    /// Read the cluster secret from a file (trailing newlines are not part of it).
    pub fn read_secret(path: &Path) -> Result<Vec<u8>, Error> {
        let mut s = std::fs::read(path).map_err(|e| {
            Error::Config(format!("cannot read secret file {}: {e}", path.display()))
        })?;
        while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            s.pop();
        }
        if s.is_empty() {
            return Err(Error::Config(format!(
                "secret file {} is empty",
                path.display()
            )));
        }
        Ok(s)
    }

    /// The largest frame a receiver accepts: what any batchwire node sends (frames and
    /// pieces are at most 1 MiB each, see `validate`).
    pub(crate) fn max_frame(&self) -> usize {
        batchwire_core::frame::MAX_FRAME_LEN
    }

    /// Check every setting against its allowed range (out-of-range values would spin a
    /// CPU, abort on an allocation, or wedge the node): the error names the setting as a
    /// node file spells it, its value and the range.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Config(m));
        if self.secret.is_empty() {
            return bad("the cluster secret is empty".into());
        }
        const KIB: usize = 1 << 10;
        const MIB: usize = 1 << 20;
        const GIB: usize = 1 << 30;
        let s = &self.session;
        for (key, v, lo, hi) in [
            ("send_queue_bytes", self.send_queue_bytes, 1, GIB),
            ("mailbox_bytes", self.mailbox_bytes, 1, 4 * GIB),
            (
                "max_payload",
                self.max_payload,
                1,
                MAX_PAYLOAD_LIMIT as usize,
            ),
            ("frame_bytes", self.frame_bytes, 1, MIB),
            ("fragment_bytes", self.fragment_bytes, 1, MIB),
            ("by_reference_bytes", self.by_reference_bytes, 1, usize::MAX),
            ("bulk_inflight_bytes", s.bulk_inflight, 1, GIB),
            ("bulk_stream_bytes", s.bulk_stream, 1, GIB),
            ("read_bytes", self.read_bytes, 1, 16 * MIB),
            ("unacked_bytes", s.unacked_bytes, 1, GIB),
            ("ack_every_bytes", s.ack_every_bytes, 1, GIB),
            ("ack_every_messages", s.ack_every as usize, 1, MIB),
            ("max_handshakes", self.max_handshakes, 1, 64 * KIB),
            (
                "max_handshakes_per_address",
                self.max_handshakes_per_address,
                1,
                64 * KIB,
            ),
            ("max_peers", self.max_peers, 1, 64 * KIB),
            // Each subscriber's queue is allocated whole.
            ("events_capacity", self.events_capacity, 1, MIB),
            (
                "max_pending_requests",
                self.max_pending_requests,
                1,
                16 * MIB,
            ),
            ("bundler_max_size", self.bundler.max_size, 1, 16 * MIB),
        ] {
            if v < lo || v > hi {
                return bad(format!(
                    "{key} = {v} is out of range: allowed {lo} ..= {hi}"
                ));
            }
        }
        if let Some(r) = self.reassembly_bytes
            && (r < self.max_payload || r > 1 << 40)
        {
            return bad(format!(
                "reassembly_bytes = {r} is out of range: allowed max_payload ({}) ..= {}",
                self.max_payload,
                1u64 << 40
            ));
        }
        let ms = |d: Duration| d.as_millis();
        const MS: Duration = Duration::from_millis(1);
        const MINUTE: Duration = Duration::from_secs(60);
        const HOUR: Duration = Duration::from_secs(3600);
        for (key, v, lo, hi) in [
            ("heartbeat_interval_ms", s.heartbeat_interval, MS, MINUTE),
            ("peer_timeout_ms", s.peer_timeout, 2 * MS, HOUR),
            (
                "ack_delay_ms",
                s.ack_delay,
                Duration::ZERO,
                10 * MINUTE / 60,
            ),
            (
                "handshake_timeout_ms",
                self.handshake_timeout,
                MS,
                10 * MINUTE,
            ),
            ("write_check_ms", self.write_check, MS, MINUTE),
            ("thread_linger_ms", self.thread_linger, MS, HOUR),
            (
                "shutdown_timeout_ms",
                self.shutdown_timeout,
                Duration::ZERO,
                HOUR,
            ),
            ("reconnect_min_ms", self.reconnect_min, MS, MINUTE),
            ("join_refresh_ms", self.join_refresh, 100 * MS, HOUR),
            (
                "idle_close_ms",
                self.idle_close.unwrap_or(HOUR),
                100 * MS,
                24 * HOUR,
            ),
            ("reconnect_max_ms", self.reconnect_max, MS, HOUR),
        ] {
            if v < lo || v > hi {
                return bad(format!(
                    "{key} = {} is out of range: allowed {} ..= {}",
                    ms(v),
                    ms(lo),
                    ms(hi)
                ));
            }
        }
        // In microseconds, as the file gives it.
        let max_delay = self.bundler.max_delay;
        if max_delay > Duration::from_secs(10) {
            return bad(format!(
                "bundler_max_delay_us = {} is out of range: allowed 0 ..= 10000000",
                max_delay.as_micros()
            ));
        }
        if self.reconnect_max < self.reconnect_min {
            return bad(format!(
                "reconnect_max_ms = {} must be at least reconnect_min_ms = {}",
                ms(self.reconnect_max),
                ms(self.reconnect_min)
            ));
        }
        batchwire_core::idle::IdleStrategy::from_level(self.idle_cpu_level)
            .map_err(Error::Config)?;
        if s.peer_timeout <= s.heartbeat_interval {
            return bad(format!(
                "peer_timeout ({:?}) must be longer than heartbeat_interval ({:?})",
                s.peer_timeout, s.heartbeat_interval
            ));
        }
        if let Some(m) = &self.membership {
            m.validate().map_err(|e| Error::Config(e.to_string()))?;
        }
        for seed in &self.seeds {
            seed.check()
                .map_err(|e| Error::Config(format!("join: {e}")))?;
        }
        if !self.seeds.is_empty() && self.membership.is_none() {
            return bad("join (seeds) needs the membership layer, which is off".into());
        }
        Ok(())
    }
}
