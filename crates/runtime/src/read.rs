//! Reading a value together with the version it is checked against.

use std::future::Future;

use tidegate_core::engine::ReadResult;

use crate::Result;
use crate::tx::Transaction;

/// What [`Transaction::read_with`] returns: the value the agent observed and the read the
/// engine recorded for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Read<T> {
    /// The value `fetch` returned.
    pub value: T,
    /// The version recorded before `fetch` ran (and this transaction's staged write on the
    /// scope, if any: read-your-writes).
    pub read: ReadResult,
}

impl Transaction {
    /// Reads `scope` from the world with `fetch` and records the read, in the only safe
    /// order: the engine records the scope's committed version *first*, then `fetch`
    /// observes the world. A write that commits between the two advances the version past
    /// the recorded one, so this transaction aborts `stale_read` at commit instead of
    /// acting on a value it cannot vouch for. (Recording after observing would record the
    /// newer version for an older value and let the stale plan commit.)
    ///
    /// `fetch` is not called if the read is refused (a scope outside the declared may-touch
    /// set, a sealed or finished transaction).
    ///
    /// ```
    /// # use tidegate_runtime::Tidegate;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tidegate_runtime::Error> {
    /// let tg = Tidegate::in_memory()?;
    /// let tx = tg.begin("agent")?;
    /// let stock = tx.read_with("retail:stock:sku-9", || async { 12 }).await?;
    /// assert_eq!(stock.value, 12);
    /// assert_eq!(stock.read.version.0, 0, "never written through the engine");
    /// # Ok(()) }
    /// ```
    pub async fn read_with<T, F, Fut>(&self, scope: &str, fetch: F) -> Result<Read<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let read = self.read(scope)?;
        let value = fetch().await;
        Ok(Read { value, read })
    }
}
