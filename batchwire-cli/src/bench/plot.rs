//! `--plot FILE.svg`: the results as a hand-written SVG (no plotting crate, no fonts to
//! ship): one bar chart per scenario, unit and size (bars: bundlers), and,
//! if rpc ran, its latency percentiles per row as horizontal bars on a log scale. Failed
//! results are drawn as the word FAILED, never as a bar.
//!
//! Only plain SVG 1.1 is used (no CSS, no rotated text, every stroke and fill explicit), so
//! simple renderers such as ImageMagick's built-in one draw it as browsers do.

use std::fmt::Write as _;
use std::path::Path;

use super::{BenchResult, si, us};

const WIDTH: f64 = 960.0;
/// Height of a vertical chart's plot area.
const PLOT_H: f64 = 240.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
/// Room above the plot area for the title; the legend's rows come under it.
const TITLE_H: f64 = 30.0;
const LEGEND_ROW: f64 = 18.0;
/// Room below the plot area for the group or tick labels, and between charts.
const BOTTOM: f64 = 34.0;
const GAP: f64 = 16.0;
/// Approximate width of a character at font-size 12.
const CHAR_W: f64 = 6.8;
/// Thickness of one bar in a horizontal chart, and the space around a group of them.
const BAR_H: f64 = 7.0;
const BAND_PAD: f64 = 8.0;
const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Refuse anything but an `.svg` path (before the bench runs, not after).
pub fn check_path(path: &Path) -> Result<(), String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(()),
        Some(e) => Err(format!(
            "--plot {}: only .svg is supported, not .{e} (convert the SVG with e.g. `convert out.svg out.png`)",
            path.display()
        )),
        None => Err(format!(
            "--plot {}: only .svg is supported (name the file *.svg)",
            path.display()
        )),
    }
}

/// Write the chart of `results` to `path`.
pub fn write_svg(path: &Path, results: &[BenchResult]) -> Result<(), String> {
    check_path(path)?;
    std::fs::write(path, render(results))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Escape text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One bar chart: a group per label, one bar per series in each group. Vertical: groups
/// along x, linear y. Horizontal: groups down the page, log x.
struct Chart {
    title: String,
    groups: Vec<String>,
    series: Vec<String>,
    /// values[series][group]: `None` = no such result; `Some(None)` = failed.
    values: Vec<Vec<Option<Option<f64>>>>,
    horizontal: bool,
    fmt: fn(f64) -> String,
}

fn fmt_si(v: f64) -> String {
    si(v).trim_end().to_string()
}

fn fmt_ms(v: f64) -> String {
    format!("{v:.2}")
}

fn fmt_us(v: f64) -> String {
    us(v)
}

/// A round upper bound for a linear axis, and its tick step.
fn nice_max(v: f64) -> (f64, f64) {
    if v <= 0.0 || !v.is_finite() {
        return (1.0, 0.2);
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            let top = m * mag;
            return (top, top / 5.0);
        }
    }
    (10.0 * mag, 2.0 * mag)
}

/// The decades a log axis spans for values in `lo..=hi` (at least one decade).
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let a = if lo.is_finite() && lo > 0.0 {
        lo.log10().floor()
    } else {
        0.0
    };
    let b = if hi.is_finite() && hi > 0.0 {
        hi.log10().ceil()
    } else {
        a + 1.0
    };
    (a, b.max(a + 1.0))
}

impl Chart {
    /// Where each legend entry goes: (x, row).
    fn legend_layout(&self) -> Vec<(f64, usize)> {
        let (mut x, mut row) = (LEFT, 0);
        self.series
            .iter()
            .map(|s| {
                let w = 16.0 + CHAR_W * s.chars().count() as f64 + 18.0;
                if x > LEFT && x + w > WIDTH - RIGHT {
                    (x, row) = (LEFT, row + 1);
                }
                let at = (x, row);
                x += w;
                at
            })
            .collect()
    }

    fn legend_rows(&self) -> usize {
        self.legend_layout().last().map(|(_, r)| r + 1).unwrap_or(0)
    }

    /// Where the plot area starts, below the title and legend.
    fn plot_top(&self, y0: f64) -> f64 {
        y0 + TITLE_H + self.legend_rows() as f64 * LEGEND_ROW + 12.0
    }

    fn band_h(&self) -> f64 {
        self.series.len().max(1) as f64 * BAR_H + BAND_PAD
    }

    fn plot_h(&self) -> f64 {
        if self.horizontal {
            self.groups.len().max(1) as f64 * self.band_h()
        } else {
            PLOT_H
        }
    }

    /// The chart's whole height.
    fn height(&self) -> f64 {
        self.plot_top(0.0) + self.plot_h() + BOTTOM + GAP
    }

    /// Finite positive values, for the axis.
    fn range(&self) -> (f64, f64) {
        let vals = self.values.iter().flatten().filter_map(|v| v.flatten());
        let vals: Vec<f64> = vals.filter(|v| v.is_finite() && *v > 0.0).collect();
        let hi = vals.iter().copied().fold(0.0, f64::max);
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        (lo, hi)
    }

    fn draw(&self, out: &mut String, y0: f64) {
        let _ = writeln!(
            out,
            r#"<text x="{LEFT:.1}" y="{:.1}" font-size="15" font-weight="bold" fill="black" stroke="none">{}</text>"#,
            y0 + 20.0,
            esc(&self.title)
        );
        for (i, (s, (lx, row))) in self.series.iter().zip(self.legend_layout()).enumerate() {
            let ly = y0 + TITLE_H + row as f64 * LEGEND_ROW;
            let _ = writeln!(
                out,
                r#"<rect x="{lx:.1}" y="{ly:.1}" width="12" height="12" fill="{}" stroke="none"/>"#,
                COLORS[i % COLORS.len()]
            );
            text(out, lx + 16.0, ly + 10.0, 12.0, "start", "black", s);
        }
        if self.horizontal {
            self.draw_horizontal(out, y0);
        } else {
            self.draw_vertical(out, y0);
        }
    }

    fn draw_vertical(&self, out: &mut String, y0: f64) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let top = self.plot_top(y0);
        let bottom = top + PLOT_H;
        let (m, step) = nice_max(self.range().1);
        let scale = |v: f64| bottom - (v / m).clamp(0.0, 1.0) * (bottom - top);
        for k in 0..=5 {
            let t = k as f64 * step;
            let y = scale(t);
            line(out, x0, y, x1, y, "#dddddd");
            text(out, x0 - 6.0, y + 4.0, 11.0, "end", "black", &(self.fmt)(t));
        }
        line(out, x0, bottom, x1, bottom, "#333333");
        line(out, x0, top, x0, bottom, "#333333");
        let gw = (x1 - x0) / self.groups.len().max(1) as f64;
        let bw = gw * 0.8 / self.series.len().max(1) as f64;
        for (g, name) in self.groups.iter().enumerate() {
            text(
                out,
                x0 + (g as f64 + 0.5) * gw,
                bottom + 18.0,
                12.0,
                "middle",
                "black",
                name,
            );
            for (s, row) in self.values.iter().enumerate() {
                let bx = x0 + g as f64 * gw + gw * 0.1 + s as f64 * bw;
                let cx = bx + bw / 2.0;
                match row.get(g).copied().flatten() {
                    None => {}
                    Some(None) => text(out, cx, bottom - 6.0, 10.0, "middle", "#cc0000", "FAILED"),
                    Some(Some(v)) => {
                        let y = scale(v);
                        bar(
                            out,
                            bx,
                            y,
                            (bw - 1.0).max(1.0),
                            bottom - y,
                            s,
                            &self.series[s],
                            &(self.fmt)(v),
                        );
                        if bw >= 14.0 {
                            text(out, cx, y - 3.0, 9.0, "middle", "black", &(self.fmt)(v));
                        }
                    }
                }
            }
        }
    }

    fn draw_horizontal(&self, out: &mut String, y0: f64) {
        let longest = self
            .groups
            .iter()
            .map(|g| g.chars().count())
            .max()
            .unwrap_or(0);
        let x0 = LEFT.max(longest as f64 * CHAR_W + 16.0);
        let x1 = WIDTH - RIGHT - 40.0; // room for the value right of the longest bar
        let top = self.plot_top(y0);
        let bottom = top + self.plot_h();
        let (lo, hi) = self.range();
        let (a, b) = decades(lo, hi);
        let scale = |v: f64| x0 + ((v.max(10f64.powf(a)).log10() - a) / (b - a)) * (x1 - x0);
        for e in a as i32..=b as i32 {
            let t = 10f64.powi(e);
            let x = scale(t);
            line(out, x, top, x, bottom, "#dddddd");
            text(
                out,
                x,
                bottom + 16.0,
                11.0,
                "middle",
                "black",
                &(self.fmt)(t),
            );
        }
        line(out, x0, top, x0, bottom, "#333333");
        line(out, x0, bottom, x1, bottom, "#333333");
        let band = self.band_h();
        for (g, name) in self.groups.iter().enumerate() {
            let by = top + g as f64 * band + BAND_PAD / 2.0;
            let mid = by + (band - BAND_PAD) / 2.0;
            text(out, x0 - 8.0, mid + 4.0, 12.0, "end", "black", name);
            if g > 0 {
                line(
                    out,
                    x0 - 4.0,
                    by - BAND_PAD / 2.0,
                    x0,
                    by - BAND_PAD / 2.0,
                    "#333333",
                );
            }
            for (s, row) in self.values.iter().enumerate() {
                let y = by + s as f64 * BAR_H;
                match row.get(g).copied().flatten() {
                    None => {}
                    Some(None) => {
                        text(out, x0 + 4.0, mid + 4.0, 11.0, "start", "#cc0000", "FAILED");
                        break;
                    }
                    Some(Some(v)) => {
                        let x = scale(v);
                        bar(
                            out,
                            x0,
                            y,
                            (x - x0).max(1.0),
                            BAR_H - 1.0,
                            s,
                            &self.series[s],
                            &(self.fmt)(v),
                        );
                        text(
                            out,
                            x + 3.0,
                            y + BAR_H - 1.0,
                            8.0,
                            "start",
                            "black",
                            &(self.fmt)(v),
                        );
                    }
                }
            }
        }
    }
}

fn text(out: &mut String, x: f64, y: f64, size: f64, anchor: &str, fill: &str, s: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" stroke="none">{}</text>"#,
        esc(s)
    );
}

fn line(out: &mut String, x1: f64, y1: f64, x2: f64, y2: f64, color: &str) {
    let _ = writeln!(
        out,
        r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{color}" stroke-width="1"/>"#
    );
}

/// A bar of series `s`, with a tooltip.
#[allow(clippy::too_many_arguments)]
fn bar(out: &mut String, x: f64, y: f64, w: f64, h: f64, s: usize, series: &str, value: &str) {
    let _ = writeln!(
        out,
        r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{}" stroke="none"><title>{}: {}</title></rect>"#,
        h.max(0.0),
        COLORS[s % COLORS.len()],
        esc(series),
        esc(value)
    );
}

/// A result's series name in a chart.
fn series_name(r: &BenchResult, show_idle: bool) -> String {
    let mut s = r.label(show_idle);
    if r.scenario == "rpc-async" {
        s += &format!(", async x{}", r.threads);
    } else if r.scenario == "rpc" {
        if r.bundler == super::rpc::TCP_FLOOR {
            s = "tcp ping-pong (floor)".into();
        } else if r.threads == 1 {
            s += ", 1 call";
        } else {
            s += &format!(", {}x{}", r.nodes, r.threads);
        }
    }
    s
}

fn size_name(size: usize) -> String {
    if size >= 1000 && size.is_multiple_of(1000) {
        format!("{} KB", size / 1000)
    } else {
        format!("{size} B")
    }
}

/// Push `x` to `v` unless it is there already; return its index.
fn index_of<T: PartialEq>(v: &mut Vec<T>, x: T) -> usize {
    match v.iter().position(|y| *y == x) {
        Some(i) => i,
        None => {
            v.push(x);
            v.len() - 1
        }
    }
}

/// The charts for `results`.
fn charts(results: &[BenchResult]) -> Vec<Chart> {
    let mut charts = Vec::new();
    // One chart per (scenario, unit), in the order they ran; one per size too when a
    // scenario ran several, each on its own axis (10 KB runs a thirtieth of 100 B's rate:
    // on one axis its bars would vanish).
    let mut pairs: Vec<(String, String)> = Vec::new();
    for r in results {
        index_of(&mut pairs, (r.scenario.clone(), r.unit.clone()));
    }
    let mut keys: Vec<(String, String, Option<usize>)> = Vec::new();
    for (scenario, unit) in pairs {
        let mut sizes = Vec::new();
        for r in results {
            if r.scenario == scenario && r.unit == unit {
                index_of(&mut sizes, r.size);
            }
        }
        if sizes.len() > 1 {
            for z in sizes {
                keys.push((scenario.clone(), unit.clone(), Some(z)));
            }
        } else {
            keys.push((scenario, unit, None));
        }
    }
    for (scenario, unit, size) in keys {
        let rows: Vec<&BenchResult> = results
            .iter()
            .filter(|r| {
                r.scenario == scenario && r.unit == unit && size.is_none_or(|z| r.size == z)
            })
            .collect();
        let mut idles: Vec<Option<u8>> = Vec::new();
        for r in &rows {
            if r.idle_cpu_level.is_some() {
                index_of(&mut idles, r.idle_cpu_level);
            }
        }
        let show_idle = idles.len() > 1;
        let (mut groups, mut series) = (Vec::new(), Vec::new());
        let mut cells = Vec::new();
        for r in &rows {
            let g = index_of(&mut groups, size_name(r.size));
            let s = index_of(&mut series, series_name(r, show_idle));
            cells.push((s, g, (!r.failed()).then_some(r.median)));
        }
        let (scenario, by) = match size {
            Some(z) => (format!("{scenario} {}", size_name(z)), "bundler"),
            None => (scenario, "bundler and size"),
        };
        let mut values = vec![vec![None; groups.len()]; series.len()];
        for (s, g, v) in cells {
            values[s][g] = Some(v);
        }
        let lower = unit.starts_with("ms/");
        charts.push(Chart {
            title: format!(
                "{scenario}: {unit} by {by} ({} is better)",
                if lower { "lower" } else { "higher" }
            ),
            groups,
            series,
            values,
            horizontal: false,
            fmt: if lower { fmt_ms } else { fmt_si },
        });
    }
    // rpc latency: one group per row, one bar per percentile.
    let lat: Vec<&BenchResult> = results
        .iter()
        .filter(|r| r.p50_us.is_some() || (r.scenario == "rpc" && r.failed()))
        .collect();
    if !lat.is_empty() {
        let mut idles: Vec<Option<u8>> = Vec::new();
        for r in &lat {
            if r.idle_cpu_level.is_some() {
                index_of(&mut idles, r.idle_cpu_level);
            }
        }
        let multi_size = lat.iter().any(|r| r.size != lat[0].size);
        let groups: Vec<String> = lat
            .iter()
            .map(|r| {
                let n = series_name(r, idles.len() > 1);
                if multi_size {
                    format!("{n} {}", size_name(r.size))
                } else {
                    n
                }
            })
            .collect();
        let series: Vec<String> = ["p50", "p90", "p99", "p99.9"].map(String::from).to_vec();
        let values = (0..4)
            .map(|k| {
                lat.iter()
                    .map(|r| {
                        if r.failed() {
                            return Some(None);
                        }
                        let p = [r.p50_us, r.p90_us, r.p99_us, r.p999_us][k];
                        p.map(Some)
                    })
                    .collect()
            })
            .collect();
        charts.push(Chart {
            title: "rpc: call latency percentiles, µs (log scale, lower is better)".into(),
            groups,
            series,
            values,
            horizontal: true,
            fmt: fmt_us,
        });
    }
    charts
}

/// The whole SVG document.
pub fn render(results: &[BenchResult]) -> String {
    let charts = charts(results);
    let height = charts.iter().map(Chart::height).sum::<f64>().max(50.0) + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white" stroke="none"/>"#
    );
    if charts.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="20" y="30" font-size="14">no results</text>"#
        );
    }
    let mut y = 0.0;
    for c in &charts {
        let _ = writeln!(out, "<g>");
        c.draw(&mut out, y);
        let _ = writeln!(out, "</g>");
        y += c.height();
    }
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests;
