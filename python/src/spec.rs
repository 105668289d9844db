//! `Spec`: a speculation group, for the sync and asyncio APIs.

use std::sync::Arc;

use pyo3::prelude::*;
use tidegate_runtime::{Error, Speculation, SpeculationOutcome, Transaction};

use crate::calls::CallCtx;
use crate::errors::{invalid, to_pyerr};
use crate::rt::{aio_ctx, block, spawn};
use crate::tx::{Tx, settled};
use crate::view::outcome_to_py;

/// A speculation group and its branches (`Tx` objects made once).
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Spec {
    spec: Speculation,
    branches: Vec<Py<Tx>>,
}

impl Spec {
    pub(crate) fn new(py: Python<'_>, spec: Speculation) -> PyResult<Spec> {
        let branches = spec.branches().iter().map(|t| Py::new(py, Tx::new(t.clone()))).collect::<PyResult<Vec<_>>>()?;
        Ok(Spec { spec, branches })
    }

    fn winner_id(&self, py: Python<'_>, winner: usize) -> PyResult<tidegate_runtime::TxId> {
        self.spec.branches().get(winner).map(Transaction::id).ok_or_else(|| {
            invalid(py, "winner", &winner.to_string(), &format!("a branch index below {}", self.spec.branches().len()))
        })
    }

    fn finish_commit(
        &self,
        py: Python<'_>,
        r: Result<SpeculationOutcome, Error>,
        ctx: &CallCtx,
    ) -> PyResult<Py<PyAny>> {
        match r {
            Ok(o) => {
                let losers = o.losers.iter().map(|l| outcome_to_py(py, l)).collect::<PyResult<Vec<_>>>()?;
                Ok((settled(py, &o.winner, ctx)?, losers).into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }

    fn finish_abort(
        &self,
        py: Python<'_>,
        r: Result<Vec<tidegate_runtime::Outcome>, Error>,
        ctx: &CallCtx,
    ) -> PyResult<Py<PyAny>> {
        match r {
            Ok(outs) => {
                let list = outs.iter().map(|o| outcome_to_py(py, o)).collect::<PyResult<Vec<_>>>()?;
                Ok(list.into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }
}

#[pymethods]
impl Spec {
    /// The branches, one transaction each.
    fn branches(&self, py: Python<'_>) -> Vec<Py<Tx>> {
        self.branches.iter().map(|b| b.clone_ref(py)).collect()
    }

    /// Chooses branch `winner` (an index), aborts the others, commits the winner.
    /// Returns `(winner Settled, [loser outcomes])`.
    fn commit(&self, py: Python<'_>, winner: usize) -> PyResult<Py<PyAny>> {
        let w = self.winner_id(py, winner)?;
        let ctx = Arc::new(CallCtx::default());
        let spec = self.spec.clone();
        let r = block(py, ctx.clone(), async move { spec.commit_winner(w).await })?;
        self.finish_commit(py, r, &ctx)
    }

    /// The asyncio form of `commit`.
    fn commit_async(
        slf: Bound<'_, Self>,
        winner: usize,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let w = slf.get().winner_id(py, winner)?;
        let spec = slf.get().spec.clone();
        let me = slf.unbind();
        spawn(
            py,
            Arc::new(aio_ctx(event_loop, context)),
            async move { spec.commit_winner(w).await },
            move |py, r, ctx| me.get().finish_commit(py, r, ctx),
            future,
        )
    }

    /// Aborts every branch. Returns their outcomes.
    fn abort(&self, py: Python<'_>, reason: String) -> PyResult<Py<PyAny>> {
        let ctx = Arc::new(CallCtx::default());
        let spec = self.spec.clone();
        let r = block(py, ctx.clone(), async move { spec.abort(reason).await })?;
        self.finish_abort(py, r, &ctx)
    }

    /// The asyncio form of `abort`.
    fn abort_async(
        slf: Bound<'_, Self>,
        reason: String,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let spec = slf.get().spec.clone();
        let me = slf.unbind();
        spawn(
            py,
            Arc::new(aio_ctx(event_loop, context)),
            async move { spec.abort(reason).await },
            move |py, r, ctx| me.get().finish_abort(py, r, ctx),
            future,
        )
    }
}
