//! The node's threads: started here, and joined at shutdown. Handles of threads that ended
//! are dropped whenever another starts or ends (their stacks are freed then), so a node
//! that accepts connections for years, or whose peers' threads all rested, holds handles
//! (and stacks) only for threads that still run, and for the last few that ended (one
//! that ends cannot forget itself, nor two that end at once each other).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The stack of an inbound connection's thread.
pub(crate) const INBOUND_STACK: usize = 512 << 10;

/// A cheap handle on the node's threads.
#[derive(Clone, Default)]
pub(crate) struct Threads(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl Threads {
    /// Start a thread named `name` running `f`.
    pub fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        self.spawn_with(std::thread::Builder::new().name(name), f)
    }

    /// Start a thread for an inbound connection whose peer proved the cluster secret (up
    /// to `max_peers` of these): each reserves a smaller stack than the default 2 MiB (TLS
    /// and the reader need far less).
    pub fn spawn_inbound(
        &self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let b = std::thread::Builder::new()
            .name(name)
            .stack_size(INBOUND_STACK);
        self.spawn_with(b, f)
    }

    fn spawn_with(
        &self,
        b: std::thread::Builder,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let on_end = Forget(self.clone());
        let h = b.spawn(move || {
            let _on_end = on_end;
            f()
        })?;
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|h| !h.is_finished());
        g.push(h);
        Ok(())
    }

    /// Drop the handles of threads that ended (detaching them frees their stacks).
    fn forget_ended(&self) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|h| !h.is_finished());
    }

    /// Threads still running.
    pub fn running(&self) -> usize {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().filter(|h| !h.is_finished()).count()
    }

    /// Join every thread, including any started meanwhile.
    pub fn join_all(&self) {
        loop {
            let hs = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
            if hs.is_empty() {
                return;
            }
            for h in hs {
                let _ = h.join();
            }
        }
    }
}

/// Run as a thread ends, even by a panic: forgets the threads that ended before it (a
/// thread cannot forget itself; the next to start or end does). Without it, a thousand
/// peers whose threads had all rested kept a thousand stacks: 32 KiB resident a peer.
struct Forget(Threads);

impl Drop for Forget {
    fn drop(&mut self) {
        self.0.forget_ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_threads_are_forgotten_and_all_are_joined() {
        let t = Threads::default();
        for i in 0..50 {
            t.spawn(format!("t{i}"), || {}).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            t.0.lock().unwrap().len() < 50,
            "finished handles are pruned"
        );
        // Threads that end forget those that ended before them, with no other start:
        // 20 threads, ended one after another, leave the handle of the last.
        let t = Threads::default();
        let go: Vec<_> = (0..20)
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                t.spawn(format!("e{i}"), move || {
                    let _ = rx.recv();
                })
                .unwrap();
                tx
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for (i, tx) in go.into_iter().enumerate() {
            drop(tx);
            while t.running() > 19 - i && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        assert_eq!(t.running(), 0);
        let left = t.0.lock().unwrap().len();
        assert_eq!(left, 1, "handles of ended threads kept");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        t.spawn("waits".into(), move || {
            let _ = rx.recv();
        })
        .unwrap();
        assert!(t.running() >= 1);
        drop(tx);
        t.join_all();
        assert_eq!(t.running(), 0);
    }
}
