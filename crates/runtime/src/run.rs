//! The automatic retry helper: re-runs a caller's transaction body at a fresh epoch when it
//! aborts for a reason worth retrying (a stale read, an expired lease, a wait timeout).

use std::any::Any;
use std::fmt;
use std::future::Future;

use tidegate_core::{AbortReason, Outcome, TxId, TxState};

use crate::Error;
use crate::engine::{Tidegate, TxOptions};
use crate::tx::Transaction;

/// How many times [`Tidegate::run`] tries in all. Default: 5.
pub const DEFAULT_ATTEMPTS: u32 = 5;

/// One attempt of [`Tidegate::run_reporting`] that did not commit and was retried.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Its transaction.
    pub tx: TxId,
    /// Why it was retried (the error's text).
    pub error: String,
    /// Why its transaction aborted, when it did.
    pub reason: Option<AbortReason>,
    /// Its settlement (every effect's tag), when this attempt saw it; an abort decided in
    /// the background (an expired lease) settles there and is reported by `reason` only.
    pub outcome: Option<Outcome>,
}

/// What [`Tidegate::run_reporting`] returns: the result of the last attempt and every
/// attempt before it.
#[derive(Debug)]
pub struct RunReport<T, E> {
    /// The last attempt's result: the body's value and the commit's outcome, or the error.
    pub result: Result<(T, Outcome), E>,
    /// The attempts that were retried, oldest first (empty if the first attempt decided).
    pub retried: Vec<Attempt>,
}

impl Tidegate {
    /// Runs `body` in a transaction, seals and commits it; on a retryable abort, runs it
    /// again in a new transaction at a fresh epoch, up to [`DEFAULT_ATTEMPTS`] times in all,
    /// with the engine's retry backoff between attempts.
    ///
    /// A body error is retried when it is retryable itself, or when the attempt's
    /// transaction ended for a retryable reason (its lease expired while the body was slow,
    /// so that its next call failed with [`Error::Finished`]); otherwise the transaction is
    /// aborted and the error returned. For a body with its own error type, and to see the
    /// attempts that were retried, use [`Tidegate::run_reporting`].
    pub async fn run<T, F, Fut>(&self, opts: TxOptions, body: F) -> Result<(T, Outcome), Error>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.run_reporting(opts, DEFAULT_ATTEMPTS, body).await.result
    }

    /// [`Tidegate::run`] with an explicit attempt bound (≥ 1).
    pub async fn run_with_attempts<T, F, Fut>(
        &self,
        opts: TxOptions,
        attempts: u32,
        body: F,
    ) -> Result<(T, Outcome), Error>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.run_reporting(opts, attempts, body).await.result
    }

    /// [`Tidegate::run_with_attempts`] for a body with its own error type `E` (anything a
    /// [`crate::Error`] converts into), also returning every retried attempt (its error,
    /// abort reason and, when known, its outcome), so that what the aborted attempts did is
    /// not lost from view. A body error of type `E` is retried when the attempt's
    /// transaction ended for a retryable reason, or when `E` is [`crate::Error`] and
    /// retryable.
    ///
    /// ```
    /// # use tidegate_runtime::{Tidegate, TxOptions};
    /// #[derive(Debug)]
    /// enum AppError { Engine(tidegate_runtime::Error), Rejected(String) }
    /// impl From<tidegate_runtime::Error> for AppError {
    ///     fn from(e: tidegate_runtime::Error) -> Self { AppError::Engine(e) }
    /// }
    /// impl std::fmt::Display for AppError {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tg = Tidegate::in_memory().unwrap();
    /// let report = tg
    ///     .run_reporting(TxOptions::agent("a"), 3, |tx| async move {
    ///         tx.read("retail:order:W1")?;
    ///         Err::<(), _>(AppError::Rejected("out of stock".into()))
    ///     })
    ///     .await;
    /// assert!(matches!(report.result, Err(AppError::Rejected(_))) && report.retried.is_empty());
    /// # }
    /// ```
    pub async fn run_reporting<T, E, F, Fut>(&self, opts: TxOptions, attempts: u32, mut body: F) -> RunReport<T, E>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error> + fmt::Display + 'static,
    {
        let mut retried = Vec::new();
        if attempts == 0 {
            let e = Error::InvalidArgument { field: "attempts", value: "0".into(), expected: "at least one attempt" };
            return RunReport { result: Err(e.into()), retried };
        }
        let mut attempt = 1;
        loop {
            let tx = match self.begin_with(opts.clone()) {
                Ok(tx) => tx,
                Err(e) => return RunReport { result: Err(e.into()), retried },
            };
            // The attempt's error, whether it is worth another attempt, and its settlement.
            let (e, retryable, outcome) = match body(tx.clone()).await {
                Ok(value) => match tx.seal_and_commit().await {
                    Ok(outcome) => return RunReport { result: Ok((value, outcome)), retried },
                    Err(e) => {
                        let (retryable, outcome) = (e.retryable(), e.outcome().cloned());
                        (E::from(e), retryable, outcome)
                    }
                },
                Err(e) => {
                    let mut outcome = None;
                    if matches!(tx.state(), Ok(TxState::Open | TxState::Sealed)) {
                        outcome = tx.abort(format!("transaction body failed: {e}")).await.ok();
                    }
                    // A body error caused by its transaction ending for a retryable reason (an
                    // expired lease under a slow body) is retried even when the body wrapped
                    // it in its own error type.
                    let own = (&e as &dyn Any).downcast_ref::<Error>().is_some_and(Error::retryable);
                    let ended = outcome.is_none() && self.abort_reason(tx.id()).is_some_and(|r| r.retryable());
                    (e, own || ended, outcome)
                }
            };
            if !retryable || attempt >= attempts {
                return RunReport { result: Err(e), retried };
            }
            let reason = outcome.as_ref().and_then(|o| o.reason.clone()).or_else(|| self.abort_reason(tx.id()));
            retried.push(Attempt { tx: tx.id(), error: e.to_string(), reason, outcome });
            let at = self.inner.clock.now().after(self.inner.retry.backoff(attempt));
            self.inner.clock.sleep_until(at).await;
            attempt += 1;
        }
    }

    /// Why `tx` aborted, if it was decided recently and aborted.
    fn abort_reason(&self, tx: TxId) -> Option<AbortReason> {
        self.inner.shared.lock().endings.abort_reason(tx)
    }
}
