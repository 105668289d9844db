//! The review middleware over HTTP (`/v1/review`, docs/server.md "Review"): register templates
//! (operator), request a transaction (agent), accept or remove it (reviewer), read one and the
//! queue; and the reviewer's web page (`/review`), whose assets are compiled in.

use axum::Json;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_review::{Decision, Status};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiResult, Problem};
use crate::AppState;
use tidegate_service::auth::{RegistryWrite, Review, TxRead, TxWrite};
use tidegate_service::review::{ReviewRequest, ReviewTxView, TemplatesView};

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

fn templates_out(v: TemplatesView) -> TemplatesOut {
    TemplatesOut { added: v.added, templates: v.templates, strategy: v.strategy, granularity: v.granularity }
}

fn tx_out(v: ReviewTxView) -> ReviewTxOut {
    ReviewTxOut {
        id: v.id,
        template: v.template,
        sql: v.sql,
        params: v.params,
        sender: v.sender,
        suspicious: v.suspicious,
        status: ReviewStatusOut::of(v.status),
        reviewable: v.reviewable,
        review: v.review,
        waits_for: v.waits_for,
        waited_by: v.waited_by,
        removal_cascade: v.removal_cascade,
        cascaded_from: v.cascaded_from,
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
    let out = templates_out(caller.tenant.register_templates(body.set, body.schema).await?);
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
    Ok(Json(templates_out(caller.tenant.review_templates().await?)))
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
    let req = ReviewRequest {
        template: body.template,
        params: body.params,
        sender: body.sender,
        suspicious: body.suspicious,
    };
    let out = caller.tenant.request_review(req, format!("key_{}", caller.key_id)).await?;
    Ok((StatusCode::CREATED, Json(tx_out(out))))
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
    Ok(Json(tx_out(caller.tenant.review_tx(&id).await?)))
}

async fn decide(caller: &Caller<Review>, id: &str, decision: Decision) -> ApiResult<ReviewOut> {
    let d = caller.tenant.decide_review(id, decision, format!("key_{}", caller.key_id)).await?;
    Ok(ReviewOut { transaction: tx_out(d.transaction), cascaded: d.cascaded })
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
    Ok(Json(decide(&caller, &id, Decision::Accept).await?))
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
    Ok(Json(decide(&caller, &id, Decision::Remove).await?))
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
    let q = caller.tenant.review_queue(state.config().limits.max_page_size).await?;
    Ok(Json(ReviewQueueOut {
        data: q.data.into_iter().map(tx_out).collect(),
        total: q.total,
        reviewable: q.reviewable,
    }))
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
