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
mod request;
mod send;
mod stats;
mod stream;

/// The guide (`docs/guide.md`): how to use the library and the `batchwire` command, every
/// guarantee, refusal and setting. Its examples are compiled and run as doc tests.
#[doc = include_str!("../../docs/guide.md")]
pub mod guide {}

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
pub use crate::mailbox::{Mailbox, RecvBatchFuture, RecvFuture};
#[cfg(feature = "metrics")]
pub use crate::metrics::MESSAGES_PER_WRITE_BUCKETS;
pub use crate::node::Node;
pub use crate::request::RequestFuture;
pub use crate::send::SendFuture;
pub use crate::stats::{HandshakeStats, MembershipStats, NodeStats, PeerStats, RequestStats};
pub use crate::stream::EventStream;
pub use batchwire_core::bundler::BundlerKind;
pub use batchwire_core::membership::MembershipConfig;
pub use bytes::Bytes;
/// The `Stream` trait that [`Mailbox`] and [`EventStream`] implement (the one
/// `futures::Stream` re-exports).
pub use futures_core::Stream;

/// A value serialized with postcard (`send_value`, `request_value`, `reply_value`).
pub(crate) fn encode_value<T: serde::Serialize>(value: &T) -> Result<Bytes, Error> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|e| Error::Encode(e.to_string()))
}
