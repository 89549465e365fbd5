//! Node configuration, with the defaults that measured well on a 2-vCPU machine.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::error::Error;
use batchwire_core::bundler::{BundlerConfig, BundlerKind};

/// One peer in the static member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub name: String,
    pub addr: SocketAddr,
}

impl std::str::FromStr for PeerSpec {
    type Err = String;
    /// Parses `name=host:port`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, addr) = s
            .split_once('=')
            .ok_or_else(|| format!("peer {s:?} is not NAME=HOST:PORT"))?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| format!("peer {s:?}: cannot resolve {addr:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("peer {s:?}: {addr:?} resolves to nothing"))?;
        Ok(PeerSpec {
            name: name.to_string(),
            addr,
        })
    }
}

/// Everything a node needs. Build with [`NodeConfig::new`] and the builder methods; every
/// field not set there has the documented default.
///
/// Connections: of two peers, the one whose name sorts first dials the other; the other
/// waits for it. List each peer on both sides (a static cluster), so every pair connects.
#[derive(Clone)]
pub struct NodeConfig {
    /// This node's name, unique in the cluster (1..=255 bytes of UTF-8).
    pub name: String,
    /// Where to accept connections. Port 0 picks a free port (see `Node::local_addr`).
    pub listen: SocketAddr,
    /// The static list of peers.
    pub peers: Vec<PeerSpec>,
    /// The cluster secret, shared by every node. Never sent over the wire.
    pub secret: Vec<u8>,
    /// Mailboxes that exist from the start, before any connection: messages that arrive
    /// before the application calls `Node::mailbox(name)` wait in them instead of being
    /// reported undeliverable. Default: none.
    pub mailboxes: Vec<String>,
    /// How outbound messages are grouped into writes, and the bundler's knobs
    /// (`max_size` 64 KiB, `max_delay` 1 ms). Default: `natural`.
    pub bundler: BundlerConfig,
    /// How the transport's writer threads and waiting receivers idle, as Akka Artery's
    /// `idle-cpu-level`: 1 parks at once (the default; no CPU when idle), 10 busy-spins.
    /// See `core::idle` for the exact mapping.
    pub idle_cpu_level: u8,
    /// Bound of each peer's outbound queue, in bytes. When full, `send` blocks and
    /// `try_send` returns `Full`. Default 4 MiB.
    pub send_queue_bytes: usize,
    /// Bound of each mailbox's queue, in bytes; a full mailbox stops its connection's reader
    /// (TCP flow control then slows the senders). Default 4 MiB.
    pub mailbox_bytes: usize,
    /// Largest payload `send` accepts. Use the same value on every node. Default 16 MiB.
    pub max_payload: usize,
    /// A writer closes a MESSAGES frame once it holds this many bytes and starts another,
    /// so receivers hand out batches of about this size. Default 64 KiB.
    pub frame_bytes: usize,
    /// Bytes the reader asks the socket for at once. Default 64 KiB.
    pub read_bytes: usize,
    /// First and largest pause between connection attempts. Default 50 ms .. 2 s.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// How long a connection may take from accept (or connect) to carrying messages: TLS,
    /// the batchwire handshake and the RESUME exchange, all together. Default 5 s.
    pub handshake_timeout: Duration,
    /// Most inbound handshakes in progress at once; beyond it new connections are closed at
    /// once (and counted). Each costs a thread until it ends. Default 64.
    pub max_handshakes: usize,
    /// Most of those from one source address, so that one client cannot take every place.
    /// Default 16.
    pub max_handshakes_per_address: usize,
    /// Most peers a node keeps, counting those not in the static list that connect with the
    /// cluster secret. Default 1024.
    pub max_peers: usize,
    /// Events queued for the subscriber at most; beyond it they are dropped and counted
    /// (see `Node::events`). Default 4096.
    pub events_capacity: usize,
    /// How long `shutdown` waits for queued messages to be written and acknowledged.
    /// Default 5 s.
    pub shutdown_timeout: Duration,
    /// Keep every message until the peer acknowledges it, and resend after a connection
    /// break (exactly once, in order). `false` is the unsequenced baseline, kept to measure
    /// what reliability costs: messages in flight when a connection breaks are lost.
    /// Use the same value on every node. Default true.
    pub reliable: bool,
    /// Most unacknowledged bytes held per peer; past it the writer stops taking from its
    /// queue, which fills, so `send` blocks. Default 16 MiB.
    pub unacked_bytes: usize,
    /// A receiver acknowledges after this many messages, or this many bytes, or after
    /// `ack_delay`, whichever comes first. Defaults 4096 messages, 1 MiB and 5 ms. (The
    /// byte bound keeps big messages from filling the sender's window before an ack.)
    pub ack_every: u64,
    pub ack_every_bytes: usize,
    pub ack_delay: Duration,
    /// An idle connection carries a heartbeat this often. Default 500 ms.
    pub heartbeat_interval: Duration,
    /// A peer silent (or unreachable) for longer than this is declared down. Default 3 s.
    pub peer_timeout: Duration,
    /// Mutually authenticated TLS on every connection (certificate, key, CA as PEM files),
    /// on top of the cluster-secret handshake. All nodes of a cluster must agree. Default
    /// none (plain TCP).
    pub tls: Option<crate::io::tls::TlsFiles>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("name", &self.name)
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("secret", &"<redacted>")
            .field("bundler", &self.bundler)
            .field("idle_cpu_level", &self.idle_cpu_level)
            .field("send_queue_bytes", &self.send_queue_bytes)
            .field("mailbox_bytes", &self.mailbox_bytes)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl NodeConfig {
    /// A node named `name` listening on `listen`, with cluster secret `secret` and defaults.
    pub fn new(name: impl Into<String>, listen: SocketAddr, secret: impl Into<Vec<u8>>) -> Self {
        NodeConfig {
            name: name.into(),
            listen,
            peers: Vec::new(),
            secret: secret.into(),
            mailboxes: Vec::new(),
            bundler: BundlerConfig::default(),
            idle_cpu_level: batchwire_core::idle::DEFAULT_LEVEL,
            send_queue_bytes: 4 << 20,
            mailbox_bytes: 4 << 20,
            max_payload: 16 << 20,
            frame_bytes: 64 << 10,
            read_bytes: 64 << 10,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 64,
            max_handshakes_per_address: 16,
            max_peers: 1024,
            events_capacity: 4096,
            shutdown_timeout: Duration::from_secs(5),
            reliable: true,
            unacked_bytes: 16 << 20,
            ack_every: 4096,
            ack_every_bytes: 1 << 20,
            ack_delay: Duration::from_millis(5),
            heartbeat_interval: Duration::from_millis(500),
            peer_timeout: Duration::from_secs(3),
            tls: None,
        }
    }

    /// Add a peer.
    pub fn peer(mut self, name: impl Into<String>, addr: SocketAddr) -> Self {
        self.peers.push(PeerSpec {
            name: name.into(),
            addr,
        });
        self
    }

    /// Declare a mailbox that exists from the start (see [`NodeConfig::mailboxes`]).
    pub fn mailbox(mut self, name: impl Into<String>) -> Self {
        self.mailboxes.push(name.into());
        self
    }

    /// Choose the bundler (its knobs keep their values).
    pub fn bundler(mut self, b: BundlerKind) -> Self {
        self.bundler.kind = b;
        self
    }

    /// Run TLS with these PEM files (see `batchwire certs`).
    pub fn tls(mut self, files: crate::io::tls::TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Choose the idle level (1..=10).
    pub fn idle_cpu_level(mut self, level: u8) -> Self {
        self.idle_cpu_level = level;
        self
    }

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

    /// The largest frame a receiver accepts: one maximum payload plus room for headers.
    pub fn max_frame(&self) -> usize {
        self.max_payload.max(self.frame_bytes) + 1024
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.secret.is_empty() {
            return Err(Error::Config("the cluster secret is empty".into()));
        }
        for (what, v) in [
            ("send_queue_bytes", self.send_queue_bytes),
            ("mailbox_bytes", self.mailbox_bytes),
            ("max_payload", self.max_payload),
            ("frame_bytes", self.frame_bytes),
            ("read_bytes", self.read_bytes),
            ("max_handshakes", self.max_handshakes),
            (
                "max_handshakes_per_address",
                self.max_handshakes_per_address,
            ),
            ("max_peers", self.max_peers),
            ("events_capacity", self.events_capacity),
        ] {
            if v == 0 {
                return Err(Error::Config(format!("{what} must be above 0")));
            }
        }
        batchwire_core::idle::IdleStrategy::from_level(self.idle_cpu_level)
            .map_err(Error::Config)?;
        if self.peer_timeout <= self.heartbeat_interval {
            return Err(Error::Config(format!(
                "peer_timeout ({:?}) must be longer than heartbeat_interval ({:?})",
                self.peer_timeout, self.heartbeat_interval
            )));
        }
        if self.unacked_bytes == 0 || self.ack_every == 0 {
            return Err(Error::Config(
                "unacked_bytes and ack_every must be above 0".into(),
            ));
        }
        if self.bundler.max_size == 0 {
            return Err(Error::Config("bundler max_size must be above 0".into()));
        }
        if self.max_payload > u32::MAX as usize - 2048 {
            return Err(Error::Config("max_payload must be below 4 GiB".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_specs_parse() {
        let p: PeerSpec = "b=127.0.0.1:7002".parse().unwrap();
        assert_eq!(p.name, "b");
        assert_eq!(p.addr.port(), 7002);
        assert!("b127.0.0.1:7002".parse::<PeerSpec>().is_err());
        assert!("b=nowhere".parse::<PeerSpec>().is_err());
    }

    #[test]
    fn validation_names_the_bad_field() {
        let mut c = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s");
        c.validate().unwrap();
        c.mailbox_bytes = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("mailbox_bytes")
        );
        let c = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "");
        assert!(c.validate().is_err());
    }
}
