//! Helpers for the integration tests: free ports and small clusters in one process.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use batchwire::{Event, Node, NodeConfig};
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, Resume};
use batchwire_core::handshake::{Handshake, HandshakeConfig, Role};
use std::sync::Arc;

pub mod raw;

pub const SECRET: &[u8] = b"test-cluster-secret";

/// The committed test certificates of CA `set` ("main": a, b, c, zz; "other": a).
pub fn test_certs(set: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/certs")
        .join(set)
}

/// Free loopback addresses, on ports below the kernel's ephemeral range (32768 and up on
/// Linux): a port picked by binding to port 0 comes from that range, and a node dialling a
/// peer that is not up yet may get it as its outgoing connection's port before the peer
/// binds it (seen once: "address in use" for a node started late). Each call takes the
/// next ports that bind, from a start that differs per process.
pub fn free_addrs(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_run(1))))
        .collect()
}

/// The first of `n` consecutive free ports, taken for this caller alone (see
/// [`free_addrs`]; a bench's node i listens on base + i).
pub fn free_run(n: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 12_000;
    const SPAN: u32 = 20_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919)) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let start = NEXT.fetch_add(n as u32, Ordering::Relaxed) % SPAN;
        if start + n as u32 > SPAN {
            continue;
        }
        let base = (LOW + start) as u16;
        // UDP as well: a node with membership binds its datagram socket on the same port,
        // and a port free for TCP may be taken for UDP.
        if (0..n).all(|i| {
            TcpListener::bind(("127.0.0.1", base + i)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", base + i)).is_ok()
        }) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports in {LOW}..{}", LOW + SPAN)
}

/// Configs for a full mesh of nodes with the given names.
pub fn mesh(names: &[&str]) -> Vec<NodeConfig> {
    let addrs = free_addrs(names.len());
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut c = NodeConfig::new(*n, addrs[i], SECRET);
            for (j, m) in names.iter().enumerate() {
                if i != j {
                    c = c.peer(*m, addrs[j]);
                }
            }
            c
        })
        .collect()
}

/// Start every config and wait until the mesh is connected.
pub fn start(cfgs: Vec<NodeConfig>) -> Vec<Node> {
    let names: Vec<String> = cfgs.iter().map(|c| c.name().to_string()).collect();
    let nodes: Vec<Node> = cfgs.into_iter().map(|c| Node::start(c).unwrap()).collect();
    for n in &nodes {
        let others: Vec<&str> = names
            .iter()
            .filter(|m| *m != n.name())
            .map(|s| s.as_str())
            .collect();
        assert!(
            n.wait_for_peers(&others, Duration::from_secs(10)),
            "{} did not connect to {others:?}: {:?}",
            n.name(),
            n.connected_peers()
        );
    }
    nodes
}

/// Nodes `names` in a full mesh on loopback, each with a mailbox "inbox", started.
pub fn start_with_inbox(names: &[&str]) -> Vec<Node> {
    start(
        mesh(names)
            .into_iter()
            .map(|c| c.mailbox("inbox"))
            .collect(),
    )
}

/// Wait (bounded) for an event matching `pred`.
pub fn wait_event(
    rx: &Receiver<Event>,
    timeout: Duration,
    pred: impl Fn(&Event) -> bool,
) -> Option<Event> {
    let deadline = Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(e) if pred(&e) => return Some(e),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// A raw peer with the secret: it logs in to `addr` as `name`, resumes from scratch, and
/// then does nothing but what the test asks.
pub fn raw_peer(addr: std::net::SocketAddr, name: &str, expect: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hs = Handshake::new(
        HandshakeConfig {
            name: Name::new(name).unwrap(),
            incarnation: 7,
            secret: Arc::from(SECRET),
            role: Role::Dial {
                expect: Name::new(expect).unwrap(),
            },
        },
        [9; 16],
    );
    let mut buf = bytes::BytesMut::new();
    let mut out = Vec::new();
    loop {
        while let Some(f) = hs.poll_transmit() {
            f.encode(&mut out);
        }
        s.write_all(&out).unwrap();
        out.clear();
        if hs.is_done() {
            break;
        }
        let f = loop {
            if let Some(f) = frame::decode(&mut buf, 1 << 16).unwrap() {
                break f;
            }
            let mut chunk = [0u8; 512];
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        hs.handle(f).unwrap();
    }
    Frame::Resume(Resume::FRESH).encode(&mut out);
    s.write_all(&out).unwrap();
    s
}
