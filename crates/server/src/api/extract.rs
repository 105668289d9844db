//! Extractors: the caller (authenticated, scoped to one tenant, permission checked), and JSON
//! bodies, paths and queries whose rejections are problem documents naming the field.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::OwnedSemaphorePermit;

use super::problem::ApiError;
use crate::AppState;
use tidegate_service::auth::{Needs, Permission, Role};
use tidegate_service::tenant::Tenant;

/// Who is calling: set by the auth middleware, read by [`Caller`].
#[derive(Debug, Clone)]
pub struct AuthContext {
    /// The key's tenant.
    pub tenant: Arc<Tenant>,
    /// The key's role.
    pub role: Role,
    /// The key's id.
    pub key_id: String,
}

/// What the auth middleware found: a caller, or why the presented key was refused.
#[derive(Debug, Clone)]
pub enum AuthState {
    /// Authenticated.
    Ok(Arc<AuthContext>),
    /// A key was presented and refused.
    Refused(ApiError),
}

/// The request's slot in its tenant's concurrency limit. Waiting handlers give it back
/// before they wait (a wait holds a waiter slot instead).
#[derive(Debug, Clone, Default)]
pub struct RequestSlot(pub Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl RequestSlot {
    /// Gives the slot back.
    pub fn release(&self) {
        self.0.lock().take();
    }
}

/// An authenticated caller whose role grants `P`. The only way a handler reaches a tenant.
#[derive(Debug)]
pub struct Caller<P: Needs> {
    /// The tenant every id in the request is resolved in.
    pub tenant: Arc<Tenant>,
    /// The key's role.
    pub role: Role,
    /// The key's id.
    pub key_id: String,
    /// The request's concurrency slot.
    pub slot: RequestSlot,
    _p: PhantomData<P>,
}

impl<S: Send + Sync, P: Needs> FromRequestParts<S> for Caller<P> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let (ctx, slot) = authorize(parts, P::PERMISSION)?;
        Ok(Caller { tenant: ctx.tenant.clone(), role: ctx.role, key_id: ctx.key_id.clone(), slot, _p: PhantomData })
    }
}

/// The authenticated caller's context, if its role grants `need`, and the request's slot.
/// Not generic, so that it is compiled once rather than once per permission.
fn authorize(parts: &Parts, need: Permission) -> Result<(Arc<AuthContext>, RequestSlot), ApiError> {
    let ctx = match parts.extensions.get::<AuthState>() {
        Some(AuthState::Ok(ctx)) => ctx.clone(),
        Some(AuthState::Refused(e)) => return Err(e.clone()),
        None => return Err(ApiError::unauthenticated("no API key: send `Authorization: Bearer <key>`")),
    };
    if !ctx.role.grants(need) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "a key with role `{}` lacks permission `{}` (docs/server.md, Roles and permissions)",
                ctx.role,
                need.as_str()
            ),
        ));
    }
    let slot = parts.extensions.get::<RequestSlot>().cloned().unwrap_or_default();
    Ok((ctx, slot))
}

/// A JSON object body. An empty body reads as `{}`; unknown fields, wrong types, a JSON value
/// that is not an object, syntax errors, other media types (or none, for a non-empty body)
/// and oversized bodies are 4xx problems.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = json_body(req, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON request's body, its media type checked and its size limited. Not generic, so that
/// it is compiled once rather than once per body type.
async fn json_body(req: Request, state: &AppState) -> Result<axum::body::Bytes, ApiError> {
    let has_type = req.headers().contains_key(header::CONTENT_TYPE);
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if !(mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))) {
            let mut e = ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("request bodies are JSON; got Content-Type `{ct}`"),
            );
            e.field = Some("Content-Type".into());
            e.value = Some(ct.to_owned());
            e.expected = Some("application/json".into());
            return Err(e);
        }
    }
    let limit = state.config().limits.max_body_bytes;
    let bytes = read_body(req.into_body(), limit).await?;
    if !has_type && !bytes.iter().all(u8::is_ascii_whitespace) {
        let mut e = ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the request has a body but no Content-Type; request bodies are JSON",
        );
        e.field = Some("Content-Type".into());
        e.expected = Some("application/json".into());
        return Err(e);
    }
    Ok(bytes)
}

/// Reads a body up to `limit` bytes (413 beyond).
pub async fn read_body(body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    match axum::body::to_bytes(body, limit).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if too_large {
                let mut p = ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the request body is larger than {limit} bytes (limits.max_body_bytes)"),
                );
                p.field = Some("body".into());
                p.expected = Some(format!("at most {limit} bytes"));
                Err(p)
            } else {
                Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    format!("reading the request body failed: {e}"),
                ))
            }
        }
    }
}

/// Parses a JSON object body (empty: `{}`) into `T`, naming the field of any error. Any
/// other JSON value is refused before serde sees it: serde reads a struct from an array too
/// (`[]` would be a valid `BeginIn`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(not_an_object(bytes));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(if path == "." { String::new() } else { path }, e.into_inner())
    })?;
    de.end().map_err(|e| json_error(String::new(), e))?;
    Ok(value)
}

/// The problem for a body that is not a JSON object: invalid JSON, or a JSON value of
/// another type.
fn not_an_object(bytes: &[u8]) -> ApiError {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Err(e) => json_error(String::new(), e),
        Ok(v) => {
            let kind = match v {
                serde_json::Value::Array(_) => "a JSON array",
                serde_json::Value::String(_) => "a JSON string",
                serde_json::Value::Number(_) => "a JSON number",
                serde_json::Value::Bool(_) => "a JSON boolean",
                _ => "JSON null",
            };
            ApiError::invalid("body", kind, "a JSON object")
        }
    }
}

fn json_error(path: String, e: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    let msg = e.to_string();
    // serde_json appends " at line L column C"; the field path says more.
    let bare = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            let mut p = ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not valid JSON: {bare} (line {}, column {})", e.line(), e.column()),
            );
            p.field = Some("body".into());
            p.expected = Some("a JSON object".into());
            p
        }
        Category::Data => {
            let join = |name: &str| if path.is_empty() { name.to_owned() } else { format!("{path}.{name}") };
            if let Some(rest) = bare.strip_prefix("unknown field `") {
                let name = rest.split('`').next().unwrap_or("");
                let expected =
                    rest.split_once(", expected ").map_or("no other fields".to_owned(), |(_, x)| x.to_owned());
                // serde_path_to_error's path already ends with the unknown field.
                let field = if path == name || path.ends_with(&format!(".{name}")) { path.clone() } else { join(name) };
                let mut p = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "unknown_field",
                    format!("unknown field `{field}`; expected {expected}"),
                );
                p.field = Some(field);
                p.expected = Some(expected);
                return p;
            }
            if let Some(rest) = bare.strip_prefix("missing field `") {
                let field = join(rest.split('`').next().unwrap_or(""));
                let mut p = ApiError::new(StatusCode::BAD_REQUEST, "missing_field", format!("missing field `{field}`"));
                p.field = Some(field);
                p.expected = Some("the field to be present".into());
                return p;
            }
            let (value, expected) = match bare.split_once(", expected ") {
                Some((v, x)) => (
                    v.trim_start_matches("invalid type: ").trim_start_matches("invalid value: ").to_owned(),
                    x.to_owned(),
                ),
                None => (String::new(), bare.clone()),
            };
            let field = if path.is_empty() { "body".to_owned() } else { path };
            ApiError::invalid(field, value, expected)
        }
    }
}

/// A path parameter; a malformed one is a 404 (paths name resources).
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no such resource: {e}"))),
        }
    }
}

/// Query parameters; unknown or malformed ones are 400 naming the parameter.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(ApiQuery(v)),
            Err(e) => {
                let text = e.body_text();
                let bare = text.trim_start_matches("Failed to deserialize query string: ").to_owned();
                // `<field>: <message>`, or a serde message naming the field in backticks.
                let field = match bare.split_once(": ") {
                    Some((f, _)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                        f.to_owned()
                    }
                    _ => bare
                        .split_once("field `")
                        .and_then(|(_, r)| r.split('`').next())
                        .map_or("query", |f| f)
                        .to_owned(),
                };
                let mut p =
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", format!("invalid query string: {bare}"));
                p.field = Some(field);
                p.expected = Some("the parameters documented for this operation".into());
                Err(p)
            }
        }
    }
}
