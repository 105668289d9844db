//! Webhook dispatch: POST the operation with its key, bounded retry with backoff, and the
//! classification of docs/server.md invariant 6.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::attempts::{Attempt, AttemptLog, now_ms};
use super::{CallOutcome, DispatchRequest, Operation};
use crate::metrics::{Metrics, ResultLabel};
use crate::registry::WebhookSpec;
use crate::settings::DispatchSection;

/// The largest response body read (beyond: the output is truncated text).
const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Longest backoff between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What every attempt POSTs, borrowed from the request (no copy of the arguments or the
/// output). The fields are in the order receivers have always seen them: by name.
#[derive(serde::Serialize)]
struct Body<'a> {
    args: &'a Value,
    capability: &'a str,
    key: &'a str,
    operation: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a Value>,
    tool: &'a str,
}

enum Try {
    Done(Value, Option<String>),
    /// Certainly not processed; may retry.
    NotSent(String),
    /// Refused for good (4xx).
    Refused(String),
    /// May have been processed; may retry under the same key.
    Maybe(String),
}

/// Where a webhook goes: its spec and its URL, parsed when the capability was registered.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) spec: &'a WebhookSpec,
    pub(super) url: Option<&'a reqwest::Url>,
}

pub(super) async fn send(
    http: &reqwest::Client,
    target: Target<'_>,
    defaults: &DispatchSection,
    req: &DispatchRequest,
    log: &AttemptLog,
    metrics: &Metrics,
) -> CallOutcome {
    let spec = target.spec;
    let attempts = spec.attempts.unwrap_or(defaults.webhook_attempts).max(1);
    let timeout = Duration::from_millis(spec.timeout_ms.unwrap_or(defaults.webhook_timeout_ms).max(1));
    let backoff = Duration::from_millis(spec.backoff_ms.unwrap_or(defaults.webhook_backoff_ms));
    // The key, rendered once: every attempt's header and body and its record carry this text.
    let key = req.key.to_string();
    let body = Body {
        args: &req.args,
        capability: &req.capability,
        key: &key,
        operation: req.operation.as_str(),
        output: req.output.as_deref(),
        tool: &req.tool,
    };
    let mut maybe_happened = false;
    let mut last = String::new();
    for n in 1..=attempts {
        if n > 1 {
            let factor = 1u32.checked_shl(n - 2).unwrap_or(u32::MAX);
            tokio::time::sleep(backoff.saturating_mul(factor).min(MAX_BACKOFF)).await;
        }
        let started = Instant::now();
        let started_ms = now_ms();
        let result = attempt(http, target, timeout, req.operation, &key, n, &body).await;
        metrics.webhook_duration.observe(started.elapsed().as_secs_f64());
        let (label, detail) = match &result {
            Try::Done(..) => ("done", "2xx".to_owned()),
            Try::NotSent(d) => ("retry", d.clone()),
            Try::Refused(d) => ("failed", d.clone()),
            Try::Maybe(d) => ("retry", d.clone()),
        };
        metrics
            .webhook_requests
            .get_or_create(&ResultLabel { result: if label == "retry" { "error".into() } else { label.into() } })
            .inc();
        let final_label = match (&result, n == attempts) {
            (Try::NotSent(_) | Try::Maybe(_), true) if maybe_happened || matches!(result, Try::Maybe(_)) => "unknown",
            (Try::NotSent(_), true) => "failed",
            _ => label,
        };
        log.record(
            req.key.forward(),
            Attempt {
                operation: req.operation,
                capability: req.capability.clone(),
                kind: "webhook".into(),
                attempt: n,
                key: key.clone(),
                started_at_ms: started_ms,
                finished_at_ms: Some(now_ms()),
                result: final_label.into(),
                detail: detail.clone(),
            },
        );
        match result {
            Try::Done(output, residue) => return CallOutcome::done_with_residue(output, residue),
            Try::Refused(d) => {
                // A 4xx after an earlier attempt that may have landed: the receiver refused
                // this one, but the earlier one may still have taken effect.
                return if maybe_happened {
                    CallOutcome::unknown(format!("{d} (after an earlier attempt whose outcome is unknown)"))
                } else {
                    CallOutcome::not_applied(d, false)
                };
            }
            Try::NotSent(d) => last = d,
            Try::Maybe(d) => {
                maybe_happened = true;
                last = d;
            }
        }
    }
    let msg = format!("{last} (after {attempts} attempts to {})", spec.url);
    if maybe_happened { CallOutcome::unknown(msg) } else { CallOutcome::not_applied(msg, false) }
}

async fn attempt(
    http: &reqwest::Client,
    target: Target<'_>,
    timeout: Duration,
    operation: Operation,
    key: &str,
    n: u32,
    body: &Body<'_>,
) -> Try {
    let builder = match target.url {
        Some(url) => http.post(url.clone()),
        None => http.post(&target.spec.url),
    };
    let sent = builder
        .timeout(timeout)
        .header("Idempotency-Key", key)
        .header("Tidegate-Operation", operation.as_str())
        .header("Tidegate-Attempt", n.to_string())
        .json(body)
        .send()
        .await;
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Try::NotSent(format!("connection failed: {e}")),
        Err(e) if e.is_timeout() => return Try::Maybe(format!("timed out after {} ms", timeout.as_millis())),
        Err(e) => return Try::Maybe(format!("request failed: {e}")),
    };
    let status = resp.status();
    let mut bytes = Vec::new();
    let mut truncated = false;
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    truncated = true;
                    break;
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) if status.is_success() => {
                return Try::Maybe(format!("HTTP {status} but reading the body failed: {e}"));
            }
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let snippet: String = text.chars().take(300).collect();
    if status.is_success() {
        if truncated {
            return Try::Done(Value::String(format!("(response body over {MAX_RESPONSE_BYTES} bytes)")), None);
        }
        let output = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice::<Value>(&bytes).unwrap_or_else(|_| Value::String(text.into_owned()))
        };
        let residue = if operation == Operation::Compensate {
            output.get("residue").and_then(Value::as_str).map(str::to_owned)
        } else {
            None
        };
        return Try::Done(output, residue);
    }
    let code = status.as_u16();
    if code == 408 || code == 429 {
        return Try::NotSent(format!("HTTP {code}: {snippet}"));
    }
    if status.is_client_error() {
        return Try::Refused(format!("HTTP {code}: {snippet}"));
    }
    Try::Maybe(format!("HTTP {code}: {snippet}"))
}
