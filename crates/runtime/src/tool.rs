//! Tools and their adapters: the per-tool declaration a user writes.
//!
//! ```
//! use serde_json::json;
//! use tidegate_runtime::{EffectClass, Tool, Compensation};
//!
//! let hotel = Tool::builder("reserve_hotel", EffectClass::Reversible)
//!     .scope(|args| format!("travel:hotel:{}", args["booking"].as_str().unwrap_or_default()))
//!     .call(|args| async move { Ok(json!({"hold": format!("H-{}", args["booking"])})) })
//!     .compensate(|_args, _output| async move { Ok(Compensation::clean()) })
//!     .build()
//!     .expect("a complete declaration");
//! assert_eq!(hotel.name(), "reserve_hotel");
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tidegate_core::EffectClass;

pub use crate::error::ToolError;

/// The result of a compensation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compensation {
    /// Residue the undo left behind (a cancellation fee), reported to the operator.
    pub residue: Option<String>,
}

impl Compensation {
    /// Undone without residue.
    pub fn clean() -> Compensation {
        Compensation { residue: None }
    }

    /// Undone, leaving `residue`.
    pub fn with_residue(residue: impl Into<String>) -> Compensation {
        Compensation { residue: Some(residue.into()) }
    }
}

/// What a probe found out about a call whose outcome was unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// The call took effect, with this output.
    Happened(Value),
    /// The call did not take effect.
    DidNotHappen,
    /// Still unknown.
    Unknown,
}

type CallFn = dyn Fn(Arc<Value>) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync;
type CompFn = dyn Fn(Arc<Value>, Arc<Value>) -> BoxFuture<'static, Result<Compensation, ToolError>> + Send + Sync;
type ProbeFn = dyn Fn(Arc<Value>) -> BoxFuture<'static, Probe> + Send + Sync;
type ScopeFn = dyn Fn(&Value) -> Vec<String> + Send + Sync;
type KeyFn = dyn Fn(&Value) -> String + Send + Sync;

struct ToolInner {
    name: Arc<str>,
    class: EffectClass,
    scope: Box<ScopeFn>,
    key: Option<Box<KeyFn>>,
    call: Box<CallFn>,
    compensate: Option<Box<CompFn>>,
    probe: Option<Box<ProbeFn>>,
}

/// A declared tool: the adapter the engine routes calls through. Cheap to clone.
#[derive(Clone)]
pub struct Tool {
    inner: Arc<ToolInner>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.inner.name)
            .field("class", &self.inner.class)
            .field("compensable", &self.inner.compensate.is_some())
            .field("probe", &self.inner.probe.is_some())
            .finish()
    }
}

impl Tool {
    /// Starts a declaration.
    pub fn builder(name: impl Into<String>, class: EffectClass) -> ToolBuilder {
        ToolBuilder { name: name.into(), class, scope: None, key: None, call: None, compensate: None, probe: None }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.inner.name
    }

    /// The effect class.
    pub fn class(&self) -> EffectClass {
        self.inner.class
    }

    /// Whether a compensation handler exists.
    pub fn compensable(&self) -> bool {
        self.inner.compensate.is_some()
    }

    pub(crate) fn scopes(&self, args: &Value) -> Vec<String> {
        (self.inner.scope)(args)
    }

    pub(crate) fn key(&self, args: &Value) -> Option<String> {
        self.inner.key.as_ref().map(|k| k(args))
    }

    pub(crate) fn invoke(&self, args: Arc<Value>) -> BoxFuture<'static, Result<Value, ToolError>> {
        (self.inner.call)(args)
    }

    pub(crate) fn compensate_call(
        &self,
        args: Arc<Value>,
        output: Arc<Value>,
    ) -> Option<BoxFuture<'static, Result<Compensation, ToolError>>> {
        self.inner.compensate.as_ref().map(|c| c(args, output))
    }

    pub(crate) fn probe_call(&self, args: Arc<Value>) -> Option<BoxFuture<'static, Probe>> {
        self.inner.probe.as_ref().map(|p| p(args))
    }

    pub(crate) fn same(&self, other: &Tool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Builds a [`Tool`].
pub struct ToolBuilder {
    name: String,
    class: EffectClass,
    scope: Option<Box<ScopeFn>>,
    key: Option<Box<KeyFn>>,
    call: Option<Box<CallFn>>,
    compensate: Option<Box<CompFn>>,
    probe: Option<Box<ProbeFn>>,
}

impl fmt::Debug for ToolBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolBuilder").field("name", &self.name).field("class", &self.class).finish_non_exhaustive()
    }
}

/// What a scope extractor may return: one scope or several.
pub trait IntoScopes {
    /// The scope texts.
    fn into_scopes(self) -> Vec<String>;
}

impl IntoScopes for String {
    fn into_scopes(self) -> Vec<String> {
        vec![self]
    }
}

impl IntoScopes for &'static str {
    fn into_scopes(self) -> Vec<String> {
        vec![self.to_owned()]
    }
}

impl IntoScopes for Vec<String> {
    fn into_scopes(self) -> Vec<String> {
        self
    }
}

impl ToolBuilder {
    /// The scope extractor: the scope(s) a call with these arguments may touch. Required.
    pub fn scope<S: IntoScopes>(mut self, f: impl Fn(&Value) -> S + Send + Sync + 'static) -> Self {
        self.scope = Some(Box::new(move |a| f(a).into_scopes()));
        self
    }

    /// The idempotency key derivation. Without one, the engine derives `tool:tx:n`, which
    /// deduplicates retries within one transaction only.
    pub fn key(mut self, f: impl Fn(&Value) -> String + Send + Sync + 'static) -> Self {
        self.key = Some(Box::new(f));
        self
    }

    /// The call itself: executes an eager effect, or releases a held one at commit. Required.
    pub fn call<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        self.call = Some(Box::new(move |a| Box::pin(f(a))));
        self
    }

    /// The compensation: undoes an executed call given its arguments and output.
    pub fn compensate<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<Value>, Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Compensation, ToolError>> + Send + 'static,
    {
        self.compensate = Some(Box::new(move |a, o| Box::pin(f(a, o))));
        self
    }

    /// The probe: asks the provider whether a call with these arguments took effect.
    pub fn probe<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Probe> + Send + 'static,
    {
        self.probe = Some(Box::new(move |a| Box::pin(f(a))));
        self
    }

    /// Finishes the declaration.
    pub fn build(self) -> Result<Tool, crate::Error> {
        let invalid = |field: &'static str, expected: &'static str| crate::Error::InvalidArgument {
            field,
            value: format!("missing (tool `{}`)", self.name),
            expected,
        };
        if self.name.trim().is_empty() {
            return Err(crate::Error::InvalidArgument {
                field: "name",
                value: format!("{:?}", self.name),
                expected: "a non-empty tool name",
            });
        }
        let Some(scope) = self.scope else { return Err(invalid("scope", "a scope extractor")) };
        let Some(call) = self.call else { return Err(invalid("call", "a call handler")) };
        Ok(Tool {
            inner: Arc::new(ToolInner {
                name: Arc::from(self.name.as_str()),
                class: self.class,
                scope,
                key: self.key,
                call,
                compensate: self.compensate,
                probe: self.probe,
            }),
        })
    }
}
