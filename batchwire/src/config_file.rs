//! [`NodeFile`]: every setting of a node as data, for a configuration file in any format
//! serde reads (TOML, JSON, YAML...). `batchwire node --config node.toml` uses it, and
//! `batchwire node --print-config` prints every key with its default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::certs::TlsFiles;
use crate::config::{NodeConfig, PeerSpec};
use crate::error::Error;
use batchwire_core::bundler::BundlerKind;
use batchwire_core::membership::MembershipConfig;

/// A node's settings as a file has them. Every key is optional except that `name`,
/// `listen` and `secret_file` must be there by the time [`NodeFile::into_config`] is
/// called; unknown keys are refused. Sizes are in bytes, times in the unit their name says;
/// each key is the [`NodeConfig`] method of the same name.
///
/// Usually read from a file with the serde format of your choice, e.g.
/// `toml::from_str::<NodeFile>(&text)?.into_config()?`; or filled in by hand:
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("bw-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let secret = dir.join("secret");
/// # std::fs::write(&secret, "s3cret")?;
/// let mut file = batchwire::NodeFile::default();
/// file.name = Some("a".into());
/// file.listen = Some("127.0.0.1:7001".parse()?);
/// file.secret_file = Some(secret);
/// file.peers = vec!["b=127.0.0.1:7002".into()];
/// file.mailbox_bytes = Some(1 << 20);
/// let config = file.into_config()?;
/// # let _ = config;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeFile {
    /// This node's name, unique in the cluster.
    pub name: Option<String>,
    /// The address to listen on.
    pub listen: Option<SocketAddr>,
    /// The file holding the cluster secret (trailing newlines are not part of it).
    pub secret_file: Option<PathBuf>,
    /// "NAME=HOST:PORT" each.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Mailboxes that exist from the start.
    #[serde(default)]
    pub mailboxes: Vec<String>,
    /// none, natural, per-destination, transfer-queue or linger.
    pub bundler: Option<String>,
    /// [`NodeConfig::bundler_max_size`].
    pub bundler_max_size: Option<usize>,
    /// [`NodeConfig::bundler_max_delay`], in microseconds.
    pub bundler_max_delay_us: Option<u64>,
    /// [`NodeConfig::idle_cpu_level`].
    pub idle_cpu_level: Option<u8>,
    /// [`NodeConfig::send_queue_bytes`].
    pub send_queue_bytes: Option<usize>,
    /// [`NodeConfig::mailbox_bytes`].
    pub mailbox_bytes: Option<usize>,
    /// [`NodeConfig::max_payload`].
    pub max_payload: Option<usize>,
    /// [`NodeConfig::frame_bytes`].
    pub frame_bytes: Option<usize>,
    /// [`NodeConfig::fragment_bytes`].
    pub fragment_bytes: Option<usize>,
    /// [`NodeConfig::by_reference_bytes`].
    pub by_reference_bytes: Option<usize>,
    /// [`NodeConfig::bulk_inflight_bytes`].
    pub bulk_inflight_bytes: Option<usize>,
    /// [`NodeConfig::bulk_stream_bytes`].
    pub bulk_stream_bytes: Option<usize>,
    /// [`NodeConfig::read_bytes`].
    pub read_bytes: Option<usize>,
    /// [`NodeConfig::reassembly_bytes`].
    pub reassembly_bytes: Option<usize>,
    /// [`NodeConfig::unacked_bytes`].
    pub unacked_bytes: Option<usize>,
    /// [`NodeConfig::reliable`] (default true; the same on every node).
    pub reliable: Option<bool>,
    /// [`NodeConfig::ack_every`]'s message count.
    pub ack_every_messages: Option<u64>,
    /// [`NodeConfig::ack_every`]'s byte count.
    pub ack_every_bytes: Option<usize>,
    /// [`NodeConfig::ack_every`]'s delay, in milliseconds.
    pub ack_delay_ms: Option<u64>,
    /// [`NodeConfig::max_pending_requests`].
    pub max_pending_requests: Option<usize>,
    /// [`NodeConfig::reconnect`]'s first pause, in milliseconds (default 50).
    pub reconnect_min_ms: Option<u64>,
    /// [`NodeConfig::reconnect`]'s largest pause, in milliseconds (default 2000).
    pub reconnect_max_ms: Option<u64>,
    /// [`NodeConfig::handshake_timeout`], in milliseconds.
    pub handshake_timeout_ms: Option<u64>,
    /// [`NodeConfig::max_handshakes`].
    pub max_handshakes: Option<usize>,
    /// [`NodeConfig::max_handshakes_per_address`].
    pub max_handshakes_per_address: Option<usize>,
    /// [`NodeConfig::max_peers`].
    pub max_peers: Option<usize>,
    /// [`NodeConfig::events_capacity`].
    pub events_capacity: Option<usize>,
    /// [`NodeConfig::shutdown_timeout`], in milliseconds.
    pub shutdown_timeout_ms: Option<u64>,
    /// [`NodeConfig::write_check`], in milliseconds.
    pub write_check_ms: Option<u64>,
    /// [`NodeConfig::thread_linger`], in milliseconds.
    pub thread_linger_ms: Option<u64>,
    /// [`NodeConfig::heartbeat_interval`], in milliseconds.
    pub heartbeat_interval_ms: Option<u64>,
    /// [`NodeConfig::peer_timeout`], in milliseconds.
    pub peer_timeout_ms: Option<u64>,
    /// [`NodeConfig::join`]: seeds of a running cluster, each "HOST:PORT" (an address or
    /// a DNS name, see [`crate::seed::Seed`]).
    #[serde(default)]
    pub join: Vec<String>,
    /// [`NodeConfig::join_refresh`], in milliseconds (default 30000).
    pub join_refresh_ms: Option<u64>,
    /// [`NodeConfig::idle_close`], in milliseconds (default 60000): connections to members
    /// are made on the first send and closed after this long idle; 0: every member is
    /// dialled when it joins and its connection kept (the full mesh).
    pub idle_close_ms: Option<u64>,
    /// [`NodeConfig::advertise`].
    pub advertise: Option<SocketAddr>,
    /// Membership on (default) or off ([`NodeConfig::without_membership`]).
    pub membership: Option<bool>,
    /// [`MembershipConfig::probe_period`], in milliseconds.
    pub probe_period_ms: Option<u64>,
    /// [`MembershipConfig::probe_rtt`], in milliseconds.
    pub probe_rtt_ms: Option<u64>,
    /// [`MembershipConfig::suspicion_timeout`], in milliseconds.
    pub suspicion_timeout_ms: Option<u64>,
    /// [`MembershipConfig::gossip_period`], in milliseconds.
    pub gossip_period_ms: Option<u64>,
    /// [`MembershipConfig::announce_period`], in milliseconds.
    pub announce_period_ms: Option<u64>,
    /// [`MembershipConfig::forget_down_after`], in milliseconds.
    pub forget_down_after_ms: Option<u64>,
    /// [`MembershipConfig::frames_per_second`].
    pub frames_per_second: Option<u64>,
    /// [`MembershipConfig::max_members`] (set it above the cluster's size).
    pub max_members: Option<u64>,
    /// Mutual TLS on every connection.
    pub tls: Option<TlsSection>,
}

/// `[tls]`: mutual TLS on every connection (all three files, PEM).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// This node's certificate (it must name the node).
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
    /// The CA that signed every node's certificate.
    pub ca: PathBuf,
}

impl NodeFile {
    /// The [`NodeConfig`] these settings make (reading the secret file). A missing
    /// essential, a bad peer or bundler name, or an inconsistent value is an
    /// `Error::Config` naming the key. (Limits are checked again by `Node::start`.)
    pub fn into_config(self) -> Result<NodeConfig, Error> {
        let bad = |m: String| Error::Config(m);
        let missing = |key: &str| bad(format!("missing `{key}`"));
        let name = self.name.ok_or_else(|| missing("name"))?;
        let listen = self.listen.ok_or_else(|| missing("listen"))?;
        let secret_file = self.secret_file.ok_or_else(|| missing("secret_file"))?;
        let secret = NodeConfig::read_secret(&secret_file)?;
        let mut cfg = NodeConfig::new(name, listen, secret);
        let mut peers = Vec::new();
        for p in &self.peers {
            let spec: PeerSpec = p.parse().map_err(|e| bad(format!("`peers`: {p:?}: {e}")))?;
            peers.push(spec);
        }
        cfg = cfg.with_peers(peers);
        for m in self.mailboxes {
            cfg = cfg.mailbox(m);
        }
        if let Some(s) = self.bundler {
            let kind = s
                .parse::<BundlerKind>()
                .map_err(|e| bad(format!("`bundler`: {e}")))?;
            cfg = cfg.bundler(kind);
        }
        if let Some(v) = self.bundler_max_size {
            cfg = cfg.bundler_max_size(v);
        }
        if let Some(v) = self.bundler_max_delay_us {
            cfg = cfg.bundler_max_delay(Duration::from_micros(v));
        }
        if let Some(v) = self.idle_cpu_level {
            cfg = cfg.idle_cpu_level(v);
        }
        let ms = Duration::from_millis;
        macro_rules! set {
            ($($key:ident => $method:ident $(via $conv:ident)?),* $(,)?) => {
                $( if let Some(v) = self.$key { cfg = cfg.$method($($conv)?(v)); } )*
            };
        }
        set!(
            send_queue_bytes => send_queue_bytes,
            mailbox_bytes => mailbox_bytes,
            max_payload => max_payload,
            frame_bytes => frame_bytes,
            fragment_bytes => fragment_bytes,
            by_reference_bytes => by_reference_bytes,
            bulk_inflight_bytes => bulk_inflight_bytes,
            bulk_stream_bytes => bulk_stream_bytes,
            read_bytes => read_bytes,
            reassembly_bytes => reassembly_bytes,
            unacked_bytes => unacked_bytes,
            max_peers => max_peers,
            events_capacity => events_capacity,
            max_handshakes => max_handshakes,
            max_handshakes_per_address => max_handshakes_per_address,
            max_pending_requests => max_pending_requests,
            reliable => reliable,
            handshake_timeout_ms => handshake_timeout via ms,
            shutdown_timeout_ms => shutdown_timeout via ms,
            write_check_ms => write_check via ms,
            thread_linger_ms => thread_linger via ms,
            heartbeat_interval_ms => heartbeat_interval via ms,
            peer_timeout_ms => peer_timeout via ms,
        );
        if self.ack_every_messages.is_some()
            || self.ack_every_bytes.is_some()
            || self.ack_delay_ms.is_some()
        {
            let s = &cfg.session;
            let (m, b, d) = (
                self.ack_every_messages.unwrap_or(s.ack_every),
                self.ack_every_bytes.unwrap_or(s.ack_every_bytes),
                self.ack_delay_ms.map_or(s.ack_delay, ms),
            );
            cfg = cfg.ack_every(m, b, d);
        }
        if self.reconnect_min_ms.is_some() || self.reconnect_max_ms.is_some() {
            let min = ms(self.reconnect_min_ms.unwrap_or(50));
            let max = ms(self.reconnect_max_ms.unwrap_or(2000));
            if min > max {
                return Err(bad(format!(
                    "`reconnect_min_ms` ({min:?}) is above `reconnect_max_ms` ({max:?})"
                )));
            }
            cfg = cfg.reconnect(min, max);
        }
        for s in &self.join {
            let seed: crate::seed::Seed = s.parse().map_err(|e| bad(format!("`join`: {e}")))?;
            cfg = cfg.join(seed);
        }
        if let Some(v) = self.idle_close_ms {
            cfg = cfg.idle_close((v > 0).then(|| ms(v)));
        }
        if let Some(v) = self.join_refresh_ms {
            cfg = cfg.join_refresh(ms(v));
        }
        if let Some(a) = self.advertise {
            cfg = cfg.advertise(a);
        }
        let tuned = [
            self.probe_period_ms,
            self.probe_rtt_ms,
            self.suspicion_timeout_ms,
            self.gossip_period_ms,
            self.announce_period_ms,
            self.forget_down_after_ms,
            self.frames_per_second,
            self.max_members,
        ];
        if self.membership == Some(false) {
            if !self.join.is_empty() || tuned.iter().any(Option::is_some) {
                return Err(bad(
                    "`membership = false` with membership settings or `join`".into(),
                ));
            }
            cfg = cfg.without_membership();
        } else if tuned.iter().any(Option::is_some) {
            let mut m = MembershipConfig::default();
            let set = |v: Option<u64>, d: &mut Duration| {
                if let Some(v) = v {
                    *d = ms(v);
                }
            };
            set(self.probe_period_ms, &mut m.probe_period);
            set(self.probe_rtt_ms, &mut m.probe_rtt);
            set(self.suspicion_timeout_ms, &mut m.suspicion_timeout);
            set(self.gossip_period_ms, &mut m.gossip_period);
            set(self.announce_period_ms, &mut m.announce_period);
            set(self.forget_down_after_ms, &mut m.forget_down_after);
            let too_large = |key: &str, v: u64| bad(format!("{key} = {v} is out of range"));
            if let Some(v) = self.frames_per_second {
                m.frames_per_second =
                    u32::try_from(v).map_err(|_| too_large("frames_per_second", v))?;
            }
            if let Some(v) = self.max_members {
                m.max_members = usize::try_from(v).map_err(|_| too_large("max_members", v))?;
            }
            cfg = cfg.membership(m);
        }
        if let Some(t) = self.tls {
            cfg = cfg.tls(TlsFiles {
                cert: t.cert,
                key: t.key,
                ca: t.ca,
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys the README once promised but the file lacked: reliability, acknowledgement
    /// pacing (each part alone keeps the others' defaults) and the request table's bound.
    #[test]
    fn acknowledgements_reliability_and_requests_can_be_set_from_a_file() {
        let dir = std::env::temp_dir().join(format!("bw-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let f = NodeFile {
            name: Some("a".into()),
            listen: Some("127.0.0.1:1".parse().unwrap()),
            secret_file: Some(secret),
            reliable: Some(false),
            ack_every_messages: Some(7),
            ack_delay_ms: Some(9),
            max_pending_requests: Some(11),
            ..NodeFile::default()
        };
        let cfg = f.into_config().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!cfg.session.reliable);
        assert_eq!(cfg.session.ack_every, 7);
        assert_eq!(cfg.session.ack_every_bytes, 1 << 20, "the default kept");
        assert_eq!(cfg.session.ack_delay, Duration::from_millis(9));
        assert_eq!(cfg.max_pending_requests, 11);
    }

    /// Every membership setting can come from the file (`max_members` above all: a
    /// cluster larger than 1024 members needs it).
    #[test]
    fn membership_settings_can_be_set_from_a_file() {
        let dir = std::env::temp_dir().join(format!("bw-config-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let f = |max_members| NodeFile {
            name: Some("a".into()),
            listen: Some("127.0.0.1:1".parse().unwrap()),
            secret_file: Some(secret.clone()),
            announce_period_ms: Some(5000),
            forget_down_after_ms: Some(60_000),
            frames_per_second: Some(50),
            max_members: Some(max_members),
            ..NodeFile::default()
        };
        let cfg = f(4096).into_config().unwrap();
        let m = cfg.membership_config().unwrap();
        assert_eq!(m.announce_period, Duration::from_secs(5));
        assert_eq!(m.forget_down_after, Duration::from_secs(60));
        assert_eq!((m.frames_per_second, m.max_members), (50, 4096));
        assert_eq!(m.probe_period, Duration::from_secs(1), "the default kept");
        // Out of range: named at start, by the membership's own check.
        let e = f(1 << 40).into_config().unwrap().validate().unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.to_string().contains("max_members"), "{e}");
    }
}
