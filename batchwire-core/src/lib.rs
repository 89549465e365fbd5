//! The sans-IO core: wire format, handshake and bundlers as pure state machines. Nothing in
//! here touches a socket, spawns a thread or reads the clock; time is always passed in.

#![forbid(unsafe_code)]

pub mod bulk;
pub mod bundler;
pub mod call;
pub mod codec;
pub mod credit;
pub mod frame;
pub mod fuzz;
pub mod handshake;
mod header;
pub mod idle;
#[cfg(test)]
mod lanes_tests;
pub mod membership;
pub mod messages;
pub mod outbox;
pub mod peer;
pub mod reassembly;
pub mod reliable;
pub mod session;
#[cfg(test)]
mod testutil;
