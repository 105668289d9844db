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

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tidegate_core::{EffectClass, EffectId, TxId};

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

/// An opaque value that travels with one call: the caller passes it with the call
/// ([`crate::CallOptions::handle`]) and every handler of that effect (the call, its release,
/// compensation and probe) receives it in its [`CallCtx`], for as long as the transaction is
/// unfinished. A language binding carries its live objects this way (the arguments as they
/// were passed, a slot for the live output) instead of a task-local or a side table. Not
/// recorded in the ledger: after a restart, handlers get `None`.
#[derive(Clone)]
pub struct CallHandle(pub Arc<dyn Any + Send + Sync>);

impl CallHandle {
    /// Wraps `value`.
    pub fn new<T: Any + Send + Sync>(value: T) -> CallHandle {
        CallHandle(Arc::new(value))
    }

    /// The value, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for CallHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallHandle(..)")
    }
}

/// What a handler declared with [`ToolBuilder::call_ctx`], [`ToolBuilder::compensate_ctx`]
/// or [`ToolBuilder::probe_ctx`] knows about the call it serves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CallCtx {
    /// The transaction.
    pub tx: TxId,
    /// The effect's issuance position in it.
    pub effect: EffectId,
    /// The adapter's idempotency key, if the call had one (a provider-side key). A handler
    /// run by recovery in a later process gets it from the call's ledger record.
    pub key: Option<Arc<str>>,
    /// The caller's name for the call ([`crate::CallOptions::call_id`]), if any.
    pub call_id: Option<Arc<str>>,
    /// The caller's per-call handle, while the transaction is unfinished in this process.
    pub handle: Option<CallHandle>,
}

impl CallCtx {
    /// A context that knows only the effect.
    pub fn bare(tx: TxId, effect: EffectId) -> CallCtx {
        CallCtx { tx, effect, key: None, call_id: None, handle: None }
    }
}

type CallFn = dyn Fn(CallCtx, Arc<Value>) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync;
type CompFn =
    dyn Fn(CallCtx, Arc<Value>, Arc<Value>) -> BoxFuture<'static, Result<Compensation, ToolError>> + Send + Sync;
type ProbeFn = dyn Fn(CallCtx, Arc<Value>) -> BoxFuture<'static, Probe> + Send + Sync;
type ScopeFn = dyn Fn(&Value) -> Vec<String> + Send + Sync;
type KeyFn = dyn Fn(&Value) -> String + Send + Sync;

/// What identifies a tool's declaration besides its name: two builds of the same declaration
/// (a tool built again in another task, or after a restart) are the same tool; a
/// declaration that differs in any of these is another tool.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Signature {
    class: EffectClass,
    keyed: bool,
    compensable: bool,
    probe: bool,
    version: Option<Arc<str>>,
}

impl Signature {
    /// What differs from `other`, for error messages.
    fn differences(&self, other: &Signature) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let mut d = Vec::new();
        if self.class != other.class {
            d.push(format!("class {} vs {}", self.class, other.class));
        }
        if self.keyed != other.keyed {
            d.push(format!("key derivation {} vs {}", yes_no(self.keyed), yes_no(other.keyed)));
        }
        if self.compensable != other.compensable {
            d.push(format!("compensation {} vs {}", yes_no(self.compensable), yes_no(other.compensable)));
        }
        if self.probe != other.probe {
            d.push(format!("probe {} vs {}", yes_no(self.probe), yes_no(other.probe)));
        }
        if self.version != other.version {
            let v = |x: &Option<Arc<str>>| x.as_deref().map_or_else(|| "none".to_owned(), |s| format!("{s:?}"));
            d.push(format!("version {} vs {}", v(&self.version), v(&other.version)));
        }
        d.join(", ")
    }
}

struct ToolInner {
    name: Arc<str>,
    signature: Signature,
    class: EffectClass,
    scope: Option<Box<ScopeFn>>,
    key: Option<Box<KeyFn>>,
    call: Box<CallFn>,
    compensate: Option<Box<CompFn>>,
    probe: Option<Box<ProbeFn>>,
    wants_ctx: bool,
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
        ToolBuilder {
            name: name.into(),
            class,
            scope: None,
            key: None,
            call: None,
            compensate: None,
            probe: None,
            version: None,
            uncompensated: false,
            wants_ctx: false,
        }
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

    /// The scopes its extractor gives for `args`; `None` for a tool declared without one
    /// (every call must then name its scopes, `CallOptions::scopes`).
    pub(crate) fn scopes(&self, args: &Value) -> Option<Vec<String>> {
        self.inner.scope.as_ref().map(|f| f(args))
    }

    pub(crate) fn key(&self, args: &Value) -> Option<String> {
        self.inner.key.as_ref().map(|k| k(args))
    }

    /// Whether a handler takes a [`CallCtx`] (so the engine keeps each call's context until
    /// its transaction finishes; tools without one cost nothing for it).
    pub(crate) fn wants_ctx(&self) -> bool {
        self.inner.wants_ctx
    }

    pub(crate) fn invoke(&self, ctx: CallCtx, args: Arc<Value>) -> BoxFuture<'static, Result<Value, ToolError>> {
        (self.inner.call)(ctx, args)
    }

    pub(crate) fn compensate_call(
        &self,
        ctx: CallCtx,
        args: Arc<Value>,
        output: Arc<Value>,
    ) -> Option<BoxFuture<'static, Result<Compensation, ToolError>>> {
        self.inner.compensate.as_ref().map(|c| c(ctx, args, output))
    }

    pub(crate) fn probe_call(&self, ctx: CallCtx, args: Arc<Value>) -> Option<BoxFuture<'static, Probe>> {
        self.inner.probe.as_ref().map(|p| p(ctx, args))
    }

    /// Whether `other` is the same declaration: the same build, or a build with the same
    /// name and [`Signature`] (its handlers are then taken to be the same code).
    pub(crate) fn same(&self, other: &Tool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.name == other.inner.name && self.inner.signature == other.inner.signature)
    }

    /// How `other`'s declaration differs from this one's, for the error refusing it.
    pub(crate) fn differences(&self, other: &Tool) -> String {
        self.inner.signature.differences(&other.inner.signature)
    }

    /// The declaration's version label, if given ([`ToolBuilder::version`]).
    pub fn version(&self) -> Option<&str> {
        self.inner.signature.version.as_deref()
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
    version: Option<Arc<str>>,
    uncompensated: bool,
    wants_ctx: bool,
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
    /// The scope extractor: the scope(s) a call with these arguments may touch. A tool built
    /// without one (a front door that computes scopes itself, from templates) must be called
    /// with `CallOptions::scopes`; a call that names none is refused before anything is
    /// recorded.
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
        self.call = Some(Box::new(move |_, a| Box::pin(f(a))));
        self
    }

    /// [`ToolBuilder::call`] for a handler that also receives the call's [`CallCtx`].
    pub fn call_ctx<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallCtx, Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        self.call = Some(Box::new(move |ctx, a| Box::pin(f(ctx, a))));
        self.wants_ctx = true;
        self
    }

    /// The compensation: undoes an executed call given its arguments and output.
    pub fn compensate<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<Value>, Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Compensation, ToolError>> + Send + 'static,
    {
        self.compensate = Some(Box::new(move |_, a, o| Box::pin(f(a, o))));
        self
    }

    /// [`ToolBuilder::compensate`] for a handler that also receives the call's [`CallCtx`]
    /// (with the handle the call was made with, while its transaction is unfinished).
    pub fn compensate_ctx<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallCtx, Arc<Value>, Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Compensation, ToolError>> + Send + 'static,
    {
        self.compensate = Some(Box::new(move |ctx, a, o| Box::pin(f(ctx, a, o))));
        self.wants_ctx = true;
        self
    }

    /// The probe: asks the provider whether a call with these arguments took effect.
    pub fn probe<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Probe> + Send + 'static,
    {
        self.probe = Some(Box::new(move |_, a| Box::pin(f(a))));
        self
    }

    /// [`ToolBuilder::probe`] for a handler that also receives the call's [`CallCtx`].
    pub fn probe_ctx<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallCtx, Arc<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Probe> + Send + 'static,
    {
        self.probe = Some(Box::new(move |ctx, a| Box::pin(f(ctx, a))));
        self.wants_ctx = true;
        self
    }

    /// A label for this declaration (`"v2"`, a content hash). A tool is identified by its
    /// name and declaration (class, which handlers it has, and this label): building the
    /// same declaration twice gives the same tool, and registering a different one under a
    /// taken name is refused. Change the label when a handler's code changes meaning.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(Arc::from(version.into()));
        self
    }

    /// Declares on purpose that this reversible tool has no compensation: an aborted
    /// transaction then leaves its effect in place, tagged `unresolved` for an operator.
    /// Without it, a reversible tool with no compensation is refused at build.
    pub fn without_compensation(mut self) -> Self {
        self.uncompensated = true;
        self
    }

    /// Finishes the declaration. Refuses a missing name, scope extractor or call handler,
    /// and a reversible tool with no compensation (unless [`ToolBuilder::without_compensation`]).
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
        let scope = self.scope;
        let Some(call) = self.call else { return Err(invalid("call", "a call handler")) };
        let reversible = matches!(self.class, EffectClass::Reversible | EffectClass::ReversibleWithCost);
        if reversible && self.compensate.is_none() && !self.uncompensated {
            return Err(crate::Error::InvalidArgument {
                field: "compensate",
                value: format!("missing (tool `{}`, class {})", self.name, self.class),
                expected: "a compensation handler, since an abort undoes a reversible effect (declare the tool \
                           `gated` or `idempotent` if it cannot be undone, or call `without_compensation()` to \
                           leave aborted effects `unresolved` on purpose)",
            });
        }
        let signature = Signature {
            class: self.class,
            keyed: self.key.is_some(),
            compensable: self.compensate.is_some(),
            probe: self.probe.is_some(),
            version: self.version,
        };
        Ok(Tool {
            inner: Arc::new(ToolInner {
                name: Arc::from(self.name.as_str()),
                signature,
                class: self.class,
                scope,
                key: self.key,
                call,
                compensate: self.compensate,
                probe: self.probe,
                wants_ctx: self.wants_ctx,
            }),
        })
    }
}
