//! A receiver that never reads: the sender is pushed back and memory stays within the
//! configured bounds. Alone in its test binary, so the process's resident memory is this
//! test's own (other tests' nodes would grow it too).

mod common;

use std::time::{Duration, Instant};

use batchwire::{Address, Error};
use common::*;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn memory_stays_bounded_when_the_receiver_never_reads() {
    const QUEUE: usize = 1 << 20;
    const MAILBOX: usize = 1 << 20;
    const WINDOW: usize = 2 << 20;
    const SIZE: usize = 10_000;
    let cfgs: Vec<_> = mesh(&["a", "b"])
        .into_iter()
        .map(|c| {
            c.mailbox("never-read")
                .send_queue_bytes(QUEUE)
                .mailbox_bytes(MAILBOX)
                .unacked_bytes(WINDOW)
        })
        .collect();
    let nodes = start(cfgs);
    let to = Address::new("b", "never-read").unwrap();
    let before = rss_kib();
    let payload = bytes::Bytes::from(vec![1u8; SIZE]);
    let (mut accepted, mut full) = (0u64, 0u64);
    // Offer 2 GB; stop after 50 consecutive Full answers or 20 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..200_000 {
        match nodes[0].try_send(&to, payload.clone()) {
            Ok(()) => {
                accepted += 1;
                full = 0;
            }
            Err(Error::Full { .. }) => {
                full += 1;
                if full >= 50 || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let grown_mib = rss_kib().saturating_sub(before) / 1024;
    assert!(
        full >= 50,
        "the sender was never pushed back ({accepted} accepted)"
    );
    // The mailbox's credit (1 MiB) is what a sender may have outstanding towards it: the
    // message that finds credit left is accepted, the next is Full. So 105 of 10 kB, and
    // nothing else may hold one (the queue and the window, 3 MiB, are never reached).
    let bound = (MAILBOX / SIZE) as u64 + 1;
    assert!(
        accepted <= bound,
        "{accepted} messages of 10 kB accepted: the mailbox credit allows {bound}"
    );
    // All of them reach b's mailbox, which holds them unread.
    let mb = nodes[1].mailbox("never-read").unwrap();
    let t0 = Instant::now();
    while (mb.len() as u64) < accepted && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = nodes[0].stats().peers[0].clone();
    eprintln!(
        "accepted {accepted}, in b's mailbox {}, queued at a {}, unacked {} B, grown {grown_mib} MiB",
        mb.len(),
        st.queued,
        st.unacked_bytes
    );
    assert_eq!(mb.len() as u64, accepted, "{st:?}");
    assert!(st.unacked_bytes as usize <= WINDOW, "{st:?}");
    // The bytes above plus kernel socket buffers (not in RSS) and allocator slack.
    assert!(grown_mib < 16, "resident memory grew by {grown_mib} MiB");
}
