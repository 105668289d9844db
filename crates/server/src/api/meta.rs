//! Identity, health, readiness, metrics and the OpenAPI document.

use std::sync::OnceLock;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::extract::Caller;
use super::problem::{ApiResult, Problem};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{Any, ClusterRead};

/// The caller's tenant, role and key.
#[utoipa::path(
    get, path = "/v1/whoami", tag = "meta", operation_id = "whoami",
    responses(
        (status = 200, description = "The caller", body = WhoamiOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn whoami(caller: Caller<Any>) -> ApiResult<Json<WhoamiOut>> {
    Ok(Json(WhoamiOut {
        tenant: caller.tenant.name.clone(),
        role: caller.role,
        key_id: format!("key_{}", caller.key_id),
    }))
}

/// This node and who serves the caller's tenant: its stream's owner node, fencing token and
/// lease, and the nodes holding leases (counts only). On a store of one node (SQLite, memory),
/// `shared` is false.
#[utoipa::path(
    get, path = "/v1/cluster", tag = "meta", operation_id = "cluster",
    responses(
        (status = 200, description = "The cluster as this node sees it", body = ClusterOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cluster's database does not answer", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn cluster(State(state): State<AppState>, caller: Caller<ClusterRead>) -> ApiResult<Json<ClusterOut>> {
    let v = state.service().cluster(&caller.tenant.name).await?;
    Ok(Json(ClusterOut {
        node: v.node_id,
        shared: v.shared,
        serving_here: v.serving_here,
        stream: v.stream.map(|s| StreamOut {
            owner: s.owner,
            owner_address: s.owner_address,
            token: s.token,
            lease_left_ms: s.lease_left_ms,
            last_lsn: s.last_lsn,
        }),
        nodes: v
            .nodes
            .into_iter()
            .map(|n| NodeOut {
                id: n.id,
                address: n.address,
                live: n.live,
                seen_ms_ago: n.seen_ms_ago,
                tenants: n.tenants,
            })
            .collect(),
    }))
}

/// This API as OpenAPI 3.1.
#[utoipa::path(
    get, path = "/v1/openapi.json", tag = "meta", operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)),
)]
pub async fn openapi_json() -> impl IntoResponse {
    static DOC: OnceLock<String> = OnceLock::new();
    let body = DOC.get_or_init(super::openapi_json).clone();
    ([(header::CONTENT_TYPE, "application/json")], body)
}

/// The process serves.
#[utoipa::path(
    get, path = "/healthz", tag = "meta", operation_id = "healthz",
    responses((status = 200, description = "Up", content_type = "text/plain", body = String)),
)]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// The catalog answers and every tenant's engine is open.
#[utoipa::path(
    get, path = "/readyz", tag = "meta", operation_id = "readyz",
    responses(
        (status = 200, description = "Ready", body = ReadyOut),
        (status = 503, description = "Not ready", body = ReadyOut),
    ),
)]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<ReadyOut>) {
    let (catalog, tenants, recovering, failed) = state.readiness();
    let ready = catalog && failed == 0 && !state.shutdown_token().is_cancelled();
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(ReadyOut { ready, catalog, tenants, recovering, failed }))
}

/// Prometheus metrics.
#[utoipa::path(
    get, path = "/metrics", tag = "meta", operation_id = "metrics",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)),
)]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let body = state.metrics().render(state.snapshot());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
}
