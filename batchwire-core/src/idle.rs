//! Idle strategies: how a waiting thread spends its time, by Akka Artery's `idle-cpu-level`
//! 1..=10. Pure: the IO layer asks [`Idler::step`] what to do before each re-check.
//!
//! | level | spin checks | yields | then | CPU when idle |
//! | ---: | ---: | ---: | --- | --- |
//! | 1 (default) | 0 | 0 | park | none |
//! | 2 | 0 | 1 | park | none |
//! | 3 | 10 | 2 | park | none |
//! | 4 | 50 | 5 | park | none |
//! | 5 | 100 | 10 | park | none |
//! | 6 | 500 | 20 | park | none |
//! | 7 | 1 000 | 50 | park | none |
//! | 8 | 5 000 | 100 | park | none |
//! | 9 | 20 000 | 200 | park | none |
//! | 10 | forever | - | never parks | one core per waiting thread |
//!
//! A spin check is [`SPIN_HINTS`] `spin_loop` hints (roughly 0.1-1 µs) followed by a look
//! at the queue; a yield is `sched_yield`; park is a condvar wait that the next message
//! wakes at once (the sender notifies a parked thread, and only a parked one, so spinning
//! saves the sender that wake-up syscall). Parking on a wake-up rather than a timer makes
//! the growing park times of Aeron's back-off unnecessary: a parked thread costs nothing and
//! wakes on the first message. Levels 1-9 therefore use no CPU once idle; they differ in how
//! long a thread keeps the CPU after its queue empties, betting that more work comes soon.
//!
//! On a 2-core machine spinning threads steal the CPU from the application, which then
//! waits for the scheduler to give it back (its tail latency grows to scheduler time
//! slices); that is why the default is 1.

/// `spin_loop` hints per spin check.
pub const SPIN_HINTS: u32 = 32;

/// The default level: park at once.
pub const DEFAULT_LEVEL: u8 = 1;

/// A take counts as small (see [`IdleStrategy::idler_after`]) below this many bytes...
pub const SMALL_TAKE_BYTES: usize = 16 << 10;
/// ...and of messages of at most this many bytes on average. After larger takes, or takes
/// of larger messages, a consumer parks at once: its batches are large already, and a
/// yield there only slows a stream.
pub const SMALL_MESSAGE: usize = 512;

/// Whether a take of `messages` messages in `bytes` bytes was a trickle of small messages,
/// after which a consumer yields once before it parks (a take of none, control frames
/// only, is not: a yield after every acknowledgement slows a stream).
pub fn small_take(messages: u64, bytes: usize) -> bool {
    messages > 0 && bytes < SMALL_TAKE_BYTES && bytes as u64 / messages <= SMALL_MESSAGE as u64
}

/// What a waiting thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStep {
    /// Spin briefly, then look again.
    Spin,
    /// Give the CPU away (`sched_yield`), then look again.
    Yield,
    /// Block until woken.
    Park,
}

/// The mapping of one level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleStrategy {
    pub level: u8,
    /// Spin checks before yielding (`u32::MAX`: forever).
    pub spins: u32,
    pub yields: u32,
}

impl IdleStrategy {
    /// The strategy of `level` (1..=10).
    pub fn from_level(level: u8) -> Result<IdleStrategy, String> {
        let (spins, yields) = match level {
            1 => (0, 0),
            2 => (0, 1),
            3 => (10, 2),
            4 => (50, 5),
            5 => (100, 10),
            6 => (500, 20),
            7 => (1_000, 50),
            8 => (5_000, 100),
            9 => (20_000, 200),
            10 => (u32::MAX, 0),
            other => return Err(format!("idle_cpu_level must be 1..=10, not {other}")),
        };
        Ok(IdleStrategy {
            level,
            spins,
            yields,
        })
    }

    /// Whether a thread at this level ever parks.
    pub fn parks(&self) -> bool {
        self.spins != u32::MAX
    }

    pub fn idler(&self) -> Idler {
        Idler { s: *self, n: 0 }
    }

    /// An idler for a consumer whose last take was small (`small`, see [`small_take`]):
    /// where this strategy would park at once (level 1), it yields once first. Whoever runs
    /// meanwhile (often the producer, on a 2-core machine) may queue more, which is then
    /// taken without a wake-up and in a larger batch; still no CPU once idle, since the
    /// next step parks. After a large take the consumer parks at once (a yield there slows
    /// a stream).
    pub fn idler_after(&self, small: bool) -> Idler {
        let mut s = *self;
        if small && s.spins == 0 && s.yields == 0 {
            s.yields = 1;
        }
        Idler { s, n: 0 }
    }
}

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy {
            level: DEFAULT_LEVEL,
            spins: 0,
            yields: 0,
        }
    }
}

/// The back-off state of one wait: spin, then yield, then park.
#[derive(Debug, Clone)]
pub struct Idler {
    s: IdleStrategy,
    n: u32,
}

impl Idler {
    /// The next step; call once per failed look at the queue.
    pub fn step(&mut self) -> IdleStep {
        if self.s.spins == u32::MAX {
            return IdleStep::Spin;
        }
        let n = self.n;
        self.n = self.n.saturating_add(1);
        if n < self.s.spins {
            IdleStep::Spin
        } else if n < self.s.spins + self.s.yields {
            IdleStep::Yield
        } else {
            IdleStep::Park
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(level: u8, n: usize) -> Vec<IdleStep> {
        let mut i = IdleStrategy::from_level(level).unwrap().idler();
        (0..n).map(|_| i.step()).collect()
    }

    #[test]
    fn level_1_parks_at_once_and_is_the_default() {
        assert_eq!(steps(1, 1), [IdleStep::Park]);
        assert_eq!(
            IdleStrategy::default(),
            IdleStrategy::from_level(DEFAULT_LEVEL).unwrap()
        );
    }

    #[test]
    fn a_small_take_is_some_small_messages() {
        assert!(small_take(1, 100) && small_take(30, 3000));
        assert!(!small_take(0, 100), "control frames only");
        assert!(!small_take(1, 1024), "a larger message");
        assert!(!small_take(200, SMALL_TAKE_BYTES), "too many bytes in all");
    }

    #[test]
    fn after_a_small_take_level_1_yields_once_before_it_parks() {
        let after = |level: u8, small: bool, n: usize| {
            let mut i = IdleStrategy::from_level(level).unwrap().idler_after(small);
            (0..n).map(|_| i.step()).collect::<Vec<_>>()
        };
        assert_eq!(
            after(1, true, 3),
            [IdleStep::Yield, IdleStep::Park, IdleStep::Park]
        );
        assert_eq!(after(1, false, 2), [IdleStep::Park, IdleStep::Park]);
        // Levels with their own spins or yields keep them unchanged.
        for level in 2..=10 {
            assert_eq!(after(level, true, 30), steps(level, 30), "level {level}");
        }
    }

    #[test]
    fn middle_levels_spin_then_yield_then_park() {
        let s = steps(3, 14);
        assert!(s[..10].iter().all(|x| *x == IdleStep::Spin));
        assert_eq!(&s[10..12], [IdleStep::Yield, IdleStep::Yield]);
        assert!(s[12..].iter().all(|x| *x == IdleStep::Park));
        for level in 1..=9 {
            let st = IdleStrategy::from_level(level).unwrap();
            assert!(st.parks(), "level {level}");
            let total = (st.spins + st.yields) as usize;
            assert_eq!(
                steps(level, total + 1)[total],
                IdleStep::Park,
                "level {level}"
            );
        }
    }

    #[test]
    fn levels_spin_longer_as_they_rise() {
        let mut prev = 0;
        for level in 1..=9 {
            let st = IdleStrategy::from_level(level).unwrap();
            assert!(st.spins + st.yields > prev || level == 1);
            prev = st.spins + st.yields;
        }
    }

    #[test]
    fn level_10_never_parks_and_out_of_range_is_an_error() {
        assert!(steps(10, 100_000).iter().all(|x| *x == IdleStep::Spin));
        assert!(!IdleStrategy::from_level(10).unwrap().parks());
        assert!(IdleStrategy::from_level(0).is_err());
        assert!(IdleStrategy::from_level(11).unwrap_err().contains("1..=10"));
    }
}
