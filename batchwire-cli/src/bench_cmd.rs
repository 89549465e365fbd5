//! `batchwire bench`: check the arguments, start the hosts (`--hosts netns`), run each
//! scenario asked for and write the report.

use std::time::{Duration, Instant};

use batchwire::NodeConfig;

use crate::bench::{Common, Overrides, Remote, fanin, mperf, plot, roundtrip, rpc, throughput};
use crate::bench_args::{BenchArgs, HostsKind, Scenario};
use crate::{bench, link};

pub(crate) fn run_bench(a: BenchArgs) -> Result<(), String> {
    let started = Instant::now();
    let entries = throughput::Entry::parse_list(&a.bundler)?;
    for l in &a.idle_cpu_level {
        batchwire_core::idle::IdleStrategy::from_level(*l)?;
    }
    if a.runs == Some(0) {
        return Err("--runs must be at least 1".into());
    }
    let throughput_only = [
        ("--duplex", a.duplex),
        ("--unacked-bytes", a.unacked_bytes.is_some()),
        ("--break-every", a.break_every > 0),
        ("--verify", a.verify),
    ];
    if a.scenario != Some(Scenario::Throughput)
        && let Some((flag, _)) = throughput_only.iter().find(|(_, on)| *on)
    {
        return Err(format!(
            "{flag} applies to the throughput scenario: batchwire bench throughput {flag} ..."
        ));
    }
    if a.pin && a.scenario != Some(Scenario::FanIn) {
        return Err(
            "--pin applies to the fan-in scenario: batchwire bench fan-in --pin ...".into(),
        );
    }
    if a.scenario != Some(Scenario::Roundtrip)
        && (a.batches.is_some() || a.warmup_batches.is_some())
    {
        return Err(
            "--batches and --warmup-batches apply to the roundtrip scenario: batchwire bench roundtrip --batches 10,5,2 ..."
                .into(),
        );
    }
    if a.unacked_bytes == Some(0) {
        return Err("--unacked-bytes must be above 0".into());
    }
    if a.tls {
        if !a.peers.is_empty() {
            return Err("--tls starts local nodes with throwaway certificates; it does not apply to --peers".into());
        }
        let dir = bench::enable_tls()?;
        if !a.quiet {
            eprintln!(
                "mutual TLS on every node (certificates in {})",
                dir.display()
            );
        }
        // With the tables (stdout), not only on stderr: a reader of the tables must know.
        outln!(
            "mutual TLS on every node (--tls): the node rows are over TLS; `raw` and `tcp` stay plain TCP"
        );
    }
    if let Some(p) = &a.plot {
        plot::check_path(p)?;
    }
    let quick = a.scenario.is_none();
    let remote = match (a.peers.is_empty(), &a.secret_file) {
        (true, None) => None,
        (true, Some(_)) => return Err("--secret-file is for --peers".into()),
        (false, None) => {
            return Err("--peers needs --secret-file (the peers' cluster secret)".into());
        }
        (false, Some(f)) => Some(Remote {
            peers: a.peers.clone(),
            secret: NodeConfig::read_secret(f).map_err(|e| e.to_string())?,
        }),
    };
    let only_raw = entries.iter().all(|e| *e == throughput::Entry::Raw);
    let only_tcp = entries.iter().all(|e| *e == throughput::Entry::Tcp);
    let scenarios: Vec<Scenario> = match a.scenario {
        Some(s) => vec![s],
        // With --peers only the scenarios that can use them.
        None if remote.is_some() => vec![Scenario::Rpc, Scenario::Roundtrip],
        // `raw` is the ceiling of throughput, fan-in and mperf; the others compare bundlers
        // only.
        None if only_raw => vec![Scenario::Throughput, Scenario::FanIn, Scenario::Mperf],
        None if only_tcp => vec![Scenario::Throughput],
        None => Scenario::ALL.to_vec(),
    };
    let common = Common {
        bundlers: entries
            .iter()
            .filter_map(|e| match e {
                throughput::Entry::Bundler(b) => Some(*b),
                throughput::Entry::Unsequenced(_)
                | throughput::Entry::Tls(_)
                | throughput::Entry::Raw
                | throughput::Entry::Tcp => None,
            })
            .collect(),
        raw: entries.contains(&throughput::Entry::Raw),
        idle_levels: a.idle_cpu_level.clone(),
        runs: a.runs.unwrap_or(if quick { 3 } else { 5 }),
        base_port: a.base_port,
        quiet: a.quiet,
        quick,
        remote,
    };
    let over = Overrides {
        sizes: a.size.clone(),
        messages: a.messages,
        nodes: a.nodes,
        threads: a.threads,
        batches: a.batches.clone(),
        warmup_batches: a.warmup_batches,
    };
    let hosts = start_hosts(&a, &scenarios, common.remote.is_some())?;
    let mut results = Vec::new();
    for s in scenarios {
        let t0 = Instant::now();
        let link_before = hosts.as_ref().map(|h| h.stats()).unwrap_or_default();
        // In the quick run of every scenario, --nodes and --threads go only where they
        // apply; a named scenario refuses them if they do not.
        let mut over = over.clone();
        if quick {
            if !matches!(s, Scenario::Mperf | Scenario::Rpc) {
                over.nodes = None;
            }
            if !matches!(s, Scenario::FanIn | Scenario::Rpc) {
                over.threads = None;
            }
        }
        let res = match s {
            Scenario::Throughput => {
                common.refuse_remote("throughput")?;
                if over.nodes.is_some_and(|n| n != 2) || over.threads.is_some_and(|t| t != 1) {
                    return Err("throughput runs one sender thread on one of 2 nodes; \
                                --nodes and --threads apply to fan-in, mperf and rpc"
                        .into());
                }
                let o = throughput::Options {
                    sizes: a.size.clone().unwrap_or_else(|| vec![100, 1000, 10_000]),
                    entries: entries.clone(),
                    idle_levels: a.idle_cpu_level.clone(),
                    messages: a.messages,
                    runs: common.runs,
                    base_port: a.base_port,
                    quiet: a.quiet,
                    quick,
                    chaos: throughput::Chaos {
                        break_every_ms: a.break_every,
                    },
                    verify: a.verify,
                    duplex: a.duplex,
                    unacked_bytes: a.unacked_bytes,
                };
                throughput::run(&o)
            }
            Scenario::FanIn => fanin::run(&common, &over, a.pin),
            Scenario::Mperf => mperf::run(&common, &over),
            Scenario::Rpc => rpc::run(&common, &over),
            Scenario::Roundtrip => roundtrip::run(&common, &over),
            Scenario::Hol => crate::bench::hol::run(&common, a.phase_ms, a.bulk_inflight_bytes),
            Scenario::Membership => {
                common.refuse_remote("membership")?;
                let counts = match a.nodes {
                    Some(n) => vec![n],
                    None => vec![8, 16, 32],
                };
                crate::bench::membership::run(
                    &counts,
                    a.runs.unwrap_or(3),
                    Duration::from_millis(a.phase_ms.unwrap_or(5000)),
                    a.idle_close_ms.unwrap_or(2000),
                    a.quiet,
                )
            }
            Scenario::Soak => {
                common.refuse_remote("soak")?;
                common.require_bundlers("soak")?;
                crate::bench::soak::run(&crate::bench::soak::Options {
                    duration: a.duration.unwrap_or(Duration::from_secs(60)),
                    nodes: a.nodes.unwrap_or(3),
                    size: a
                        .size
                        .as_ref()
                        .and_then(|s| s.first().copied())
                        .unwrap_or(100),
                    rate: a.rate,
                    kill_every: a.kill_every,
                    restart_every: a.restart_every,
                    report_every: a.report_every,
                    bundlers: common.bundlers.clone(),
                    base_port: a.base_port,
                    namespaces: hosts
                        .as_ref()
                        .map(|h| h.names().to_vec())
                        .unwrap_or_default(),
                    quiet: a.quiet,
                })
            }
            Scenario::Scale => {
                common.refuse_remote("scale")?;
                crate::bench::scale::run(&a.peer_counts, a.idle_secs, a.base_port, a.quiet)
            }
        };
        let mut res = res?;
        if let Some(h) = &hosts {
            let spec = h.spec().to_string();
            for r in &mut res {
                r.link = Some(spec.clone());
            }
            out!("{}", link_reading(h, &link_before, &res));
        }
        results.extend(res);
        if !a.quiet {
            eprintln!("{} took {:.0} s", s.name(), t0.elapsed().as_secs_f64());
        }
    }
    drop(hosts);
    if let Some(path) = &a.json {
        bench::write_json(path, &results)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        outln!("\nwrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        plot::write_svg(path, &results)?;
        outln!("wrote {}", path.display());
    }
    if !a.quiet {
        eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
    }
    let failed: Vec<_> = results.iter().filter(|r| r.failed()).collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} result(s) FAILED verification (lost, duplicated or reordered messages)",
            failed.len()
        ));
    }
    Ok(())
}

/// `--hosts netns`: a namespace per node, joined by the emulated link (removed when the
/// returned value is dropped, or on a signal).
pub(crate) fn start_hosts(
    a: &BenchArgs,
    scenarios: &[Scenario],
    remote: bool,
) -> Result<Option<link::hosts::Hosts>, String> {
    if a.hosts == HostsKind::Loopback {
        if a.link.is_some() {
            return Err("--link puts an emulated link between hosts: add --hosts netns".into());
        }
        return Ok(None);
    }
    if remote {
        return Err("--hosts netns starts its own nodes; it does not apply to --peers".into());
    }
    if let Some(s) = scenarios
        .iter()
        .find(|s| matches!(s, Scenario::Hol | Scenario::Scale | Scenario::Membership))
    {
        return Err(format!(
            "--hosts netns runs throughput, fan-in, mperf, rpc, roundtrip and soak; {} runs on loopback only",
            s.name()
        ));
    }
    // rpc and mperf default to 4 nodes; the others run 2.
    let n = a.nodes.unwrap_or(4).max(2);
    let spec = a.link.unwrap_or(link::LinkSpec::PASS);
    let t0 = Instant::now();
    let hosts = link::hosts::Hosts::start(n, spec)?;
    if !a.quiet {
        eprintln!(
            "{} hosts in network namespaces (10.99.0.1-{}), link {} each way, ready in {:.1} s",
            hosts.len(),
            n,
            match a.link {
                Some(l) => l.to_string(),
                None => "without delay or limit".into(),
            },
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(Some(hosts))
}

/// After a scenario on emulated hosts: the link's counters, and each figure against the
/// link (payload rate against the link rate; call latency against the RTT).
pub(crate) fn link_reading(
    h: &link::hosts::Hosts,
    before: &link::pipe::PipeStats,
    res: &[bench::BenchResult],
) -> String {
    let spec = h.spec();
    let s = h.stats().since(before);
    let mut out = format!(
        "\nlink {spec}: {} packets, {:.1} MB; lost at random {}, dropped by the full queue {}; \
         at most {} bytes held in one direction (bound {})\n",
        s.packets_in,
        s.bytes_in as f64 / 1e6,
        s.lost,
        s.queue_drops,
        s.max_held,
        h.held_limit()
    );
    if h.unroutable() > 0 {
        out += &format!(
            "  {} packets were for no host (not IPv4, or outside 10.99.0.0/24) and were not passed on\n",
            h.unroutable()
        );
    }
    // A result that failed its checks has no figure to compare with the link.
    for r in res.iter().filter(|r| !r.failed()) {
        let what = format!("{} {}", r.scenario, r.label(true));
        // One sender over one link: throughput and fan-in.
        if matches!(r.scenario.as_str(), "throughput" | "fan-in")
            && let Some(bps) = spec.bytes_per_sec()
        {
            out += &format!(
                "  {} {} B: payload {:.2} MB/s = {:.0}% of the link's {:.2} MB/s\n",
                what,
                r.size,
                r.median * r.size as f64 / 1e6,
                100.0 * r.median * r.size as f64 / bps,
                bps / 1e6
            );
        }
        if let Some(p50) = r.p50_us
            && !spec.rtt.is_zero()
        {
            out += &format!(
                "  {} {} B: p50 {:.1} ms = {:.2}x the link's RTT of {:.0} ms\n",
                what,
                r.size,
                p50 / 1e3,
                p50 / 1e3 / (spec.rtt.as_secs_f64() * 1e3),
                spec.rtt.as_secs_f64() * 1e3
            );
        }
    }
    out
}
