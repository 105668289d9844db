//! The world the agents act on: the sinks, the tools, and the fault injector between them.
//!
//! Every mechanism reaches the sinks only through [`World`], so every call, compensation,
//! probe and reservation passes the same seeded [`Injector`].

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_runtime::EffectClass;

use crate::fault::{FaultClass, Injector};
use crate::sinks::{BufferSink, DbSink, FsSink, MailServer, MailSink, OrderRow, Sink, SinkError, SinkKind};

/// The sinks of one workload run (shared by its trials; trials use distinct effect ids).
#[derive(Debug)]
pub struct Sinks {
    /// In-memory buffer.
    pub buffer: BufferSink,
    /// Files.
    pub fs: FsSink,
    /// Rows and orders.
    pub db: DbSink,
    /// The HTTP mailbox.
    pub mail: MailSink,
}

impl Sinks {
    /// Fresh buffer, directory and database; the mailbox client of `server`.
    pub fn new(server: &MailServer) -> Result<Sinks, SinkError> {
        Ok(Sinks { buffer: BufferSink::new(), fs: FsSink::new()?, db: DbSink::new()?, mail: server.client() })
    }

    /// The sink of a kind.
    pub fn sink(&self, kind: SinkKind) -> &dyn Sink {
        match kind {
            SinkKind::Buffer => &self.buffer,
            SinkKind::Fs => &self.fs,
            SinkKind::Db => &self.db,
            SinkKind::Mail => &self.mail,
        }
    }
}

/// Where a tool's effect lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A generic effect `args.res` in a sink.
    Sink(SinkKind),
    /// An operation `args.op` on order `args.order` (the versioned orders table).
    Orders,
}

/// A tool as the world knows it: where it writes and what its effect really is.
///
/// `class` is the truth (a mail cannot be unsent); what an adapter *declares* to a mechanism
/// may differ (the misclassification ablation and the annotation-error workload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    /// Name.
    pub name: &'static str,
    /// Where the effect lands.
    pub target: Target,
    /// The effect's real class.
    pub class: EffectClass,
}

impl ToolSpec {
    /// A tool writing generic effects to `kind` with class `class`.
    pub const fn sink(name: &'static str, kind: SinkKind, class: EffectClass) -> ToolSpec {
        ToolSpec { name, target: Target::Sink(kind), class }
    }

    /// A tool operating on orders, with class `class`.
    pub const fn orders(name: &'static str, class: EffectClass) -> ToolSpec {
        ToolSpec { name, target: Target::Orders, class }
    }

    /// Whether the provider can undo it.
    pub fn undoable(&self) -> bool {
        self.class != EffectClass::Gated
    }

    /// The scope a call touches: `retail:order:<order>` for orders, otherwise a scope per
    /// effect id in the sink's scope type.
    pub fn scope(&self, args: &Value) -> String {
        let s = |k: &str| args[k].as_str().unwrap_or_default().to_owned();
        if let Some(sc) = args["scope"].as_str() {
            return sc.to_owned();
        }
        match self.target {
            Target::Orders => format!("retail:order:{}", s("order")),
            Target::Sink(SinkKind::Buffer) => format!("kv:{}", s("res")),
            Target::Sink(SinkKind::Fs) => format!("fs:/eval/{}", s("res").replace(':', "/")),
            Target::Sink(SinkKind::Db) => format!("db:rows:{}", s("res")),
            Target::Sink(SinkKind::Mail) => format!("mail:{}", s("res")),
        }
    }
}

/// Why a call through the world failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Known not to have taken effect (F1, F3); worth retrying.
    Transient(String),
    /// May or may not have taken effect (F2, F5).
    Unknown(String),
    /// A business failure (scripted): retrying does not help.
    Failed(String),
}

impl CallError {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            CallError::Transient(m) | CallError::Unknown(m) | CallError::Failed(m) => m,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

fn sink_err(e: SinkError) -> CallError {
    CallError::Failed(format!("provider error: {e}"))
}

/// An order as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The order's status (`-` for non-order scopes).
    pub status: String,
    /// Its version.
    pub version: u64,
}

/// One trial's view of the world: shared sinks, its own injector.
#[derive(Debug)]
pub struct World {
    /// The sinks.
    pub sinks: Arc<Sinks>,
    faults: Mutex<Injector>,
}

impl World {
    /// A world over `sinks` with `faults`.
    pub fn new(sinks: Arc<Sinks>, faults: Injector) -> World {
        World { sinks, faults: Mutex::new(faults) }
    }

    /// Faults injected so far, by class.
    pub fn injected(&self) -> [u64; 5] {
        self.faults.lock().injected
    }

    /// A seeded draw in `[lo, hi)` from the trial's generator (think times).
    pub fn uniform(&self, lo: u64, hi: u64) -> u64 {
        self.faults.lock().uniform(lo, hi)
    }

    /// Reads a scope: orders return their row; other scopes have no state (version 0).
    pub fn observe(&self, scope: &str) -> Result<Observed, CallError> {
        match scope.strip_prefix("retail:order:") {
            Some(id) => {
                let OrderRow { status, version, .. } = self.sinks.db.order(id).map_err(sink_err)?;
                Ok(Observed { status, version })
            }
            None => Ok(Observed { status: "-".into(), version: 0 }),
        }
    }

    fn apply(&self, tool: &ToolSpec, args: &Value, key: Option<&str>) -> Result<(), CallError> {
        let s = |k: &str| args[k].as_str().unwrap_or_default();
        match tool.target {
            Target::Orders => self
                .sinks
                .db
                .apply_order(s("res"), s("order"), s("op"), args["based_on"].as_u64().unwrap_or(0), key)
                .map_err(sink_err),
            Target::Sink(kind) => self.sinks.sink(kind).apply(s("res"), &args["body"], key).map_err(sink_err),
        }
    }

    /// Calls the tool: a scripted failure (`args.fail`), or the effect through the injector.
    pub fn invoke(&self, tool: &ToolSpec, args: &Value, key: Option<&str>) -> Result<(), CallError> {
        if args["fail"].as_bool() == Some(true) {
            return Err(CallError::Failed(format!("{} refused the request", tool.name)));
        }
        let fault = self.faults.lock().on_call();
        match fault {
            None | Some(FaultClass::F3) => self.apply(tool, args, key),
            Some(FaultClass::F1) => Err(CallError::Transient(format!("{}: F1 connection refused", tool.name))),
            Some(FaultClass::F2) => {
                self.apply(tool, args, key)?;
                Err(CallError::Unknown(format!("{}: F2 connection reset after the request", tool.name)))
            }
            Some(FaultClass::F4) => {
                self.apply(tool, args, key)?;
                self.apply(tool, args, key)
            }
            Some(FaultClass::F5) => {
                if self.faults.lock().coin() {
                    self.apply(tool, args, key)?;
                }
                Err(CallError::Unknown(format!("{}: F5 timed out", tool.name)))
            }
        }
    }

    /// Undoes one application of the call's effect (F3 may fail the attempt). Irreversible
    /// effects cannot be undone.
    pub fn undo(&self, tool: &ToolSpec, args: &Value) -> Result<(), CallError> {
        if !tool.undoable() {
            return Err(CallError::Failed(format!("{} cannot be undone", tool.name)));
        }
        if self.faults.lock().on_compensation() {
            return Err(CallError::Transient(format!("{}: F3 compensation failed", tool.name)));
        }
        let res = args["res"].as_str().unwrap_or_default();
        match tool.target {
            Target::Orders => self.sinks.db.undo_order(res).map_err(sink_err),
            Target::Sink(kind) => self.sinks.sink(kind).undo(res).map_err(sink_err),
        }
    }

    /// Asks the provider whether an application under `key` happened.
    pub fn probe(&self, tool: &ToolSpec, key: &str) -> Result<bool, CallError> {
        match tool.target {
            Target::Orders | Target::Sink(SinkKind::Db) => self.sinks.db.applied_key(key),
            Target::Sink(kind) => self.sinks.sink(kind).applied_key(key),
        }
        .map_err(sink_err)
    }

    /// TCC try: a reservation at the provider (faults as for a call; F2/F4/F5 leave an
    /// orphan reservation, which is never visible).
    pub fn reserve(&self, tool: &ToolSpec, args: &Value) -> Result<String, CallError> {
        if args["fail"].as_bool() == Some(true) {
            return Err(CallError::Failed(format!("{} refused the request", tool.name)));
        }
        let fault = self.faults.lock().on_call();
        let kind = match tool.target {
            Target::Orders => SinkKind::Db,
            Target::Sink(k) => k,
        };
        let body = json!({"args": args});
        let res = args["res"].as_str().unwrap_or_default();
        match fault {
            Some(FaultClass::F1) => Err(CallError::Transient(format!("{}: F1 on try", tool.name))),
            Some(FaultClass::F2 | FaultClass::F5) => {
                self.sinks.sink(kind).reserve(res, &body).map_err(sink_err)?;
                Err(CallError::Unknown(format!("{}: lost the try's answer", tool.name)))
            }
            _ => self.sinks.sink(kind).reserve(res, &body).map_err(sink_err),
        }
    }

    /// TCC confirm (faults as for a call; confirm is idempotent per reservation).
    pub fn confirm(&self, tool: &ToolSpec, args: &Value, id: &str) -> Result<(), CallError> {
        let fault = self.faults.lock().on_call();
        let go = || -> Result<(), CallError> {
            match tool.target {
                // An order confirm applies the held operation itself.
                Target::Orders => self.apply(tool, args, Some(id)),
                Target::Sink(kind) => self.sinks.sink(kind).confirm(id).map_err(sink_err),
            }
        };
        match fault {
            Some(FaultClass::F1) => Err(CallError::Transient(format!("{}: F1 on confirm", tool.name))),
            Some(FaultClass::F2) => {
                go().and(Err(CallError::Unknown(format!("{}: lost the confirm's answer", tool.name))))
            }
            Some(FaultClass::F4) => go().and_then(|()| go()),
            Some(FaultClass::F5) => {
                if self.faults.lock().coin() {
                    go()?;
                }
                Err(CallError::Unknown(format!("{}: confirm timed out", tool.name)))
            }
            _ => go(),
        }
    }

    /// TCC cancel (F3 may fail the attempt).
    pub fn cancel(&self, tool: &ToolSpec, id: &str) -> Result<(), CallError> {
        if self.faults.lock().on_compensation() {
            return Err(CallError::Transient(format!("{}: F3 cancel failed", tool.name)));
        }
        match tool.target {
            Target::Orders => Ok(()),
            Target::Sink(kind) => self.sinks.sink(kind).cancel(id).map_err(sink_err),
        }
    }

    /// Ground truth: live applications of the call's effect.
    pub fn live(&self, tool: &ToolSpec, args: &Value) -> Result<u64, SinkError> {
        let res = args["res"].as_str().unwrap_or_default();
        match tool.target {
            Target::Orders => self.sinks.db.order_ops_live(res),
            Target::Sink(kind) => self.sinks.sink(kind).live(res),
        }
    }
}
