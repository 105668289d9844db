//! Middleware: request ids and problem documents for every error, logs, metrics, the global
//! and per-tenant concurrency limits, authentication, idempotency.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use rand::RngCore;
use serde_json::Value;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use super::extract::{AuthState, RequestSlot, read_body};
use super::problem::ApiError;
use crate::AppState;
use tidegate_service::ServiceError;
use tidegate_service::dispatch::now_ms;
use tidegate_service::idempotency::{Begin, Fingerprint, Recorded};
use tidegate_service::metrics::{HttpLabels, RouteLabel};

const REQUEST_ID: &str = "x-request-id";

pub(super) fn wrap(router: Router<AppState>, state: AppState) -> Router {
    router
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), idempotency))
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(from_fn_with_state(state.clone(), global_limit))
        .layer(from_fn_with_state(state.clone(), record_metrics))
        .layer(CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            ApiError::internal("the handler panicked").into_response()
        }))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(from_fn(request_id))
        .with_state(state)
}

async fn fallback() -> ApiError {
    ApiError::not_found("route", "this path")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this path does not take this method")
}

fn valid_request_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
        .then(|| s.to_owned())
}

/// Accepts a valid `X-Request-Id` or makes one; returns it; puts it in every problem
/// document; turns any error response that is not a problem document into one.
async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req.headers().get(REQUEST_ID).and_then(valid_request_id).unwrap_or_else(|| {
        let mut b = [0u8; 12];
        rand::thread_rng().fill_bytes(&mut b);
        hex::encode(b)
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        req.headers_mut().insert(REQUEST_ID, v);
    }
    let resp = next.run(req).await;
    let mut resp = if resp.status().is_client_error() || resp.status().is_server_error() {
        problem_with_id(resp, &id).await
    } else {
        resp
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

async fn problem_with_id(resp: Response, id: &str) -> Response {
    let (mut parts, body) = resp.into_parts();
    let is_problem = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/problem+json"));
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let mut doc: Value = if is_problem { serde_json::from_slice(&bytes).unwrap_or(Value::Null) } else { Value::Null };
    if !doc.is_object() {
        let text = String::from_utf8_lossy(&bytes).trim().to_owned();
        let code = match parts.status.as_u16() {
            404 => "not_found",
            405 => "method_not_allowed",
            413 => "body_too_large",
            415 => "unsupported_media_type",
            s if s >= 500 => "internal",
            _ => "invalid_request",
        };
        let detail = if text.is_empty() { parts.status.canonical_reason().unwrap_or("error").to_owned() } else { text };
        let mut e = ApiError::new(parts.status, code, detail);
        e.retryable = parts.status.is_server_error();
        doc = serde_json::to_value(e.problem()).unwrap_or(Value::Null);
    }
    if let Some(o) = doc.as_object_mut() {
        o.insert("request_id".into(), Value::String(id.to_owned()));
    }
    let body = serde_json::to_vec(&doc).unwrap_or_default();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

async fn record_metrics(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let method = req.method().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    let m = state.metrics();
    m.http_requests.get_or_create(&HttpLabels { method, route: route.clone(), status: resp.status().as_u16() }).inc();
    m.http_duration.get_or_create(&RouteLabel { route }).observe(started.elapsed().as_secs_f64());
    resp
}

fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Bounded concurrency over all tenants (503 + Retry-After beyond).
async fn global_limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if exempt(req.uri().path()) {
        return next.run(req).await;
    }
    if state.shutdown_token().is_cancelled() {
        return ApiError::shutting_down().into_response();
    }
    let Ok(_permit) = state.0.global.clone().try_acquire_owned() else {
        state.metrics().refused("global");
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "the server is handling {} requests (limits.max_concurrent_requests)",
                state.config().limits.max_concurrent_requests
            ),
        )
        .retry_after(1)
        .into_response();
    };
    next.run(req).await
}

/// Resolves the bearer key (if any) into an [`AuthState`] and takes a slot in the tenant's
/// concurrency limit (429 + Retry-After beyond). Handlers see it through `Caller`.
async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let header = req.headers().get(header::AUTHORIZATION).map(|v| v.to_str().map(str::to_owned));
    let mut slot = None;
    match header {
        None => {}
        Some(Err(_)) => {
            req.extensions_mut()
                .insert(AuthState::Refused(ApiError::unauthenticated("the Authorization header is not visible ASCII")));
        }
        Some(Ok(h)) => match state.authenticate(&h).await {
            Ok(ctx) => {
                let Ok(permit) = ctx.tenant.permits.clone().try_acquire_owned() else {
                    state.metrics().refused("tenant");
                    return ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_requests",
                        format!(
                            "the tenant has {} requests in progress (limits.max_concurrent_per_tenant)",
                            state.config().limits.max_concurrent_per_tenant
                        ),
                    )
                    .retry_after(1)
                    .into_response();
                };
                let s = RequestSlot(Arc::new(Mutex::new(Some(permit))));
                req.extensions_mut().insert(s.clone());
                slot = Some(s);
                req.extensions_mut().insert(AuthState::Ok(Arc::new(ctx)));
            }
            Err(e) => {
                req.extensions_mut().insert(AuthState::Refused(e));
            }
        },
    }
    let resp = next.run(req).await;
    if let Some(s) = slot {
        s.release();
    }
    resp
}

fn valid_idempotency_key(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 255 && s.bytes().all(|b| b.is_ascii_graphic())).then(|| s.to_owned())
}

/// Frees a running idempotency record if its request task dies without a response (the
/// state submits the operation at once; nobody waits for it here).
struct Unfinished {
    state: AppState,
    tenant: Arc<tidegate_service::tenant::Tenant>,
    key: Option<String>,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            let fut = self.tenant.idempotency.finish(&k, None);
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                h.spawn(async move {
                    if let Err(e) = fut.await {
                        tracing::warn!("freeing an idempotency key: {e}");
                    }
                });
            }
            let _ = &self.state;
        }
    }
}

/// `Idempotency-Key` on POST (docs/server.md, invariant 7). The request runs on a server
/// task, so a disconnect neither cancels it nor loses its record.
async fn idempotency(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(raw) = req.headers().get("idempotency-key") else { return next.run(req).await };
    // Authentication answers first: a request without a valid key is a 401 whatever its
    // other headers say (found by scripts/fuzz-api.sh).
    let Some(AuthState::Ok(ctx)) = req.extensions().get::<AuthState>().cloned() else {
        // Unauthenticated: the handler's extractor refuses it; nothing to record.
        return next.run(req).await;
    };
    let Some(key) = valid_idempotency_key(raw) else {
        return ApiError::invalid(
            "Idempotency-Key",
            String::from_utf8_lossy(raw.as_bytes()),
            "1 to 255 visible ASCII characters",
        )
        .into_response();
    };
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, state.config().limits.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let body_value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let fp = Fingerprint { method: parts.method.to_string(), path, body: body_value };
    let tenant = ctx.tenant.clone();
    let begun = match tenant.idempotency.begin(&key, fp, now_ms()).await {
        Ok(b) => b,
        Err(e) => return ApiError::from(ServiceError::from(e)).into_response(),
    };
    match begun {
        Begin::Replay(rec) => {
            state.metrics().idempotent_replays.inc();
            let mut resp = Response::new(Body::from(rec.body));
            *resp.status_mut() = StatusCode::from_u16(rec.status).unwrap_or(StatusCode::OK);
            if let Some(ct) = rec.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            if let Some(l) = rec.location.and_then(|c| HeaderValue::from_str(&c).ok()) {
                resp.headers_mut().insert(header::LOCATION, l);
            }
            resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            resp
        }
        Begin::InProgress => ApiError::conflict(
            "idempotency_key_in_progress",
            format!("a request with Idempotency-Key `{key}` is still running; retry after it finishes"),
        )
        .with_field("Idempotency-Key")
        .retry_after(1)
        .into_response(),
        Begin::Mismatch(diff) => ApiError::conflict(
            "idempotency_key_reused",
            format!("Idempotency-Key `{key}` was used for another request: {diff}"),
        )
        .with_field("Idempotency-Key")
        .into_response(),
        Begin::Proceed => {
            let req = Request::from_parts(parts, Body::from(bytes));
            let mut guard = Unfinished { state: state.clone(), tenant: tenant.clone(), key: Some(key.clone()) };
            let task = state.spawn(async move {
                let resp = next.run(req).await;
                let (parts, body) = resp.into_parts();
                if parts.status.is_success() {
                    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
                    let header =
                        |h| parts.headers.get(h).and_then(|v: &HeaderValue| v.to_str().ok()).map(str::to_owned);
                    let rec = Recorded {
                        status: parts.status.as_u16(),
                        content_type: header(header::CONTENT_TYPE),
                        location: header(header::LOCATION),
                        body: bytes.to_vec(),
                    };
                    // The response goes out only once its record is kept (durably, after the
                    // ledger, with a durable store): a retry after a crash replays it.
                    if let Some(k) = guard.key.take()
                        && let Err(e) = guard.tenant.keep_idempotent_response(&k, rec).await
                    {
                        // Not kept: the client gets the response, but a retry is not
                        // guaranteed to replay it. The key stays running (a retry is refused
                        // `idempotency_key_in_progress`) until the process restarts.
                        tracing::warn!("recording the response of Idempotency-Key `{k}`: {e}");
                    }
                    Response::from_parts(parts, Body::from(bytes))
                } else {
                    drop(guard);
                    Response::from_parts(parts, body)
                }
            });
            match task.await {
                Ok(Some(r)) => r,
                Ok(None) => ApiError::shutting_down().into_response(),
                Err(_) => ApiError::internal("the request's task failed").into_response(),
            }
        }
    }
}
