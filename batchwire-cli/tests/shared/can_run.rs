//! One place that decides whether a test that needs something from the machine (root,
//! `/dev/net/tun`, two CPUs) can run, and what happens when it cannot: under CI (the
//! environment variable `CI` set, and not "false" or "0") the test fails, naming what is
//! missing, because a CI run that quietly skips them would claim more than it ran;
//! elsewhere it says SKIPPED on stderr and the caller returns.
//!
//! Shared by the CLI's integration tests (`mod can_run;` with a `#[path]`) and the link
//! emulator's unit tests in `src/link/hosts.rs`. No unsafe, no subprocess.

#![allow(dead_code)]

/// Whether we run under CI.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `None` if this process runs as root, else why not.
pub fn root_missing() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // "Uid:\treal\teffective\tsaved\tfs": the effective one decides.
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_owned);
    match euid.as_deref() {
        Some("0") => None,
        Some(u) => Some(format!("needs root (effective uid {u})")),
        None => Some("needs root (no Uid line in /proc/self/status)".to_owned()),
    }
}

/// `None` if network namespaces with TUN devices can be made here (root and
/// `/dev/net/tun`), else what is missing.
pub fn netns_missing() -> Option<String> {
    let mut why = Vec::new();
    if let Some(r) = root_missing() {
        why.push(r);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        why.push("needs /dev/net/tun (the tun kernel module)".to_owned());
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// `None` if at least `n` CPUs are available to this process, else how many are.
pub fn cpus_missing(n: usize) -> Option<String> {
    let have = std::thread::available_parallelism().map_or(1, |c| c.get());
    (have < n).then(|| format!("needs {n} CPUs, {have} available"))
}

/// Whether test `test` can run, given what is `missing`. Under CI a missing thing is a
/// failure (this panics); elsewhere it is reported as SKIPPED and `false` is returned.
pub fn can_run(test: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    assert!(
        !under_ci(),
        "{test} cannot run on this CI machine: it {why}. A CI run must run it: give the \
         runner what it needs (CI is set, so this is a failure, not a skip)"
    );
    eprintln!("SKIPPED {test}: it {why} (with CI=true this fails instead)");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_missing_is_named_and_ci_makes_it_a_failure() {
        assert!(can_run("t", None));
        assert!(cpus_missing(1).is_none());
        assert!(
            cpus_missing(1 << 20)
                .unwrap()
                .contains("needs 1048576 CPUs")
        );
        if !under_ci() {
            assert!(!can_run("t", Some("needs x".into())));
        } else {
            let r = std::panic::catch_unwind(|| can_run("t", Some("needs x".into())));
            assert!(r.is_err());
        }
    }
}
