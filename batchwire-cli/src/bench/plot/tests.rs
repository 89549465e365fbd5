use super::*;
use crate::bench::Faults;

/// A minimal well-formedness check: every tag closes, in order, and no stray `<`/`&`.
fn well_formed(s: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('<') {
        let text = &rest[..i];
        check_text(text)?;
        let end = rest[i..].find('>').ok_or("unclosed tag")? + i;
        let tag = &rest[i + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("stray </{name}>"))?;
            if open != name.trim() {
                return Err(format!("<{open}> closed by </{name}>"));
            }
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().ok_or("empty tag")?;
            stack.push(name.to_string());
        }
        if !tag.matches('"').count().is_multiple_of(2) {
            return Err(format!("unbalanced quotes in <{tag}>"));
        }
        rest = &rest[end + 1..];
    }
    check_text(rest)?;
    if !stack.is_empty() {
        return Err(format!("unclosed: {stack:?}"));
    }
    Ok(())
}

fn check_text(t: &str) -> Result<(), String> {
    for (i, _) in t.match_indices('&') {
        let ent = &t[i..];
        if !["&amp;", "&lt;", "&gt;", "&quot;"]
            .iter()
            .any(|e| ent.starts_with(e))
        {
            return Err(format!("unescaped & in {t:?}"));
        }
    }
    Ok(())
}

fn result(scenario: &str, bundler: &str, size: usize, v: f64, unit: &str) -> BenchResult {
    BenchResult::new(scenario, bundler, Some(1), size, vec![v, v * 1.1], unit)
}

#[test]
fn svg_is_well_formed_with_every_kind_of_chart() {
    let mut rs = vec![
        result("throughput", "natural", 100, 6e6, "msgs/s"),
        result("throughput", "natural", 1000, 1.5e6, "msgs/s"),
        result("throughput", "a<b&c", 100, 5e6, "msgs/s"),
        result("roundtrip", "linger", 100, 4.2, "ms/batch"),
        result("rpc", "natural", 100, 2e4, "calls/s/node")
            .with_latency(Some([40.0, 80.0, 300.0, 2000.0])),
        result("rpc", "linger", 100, 2e4, "calls/s/node").with_faults(Faults {
            lost: 1,
            ..Faults::default()
        }),
    ];
    rs[4].threads = 16;
    let svg = render(&rs);
    well_formed(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    assert!(svg.contains("a&lt;b&amp;c"));
    assert!(svg.contains("FAILED"));
    assert!(svg.contains("latency percentiles"));
    assert!(svg.contains("roundtrip: ms/batch by bundler and size (lower is better)"));
    // Several sizes: a chart each, on its own axis, in messages per second as measured.
    assert!(svg.contains("throughput 100 B: msgs/s by bundler (higher is better)"));
    assert!(svg.contains("throughput 1 KB: msgs/s by bundler (higher is better)"));
    assert!(!svg.contains("bytes/s"));
    assert!(
        svg.contains(">1.57 M<") || svg.contains(">1.57 M"),
        "in SI units: {svg}"
    );
    // One size: messages per second, as measured.
    let one = render(&rs[..1]);
    assert!(one.contains("throughput: msgs/s by bundler and size (higher is better)"));
    assert!(one.contains(">6 M<") || one.contains(">6.00 M<"), "{one}");
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    // No results at all is still a document.
    well_formed(&render(&[])).unwrap();
}

#[test]
fn the_checker_catches_broken_documents() {
    assert!(well_formed("<svg><g></svg>").is_err());
    assert!(well_formed("<svg>a & b</svg>").is_err());
    assert!(well_formed("<svg><rect x=\"1/></svg>").is_err());
}

#[test]
fn only_svg_paths_are_accepted() {
    assert!(check_path(Path::new("/tmp/x.svg")).is_ok());
    let e = check_path(Path::new("/tmp/x.png")).unwrap_err();
    assert!(e.contains("only .svg is supported"), "{e}");
    assert!(check_path(Path::new("/tmp/x")).is_err());
}

#[test]
fn axes_round_up() {
    assert_eq!(decades(45.0, 3000.0), (1.0, 4.0));
    assert_eq!(decades(f64::INFINITY, 0.0), (0.0, 1.0));
    assert_eq!(nice_max(7.3e6), (1e7, 2e6));
    assert_eq!(nice_max(1.6), (2.0, 0.4));
    assert_eq!(nice_max(0.0), (1.0, 0.2));
}
