//! The IO layer: sockets, threads and queues around the sans-IO core.

pub(crate) mod connection;
pub(crate) mod detector;
pub mod mailbox;
pub mod node;
pub(crate) mod queue;
pub mod tls;
pub(crate) mod writer;
