//! What the `batchwire` binary asks of the C library (the only `unsafe` of `main`).

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
