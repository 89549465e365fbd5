//! Micro-benchmarks of the sans-IO core, without sockets: encoding into the outbox, each
//! bundler's decision + take, and decoding a MESSAGES frame, per message.
//!
//! `cargo bench --bench core` prints nanoseconds per message (median of 7 repetitions,
//! with min-max). On a noisy machine, count instructions instead, which repeat exactly:
//! `valgrind --tool=callgrind target/release/deps/core-* --messages 100000 --reps 1`
//! and divide the total by the message count printed.

use std::hint::black_box;
use std::time::Instant;

use batchwire_core::bundler::{BundlerConfig, BundlerKind, Decision};
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame};
use batchwire_core::outbox::{Batch, Outbox};
use bytes::BytesMut;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Run `f` `reps` times; print median and spread of ns per message.
fn measure(label: &str, messages: usize, reps: usize, mut f: impl FnMut()) {
    let mut ns: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / messages as f64
        })
        .collect();
    ns.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{label:<40} {:>8.1} ns/msg  (min {:.1}, max {:.1})",
        ns[ns.len() / 2],
        ns[0],
        ns[ns.len() - 1]
    );
}

fn main() {
    // `cargo bench` passes --bench; ignore unknown flags.
    let n = arg("--messages", 1_000_000);
    let reps = arg("--reps", 7);
    let size = arg("--size", 100);
    let payload = vec![7u8; size];
    let (to, from) = (Name::from_static("sink"), Name::from_static("src"));
    println!("core micro-benchmarks: {n} messages of {size} B, {reps} repetitions");

    // Encoding: what a sender does under the lane lock.
    let mut ob = Outbox::new(64 << 10);
    let mut batch = Batch::default();
    measure("encode (outbox push, 64 KiB frames)", n, reps, || {
        for i in 0..n {
            ob.push_message(0, &to, &from, black_box(&payload), None);
            if i % 10_000 == 9_999 {
                ob.take(usize::MAX, usize::MAX, &mut batch, None);
            }
        }
        ob.take(usize::MAX, usize::MAX, &mut batch, None);
    });

    // Each bundler: its decision and the take it asks for, with the queue refilled in
    // bursts of 1000 messages (what a writer sees under load).
    for kind in BundlerKind::ALL {
        let cfg = BundlerConfig {
            kind: *kind,
            ..Default::default()
        };
        let mut b = cfg.build();
        let mut ob = Outbox::new(b.frame_bytes(64 << 10));
        let now = Instant::now();
        let label = format!("push + bundler {} + take", kind.name());
        measure(&label, n, reps, || {
            let mut sent = 0;
            while sent < n {
                for _ in 0..1000 {
                    ob.push_message(0, &to, &from, &payload, Some(now));
                }
                sent += 1000;
                // Drain as the writer would, moving the fake clock past any timer.
                let mut t = now;
                while ob.messages() > 0 {
                    match b.poll(ob.level(), t) {
                        Decision::Flush {
                            max_messages,
                            max_bytes,
                            ..
                        } => {
                            ob.take(max_messages, max_bytes, &mut batch, Some(t));
                            black_box(&batch);
                        }
                        Decision::Wait { until } => t = until.unwrap_or(t),
                    }
                }
            }
        });
    }

    // Decoding: the reader's check + runs, then the consumer's per-message decode.
    let mut ob = Outbox::new(64 << 10);
    for _ in 0..n {
        ob.push_message(0, &to, &from, &payload, None);
    }
    ob.take(usize::MAX, usize::MAX, &mut batch, None);
    let wire = batch.buf.clone();
    // One copy of the wire bytes per repetition, made before timing.
    let mut copies: Vec<BytesMut> = (0..reps).map(|_| BytesMut::from(&wire[..])).collect();
    measure("decode (check, runs, per-message)", n, reps, || {
        let mut buf = copies.pop().unwrap_or_default();
        let mut count = 0usize;
        while let Ok(Some(Frame::Messages(list))) = frame::decode(&mut buf, 1 << 20) {
            for (_, range, _) in list.runs() {
                let mut data = list.body().slice(range);
                while let Some((f, p, _)) = frame::next_message(&mut data) {
                    black_box((f, p));
                    count += 1;
                }
            }
        }
        assert_eq!(count, n);
    });
}
