//! The API's wire types (kept apart from engine types; docs/server.md owns the format), one
//! file per resource. Everything is re-exported here, so a handler imports `super::wire::*`;
//! a component's name in the OpenAPI document is the type's bare name, wherever it lives.

use serde_json::Value;

/// A page of a list: `$name { data: Vec<$item>, has_more, next_cursor }`. Every list
/// endpoint answers this shape; the module that owns `$item` declares its list.
macro_rules! list_type {
    ($name:ident, $item:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Serialize, ToSchema)]
        pub struct $name {
            /// The page.
            pub data: Vec<$item>,
            /// Whether more follow.
            pub has_more: bool,
            /// Pass as `cursor` for the next page.
            pub next_cursor: Option<String>,
        }
    };
}

mod attention;
mod console;
mod effects;
mod groups;
mod keys;
mod ledger;
mod meta;
mod registry;
mod tasks;
mod transactions;

pub use attention::*;
pub use console::*;
pub use effects::*;
pub use groups::*;
pub use keys::*;
pub use ledger::*;
pub use meta::*;
pub use registry::*;
pub use tasks::*;
pub use transactions::*;

/// The default of an `args` field: `{}`.
fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}
