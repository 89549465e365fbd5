use super::*;

/// A `NAME/tls` entry's certificates go to its own workers only; `bench --tls` gives
/// them to every worker. (They once went to every worker spawned after the first TLS
/// entry: `natural` after `natural/tls` in one bench ran TLS, at half its rate.)
#[test]
fn only_bench_tls_puts_every_worker_on_tls() {
    let dir = tls_certs().unwrap();
    assert!(dir.join("ca.pem").exists());
    assert_eq!(tls_for_all(), None);
    assert_eq!(enable_tls().unwrap(), dir);
    assert_eq!(tls_for_all(), Some(&dir));
    remove_tls_certs();
    assert!(!dir.exists());
}

#[test]
fn verifier_counts_faults_per_stream() {
    let mut v = Verifier::new(2, 3);
    for (s, q) in [(0, 0), (1, 0), (0, 1), (1, 2), (1, 1), (0, 1), (0, 2)] {
        v.see(s, q);
    }
    // Stream 1 saw 2 before 1 (two reorderings: 2 skips 1, then 1 goes back).
    assert_eq!((v.distinct, v.duplicated, v.reordered), (6, 1, 2));
    v.see(2, 0); // no such stream
    v.see(0, 3); // out of range
    assert_eq!(v.duplicated, 3);
    assert_eq!(
        v.faults(7),
        Faults {
            lost: 1,
            duplicated: 3,
            reordered: 2
        }
    );
    let mut stamped = Verifier::new(2, 2);
    stamped.see_stamped(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]); // seq 1 of stream 1
    stamped.see_stamped(&[0; 11]); // too short for a stream
    assert_eq!(
        (stamped.distinct, stamped.duplicated, stamped.reordered),
        (1, 1, 1)
    );
    let mut ok = Verifier::new(3, 2);
    for q in 0..2 {
        for s in 0..3 {
            ok.see(s, q);
        }
    }
    assert_eq!(ok.faults(6), Faults::default());
}

#[test]
fn shares_add_up() {
    let total: u64 = (0..7).map(|t| share(100, 7, t)).sum();
    assert_eq!(total, 100);
    assert_eq!((share(100, 7, 0), share(100, 7, 6)), (15, 14));
}

#[test]
fn process_cpu_time_counts_the_work_of_another_thread() {
    let thread_cpu = || clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let c0 = process_cpu_ns();
    // Another thread burns 20 ms of its own CPU time (at most 10 s of wall clock).
    let burnt = std::thread::spawn(move || {
        let (t, start) = (std::time::Instant::now(), thread_cpu());
        let mut x = 0u64;
        while thread_cpu() - start < 20_000_000 && t.elapsed() < Duration::from_secs(10) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        thread_cpu() - start
    })
    .join()
    .unwrap();
    assert!(burnt >= 20_000_000, "the thread burnt only {burnt} ns");
    // Other tests run in this process meanwhile: the process's time is at least it.
    let counted = process_cpu_ns() - c0;
    assert!(counted >= burnt, "counted {counted} ns of {burnt}");
}

#[test]
fn rng_stays_in_range() {
    let mut r = Rng::new(7);
    let mut hit = [false; 3];
    for _ in 0..100 {
        hit[r.below(3)] = true;
    }
    assert_eq!(hit, [true; 3]);
}

/// A receiver stops taking at the expected count; a repeat that came after the last new
/// message (before the sender's last barrier) is still found and counted as duplicated.
#[test]
fn a_late_duplicate_after_the_count_is_counted() {
    let secret = b"bench-test-secret";
    let l0 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let l1 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a0, a1) = (l0.local_addr().unwrap(), l1.local_addr().unwrap());
    drop((l0, l1));
    let cfg = |me: &str, at, other: &str, there| {
        NodeConfig::new(me, at, &secret[..])
            .peer(other, there)
            .mailbox("sink")
            .mailbox(CTL)
    };
    let n0 = Node::start(cfg("n0", a0, "n1", a1)).unwrap();
    let n1 = Node::start(cfg("n1", a1, "n0", a0)).unwrap();
    assert!(n0.wait_for_peers(&["n1"], Duration::from_secs(10)));
    let sink = n1.mailbox("sink").unwrap();
    let sender = std::thread::spawn(move || {
        let ctl = Ctl::new(&n0, 0, 2).unwrap();
        let to = Address::new("n1", "sink").unwrap();
        for seq in [0u64, 1, 2, 1] {
            n0.send(&to, seq.to_le_bytes().to_vec()).unwrap();
        }
        ctl.finish(Duration::from_secs(10)).unwrap();
        n0.shutdown();
    });
    let ctl = Ctl::new(&n1, 1, 2).unwrap();
    let mut v = Verifier::new(1, 3);
    let see = |v: &mut Verifier, p: &[u8]| v.see(0, u64_at(p, 0).unwrap());
    while v.distinct < 3 {
        let e = sink.recv_timeout(Duration::from_secs(10)).unwrap();
        see(&mut v, &e.payload);
    }
    finish_checking(ctl, sink, &mut v, 3, Duration::from_secs(10), see).unwrap();
    sender.join().unwrap();
    assert_eq!((v.distinct, v.duplicated, v.reordered), (3, 1, 0));
}
