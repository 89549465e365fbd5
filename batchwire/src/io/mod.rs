//! The IO layer: sockets, threads and queues around the sans-IO core.

pub(crate) mod connection;
pub(crate) mod detector;
pub mod mailbox;
pub mod node;
pub(crate) mod queue;
pub mod tls;
pub(crate) mod writer;

/// Spin or yield as an idle step says (the caller holds no lock); parking is the caller's,
/// on its own condvar.
pub(crate) fn pause(step: batchwire_core::idle::IdleStep) {
    use batchwire_core::idle::{IdleStep, SPIN_HINTS};
    match step {
        IdleStep::Spin => {
            for _ in 0..SPIN_HINTS {
                std::hint::spin_loop();
            }
        }
        IdleStep::Yield => std::thread::yield_now(),
        IdleStep::Park => {}
    }
}
