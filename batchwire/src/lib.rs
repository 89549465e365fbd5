#![doc = include_str!("../../README.md")]
//!
//! # Layout
//! - `batchwire-core`: the sans-IO protocol (wire format, handshake, bundlers, the per-peer
//!   `Session` with every protocol rule and timer). No sockets, threads or clock reads.
//! - this crate: the API ([`Node`], [`Mailbox`], [`NodeConfig`], [`Event`]) on a thin
//!   threaded IO layer (the private `io` module: one owner per piece of state, thread
//!   bodies that take only what they use).
//! - `batchwire-cli` (the `batchwire` binary): the CLI and the benchmark.
#![warn(missing_docs)]

mod address;
mod class;
mod config;
mod config_file;
mod error;
mod event;
mod io;
mod mailbox;
#[cfg(feature = "metrics")]
mod metrics;
mod node;
mod stats;

pub use crate::address::Address;
pub use crate::class::Class;
pub use crate::config::{NodeConfig, PeerSpec, TlsFiles};
pub use crate::config_file::{NodeFile, TlsSection};
pub use crate::error::{Error, RecvError};
pub use crate::event::{
    CloseReason, DownReason, Event, FailReason, FailedMessage, HandshakeFailure, Member,
    MemberState,
};
pub use crate::io::mailbox::Envelope;
pub use crate::mailbox::{Mailbox, RecvFuture};
pub use crate::node::Node;
pub use crate::stats::{HandshakeStats, MembershipStats, NodeStats, PeerStats};
pub use batchwire_core::bundler::BundlerKind;
pub use batchwire_core::membership::MembershipConfig;
pub use bytes::Bytes;
