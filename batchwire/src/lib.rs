//! Fast, reliable node-to-node messaging with application-level message bundling.
//!
//! A [`Node`] has a name, a listen address and the cluster's secret; it reaches other
//! nodes by name (static peers, or a cluster joined through any member) and delivers
//! messages to named [`Mailbox`]es, addressed `mailbox@node` ([`Address`]). Every message
//! accepted by a send is delivered exactly once and in order, or handed back to its sender
//! in an [`Event::SendFailed`]. Messages bound for one node are bundled into few writes by
//! a bundler chosen by name ([`BundlerKind`]).
//!
//! ```
//! use std::time::Duration;
//! use batchwire::{Address, Node, NodeConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let a = Node::start(NodeConfig::new("a", "127.0.0.1:0".parse()?, "secret"))?;
//! // b joins the cluster through a (port 0: the OS picks; `local_addr` says which).
//! let b = Node::start(NodeConfig::new("b", "127.0.0.1:0".parse()?, "secret").join(a.local_addr()))?;
//! let inbox = b.mailbox("inbox")?;
//! assert!(a.wait_for_members(Duration::from_secs(10), |m| m.iter().any(|m| m.name == "b")));
//! a.send(&Address::new("b", "inbox")?, "hello")?;
//! assert_eq!(&inbox.recv_timeout(Duration::from_secs(10))?.payload[..], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! The [guide] covers everything else: request/reply and async, typed messages,
//! membership, TLS, configuration, operations, bundlers and idle levels. The repository's
//! `docs/` has the architecture, the wire protocol, the benchmark and its results.
//!
//! # Layout
//! - `batchwire-core`: the sans-IO protocol (wire format, handshake, bundlers, the per-peer
//!   `Session` with every protocol rule and timer). No sockets, threads or clock reads.
//! - this crate: the API ([`Node`], [`Mailbox`], [`NodeConfig`], [`Event`]) on a thin
//!   threaded IO layer (the private `io` module: one owner per piece of state, thread
//!   bodies that take only what they use).
//! - `batchwire-cli` (the `batchwire` binary): the CLI and the benchmark.
#![warn(missing_docs)]
// The C library is called from `sys` alone.
#![deny(unsafe_code)]

mod address;
mod certs;
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
mod seed;
mod send;
mod stats;
mod stream;
#[cfg(unix)]
mod sys;
mod value;

/// The guide (`docs/guide.md`): how to use the library and the `batchwire` command, every
/// guarantee, refusal and setting. Its examples are compiled and run as doc tests.
#[doc = include_str!("../../docs/guide.md")]
pub mod guide {}

/// The README, so that its first program is compiled and run as a doc test.
#[doc = include_str!("../../README.md")]
#[doc(hidden)]
pub mod readme {}

pub use crate::address::Address;
pub use crate::certs::TlsFiles;
pub use crate::class::Class;
pub use crate::config::{NodeConfig, PeerSpec};
pub use crate::config_file::{NodeFile, TlsSection};
pub use crate::error::{Error, RecvError};
pub use crate::event::{
    CloseReason, DownReason, Event, FailReason, FailedMessage, HandshakeFailure, Member,
    MemberState, TimedEvent,
};
pub use crate::io::envelope::Envelope;
pub use crate::mailbox::{Mailbox, RecvBatchFuture, RecvFuture};
#[cfg(feature = "metrics")]
pub use crate::metrics::MESSAGES_PER_WRITE_BUCKETS;
pub use crate::node::Node;
pub use crate::request::RequestFuture;
pub use crate::seed::Seed;
pub use crate::send::SendFuture;
pub use crate::stats::{HandshakeStats, MembershipStats, NodeStats, PeerStats, RequestStats};
pub use crate::stream::EventStream;
pub use batchwire_core::bundler::BundlerKind;
pub use batchwire_core::membership::MembershipConfig;
pub use bytes::Bytes;
/// The `Stream` trait that [`Mailbox`] and [`EventStream`] implement (the one
/// `futures::Stream` re-exports).
pub use futures_core::Stream;
