//! The deadline wheel: a hierarchical timing wheel whose cost per fired timer does not grow
//! with the number of timers armed (docs/plans.md, "The deadline wheel").

const BITS: u32 = 6;
const SLOTS: usize = 1 << BITS;
const LEVELS: usize = 10;
/// Deadlines are clamped below this (2^60 ms, about 36 million years).
pub const MAX_DEADLINE: u64 = (1 << (BITS as usize * LEVELS)) - 1;

/// Timers keyed by `T`, each at a millisecond of the engine clock.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Wheel<T> {
    now: u64,
    slots: Vec<Vec<(u64, T)>>,
    occupied: [u64; LEVELS],
    len: usize,
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Wheel::new()
    }
}

impl<T> Wheel<T> {
    /// An empty wheel at time 0.
    pub fn new() -> Wheel<T> {
        Wheel { now: 0, slots: (0..SLOTS * LEVELS).map(|_| Vec::new()).collect(), occupied: [0; LEVELS], len: 0 }
    }

    /// The shape a decoded wheel must have (so that indexing it cannot panic).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.slots.len() != SLOTS * LEVELS {
            return Err(format!("the deadline wheel has {} slots, expected {}", self.slots.len(), SLOTS * LEVELS));
        }
        let held: usize = self.slots.iter().map(Vec::len).sum();
        if held != self.len {
            return Err(format!("the deadline wheel holds {held} timers but counts {}", self.len));
        }
        for (l, occ) in self.occupied.iter().enumerate() {
            for s in 0..SLOTS {
                if (occ >> s) & 1 == 0 && !self.slots[l * SLOTS + s].is_empty() {
                    return Err(format!("slot {s} of level {l} holds timers but is marked empty"));
                }
            }
        }
        Ok(())
    }

    /// Every armed timer's item, in no particular order.
    pub(crate) fn items(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten().map(|(_, t)| t)
    }

    /// Timers armed and not yet fired.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wheel's time: every timer at or before it has fired.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Arms a timer at `at` (a time already passed fires at the next `advance`). O(1).
    pub fn insert(&mut self, at: u64, item: T) {
        let at = at.clamp(self.now, MAX_DEADLINE);
        self.place(at, item);
        self.len += 1;
    }

    fn place(&mut self, at: u64, item: T) {
        let masked = (self.now ^ at) | (SLOTS as u64 - 1);
        let significant = 63 - masked.leading_zeros();
        let level = ((significant / BITS) as usize).min(LEVELS - 1);
        let slot = ((at >> (level as u32 * BITS)) as usize) & (SLOTS - 1);
        self.slots[level * SLOTS + slot].push((at, item));
        self.occupied[level] |= 1 << slot;
    }

    /// The earliest time a slot holds timers for (a lower bound of the next timer).
    pub fn next_deadline(&self) -> Option<u64> {
        (0..LEVELS).find_map(|l| self.next_at(l).map(|(_, d)| d))
    }

    fn next_at(&self, level: usize) -> Option<(usize, u64)> {
        let occ = self.occupied[level];
        if occ == 0 {
            return None;
        }
        let shift = level as u32 * BITS;
        let now_slot = ((self.now >> shift) as usize) & (SLOTS - 1);
        let rotated = occ.rotate_right(now_slot as u32);
        let slot = (rotated.trailing_zeros() as usize + now_slot) % SLOTS;
        let level_range: u64 = 1u64 << (shift + BITS).min(63);
        let start = if shift + BITS >= 64 { 0 } else { self.now & !(level_range - 1) };
        Some((slot, start + ((slot as u64) << shift)))
    }

    /// Moves the clock to `to` and hands every timer at or before it to `fire`, in time order
    /// per slot.
    pub fn advance(&mut self, to: u64, mut fire: impl FnMut(u64, T)) {
        while let Some((level, slot, deadline)) = (0..LEVELS).find_map(|l| self.next_at(l).map(|(s, d)| (l, s, d))) {
            if deadline > to {
                break;
            }
            self.now = self.now.max(deadline);
            let items = std::mem::take(&mut self.slots[level * SLOTS + slot]);
            self.occupied[level] &= !(1 << slot);
            for (at, item) in items {
                if level == 0 || at <= self.now {
                    self.len -= 1;
                    fire(at, item);
                } else {
                    self.place(at, item);
                }
            }
        }
        self.now = self.now.max(to.min(MAX_DEADLINE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn each_advance_fires_exactly_the_timers_due() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut w = Wheel::new();
        let mut pending = std::collections::BTreeSet::new();
        for i in 0..5_000u64 {
            let at = match i % 3 {
                0 => rng.gen_range(0..100),
                1 => rng.gen_range(0..100_000),
                _ => rng.gen_range(0..10_000_000_000),
            };
            w.insert(at, i);
            pending.insert((at, i));
        }
        let mut t = 0u64;
        while !pending.is_empty() {
            t += rng.gen_range(1..2_000_000_000u64);
            let mut got = Vec::new();
            w.advance(t, |at, i| got.push((at, i)));
            got.sort_unstable();
            let due: Vec<_> = pending.iter().copied().take_while(|(at, _)| *at <= t).collect();
            assert_eq!(got, due, "advance to {t}");
            for d in due {
                pending.remove(&d);
                // Timers armed while running land relative to the wheel's time.
                if d.1 % 7 == 0 {
                    let at = t + rng.gen_range(0..1_000_000);
                    w.insert(at, d.1 + 1_000_000);
                    pending.insert((at, d.1 + 1_000_000));
                }
            }
            assert_eq!(w.len(), pending.len());
        }
    }

    #[test]
    fn never_fires_before_its_time() {
        let mut w = Wheel::new();
        w.insert(1_000, 'a');
        w.insert(64 * 64 + 5, 'b');
        let mut got = Vec::new();
        for t in [999, 1_000, 4_100, 4_101] {
            w.advance(t, |at, c| got.push((t, at, c)));
        }
        assert_eq!(got, vec![(1_000, 1_000, 'a'), (4_101, 4_101, 'b')]);
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn a_timer_inserted_in_the_past_fires_at_the_next_advance() {
        let mut w = Wheel::new();
        w.advance(500, |_, _: u8| unreachable!());
        w.insert(10, 1u8);
        let mut n = 0;
        w.advance(500, |_, _| n += 1);
        assert_eq!(n, 1);
    }
}

#[cfg(test)]
mod timing {
    #[test]
    #[ignore = "timing probe"]
    fn sparse() {
        for n in [1_000u64, 100_000] {
            let t = std::time::Instant::now();
            let mut w = super::Wheel::new();
            for i in 0..n {
                w.insert((i * 2_592_000_000) / n, i);
            }
            let ins = t.elapsed();
            let mut now = 0;
            let mut steps = 0;
            while !w.is_empty() {
                now += 3_600_000;
                steps += 1;
                w.advance(now, |_, _| {});
            }
            eprintln!("n={n} insert {ins:?} total {:?} steps {steps}", t.elapsed());
        }
    }
}
