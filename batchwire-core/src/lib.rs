//! The sans-IO core: wire format, handshake and bundlers as pure state machines. Nothing in
//! here touches a socket, spawns a thread or reads the clock; time is always passed in.

pub mod bundler;
pub mod codec;
pub mod frame;
pub mod fuzz;
pub mod handshake;
mod header;
pub mod idle;
pub mod messages;
pub mod outbox;
pub mod reliable;
pub mod session;
