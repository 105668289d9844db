//! Errors as `application/problem+json` (RFC 9457), naming the field, the value and what was
//! expected. The request id is added by the request-id middleware.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use tidegate_runtime::EngineError;
use tidegate_service::ServiceError;
use utoipa::ToSchema;

/// The problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:tidegate:problem:<code>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// The machine-readable kind, e.g. `invalid_field`, `not_found`, `wrong_state`.
    pub code: String,
    /// The request field at fault (JSON path, query parameter or header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value given (truncated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What was expected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Whether sending the same request again later may succeed.
    pub retryable: bool,
    /// The request's id (`X-Request-Id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For `transaction_aborted`: the transaction with its outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub transaction: Option<Value>,
    /// For `tenant_unavailable` on a node that does not serve the tenant: the node that does
    /// (its id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Where that node answers (`server.advertise_url`), when it said: send the request there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_address: Option<String>,
}

/// An API error: what every handler and extractor returns (boxed, so results stay small).
#[derive(Debug, Clone)]
pub struct ApiError(Box<ApiErrorData>);

impl std::ops::Deref for ApiError {
    type Target = ApiErrorData;
    fn deref(&self) -> &ApiErrorData {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut ApiErrorData {
        &mut self.0
    }
}

/// The parts of an [`ApiError`].
#[derive(Debug, Clone)]
pub struct ApiErrorData {
    /// Status.
    pub status: StatusCode,
    /// Machine-readable kind.
    pub code: &'static str,
    /// Human-readable detail.
    pub detail: String,
    /// Field at fault.
    pub field: Option<String>,
    /// Value given.
    pub value: Option<String>,
    /// What was expected.
    pub expected: Option<String>,
    /// Whether a retry may succeed.
    pub retryable: bool,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
    /// The transaction (for `transaction_aborted`).
    pub transaction: Option<Value>,
    /// The node serving the tenant and where it answers (for `tenant_unavailable`).
    pub owner: Option<(String, Option<String>)>,
}

/// Result with [`ApiError`].
pub type ApiResult<T> = Result<T, ApiError>;

fn truncate(s: &str) -> String {
    if s.len() <= 200 {
        return s.to_owned();
    }
    let mut end = 200;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl ApiError {
    /// A bare error.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError(Box::new(ApiErrorData {
            status,
            code,
            detail: detail.into(),
            field: None,
            value: None,
            expected: None,
            retryable: false,
            retry_after: None,
            transaction: None,
            owner: None,
        }))
    }

    /// 400: `field` had `value`, expected `expected`.
    pub fn invalid(field: impl Into<String>, value: impl AsRef<str>, expected: impl Into<String>) -> ApiError {
        let field = field.into();
        let value = truncate(value.as_ref());
        let expected = expected.into();
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            format!("invalid `{field}` = {value}: expected {expected}"),
        );
        e.field = Some(field);
        e.value = Some(value);
        e.expected = Some(expected);
        e
    }

    /// 404 for `what` named `id` (the same body whether it never existed or is another
    /// tenant's).
    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no {what} `{}`", truncate(id)))
    }

    /// 409 with a code.
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, detail)
    }

    /// Marks the error retryable after `secs`.
    pub fn retry_after(mut self, secs: u64) -> ApiError {
        self.retryable = true;
        self.retry_after = Some(secs);
        self
    }

    /// 503 `tenant_unavailable` from a node that does not serve the tenant: `owner` does
    /// (answering at `address`) under a lease that runs `remaining_ms` more; the problem
    /// names both and `Retry-After` is the lease's remaining seconds (docs/deployment.md).
    pub fn served_elsewhere(
        owner: &str,
        address: Option<&str>,
        remaining_ms: u64,
        why: impl std::fmt::Display,
    ) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "tenant_unavailable",
            format!("this node does not serve the tenant: {why}"),
        )
        .retry_after(remaining_ms.div_ceil(1000).max(1));
        e.owner = Some((owner.to_owned(), address.map(str::to_owned)));
        e
    }

    /// Names the field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> ApiError {
        self.field = Some(field.into());
        self
    }

    /// 401.
    pub fn unauthenticated(detail: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", detail);
        e.field = Some("Authorization".into());
        e.expected = Some("`Authorization: Bearer tgk_<id>_<secret>` with a valid, unrevoked key".into());
        e
    }

    /// 503 while shutting down.
    pub fn shutting_down() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the server is shutting down").retry_after(1)
    }

    /// 500: a fault of the server itself.
    pub fn internal(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", detail)
    }

    /// The problem document (without request id).
    pub fn problem(&self) -> Problem {
        Problem {
            type_: format!("urn:tidegate:problem:{}", self.code),
            title: title(self.status).to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_owned(),
            field: self.field.clone(),
            value: self.value.clone(),
            expected: self.expected.clone(),
            retryable: self.retryable,
            request_id: None,
            transaction: self.transaction.clone(),
            owner: self.owner.as_ref().map(|(id, _)| id.clone()),
            owner_address: self.owner.as_ref().and_then(|(_, a)| a.clone()),
        }
    }
}

fn title(s: StatusCode) -> &'static str {
    match s.as_u16() {
        400 => "Invalid request",
        401 => "Not authenticated",
        403 => "Forbidden",
        404 => "Not found",
        405 => "Method not allowed",
        409 => "Conflict",
        413 => "Request body too large",
        415 => "Unsupported media type",
        429 => "Too many requests",
        503 => "Service unavailable",
        _ => s.canonical_reason().unwrap_or("Error"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// Maps a runtime error. Aborts become `409 transaction_aborted` (the caller attaches the
/// transaction); a failed store is `503 store_unavailable`.
pub fn from_runtime(e: tidegate_runtime::Error) -> ApiError {
    from_runtime_ref(&e)
}

/// [`from_runtime`] of a shared error (a [`ServiceError::Engine`]).
pub fn from_runtime_ref(e: &tidegate_runtime::Error) -> ApiError {
    use tidegate_runtime::Error as E;
    match e {
        E::Engine(ee) => from_engine(ee),
        E::Aborted(o) => {
            let reason = o.reason.as_ref().map_or_else(|| "unknown reason".to_owned(), ToString::to_string);
            let retryable = o.reason.as_ref().is_some_and(tidegate_runtime::AbortReason::retryable);
            let mut e = ApiError::conflict("transaction_aborted", format!("the transaction aborted: {reason}"));
            e.retryable = retryable;
            e
        }
        finished @ E::Finished { .. } => {
            let mut e = ApiError::conflict("wrong_state", finished.to_string());
            e.retryable = finished.retryable();
            e
        }
        E::Fenced(f) => tenant_unavailable(&ServiceError::fenced(f).to_string()),
        // Another node holds the tenant's PostgreSQL stream under a live lease: that node
        // serves it; this one may take it once the lease runs out (docs/deployment.md).
        E::Store(s @ tidegate_storage::StoreError::Leased { owner, address, remaining_ms, .. }) => {
            ApiError::served_elsewhere(owner, address.as_deref(), *remaining_ms, s)
        }
        E::Store(s) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", format!("the ledger store failed: {s}"))
        }
        E::InvalidArgument { field, value, expected } => ApiError::invalid(*field, value, *expected),
        E::UnknownTool { name, .. } => ApiError::invalid("tool", name, "a tool registered with this tenant"),
        interrupted @ E::CallInterrupted { .. } => ApiError::conflict("call_interrupted", interrupted.to_string()),
        misuse @ E::TicketMisuse { .. } => ApiError::conflict("ticket_misuse", misuse.to_string()),
        missing @ E::MissingDescriptor { .. } => {
            let mut e = ApiError::new(StatusCode::BAD_REQUEST, "missing_descriptor", missing.to_string());
            e.field = Some("compensate".into());
            e.expected =
                Some("a compensation descriptor {capability, args}: a reversible effect in a plan step".into());
            e
        }
        E::Plan(p) => {
            let detail = p.to_string();
            match p {
                tidegate_runtime::PlanError::Invalid { field, value, expected } => {
                    ApiError::invalid(field.clone(), value, expected.clone())
                }
                tidegate_runtime::PlanError::Log { .. } | tidegate_runtime::PlanError::Stopped { .. } => {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", detail)
                }
                _ => ApiError::conflict("plan_refused", detail),
            }
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// Seconds a client waits before asking again for a tenant this node does not serve (another
/// node may serve it by then, or a router sends the request there).
pub const TENANT_RETRY_AFTER_S: u64 = 5;

/// 503 for a tenant this node does not serve (any more); `detail` names the tenant and why.
fn tenant_unavailable(detail: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "tenant_unavailable", detail.to_owned())
        .retry_after(TENANT_RETRY_AFTER_S)
}

/// Maps an engine refusal.
pub fn from_engine(e: &EngineError) -> ApiError {
    let detail = e.to_string();
    match e {
        EngineError::Scope { field, source } => {
            ApiError::invalid(field.clone(), source.to_string(), "a well-formed `type:path` scope")
        }
        EngineError::InvalidArgument { field, value, expected } => ApiError::invalid(*field, value, *expected),
        EngineError::UnknownTx { .. } | EngineError::UnknownGroup { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
        }
        EngineError::Settled { .. } | EngineError::WrongState { .. } | EngineError::InFlight { .. } => {
            ApiError::conflict("wrong_state", detail)
        }
        EngineError::ProtocolViolation { .. } => ApiError::conflict("protocol_violation", detail),
        EngineError::KeyInUse { .. } => ApiError::conflict("key_in_use", detail).retry_after(1),
        EngineError::KeyUnresolved { .. } => ApiError::conflict("key_unresolved", detail),
        EngineError::KeyReused { .. } => ApiError::conflict("key_reused", detail),
        EngineError::NotInGroup { .. } => {
            let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_field", detail);
            e.field = Some("winner".into());
            e.expected = Some("one of the group's branches".into());
            e
        }
        EngineError::BranchOfGroup { .. } => ApiError::conflict("branch_of_group", detail),
        EngineError::SiblingConflict { .. } => ApiError::conflict("sibling_conflict", detail),
        EngineError::LockConflict { .. } => ApiError::conflict("lock_conflict", detail).retry_after(1),
        EngineError::NoWinner { .. } => ApiError::conflict("no_winner", detail),
        _ => ApiError::conflict("refused", detail),
    }
}

/// The one mapping of the service's errors to problem documents: bad input is 400 naming the
/// field, a missing thing 404, a conflict 409 (with `Retry-After` when it says when), a part
/// that cannot serve 503 (a tenant this node dropped, `tenant_unavailable`, with
/// `Retry-After`), the engine's refusals as [`from_runtime`] maps them.
impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        if let ServiceError::TenantUnavailable { .. } = &e {
            return tenant_unavailable(&e.to_string());
        }
        match e {
            ServiceError::Invalid { field, value, expected } => ApiError::invalid(field, value, expected),
            ServiceError::NotFound { what, name } => ApiError::not_found(what, &name),
            ServiceError::Conflict { code, detail, retry_after } => {
                let e = ApiError::conflict(code, detail);
                match retry_after {
                    Some(s) => e.retry_after(s),
                    None => e,
                }
            }
            ServiceError::Engine(e) => from_runtime_ref(&e),
            ServiceError::Unavailable { code, detail, retry_after } => {
                let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, detail);
                match retry_after {
                    Some(s) => e.retry_after(s),
                    None => e,
                }
            }
            ServiceError::ShuttingDown => ApiError::shutting_down(),
            ServiceError::Busy { code, detail, retry_after } => {
                let e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, detail);
                match retry_after {
                    Some(s) => e.retry_after(s),
                    None => e,
                }
            }
            ServiceError::CrossTenant { field, found, detail } => {
                let mut e = ApiError::new(StatusCode::BAD_REQUEST, "cross_tenant", detail);
                e.field = Some(field);
                e.value = Some(found);
                e.expected = Some("this tenant (or no `tenant`)".into());
                e
            }
            ServiceError::Refused { code, detail } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail),
            ServiceError::Internal(d) => ApiError::internal(d),
            ServiceError::Tenant { source, .. } => from_runtime_ref(&source),
            e @ (ServiceError::Catalog { .. }
            | ServiceError::CatalogPostgres { .. }
            | ServiceError::CatalogVersion { .. }) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable", e.to_string()).retry_after(1)
            }
            // The tenant's state (idempotency records, worker tasks, attempts): a busy or
            // failing disk may pass; a damaged file needs an operator (its message says what to do).
            ServiceError::State(s) if s.retryable() => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "state_unavailable", s.to_string()).retry_after(1)
            }
            ServiceError::State(s) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "state_unavailable", s.to_string())
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}
