//! Python pre-commit hooks.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tidegate_runtime::hooks::{PreCommitHook, Verdict};

use crate::calls::{ArgBuilder, current, describe, invoke};
use crate::interp;
use crate::view::view_to_py;

/// A Python pre-commit hook: `fn(view) -> True | None` approves, `False` or a string (the
/// reason) vetoes; an exception vetoes and becomes the cause of the `Vetoed` error.
pub(crate) struct PyHook {
    pub(crate) name: String,
    pub(crate) f: Arc<Py<PyAny>>,
    pub(crate) is_async: bool,
}

impl PreCommitHook for PyHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, view: &'a tidegate_core::engine::SealedView) -> futures_boxed::BoxFuture<'a, Verdict> {
        let ctx = current();
        let view = view.clone();
        let f = self.f.clone();
        let is_async = self.is_async;
        Box::pin(async move {
            let build: ArgBuilder = Box::new(move |py| {
                let v = view_to_py(py, &view)?;
                Ok((PyTuple::new(py, [v])?.unbind(), None))
            });
            match invoke(f, is_async, build, ctx.clone()).await {
                Ok(v) => interp::attach(|py| {
                    let v = v.bind(py);
                    if v.is_none() {
                        return Verdict::Approve;
                    }
                    if let Ok(reason) = v.extract::<String>() {
                        return Verdict::Veto(reason);
                    }
                    match v.is_truthy() {
                        Ok(true) => Verdict::Approve,
                        _ => Verdict::Veto("rejected".to_owned()),
                    }
                }),
                Err(exc) => {
                    let reason = interp::attach(|py| describe(py, &exc));
                    if let Some(c) = &ctx {
                        *c.error.lock() = Some(exc);
                    }
                    Verdict::Veto(reason)
                }
            }
        })
    }
}

/// `futures::future::BoxFuture` without depending on `futures`.
pub(crate) mod futures_boxed {
    use std::future::Future;
    use std::pin::Pin;

    /// A boxed, sendable future.
    pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
}
