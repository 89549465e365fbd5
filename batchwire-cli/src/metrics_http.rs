//! `batchwire node --metrics-listen`: the node's counters for Prometheus at
//! `http://ADDR/metrics`, and its status as JSON at `http://ADDR/status` (what
//! `batchwire status --json` prints), served by one small, bounded HTTP/1.0 responder.
//!
//! Anyone who can reach the port can talk to it, so it is bounded like the node's own
//! listener: at most [`MAX_CONNECTIONS`] requests are served at once (one more takes the
//! place of the oldest still sending its head, which is cut, so silent connections cannot
//! keep a scrape out; with every place answering, it is closed at once), each must send
//! its whole request head within [`HEAD_DEADLINE`] and at most [`MAX_HEAD`] bytes and take
//! its answer within [`ANSWER_DEADLINE`], and a failure to accept (too many open files,
//! say) backs off up to a second and is logged at most once per ten seconds with how many
//! happened. A bare port binds to loopback: serving the counters beyond the host must be
//! asked for with an address.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;

/// Requests served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Largest request head taken.
pub const MAX_HEAD: usize = 8 << 10;
/// Time a client has to take the whole answer.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

/// Connections still sending their request head, by arrival (the oldest is cut to make
/// room when every place is taken).
#[derive(Clone, Default)]
struct Heads(Arc<Mutex<Vec<(u64, Instant, TcpStream)>>>);

/// A connection still without its whole head this long after it came is taken for a
/// silent one (a scraper sends its head at once), and may be cut to make room.
const SILENT_AFTER: Duration = Duration::from_millis(200);

impl Heads {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Instant, TcpStream)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cut the oldest connection still sending its head, if it has been at it for
    /// `SILENT_AFTER`; whether there was one.
    fn cut_oldest(&self) -> bool {
        let mut g = self.lock();
        let Some(i) = (0..g.len()).min_by_key(|&i| g[i].0) else {
            return false;
        };
        if g[i].1.elapsed() < SILENT_AFTER {
            return false;
        }
        let (_, _, s) = g.swap_remove(i);
        let _ = s.shutdown(std::net::Shutdown::Both);
        true
    }

    fn forget(&self, id: u64) {
        self.lock().retain(|(i, _, _)| *i != id);
    }
}

/// `--metrics-listen`'s value: `PORT` (on 127.0.0.1) or `HOST:PORT`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        format!("{s:?} is neither a port (served on 127.0.0.1) nor an address such as 127.0.0.1:9100 or 0.0.0.0:9100")
    })
}

/// The node's status as JSON, as the node last published it (`/status`).
pub type StatusCell = Arc<Mutex<String>>;

/// What is served: the metrics, and the status.
#[derive(Clone)]
pub struct Served {
    pub metrics: PrometheusHandle,
    pub status: StatusCell,
}

/// Install the Prometheus recorder and serve it on `addr` from a thread of its own.
/// Returns the handle (the caller runs its upkeep now and then) and the status cell (the
/// caller fills it).
pub fn serve(addr: SocketAddr) -> Result<Served, String> {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    // The port the system chose, if asked for port 0.
    let addr = listener.local_addr().unwrap_or(addr);
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        // A real histogram (buckets sum across nodes), not a summary.
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("batchwire_messages_per_write".into()),
            &batchwire::MESSAGES_PER_WRITE_BUCKETS,
        )
        .map_err(|e| format!("cannot set the histogram's buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let served = Served {
        metrics: handle,
        status: Arc::new(Mutex::new("{}".into())),
    };
    let h = served.clone();
    std::thread::Builder::new()
        .name("bw-metrics".into())
        .spawn(move || accept_loop(listener, h))
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    tracing::info!(%addr, "serving metrics at http://{addr}/metrics and the status at /status");
    Ok(served)
}

fn accept_loop(listener: TcpListener, handle: Served) {
    let busy = Arc::new(AtomicUsize::new(0));
    let heads = Heads::default();
    let mut next_id = 0u64;
    let mut pause = Duration::from_millis(10);
    let mut errors = 0u64;
    let mut last_log: Option<Instant> = None;
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => {
                pause = Duration::from_millis(10);
                s
            }
            Err(e) => {
                // Typically out of file descriptors: wait, longer each time, and say so
                // once per ten seconds.
                errors += 1;
                if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(error = %e, errors_so_far = errors, "metrics: accept failed; backing off");
                    last_log = Some(Instant::now());
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // Every place taken: the oldest still silent gives way (its thread ends at once),
        // or, with every place answering or just come, this one is closed at once. Cut
        // threads count until they end: never more than twice the places at once.
        let before = busy.fetch_add(1, Ordering::AcqRel);
        if before >= 2 * MAX_CONNECTIONS || (before >= MAX_CONNECTIONS && !heads.cut_oldest()) {
            busy.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        next_id += 1;
        let id = next_id;
        if let Ok(c) = stream.try_clone() {
            heads.lock().push((id, Instant::now(), c));
        }
        let (b, h, hs) = (busy.clone(), handle.clone(), heads.clone());
        let spawned = std::thread::Builder::new()
            .name("bw-metrics-req".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let _ = respond(stream, &h, || hs.forget(id));
                hs.forget(id);
                b.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            heads.forget(id);
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Read one request head (within the deadline and the size bound) and answer it;
/// `head_done` once the head is whole.
fn respond(mut s: TcpStream, served: &Served, head_done: impl FnOnce()) -> std::io::Result<()> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > MAX_HEAD {
            return Ok(()); // cut
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(_) => return Ok(()),
        }
    }
    head_done();
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    const TEXT: &str = "text/plain; version=0.0.4";
    let (status, kind, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => ("200 OK", TEXT, served.metrics.render()),
        (Some("GET"), Some("/status")) => (
            "200 OK",
            "application/json",
            served
                .status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        ),
        (Some("GET"), Some(_)) => (
            "404 Not Found",
            TEXT,
            "only /metrics and /status are served\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            TEXT,
            "only GET /metrics and GET /status\n".into(),
        ),
    };
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body.as_bytes());
    // The whole answer within its deadline, however slowly the client reads: each write
    // waits at most for what is left of it.
    let deadline = Instant::now() + ANSWER_DEADLINE;
    let mut rest = &answer[..];
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(()); // cut
        }
        s.set_write_timeout(Some(left))?;
        let n = s.write(rest)?;
        if n == 0 {
            return Ok(());
        }
        rest = &rest[n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every place held by silent connections: a scrape still gets its answer (the
    /// oldest silent one gives way).
    #[test]
    fn silent_connections_cannot_keep_a_scrape_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let served = Served {
            metrics: recorder.handle(),
            status: Arc::new(Mutex::new("{\"up\":1}".into())),
        };
        std::thread::spawn(move || accept_loop(listener, served));
        let silent: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Accepted, and silent for longer than a scraper would be.
        std::thread::sleep(SILENT_AFTER + Duration::from_millis(300));
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /status HTTP/1.0\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out:?}");
        assert!(out.ends_with("{\"up\":1}"), "{out:?}");
        drop(silent);
    }

    #[test]
    fn a_bare_port_is_loopback_an_address_is_taken_as_given() {
        assert_eq!(
            parse_addr("9100").unwrap(),
            "127.0.0.1:9100".parse().unwrap()
        );
        assert_eq!(
            parse_addr("0.0.0.0:9100").unwrap(),
            "0.0.0.0:9100".parse().unwrap()
        );
        assert_eq!(
            parse_addr("[::1]:9100").unwrap(),
            "[::1]:9100".parse().unwrap()
        );
        let e = parse_addr("nowhere").unwrap_err();
        assert!(e.contains("127.0.0.1"), "{e}");
    }
}
