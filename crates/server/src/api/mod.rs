//! The HTTP API: the router (generated together with its OpenAPI document), middleware
//! (request ids, logs, metrics, limits, authentication, idempotency) and the handlers.
//!
//! ```text
//!  request ─► request id ─► trace ─► metrics ─► global limit (503) ─► auth + tenant limit (429)
//!          ─► idempotency (POST + Idempotency-Key) ─► handler (Caller<P> extractor: 401/403)
//! ```

mod common;
mod console;
pub mod effects;
pub mod extract;
mod groups;
mod keys;
mod ledger;
mod meta;
mod middleware;
pub mod plans;
pub mod problem;
mod registry;
pub mod review;
mod tasks;
mod transactions;
mod wait;
pub mod wire;

use std::collections::BTreeMap;

use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use crate::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tidegate",
        version = "1",
        description = "Transactions over AI agents' tool calls, as a service. See docs/server.md."
    ),
    modifiers(&BearerAuth),
    components(schemas(problem::Problem)),
    tags(
        (name = "transactions", description = "Transactions: begin, read, effects, seal, commit, abort, wait"),
        (name = "groups", description = "Speculation groups"),
        (name = "registry", description = "Tools and capabilities"),
        (name = "tasks", description = "Pull-worker tasks"),
        (name = "ledger", description = "Ledger queries"),
        (name = "keys", description = "API keys of the caller's tenant"),
        (name = "plans", description = "Plans: steps whose compensations are held until the plan commits (docs/plans.md)"),
        (name = "review", description = "Review of LLM-generated database transactions (docs/review.md)"),
        (name = "meta", description = "Identity, health, metrics, this document")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("tgk_<id>_<secret>")
                    .description(Some("An API key of one tenant (`tidegate key create`)."))
                    .build(),
            ),
        );
    }
}

/// Every route with the schemas it names and its path item, in the order they are mounted.
fn method_routers() -> Vec<UtoipaMethodRouter<AppState>> {
    vec![
        routes!(transactions::begin, transactions::list),
        routes!(console::stream),
        routes!(transactions::get),
        routes!(transactions::read),
        routes!(transactions::effect),
        routes!(effects::result),
        routes!(transactions::seal),
        routes!(transactions::commit),
        routes!(transactions::abort),
        routes!(transactions::outcome),
        routes!(transactions::events),
        routes!(transactions::timeline),
        routes!(transactions::call),
        routes!(transactions::batch),
        routes!(groups::begin),
        routes!(groups::get),
        routes!(groups::commit),
        routes!(groups::abort),
        routes!(registry::put_tool, registry::get_tool, registry::delete_tool),
        routes!(registry::list_tools),
        routes!(registry::put_capability, registry::get_capability, registry::delete_capability),
        routes!(registry::list_capabilities),
        routes!(tasks::poll),
        routes!(tasks::heartbeat),
        routes!(tasks::report),
        routes!(tasks::list),
        routes!(ledger::events),
        routes!(ledger::attention),
        routes!(console::resolve),
        routes!(console::retry),
        routes!(console::export),
        routes!(console::series),
        routes!(review::register_templates, review::list_templates),
        routes!(review::request),
        routes!(review::get_one),
        routes!(review::accept),
        routes!(review::remove),
        routes!(review::queue),
        routes!(plans::open, plans::list),
        routes!(plans::stuck),
        routes!(plans::get),
        routes!(plans::commit),
        routes!(plans::fail),
        routes!(plans::signal),
        routes!(plans::verdict),
        routes!(plans::arm),
        routes!(plans::resolve),
        routes!(keys::create, keys::list),
        routes!(keys::revoke),
        routes!(meta::whoami),
        routes!(meta::cluster),
        routes!(meta::openapi_json),
        routes!(meta::healthz),
        routes!(meta::readyz),
        routes!(meta::metrics),
    ]
}

/// The API's routes with their OpenAPI document.
pub fn api_router() -> OpenApiRouter<AppState> {
    method_routers().into_iter().fold(OpenApiRouter::with_openapi(ApiDoc::openapi()), OpenApiRouter::routes)
}

/// Component names that stand for more than one schema, each with the schemas it was given.
/// utoipa names a component after the type's bare name (not its module path) and keeps the
/// last one mounted, so two request types of the same name document one route with the
/// other's body (issue 26: the attention list's `ResolveIn {action, note}` was documented as
/// the plans' `ResolveIn {choice}`). Empty when every name is one schema; checked by a test.
pub fn schema_name_collisions() -> Vec<String> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let declared = ApiDoc::openapi().components.map(|c| c.schemas).unwrap_or_default();
    let collected = method_routers().into_iter().flat_map(|(schemas, _, _)| schemas);
    for (name, schema) in declared.into_iter().chain(collected) {
        let json = serde_json::to_string(&schema).unwrap_or_default();
        let versions = seen.entry(name).or_default();
        if !versions.contains(&json) {
            versions.push(json);
        }
    }
    seen.into_iter()
        .filter(|(_, versions)| versions.len() > 1)
        .map(|(name, versions)| format!("`{name}` is {} different schemas: {}", versions.len(), versions.join(" | ")))
        .collect()
}

/// The OpenAPI document (what `/v1/openapi.json` serves and docs/openapi.json holds).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().into_openapi()
}

/// The OpenAPI document as committed: pretty JSON with a final newline.
pub fn openapi_json() -> String {
    let mut s = serde_json::to_string_pretty(&openapi()).unwrap_or_default();
    s.push('\n');
    s
}

/// The complete application: routes, `extra` routes (later issues mount theirs here; they
/// get the same middleware and use the same `Caller` extractor), fallbacks and middleware.
pub fn app(state: AppState, extra: Router<AppState>) -> Router {
    let (router, _) = api_router().split_for_parts();
    middleware::wrap(router.merge(review::page_routes()).merge(console::page_routes()).merge(extra), state)
}
