#![doc = include_str!("../../README.md")]
//!
//! # Layers
//! - `batchwire-core`: the sans-IO protocol core (wire format, handshake, bundlers).
//! - [`Node`], [`Mailbox`]: the IO layer and the API.
//! - `batchwire-cli` (the `batchwire` binary): the CLI and the benchmark.

pub mod config;
pub mod error;
pub mod io;
pub mod stats;

pub use crate::config::{NodeConfig, PeerSpec};
pub use crate::error::{Error, RecvError};
pub use crate::io::mailbox::{Envelope, Mailbox, RecvFuture};
pub use crate::io::node::{Address, Event, FailedMessage, Node};
pub use crate::io::tls::TlsFiles;
pub use crate::stats::{HandshakeFailure, HandshakeStats, NodeStats, PeerStats};
pub use batchwire_core::bundler::BundlerKind;
pub use bytes::Bytes;
