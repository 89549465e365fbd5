//! A child process that is killed when dropped, so a failing test leaves nothing running.
//! Shared by the CLI's integration tests (`mod proc;` with a `#[path]`).

#![allow(dead_code)]

/// Kills the child process when dropped.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
