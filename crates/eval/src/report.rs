//! Tables, JSON, CSV and SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

/// One printed table.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// File-name-safe id, e.g. `table1_contention`.
    pub id: String,
    /// Title (names the paper's table it mirrors).
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows of formatted cells.
    pub rows: Vec<Vec<String>>,
    /// Footnotes.
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table.
    pub fn new(id: &str, title: &str, columns: &[&str]) -> Table {
        Table {
            id: id.into(),
            title: title.into(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders as a Markdown table.
    pub fn render(&self) -> String {
        let mut s = format!("### {}\n\n| {} |\n|", self.title, self.columns.join(" | "));
        for _ in &self.columns {
            s.push_str(" --- |");
        }
        s.push('\n');
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        for n in &self.notes {
            let _ = writeln!(s, "\n{n}");
        }
        s
    }

    /// Renders as CSV.
    pub fn csv(&self) -> String {
        let esc = |c: &str| {
            if c.contains([',', '"', '\n']) { format!("\"{}\"", c.replace('"', "\"\"")) } else { c.to_owned() }
        };
        let mut s = self.columns.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",") + "\n";
        for r in &self.rows {
            s.push_str(&(r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",") + "\n"));
        }
        s
    }
}

/// A plot: lines over a numeric x axis, or grouped bars over categories.
#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    /// File-name-safe id.
    pub id: String,
    /// Title.
    pub title: String,
    /// X label.
    pub x_label: String,
    /// Y label.
    pub y_label: String,
    /// Category names (bars) — empty for a line plot.
    pub categories: Vec<String>,
    /// Named series of (x, y); for bars, x is the category index.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// Everything one workload produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Settings it ran with.
    pub settings: Value,
    /// Tables.
    pub tables: Vec<Table>,
    /// Raw per-cell metrics.
    pub cells: Vec<Value>,
    /// Plots.
    pub plots: Vec<Plot>,
    /// Wall-clock seconds the workload took.
    pub seconds: f64,
}

impl Report {
    /// Prints every table.
    pub fn render(&self) -> String {
        let mut s = format!("## {} ({:.1} s)\n\n", self.workload, self.seconds);
        for t in &self.tables {
            s.push_str(&t.render());
            s.push('\n');
        }
        s
    }

    /// Writes `<workload>_<table>.csv` for every table into `dir`.
    pub fn write_csv(&self, dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for t in &self.tables {
            let p = dir.join(format!("{}_{}.csv", self.workload, t.id));
            std::fs::write(&p, t.csv())?;
            out.push(p);
        }
        Ok(out)
    }

    /// Writes `<workload>_<plot>.svg` for every plot into `dir`.
    pub fn write_svg(&self, dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for p in &self.plots {
            let path = dir.join(format!("{}_{}.svg", self.workload, p.id));
            std::fs::write(&path, svg(p))?;
            out.push(path);
        }
        Ok(out)
    }
}

const PALETTE: [&str; 10] =
    ["#1b6ca8", "#d1495b", "#66a182", "#edae49", "#8d6a9f", "#2e4057", "#f26419", "#00798c", "#a23b72", "#6c757d"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * pow).find(|s| *s >= raw).unwrap_or(10.0 * pow)
}

/// Renders a plot as a standalone SVG (hand-written; no plotting dependency).
pub fn svg(p: &Plot) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 420.0, 70.0, 210.0, 40.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let pts = p.series.iter().flat_map(|(_, v)| v.iter().copied());
    let ymax = pts.clone().map(|(_, y)| y).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let bars = !p.categories.is_empty();
    let (xmin, xmax) = if bars {
        (0.0, p.categories.len() as f64)
    } else {
        let xs: Vec<f64> = pts.map(|(x, _)| x).collect();
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi > lo { (lo, hi) } else { (0.0, 1.0) }
    };
    let sx = |x: f64| left + (x - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| top + ph - y / ymax * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
        left + pw / 2.0,
        esc(&p.title),
        top + ph,
        left + pw,
        top + ph,
        top + ph,
        left + pw / 2.0,
        h - 12.0,
        esc(&p.x_label),
        top + ph / 2.0,
        esc(&p.y_label),
    );
    // Gridlines at a "nice" step (1, 2, 2.5 or 5 times a power of ten), about four of them.
    let step = nice_step(ymax / 1.1 / 4.0);
    let ticks = (ymax / step).floor().clamp(1.0, 20.0) as u32;
    for i in 0..=ticks {
        let y = step * f64::from(i);
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4}</text>",
            sy(y),
            left + pw,
            left - 6.0,
            sy(y) + 4.0,
            trim(y)
        );
    }
    if bars {
        let n = p.series.len().max(1) as f64;
        let slot = pw / p.categories.len().max(1) as f64;
        for (ci, c) in p.categories.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                left + slot * (ci as f64 + 0.5),
                top + ph + 18.0,
                esc(c)
            );
        }
        for (si, (_, v)) in p.series.iter().enumerate() {
            for &(x, y) in v {
                let bw = slot * 0.8 / n;
                let bx = left + slot * x + slot * 0.1 + bw * si as f64;
                let _ = writeln!(
                    s,
                    "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                    sy(y),
                    top + ph - sy(y),
                    PALETTE[si % PALETTE.len()]
                );
            }
        }
    } else {
        let mut xs: Vec<f64> = p.series.iter().flat_map(|(_, v)| v.iter().map(|(x, _)| *x)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for x in xs {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                sx(x),
                top + ph + 18.0,
                trim(x)
            );
        }
        for (si, (_, v)) in p.series.iter().enumerate() {
            let c = PALETTE[si % PALETTE.len()];
            let path: Vec<String> = v.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
            // Later series are dashed, so a series drawn over an equal one leaves it visible.
            let dash = ["", "8,4", "3,3", "12,4,3,4"][si % 4];
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>",
                path.join(" ")
            );
            for &(x, y) in v {
                let _ = writeln!(s, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>", sx(x), sy(y));
            }
        }
    }
    for (si, (name, _)) in p.series.iter().enumerate() {
        let y = top + 10.0 + 18.0 * si as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            left + pw + 14.0,
            y - 10.0,
            PALETTE[si % PALETTE.len()],
            left + pw + 32.0,
            y,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn trim(v: f64) -> String {
    if v.fract().abs() < 1e-9 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// Milliseconds with one decimal.
pub fn ms(d: f64) -> String {
    format!("{d:.1}")
}
