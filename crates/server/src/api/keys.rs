//! The API keys of the caller's tenant (admin role).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use super::wire::*;
use crate::AppState;
use crate::error::ServerError;
use tidegate_service::auth::KeysManage;
use tidegate_service::catalog::KeyRecord;

fn key_out(r: &KeyRecord) -> KeyOut {
    KeyOut {
        id: format!("key_{}", r.id),
        role: r.role,
        label: r.label.clone(),
        created_at_ms: r.created_at_ms,
        revoked_at_ms: r.revoked_at_ms,
    }
}

fn catalog_error(e: ServerError) -> ApiError {
    match e {
        ServerError::Invalid { field, value, expected } => ApiError::invalid(field, value, expected),
        other => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable", other.to_string()).retry_after(1)
        }
    }
}

/// Create a key for the caller's tenant. The key is in this response only.
#[utoipa::path(
    post, path = "/v1/keys", tag = "keys", operation_id = "create_key",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = KeyIn,
    responses(
        (status = 201, description = "Created; `key` is shown this once", body = NewKeyOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller<KeysManage>,
    ApiJson(body): ApiJson<KeyIn>,
) -> ApiResult<(StatusCode, Json<NewKeyOut>)> {
    let cat = state.catalog().clone();
    let tenant = caller.tenant.name.clone();
    let (new, rec) = tokio::task::spawn_blocking(move || cat.create_key(&tenant, body.role, body.label.as_deref()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(catalog_error)?;
    Ok((StatusCode::CREATED, Json(NewKeyOut { record: key_out(&rec), key: new.key })))
}

/// The tenant's keys (never their secrets).
#[utoipa::path(
    get, path = "/v1/keys", tag = "keys", operation_id = "list_keys",
    responses(
        (status = 200, description = "Every key of the tenant", body = KeyList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<AppState>, caller: Caller<KeysManage>) -> ApiResult<Json<KeyList>> {
    let cat = state.catalog().clone();
    let tenant = caller.tenant.name.clone();
    let keys = tokio::task::spawn_blocking(move || cat.keys(Some(&tenant)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(catalog_error)?;
    Ok(Json(KeyList { data: keys.iter().map(key_out).collect(), has_more: false, next_cursor: None }))
}

/// Revoke a key of the tenant (at once on this server).
#[utoipa::path(
    delete, path = "/v1/keys/{key}", tag = "keys", operation_id = "revoke_key",
    params(("key" = String, Path, description = "Key id (`key_<id>`)")),
    responses(
        (status = 200, description = "Revoked", body = KeyOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn revoke(
    State(state): State<AppState>,
    caller: Caller<KeysManage>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<KeyOut>> {
    let raw = id.strip_prefix("key_").unwrap_or("").to_owned();
    if raw.len() != 16 || !raw.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::not_found("key", &id));
    }
    if raw == caller.key_id {
        return Err(ApiError::conflict("own_key", "a key cannot revoke itself; use another admin key"));
    }
    let cat = state.catalog().clone();
    let (tenant, raw2) = (caller.tenant.name.clone(), raw.clone());
    let rec = tokio::task::spawn_blocking(move || cat.revoke_key(&raw2, Some(&tenant)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e {
            ServerError::NotFound { .. } => ApiError::not_found("key", &id),
            other => catalog_error(other),
        })?;
    state.forget_key(&raw);
    Ok(Json(key_out(&rec)))
}
