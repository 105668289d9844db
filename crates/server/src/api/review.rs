//! The review middleware over HTTP (`/v1/review`, docs/server.md "Review"): register templates
//! (operator), request a transaction (agent), accept or remove it (reviewer), read one and the
//! queue; and the reviewer's web page (`/review`), whose assets are compiled in.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_review::{Decision, Manager, Request, Status, TemplateSet, TxView};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use crate::AppState;
use tidegate_service::auth::{RegistryWrite, Review, TxRead, TxWrite};
use tidegate_service::ids::{self, Kind};
use tidegate_service::review::ReviewFailure;
use tidegate_service::tenant::Tenant;

/// Templates to register, with an optional schema to run first.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({
        "set": {
            "tables": {"account": {"primary_key": ["id"]}},
            "invariants": [{"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0}],
            "templates": [{
                "name": "withdraw",
                "params": ["id", "amount"],
                "steps": [{"statements": [{"sql": "UPDATE account SET balance = balance - :amount WHERE id = :id"}]}],
                "writes": [{"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "id"}}]
            }]
        },
        "schema": "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0)); INSERT OR IGNORE INTO account VALUES (1, 100);"
    })
))]
pub struct TemplatesIn {
    /// A template set: `tables`, `invariants`, `templates` (the format of docs/review.md,
    /// as JSON). A template or table already registered must be given unchanged.
    #[schema(value_type = Object)]
    pub set: Value,
    /// SQL run on the tenant's review database before the templates are added (e.g.
    /// `CREATE TABLE IF NOT EXISTS ...`); it runs again if the same registration is repeated.
    #[serde(default)]
    pub schema: Option<String>,
}

/// The registered templates.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplatesOut {
    /// Whether this registration added anything.
    pub added: bool,
    /// Every registered template's name.
    pub templates: Vec<String>,
    /// The deployment's strategy (`buffer_suspicious` or `buffer_compensating`).
    pub strategy: String,
    /// The finest dependency-check granularity.
    pub granularity: String,
}

/// A request for a transaction.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"template": "withdraw", "params": {"id": 1, "amount": 30}, "sender": "support-bot", "suspicious": true})
))]
pub struct ReviewRequestIn {
    /// The template's name.
    pub template: String,
    /// Its parameters (an object).
    #[schema(value_type = Object)]
    pub params: Value,
    /// Who sent it (an LLM agent, a user). Default: the caller's key id.
    #[serde(default)]
    pub sender: Option<String>,
    /// Whether it needs review (LLM-generated, flagged by a policy). Default `false`.
    #[serde(default)]
    pub suspicious: bool,
}

/// Where a review transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewStatusOut {
    /// Waiting for buffered transactions it depends on.
    Held,
    /// Suspicious, not executed, waiting for a reviewer.
    AwaitingReview,
    /// Executed; its compensation is held until a reviewer decides.
    ExecutedAwaitingReview,
    /// Final: in the database for good.
    Committed,
    /// Final: taken out of history.
    Removed,
    /// Final: the database refused it.
    Failed,
    /// Final: a removal whose compensation the database refused.
    CompensationFailed,
}

impl ReviewStatusOut {
    fn of(s: Status) -> ReviewStatusOut {
        match s {
            Status::Held => ReviewStatusOut::Held,
            Status::AwaitingReview => ReviewStatusOut::AwaitingReview,
            Status::ExecutedAwaitingReview => ReviewStatusOut::ExecutedAwaitingReview,
            Status::Committed => ReviewStatusOut::Committed,
            Status::Removed => ReviewStatusOut::Removed,
            Status::Failed => ReviewStatusOut::Failed,
            Status::CompensationFailed => ReviewStatusOut::CompensationFailed,
        }
    }
}

/// One transaction of the review middleware.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewTxOut {
    /// Its id (`rv_<tag>_<n>`).
    pub id: String,
    /// The template.
    pub template: String,
    /// The template's SQL statements, in order (a statement marked `each` runs per element).
    pub sql: Vec<String>,
    /// The parameters.
    #[schema(value_type = Object)]
    pub params: Value,
    /// Who sent it.
    pub sender: String,
    /// Whether it needs review.
    pub suspicious: bool,
    /// Where it stands.
    pub status: ReviewStatusOut,
    /// Whether a reviewer may decide on it now.
    pub reviewable: bool,
    /// The reviewer's decision (`accept` or `remove`), if any.
    pub review: Option<String>,
    /// Buffered transactions it waits for.
    pub waits_for: Vec<String>,
    /// Transactions waiting for it.
    pub waited_by: Vec<String>,
    /// What removing it now would also remove (transactions that build on it).
    pub removal_cascade: Vec<String>,
    /// The removal it was cascaded from, if any.
    pub cascaded_from: Option<String>,
    /// The database's refusal, if any.
    pub error: Option<String>,
}

/// A reviewer's decision and what followed.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewOut {
    /// The transaction after the decision.
    pub transaction: ReviewTxOut,
    /// The transactions the decision removed with it (a removal's cascade), in id order.
    pub cascaded: Vec<String>,
}

/// The buffer: every transaction not yet final, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewQueueOut {
    /// The transactions (at most `limits.max_page_size`).
    pub data: Vec<ReviewTxOut>,
    /// How many are in the buffer.
    pub total: usize,
    /// How many of them await a reviewer.
    pub reviewable: usize,
}

fn failure(e: ReviewFailure) -> ApiError {
    use tidegate_review::Error as E;
    match e {
        ReviewFailure::Config(detail) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "review_unavailable",
            format!("the tenant's review database is not usable: {detail}"),
        ),
        ReviewFailure::Review(e) => match e {
            E::Template { template, field, value, expected } => {
                // Whole-set paths as they are; a template's own fields under its name.
                let field = if ["templates[", "tables", "invariants"].iter().any(|p| field.starts_with(p)) {
                    format!("set.{field}")
                } else {
                    format!("set.templates[{template:?}].{field}")
                };
                ApiError::invalid(field, value, expected)
            }
            E::UnknownTemplate(name) => {
                ApiError::invalid("template", name, "the name of a template registered with this tenant")
            }
            E::Param { template, field, value, expected } => {
                let field = if field == "params" { field } else { format!("params.{field}") };
                ApiError::invalid(field, value, format!("{expected} (template {template:?})"))
            }
            E::Review { id, reason } => {
                ApiError::conflict("not_reviewable", format!("transaction {id} cannot be reviewed: {reason}"))
            }
            E::UnknownTx(id) => ApiError::not_found("review transaction", &id.to_string()),
            e @ (E::Database { .. } | E::Log { .. }) if e.retryable() => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "review_unavailable", e.to_string()).retry_after(1)
            }
            E::Privilege { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "review_unavailable",
                "the tenant's review database is not usable: least privilege could not be set up for it; the server's log has the details",
            ),
            E::Database { op, message, .. } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "database_refused", format!("{op}: {message}"))
            }
            other => ApiError::internal(other.to_string()),
        },
    }
}

/// Runs `f` on the tenant's manager on a blocking thread.
async fn with_manager<R: Send + 'static>(
    tenant: &Arc<Tenant>,
    f: impl FnOnce(&mut Manager) -> tidegate_review::Result<R> + Send + 'static,
) -> ApiResult<R> {
    with_manager_for(tenant, None, f).await
}

/// As [`with_manager`], for a request naming the transaction `id` (an unknown one is answered
/// exactly as an id of another tenant: 404 naming the id as given; a refused review names the
/// id as given, not the manager's internal number).
async fn with_manager_for<R: Send + 'static>(
    tenant: &Arc<Tenant>,
    id: Option<&str>,
    f: impl FnOnce(&mut Manager) -> tidegate_review::Result<R> + Send + 'static,
) -> ApiResult<R> {
    let t = tenant.clone();
    let r = tokio::task::spawn_blocking(move || t.review.with(&t.engine, &t.review_place, f))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    r.map_err(|e| match (e, id) {
        (ReviewFailure::Review(tidegate_review::Error::UnknownTx(_)), Some(id)) => {
            ApiError::not_found("review transaction", id)
        }
        (ReviewFailure::Review(tidegate_review::Error::Review { reason, .. }), Some(id)) => {
            ApiError::conflict("not_reviewable", format!("transaction {id} cannot be reviewed: {reason}"))
        }
        (e, _) => failure(e),
    })
}

fn rv(tag: &str, n: u64) -> String {
    ids::format(Kind::Review, tag, n)
}

fn parse_id(t: &Tenant, id: &str) -> ApiResult<u64> {
    ids::parse(Kind::Review, &t.tag, id).ok_or_else(|| ApiError::not_found("review transaction", id))
}

fn snake<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn tx_out(m: &Manager, tag: &str, v: TxView) -> ReviewTxOut {
    let sql = m
        .templates()
        .get(&v.template)
        .map(|t| t.steps.iter().flat_map(|s| s.statements.iter().map(|st| st.sql.clone())).collect())
        .unwrap_or_default();
    let reviewable = v.suspicious && v.review.is_none() && !v.status.is_final();
    let removal_cascade =
        if reviewable { m.cascade_preview(v.id).into_iter().map(|n| rv(tag, n)).collect() } else { Vec::new() };
    ReviewTxOut {
        id: rv(tag, v.id),
        template: v.template,
        sql,
        params: v.params,
        sender: v.sender,
        suspicious: v.suspicious,
        status: ReviewStatusOut::of(v.status),
        reviewable,
        review: v.review.map(|d| snake(&d)),
        waits_for: v.waits_for.into_iter().map(|n| rv(tag, n)).collect(),
        waited_by: v.waited_by.into_iter().map(|n| rv(tag, n)).collect(),
        removal_cascade,
        cascaded_from: v.cascaded_from.map(|n| rv(tag, n)),
        error: v.error,
    }
}

/// Register templates (with their tables and invariants) for the tenant's review manager.
#[utoipa::path(
    post, path = "/v1/review/templates", tag = "review", operation_id = "review_register_templates",
    request_body = TemplatesIn,
    responses(
        (status = 200, description = "Nothing new (the same templates again)", body = TemplatesOut),
        (status = 201, description = "Added", body = TemplatesOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn register_templates(
    caller: Caller<RegistryWrite>,
    ApiJson(body): ApiJson<TemplatesIn>,
) -> ApiResult<(StatusCode, Json<TemplatesOut>)> {
    let set: TemplateSet = serde_path_to_error::deserialize(body.set).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "set".to_owned() } else { format!("set.{path}") };
        ApiError::invalid(
            field,
            e.inner().to_string(),
            "a template set (tables, invariants, templates; docs/review.md)",
        )
    })?;
    let schema = body.schema.filter(|s| !s.trim().is_empty());
    let out = with_manager(&caller.tenant, move |m| {
        let added = m.register(set, schema)?;
        let o = m.options();
        Ok(TemplatesOut {
            added,
            templates: m.templates().templates.iter().map(|t| t.name.clone()).collect(),
            strategy: snake(&o.strategy),
            granularity: snake(&o.granularity),
        })
    })
    .await?;
    Ok((if out.added { StatusCode::CREATED } else { StatusCode::OK }, Json(out)))
}

/// The registered templates.
#[utoipa::path(
    get, path = "/v1/review/templates", tag = "review", operation_id = "review_list_templates",
    responses(
        (status = 200, description = "The templates", body = TemplatesOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_templates(caller: Caller<TxRead>) -> ApiResult<Json<TemplatesOut>> {
    let out = with_manager(&caller.tenant, |m| {
        let o = m.options();
        Ok(TemplatesOut {
            added: false,
            templates: m.templates().templates.iter().map(|t| t.name.clone()).collect(),
            strategy: snake(&o.strategy),
            granularity: snake(&o.granularity),
        })
    })
    .await?;
    Ok(Json(out))
}

/// Request a transaction: it runs at once, or is buffered (suspicious, or depending on a
/// buffered one) until a reviewer decides. Returns its id and status.
#[utoipa::path(
    post, path = "/v1/review/transactions", tag = "review", operation_id = "review_request",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = ReviewRequestIn,
    responses(
        (status = 201, description = "Entered the manager", body = ReviewTxOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn request(
    caller: Caller<TxWrite>,
    ApiJson(body): ApiJson<ReviewRequestIn>,
) -> ApiResult<(StatusCode, Json<ReviewTxOut>)> {
    if let Some(s) = &body.sender
        && (s.is_empty() || s.len() > 200)
    {
        return Err(ApiError::invalid("sender", s, "1 to 200 bytes"));
    }
    let sender = body.sender.unwrap_or_else(|| format!("key_{}", caller.key_id));
    let req = Request { template: body.template, params: body.params, sender, suspicious: body.suspicious };
    let tag = caller.tenant.tag.clone();
    let out = with_manager(&caller.tenant, move |m| {
        let id = m.request(req)?;
        let v = m.status(id)?;
        Ok(tx_out(m, &tag, v))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(out)))
}

/// One transaction's status, SQL, parameters and dependencies.
#[utoipa::path(
    get, path = "/v1/review/transactions/{id}", tag = "review", operation_id = "review_get",
    params(("id" = String, Path, description = "Review transaction id (`rv_<tag>_<n>`)")),
    responses(
        (status = 200, description = "The transaction", body = ReviewTxOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_one(caller: Caller<TxRead>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<ReviewTxOut>> {
    let n = parse_id(&caller.tenant, &id)?;
    let tag = caller.tenant.tag.clone();
    let out = with_manager_for(&caller.tenant, Some(&id), move |m| {
        let v = m.status(n)?;
        Ok(tx_out(m, &tag, v))
    })
    .await?;
    Ok(Json(out))
}

async fn decide(caller_tenant: &Arc<Tenant>, key_id: &str, id: &str, decision: Decision) -> ApiResult<ReviewOut> {
    let n = parse_id(caller_tenant, id)?;
    let tag = caller_tenant.tag.clone();
    let reviewer = format!("key_{key_id}");
    with_manager_for(caller_tenant, Some(id), move |m| {
        m.review(n, decision, &reviewer)?;
        let v = m.status(n)?;
        let cascaded = m.cascaded(n).into_iter().map(|c| rv(&tag, c)).collect();
        Ok(ReviewOut { transaction: tx_out(m, &tag, v), cascaded })
    })
    .await
}

/// Accept a suspicious transaction: it stays (or is executed once what it waits for is
/// resolved).
#[utoipa::path(
    post, path = "/v1/review/transactions/{id}/accept", tag = "review", operation_id = "review_accept",
    params(("id" = String, Path, description = "Review transaction id (`rv_<tag>_<n>`)")),
    responses(
        (status = 200, description = "Accepted", body = ReviewOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn accept(caller: Caller<Review>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<ReviewOut>> {
    Ok(Json(decide(&caller.tenant, &caller.key_id, &id, Decision::Accept).await?))
}

/// Remove a suspicious transaction from history (never executed, or compensated), with every
/// transaction that builds on it; `cascaded` names those.
#[utoipa::path(
    post, path = "/v1/review/transactions/{id}/remove", tag = "review", operation_id = "review_remove",
    params(("id" = String, Path, description = "Review transaction id (`rv_<tag>_<n>`)")),
    responses(
        (status = 200, description = "Removed", body = ReviewOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn remove(caller: Caller<Review>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<ReviewOut>> {
    Ok(Json(decide(&caller.tenant, &caller.key_id, &id, Decision::Remove).await?))
}

/// The buffer: every transaction not yet final (awaiting review, executed awaiting review,
/// held), oldest first, with its SQL, parameters, sender and what waits on it.
#[utoipa::path(
    get, path = "/v1/review/queue", tag = "review", operation_id = "review_queue",
    responses(
        (status = 200, description = "The buffer", body = ReviewQueueOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn queue(
    axum::extract::State(state): axum::extract::State<AppState>,
    caller: Caller<TxRead>,
) -> ApiResult<Json<ReviewQueueOut>> {
    let tag = caller.tenant.tag.clone();
    let limit = state.config().limits.max_page_size;
    let out = with_manager(&caller.tenant, move |m| {
        let all = m.queue();
        let total = all.len();
        let data: Vec<ReviewTxOut> = all.into_iter().take(limit).map(|v| tx_out(m, &tag, v)).collect();
        let reviewable = m.reviewable().len();
        Ok(ReviewQueueOut { data, total, reviewable })
    })
    .await?;
    Ok(Json(out))
}

const PAGE_HTML: &str = include_str!("review_page/index.html");
const PAGE_JS: &str = include_str!("review_page/review.js");
const PAGE_CSS: &str = include_str!("review_page/review.css");

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

/// The reviewer's web page and its assets (no authentication: the page itself asks for an
/// API key and sends it with every API call).
pub fn page_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/review",
            get(|| async {
                let mut r = asset("text/html; charset=utf-8", PAGE_HTML).into_response();
                r.headers_mut().insert(
                    header::CONTENT_SECURITY_POLICY,
                    header::HeaderValue::from_static(
                        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; frame-ancestors 'none'",
                    ),
                );
                r
            }),
        )
        .route("/review/review.js", get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }))
        .route("/review/review.css", get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }))
}
