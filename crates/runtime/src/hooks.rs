//! Pre-commit hooks: validators, policy checks and human review gates that see the sealed
//! footprint and may veto. A hook may take as long as it needs (a review can take days); the
//! transaction waits, and keeps blocking later transactions on its scopes meanwhile.

use std::fmt;
use std::future::Future;

use futures::future::BoxFuture;
use tidegate_core::engine::SealedView;

/// A hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the commit proceed.
    Approve,
    /// Abort the transaction with this reason.
    Veto(String),
}

/// A pre-commit hook. `check` MUST NOT call back into the same transaction.
pub trait PreCommitHook: Send + Sync {
    /// A name for records and abort reasons.
    fn name(&self) -> &str;
    /// Decides on a sealed footprint.
    fn check<'a>(&'a self, view: &'a SealedView) -> BoxFuture<'a, Verdict>;
}

/// A hook from a name and a closure returning a future.
pub struct FnHook<F> {
    name: String,
    f: F,
}

impl<F> fmt::Debug for FnHook<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnHook").field("name", &self.name).finish()
    }
}

impl<F, Fut> FnHook<F>
where
    F: Fn(SealedView) -> Fut + Send + Sync,
    Fut: Future<Output = Verdict> + Send + 'static,
{
    /// Wraps `f` (which receives a copy of the view) as a hook called `name`.
    pub fn new(name: impl Into<String>, f: F) -> FnHook<F> {
        FnHook { name: name.into(), f }
    }
}

impl<F, Fut> PreCommitHook for FnHook<F>
where
    F: Fn(SealedView) -> Fut + Send + Sync,
    Fut: Future<Output = Verdict> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, view: &'a SealedView) -> BoxFuture<'a, Verdict> {
        Box::pin((self.f)(view.clone()))
    }
}
