//! Bundlers decide when a writer flushes its queue and how much it takes: the one seam
//! between "messages were queued" and "bytes were written".
//!
//! A bundler is a pure state machine. The writer shows it the queue's level and the current
//! time (passed in, never read here) and gets back a [`Decision`]: flush now (all, or up to
//! a number of messages or bytes), or wait until more is queued or a deadline passes. Tests
//! drive bundlers with a fake clock.
//!
//! What is grouped is decided by the [`Outbox`](super::outbox::Outbox): a frame (a message
//! list) is a run of consecutive messages to one destination. Where the queue lives is
//! decided by [`BundlerKind::shared_queue`]: one queue per peer, or one for all peers
//! (`transfer-queue`).
//!
//! Each strategy lives in a file named after it and is chosen by name ([`BundlerKind`]).

use std::time::{Duration, Instant};

mod linger;
mod natural;
mod none;
mod per_destination;
mod transfer_queue;

pub use linger::Linger;
pub use natural::Natural;
pub use none::NoBundling;
pub use per_destination::PerDestination;
pub use transfer_queue::TransferQueue;

/// What the writer's queue holds when it asks its bundler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLevel {
    pub messages: usize,
    pub bytes: usize,
    /// When the oldest queued message was queued (only tracked for bundlers whose
    /// [`Bundler::needs_enqueue_time`] is true; otherwise `None`).
    pub oldest: Option<Instant>,
}

/// Why a flush happened (counted in the stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    /// The writer took everything that was queued (the queue is empty after it).
    Drained,
    /// The queued bytes reached the bundler's size limit.
    SizeReached,
    /// The bundler's timer expired.
    Timer,
    /// One message per write (the `none` bundler).
    Single,
}

impl FlushReason {
    /// Its place in a count per reason (drained, size reached, timer, single).
    pub const fn index(self) -> usize {
        match self {
            FlushReason::Drained => 0,
            FlushReason::SizeReached => 1,
            FlushReason::Timer => 2,
            FlushReason::Single => 3,
        }
    }
}

/// What the writer should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take at most `max_messages` and at most `max_bytes` (whole frames, at least one) and
    /// write them now.
    Flush {
        max_messages: usize,
        max_bytes: usize,
        reason: FlushReason,
    },
    /// Nothing to write: sleep until a message is queued, or until `until` if set.
    Wait { until: Option<Instant> },
}

impl Decision {
    /// Flush everything queued.
    pub const fn all(reason: FlushReason) -> Decision {
        Decision::Flush {
            max_messages: usize::MAX,
            max_bytes: usize::MAX,
            reason,
        }
    }
    /// Wait for the next message, with no timer.
    pub const IDLE: Decision = Decision::Wait { until: None };
}

/// Flush up to `max_size` bytes whenever anything is queued (never wait with messages
/// queued); the reason says whether the size limit was reached. Shared by
/// `per-destination` and `transfer-queue`, which differ in where the queue lives.
pub(crate) fn drain_up_to(level: QueueLevel, max_size: usize) -> Decision {
    if level.messages == 0 {
        return Decision::IDLE;
    }
    let reason = if level.bytes >= max_size {
        FlushReason::SizeReached
    } else {
        FlushReason::Drained
    };
    Decision::Flush {
        max_messages: usize::MAX,
        max_bytes: max_size,
        reason,
    }
}

/// A bundling strategy.
pub trait Bundler: Send {
    /// The strategy's CLI name.
    fn name(&self) -> &'static str;
    /// Whether the queue must record when its oldest message was queued (costs a clock read
    /// whenever a message lands in an empty queue).
    fn needs_enqueue_time(&self) -> bool {
        false
    }
    /// While the writer sleeps with messages queued, wake it when this many bytes are
    /// queued (only a bundler with a timer sleeps with messages queued).
    fn wake_bytes(&self) -> usize {
        usize::MAX
    }
    /// Whether a message that finds the queue empty and the writer idle is written at once
    /// whatever else happens (no timer, no size to wait for): then the sending thread may
    /// write it itself instead of waking the writer ("write-through"), which saves a
    /// thread hand-off per message when there is nothing to bundle.
    fn writes_when_idle(&self) -> bool {
        false
    }
    /// Largest frame the outbox should build (0: one message per frame).
    fn frame_bytes(&self, default: usize) -> usize {
        default
    }
    /// Decide what to do given the queue's level at `now`.
    fn poll(&mut self, level: QueueLevel, now: Instant) -> Decision;
}

/// The strategies, by CLI name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum BundlerKind {
    /// One frame and one write per message: the unbundled baseline.
    None,
    /// Write everything queued for a peer as one batch, repeat (no timer). The default.
    #[default]
    Natural,
    /// One queue per peer, drained up to `max_size` bytes per write (JGroups 5.5's default).
    PerDestination,
    /// One queue for all peers and one writer thread (JGRP-1540).
    TransferQueue,
    /// Wait for `max_size` bytes or `max_delay`, whichever comes first (Nagle, Kafka's
    /// linger.ms, the Erlang relay's "K messages or T ms").
    Linger,
}

impl BundlerKind {
    pub const ALL: &'static [BundlerKind] = &[
        BundlerKind::None,
        BundlerKind::Natural,
        BundlerKind::PerDestination,
        BundlerKind::TransferQueue,
        BundlerKind::Linger,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BundlerKind::None => "none",
            BundlerKind::Natural => "natural",
            BundlerKind::PerDestination => "per-destination",
            BundlerKind::TransferQueue => "transfer-queue",
            BundlerKind::Linger => "linger",
        }
    }

    /// One queue and writer for all peers (true) or one per peer (false).
    pub fn shared_queue(self) -> bool {
        self == BundlerKind::TransferQueue
    }
}

/// A bundler and its knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundlerConfig {
    pub kind: BundlerKind,
    /// `per-destination`, `transfer-queue`: most bytes per flush; `linger`: bytes that
    /// trigger a flush before the timer. Default 64 KiB.
    pub max_size: usize,
    /// `linger`: longest time a message waits for company. Default 1 ms.
    pub max_delay: Duration,
}

impl Default for BundlerConfig {
    fn default() -> Self {
        BundlerConfig {
            kind: BundlerKind::default(),
            max_size: 64 << 10,
            max_delay: Duration::from_millis(1),
        }
    }
}

impl BundlerConfig {
    /// A fresh bundler.
    pub fn build(&self) -> Box<dyn Bundler> {
        match self.kind {
            BundlerKind::None => Box::new(NoBundling),
            BundlerKind::Natural => Box::new(Natural),
            BundlerKind::PerDestination => Box::new(PerDestination {
                max_size: self.max_size,
            }),
            BundlerKind::TransferQueue => Box::new(TransferQueue {
                max_size: self.max_size,
            }),
            BundlerKind::Linger => Box::new(Linger {
                max_size: self.max_size,
                max_delay: self.max_delay,
            }),
        }
    }
}

impl std::fmt::Display for BundlerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BundlerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BundlerKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = BundlerKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown bundler {s:?} (known: {})", names.join(", "))
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn level(messages: usize, bytes: usize, oldest: Option<Instant>) -> QueueLevel {
        QueueLevel {
            messages,
            bytes,
            oldest,
        }
    }

    /// Only a bundler with a timer (`linger`) needs to know when its oldest message was
    /// queued, or a byte count at which to be woken early; the others take neither (a clock
    /// read per message, a wake-up, for nothing).
    #[test]
    fn only_the_timed_bundler_asks_for_times_and_early_wake_ups() {
        for kind in [
            BundlerKind::None,
            BundlerKind::Natural,
            BundlerKind::PerDestination,
            BundlerKind::TransferQueue,
        ] {
            let b = BundlerConfig {
                kind,
                ..BundlerConfig::default()
            }
            .build();
            assert!(!b.needs_enqueue_time(), "{kind}");
            assert_eq!(b.wake_bytes(), usize::MAX, "{kind}");
        }
        let l = BundlerConfig {
            kind: BundlerKind::Linger,
            ..BundlerConfig::default()
        }
        .build();
        assert!(l.needs_enqueue_time());
        assert!(l.wake_bytes() < usize::MAX);
    }

    #[test]
    fn a_lone_message_may_be_written_by_its_sender_exactly_with_the_bundlers_that_write_it_at_once()
    {
        let now = Instant::now();
        for kind in BundlerKind::ALL {
            let mut b = BundlerConfig {
                kind: *kind,
                ..Default::default()
            }
            .build();
            let at_once = matches!(
                b.poll(level(1, 100, Some(now)), now),
                Decision::Flush { .. }
            );
            let shared = *kind == BundlerKind::TransferQueue;
            assert_eq!(b.writes_when_idle(), at_once && !shared, "{kind}");
        }
    }

    #[test]
    fn kinds_parse_by_name() {
        for k in BundlerKind::ALL {
            assert_eq!(k.name().parse::<BundlerKind>().unwrap(), *k);
            let cfg = BundlerConfig {
                kind: *k,
                ..Default::default()
            };
            assert_eq!(cfg.build().name(), k.name());
        }
        let err = "nagle".parse::<BundlerKind>().unwrap_err();
        assert!(err.contains("transfer-queue"), "{err}");
    }

    #[test]
    fn every_bundler_waits_without_a_timer_when_empty() {
        let now = Instant::now();
        for k in BundlerKind::ALL {
            let mut b = BundlerConfig {
                kind: *k,
                ..Default::default()
            }
            .build();
            assert_eq!(b.poll(level(0, 0, None), now), Decision::IDLE, "{k}");
        }
    }
}
