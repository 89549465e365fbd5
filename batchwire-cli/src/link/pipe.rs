//! One direction of an emulated link, sans IO: packets go in with the time they arrived
//! and come out when the link would have delivered them. The clock is passed in, so the
//! tests below drive it with a fake one.
//!
//! The model is mahimahi's (a bottleneck queue, then the wire):
//! 1. **Loss**: each packet is dropped with probability `loss` (a seeded generator, so a
//!    run can be repeated).
//! 2. **Queue**: the packet waits behind the bytes not yet serialized. If they and it would
//!    exceed `queue` bytes, it is dropped at the tail, as a router's full buffer would.
//! 3. **Rate**: it leaves the queue when the link has serialized everything before it and
//!    it: `len * 8 / rate` seconds per packet, back to back.
//! 4. **Delay**: it arrives `rtt / 2` after it left.
//!
//! What the pipe holds is bounded: at most `queue` bytes waiting plus what the wire can
//! carry in one delay (`rate * rtt / 2`), and one packet (see [`LinkSpec::held_limit`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::LinkSpec;

/// Why a packet was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Queued; it comes out of [`Pipe::poll`] at its time.
    Queued,
    /// Dropped at random (`loss`).
    Lost,
    /// Dropped because the queue was full.
    QueueFull,
}

/// Counters of one direction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PipeStats {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub delivered: u64,
    pub bytes_out: u64,
    /// The most bytes held at once.
    pub max_held: usize,
}

impl PipeStats {
    /// What changed since `before` (`max_held` stays the most ever held).
    pub fn since(&self, before: &PipeStats) -> PipeStats {
        PipeStats {
            packets_in: self.packets_in - before.packets_in,
            bytes_in: self.bytes_in - before.bytes_in,
            lost: self.lost - before.lost,
            queue_drops: self.queue_drops - before.queue_drops,
            delivered: self.delivered - before.delivered,
            bytes_out: self.bytes_out - before.bytes_out,
            max_held: self.max_held,
        }
    }
}

impl std::ops::AddAssign for PipeStats {
    fn add_assign(&mut self, o: PipeStats) {
        self.packets_in += o.packets_in;
        self.bytes_in += o.bytes_in;
        self.lost += o.lost;
        self.queue_drops += o.queue_drops;
        self.delivered += o.delivered;
        self.bytes_out += o.bytes_out;
        self.max_held = self.max_held.max(o.max_held);
    }
}

/// One direction of a link.
#[derive(Debug)]
pub struct Pipe {
    one_way: Duration,
    /// Bits per second; `None`: no limit.
    rate: Option<u64>,
    loss_ppm: u32,
    queue: usize,
    held_limit: usize,
    /// When the wire has serialized everything taken so far.
    free_at: Option<Instant>,
    /// Packets on their way, in delivery order, with their delivery time.
    held: VecDeque<(Instant, Vec<u8>)>,
    held_bytes: usize,
    rng: u64,
    stats: PipeStats,
}

/// The largest packet the pipe is sized for (the TUN devices' MTU is below it).
pub const MAX_PACKET: usize = 65_536;

impl Pipe {
    /// A direction with `spec`'s settings; `seed` picks the loss pattern.
    pub fn new(spec: &LinkSpec, seed: u64) -> Pipe {
        Pipe {
            one_way: spec.rtt / 2,
            rate: spec.rate_bps,
            loss_ppm: spec.loss_ppm,
            queue: spec.queue_bytes(),
            held_limit: spec.held_limit(),
            free_at: None,
            held: VecDeque::new(),
            held_bytes: 0,
            // xorshift must not start at 0.
            rng: seed | 1,
            stats: PipeStats::default(),
        }
    }

    /// The most bytes this pipe ever holds ([`LinkSpec::held_limit`]).
    pub fn held_limit(&self) -> usize {
        self.held_limit
    }

    /// Seconds the wire needs for `len` bytes.
    fn serialize(&self, len: usize) -> Duration {
        match self.rate {
            Some(r) => Duration::from_nanos((len as u128 * 8 * 1_000_000_000 / r as u128) as u64),
            None => Duration::ZERO,
        }
    }

    /// Bytes waiting to be serialized at `now`.
    pub fn backlog(&self, now: Instant) -> usize {
        match (self.rate, self.free_at) {
            (Some(r), Some(f)) if f > now => {
                ((f - now).as_nanos() * r as u128 / 8 / 1_000_000_000) as usize
            }
            _ => 0,
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A packet entered the link at `now`; it is copied only if it is kept.
    pub fn push(&mut self, now: Instant, pkt: &[u8]) -> Verdict {
        let len = pkt.len();
        self.stats.packets_in += 1;
        self.stats.bytes_in += len as u64;
        if self.loss_ppm > 0 && (self.next_random() % 1_000_000) < self.loss_ppm as u64 {
            self.stats.lost += 1;
            return Verdict::Lost;
        }
        let over_queue = self.backlog(now) + len > self.queue;
        // With no rate limit nothing waits to be serialized: the bound is on what is held.
        let over_held = self.held_bytes + len > self.held_limit();
        if len > MAX_PACKET || over_queue || over_held {
            self.stats.queue_drops += 1;
            return Verdict::QueueFull;
        }
        let start = match self.free_at {
            Some(f) if f > now => f,
            _ => now,
        };
        let sent = start + self.serialize(len);
        self.free_at = Some(sent);
        self.held.push_back((sent + self.one_way, pkt.to_vec()));
        self.held_bytes += len;
        self.stats.max_held = self.stats.max_held.max(self.held_bytes);
        Verdict::Queued
    }

    /// The next packet due at `now`, if any.
    pub fn poll(&mut self, now: Instant) -> Option<Vec<u8>> {
        match self.held.front() {
            Some((at, _)) if *at <= now => {}
            _ => return None,
        }
        let (_, pkt) = self.held.pop_front()?;
        self.held_bytes -= pkt.len();
        self.stats.delivered += 1;
        self.stats.bytes_out += pkt.len() as u64;
        Some(pkt)
    }

    /// When the next packet is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.front().map(|(at, _)| *at)
    }

    #[cfg(test)]
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    pub fn stats(&self) -> PipeStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> LinkSpec {
        s.parse().unwrap()
    }

    /// Deliver everything due up to `until`, stepping the fake clock by `step`; returns
    /// each delivery time as an offset from `t0`.
    fn drain(p: &mut Pipe, t0: Instant, until: Duration, step: Duration) -> Vec<Duration> {
        let mut out = Vec::new();
        let mut t = Duration::ZERO;
        while t <= until {
            while p.poll(t0 + t).is_some() {
                out.push(t);
            }
            t += step;
        }
        out
    }

    #[test]
    fn a_packet_arrives_half_the_rtt_plus_its_serialization_later() {
        // 1000 bytes at 8 Mbit/s take 1 ms on the wire; one way is 50 ms.
        let mut p = Pipe::new(&spec("rtt=100ms,rate=8mbit"), 1);
        let t0 = Instant::now();
        assert_eq!(p.push(t0, &[0; 1000]), Verdict::Queued);
        assert_eq!(p.next_due(), Some(t0 + Duration::from_millis(51)));
        assert!(p.poll(t0 + Duration::from_micros(50_999)).is_none());
        assert_eq!(
            p.poll(t0 + Duration::from_millis(51)).map(|v| v.len()),
            Some(1000)
        );
        assert_eq!(p.held_bytes(), 0);
    }

    #[test]
    fn back_to_back_packets_are_paced_at_the_rate() {
        let mut p = Pipe::new(&spec("rtt=10ms,rate=8mbit,queue=200k"), 1);
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(p.push(t0, &[0; 1000]), Verdict::Queued);
        }
        // 100 KB at 1 MB/s: the last one leaves 100 ms in, arrives 105 ms in.
        let times = drain(
            &mut p,
            t0,
            Duration::from_millis(200),
            Duration::from_micros(100),
        );
        assert_eq!(times.len(), 100);
        assert_eq!(times[0], Duration::from_millis(6));
        assert_eq!(times[99], Duration::from_millis(105));
        for w in times.windows(2) {
            assert_eq!(w[1] - w[0], Duration::from_millis(1));
        }
    }

    #[test]
    fn a_full_queue_drops_at_the_tail_and_holds_no_more_than_its_bound() {
        let mut p = Pipe::new(&spec("rtt=100ms,rate=8mbit,queue=10000"), 1);
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..20).map(|_| p.push(t0, &[0; 1000])).collect();
        // 10 fit (the backlog counts what is not yet serialized), the rest are dropped.
        assert_eq!(
            verdicts.iter().filter(|v| **v == Verdict::Queued).count(),
            10
        );
        assert_eq!(verdicts[10..], [Verdict::QueueFull; 10]);
        // 5 ms later five have left the queue: five more fit.
        let t = t0 + Duration::from_millis(5);
        let more = (0..10).filter(|_| p.push(t, &[0; 1000]) == Verdict::Queued);
        assert_eq!(more.count(), 5);
        assert!(p.stats().max_held <= p.held_limit());
        assert_eq!(p.stats().queue_drops, 15);
    }

    #[test]
    fn held_bytes_stay_bounded_under_a_flood() {
        // 100x the link rate for a simulated second.
        let mut p = Pipe::new(&spec("rtt=170ms,rate=20mbit"), 7);
        let t0 = Instant::now();
        let mut t = Duration::ZERO;
        while t < Duration::from_secs(1) {
            p.push(t0 + t, &[0; 1500]);
            while p.poll(t0 + t).is_some() {}
            t += Duration::from_micros(6);
        }
        let s = p.stats();
        assert!(
            s.max_held <= p.held_limit(),
            "{} > {}",
            s.max_held,
            p.held_limit()
        );
        assert!(s.queue_drops > s.packets_in / 2);
        // What got through is the link rate: 20 Mbit/s for the second minus the delay.
        let expect = 20e6 / 8.0 * (1.0 - 0.085);
        let got = s.bytes_out as f64;
        assert!((got - expect).abs() / expect < 0.02, "{got} vs {expect}");
    }

    #[test]
    fn loss_is_near_its_setting_and_repeats_with_the_seed() {
        let run = |seed| {
            let mut p = Pipe::new(&spec("rtt=0ms,loss=1%"), seed);
            let t0 = Instant::now();
            (0..100_000).for_each(|_| {
                p.push(t0, &[0; 100]);
                while p.poll(t0).is_some() {}
            });
            p.stats().lost
        };
        let a = run(42);
        assert_eq!(a, run(42));
        // 1% of 100,000 = 1000; the standard deviation is about 31.
        assert!((850..1150).contains(&a), "{a}");
    }

    #[test]
    fn no_rate_means_only_the_delay() {
        let mut p = Pipe::new(&spec("rtt=20ms"), 1);
        let t0 = Instant::now();
        for _ in 0..1000 {
            assert_eq!(p.push(t0, &[0; 1500]), Verdict::Queued);
        }
        assert_eq!(p.backlog(t0), 0);
        assert!(p.poll(t0 + Duration::from_millis(9)).is_none());
        let n = std::iter::from_fn(|| p.poll(t0 + Duration::from_millis(10))).count();
        assert_eq!(n, 1000);
    }
}
