//! The hol scenario's worker processes: the sender (small messages beside a bulk stream)
//! and the receiver.

use super::*;

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// send or recv.
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub listen: SocketAddr,
    #[arg(long)]
    pub peer: SocketAddr,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
    #[arg(long, default_value_t = 3000)]
    pub phase_ms: u64,
    #[arg(long)]
    pub bulk_inflight_bytes: Option<usize>,
}

/// What n0 reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SendReport {
    pub rtt_alone: Vec<(u64, u64)>,
    pub rtt_bulk: Vec<(u64, u64)>,
    /// Pings whose answer was not the ping (lost, duplicated or reordered).
    pub ping_faults: Faults,
    pub bulk_sent: u64,
    pub bulk_secs: f64,
    /// Messages sent to "read" in phases 3 and 4, to "other1" and to "other2".
    pub read_sent: [u64; 2],
    pub other1_sent: u64,
    pub other2_sent: u64,
    /// `try_send` to "other2" answered `Full`.
    pub other2_full: u64,
}

/// What n1 reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RecvReport {
    /// Per stream (bulk, read, other1, other2): in order, and faults seen.
    pub got: [u64; 4],
    pub dup: [u64; 4],
    pub reordered: [u64; 4],
    /// Bulk messages that arrived with the wrong length.
    pub bad_len: u64,
    /// Seconds from the first to the last message of "read" in phases 3 and 4.
    pub read_secs: [f64; 2],
}

/// One stream's order check: sequence numbers must come 0, 1, 2, ...
#[derive(Default)]
pub(super) struct Seq {
    next: u64,
    dup: u64,
    reordered: u64,
}

impl Seq {
    fn see(&mut self, k: u64) {
        match k.cmp(&self.next) {
            std::cmp::Ordering::Equal => self.next += 1,
            std::cmp::Ordering::Less => self.dup += 1,
            std::cmp::Ordering::Greater => {
                self.reordered += 1;
                self.next = k + 1;
            }
        }
    }
}

/// A small message: its sequence number, its phase, then zeros.
pub(super) fn small(k: u64, phase: u8) -> Bytes {
    let mut b = BytesMut::with_capacity(SMALL);
    b.put_u64_le(k);
    b.put_u8(phase);
    b.put_bytes(0, SMALL - 9);
    b.freeze()
}

pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    match a.role.as_str() {
        "send" => send(a, secret),
        "recv" => recv(a, secret),
        other => Err(format!("unknown hol role {other:?}")),
    }
}

pub(super) fn start(
    a: &WorkerArgs,
    secret: &[u8],
    me: &str,
    peer: &str,
    boxes: &[&str],
) -> Result<Node, String> {
    let mut cfg = NodeConfig::new(me, a.listen, secret)
        .peer(peer, a.peer)
        .mailbox(CTL)
        .bundler(a.bundler)
        .idle_cpu_level(a.idle_cpu_level)
        .max_payload(BULK);
    if let Some(v) = a.bulk_inflight_bytes {
        cfg = cfg.bulk_inflight_bytes(v);
    }
    for b in boxes {
        cfg = cfg.mailbox(*b);
    }
    let node =
        Node::start(crate::bench::with_bench_settings(cfg, None)).ctx("starting the node")?;
    if !node.wait_for_peers(&[peer], Duration::from_secs(30)) {
        return Err(format!("{peer} did not come up within 30 s"));
    }
    Ok(node)
}

/// Ping `to` one message at a time until `until`; record round trips.
pub(super) fn ping(
    pong: &Mailbox,
    to: &Address,
    until: Instant,
    k: &mut u64,
    faults: &mut Faults,
) -> Result<Vec<(u64, u64)>, String> {
    let mut h = new_histogram()?;
    while Instant::now() < until {
        let t0 = Instant::now();
        pong.send(to, small(*k, 0)).ctx("ping")?;
        match pong.recv_timeout(Duration::from_secs(10)) {
            Ok(e) if u64_at(&e.payload, 0) == Some(*k) => {
                h.record(t0.elapsed().as_nanos().max(1) as u64)
                    .ctx("recording")?;
            }
            Ok(_) => faults.reordered += 1,
            Err(e) => {
                faults.lost += 1;
                return Err(format!("ping {k}: no answer within 10 s ({e})"));
            }
        }
        *k += 1;
    }
    Ok(hist_to_pairs(&h))
}

/// Stream small messages to `to` until `stop`; `try_` backs off on `Full` (counted).
pub(super) fn stream(
    node: &Node,
    to: &Address,
    phase: u8,
    k: &mut u64,
    stop: &AtomicBool,
    full: Option<&AtomicU64>,
) -> Result<(), String> {
    while !stop.load(Ordering::Relaxed) {
        match full {
            None => node.send(to, small(*k, phase)).ctx("send")?,
            Some(f) => match node.try_send(to, small(*k, phase)) {
                Ok(()) => {}
                Err(Error::Full { .. }) => {
                    f.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(format!("try_send to {to}: {e}")),
            },
        }
        *k += 1;
    }
    Ok(())
}

pub(super) fn send(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let node = start(a, secret, "n0", "n1", &["pong"])?;
    let mut ctl = Ctl::new(&node, 0, 2)?;
    ctl.barrier(1, Duration::from_secs(30))?;
    let at = |m: &str| Address::new("n1", m).ctx("address");
    let (echo, bulk, read) = (at("echo")?, at("bulk")?, at("read")?);
    let (other1, other2) = (at("other1")?, at("other2")?);
    let phase = Duration::from_millis(a.phase_ms);
    let pong = node.mailbox("pong").ctx("mailbox")?;
    let mut r = SendReport::default();
    let mut k = 0;
    // 1 and 2: round trips alone, then beside the bulk stream.
    r.rtt_alone = ping(
        &pong,
        &echo,
        Instant::now() + phase,
        &mut k,
        &mut r.ping_faults,
    )?;
    let stop = AtomicBool::new(false);
    let (bulk_sent, bulk_secs) = std::thread::scope(|s| -> Result<(u64, f64), String> {
        let streamer = s.spawn(|| -> Result<(u64, f64), String> {
            let t0 = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Zeroed memory is mapped lazily: only the header's page is written.
                let mut v = vec![0u8; BULK];
                v[..8].copy_from_slice(&n.to_le_bytes());
                node.send_with(&bulk, v, Class::Bulk).ctx("bulk send")?;
                n += 1;
            }
            Ok((n, t0.elapsed().as_secs_f64()))
        });
        // Let the stream get going before timing pings beside it.
        std::thread::sleep(Duration::from_millis(200));
        let res = ping(
            &pong,
            &echo,
            Instant::now() + phase,
            &mut k,
            &mut r.ping_faults,
        );
        stop.store(true, Ordering::Relaxed);
        let sent = streamer.join().map_err(|_| "the bulk thread panicked")?;
        r.rtt_bulk = res?;
        sent
    })?;
    (r.bulk_sent, r.bulk_secs) = (bulk_sent, bulk_secs);
    ctl.barrier(2, Duration::from_secs(120))?;
    // 3 and 4: the rate to "read", beside a read mailbox, then beside an unread one.
    let mut kr = 0u64;
    let full = AtomicU64::new(0);
    for (p, other) in [(3u8, &other1), (4u8, &other2)] {
        let stop = AtomicBool::new(false);
        let start_k = kr;
        let mut ko = 0u64;
        std::thread::scope(|s| -> Result<(), String> {
            let o = s.spawn(|| {
                let f = (p == 4).then_some(&full);
                stream(&node, other, p, &mut ko, &stop, f)
            });
            let main = s.spawn(|| stream(&node, &read, p, &mut kr, &stop, None));
            std::thread::sleep(phase);
            stop.store(true, Ordering::Relaxed);
            main.join().map_err(|_| "a sending thread panicked")??;
            o.join().map_err(|_| "a sending thread panicked")??;
            Ok(())
        })?;
        r.read_sent[(p - 3) as usize] = kr - start_k;
        if p == 3 {
            r.other1_sent = ko;
        } else {
            r.other2_sent = ko;
        }
    }
    r.other2_full = full.load(Ordering::Relaxed);
    drop(pong);
    ctl.finish(Duration::from_secs(120))?;
    node.shutdown();
    print_result(&r)
}

/// Read a stream until n0 is done and nothing came for a while; check its order.
pub(super) fn consume(mb: &Mailbox, seq: &mut Seq, done: &AtomicBool, each: &mut dyn FnMut(&[u8])) {
    let mut quiet_since: Option<Instant> = None;
    let mut batch = Vec::with_capacity(1024);
    loop {
        match mb.recv_batch_into(&mut batch, 1024, Duration::from_millis(20)) {
            Ok(_) => {
                quiet_since = None;
                for e in batch.drain(..) {
                    seq.see(u64_at(&e.payload, 0).unwrap_or(u64::MAX));
                    each(&e.payload);
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) if done.load(Ordering::Relaxed) => {
                let t = *quiet_since.get_or_insert_with(Instant::now);
                if t.elapsed() > QUIET {
                    return;
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => return,
        }
    }
}

pub(super) fn recv(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let boxes = ["echo", "bulk", "read", "other1", "other2"];
    let node = start(a, secret, "n1", "n0", &boxes)?;
    let mut ctl = Ctl::new(&node, 1, 2)?;
    let mbs: Vec<Mailbox> = boxes
        .iter()
        .map(|b| node.mailbox(b).ctx("mailbox"))
        .collect::<Result<_, _>>()?;
    ctl.barrier(1, Duration::from_secs(30))?;
    let done = AtomicBool::new(false);
    let mut r = RecvReport::default();
    let mut seqs: [Seq; 4] = Default::default();
    let mut times: [Option<(Instant, Instant)>; 2] = [None, None];
    let mut bad_len = 0u64;
    std::thread::scope(|s| -> Result<(), String> {
        let done = &done;
        // Serve the pings.
        let echo = &mbs[0];
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok(e) = echo.recv_timeout(Duration::from_millis(20)) {
                    let _ = echo.send(&e.from, e.payload);
                }
            }
        });
        let [s_bulk, s_read, s_other1, s_other2] = &mut seqs;
        let (m_bulk, m_read, m_other1) = (&mbs[1], &mbs[2], &mbs[3]);
        let times = &mut times;
        let bad_len = &mut bad_len;
        s.spawn(move || {
            consume(m_bulk, s_bulk, done, &mut |p| {
                if p.len() != BULK {
                    *bad_len += 1;
                }
            })
        });
        s.spawn(move || {
            consume(m_read, s_read, done, &mut |p| {
                let ph = p.get(8).copied().unwrap_or(0);
                if let Some(i) = ph.checked_sub(3).map(usize::from).filter(|i| *i < 2) {
                    let now = Instant::now();
                    let t = times[i].get_or_insert((now, now));
                    t.1 = now;
                }
            })
        });
        s.spawn(move || consume(m_other1, s_other1, done, &mut |_| {}));
        ctl.barrier(2, Duration::from_secs(120))?;
        // "other2" is not read while n0 sends (phase 4); only once it is done.
        let res = ctl.finish(Duration::from_secs(120));
        done.store(true, Ordering::Relaxed);
        consume(&mbs[4], s_other2, done, &mut |_| {});
        res
    })?;
    r.bad_len = bad_len;
    for (i, s) in seqs.iter().enumerate() {
        (r.got[i], r.dup[i], r.reordered[i]) = (s.next, s.dup, s.reordered);
    }
    // The per-phase counts of "read" follow from the sequence numbers n0 sent; n1 gives
    // the time spans.
    for (i, t) in times.iter().enumerate() {
        r.read_secs[i] = t.map(|(a, b)| (b - a).as_secs_f64()).unwrap_or(0.0);
    }
    drop(mbs);
    node.shutdown();
    print_result(&r)
}
