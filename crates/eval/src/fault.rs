//! The fault injector: F1–F5, Bernoulli or burst, seeded per (workload, mode, rate, run).
//!
//! | class | where | what the caller sees | what the provider saw |
//! | --- | --- | --- | --- |
//! | F1 | before execution | a transient error | nothing |
//! | F2 | after the effect, before the return | an error whose outcome is unknown | the effect |
//! | F3 | inside a compensation | a transient error | nothing undone |
//! | F4 | duplicate delivery | success | the request twice (same idempotency key, if any) |
//! | F5 | timeout | an error whose outcome is unknown | the effect, or not (a seeded coin) |
//!
//! F1, F2, F4 and F5 are drawn on forward calls (and releases), F3 on compensation attempts.
//! The injector never looks at which mechanism it serves: the same seed gives the same draws.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A fault class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum FaultClass {
    /// Before execution.
    F1,
    /// After the effect, before the return.
    F2,
    /// Inside a compensation.
    F3,
    /// Duplicate delivery.
    F4,
    /// Timeout: the effect may or may not have happened.
    F5,
}

impl FaultClass {
    /// Every class.
    pub const ALL: [FaultClass; 5] = [FaultClass::F1, FaultClass::F2, FaultClass::F3, FaultClass::F4, FaultClass::F5];

    /// `F1` … `F5`.
    pub fn name(self) -> &'static str {
        match self {
            FaultClass::F1 => "F1",
            FaultClass::F2 => "F2",
            FaultClass::F3 => "F3",
            FaultClass::F4 => "F4",
            FaultClass::F5 => "F5",
        }
    }
}

/// How faults arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Pattern {
    /// Each eligible call faults independently with the profile's rate.
    Bernoulli,
    /// A burst starts with probability `rate / len`, then the next `len` eligible calls fault
    /// (the marginal rate stays close to `rate`).
    Burst {
        /// Calls per burst.
        len: u32,
    },
}

/// What to inject.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultProfile {
    /// Per-call probability (marginal).
    pub rate: f64,
    /// The classes drawn from (uniformly) when a fault fires.
    pub classes: Vec<FaultClass>,
    /// Arrival pattern.
    pub pattern: Pattern,
}

impl FaultProfile {
    /// No faults.
    pub fn none() -> FaultProfile {
        FaultProfile { rate: 0.0, classes: Vec::new(), pattern: Pattern::Bernoulli }
    }

    /// Bernoulli faults of the given classes.
    pub fn bernoulli(rate: f64, classes: &[FaultClass]) -> FaultProfile {
        FaultProfile { rate, classes: classes.to_vec(), pattern: Pattern::Bernoulli }
    }

    /// Mixed faults of every class.
    pub fn mixed(rate: f64) -> FaultProfile {
        FaultProfile::bernoulli(rate, &FaultClass::ALL)
    }
}

/// A seeded injector for one run.
#[derive(Debug)]
pub struct Injector {
    rng: SmallRng,
    profile: FaultProfile,
    burst_left: u32,
    /// Faults injected, by class (F1..F5).
    pub injected: [u64; 5],
}

impl Injector {
    /// An injector whose draws depend only on `seed`.
    pub fn new(profile: FaultProfile, seed: u64) -> Injector {
        Injector { rng: SmallRng::seed_from_u64(seed), profile, burst_left: 0, injected: [0; 5] }
    }

    fn fires(&mut self) -> bool {
        if self.profile.rate <= 0.0 {
            return false;
        }
        match self.profile.pattern {
            Pattern::Bernoulli => self.rng.gen_bool(self.profile.rate.min(1.0)),
            Pattern::Burst { len } => {
                if self.burst_left > 0 {
                    self.burst_left -= 1;
                    return true;
                }
                let entry = (self.profile.rate / f64::from(len.max(1))).min(1.0);
                if self.rng.gen_bool(entry) {
                    self.burst_left = len.saturating_sub(1);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Draws the fault (if any) for a forward call: one of the profile's F1, F2, F4, F5.
    pub fn on_call(&mut self) -> Option<FaultClass> {
        let forward: Vec<FaultClass> = self.profile.classes.iter().copied().filter(|c| *c != FaultClass::F3).collect();
        if forward.is_empty() || !self.fires() {
            return None;
        }
        let c = forward[self.rng.gen_range(0..forward.len())];
        self.injected[c as usize] += 1;
        Some(c)
    }

    /// Whether this compensation attempt fails (F3, when the profile has it).
    pub fn on_compensation(&mut self) -> bool {
        if !self.profile.classes.contains(&FaultClass::F3) || !self.fires() {
            return false;
        }
        self.injected[FaultClass::F3 as usize] += 1;
        true
    }

    /// A fair coin (did a timed-out call take effect?).
    pub fn coin(&mut self) -> bool {
        self.rng.gen_bool(0.5)
    }

    /// A uniform draw in `[lo, hi)` (think times).
    pub fn uniform(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { self.rng.gen_range(lo..hi) }
    }
}

/// The seed of one run: FNV-1a over (base seed, workload, mode, rate, run).
pub fn seed_for(base: u64, workload: &str, mode: &str, rate: f64, run: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(&base.to_le_bytes());
    eat(workload.as_bytes());
    eat(&[0]);
    eat(mode.as_bytes());
    eat(&[0]);
    eat(&rate.to_bits().to_le_bytes());
    eat(&run.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws_and_rates_are_close_to_the_profile() {
        let draw = |seed| {
            let mut i = Injector::new(FaultProfile::mixed(0.2), seed);
            (0..2000).map(|_| i.on_call()).collect::<Vec<_>>()
        };
        let s = seed_for(7, "stress", "tidegate", 0.2, 3);
        assert_eq!(draw(s), draw(s));
        assert_ne!(draw(s), draw(seed_for(7, "stress", "tidegate", 0.2, 4)));
        let fired = draw(s).iter().filter(|f| f.is_some()).count();
        assert!((300..500).contains(&fired), "{fired} of 2000 at 0.2");
    }

    #[test]
    fn bursts_come_in_runs_at_about_the_marginal_rate() {
        let mut i = Injector::new(
            FaultProfile { rate: 0.12, classes: vec![FaultClass::F1], pattern: Pattern::Burst { len: 3 } },
            1,
        );
        let v: Vec<bool> = (0..30_000).map(|_| i.on_call().is_some()).collect();
        let rate = v.iter().filter(|b| **b).count() as f64 / v.len() as f64;
        assert!((0.09..0.15).contains(&rate), "{rate}");
        let starts = v.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        let mean_run = v.iter().filter(|b| **b).count() as f64 / starts;
        assert!(mean_run >= 2.9, "mean burst length {mean_run}");
    }
}
