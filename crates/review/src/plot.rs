//! SVG plots of `tidegate bench review`'s buffered-rate results (self-contained SVG 1.1, no
//! scripts or external resources): the rate against SI with RI = infinity, and against RI
//! with SI = 5, one line per granularity, each point with its 95% confidence interval.

use std::fmt::Write as _;

use serde_json::Value;

/// One series: a name and its points `(x, y, ci95)`.
type Series = (String, Vec<(f64, f64, f64)>);

const W: f64 = 640.0;
const H: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 4] = ["#1a5fb4", "#c01c28", "#26a269", "#986a44"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A line chart with error bars; `x` is drawn on a log scale (the intervals span decades).
fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).filter(|x| *x > 0.0).collect();
    let (x0, x1) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(*x), b.max(*x)));
    let (lx0, lx1) = if xs.is_empty() { (0.0, 1.0) } else { (x0.log10(), x1.log10().max(x0.log10() + 1e-9)) };
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x.log10() - lx0) / (lx1 - lx0) * pw;
    let py = |y: f64| TOP + (1.0 - y.clamp(0.0, 1.0)) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12" role="img" aria-labelledby="title"><title id="title">{}</title><rect width="{W}" height="{H}" fill="#fff"/>"##,
        esc(title)
    );
    let _ = write!(s, r#"<text x="{}" y="22" font-size="14" font-weight="bold">{}</text>"#, LEFT, esc(title));
    for i in 0..=5 {
        let y = f64::from(i) / 5.0;
        let (x2, yy, tx, ty) = (LEFT + pw, py(y), LEFT - 6.0, py(y) + 4.0);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{tx}" y="{ty}" text-anchor="end">{y:.1}</text>"##
        );
    }
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let _ = write!(
            s,
            r##"<line x1="{0}" x2="{0}" y1="{1}" y2="{2}" stroke="#eee"/><text x="{0}" y="{3}" text-anchor="middle">{x}</text>"##,
            px(x),
            TOP,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#555"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + pw / 2.0,
        H - 18.0,
        esc(x_label),
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let path: Vec<String> =
            pts.iter().filter(|p| p.0 > 0.0).map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1))).collect();
        let _ = write!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, path.join(" "));
        for (x, y, ci) in pts.iter().filter(|p| p.0 > 0.0) {
            let ci = if ci.is_finite() { *ci } else { 0.0 };
            let _ = write!(
                s,
                r#"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="{c}"/><circle cx="{0:.1}" cy="{3:.1}" r="3" fill="{c}"><title>{4}: x={x} y={y:.3} ± {ci:.3}</title></circle>"#,
                px(*x),
                py(y - ci),
                py(y + ci),
                py(*y),
                esc(name)
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="{c}" stroke-width="2"/><text x="{3}" y="{4}">{5}</text>"#,
            LEFT + pw + 12.0,
            LEFT + pw + 32.0,
            ly,
            LEFT + pw + 38.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn series(rows: &Value, x_key: &str, y_key: &str) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for row in rows.as_array().into_iter().flatten() {
        let gran = row["granularity"].as_str().unwrap_or("?").to_owned();
        let x = match &row[x_key] {
            Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
            _ => continue, // RI = infinity has no place on the axis
        };
        let y = row[y_key].as_f64().unwrap_or(f64::NAN);
        let ci = row[&format!("{y_key}_ci95")].as_f64().unwrap_or(f64::NAN);
        match out.iter_mut().find(|(n, _)| *n == gran) {
            Some((_, pts)) => pts.push((x, y, ci)),
            None => out.push((gran, vec![(x, y, ci)])),
        }
    }
    out
}

/// The plots of a `tidegate_review::bench::run` result, as `(file name, SVG text)`.
pub fn plots(result: &Value) -> Vec<(String, String)> {
    vec![
        (
            "review-rate-vs-si.svg".into(),
            chart(
                "Buffered rate vs SI (RI = infinity), 95% CI",
                "suspicious interval SI (log scale)",
                "buffered rate (in buffer at the end / requests)",
                &series(&result["buffered_rate_vs_si"], "si", "rate_end"),
            ),
        ),
        (
            "review-rate-vs-ri.svg".into(),
            chart(
                "Buffered on arrival vs RI (SI = 5, 80% removed per review), 95% CI",
                "review interval RI (log scale)",
                "buffered on arrival / requests",
                &series(&result["buffered_rate_vs_ri"], "ri", "rate_arrival"),
            ),
        ),
    ]
}
