//! Exact binomial intervals and small summaries.
//!
//! Rates are reported with 95% Clopper–Pearson (exact, two-sided) intervals. A zero count is
//! reported as the interval's upper bound (`0/100 (≤3.6%)`), as the Atomix paper does.

use serde::Serialize;

/// `k` events out of `n` trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Rate {
    /// Events.
    pub k: u64,
    /// Trials.
    pub n: u64,
}

impl Rate {
    /// `k` of `n`.
    pub fn new(k: u64, n: u64) -> Rate {
        Rate { k, n }
    }

    /// The point estimate (0 when `n == 0`).
    pub fn p(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.k as f64 / self.n as f64 }
    }

    /// The 95% Clopper–Pearson interval.
    pub fn ci95(&self) -> (f64, f64) {
        clopper_pearson(self.k, self.n, 0.05)
    }

    /// `k/n = p% [lo, hi]`, or `0/n (≤hi%)` for a zero count.
    pub fn show(&self) -> String {
        let (lo, hi) = self.ci95();
        if self.n == 0 {
            "n/a".to_owned()
        } else if self.k == 0 {
            format!("0/{} (≤{:.1}%)", self.n, hi * 100.0)
        } else {
            format!("{}/{} = {:.1}% [{:.1}, {:.1}]", self.k, self.n, self.p() * 100.0, lo * 100.0, hi * 100.0)
        }
    }
}

/// Exact two-sided `1 - alpha` interval for a binomial proportion.
pub fn clopper_pearson(k: u64, n: u64, alpha: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let lo = if k == 0 {
        0.0
    } else {
        // Smallest p with P(X >= k | p) = alpha/2; P(X >= k) grows with p.
        bisect(|p| 1.0 - binom_cdf(k - 1, n, p) - alpha / 2.0)
    };
    let hi = if k == n {
        1.0
    } else {
        // Largest p with P(X <= k | p) = alpha/2; P(X <= k) falls with p.
        bisect(|p| alpha / 2.0 - binom_cdf(k, n, p))
    };
    (lo, hi)
}

/// Finds the root of an increasing function on (0, 1).
fn bisect(f: impl Fn(f64) -> f64) -> f64 {
    let (mut a, mut b) = (0.0f64, 1.0f64);
    for _ in 0..80 {
        let m = (a + b) / 2.0;
        if f(m) < 0.0 { a = m } else { b = m }
    }
    (a + b) / 2.0
}

/// P(X <= k) for X ~ Binomial(n, p), summed in log space.
fn binom_cdf(k: u64, n: u64, p: f64) -> f64 {
    if p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return if k >= n { 1.0 } else { 0.0 };
    }
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    let ln_n = ln_gamma(n as f64 + 1.0);
    (0..=k.min(n))
        .map(|i| {
            let i_f = i as f64;
            (ln_n - ln_gamma(i_f + 1.0) - ln_gamma((n - i) as f64 + 1.0) + i_f * lp + (n - i) as f64 * lq).exp()
        })
        .sum::<f64>()
        .min(1.0)
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let s = C.iter().enumerate().skip(1).fold(C[0], |acc, (i, c)| acc + c / (x + i as f64));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

/// Mean of a sample (0 for an empty one).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() { 0.0 } else { xs.iter().sum::<f64>() / xs.len() as f64 }
}

/// The `q` quantile (nearest rank) of a sample (0 for an empty one).
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clopper_pearson_matches_published_values() {
        // 0/100: the paper's "CP-95% upper bound 3.7%" (3.62% exactly).
        let (lo, hi) = clopper_pearson(0, 100, 0.05);
        assert_eq!(lo, 0.0);
        assert!((hi - 0.0362).abs() < 0.0005, "{hi}");
        // 0/500: [0, 0.74].
        assert!((clopper_pearson(0, 500, 0.05).1 - 0.00735).abs() < 0.0002);
        // 400/500: [76, 83].
        let (lo, hi) = clopper_pearson(400, 500, 0.05);
        assert!((lo - 0.762).abs() < 0.005 && (hi - 0.835).abs() < 0.005, "{lo} {hi}");
        // 17/30 = 57% [37, 75].
        let (lo, hi) = clopper_pearson(17, 30, 0.05);
        assert!((lo - 0.374).abs() < 0.005 && (hi - 0.745).abs() < 0.005, "{lo} {hi}");
    }

    #[test]
    fn zero_counts_show_as_upper_bounds() {
        assert_eq!(Rate::new(0, 100).show(), "0/100 (≤3.6%)");
        assert!(Rate::new(3, 10).show().starts_with("3/10 = 30.0% ["));
    }
}
