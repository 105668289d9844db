//! The attention queue's operator actions as typed operations (docs/console.md): resolve or
//! accept an effect that settled unresolved, leaked or partial-commit, or retry it through its
//! tool's capability with the same key. Every action is an extension record on the ledger
//! stream `operator` ([`crate::console::OPERATOR_STREAM`]), which the ledger index folds into
//! the entry's resolution.
//!
//! ```text
//!  resolve_attention(tx, n, action, note, by) ─► append "resolve_effect" ─► the entry, resolved
//!  retry_attention(tx, n, note, by) ─ touched(open) ─ dispatch on a task ─ touched(close)
//!                                   ─► append "retry_effect" (operation, outcome, by) ─► RetryReport
//! ```

use std::sync::Arc;

use tidegate_core::{EffectId, TxId};

use crate::console::{OPERATOR_STREAM, OperatorAction, Resolution, now_ms};
use crate::dispatch::{CallOutcome, DispatchKey, DispatchRequest, Operation};
use crate::error::{Result, ServiceError};
use crate::index::AttentionEntry;
use crate::tenant::Tenant;

/// Longest operator note.
pub const MAX_NOTE_BYTES: usize = 2000;

/// What a retry of an attention entry did.
#[derive(Debug, Clone)]
pub struct RetryReport {
    /// What was sent: the forward call or release, or the compensation.
    pub operation: Operation,
    /// `done`, `failed` or `unknown`.
    pub outcome: &'static str,
    /// The receiver's message when it was not done.
    pub detail: Option<String>,
    /// The entry as it was before the retry (its resolution is read when it is shown).
    pub entry: AttentionEntry,
}

impl Tenant {
    /// The transaction (of this tenant, known to its index) and effect position a request
    /// names.
    fn attention_target(&self, id: &str, effect: &str) -> Result<(TxId, u32)> {
        let tx = self.parse_tx(id)?;
        if self.index.phase(tx).is_none() {
            return Err(ServiceError::NotFound { what: "transaction", name: id.to_owned() });
        }
        let n = effect
            .parse()
            .map_err(|_| ServiceError::invalid("effect", effect, "an effect's issuance position (0, 1, ...)"))?;
        Ok((tx, n))
    }

    fn attention_entry_of(&self, id: &str, tx: TxId, n: u32) -> Result<AttentionEntry> {
        self.index.attention_entry(tx, EffectId(n)).ok_or_else(|| {
            ServiceError::conflict(
                "not_in_attention",
                format!("effect {n} of {id} did not settle unresolved, leaked or partial-commit"),
            )
        })
    }

    /// Resolves (or accepts) effect `effect` of transaction `id` in the attention list, with
    /// `note` saying what was done and `by` who: recorded in the ledger; a later resolution of
    /// the same effect replaces the earlier one. Returns the entry with its resolution.
    pub async fn resolve_attention(
        &self,
        id: &str,
        effect: &str,
        action: OperatorAction,
        note: &str,
        by: String,
    ) -> Result<AttentionEntry> {
        let (tx, n) = self.attention_target(id, effect)?;
        if action == OperatorAction::Retried {
            return Err(ServiceError::invalid(
                "action",
                "retried",
                "resolved or accepted (a retry is POST /v1/ledger/attention/{tx}/{effect}/retry)",
            ));
        }
        let trimmed = note.trim();
        if trimmed.is_empty() || trimmed.len() > MAX_NOTE_BYTES {
            return Err(ServiceError::invalid(
                "note",
                note,
                format!("1 to {MAX_NOTE_BYTES} bytes saying what was done"),
            ));
        }
        self.attention_entry_of(id, tx, n)?;
        let r = Resolution {
            kind: "resolve_effect".into(),
            tx: tx.0,
            effect: n,
            action,
            note: trimmed.to_owned(),
            by,
            at_ms: now_ms(),
            operation: None,
            outcome: None,
            lsn: 0,
        };
        self.engine.append_extension(OPERATOR_STREAM, r.body()).await?;
        self.index
            .attention_entry(tx, EffectId(n))
            .ok_or_else(|| ServiceError::Internal("the attention entry vanished".into()))
    }

    /// Retries effect `effect` of transaction `id` through its tool's capability with the same
    /// idempotency key: for a committed transaction the forward operation (the release of a
    /// held effect, the call of an eager one), for an aborted one the compensation
    /// (`no_compensation` when the tool has none). The retry is recorded in the ledger with its
    /// outcome and `by`; one confirmed done resolves the entry.
    pub async fn retry_attention(&self, id: &str, effect: &str, note: Option<&str>, by: String) -> Result<RetryReport> {
        let (tx, n) = self.attention_target(id, effect)?;
        let note = note.map(str::trim).unwrap_or_default().to_owned();
        if note.len() > MAX_NOTE_BYTES {
            return Err(ServiceError::invalid("note", note, format!("at most {MAX_NOTE_BYTES} bytes")));
        }
        let entry = self.attention_entry_of(id, tx, n)?;
        let e = &entry.effect;
        let Some(tool) = self.tool(&e.tool) else {
            return Err(ServiceError::conflict(
                "no_tool",
                format!("tool `{}` is no longer registered; nothing to retry with", e.tool),
            ));
        };
        // The index holds the client's arguments and the effect's public key.
        let (args, key) = ((*e.args).clone(), e.key.to_string());
        let (operation, capability, send_key, output) = if entry.committed {
            let op = if e.class.executes_eagerly() { Operation::Call } else { Operation::Release };
            (op, tool.def.call.clone(), DispatchKey::effect(key), None)
        } else {
            let Some(cap) = tool.def.compensate.clone() else {
                return Err(ServiceError::conflict(
                    "no_compensation",
                    format!("{id} aborted and tool `{}` has no compensate capability: resolve or accept it", e.tool),
                ));
            };
            (Operation::Compensate, cap, DispatchKey::compensation(key), Some(e.output.clone().unwrap_or_default()))
        };
        let req = DispatchRequest {
            capability,
            operation,
            tool: e.tool.to_string(),
            key: send_key,
            args: Arc::new(args),
            output,
        };
        // The retry writes the effect's scopes after its transaction settled: their versions
        // advance before it is sent and again with its outcome, and reads and eager writes there
        // are refused meanwhile, so no read made before it (or while it runs) commits after it
        // (docs/engine.md, "A compensation advances the version"). The dispatch and the closing
        // touch run in a task of their own: a caller that goes away cannot leave the scopes
        // marked.
        let scopes: Vec<String> = e.scopes.iter().map(|s| s.to_string()).collect();
        let refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        if !scopes.is_empty() {
            self.engine.touched(tx, EffectId(n), &refs, false).await?;
        }
        let (engine, dispatcher) = (self.engine.clone(), self.dispatcher.clone());
        let effect_id = EffectId(n);
        let run = tokio::spawn(async move {
            let outcome = dispatcher.dispatch(req).await;
            let refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let closed = if refs.is_empty() { Ok(0) } else { engine.touched(tx, effect_id, &refs, true).await };
            (outcome, closed)
        });
        let (outcome, closed) = run.await.map_err(|_| ServiceError::Internal("the retry's task failed".into()))?;
        closed?;
        let (outcome, detail) = match outcome {
            CallOutcome::Done { .. } => ("done", None),
            CallOutcome::NotApplied { message, .. } => ("failed", Some(message)),
            CallOutcome::Unknown { message } => ("unknown", Some(message)),
        };
        let text = match (&detail, note.is_empty()) {
            (None, true) => format!("retried {}: done", operation.as_str()),
            (None, false) => format!("retried {}: done; {note}", operation.as_str()),
            (Some(d), true) => format!("retried {}: {outcome}: {d}", operation.as_str()),
            (Some(d), false) => format!("retried {}: {outcome}: {d}; {note}", operation.as_str()),
        };
        let r = Resolution {
            kind: "retry_effect".into(),
            tx: tx.0,
            effect: n,
            action: OperatorAction::Retried,
            note: text,
            by,
            at_ms: now_ms(),
            operation: Some(operation.as_str().to_owned()),
            outcome: Some(outcome.to_owned()),
            lsn: 0,
        };
        self.engine.append_extension(OPERATOR_STREAM, r.body()).await?;
        Ok(RetryReport { operation, outcome, detail, entry })
    }
}
