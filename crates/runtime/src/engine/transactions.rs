//! Transactions from the engine's side: beginning one ([`TxOptions`]), a handle on an
//! unfinished one by id, and the leases that end abandoned ones.

use std::sync::Arc;
use std::time::Duration;

use tidegate_core::TxId;
use tidegate_core::engine::BeginRequest;

use super::Tidegate;
use crate::tx::Transaction;
use crate::{Error, Result};

/// Options of [`Tidegate::begin_with`].
#[derive(Debug, Clone, Default)]
pub struct TxOptions {
    /// The agent's name (for records and traces). Default: `"agent"`.
    pub agent: Option<String>,
    /// Scopes the transaction may touch. Declaring them lets transactions on other scopes
    /// commit without waiting for this one; touching anything else aborts it.
    pub may_touch: Option<Vec<String>>,
    /// Lease override.
    pub lease: Option<Duration>,
}

impl TxOptions {
    /// Options for `agent`.
    pub fn agent(agent: impl Into<String>) -> TxOptions {
        TxOptions { agent: Some(agent.into()), ..TxOptions::default() }
    }

    /// Declares the may-touch set.
    pub fn may_touch<I, S>(mut self, scopes: I) -> TxOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.may_touch = Some(scopes.into_iter().map(Into::into).collect());
        self
    }

    /// Overrides the lease.
    pub fn lease(mut self, lease: Duration) -> TxOptions {
        self.lease = Some(lease);
        self
    }
}

impl Tidegate {
    /// Begins a transaction for `agent` with no may-touch declaration.
    pub fn begin(&self, agent: &str) -> Result<Transaction> {
        self.begin_with(TxOptions::agent(agent))
    }

    /// Begins a transaction.
    pub fn begin_with(&self, opts: TxOptions) -> Result<Transaction> {
        let may_touch = match opts.may_touch {
            None => None,
            Some(list) => {
                let mut scopes = Vec::with_capacity(list.len());
                for (i, s) in list.iter().enumerate() {
                    scopes.push(self.parse_scope(s, &format!("may_touch[{i}]"))?);
                }
                Some(scopes)
            }
        };
        if opts.lease.is_some_and(|l| l.is_zero()) {
            return Err(Error::InvalidArgument {
                field: "lease",
                value: "0s".into(),
                expected: "a positive duration (the transaction would expire at once)",
            });
        }
        let agent: Arc<str> = opts.agent.as_deref().unwrap_or("agent").into();
        let now = self.inner.clock.now();
        let req = BeginRequest { agent, may_touch, lease: opts.lease };
        let (begun, _) = self.with_core(|c| c.begin(req, now))?;
        Ok(Transaction::new(self.clone(), begun.tx, begun.epoch))
    }

    /// A handle on the unfinished transaction `id` of this engine, e.g. one that
    /// `recover_keeping_open` kept open across a restart, so that its agent (or a server
    /// acting for it) can go on with it. A transaction that has finished is an error saying
    /// how it ended ([`Error::Finished`]); an id never issued is `EngineError::UnknownTx`.
    ///
    /// How a transaction ended is kept in memory for the last few thousand decisions of this
    /// process; for an older one, or one a previous process finished, it is read from the
    /// ledger (a scan, stopping at its settlement), so memory stays bounded.
    pub fn transaction(&self, id: TxId) -> Result<Transaction> {
        self.refuse_if_fenced()?;
        let g = self.inner.shared.lock();
        let err = match g.core.epoch(id) {
            Ok(epoch) => {
                drop(g);
                return Ok(Transaction::new(self.clone(), id, epoch));
            }
            Err(e) => g.endings.explain(e),
        };
        drop(g);
        match err {
            Error::Engine(tidegate_core::EngineError::Settled { tx }) => Err(self.ending_in_ledger(tx).unwrap_or(err)),
            other => Err(other),
        }
    }

    /// Aborts every transaction whose lease has ended and runs their compensations.
    /// Returns how many expired. Waiting committers call this on their own; call it (or
    /// [`Tidegate::spawn_reaper`]) when nothing else may notice.
    pub async fn reap(&self) -> Result<usize> {
        let now = self.inner.clock.now();
        let (n, _) = self.with_core(|c| Ok(c.expire_leases(now)))?;
        Ok(n)
    }

    /// Starts a background task that reaps expired leases as their deadlines pass.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        self.inner.handle.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let tg = Tidegate { inner };
                let now = tg.inner.clock.now();
                let next = tg.inner.shared.lock().core.next_lease_deadline();
                let wake = next.unwrap_or(now.after(Duration::from_millis(250))).min(now.after(Duration::from_secs(1)));
                let clock = tg.inner.clock.clone();
                drop(tg);
                clock.sleep_until(wake).await;
                let Some(inner) = weak.upgrade() else { return };
                let tg = Tidegate { inner };
                let _ = tg.reap().await;
            }
        })
    }
}
