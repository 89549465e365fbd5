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
            .shutdown_timeout(self.connect_timeout);
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

/// A payload as text: UTF-8 as it is, anything else as hex.
fn payload_text(p: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(p) {
        Ok(s) => ("text", s.to_string()),
        Err(_) => ("hex", p.iter().map(|b| format!("{b:02x}")).collect()),
    }
}

/// What `send` heard back.
#[derive(Default)]
struct Tally {
    failed: u64,
    undeliverable: u64,
    reasons: Vec<String>,
}

impl Tally {
    /// Count the next event about `to`, waiting up to `wait` for one.
    fn take(&mut self, events: &std::sync::mpsc::Receiver<Event>, to: &Address, wait: Duration) {
        match events.recv_timeout(wait) {
            Ok(Event::SendFailed {
                peer,
                count,
                reason,
                ..
            }) if peer == to.node() => {
                self.failed += count;
                self.reasons.push(format!("{count} failed: {reason:?}"));
            }
            Ok(Event::Undeliverable {
                to: t, from, count, ..
            }) if t == *to && from == SEND_MAILBOX => {
                self.undeliverable += count;
            }
            _ => {}
        }
    }
}

/// `batchwire send`.
pub fn send(c: &Connect, to: &str, messages: Vec<String>) -> Result<(), String> {
    let to = parse_address(to)?;
    let messages: Vec<String> = if messages.is_empty() {
        // One message per line of standard input.
        std::io::stdin()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("reading standard input: {e}"))?
    } else {
        messages
    };
    // Sent from a mailbox of its own: what comes back (an echo, say) lands there and is
    // dropped with the client, instead of being reported undeliverable.
    let client = c.start(&[SEND_MAILBOX])?;
    let node = &client.node;
    let from = node.mailbox(SEND_MAILBOX).map_err(|e| e.to_string())?;
    client.reach(to.node())?;
    let events = node.events();
    let before = node.stats().peer(to.node()).map_or(0, |p| p.acked);
    let mut sent = 0u64;
    for m in messages {
        from.send(&to, Bytes::from(m))
            .map_err(|e| format!("send to {to}: {e} ({sent} sent before)"))?;
        sent += 1;
    }
    // Wait until the peer acknowledged every one (or the timeout), watching for failures.
    let deadline = Instant::now() + client.timeout;
    let mut t = Tally::default();
    let mut acked = 0;
    while Instant::now() < deadline {
        acked = node
            .stats()
            .peer(to.node())
            .map_or(0, |p| p.acked.saturating_sub(before));
        if acked + t.failed >= sent {
            break;
        }
        t.take(&events, &to, Duration::from_millis(5));
    }
    // A notice of "no such mailbox" comes with (or just after) the acknowledgement.
    let grace = Instant::now() + Duration::from_millis(100);
    while Instant::now() < grace {
        t.take(&events, &to, Duration::from_millis(10));
    }
    let Tally {
        failed,
        undeliverable,
        reasons,
    } = t;
    let acked = acked.min(sent);
    if c.json {
        outln!(
            "{}",
            json!({
                "to": to.to_string(),
                "sent": sent,
                "acknowledged": acked,
                "failed": failed,
                "undeliverable": undeliverable,
            })
        );
    } else {
        outln!("sent {sent} message(s) to {to}: {acked} acknowledged");
    }
    drop(events);
    // What came back (an echo, say) is not this command's business.
    while from.try_recv().is_ok() {}
    drop(from);
    client.node.shutdown();
    if undeliverable > 0 {
        return Err(format!(
            "{undeliverable} message(s) undeliverable: {} has no mailbox {:?}",
            to.node(),
            to.mailbox()
        ));
    }
    if failed > 0 {
        return Err(format!("to {to}: {}", reasons.join("; ")));
    }
    if acked < sent {
        return Err(format!(
            "{} of {sent} message(s) not acknowledged by {} within {:?}",
            sent - acked,
            to.node(),
            client.timeout
        ));
    }
    Ok(())
}

/// `batchwire request`.
pub fn request(c: &Connect, to: &str, message: &str, timeout: Duration) -> Result<(), String> {
    let to = parse_address(to)?;
    let client = c.start(&[])?;
    client.reach(to.node())?;
    let t0 = Instant::now();
    let reply = client
        .node
        .request(&to, Bytes::from(message.to_string()), timeout)
        .map_err(|e| format!("request to {to}: {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let (kind, text) = payload_text(&reply.payload);
    if c.json {
        let mut v = json!({
            "from": reply.from.to_string(),
            "bytes": reply.payload.len(),
            "ms": (ms * 1000.0).round() / 1000.0,
        });
        v[kind] = json!(text);
        outln!("{v}");
    } else {
        outln!("{text}");
    }
    client.node.shutdown();
    Ok(())
}

/// `batchwire listen`.
pub fn listen(
    c: &Connect,
    mailbox: &str,
    count: Option<u64>,
    duration: Option<Duration>,
    reply: Option<&str>,
) -> Result<(), String> {
    let stop = crate::sys::stop_signals()?;
    let client = c.start(&[mailbox])?;
    let mb = client.node.mailbox(mailbox).map_err(|e| e.to_string())?;
    eprintln!(
        "listening on {} (address {mailbox}@{}); Ctrl-C to stop",
        client.node.local_addr(),
        client.node.name()
    );
    let until = duration.map(|d| Instant::now() + d);
    let mut n = 0u64;
    while count.is_none_or(|c| n < c)
        && until.is_none_or(|t| Instant::now() < t)
        && !stop.load(Ordering::Acquire)
    {
        let e = match mb.recv_timeout(Duration::from_millis(100)) {
            Ok(e) => e,
            Err(batchwire::RecvError::Timeout | batchwire::RecvError::Empty) => continue,
            Err(e) => return Err(format!("mailbox {mailbox}: {e}")),
        };
        n += 1;
        let (kind, text) = payload_text(&e.payload);
        if c.json {
            let mut v = json!({
                "from": e.from.to_string(),
                "to": format!("{mailbox}@{}", client.node.name()),
                "bytes": e.payload.len(),
                "request": e.is_request(),
            });
            v[kind] = json!(text);
            outln!("{v}");
        } else {
            outln!("{}\t{text}", e.from);
        }
        if let (Some(r), true) = (reply, e.is_request()) {
            e.reply(Bytes::from(r.to_string()))
                .map_err(|err| format!("reply to {}: {err}", e.from))?;
        }
    }
    drop(mb);
    client.node.shutdown();
    Ok(())
}

/// Why a node gave no status.
enum NoStatus {
    /// It has no status mailbox: not a `batchwire node` (a client, or a library node).
    NotServed(String),
    /// Anything else.
    Failed(String),
}

impl NoStatus {
    fn text(self) -> String {
        match self {
            NoStatus::NotServed(s) | NoStatus::Failed(s) => s,
        }
    }
}

/// Ask `node`'s status mailbox.
fn ask_status(
    client: &Client,
    node: &str,
    timeout: Duration,
) -> Result<serde_json::Value, NoStatus> {
    client.reach(node).map_err(NoStatus::Failed)?;
    let to = Address::new(node, STATUS_MAILBOX).map_err(|e| NoStatus::Failed(e.to_string()))?;
    let reply = client
        .node
        .request(&to, Bytes::new(), timeout)
        .map_err(|e| match e {
            batchwire::Error::Undeliverable { .. } => NoStatus::NotServed(format!(
                "{node} has no {STATUS_MAILBOX:?} mailbox: it is not a `batchwire node` \
                 (a client, or a node of an application)"
            )),
            e => NoStatus::Failed(format!("status of {node}: {e}")),
        })?;
    serde_json::from_slice(&reply.payload)
        .map_err(|e| NoStatus::Failed(format!("status of {node}: the reply is not JSON: {e}")))
}

/// Whether a member (as JSON) is shown: live ones, and with `all` every one.
fn shown(m: &serde_json::Value, all: bool) -> bool {
    all || matches!(m["state"].as_str(), Some("alive" | "suspect"))
}

/// `batchwire members`.
pub fn members(c: &Connect, node: Option<&str>, all: bool) -> Result<(), String> {
    let client = c.start(&[])?;
    let me = client.node.name().to_string();
    let list: Vec<serde_json::Value> = match node {
        // The client's own view (it joined): wait a moment for it to settle.
        None if client.joined => {
            settle(&client.node, client.timeout);
            client
                .node
                .members()
                .iter()
                .filter(|m| m.name != me)
                .map(member_json)
                .filter(|m| shown(m, all))
                .collect()
        }
        _ => {
            let target = node
                .map(str::to_string)
                .or_else(|| c.peers.first().map(|p| p.name.clone()))
                .ok_or("--node NAME: whose view to show")?;
            let s = ask_status(&client, &target, client.timeout).map_err(NoStatus::text)?;
            s["members"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m["name"] != me.as_str() && shown(m, all))
                .collect()
        }
    };
    if c.json {
        outln!("{}", serde_json::Value::Array(list));
    } else {
        outln!(
            "{:<20} {:<24} {:<8} incarnation",
            "name",
            "address",
            "state"
        );
        for m in &list {
            outln!(
                "{:<20} {:<24} {:<8} {}",
                m["name"].as_str().unwrap_or(""),
                m["addr"].as_str().unwrap_or(""),
                m["state"].as_str().unwrap_or(""),
                m["incarnation"]
            );
        }
    }
    client.node.shutdown();
    Ok(())
}

/// Wait until the view has not changed for half a second (at most `max`).
fn settle(node: &Node, max: Duration) {
    let end = Instant::now() + max;
    let mut last = node.members();
    let mut since = Instant::now();
    while Instant::now() < end && since.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        let now = node.members();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

/// `batchwire status`.
pub fn status(c: &Connect, node: Option<&str>, all: bool) -> Result<(), String> {
    let client = c.start(&[])?;
    let me = client.node.name().to_string();
    let targets: Vec<String> = match node {
        Some(n) => vec![n.to_string()],
        None if client.joined => {
            settle(&client.node, client.timeout);
            client
                .node
                .members()
                .into_iter()
                .filter(|m| m.name != me && m.state.is_live())
                .map(|m| m.name)
                .collect()
        }
        None => c.peers.iter().map(|p| p.name.clone()).collect(),
    };
    let mut answers = Vec::new();
    let mut failed = 0;
    for t in &targets {
        match ask_status(&client, t, client.timeout) {
            Ok(s) => answers.push(s),
            Err(e) => {
                // Asking every member: one that left while asked, or that serves no status
                // (a client), is not a failure of the cluster.
                let gone = node.is_none()
                    && client
                        .node
                        .members()
                        .iter()
                        .any(|m| m.name == *t && !m.state.is_live());
                let not_served = matches!(e, NoStatus::NotServed(_));
                if !(gone || not_served && node.is_none()) {
                    failed += 1;
                }
                answers.push(json!({
                    "node": t, "error": e.text(), "gone": gone, "not_served": not_served,
                }));
            }
        }
    }
    if c.json {
        outln!("{}", serde_json::Value::Array(answers.clone()));
    } else {
        for s in &answers {
            match s["error"].as_str() {
                Some(_) if s["not_served"] == true && node.is_none() => outln!(
                    "node {}: serves no status (a client, or a node of an application)",
                    s["node"].as_str().unwrap_or("?")
                ),
                Some(e) if s["gone"] == true => {
                    outln!(
                        "node {}: left while asked ({e})",
                        s["node"].as_str().unwrap_or("?")
                    )
                }
                Some(e) => outln!("node {}: no answer: {e}", s["node"].as_str().unwrap_or("?")),
                None => print_status(s, &me, all),
            }
        }
    }
    client.node.shutdown();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "{failed} of {} node(s) did not answer",
            targets.len()
        ))
    }
}

fn print_status(s: &serde_json::Value, me: &str, all: bool) {
    outln!(
        "node {} (batchwire {}) listening on {}, advertised {}, up {} s, {} threads",
        s["node"].as_str().unwrap_or("?"),
        s["version"].as_str().unwrap_or("?"),
        s["listen"].as_str().unwrap_or("?"),
        s["advertise"].as_str().unwrap_or("?"),
        s["uptime_secs"],
        s["threads"]
    );
    let members = s["members"].as_array().cloned().unwrap_or_default();
    let listed: Vec<_> = members
        .iter()
        .filter(|m| m["name"] != me && shown(m, all))
        .collect();
    outln!("  members ({}):", listed.len());
    for m in listed {
        outln!(
            "    {:<20} {:<24} {:<8} incarnation {}",
            m["name"].as_str().unwrap_or(""),
            m["addr"].as_str().unwrap_or(""),
            m["state"].as_str().unwrap_or(""),
            m["incarnation"]
        );
    }
    let peers = s["stats"]["peers"].as_array().cloned().unwrap_or_default();
    // Peers that are gone (a client that left, say) only with --all.
    let live = |name: &serde_json::Value| {
        members
            .iter()
            .any(|m| m["name"] == *name && shown(m, false))
    };
    let listed: Vec<_> = peers
        .iter()
        .filter(|p| p["peer"] != me && (all || p["connected"] == true || live(&p["peer"])))
        .collect();
    outln!("  peers ({}):", listed.len());
    for p in listed {
        outln!(
            "    {:<20} {:<12} sent {} msgs ({} B), received {} msgs ({} B), connects {}, failed {}, unacked {} B",
            p["peer"].as_str().unwrap_or(""),
            if p["connected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            p["messages_sent"],
            p["bytes_sent"],
            p["messages_received"],
            p["bytes_received"],
            p["connects"],
            p["send_failed"],
            p["unacked_bytes"]
        );
    }
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
