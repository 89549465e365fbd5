//! What the `batchwire` binary asks of the operating system: the C library (the only
//! `unsafe` of `main`), signals, standard output.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// glibc gives every thread that allocates a malloc arena of its own, each reserving 64 MiB
/// of address space, up to eight per CPU: a node with a thread per peer and per pending
/// handshake reserved 1.1 GB with 69 threads (14 MB resident), and under an address-space
/// limit (`ulimit -v`) a flood of 64 handshakes made an allocation fail, which aborts the
/// process. Two arenas serve a node's threads as well (they hold locks only while
/// allocating). A `MALLOC_ARENA_MAX` set in the environment wins.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a tunable of glibc's allocator; called once, at the
        // start of main, before any other thread runs.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Write to standard output; a closed pipe (`batchwire ... | head`) ends the process
/// quietly with the status a shell gives a process killed by SIGPIPE (141), instead of
/// `println!`'s panic ("failed printing to stdout: Broken pipe"). SIGPIPE itself stays
/// ignored: the node's sockets rely on that.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        panic!("failed printing to stdout: {e}");
    }
}

/// SIGTERM and SIGINT ask `batchwire node` to stop: it answers what its echo mailbox
/// already holds, then shuts down cleanly (queued messages flushed, acknowledgements
/// awaited up to `shutdown_timeout`, a goodbye to every peer) and exits 0. A second signal
/// while it drains ends it at once (exit 130), as the shell convention has it.
pub fn stop_signals() -> Result<Arc<AtomicBool>, String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        // The second one exits at once; the first only sets `stop`.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&stop)))
            .map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }
    Ok(stop)
}
