//! `batchwire node --config node.toml`: every setting of a node in one file. Flags given
//! on the command line win over the file; what neither says keeps the library's default.
//! `batchwire node --print-config` prints [`DEFAULTS`], a commented file of them all.
//!
//! Unknown keys and bad values are refused with the key and the reason (and, from the TOML
//! parser, the line and column).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use batchwire::{BundlerKind, NodeConfig, NodeFile, PeerSpec, TlsFiles};
use serde::Deserialize;

/// A config file as `batchwire node` reads it: the library's [`NodeFile`] and the
/// command's own keys.
#[derive(Debug, Default)]
pub struct CliFile {
    pub node: NodeFile,
    pub stats_every_secs: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
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
# Serve the counters for Prometheus at http://ADDR/metrics (off unless set): a port
# (served on 127.0.0.1 only) or an address ("0.0.0.0:9100" serves other hosts too).
# metrics_listen = "127.0.0.1:9100"

# Queues and flow control.
# send_queue_bytes = 4194304        # per peer and lane (ordinary, bulk)
# mailbox_bytes = 16777216          # credit per (sending node, mailbox)
# max_payload = 67108864            # largest message; up to 16 GiB
# frame_bytes = 65536               # target size of one MESSAGES frame (at most 1 MiB)
# fragment_bytes = 65536            # larger messages go in pieces of this size (at most 1 MiB)
# by_reference_bytes = 512          # payloads this large are written from your buffer, not copied
# bulk_inflight_bytes = 131072      # pieces in flight per peer
# bulk_stream_bytes = 2097152       # ... once bulk has had the connection to itself
# read_bytes = 262144               # one read call
# unacked_bytes = 16777216          # the send window per peer
# reliable = true                   # false: the unsequenced baseline (same on every node)
# ack_every_messages = 4096         # acknowledge after this many messages,
# ack_every_bytes = 1048576         # ... or this many bytes,
# ack_delay_ms = 5                  # ... or this long after the first unacknowledged one
# max_pending_requests = 65536      # requests in flight at most

# Connections and liveness.
# idle_close_ms = 60000             # a connection to a member is made on the first send and
#                                   # closed after this long idle (0: dial every member, keep all)
# reconnect_min_ms = 50
# reconnect_max_ms = 2000
# handshake_timeout_ms = 5000       # TLS + handshake + RESUME, one deadline
# max_handshakes = 64               # inbound handshakes in progress, in all
# max_handshakes_per_address = 16   # ... and from one address
# max_peers = 2048
# events_capacity = 4096            # events queued for each subscriber
# shutdown_timeout_ms = 5000        # how long a shutdown waits for acknowledgements
# write_check_ms = 100              # a blocked write returns this often
# thread_linger_ms = 2000           # a peer's idle writer/reader thread ends after this
# heartbeat_interval_ms = 500
# peer_timeout_ms = 3000

# Cluster membership (SWIM). Join a running cluster through any of these members (one is
# enough); other hosts dial this node at `advertise` (default: the listen address, which
# must then not be 0.0.0.0 for other hosts). A seed is HOST:PORT, an address or a DNS name;
# a name is resolved again every join_refresh_ms and every address it lists is a seed
# (e.g. a Kubernetes headless Service: "batchwire.default.svc.cluster.local:7000").
# join = ["127.0.0.1:7001"]
# join_refresh_ms = 30000
# advertise = "10.0.0.1:7001"
# membership = true
# probe_period_ms = 1000            # each member probes one other this often
# probe_rtt_ms = 300                # then asks 3 others to probe it indirectly
# suspicion_timeout_ms = 3000       # a suspect that does not refute is declared down
# gossip_period_ms = 200            # news goes to 3 random members this often
# announce_period_ms = 30000        # a member announces itself to its seeds this often
# forget_down_after_ms = 600000     # a down member is forgotten after this long
# frames_per_second = 200           # most membership datagrams taken from one member
# max_members = 1024                # most members in the view (above the cluster's size;
#                                   # max_peers at least 4/3 of it)

# Mutual TLS on every connection (all three, PEM).
# [tls]
# cert = "a.pem"
# key = "a-key.pem"
# ca = "ca.pem"
"#;

/// Read and check a config file. Relative paths in it (`secret_file`, the `[tls]` files)
/// are relative to the file's folder, not to where the command runs: a config and its
/// secret move together.
pub fn read(path: &Path) -> Result<CliFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let mut f = parse(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    let folder = path.parent().unwrap_or(Path::new(""));
    let beside = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = folder.join(&*p);
        }
    };
    if let Some(p) = f.node.secret_file.as_mut() {
        beside(p);
    }
    if let Some(t) = f.node.tls.as_mut() {
        beside(&mut t.cert);
        beside(&mut t.key);
        beside(&mut t.ca);
    }
    Ok(f)
}

/// Parse a config file's text: TOML syntax first (errors with the line), then the
/// command's keys, then the node's (unknown keys refused, naming the key).
pub fn parse(text: &str) -> Result<CliFile, String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut take = |key: &str| table.remove(key);
    let stats_every_secs = match take("stats_every_secs") {
        Some(v) => Some(u64::deserialize(v).map_err(|e| format!("`stats_every_secs`: {e}"))?),
        None => None,
    };
    let metrics_listen = match take("metrics_listen") {
        Some(toml::Value::Integer(port)) => Some(
            u16::try_from(port)
                .map_err(|_| format!("`metrics_listen`: port {port} is out of range"))
                .and_then(|p| crate::metrics_http::parse_addr(&p.to_string()))?,
        ),
        Some(v) => Some(
            String::deserialize(v)
                .map_err(|e| format!("`metrics_listen`: {e}"))
                .and_then(|s| crate::metrics_http::parse_addr(&s))
                .map_err(|e| format!("`metrics_listen`: {e}"))?,
        ),
        None => None,
    };
    // Each key on its own, so that an error names its key.
    let mut node = toml::Table::new();
    for (key, value) in table {
        let one: toml::Table = [(key.clone(), value.clone())].into_iter().collect();
        if let Err(e) = one.try_into::<NodeFile>() {
            return Err(format!("`{key}`: {}", e.message().trim()));
        }
        node.insert(key, value);
    }
    let node: NodeFile = node.try_into().map_err(|e| e.to_string())?;
    Ok(CliFile {
        node,
        stats_every_secs,
        metrics_listen,
    })
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
    pub idle_close_ms: Option<u64>,
    pub max_handshakes: Option<usize>,
    pub max_handshakes_per_address: Option<usize>,
    pub join: Vec<batchwire::Seed>,
    pub advertise: Option<SocketAddr>,
}

/// What `batchwire node` does besides the library's settings.
#[derive(Debug)]
pub struct Extras {
    /// Print counters every this many seconds (0: never).
    pub stats_every: u64,
    /// ...as JSON.
    pub stats_json: bool,
    /// `--stats-brief`: only the node's own counters.
    pub stats_brief: bool,
    /// `--event-times`: member lines end with the host's monotonic time.
    pub event_times: bool,
    /// Serve metrics for Prometheus here.
    pub metrics_listen: Option<SocketAddr>,
    /// The TLS files, to check at start that the certificate names the node (every peer
    /// would refuse it otherwise).
    pub tls: Option<TlsFiles>,
}

/// The node's configuration from the flags over the file, and the command's own settings.
pub fn build(flags: Flags, file: CliFile) -> Result<(NodeConfig, Extras), String> {
    let mut f = file.node;
    // Every missing essential at once, each with its flag and key.
    f.name = flags.name.or(f.name);
    f.listen = flags.listen.or(f.listen);
    f.secret_file = flags.secret_file.or(f.secret_file);
    let missing: Vec<String> = [
        (f.name.is_none(), "name", "--name"),
        (f.listen.is_none(), "listen", "--listen"),
        (f.secret_file.is_none(), "secret_file", "--secret-file"),
    ]
    .into_iter()
    .filter(|m| m.0)
    .map(|(_, key, flag)| format!("`{key}` ({flag})"))
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing {}: give each as a flag or `key = ...` in a --config file",
            missing.join(", ")
        ));
    }
    // A peer given as a flag replaces one of the same name in the file.
    for p in &flags.peers {
        f.peers
            .retain(|q| q.split_once('=').map(|(n, _)| n.trim()) != Some(p.name.as_str()));
        f.peers.push(format!("{}={}", p.name, p.addr));
    }
    if !f.mailboxes.iter().any(|m| m == "echo") {
        f.mailboxes.push("echo".into());
    }
    if let Some(b) = flags.bundler {
        f.bundler = Some(b.name().to_string());
    }
    f.idle_cpu_level = flags.idle_cpu_level.or(f.idle_cpu_level);
    f.handshake_timeout_ms = flags.handshake_timeout_ms.or(f.handshake_timeout_ms);
    f.idle_close_ms = flags.idle_close_ms.or(f.idle_close_ms);
    f.max_handshakes = flags.max_handshakes.or(f.max_handshakes);
    f.max_handshakes_per_address = flags
        .max_handshakes_per_address
        .or(f.max_handshakes_per_address);
    // Seeds from the flags come first (tried first), then the file's.
    let mut join: Vec<String> = flags.join.iter().map(|s| s.to_string()).collect();
    for s in &f.join {
        if !join.contains(s) {
            join.push(s.clone());
        }
    }
    f.join = join;
    f.advertise = flags.advertise.or(f.advertise);
    // Kept to check at start that the node's own certificate names it.
    let file_tls = f.tls.as_ref().map(|t| TlsFiles {
        cert: t.cert.clone(),
        key: t.key.clone(),
        ca: t.ca.clone(),
    });
    let tls = flags.tls.clone().or(file_tls);
    let mut cfg = f.into_config().map_err(|e| e.to_string())?;
    if let Some(t) = flags.tls {
        cfg = cfg.tls(t);
    }
    cfg.validate().map_err(|e| e.to_string())?;
    let extras = Extras {
        stats_every: flags.stats_every.or(file.stats_every_secs).unwrap_or(10),
        metrics_listen: flags.metrics_listen.or(file.metrics_listen),
        stats_json: false,
        stats_brief: false,
        event_times: false,
        tls,
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
        assert_eq!(f.node.name.as_deref(), Some("a"));
        assert_eq!(f.node.mailbox_bytes, Some(16 << 20));
        assert_eq!(f.node.bulk_inflight_bytes, Some(128 << 10));
        assert_eq!(f.node.bulk_stream_bytes, Some(2 << 20));
        assert!(f.node.tls.is_some());
        let dir = std::env::temp_dir().join(format!("bw-nodefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        let f = parse(&text.replace("\"secret\"", &format!("{secret:?}"))).unwrap();
        let (_cfg, extras) = build(Flags::default(), f).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(extras.stats_every, 10);
        assert!(extras.metrics_listen.is_some());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_key() {
        let e = parse("name = \"a\"\nmailbox_byte = 5\n").unwrap_err();
        assert!(e.contains("`mailbox_byte`") && e.contains("unknown"), "{e}");
        let e = parse("name = \"a\"\nmailbox_bytes = \n").unwrap_err();
        assert!(e.contains("line 2"), "a syntax error names its line: {e}");
        let e = parse("max_payload = \"big\"\n").unwrap_err();
        assert!(e.contains("`max_payload`") && e.contains("big"), "{e}");
        let e = parse("[tls]\ncert = \"c\"\n").unwrap_err();
        assert!(e.contains("`tls`") && e.contains("key"), "{e}");
        let e = parse("metrics_listen = \"nowhere\"\n").unwrap_err();
        assert!(e.contains("`metrics_listen`"), "{e}");
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
        assert_eq!(
            e,
            "missing `name` (--name), `listen` (--listen), `secret_file` (--secret-file): give \
             each as a flag or `key = ...` in a --config file"
        );
        let e = build(Flags::default(), parse("name = \"a\"").unwrap())
            .err()
            .unwrap();
        assert!(
            e.starts_with("missing `listen` (--listen), `secret_file`"),
            "{e}"
        );
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
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.contains("`peers`") && e.contains("b=x"), "{e}");
    }

    /// Paths in a config file are relative to its folder, wherever the command runs;
    /// absolute ones stay as they are.
    #[test]
    fn relative_paths_in_a_file_are_relative_to_its_folder() {
        let dir = std::env::temp_dir().join(format!("bw-nodefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(
            &file,
            "name = \"a\"\nsecret_file = \"secret\"\n[tls]\ncert = \"c/a.pem\"\nkey = \"/abs/a-key.pem\"\nca = \"ca.pem\"\n",
        )
        .unwrap();
        let f = read(&file).unwrap();
        assert_eq!(f.node.secret_file, Some(dir.join("secret")));
        let t = f.node.tls.unwrap();
        assert_eq!(t.cert, dir.join("c/a.pem"));
        assert_eq!(t.key, PathBuf::from("/abs/a-key.pem"));
        assert_eq!(t.ca, dir.join("ca.pem"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
