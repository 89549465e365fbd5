//! What the `batchwire` binary asks of the operating system: the C library (here alone:
//! `main.rs` denies `unsafe` everywhere else), signals, standard output.
#![allow(unsafe_code)]

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
/// ignored: the node's sockets rely on that. Any other failure (a full disk, a closed
/// descriptor) ends it with a message and status 74 (`EX_IOERR`): a panic on one of the
/// node's threads left the others running with nobody to stop them.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args) {
        stdout_failed(&e);
    }
}

/// Standard output cannot be written: end the process (see `write_stdout`).
fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    // Not `eprintln!`, which panics if standard error fails too.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("batchwire: cannot write to standard output: {e}\n"),
    );
    std::process::exit(74);
}

/// Write whole lines to standard output with plain `write(2)` calls, not through the
/// stdout lock: each call at most `PIPE_BUF` (4096) bytes of whole lines where it can, so
/// it is never split or mixed with another writer's lines on a pipe. For a thread that may
/// wait long (for a CPU, or for a slow reader) without holding up the lock others print
/// under. A closed pipe ends the process as `write_stdout` does.
pub fn write_stdout_lines(text: &str) {
    const PIPE_BUF: usize = 4096;
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // Up to the last line end within PIPE_BUF; a longer line alone, whole.
        let cut = if rest.len() <= PIPE_BUF {
            rest.len()
        } else {
            match rest[..PIPE_BUF].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(rest.len(), |i| i + 1),
            }
        };
        let mut chunk = &rest[..cut];
        while !chunk.is_empty() {
            // SAFETY: write(2) reads `chunk.len()` bytes from a live slice; fd 1 is this
            // process's standard output for its whole life.
            let n = unsafe { libc::write(1, chunk.as_ptr().cast(), chunk.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                stdout_failed(&e);
            }
            chunk = &chunk[n as usize..];
        }
        rest = &rest[cut..];
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

/// Restrict the calling thread (and the threads it starts from now on) to CPU `cpu`.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: `set` is a plain bit set that lives across the call (all-zero is empty);
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it and pid 0 means the
    // calling thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Start `cmd`'s process in the network namespace `ns` (a descriptor the caller keeps
/// open until the process has started).
pub fn exec_in_netns(cmd: &mut std::process::Command, ns: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only setns(2) runs, which is async-signal-safe and
    // touches no memory.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Move the calling thread (only it) into the network namespace `ns`, a descriptor the
/// caller holds open.
pub fn enter_netns(ns: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: setns(2) takes no pointers; it changes only this thread's namespace.
    if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The time of `clock` in ns (0 if it cannot be read).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) only writes into the live timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// SIGKILL to process `pid` (one this process started).
pub fn kill9(pid: u32) {
    // SAFETY: kill(2) takes no pointers.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// Whether this process runs as root (its effective user id is 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) only reads.
    unsafe { libc::geteuid() == 0 }
}

/// Let the calling thread run ahead of ordinary processes (nice -10) while `ahead`, or put
/// it back (nice 0). The processes and threads it starts meanwhile run at the ordinary
/// priority: the policy is set with `SCHED_RESET_ON_FORK`. The membership bench starts a
/// thousand node processes from one thread; at the ordinary priority that thread shared two
/// CPUs with every node already running, and starting them took 16-20 s (3-7 s ahead),
/// which the convergence time then measured. Going ahead needs `CAP_SYS_NICE` (root has it).
#[cfg(target_os = "linux")]
pub fn run_ahead(ahead: bool) -> std::io::Result<()> {
    let policy = libc::SCHED_OTHER | if ahead { libc::SCHED_RESET_ON_FORK } else { 0 };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) reads one sched_param, which lives in this frame;
    // pid 0 is the calling thread. gettid(2) and setpriority(2) take no pointers (on
    // Linux, PRIO_PROCESS with a thread id sets that thread's nice value).
    unsafe {
        if libc::sched_setscheduler(0, policy, &param) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let tid = libc::gettid() as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, if ahead { -10 } else { 0 }) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Run the calling thread only when the CPUs have nothing else to run (SCHED_IDLE).
#[cfg(target_os = "linux")]
pub fn run_when_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) on the calling thread (0) reads one sched_param,
    // which lives in this frame.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Elsewhere the thread keeps its priority.
#[cfg(not(target_os = "linux"))]
pub fn run_when_idle() -> std::io::Result<()> {
    Ok(())
}

/// The host's monotonic clock (CLOCK_MONOTONIC, which `std::time::Instant` reads on Linux)
/// in nanoseconds: comparable between processes of one host, so the membership bench can
/// take the time a node saw a change from the node itself (`--event-times`).
#[cfg(target_os = "linux")]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec, which lives in this frame.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Elsewhere there is no clock shared with other processes: 0.
#[cfg(not(target_os = "linux"))]
pub fn monotonic_ns() -> u64 {
    0
}

/// Which of `fds` have something to read (or were closed), waiting at most `limit` for
/// one (poll(2)); none on an error (an interrupted wait).
pub fn readable<'a, F: std::os::fd::AsRawFd + 'a>(
    fds: impl Iterator<Item = &'a F>,
    limit: std::time::Duration,
) -> Vec<usize> {
    let mut polled: Vec<libc::pollfd> = fds
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = limit.as_millis().min(60_000) as libc::c_int;
    // SAFETY: poll(2) reads and writes `polled.len()` pollfd entries, all in `polled`,
    // which outlives the call; the descriptors are kept open by the borrowed `fds`.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return Vec::new();
    }
    polled
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(k, _)| k)
        .collect()
}

/// Elsewhere the thread keeps its priority.
#[cfg(not(target_os = "linux"))]
pub fn run_ahead(_ahead: bool) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}
