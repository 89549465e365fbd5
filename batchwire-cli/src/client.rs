//! `batchwire send | request | listen | members | status`: talk to a running cluster from
//! the command line.
//!
//! Each command starts a short-lived client node that reaches the cluster either through
//! `--join HOST:PORT` (it joins as a member, so it can reach every member by name, and
//! leaves when done) or through `--peer NAME=HOST:PORT` (it connects to those nodes
//! only). It proves the cluster's secret (`--secret-file`) or, with TLS, presents its own
//! certificate (`--tls-cert/--tls-key/--tls-ca`; then `--name` must be the name the
//! certificate names). Output is text for people, or one JSON document (per message for
//! `listen`) with `--json`. Errors go to stderr and the exit status is 1.
//!
//! `batchwire node` serves a mailbox [`STATUS_MAILBOX`]: a request to it is answered with
//! the node's status as JSON ([`status_json`]), which `status` prints and `members` uses
//! when it has no view of its own (with `--peer`).

mod messages;
mod status;
pub use messages::{listen, request, send};
pub use status::{members, status};

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use batchwire::{
    Address, Bytes, Event, HandshakeFailure, Member, MemberState, Node, NodeConfig, PeerSpec,
};
use serde_json::json;

use crate::bench::soak::parse_duration;

/// The mailbox on which `batchwire node` answers status requests.
pub const STATUS_MAILBOX: &str = "status";

/// The client's mailbox that `send` sends from.
const SEND_MAILBOX: &str = "cli";

/// How a client command reaches the cluster.
#[derive(clap::Args, Debug, Clone)]
pub struct Connect {
    /// Join the cluster through the member at HOST:PORT (repeatable; one that answers is
    /// enough). The client is a member until it exits.
    #[arg(long = "join")]
    join: Vec<batchwire::Seed>,
    /// Or connect to this node only, NAME=HOST:PORT (repeatable).
    #[arg(long = "peer")]
    peers: Vec<PeerSpec>,
    /// File holding the cluster secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Mutual TLS: the client's certificate (PEM; it must name --name).
    #[arg(long, requires_all = ["tls_key", "tls_ca", "name"])]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: the client's private key (PEM).
    #[arg(long, requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: the CA that signed every node's certificate (PEM).
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// The client node's name [default: !cli-PID, which sorts before ordinary names].
    #[arg(long)]
    name: Option<String>,
    /// The address the client listens on [default: port 0 on the local address that
    /// routes to the cluster].
    #[arg(long, value_parser = resolve_addr)]
    listen: Option<SocketAddr>,
    /// How long to wait for the cluster (to join, or for the peer to connect), e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A client node, started and connected.
pub struct Client {
    pub node: Node,
    joined: bool,
    timeout: Duration,
}

impl Connect {
    /// Start the client node with `mailboxes`; wait until it has joined (with `--join`) or
    /// its peers are connected (with `--peer`).
    pub fn start(&self, mailboxes: &[&str]) -> Result<Client, String> {
        if self.join.is_empty() && self.peers.is_empty() {
            return Err(
                "say how to reach the cluster: --join HOST:PORT (any member) or --peer NAME=HOST:PORT"
                    .into(),
            );
        }
        let secret = match &self.secret_file {
            Some(f) => NodeConfig::read_secret(f).map_err(|e| e.to_string())?,
            None => return Err("--secret-file is needed (the cluster's secret)".into()),
        };
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| format!("!cli-{}", std::process::id()));
        // Toward a --peer, the client dials (the peer does not know it): the name that
        // sorts first dials, so the client's must.
        if let Some(p) = self.peers.iter().find(|p| p.name.as_str() <= name.as_str()) {
            return Err(format!(
                "peer {:?} sorts before this client's name {name:?}: with --peer the client \
                 dials, and of two nodes the one whose name sorts first dials. Give a --name \
                 that sorts first (e.g. \"!{name}\"), or reach the cluster with --join",
                p.name
            ));
        }
        let first = match self.join.first() {
            Some(seed) => first_addr(seed)?,
            None => self.peers.first().map(|p| p.addr).ok_or("no address")?,
        };
        let listen = match self.listen {
            Some(a) => a,
            None => SocketAddr::new(route_to(first), 0),
        };
        let mut cfg = NodeConfig::new(name, listen, secret)
            .with_peers(self.peers.iter().cloned())
            // Short-lived: what is not acknowledged within this is reported failed.
            // (The node takes at most an hour; the wait for the cluster may be longer.)
            .shutdown_timeout(self.connect_timeout.min(Duration::from_secs(3600)));
        for seed in &self.join {
            cfg = cfg.join(seed.clone());
        }
        for m in mailboxes {
            cfg = cfg.mailbox(*m);
        }
        if let (Some(cert), Some(key), Some(ca)) = (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            cfg = cfg.tls(batchwire::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            });
        }
        let node = Node::start(cfg).map_err(|e| e.to_string())?;
        let events = node.events();
        let client = Client {
            node,
            joined: !self.join.is_empty(),
            timeout: self.connect_timeout,
        };
        let me = client.node.name().to_string();
        let names: Vec<&str> = self.peers.iter().map(|p| p.name.as_str()).collect();
        let deadline = Instant::now() + self.connect_timeout;
        loop {
            let joined = !client.joined
                || client
                    .node
                    .members()
                    .iter()
                    .any(|m| m.name != me && m.state == MemberState::Alive);
            let up = client.node.connected_peers();
            let missing: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| !up.iter().any(|u| u == n))
                .collect();
            if joined && missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let what = if !joined {
                    format!(
                        "no member answered at {} within {:?}",
                        join_list(&self.join),
                        self.connect_timeout
                    )
                } else {
                    format!(
                        "not connected to {} within {:?}",
                        missing.join(", "),
                        self.connect_timeout
                    )
                };
                return Err(client.why_not_connected(&what));
            }
            // A refusal that trying again cannot mend ends the wait at once.
            if let Ok(Event::HandshakeFailed {
                addr, kind, reason, ..
            }) = events.recv_timeout(Duration::from_millis(20))
                && !matches!(
                    kind,
                    HandshakeFailure::Timeout
                        | HandshakeFailure::Closed
                        | HandshakeFailure::Capacity
                )
            {
                return Err(format!("cannot connect to {addr}: {reason}"));
            }
        }
        Ok(client)
    }
}

/// A seed's first address (a name resolved now), to pick the client's own address.
fn first_addr(seed: &batchwire::Seed) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    seed.to_string()
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {seed}: {e}"))?
        .next()
        .ok_or_else(|| format!("{seed} resolves to no address"))
}

fn join_list(a: &[batchwire::Seed]) -> String {
    a.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The local address this host would use toward `to` (no packet is sent).
fn route_to(to: SocketAddr) -> std::net::IpAddr {
    let any: SocketAddr = if to.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    UdpSocket::bind(any)
        .and_then(|s| s.connect(to).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(any.ip())
}

impl Client {
    /// `what`, and what the node's counters say about why (a refused handshake, say).
    fn why_not_connected(&self, what: &str) -> String {
        let h = self.node.stats().handshakes;
        let mut why: Vec<String> = h
            .failed
            .iter()
            .map(|(kind, n)| format!("{n} handshake(s) failed: {kind:?}"))
            .collect();
        if why.is_empty() {
            why.push("no handshake completed (is the address right, and the node running?)".into());
        }
        format!(
            "{what}; {} (BATCHWIRE_LOG=info shows each attempt)",
            why.join(", ")
        )
    }

    /// The node named `node`: with `--join`, wait until it is in the view.
    fn reach(&self, node: &str) -> Result<(), String> {
        if self.node.connected_peers().iter().any(|p| p == node) {
            return Ok(());
        }
        if self.joined {
            let ok = self.node.wait_for_members(self.timeout, |v| {
                v.iter()
                    .any(|m| m.name == node && m.state == MemberState::Alive)
            });
            if ok {
                return Ok(());
            }
            let names: Vec<String> = self
                .node
                .members()
                .into_iter()
                .filter(|m| m.name != self.node.name())
                .map(|m| m.name)
                .collect();
            return Err(format!(
                "no live member named {node:?} in the cluster (members: {})",
                names.join(", ")
            ));
        }
        Err(format!(
            "{node:?} is not one of the --peer nodes; give it with --peer {node}=HOST:PORT, or use --join"
        ))
    }
}

/// `MAILBOX@NODE` (as addresses are printed).
pub fn parse_address(s: &str) -> Result<Address, String> {
    let (mailbox, node) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?} is not MAILBOX@NODE (e.g. echo@b)"))?;
    Address::new(node, mailbox).map_err(|e| format!("{s:?}: {e}"))
}

fn member_json(m: &Member) -> serde_json::Value {
    json!({
        "name": m.name,
        "addr": m.addr.to_string(),
        "state": m.state.name(),
        "incarnation": m.incarnation,
    })
}

/// A node's status: name, version, addresses, uptime, members, and its counters.
pub fn status_json(node: &Node, started: Instant) -> serde_json::Value {
    let members: Vec<_> = node.members().iter().map(member_json).collect();
    json!({
        "node": node.name(),
        "version": env!("CARGO_PKG_VERSION"),
        "listen": node.local_addr().to_string(),
        "advertise": node.advertised_addr().to_string(),
        "uptime_secs": started.elapsed().as_secs(),
        "threads": node.threads(),
        "members": members,
        "stats": node.stats(),
    })
}

/// HOST:PORT as an address: an IP address as it is, a host name resolved (its first
/// address), as `--peer` does.
pub fn resolve_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| format!("{s:?} is not HOST:PORT that resolves: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}
