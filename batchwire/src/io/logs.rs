//! Log lines that network input causes are rate-limited: each call site of [`warn_limited!`]
//! writes at most [`BURST`] lines per [`WINDOW`]; past that, lines are counted, and the
//! next line written after the window ends says how many were suppressed
//! (`suppressed_in_last_10s = N`). A client that fails a thousand handshakes a second
//! costs ten lines per ten seconds, not a thousand a second. (The counters in
//! [`crate::stats::NodeStats`] count every one.)

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The span of one budget of lines.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);
/// Lines per call site per window.
pub(crate) const BURST: u32 = 10;

/// One call site's budget.
pub(crate) struct LogLimit(Mutex<State>);

struct State {
    /// When the current window began (`None`: no line yet).
    since: Option<Instant>,
    /// Lines written in it.
    written: u32,
    /// Lines suppressed and not reported yet.
    suppressed: u64,
}

impl LogLimit {
    pub const fn new() -> LogLimit {
        LogLimit(Mutex::new(State {
            since: None,
            written: 0,
            suppressed: 0,
        }))
    }

    /// Whether a line may be written at `now`: `Some(n)` with the lines suppressed since
    /// the last one written (to say so), or `None` (counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if s.since
            .is_none_or(|t| now.saturating_duration_since(t) >= WINDOW)
        {
            s.since = Some(now);
            s.written = 0;
        }
        if s.written >= BURST {
            s.suppressed += 1;
            return None;
        }
        s.written += 1;
        Some(std::mem::take(&mut s.suppressed))
    }
}

/// `tracing::warn!` at most [`BURST`] times per [`WINDOW`] from this call site; the first
/// line after lines were suppressed carries `suppressed_in_last_10s`.
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: $crate::io::logs::LogLimit = $crate::io::logs::LogLimit::new();
        if let Some(suppressed) = LIMIT.admit(std::time::Instant::now()) {
            if suppressed > 0 {
                tracing::warn!(suppressed_in_last_10s = suppressed, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    }};
}
pub(crate) use warn_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_counted_and_reported_with_the_next_line() {
        let l = LogLimit::new();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let written = (0..1000).filter(|i| l.admit(t0 + ms(*i)).is_some()).count();
        assert_eq!(written, BURST as usize);
        // The next window: the first line says how many were suppressed.
        assert_eq!(l.admit(t0 + WINDOW + ms(1)), Some(1000 - u64::from(BURST)));
        assert_eq!(l.admit(t0 + WINDOW + ms(2)), Some(0));
        // A quiet site writes every line.
        let q = LogLimit::new();
        for i in 0..5 {
            assert_eq!(q.admit(t0 + WINDOW * i), Some(0));
        }
    }
}
