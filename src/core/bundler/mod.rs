//! Bundlers decide when a writer flushes its queue and how much it takes: the one seam
//! between "messages were queued" and "bytes were written".
//!
//! A bundler is a pure state machine. The writer shows it the queue's level and the current
//! time (passed in, never read here) and gets back a [`Decision`]: flush now, or wait until
//! more is queued or a deadline passes. Tests drive bundlers with a fake clock.
//!
//! Each strategy lives in a file named after it and is chosen by name ([`BundlerKind`]).

use std::time::Instant;

mod natural;
mod none;

pub use natural::Natural;
pub use none::NoBundling;

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
    /// The writer took everything that was queued.
    Drained,
    /// The queued bytes reached the bundler's size limit.
    SizeReached,
    /// The bundler's timer expired.
    Timer,
    /// One message per write (the `none` bundler).
    Single,
}

/// What the writer should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take at most `max_messages` from the queue and write them now.
    Flush {
        max_messages: usize,
        reason: FlushReason,
    },
    /// Nothing to write: sleep until a message is queued, or until `until` if set.
    Wait { until: Option<Instant> },
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
    /// Decide what to do given the queue's level at `now`.
    fn poll(&mut self, level: QueueLevel, now: Instant) -> Decision;
}

/// The strategies, by CLI name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BundlerKind {
    /// One frame and one write per message: the unbundled baseline.
    None,
    /// Write everything queued as one batch, repeat (no timer). The default.
    #[default]
    Natural,
}

impl BundlerKind {
    pub const ALL: &'static [BundlerKind] = &[BundlerKind::None, BundlerKind::Natural];

    pub fn name(self) -> &'static str {
        match self {
            BundlerKind::None => "none",
            BundlerKind::Natural => "natural",
        }
    }

    /// A fresh bundler of this kind.
    pub fn build(self) -> Box<dyn Bundler> {
        match self {
            BundlerKind::None => Box::new(NoBundling),
            BundlerKind::Natural => Box::new(Natural),
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
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_name() {
        for k in BundlerKind::ALL {
            assert_eq!(k.name().parse::<BundlerKind>().unwrap(), *k);
            assert_eq!(k.build().name(), k.name());
        }
        let err = "nagle".parse::<BundlerKind>().unwrap_err();
        assert!(err.contains("natural"), "{err}");
    }
}
