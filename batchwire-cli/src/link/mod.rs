//! The WAN link emulator: `--hosts netns --link rtt=170ms,rate=20mbit[,loss=0.1%][,queue=BYTES]`.
//!
//! Each bench node runs in a network namespace of its own ([`hosts`]), where its only
//! route to the others is a TUN device. This process reads the IP packets each host sends
//! from its TUN device, passes them through one [`pipe::Pipe`] per direction (loss, a
//! bottleneck queue, the rate, half the RTT) and writes them into the receiving host's
//! TUN device, as mahimahi does. So each TCP end sees a real path: the RTT, window growth,
//! a full queue's drops and loss recovery, not a proxy's view.
//!
//! `pipe` is the link model, sans IO (the clock is passed in); `hosts` is the IO: the
//! namespaces, the devices and the two kinds of threads that move packets.

pub mod hosts;
pub mod pipe;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The settings of the emulated link (the same in both directions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    /// Round-trip time; each direction delays by half of it.
    pub rtt: Duration,
    /// Bits per second of each direction; `None`: no limit.
    pub rate_bps: Option<u64>,
    /// Packets dropped at random, in parts per million.
    pub loss_ppm: u32,
    /// The bottleneck queue in bytes; `None`: one bandwidth-delay product (at least
    /// 64 KiB), or 16 MiB with no rate limit.
    pub queue: Option<usize>,
}

impl LinkSpec {
    /// No delay, no limit, no loss: `--hosts netns` without `--link`.
    pub const PASS: LinkSpec = LinkSpec {
        rtt: Duration::ZERO,
        rate_bps: None,
        loss_ppm: 0,
        queue: None,
    };

    /// The queue in bytes, after the default.
    pub fn queue_bytes(&self) -> usize {
        match (self.queue, self.rate_bps) {
            (Some(q), _) => q,
            (None, Some(r)) => {
                let bdp = r as u128 * self.rtt.as_nanos() / 8 / 1_000_000_000;
                (bdp as usize).max(64 * 1024)
            }
            (None, None) => 16 << 20,
        }
    }

    /// The most bytes one direction holds: the queue, what the wire carries in half the
    /// RTT, and one packet.
    pub fn held_limit(&self) -> usize {
        let wire = match self.rate_bps {
            Some(r) => (r as u128 * (self.rtt / 2).as_nanos() / 8 / 1_000_000_000) as usize,
            None => 0,
        };
        self.queue_bytes() + wire + pipe::MAX_PACKET
    }

    /// Bytes per second of one direction, if limited.
    pub fn bytes_per_sec(&self) -> Option<f64> {
        self.rate_bps.map(|r| r as f64 / 8.0)
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rtt={}ms", self.rtt.as_secs_f64() * 1e3)?;
        if let Some(r) = self.rate_bps {
            if r % 1_000_000 == 0 {
                write!(f, ",rate={}mbit", r / 1_000_000)?;
            } else {
                write!(f, ",rate={}kbit", r as f64 / 1e3)?;
            }
        }
        if self.loss_ppm > 0 {
            write!(f, ",loss={}%", self.loss_ppm as f64 / 1e4)?;
        }
        write!(f, ",queue={}", self.queue_bytes())
    }
}

/// A node's failure detectors set for `link`, as one would for such a path: the defaults
/// are a LAN's (a SWIM probe must be answered within 300 ms, a peer silent or unreachable
/// for 3 s is down), and across 170 ms with a full bottleneck queue (170 ms more each
/// way) they declare live peers down. Here the loaded round trip (the RTT plus both
/// queues drained) sets them: probes may take twice it, a probe round is three of those,
/// suspicion lasts three rounds, and silence ten loaded round trips; never below the
/// defaults.
pub fn tune(cfg: batchwire::NodeConfig, link: &LinkSpec) -> batchwire::NodeConfig {
    let loaded = link.loaded_rtt();
    let mut m = batchwire::MembershipConfig::default();
    let probe_rtt = m.probe_rtt.max(loaded * 2);
    m.probe_period = m.probe_period.max(probe_rtt * 3);
    m.probe_rtt = probe_rtt;
    m.suspicion_timeout = m.suspicion_timeout.max(m.probe_period * 3);
    let cfg = match cfg.membership_config() {
        Some(_) => cfg.membership(m),
        None => cfg,
    };
    cfg.peer_timeout(Duration::from_secs(3).max(loaded * 10))
}

impl LinkSpec {
    /// The round trip with both directions' bottleneck queues full.
    pub fn loaded_rtt(&self) -> Duration {
        let queue = match self.rate_bps {
            Some(r) => Duration::from_secs_f64(self.queue_bytes() as f64 * 8.0 / r as f64),
            None => Duration::ZERO,
        };
        self.rtt + queue * 2
    }
}

fn parse_duration(v: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!(
            "rtt {v:?} needs a unit: us, ms or s (e.g. rtt=170ms)"
        ));
    };
    let x: f64 = num
        .parse()
        .map_err(|_| format!("rtt {v:?} is not a number"))?;
    if !(0.0..=60.0).contains(&(x * scale)) {
        return Err(format!("rtt {v:?} is out of range (0 to 60 s)"));
    }
    Ok(Duration::from_secs_f64(x * scale))
}

fn parse_rate(v: &str) -> Result<u64, String> {
    let lower = v.to_ascii_lowercase();
    let units = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)];
    let (num, scale) = units
        .iter()
        .find_map(|(u, s)| lower.strip_suffix(u).map(|n| (n.to_string(), *s)))
        .ok_or_else(|| {
            format!("rate {v:?} needs a unit: bit, kbit, mbit or gbit (e.g. rate=20mbit)")
        })?;
    let x: f64 = num
        .parse()
        .map_err(|_| format!("rate {v:?} is not a number"))?;
    let bps = x * scale;
    if !(8_000.0..=100e9).contains(&bps) {
        return Err(format!("rate {v:?} is out of range (8kbit to 100gbit)"));
    }
    Ok(bps as u64)
}

fn parse_loss(v: &str) -> Result<u32, String> {
    let frac = match v.strip_suffix('%') {
        Some(p) => p.parse::<f64>().map(|x| x / 100.0),
        None => v.parse::<f64>(),
    }
    .map_err(|_| format!("loss {v:?} is not a number (e.g. loss=0.1%)"))?;
    if !(0.0..=0.5).contains(&frac) {
        return Err(format!("loss {v:?} is out of range (0 to 50%)"));
    }
    Ok((frac * 1e6).round() as u32)
}

fn parse_bytes(v: &str) -> Result<usize, String> {
    let lower = v.to_ascii_lowercase();
    let (num, scale) = if let Some(n) = lower.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = lower.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (lower.as_str(), 1)
    };
    let x: usize = num
        .parse()
        .map_err(|_| format!("queue {v:?} is not a byte count (e.g. queue=256k)"))?;
    let b = x.saturating_mul(scale);
    if !(3000..=(1 << 30)).contains(&b) {
        return Err(format!("queue {v:?} is out of range (3000 bytes to 1 GiB)"));
    }
    Ok(b)
}

impl FromStr for LinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut spec = LinkSpec::PASS;
        let mut rtt = None;
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--link: {part:?} is not KEY=VALUE"))?;
            match k.trim() {
                "rtt" => rtt = Some(parse_duration(v.trim())?),
                "rate" => spec.rate_bps = Some(parse_rate(v.trim())?),
                "loss" => spec.loss_ppm = parse_loss(v.trim())?,
                "queue" => spec.queue = Some(parse_bytes(v.trim())?),
                other => {
                    return Err(format!(
                        "--link: unknown setting {other:?} (rtt, rate, loss, queue)"
                    ));
                }
            }
        }
        spec.rtt = rtt.ok_or("--link needs rtt=..., e.g. --link rtt=170ms,rate=20mbit")?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issues_example_and_prints_it_back() {
        let s: LinkSpec = "rtt=170ms,rate=20mbit,loss=0.1%,queue=256k"
            .parse()
            .unwrap();
        assert_eq!(s.rtt, Duration::from_millis(170));
        assert_eq!(s.rate_bps, Some(20_000_000));
        assert_eq!(s.loss_ppm, 1000);
        assert_eq!(s.queue_bytes(), 256 * 1024);
        assert_eq!(
            s.to_string(),
            "rtt=170ms,rate=20mbit,loss=0.1%,queue=262144"
        );
        let again: LinkSpec = s.to_string().parse().unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn the_default_queue_is_one_bandwidth_delay_product() {
        let s: LinkSpec = "rtt=170ms,rate=20mbit".parse().unwrap();
        assert_eq!(s.queue_bytes(), 425_000);
        let small: LinkSpec = "rtt=1ms,rate=1mbit".parse().unwrap();
        assert_eq!(small.queue_bytes(), 64 * 1024);
        let unlimited: LinkSpec = "rtt=1ms".parse().unwrap();
        assert_eq!(unlimited.queue_bytes(), 16 << 20);
    }

    #[test]
    fn failure_detectors_follow_the_loaded_round_trip() {
        let lan: LinkSpec = "rtt=1ms,rate=1gbit".parse().unwrap();
        let d = batchwire::NodeConfig::new("a", ([127, 0, 0, 1], 1).into(), b"s".to_vec());
        let fields = |c: &batchwire::NodeConfig| {
            let m = c.membership_config().unwrap();
            (m.probe_rtt, m.probe_period, m.suspicion_timeout)
        };
        // A fast link keeps the defaults.
        assert_eq!(fields(&tune(d.clone(), &lan)), fields(&d));
        let wan: LinkSpec = "rtt=170ms,rate=20mbit".parse().unwrap();
        assert_eq!(wan.loaded_rtt(), Duration::from_millis(510));
        let t = tune(d, &wan);
        let m = t.membership_config().unwrap();
        assert_eq!(m.probe_rtt, Duration::from_millis(1020));
        assert_eq!(m.probe_period, Duration::from_millis(3060));
        assert_eq!(m.suspicion_timeout, Duration::from_millis(9180));
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        for (bad, says) in [
            ("rate=20mbit", "needs rtt"),
            ("rtt=170", "needs a unit"),
            ("rtt=170ms,rate=20", "needs a unit"),
            ("rtt=170ms,loss=60%", "out of range"),
            ("rtt=170ms,jitter=5ms", "unknown setting"),
            ("rtt=170ms,queue=10", "out of range"),
            ("rtt", "KEY=VALUE"),
        ] {
            let e = bad.parse::<LinkSpec>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
