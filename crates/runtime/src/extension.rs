//! Extension records: another component's opaque records kept in the engine's ledger
//! ([`tidegate_core::Event::Extension`]), for the ledger's durability, order and hash chain.
//! The state machine ignores them (live and on replay); a component reads its stream back by
//! scanning the store. The review manager's decision log is one such stream.

use std::sync::Arc;

use serde_json::Value;
use tidegate_core::{EffectId, Event, TxId};
use tidegate_storage::Lsn;

use crate::engine::Tidegate;
use crate::error::{Error, Result};

/// The longest stream name accepted, in bytes.
pub const MAX_STREAM_BYTES: usize = 200;

/// The largest record body accepted, in bytes of its JSON text (4 MiB). Every start of a
/// component reads its whole stream back, so a record is meant to be a fact, not a payload.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Counts the bytes of a JSON text without keeping them.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        if self.0 > MAX_BODY_BYTES {
            return Err(std::io::Error::other("over the limit"));
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn check_body(body: &Value) -> Result<()> {
    let mut n = Counter(0);
    if serde_json::to_writer(&mut n, body).is_err() {
        return Err(Error::InvalidArgument {
            field: "body",
            value: format!("a JSON body of more than {} bytes", n.0),
            expected: "at most 4 MiB (4,194,304 bytes) of JSON text (extension::MAX_BODY_BYTES)",
        });
    }
    Ok(())
}

fn stream_name(stream: &str) -> Result<Arc<str>> {
    if stream.is_empty() || stream.len() > MAX_STREAM_BYTES || stream.chars().any(char::is_control) {
        return Err(Error::InvalidArgument {
            field: "stream",
            value: format!("{stream:?}"),
            expected: "a non-empty name of at most 200 bytes without control characters",
        });
    }
    Ok(Arc::from(stream))
}

impl Tidegate {
    fn record_extension(&self, stream: &str, body: Value) -> Result<Lsn> {
        let stream = stream_name(stream)?;
        check_body(&body)?;
        let body = Arc::new(body);
        let ((), lsn) = self.with_core(|c| {
            c.record_extension(stream, body);
            Ok(())
        })?;
        Ok(lsn)
    }

    /// Records `bodies` to `stream` and the scopes compensations write
    /// ([`tidegate_core::Event::Touched`]) in one append (all or none), the touches after the
    /// records (the plan executor's `comp_started` and `comp_done` with their touches), and
    /// returns the last LSN without waiting for durability.
    pub(crate) fn record_extensions_touching(
        &self,
        stream: &str,
        bodies: Vec<Value>,
        touches: Vec<tidegate_plans::Touch>,
    ) -> Result<Lsn> {
        let stream = stream_name(stream)?;
        for b in &bodies {
            check_body(b)?;
        }
        let mut parsed = Vec::with_capacity(touches.len());
        for t in touches {
            let scopes = t.scopes.iter().map(|s| self.parse_scope(s, "touch.scopes")).collect::<Result<Vec<_>>>()?;
            parsed.push((TxId(t.tx), EffectId(t.effect), scopes, t.done));
        }
        let ((), lsn) = self.with_core(|c| {
            for b in bodies {
                c.record_extension(stream.clone(), Arc::new(b));
            }
            for (tx, effect, scopes, done) in parsed {
                c.touched(tx, effect, scopes, done)?;
            }
            Ok(())
        })?;
        Ok(lsn)
    }

    /// Records that a compensation of effect `effect` of the settled transaction `undoes`
    /// writes `scopes`, and returns once that is durable: each scope gets a fresh version, so a
    /// read made before the compensation cannot commit after it, and at L2 and above its
    /// unsettled readers are doomed (docs/engine.md, "A compensation advances the version").
    /// A front door that runs such a compensation itself (an operator's retry) calls it with
    /// `done: false` before dispatching and with `done: true` once the dispatch ended (in a
    /// task that outlives its caller, so that a dropped request cannot leave the scopes
    /// marked); in between, reads and eager effects on the scopes are refused
    /// (`lock_conflict`, retryable). The engine's own aborts, late compensations and the plan
    /// executor do so already.
    pub async fn touched(&self, undoes: TxId, effect: EffectId, scopes: &[&str], done: bool) -> Result<Lsn> {
        let scopes = scopes
            .iter()
            .enumerate()
            .map(|(i, s)| self.parse_scope(s, &format!("scopes[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let ((), lsn) = self.with_core(|c| c.touched(undoes, effect, scopes, done))?;
        self.durable(lsn).await?;
        Ok(lsn)
    }

    /// Appends `body` to the extension stream `stream` and returns its LSN once it is durable.
    /// Records of one engine are ordered with each other and with the engine's own events.
    pub async fn append_extension(&self, stream: &str, body: Value) -> Result<Lsn> {
        let lsn = self.record_extension(stream, body)?;
        self.durable(lsn).await?;
        Ok(lsn)
    }

    /// Blocking [`Tidegate::append_extension`] for plain threads (it waits on the store, not on
    /// the engine's runtime, so it may also run on a `spawn_blocking` thread).
    pub fn append_extension_blocking(&self, stream: &str, body: Value) -> Result<Lsn> {
        let lsn = self.record_extension(stream, body)?;
        if lsn != 0 && !self.store().is_durable(lsn) {
            self.store().wait_durable(lsn)?;
        }
        Ok(lsn)
    }

    /// Every record of the extension stream `stream` in the store, in append order, with its
    /// LSN (a scan of the whole ledger: meant for a component's start, not a hot path).
    pub fn extension_records(&self, stream: &str) -> Result<Vec<(Lsn, Arc<Value>)>> {
        let stream = stream_name(stream)?;
        let mut out = Vec::new();
        self.store().scan(1, &mut |lsn, event| {
            if let Event::Extension { stream: s, body } = event
                && **s == *stream
            {
                out.push((lsn, body.clone()));
            }
            true
        })?;
        Ok(out)
    }
}
