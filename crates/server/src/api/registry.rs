//! The tool registry and capabilities of the caller's tenant.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{RegistryRead, RegistryWrite};
use tidegate_service::registry::{CapabilitySpec, ToolDef, valid_name};
use tidegate_service::tenant::Tenant;
use tidegate_service::tools::ServerTool;

fn tool_out(t: &Tenant, st: &ServerTool) -> ToolOut {
    ToolOut { name: st.name.clone(), signature: t.engine.tool_signature(&st.name), definition: st.def.clone() }
}

fn check_name(what: &str, name: &str) -> ApiResult<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!("{what} name"), name, "1-128 of A-Z a-z 0-9 _ . : -"))
    }
}

/// Define or redefine a tool (an equal definition changes nothing).
#[utoipa::path(
    put, path = "/v1/tools/{name}", tag = "registry", operation_id = "put_tool",
    params(("name" = String, Path, description = "Tool name")),
    request_body = ToolDef,
    responses(
        (status = 200, description = "Unchanged or redefined", body = ToolOut),
        (status = 201, description = "Defined", body = ToolOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_tool(
    caller: Caller<RegistryWrite>,
    ApiPath(name): ApiPath<String>,
    ApiJson(def): ApiJson<ToolDef>,
) -> ApiResult<(StatusCode, Json<ToolOut>)> {
    let t = &caller.tenant;
    check_name("tool", &name)?;
    def.validate().map_err(|(f, v, e)| ApiError::invalid(f, v, e))?;
    let existed = t.tool(&name).is_some();
    t.put_tool(&name, def)?;
    let st = t.tool(&name).ok_or_else(|| ApiError::internal("the tool vanished"))?;
    Ok((if existed { StatusCode::OK } else { StatusCode::CREATED }, Json(tool_out(t, &st))))
}

/// A tool.
#[utoipa::path(
    get, path = "/v1/tools/{name}", tag = "registry", operation_id = "get_tool",
    params(("name" = String, Path, description = "Tool name")),
    responses(
        (status = 200, description = "The tool", body = ToolOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_tool(caller: Caller<RegistryRead>, ApiPath(name): ApiPath<String>) -> ApiResult<Json<ToolOut>> {
    let t = &caller.tenant;
    let st = t.tool(&name).ok_or_else(|| ApiError::not_found("tool", &name))?;
    Ok(Json(tool_out(t, &st)))
}

/// Remove a tool from the registry (its recorded effects still settle).
#[utoipa::path(
    delete, path = "/v1/tools/{name}", tag = "registry", operation_id = "delete_tool",
    params(("name" = String, Path, description = "Tool name")),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_tool(caller: Caller<RegistryWrite>, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    if caller.tenant.remove_tool(&name)? { Ok(StatusCode::NO_CONTENT) } else { Err(ApiError::not_found("tool", &name)) }
}

/// Every tool.
#[utoipa::path(
    get, path = "/v1/tools", tag = "registry", operation_id = "list_tools",
    responses(
        (status = 200, description = "Every tool", body = ToolList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_tools(caller: Caller<RegistryRead>) -> ApiResult<Json<ToolList>> {
    let t = &caller.tenant;
    let data = t.tools().iter().map(|st| tool_out(t, st)).collect();
    Ok(Json(ToolList { data, has_more: false, next_cursor: None }))
}

/// Define or replace a capability.
#[utoipa::path(
    put, path = "/v1/capabilities/{name}", tag = "registry", operation_id = "put_capability",
    params(("name" = String, Path, description = "Capability name")),
    request_body = CapabilitySpec,
    responses(
        (status = 200, description = "Replaced", body = CapabilityOut),
        (status = 201, description = "Defined", body = CapabilityOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_capability(
    State(state): State<AppState>,
    caller: Caller<RegistryWrite>,
    ApiPath(name): ApiPath<String>,
    ApiJson(spec): ApiJson<CapabilitySpec>,
) -> ApiResult<(StatusCode, Json<CapabilityOut>)> {
    let t = &caller.tenant;
    check_name("capability", &name)?;
    spec.validate(&state.config().dispatch.allowed_webhook_hosts).map_err(|(f, v, e)| ApiError::invalid(f, v, e))?;
    let existed = t.dispatcher.capability(&name).is_some();
    t.put_capability(&name, spec.clone())?;
    Ok((if existed { StatusCode::OK } else { StatusCode::CREATED }, Json(CapabilityOut { name, spec })))
}

/// A capability.
#[utoipa::path(
    get, path = "/v1/capabilities/{name}", tag = "registry", operation_id = "get_capability",
    params(("name" = String, Path, description = "Capability name")),
    responses(
        (status = 200, description = "The capability", body = CapabilityOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_capability(
    caller: Caller<RegistryRead>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<CapabilityOut>> {
    let spec = caller.tenant.dispatcher.capability(&name).ok_or_else(|| ApiError::not_found("capability", &name))?;
    Ok(Json(CapabilityOut { name, spec }))
}

/// Delete a capability (refused while a tool names it).
#[utoipa::path(
    delete, path = "/v1/capabilities/{name}", tag = "registry", operation_id = "delete_capability",
    params(("name" = String, Path, description = "Capability name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_capability(caller: Caller<RegistryWrite>, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    if caller.tenant.delete_capability(&name)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("capability", &name))
    }
}

/// Every capability.
#[utoipa::path(
    get, path = "/v1/capabilities", tag = "registry", operation_id = "list_capabilities",
    responses(
        (status = 200, description = "Every capability", body = CapabilityList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_capabilities(caller: Caller<RegistryRead>) -> ApiResult<Json<CapabilityList>> {
    let data =
        caller.tenant.dispatcher.capabilities().into_iter().map(|(name, spec)| CapabilityOut { name, spec }).collect();
    Ok(Json(CapabilityList { data, has_more: false, next_cursor: None }))
}
