//! The HTTP API: the router (generated together with its OpenAPI document), middleware
//! (request ids, logs, metrics, limits, authentication, idempotency) and the handlers.
//!
//! ```text
//!  request ─► request id ─► trace ─► metrics ─► global limit (503) ─► auth + tenant limit (429)
//!          ─► idempotency (POST + Idempotency-Key) ─► handler (Caller<P> extractor: 401/403)
//! ```

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

use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
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

/// The API's routes with their OpenAPI document.
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(transactions::begin, transactions::list))
        .routes(routes!(console::stream))
        .routes(routes!(transactions::get))
        .routes(routes!(transactions::read))
        .routes(routes!(transactions::effect))
        .routes(routes!(effects::result))
        .routes(routes!(transactions::seal))
        .routes(routes!(transactions::commit))
        .routes(routes!(transactions::abort))
        .routes(routes!(transactions::outcome))
        .routes(routes!(transactions::events))
        .routes(routes!(transactions::timeline))
        .routes(routes!(transactions::call))
        .routes(routes!(groups::begin))
        .routes(routes!(groups::get))
        .routes(routes!(groups::commit))
        .routes(routes!(groups::abort))
        .routes(routes!(registry::put_tool, registry::get_tool, registry::delete_tool))
        .routes(routes!(registry::list_tools))
        .routes(routes!(registry::put_capability, registry::get_capability, registry::delete_capability))
        .routes(routes!(registry::list_capabilities))
        .routes(routes!(tasks::poll))
        .routes(routes!(tasks::heartbeat))
        .routes(routes!(tasks::report))
        .routes(routes!(tasks::list))
        .routes(routes!(ledger::events))
        .routes(routes!(ledger::attention))
        .routes(routes!(console::resolve))
        .routes(routes!(console::retry))
        .routes(routes!(console::export))
        .routes(routes!(console::series))
        .routes(routes!(review::register_templates, review::list_templates))
        .routes(routes!(review::request))
        .routes(routes!(review::get_one))
        .routes(routes!(review::accept))
        .routes(routes!(review::remove))
        .routes(routes!(review::queue))
        .routes(routes!(plans::open, plans::list))
        .routes(routes!(plans::stuck))
        .routes(routes!(plans::get))
        .routes(routes!(plans::commit))
        .routes(routes!(plans::fail))
        .routes(routes!(plans::signal))
        .routes(routes!(plans::verdict))
        .routes(routes!(plans::arm))
        .routes(routes!(plans::resolve))
        .routes(routes!(keys::create, keys::list))
        .routes(routes!(keys::revoke))
        .routes(routes!(meta::whoami))
        .routes(routes!(meta::openapi_json))
        .routes(routes!(meta::healthz))
        .routes(routes!(meta::readyz))
        .routes(routes!(meta::metrics))
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
