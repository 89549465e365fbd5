//! Mutual TLS: a three-node cluster, and every refusal seen from both sides.

mod common;

use std::path::Path;
use std::time::Duration;

use batchwire::{Address, Event, Node, NodeConfig, TlsFiles};
use common::*;

const T: Duration = Duration::from_secs(20);

fn with_tls(cfgs: Vec<NodeConfig>, certs: &Path) -> Vec<NodeConfig> {
    cfgs.into_iter()
        .map(|c| {
            let files = TlsFiles::in_dir(certs, c.name());
            c.tls(files)
        })
        .collect()
}

fn failure(rx: &std::sync::mpsc::Receiver<Event>) -> (Option<String>, String) {
    match wait_event(rx, T, |e| matches!(e, Event::HandshakeFailed { .. })) {
        Some(Event::HandshakeFailed { peer, reason, .. }) => {
            eprintln!("handshake failed: peer {peer:?}: {reason}");
            (peer, reason)
        }
        other => panic!("no handshake failure: {other:?}"),
    }
}

#[test]
fn three_nodes_talk_over_mutual_tls() {
    let certs = test_certs("main");
    let nodes = start(with_tls(mesh(&["a", "b", "c"]), &certs));
    let inboxes: Vec<_> = nodes.iter().map(|n| n.mailbox("inbox").unwrap()).collect();
    for i in 0..2000u64 {
        nodes[0]
            .send(
                &Address::new("b", "inbox").unwrap(),
                i.to_le_bytes().to_vec(),
            )
            .unwrap();
        nodes[2]
            .send(
                &Address::new("b", "inbox").unwrap(),
                i.to_le_bytes().to_vec(),
            )
            .unwrap();
    }
    nodes[1].send_all("inbox", &b"to all"[..]).unwrap();
    // b's inbox: 2,000 from a and 2,000 from c, each in order, and b's own "to all"
    // (send_all includes the sender): 4,001, nothing else.
    let mut next = std::collections::HashMap::new();
    let mut to_all = 0;
    for k in 0..4001 {
        let e = inboxes[1]
            .recv_timeout(T)
            .unwrap_or_else(|e| panic!("message {k} of 4001: {e}"));
        if &e.payload[..] == b"to all" {
            assert_eq!(e.from.node(), "b");
            to_all += 1;
            continue;
        }
        let n = next.entry(e.from.node().to_string()).or_insert(0u64);
        assert_eq!(u64::from_le_bytes(e.payload[..].try_into().unwrap()), *n);
        *n += 1;
    }
    assert_eq!(to_all, 1);
    assert_eq!((next["a"], next["c"], next.len()), (2000, 2000, 2));
    for i in [0, 2] {
        assert_eq!(&inboxes[i].recv_timeout(T).unwrap().payload[..], b"to all");
    }
    std::thread::sleep(Duration::from_millis(200));
    for (i, mb) in inboxes.iter().enumerate() {
        assert!(mb.try_recv().is_err(), "inbox {i}: a message too many");
    }
}

#[test]
fn a_certificate_from_another_ca_is_refused_on_both_sides() {
    let (good, other) = (test_certs("main"), test_certs("other"));
    let cfgs = mesh(&["a", "b"]);
    let b = Node::start(cfgs[1].clone().tls(TlsFiles::in_dir(&good, "b"))).unwrap();
    let b_events = b.events();
    let a = Node::start(cfgs[0].clone().tls(TlsFiles::in_dir(&other, "a"))).unwrap();
    let a_events = a.events();
    let (peer, reason) = failure(&a_events);
    assert_eq!(peer.as_deref(), Some("b"));
    assert!(
        reason.contains("TLS") && reason.to_lowercase().contains("certificate"),
        "{reason}"
    );
    let (_, reason) = failure(&b_events);
    assert!(reason.contains("TLS"), "{reason}");
    assert!(a.connected_peers().is_empty());
}

#[test]
fn a_certificate_that_names_another_node_is_refused() {
    let certs = test_certs("main");
    let cfgs = mesh(&["a", "b"]);
    let b = Node::start(cfgs[1].clone().tls(TlsFiles::in_dir(&certs, "b"))).unwrap();
    let b_events = b.events();
    // Node "a" presents the certificate of "zz": valid CA, wrong name.
    let a = Node::start(cfgs[0].clone().tls(TlsFiles {
        cert: certs.join("zz.pem"),
        key: certs.join("zz-key.pem"),
        ca: certs.join("ca.pem"),
    }))
    .unwrap();
    let a_events = a.events();
    let (peer, reason) = failure(&b_events);
    assert_eq!(peer.as_deref(), Some("a"));
    assert!(reason.contains(r#"does not name "a""#), "{reason}");
    let (_, reason) = failure(&a_events);
    assert!(reason.contains("does not name"), "{reason}");
}

#[test]
fn a_server_certificate_for_another_name_is_refused_by_the_dialler() {
    let certs = test_certs("main");
    let cfgs = mesh(&["a", "b"]);
    // "b" serves with the certificate of "zz"; "a" dials "b" and checks the name.
    let b = Node::start(cfgs[1].clone().tls(TlsFiles {
        cert: certs.join("zz.pem"),
        key: certs.join("zz-key.pem"),
        ca: certs.join("ca.pem"),
    }))
    .unwrap();
    let b_events = b.events();
    let a = Node::start(cfgs[0].clone().tls(TlsFiles::in_dir(&certs, "a"))).unwrap();
    let a_events = a.events();
    let (_, reason) = failure(&a_events);
    assert!(
        reason.contains("NotValidForName") || reason.contains("not valid for"),
        "{reason}"
    );
    let (_, reason) = failure(&b_events);
    assert!(reason.contains("TLS"), "{reason}");
}

#[test]
fn a_client_without_a_certificate_is_refused() {
    use std::io::Write;
    let certs = test_certs("main");
    let b = Node::start(
        mesh(&["a", "b"])[1]
            .clone()
            .tls(TlsFiles::in_dir(&certs, "b")),
    )
    .unwrap();
    let events = b.events();
    // A TLS client that trusts the CA but presents no certificate.
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_file_iter(certs.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(cfg), "b".try_into().unwrap()).unwrap();
    let mut sock = std::net::TcpStream::connect(b.local_addr()).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let mut client_err = None;
    for _ in 0..20 {
        match conn.complete_io(&mut sock) {
            Ok(_) if !conn.is_handshaking() => {
                // TLS 1.3: the server's refusal arrives after the client's Finished.
                let _ = conn.writer().write_all(b"x");
                if let Err(e) = conn.complete_io(&mut sock) {
                    client_err = Some(e.to_string());
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                client_err = Some(e.to_string());
                break;
            }
        }
    }
    let client_err = client_err.expect("the node accepted a client without a certificate");
    assert!(
        client_err.to_lowercase().contains("certificate"),
        "{client_err}"
    );
    let (_, reason) = failure(&events);
    assert!(
        reason.contains("TLS") && reason.contains("ertificate"),
        "{reason}"
    );
}

#[test]
fn a_plaintext_node_and_a_tls_node_refuse_each_other_clearly() {
    let certs = test_certs("main");
    let cfgs = mesh(&["a", "b"]);
    let b = Node::start(cfgs[1].clone().tls(TlsFiles::in_dir(&certs, "b"))).unwrap();
    let b_events = b.events();
    let a = Node::start(cfgs[0].clone()).unwrap(); // no TLS; dials b
    let a_events = a.events();
    let (_, reason) = failure(&b_events);
    assert!(reason.contains("TLS"), "{reason}");
    let (peer, reason) = failure(&a_events);
    assert_eq!(
        peer.as_deref(),
        Some("b"),
        "the dialler names the node it dialled"
    );
    assert!(reason.contains("speaks TLS"), "{reason}");
}

/// A client with a valid certificate that sends bytes that are not TLS records once the
/// TLS handshake is done: the node refuses that connection, saying it was TLS that failed,
/// and goes on serving real peers.
#[test]
fn garbage_after_the_tls_handshake_closes_only_that_connection() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    let certs = test_certs("main");
    let cfgs = with_tls(mesh(&["a", "b"]), &certs);
    let b = Node::start(cfgs[1].clone()).unwrap();
    let events = b.events();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certs.join("zz.pem"))
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(certs.join("zz-key.pem")).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(cfg), "b".try_into().unwrap()).unwrap();
    let mut sock = std::net::TcpStream::connect(b.local_addr()).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    for _ in 0..20 {
        if !conn.is_handshaking() {
            break;
        }
        conn.complete_io(&mut sock).unwrap();
    }
    assert!(!conn.is_handshaking(), "the TLS handshake did not finish");
    // An application-data record header and 32 bytes that do not decrypt.
    sock.write_all(&[0x17, 0x03, 0x03, 0x00, 0x20]).unwrap();
    sock.write_all(&[0xAB; 32]).unwrap();
    let (_, reason) = failure(&events);
    assert!(reason.contains("TLS"), "{reason}");
    // The node closed that connection (the end of the stream, or a reset: not a read that
    // times out on a connection still open)...
    let mut rest = Vec::new();
    let r = sock.read_to_end(&mut rest);
    assert!(
        !matches!(&r, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the connection is still open: {r:?}"
    );
    // ...and still serves a real peer.
    let a = Node::start(cfgs[0].clone()).unwrap();
    let inbox = b.mailbox("inbox").unwrap();
    a.send(&Address::new("b", "inbox").unwrap(), &b"after"[..])
        .unwrap();
    assert_eq!(&inbox.recv_timeout(T).unwrap().payload[..], b"after");
}
