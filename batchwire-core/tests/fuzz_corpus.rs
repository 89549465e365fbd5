//! The fuzz targets (fuzz/fuzz_targets) as an ordinary test: every seed in fuzz/seeds,
//! every truncation of it, and seeded random mutations, none of which may panic. Run the
//! real fuzzer with `cargo fuzz run frame` (cargo-fuzz, nightly or RUSTC_BOOTSTRAP=1).

use batchwire_core::fuzz;

fn seeds(dir: &str) -> Vec<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(dir);
    let mut v: Vec<_> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!v.is_empty());
    v.sort();
    v
}

/// xorshift64*: deterministic mutations without a dependency.
fn mutations(seed: &[u8], n: usize, mut state: u64) -> Vec<Vec<u8>> {
    let mut next = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..n)
        .map(|_| {
            let mut m = seed.to_vec();
            for _ in 0..1 + next() % 4 {
                let r = next();
                match r % 4 {
                    0 if !m.is_empty() => {
                        let i = (r >> 8) as usize % m.len();
                        m[i] ^= 1 << ((r >> 40) % 8);
                    }
                    1 if !m.is_empty() => {
                        let i = (r >> 8) as usize % m.len();
                        m[i] = (r >> 32) as u8;
                    }
                    2 => m.push((r >> 16) as u8),
                    _ => {
                        let cut = (r >> 8) as usize % (m.len() + 1);
                        m.truncate(cut);
                    }
                }
            }
            m
        })
        .collect()
}

fn exercise(dir: &str, target: fn(&[u8])) {
    for (k, s) in seeds(dir).iter().enumerate() {
        for cut in 0..=s.len() {
            target(&s[..cut]);
        }
        for m in mutations(s, 3000, 0x9e37_79b9_7f4a_7c15 ^ k as u64) {
            target(&m);
        }
    }
}

#[test]
fn frame_decoder_survives_the_corpus() {
    exercise("frame", fuzz::frames);
    exercise("handshake", fuzz::frames);
}

#[test]
fn the_peer_machine_survives_the_corpus() {
    // Its seeds began as some of the frame decoder's, and grow with what the fuzzer keeps.
    exercise("peer", fuzz::peer);
}

#[test]
fn handshake_survives_the_corpus() {
    exercise("handshake", fuzz::handshake);
    exercise("frame", fuzz::handshake);
}

#[test]
fn membership_survives_the_corpus() {
    // Real packets made now, and whatever the fuzzer kept in fuzz/seeds/membership.
    let mut all = fuzz::membership_seeds();
    all.extend(seeds("membership"));
    for (k, s) in all.iter().enumerate() {
        for cut in 0..=s.len() {
            fuzz::membership(&s[..cut]);
        }
        for m in mutations(s, 1000, 0x5bd1_e995 ^ k as u64) {
            fuzz::membership(&m);
        }
    }
}

#[test]
fn datagrams_survive_the_corpus() {
    // Sealed datagrams made now (each opens), and whatever the fuzzer kept.
    let mut all = fuzz::datagram_seeds();
    all.extend(seeds("datagram"));
    for (k, s) in all.iter().enumerate() {
        for cut in 0..=s.len() {
            fuzz::datagram(&s[..cut]);
        }
        for m in mutations(s, 300, 0x2545_f491 ^ k as u64) {
            fuzz::datagram(&m);
        }
    }
}
