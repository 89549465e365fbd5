//! The rpc scenario's worker processes: callers (blocking threads or one async runtime) and
//! the serving node.

use super::*;

/// Arguments of the worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// node, tcp-server or tcp-client.
    #[arg(long)]
    pub role: String,
    /// This node's index (it listens on base-port + index).
    #[arg(long, default_value_t = 0)]
    pub index: usize,
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Nodes 0..clients make calls; the others only serve.
    #[arg(long)]
    pub clients: Option<usize>,
    #[arg(long)]
    pub base_port: u16,
    /// Calling threads per calling node.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Calls per calling node, over its threads.
    #[arg(long)]
    pub calls: u64,
    #[arg(long)]
    pub size: usize,
    #[arg(long, default_value = "natural")]
    pub bundler: BundlerKind,
    #[arg(long, default_value_t = 1)]
    pub idle_cpu_level: u8,
    /// With N > 0: instead of threads, one tokio runtime with N requests in flight.
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
}

/// What a node (or the TCP client) reports. A node that only serves reports no calls.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CallReport {
    /// Calls answered correctly.
    pub calls: u64,
    pub faults: Faults,
    /// From the start barrier until the node's last thread finished its calls.
    pub secs: f64,
    /// The latency histogram (ns) as (value, count) pairs.
    pub hist: Vec<(u64, u64)>,
}

/// The payload of call `id`: the id, then zeros up to `size`.
pub(super) fn call_payload(chunk: &mut BytesMut, id: u64, size: usize) -> bytes::Bytes {
    if chunk.capacity() < size {
        *chunk = BytesMut::with_capacity((256 << 10).max(size));
    }
    chunk.put_u64_le(id);
    chunk.put_bytes(0, size - HEADER);
    chunk.split().freeze()
}

/// Count a call's outcome: a reply that does not carry the call's id is a fault.
pub(super) fn check_reply(r: Result<Envelope, batchwire::Error>, id: u64, f: &mut Faults) -> bool {
    match r {
        Ok(e) => match u64_at(&e.payload, 0) {
            Some(x) if x == id => true,
            Some(x) if x < id => {
                f.duplicated += 1;
                false
            }
            _ => {
                f.reordered += 1;
                false
            }
        },
        Err(_) => {
            f.lost += 1;
            false
        }
    }
}

/// Make `calls` synchronous calls (`Node::request`) to random `targets`, recording each
/// call's latency in `hist`. A reply that does not carry its call's id counts as a fault; a
/// call unanswered within [`CALL_TIMEOUT`] as lost.
pub fn call_loop(
    node: &Node,
    targets: &[Address],
    calls: u64,
    size: usize,
    seed: u64,
    hist: &mut Histogram<u64>,
) -> Result<(u64, Faults), String> {
    let mut rng = Rng::new(seed);
    let mut chunk = BytesMut::new();
    let mut f = Faults::default();
    let size = size.max(HEADER);
    let mut ok = 0;
    for id in 0..calls {
        let p = call_payload(&mut chunk, id, size);
        let to = &targets[rng.below(targets.len())];
        let t = Instant::now();
        let r = node.request(to, p, CALL_TIMEOUT);
        if let Err(e @ (batchwire::Error::ShutDown { .. } | batchwire::Error::UnknownNode(_))) = &r
        {
            return Err(format!("call to {to}: {e}"));
        }
        if check_reply(r, id, &mut f) {
            hist.saturating_record(t.elapsed().as_nanos() as u64);
            ok += 1;
        }
    }
    Ok((ok, f))
}

/// Make `calls` requests from one tokio runtime (current-thread: the node's threads do the
/// IO), `concurrency` of them in flight at once, to random `targets`.
pub(super) fn async_calls(
    node: &Node,
    targets: &[Address],
    calls: u64,
    size: usize,
    concurrency: usize,
    seed: u64,
) -> Result<CallReport, String> {
    use futures_util::StreamExt;
    use futures_util::stream::FuturesUnordered;
    use std::cell::RefCell;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .ctx("tokio runtime")?;
    let hist = RefCell::new(new_histogram()?);
    let faults = RefCell::new(Faults::default());
    let size = size.max(HEADER);
    let t0 = Instant::now();
    let ok = rt.block_on(async {
        let tasks: FuturesUnordered<_> = (0..concurrency)
            .map(|task| {
                let (hist, faults) = (&hist, &faults);
                async move {
                    let mut rng = Rng::new(seed * 100_000 + task as u64);
                    let mut chunk = BytesMut::new();
                    let mut ok = 0u64;
                    for id in 0..share(calls, concurrency, task) {
                        let p = call_payload(&mut chunk, id, size);
                        let to = &targets[rng.below(targets.len())];
                        let t = Instant::now();
                        let r = node.request_async(to, p, CALL_TIMEOUT).await;
                        if check_reply(r, id, &mut faults.borrow_mut()) {
                            hist.borrow_mut()
                                .saturating_record(t.elapsed().as_nanos() as u64);
                            ok += 1;
                        }
                    }
                    ok
                }
            })
            .collect();
        tasks.fold(0u64, |a, b| async move { a + b }).await
    });
    Ok(CallReport {
        calls: ok,
        faults: faults.into_inner(),
        secs: t0.elapsed().as_secs_f64(),
        hist: hist_to_pairs(&hist.into_inner()),
    })
}

/// Serve calls on `mb` (answer every request with its payload) until `stop` is set and
/// nothing is left.
pub(super) fn serve(mb: &Mailbox, stop: &AtomicBool) -> Result<(), String> {
    let mut batch = Vec::with_capacity(1024);
    loop {
        match mb.recv_batch_into(&mut batch, 1024, Duration::from_millis(20)) {
            Ok(_) => {
                for e in batch.drain(..) {
                    e.reply(e.payload.clone())
                        .map_err(|err| format!("reply to {}: {err}", e.from))?;
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) if stop.load(Ordering::Acquire) => {
                return Ok(());
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(_) => return Ok(()),
        }
    }
}

/// Run `threads` calling threads, sharing `calls` between them, and fold what they saw into
/// one report (the time is that of the slowest thread).
pub(super) fn run_callers(
    node: &Node,
    threads: usize,
    targets: &[Address],
    calls: u64,
    size: usize,
    seed: u64,
) -> Result<CallReport, String> {
    let t0 = Instant::now();
    let outs = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let n = share(calls, threads, t);
                s.spawn(move || -> Result<(u64, Faults, Histogram<u64>), String> {
                    let mut h = new_histogram()?;
                    let (ok, f) =
                        call_loop(node, targets, n, size, seed * 1000 + t as u64, &mut h)?;
                    Ok((ok, f, h))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a calling thread panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let mut hist = new_histogram()?;
    let mut rep = CallReport {
        secs,
        ..CallReport::default()
    };
    for (ok, f, h) in outs {
        rep.calls += ok;
        rep.faults += f;
        hist.add(&h).ctx("merging histograms")?;
    }
    rep.hist = hist_to_pairs(&hist);
    Ok(rep)
}

/// Run a worker role; prints its report line on stdout.
pub fn worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    match a.role.as_str() {
        "node" => node_worker(a, secret),
        other => Err(format!("unknown rpc role {other:?}")),
    }
}

pub(super) fn node_worker(a: &WorkerArgs, secret: &[u8]) -> Result<(), String> {
    let (i, n) = (a.index, a.nodes);
    let calling = i < a.clients.unwrap_or(n);
    let boxes = vec![MAILBOX.to_string(), CTL.to_string()];
    let cfg = mesh_config(
        i,
        n,
        a.base_port,
        secret,
        a.bundler,
        a.idle_cpu_level,
        &boxes,
    )?;
    let (node, others) = crate::bench::start_cluster_node(cfg, i, n)?;
    let targets = others
        .iter()
        .map(|o| Address::new(o, MAILBOX).ctx("address"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ctl = Ctl::new(&node, i, n)?;
    let server = node.mailbox(MAILBOX).ctx("mailbox rpc")?;
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|s| -> Result<CallReport, String> {
        let srv = s.spawn(|| serve(&server, &stop));
        let res = ctl.barrier(READY, Duration::from_secs(60)).and_then(|()| {
            if !calling {
                Ok(CallReport::default())
            } else if a.concurrency > 0 {
                async_calls(
                    &node,
                    &targets,
                    a.calls,
                    a.size,
                    a.concurrency,
                    i as u64 + 1,
                )
            } else {
                run_callers(&node, a.threads, &targets, a.calls, a.size, i as u64 + 1)
            }
        });
        // Serve until every node made all its calls.
        let done = match &res {
            Ok(_) => ctl.finish(Duration::from_secs(300)),
            Err(e) => Err(e.clone()),
        };
        stop.store(true, Ordering::Release);
        let served = srv
            .join()
            .unwrap_or_else(|_| Err("the server thread panicked".into()));
        done?;
        served?;
        res
    })?;
    drop(server);
    node.shutdown();
    print_result(&report)
}
