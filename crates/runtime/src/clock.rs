//! Time, injected: the engine never reads the system clock itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tidegate_core::Timestamp;

/// The one clock trait, from `tidegate-core` (docs/service.md, "Dispatch vocabulary").
pub use tidegate_core::Clock;

/// Tokio's clock, anchored to wall-clock time when created: `now` is the Unix time at
/// creation plus tokio's monotonic elapsed time, so timestamps written to a durable ledger
/// (lease deadlines) stay meaningful after a restart. Under `tokio::time::pause()` (or
/// `#[tokio::test(start_paused = true)]`) the elapsed part is virtual time that jumps forward
/// whenever every task is idle, so tests run leases, backoffs and think times in no wall time.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    base: u64,
}

impl Default for TokioClock {
    fn default() -> Self {
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        TokioClock { origin: tokio::time::Instant::now(), base }
    }
}

impl TokioClock {
    /// A clock whose zero is now.
    pub fn new() -> TokioClock {
        TokioClock::default()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.base.saturating_add(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)))
    }

    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<'static, ()> {
        let at = self.origin + Duration::from_nanos(deadline.0.saturating_sub(self.base));
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that moves only when told to ([`ManualClock::advance`]). Runtime-agnostic.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualInner>>,
}

#[derive(Debug, Default)]
struct ManualInner {
    now: u64,
    sleepers: Vec<(u64, Waker)>,
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves time forward and wakes every sleep that is now due.
    pub fn advance(&self, d: Duration) {
        let due: Vec<Waker> = {
            let mut g = self.inner.lock();
            g.now = g.now.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let now = g.now;
            let (due, keep): (Vec<_>, Vec<_>) = g.sleepers.drain(..).partition(|(t, _)| *t <= now);
            g.sleepers = keep;
            due.into_iter().map(|(_, w)| w).collect()
        };
        for w in due {
            w.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.inner.lock().now)
    }

    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<'static, ()> {
        Box::pin(ManualSleep { clock: self.inner.clone(), deadline: deadline.0 })
    }
}

struct ManualSleep {
    clock: Arc<Mutex<ManualInner>>,
    deadline: u64,
}

impl Future for ManualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut g = self.clock.lock();
        if g.now >= self.deadline {
            Poll::Ready(())
        } else {
            g.sleepers.push((self.deadline, cx.waker().clone()));
            Poll::Pending
        }
    }
}
