//! The TCP ping-pong floor of the `rpc` scenario: the same request size between two
//! processes over plain `TcpStream`s (`TCP_NODELAY`, one request in flight), so the
//! one-outstanding-call rows have an in-run floor to stand beside.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::rpc::{CALL_TIMEOUT, CallReport, HEADER, WorkerArgs};
use super::{Context, hist_to_pairs, new_histogram, node_addr, print_result, u64_at};

/// Run a floor role (`tcp-server` or `tcp-client`); prints its report line on stdout.
pub fn worker(a: &WorkerArgs) -> Result<(), String> {
    match a.role.as_str() {
        "tcp-server" => server(a),
        "tcp-client" => client(a),
        other => Err(format!("unknown ping-pong role {other:?}")),
    }
}

/// Echo fixed-size requests until the client closes.
fn server(a: &WorkerArgs) -> Result<(), String> {
    let addr = node_addr(a.base_port, 1)?;
    let l = TcpListener::bind(addr).ctx(&format!("tcp listen on {addr}"))?;
    let (mut s, _) = l.accept().ctx("tcp accept")?;
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; a.size.max(HEADER)];
    let mut served = 0u64;
    loop {
        match s.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("tcp read: {e}")),
        }
        s.write_all(&buf).ctx("tcp write")?;
        served += 1;
    }
    print_result(&CallReport {
        calls: served,
        ..CallReport::default()
    })
}

/// Make `a.calls` calls, one in flight, recording each call's latency.
fn client(a: &WorkerArgs) -> Result<(), String> {
    let addr = node_addr(a.base_port, 1)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("tcp connect: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    s.set_nodelay(true).ctx("TCP_NODELAY")?;
    s.set_read_timeout(Some(CALL_TIMEOUT)).ctx("read timeout")?;
    let size = a.size.max(HEADER);
    let (mut req, mut resp) = (vec![0u8; size], vec![0u8; size]);
    let mut hist = new_histogram()?;
    let mut rep = CallReport::default();
    let t0 = Instant::now();
    for id in 0..a.calls {
        req[..8].copy_from_slice(&id.to_le_bytes());
        let t = Instant::now();
        s.write_all(&req).ctx("tcp write")?;
        if let Err(e) = s.read_exact(&mut resp) {
            tracing::warn!(error = %e, "tcp ping-pong: no reply");
            rep.faults.lost += a.calls - id;
            break;
        }
        hist.saturating_record(t.elapsed().as_nanos() as u64);
        if u64_at(&resp, 0) == Some(id) {
            rep.calls += 1;
        } else {
            rep.faults.reordered += 1;
        }
    }
    rep.secs = t0.elapsed().as_secs_f64();
    rep.hist = hist_to_pairs(&hist);
    print_result(&rep)
}
