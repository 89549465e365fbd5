use super::*;

#[test]
fn summarize_gives_median_min_max() {
    assert_eq!(summarize(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
    assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
    assert_eq!(summarize(&[]), (0.0, 0.0, 0.0));
}

#[test]
fn si_suffixes() {
    assert_eq!(si(1_234_567.0), "1.23 M");
    assert_eq!(si(999.0), "999.0 ");
}

#[test]
fn percentiles_come_from_the_histogram_in_microseconds() {
    let mut h = new_histogram().unwrap();
    assert_eq!(percentiles_us(&h), None);
    for i in 1..=1000u64 {
        h.record(i * 1000).unwrap(); // 1 µs .. 1000 µs
    }
    let [p50, p90, p99, p999] = percentiles_us(&h).unwrap();
    for (got, want) in [(p50, 500.0), (p90, 900.0), (p99, 990.0), (p999, 999.0)] {
        assert!((got - want).abs() <= want * 0.002, "{got} vs {want}");
    }
    // Shipping a histogram as pairs and merging it back loses nothing.
    let mut back = new_histogram().unwrap();
    add_pairs(&mut back, &hist_to_pairs(&h)).unwrap();
    assert_eq!(back.len(), 1000);
    assert_eq!(percentiles_us(&back), percentiles_us(&h));
    assert_eq!(
        median_percentiles(&[[1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0], [2.0; 4]]),
        Some([2.0, 2.0, 3.0, 4.0])
    );
}

#[test]
fn tables_align_and_failed_rows_show_no_figures() {
    let mut ok = BenchResult::new("fan-in", "natural", Some(1), 100, vec![1e6, 2e6], "msgs/s");
    ok.messages = 10;
    let bad = BenchResult::new("fan-in", "linger", Some(1), 100, vec![3e6, 4e6], "msgs/s")
        .with_faults(Faults {
            lost: 2,
            duplicated: 0,
            reordered: 1,
        });
    assert!(!ok.failed() && bad.failed());
    let mut t = Table::new(["bundler", "median"]);
    for r in [&ok, &bad] {
        if r.failed() {
            t.failed_row(vec![r.label(false)], r.failure());
        } else {
            t.row(vec![r.label(false), si(r.median)]);
        }
    }
    let s = t.render();
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], "bundler  median");
    assert_eq!(lines[1], "natural  1.50 M");
    assert_eq!(lines[2], "linger   FAILED: lost 2 duplicated 0 reordered 1");
    assert!(!s.contains("3.50"), "a failed row shows no figure: {s}");
}

/// A soak whose survivors were declared down fails, as the benchmark's doc says, and
/// a failed row is marked in the JSON.
#[test]
fn a_soak_with_a_survivor_declared_down_fails() {
    let mut r = BenchResult::new("soak", "natural", None, 100, vec![1.0], "msgs/s");
    r.soak = Some(SoakFigures::default());
    assert!(!r.failed());
    r.soak.as_mut().unwrap().downs_of_survivors = 1;
    assert!(r.failed());
    assert!(r.failure().contains("downs of others 1"), "{}", r.failure());
    let path = std::env::temp_dir().join(format!("bw-json-{}.json", std::process::id()));
    write_json(&path, std::slice::from_ref(&r)).unwrap();
    let back: Report = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(back.results[0].verification_failed);
}

#[test]
fn machine_and_commit_are_filled() {
    let m = Machine::detect();
    assert!(m.cores >= 1);
    assert!(!m.kernel.is_empty() && !m.cpu.is_empty());
    assert!(!current_commit().is_empty());
}
