//! `batchwire node --config node.toml`: every setting of a node in one file. Flags given
//! on the command line win over the file; what neither says keeps the library's default.
//! `batchwire node --print-config` prints [`DEFAULTS`], a commented file of them all.
//!
//! Unknown keys and bad values are refused with the key and the reason (and, from the TOML
//! parser, the line and column).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use batchwire::{BundlerKind, NodeConfig, PeerSpec, TlsFiles};
use serde::Deserialize;

/// The node's settings as the file has them; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    pub name: Option<String>,
    pub listen: Option<SocketAddr>,
    pub secret_file: Option<PathBuf>,
    /// "NAME=HOST:PORT" each.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Mailboxes that exist from the start, besides "echo".
    #[serde(default)]
    pub mailboxes: Vec<String>,
    pub bundler: Option<String>,
    pub bundler_max_size: Option<usize>,
    pub bundler_max_delay_us: Option<u64>,
    pub idle_cpu_level: Option<u8>,
    pub stats_every_secs: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    pub send_queue_bytes: Option<usize>,
    pub mailbox_bytes: Option<usize>,
    pub max_payload: Option<usize>,
    pub frame_bytes: Option<usize>,
    pub fragment_bytes: Option<usize>,
    pub bulk_inflight_bytes: Option<usize>,
    pub read_bytes: Option<usize>,
    pub unacked_bytes: Option<usize>,
    pub reconnect_min_ms: Option<u64>,
    pub reconnect_max_ms: Option<u64>,
    pub handshake_timeout_ms: Option<u64>,
    pub max_handshakes: Option<usize>,
    pub max_handshakes_per_address: Option<usize>,
    pub max_peers: Option<usize>,
    pub events_capacity: Option<usize>,
    pub shutdown_timeout_ms: Option<u64>,
    pub write_check_ms: Option<u64>,
    pub heartbeat_interval_ms: Option<u64>,
    pub peer_timeout_ms: Option<u64>,
    pub tls: Option<TlsSection>,
}

/// `[tls]`: mutual TLS on every connection (all three files).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// Every setting with its default, as `--print-config` prints it.
pub const DEFAULTS: &str = r#"# batchwire node configuration (TOML). Every key is optional here; name, listen and
# secret_file must be given here or as flags (--name, --listen, --secret-file). Flags win
# over this file. Sizes are in bytes, times in the unit their name says.

# This node's name, unique in the cluster, and the address it listens on.
# name = "a"
# listen = "127.0.0.1:7001"
# The file holding the cluster secret (trailing newlines are not part of it).
# secret_file = "secret"
# Peers, "NAME=HOST:PORT" (IPv6: "b=[::1]:7002").
# peers = ["b=127.0.0.1:7002"]
# Mailboxes that exist from the start (the node always serves "echo").
# mailboxes = []

# Bundler: none, natural, per-destination, transfer-queue or linger; its largest batch and,
# for linger, how long it waits for company.
# bundler = "natural"
# bundler_max_size = 65536
# bundler_max_delay_us = 1000
# How transport threads idle: 1 (park at once) ..= 10 (busy-spin).
# idle_cpu_level = 1
# Print counters every this many seconds (0: never).
# stats_every_secs = 10
# Serve the counters for Prometheus at http://ADDR/metrics (off unless set).
# metrics_listen = "127.0.0.1:9100"

# Queues and flow control.
# send_queue_bytes = 4194304        # per peer and lane (ordinary, bulk)
# mailbox_bytes = 16777216          # credit per (sending node, mailbox)
# max_payload = 67108864            # largest message; up to 16 GiB
# frame_bytes = 65536               # target size of one MESSAGES frame (at most 1 MiB)
# fragment_bytes = 65536            # larger messages go in pieces of this size (at most 1 MiB)
# bulk_inflight_bytes = 131072      # pieces in flight per peer
# read_bytes = 65536                # one read call
# unacked_bytes = 16777216          # the send window per peer

# Connections and liveness.
# reconnect_min_ms = 50
# reconnect_max_ms = 2000
# handshake_timeout_ms = 5000       # TLS + handshake + RESUME, one deadline
# max_handshakes = 64               # inbound handshakes in progress, in all
# max_handshakes_per_address = 16   # ... and from one address
# max_peers = 1024
# events_capacity = 4096            # events queued for each subscriber
# shutdown_timeout_ms = 5000        # how long a shutdown waits for acknowledgements
# write_check_ms = 100              # a blocked write returns this often
# heartbeat_interval_ms = 500
# peer_timeout_ms = 3000

# Mutual TLS on every connection (all three, PEM).
# [tls]
# cert = "a.pem"
# key = "a-key.pem"
# ca = "ca.pem"
"#;

/// Read and check a config file.
pub fn read(path: &Path) -> Result<NodeFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("config file {}: {e}", path.display()))
}

/// Parse a config file's text.
pub fn parse(text: &str) -> Result<NodeFile, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// What the command line said (flags win over the file).
#[derive(Debug, Default)]
pub struct Flags {
    pub name: Option<String>,
    pub listen: Option<SocketAddr>,
    pub secret_file: Option<PathBuf>,
    pub peers: Vec<PeerSpec>,
    pub bundler: Option<BundlerKind>,
    pub idle_cpu_level: Option<u8>,
    pub tls: Option<TlsFiles>,
    pub stats_every: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    pub handshake_timeout_ms: Option<u64>,
    pub max_handshakes: Option<usize>,
    pub max_handshakes_per_address: Option<usize>,
}

/// What `batchwire node` does besides the library's settings.
#[derive(Debug)]
pub struct Extras {
    /// Print counters every this many seconds (0: never).
    pub stats_every: u64,
    /// Serve metrics for Prometheus here.
    pub metrics_listen: Option<SocketAddr>,
}

/// The node's configuration from the flags over the file, and the command's own settings.
pub fn build(flags: Flags, file: NodeFile) -> Result<(NodeConfig, Extras), String> {
    let missing = |key: &str, flag: &str| {
        format!("missing `{key}`: give {flag} or `{key} = ...` in a --config file")
    };
    let name = flags
        .name
        .or(file.name)
        .ok_or_else(|| missing("name", "--name"))?;
    let listen = flags
        .listen
        .or(file.listen)
        .ok_or_else(|| missing("listen", "--listen"))?;
    let secret_file = flags
        .secret_file
        .or(file.secret_file)
        .ok_or_else(|| missing("secret_file", "--secret-file"))?;
    let secret = NodeConfig::read_secret(&secret_file).map_err(|e| e.to_string())?;
    let mut cfg = NodeConfig::new(name, listen, secret).mailbox("echo");
    // Peers: the file's, then the flags' (a flag naming a peer of the file replaces it).
    let mut peers = Vec::new();
    for p in &file.peers {
        let spec: PeerSpec = p.parse().map_err(|e| format!("`peers`: {p:?}: {e}"))?;
        peers.push(spec);
    }
    for p in flags.peers {
        peers.retain(|q: &PeerSpec| q.name != p.name);
        peers.push(p);
    }
    cfg = cfg.with_peers(peers);
    for m in file.mailboxes {
        cfg = cfg.mailbox(m);
    }
    let bundler = match (flags.bundler, file.bundler) {
        (Some(b), _) => b,
        (None, Some(s)) => s
            .parse::<BundlerKind>()
            .map_err(|e| format!("`bundler`: {e}"))?,
        (None, None) => BundlerKind::Natural,
    };
    cfg = cfg.bundler(bundler);
    if let Some(v) = file.bundler_max_size {
        cfg = cfg.bundler_max_size(v);
    }
    if let Some(v) = file.bundler_max_delay_us {
        cfg = cfg.bundler_max_delay(Duration::from_micros(v));
    }
    if let Some(v) = flags.idle_cpu_level.or(file.idle_cpu_level) {
        cfg = cfg.idle_cpu_level(v);
    }
    let ms = Duration::from_millis;
    macro_rules! set {
        ($($key:ident => $method:ident $(via $conv:ident)?),* $(,)?) => {
            $( if let Some(v) = file.$key { cfg = cfg.$method($($conv)?(v)); } )*
        };
    }
    set!(
        send_queue_bytes => send_queue_bytes,
        mailbox_bytes => mailbox_bytes,
        max_payload => max_payload,
        frame_bytes => frame_bytes,
        fragment_bytes => fragment_bytes,
        bulk_inflight_bytes => bulk_inflight_bytes,
        read_bytes => read_bytes,
        unacked_bytes => unacked_bytes,
        max_peers => max_peers,
        events_capacity => events_capacity,
        shutdown_timeout_ms => shutdown_timeout via ms,
        write_check_ms => write_check via ms,
        heartbeat_interval_ms => heartbeat_interval via ms,
        peer_timeout_ms => peer_timeout via ms,
    );
    if file.reconnect_min_ms.is_some() || file.reconnect_max_ms.is_some() {
        let min = ms(file.reconnect_min_ms.unwrap_or(50));
        let max = ms(file.reconnect_max_ms.unwrap_or(2000));
        if min > max {
            return Err(format!(
                "`reconnect_min_ms` ({min:?}) is above `reconnect_max_ms` ({max:?})"
            ));
        }
        cfg = cfg.reconnect(min, max);
    }
    if let Some(v) = flags.handshake_timeout_ms.or(file.handshake_timeout_ms) {
        cfg = cfg.handshake_timeout(ms(v));
    }
    if let Some(v) = flags.max_handshakes.or(file.max_handshakes) {
        cfg = cfg.max_handshakes(v);
    }
    if let Some(v) = flags
        .max_handshakes_per_address
        .or(file.max_handshakes_per_address)
    {
        cfg = cfg.max_handshakes_per_address(v);
    }
    let tls = flags.tls.or(file.tls.map(|t| TlsFiles {
        cert: t.cert,
        key: t.key,
        ca: t.ca,
    }));
    if let Some(t) = tls {
        cfg = cfg.tls(t);
    }
    let extras = Extras {
        stats_every: flags.stats_every.or(file.stats_every_secs).unwrap_or(10),
        metrics_listen: flags.metrics_listen.or(file.metrics_listen),
    };
    Ok((cfg, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults file with every key uncommented.
    fn uncommented() -> String {
        DEFAULTS
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.contains(" = ") || l.starts_with('['))
            .map(|l| l.split("  #").next().unwrap_or(l).trim_end().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn every_key_of_the_printed_defaults_is_understood_and_builds_a_node_config() {
        let text = uncommented();
        let f = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(f.name.as_deref(), Some("a"));
        assert_eq!(f.mailbox_bytes, Some(16 << 20));
        assert_eq!(f.bulk_inflight_bytes, Some(128 << 10));
        assert!(f.tls.is_some());
        let dir = std::env::temp_dir().join(format!("bw-nodefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        let f = parse(&text.replace("\"secret\"", &format!("{secret:?}"))).unwrap();
        let (_cfg, extras) = build(Flags::default(), f).unwrap();
        assert_eq!(extras.stats_every, 10);
        assert!(extras.metrics_listen.is_some());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_key() {
        let e = parse("name = \"a\"\nmailbox_byte = 5\n").unwrap_err();
        assert!(e.contains("mailbox_byte") && e.contains("line 2"), "{e}");
        let e = parse("max_payload = \"big\"\n").unwrap_err();
        assert!(e.contains("max_payload") || e.contains("line 1"), "{e}");
        let e = parse("[tls]\ncert = \"c\"\n").unwrap_err();
        assert!(e.contains("key"), "{e}");
        let f = parse("bundler = \"fastest\"\nname = \"a\"\nlisten = \"127.0.0.1:1\"\n").unwrap();
        let flags = Flags {
            secret_file: Some(PathBuf::from("/nonexistent/secret")),
            ..Flags::default()
        };
        // The secret is read first: its error names the file.
        let e = build(flags, f).err().unwrap();
        assert!(e.contains("/nonexistent/secret"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file_and_missing_essentials_are_named() {
        let e = build(Flags::default(), parse("").unwrap()).err().unwrap();
        assert!(e.contains("`name`") && e.contains("--name"), "{e}");
        let dir = std::env::temp_dir().join(format!("bw-nodefile2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let text = format!(
            "name = \"a\"\nlisten = \"127.0.0.1:1\"\nsecret_file = {secret:?}\nbundler = \"fastest\"\n"
        );
        let e = build(Flags::default(), parse(&text).unwrap())
            .err()
            .unwrap();
        assert!(e.contains("`bundler`") && e.contains("fastest"), "{e}");
        let flags = Flags {
            bundler: Some(BundlerKind::Linger),
            stats_every: Some(0),
            ..Flags::default()
        };
        let (_, extras) = build(flags, parse(&text).unwrap()).unwrap();
        assert_eq!(extras.stats_every, 0, "the flag won");
        let text = text.replace("\"fastest\"", "\"linger\"") + "peers = [\"b=x\"]\n";
        let e = build(Flags::default(), parse(&text).unwrap())
            .err()
            .unwrap();
        assert!(e.contains("`peers`") && e.contains("b=x"), "{e}");
    }
}
