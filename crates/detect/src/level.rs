//! The consistency levels L0–L4 of the source paper's §4.1.

use serde::Serialize;
use std::fmt;

/// A named point of the paper's chain `L0 ⊊ L1 ⊊ L2 ⊊ L3 ⊊ L4`. Each level prevents the
/// anomalies of the level below plus one more:
///
/// | level | prevents |
/// | --- | --- |
/// | L0 | nothing |
/// | L1 | A1 stale generation |
/// | L2 | A1, A3 causal cascade |
/// | L3 | A1, A3, A6 tool-effect reordering |
/// | L4 | A1, A3, A6, A2 phantom tool |
///
/// A4 (split view) is not on the chain: the paper formalises it outside the single-store
/// model, and no level is distinguished by preventing it. It is reported next to the level,
/// never folded into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Level {
    /// Admits everything.
    L0,
    /// No A1.
    L1,
    /// No A1, A3.
    L2,
    /// No A1, A3, A6.
    L3,
    /// No A1, A3, A6, A2.
    L4,
}

impl Level {
    /// The highest level a trace satisfies, given which anomalies it exhibits.
    pub fn classify(a1: bool, a2: bool, a3: bool, a6: bool) -> Level {
        if a1 {
            Level::L0
        } else if a3 {
            Level::L1
        } else if a6 {
            Level::L2
        } else if a2 {
            Level::L3
        } else {
            Level::L4
        }
    }

    /// The anomalies this level prevents, in the order the chain adds them.
    pub fn prevents(self) -> &'static [&'static str] {
        const CHAIN: [&str; 4] = ["A1", "A3", "A6", "A2"];
        &CHAIN[..self as usize]
    }

    /// `"L0"` … `"L4"`.
    pub fn as_str(self) -> &'static str {
        ["L0", "L1", "L2", "L3", "L4"][self as usize]
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Level;

    #[test]
    fn the_first_anomaly_missing_from_the_chain_caps_the_level() {
        assert_eq!(Level::classify(false, false, false, false), Level::L4);
        assert_eq!(Level::classify(true, true, true, true), Level::L0);
        assert_eq!(Level::classify(false, true, true, true), Level::L1);
        assert_eq!(Level::classify(false, true, false, true), Level::L2);
        assert_eq!(Level::classify(false, true, false, false), Level::L3);
        assert_eq!(Level::L3.prevents(), &["A1", "A3", "A6"]);
    }
}
