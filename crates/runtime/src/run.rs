//! The automatic retry helper: re-runs a caller's transaction body at a fresh epoch when it
//! aborts for a reason worth retrying (a stale read, an expired lease, a wait timeout).

use std::future::Future;

use tidegate_core::{Outcome, TxState};

use crate::engine::{Tidegate, TxOptions};
use crate::tx::Transaction;
use crate::{Error, Result};

/// How many times [`Tidegate::run`] tries in all. Default: 5.
pub const DEFAULT_ATTEMPTS: u32 = 5;

impl Tidegate {
    /// Runs `body` in a transaction, seals and commits it; on a retryable abort, runs it
    /// again in a new transaction at a fresh epoch, up to [`DEFAULT_ATTEMPTS`] times in all.
    /// If `body` returns an error the transaction is aborted and the error returned (retried
    /// only if it is itself retryable).
    pub async fn run<T, F, Fut>(&self, opts: TxOptions, body: F) -> Result<(T, Outcome)>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.run_with_attempts(opts, DEFAULT_ATTEMPTS, body).await
    }

    /// [`Tidegate::run`] with an explicit attempt bound (≥ 1).
    pub async fn run_with_attempts<T, F, Fut>(
        &self,
        opts: TxOptions,
        attempts: u32,
        mut body: F,
    ) -> Result<(T, Outcome)>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        if attempts == 0 {
            return Err(Error::InvalidArgument {
                field: "attempts",
                value: "0".into(),
                expected: "at least one attempt",
            });
        }
        let mut attempt = 1;
        loop {
            let tx = self.begin_with(opts.clone())?;
            let result = match body(tx.clone()).await {
                Ok(value) => tx.seal_and_commit().await.map(|outcome| (value, outcome)),
                Err(e) => {
                    if matches!(tx.state(), Ok(TxState::Open | TxState::Sealed)) {
                        let _ = tx.abort(format!("transaction body failed: {e}")).await;
                    }
                    Err(e)
                }
            };
            match result {
                Err(e) if e.retryable() && attempt < attempts => {
                    let at = self.inner.clock.now().after(self.inner.retry.backoff(attempt));
                    self.inner.clock.sleep_until(at).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}
