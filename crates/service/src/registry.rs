//! Tool definitions and capability specs as the API and the catalog hold them, and the
//! templates that turn a call's arguments into scopes and keys.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_runtime::EffectClass;

/// An effect class on the wire (docs/engine.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WireClass {
    /// Executes at once; compensated on abort.
    Reversible,
    /// As reversible; the compensation may leave residue.
    ReversibleWithCost,
    /// Staged; applied at commit.
    Bufferable,
    /// Irreversible; held until commit.
    Gated,
    /// Executes at once under a provider-side key.
    Idempotent,
}

impl From<WireClass> for EffectClass {
    fn from(c: WireClass) -> EffectClass {
        match c {
            WireClass::Reversible => EffectClass::Reversible,
            WireClass::ReversibleWithCost => EffectClass::ReversibleWithCost,
            WireClass::Bufferable => EffectClass::Bufferable,
            WireClass::Gated => EffectClass::Gated,
            WireClass::Idempotent => EffectClass::Idempotent,
        }
    }
}

impl WireClass {
    /// From the engine's class (`None` for a class this build does not know).
    pub fn from_engine(c: EffectClass) -> Option<WireClass> {
        Some(match c {
            EffectClass::Reversible => WireClass::Reversible,
            EffectClass::ReversibleWithCost => WireClass::ReversibleWithCost,
            EffectClass::Bufferable => WireClass::Bufferable,
            EffectClass::Gated => WireClass::Gated,
            EffectClass::Idempotent => WireClass::Idempotent,
            _ => return None,
        })
    }
}

/// A tool registered over the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(examples(
    json!({"class": "gated", "scopes": ["retail:order:{order_id}"], "key": "invoice:{order_id}", "call": "billing",
        "description": "Sends the invoice of an order."})
)))]
pub struct ToolDef {
    /// The effect class.
    pub class: WireClass,
    /// Scope templates, e.g. `retail:order:{order_id}` (at least one).
    pub scopes: Vec<String>,
    /// Key template (default: `<tx id>:<tool>:<n>`, unique per call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Capability that executes the call (eager classes) or releases it at commit (held).
    pub call: String,
    /// Capability that compensates an executed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate: Option<String>,
    /// Capability that answers whether a call with a key took effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Free text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl ToolDef {
    /// The capabilities the definition names.
    pub fn capabilities(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.call.as_str()).chain(self.compensate.as_deref()).chain(self.probe.as_deref())
    }

    /// Checks templates and limits; returns `(field, value, expected)` on the first problem.
    pub fn validate(&self) -> Result<(), (String, String, &'static str)> {
        if self.scopes.is_empty() || self.scopes.len() > 64 {
            return Err(("scopes".into(), format!("{} templates", self.scopes.len()), "1 to 64 scope templates"));
        }
        for (i, s) in self.scopes.iter().enumerate() {
            Template::parse(s).map_err(|e| (format!("scopes[{i}]"), s.clone(), e))?;
        }
        if let Some(k) = &self.key {
            Template::parse(k).map_err(|e| ("key".into(), k.clone(), e))?;
        }
        for (field, cap) in
            [("call", Some(&self.call)), ("compensate", self.compensate.as_ref()), ("probe", self.probe.as_ref())]
        {
            if let Some(c) = cap
                && !valid_name(c)
            {
                return Err((field.into(), c.clone(), "a capability name: 1-128 of A-Z a-z 0-9 _ . : -"));
            }
        }
        if self.description.as_ref().is_some_and(|d| d.len() > 4096) {
            return Err(("description".into(), "(too long)".into(), "at most 4096 bytes"));
        }
        Ok(())
    }
}

/// Longest deadline of a worker capability's tasks (365 days).
pub const MAX_TASK_DEADLINE_MS: u64 = 365 * 86_400_000;

/// A capability: where the server dispatches an operation. Its OpenAPI schema is written by
/// hand ([`PartialSchema`](utoipa::PartialSchema) below): the derived one combined each
/// variant's `additionalProperties: false` with the `kind` tag in an `allOf`, which no value
/// satisfies (found by scripts/fuzz-api.sh).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CapabilitySpec {
    /// An HTTP webhook the server POSTs to.
    Webhook(WebhookSpec),
    /// A queue that pull workers serve.
    Worker(WorkerSpec),
}

/// An HTTP webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    /// `http://` or `https://` URL.
    pub url: String,
    /// Timeout of one request in milliseconds (default `dispatch.webhook_timeout_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Attempts in all, 1-20 (default `dispatch.webhook_attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Backoff before the second attempt, doubled each time, in milliseconds (default
    /// `dispatch.webhook_backoff_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
}

/// A pull-worker queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// Lease of a task a worker took, in milliseconds (default `dispatch.task_lease_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_lease_ms: Option<u64>,
    /// If set, a task no worker settled within this many milliseconds of its creation
    /// settles by itself: `failed` if no worker ever leased it, else `unknown` (1 to
    /// 31536000000, 365 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Tasks in all for one operation, 1-20, when workers report `not_applied` with `retry:
    /// true` (default `dispatch.webhook_attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Backoff before the second task, doubled each time, in milliseconds (default
    /// `dispatch.webhook_backoff_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for CapabilitySpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
        use utoipa::openapi::{Discriminator, RefOr};
        // Each variant: the kind tag, then the variant's own fields, nothing else.
        let variant = |kind: &str, fields: RefOr<Schema>, description: &str| -> RefOr<Schema> {
            let mut b = ObjectBuilder::new()
                .property("kind", ObjectBuilder::new().schema_type(Type::String).enum_values(Some([kind])))
                .required("kind")
                .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
                .description(Some(description));
            if let RefOr::T(Schema::Object(o)) = fields {
                for (name, schema) in o.properties {
                    b = b.property(name, schema);
                }
                for r in o.required {
                    b = b.required(r);
                }
            }
            b.into()
        };
        OneOfBuilder::new()
            .item(variant(
                "webhook",
                <WebhookSpec as utoipa::PartialSchema>::schema(),
                "An HTTP webhook the server POSTs to.",
            ))
            .item(variant(
                "worker",
                <WorkerSpec as utoipa::PartialSchema>::schema(),
                "A queue that pull workers serve.",
            ))
            .discriminator(Some(Discriminator::new("kind")))
            .examples([
                serde_json::json!({"kind": "webhook", "url": "https://hooks.example.com/tidegate/billing",
                    "timeout_ms": 5000, "attempts": 4, "backoff_ms": 100}),
                serde_json::json!({"kind": "worker", "task_lease_ms": 30000, "deadline_ms": 600000}),
            ])
            .description(Some("A capability: where the server dispatches an operation."))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for CapabilitySpec {}

impl CapabilitySpec {
    /// Checks the spec; returns `(field, value, expected)` on the first problem.
    pub fn validate(&self, allowed_hosts: &[String]) -> Result<(), (String, String, &'static str)> {
        match self {
            CapabilitySpec::Webhook(w) => {
                let url = reqwest::Url::parse(&w.url)
                    .map_err(|_| ("url".to_owned(), w.url.clone(), "an absolute http:// or https:// URL"))?;
                if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                    return Err(("url".into(), w.url.clone(), "an absolute http:// or https:// URL"));
                }
                if !allowed_hosts.is_empty()
                    && !url.host_str().is_some_and(|h| allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
                {
                    return Err(("url".into(), w.url.clone(), "a host listed in dispatch.allowed_webhook_hosts"));
                }
                if w.timeout_ms.is_some_and(|t| t == 0 || t > 600_000) {
                    return Err(("timeout_ms".into(), shown(w.timeout_ms), "1 to 600000 milliseconds"));
                }
                if w.attempts.is_some_and(|a| a == 0 || a > 20) {
                    return Err(("attempts".into(), shown(w.attempts), "1 to 20 attempts"));
                }
                if w.backoff_ms.is_some_and(|b| b > 60_000) {
                    return Err(("backoff_ms".into(), shown(w.backoff_ms), "at most 60000 milliseconds"));
                }
            }
            CapabilitySpec::Worker(w) => {
                if w.task_lease_ms.is_some_and(|t| t == 0 || t > 86_400_000) {
                    return Err(("task_lease_ms".into(), shown(w.task_lease_ms), "1 to 86400000 milliseconds"));
                }
                // At most a year: beyond `i64` it was accepted against the document's `int64`
                // (found by scripts/fuzz-api.sh).
                if w.deadline_ms.is_some_and(|t| t == 0 || t > MAX_TASK_DEADLINE_MS) {
                    return Err((
                        "deadline_ms".into(),
                        shown(w.deadline_ms),
                        "1 to 31536000000 milliseconds (365 days)",
                    ));
                }
                if w.attempts.is_some_and(|a| a == 0 || a > 20) {
                    return Err(("attempts".into(), shown(w.attempts), "1 to 20 attempts"));
                }
                if w.backoff_ms.is_some_and(|b| b > 60_000) {
                    return Err(("backoff_ms".into(), shown(w.backoff_ms), "at most 60000 milliseconds"));
                }
            }
        }
        Ok(())
    }
}

/// Whether `name` is a valid tool or capability name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// A template: literal text with `{path}` holes filled from a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Field(Vec<String>),
}

impl Template {
    /// Parses `text`; `{{` and `}}` are literal braces.
    pub fn parse(text: &str) -> Result<Template, &'static str> {
        if text.is_empty() || text.len() > 1024 {
            return Err("a template of 1 to 1024 bytes");
        }
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut field = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' => field.push(c),
                            _ => {
                                return Err(
                                    "`{field}` holes naming argument members (letters, digits, _ - .), `{{`/`}}` for braces",
                                );
                            }
                        }
                    }
                    let path: Vec<String> = field.split('.').map(str::to_owned).collect();
                    if path.iter().any(String::is_empty) {
                        return Err(
                            "`{field}` holes naming argument members (letters, digits, _ - .), `{{`/`}}` for braces",
                        );
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field(path));
                }
                '}' => return Err("balanced braces (`}}` for a literal `}`)"),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template { parts })
    }

    /// Fills the holes from `args`. A hole must name a string, number or boolean member.
    pub fn render(&self, args: &Value) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Field(path) => {
                    let mut v = args;
                    for seg in path {
                        v = match v.get(seg) {
                            Some(x) => x,
                            None => return Err(format!("args.{} is missing", path.join("."))),
                        };
                    }
                    match v {
                        Value::String(s) => out.push_str(s),
                        Value::Number(n) => out.push_str(&n.to_string()),
                        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                        other => {
                            return Err(format!(
                                "args.{} is {}, not a string, number or boolean",
                                path.join("."),
                                kind_of(other)
                            ));
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// A JSON value's kind, for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An optional number as a client sent it (the value of a bad-input error names what was
/// sent, never Rust's `Some(..)`).
fn shown<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_fill_nested_members_and_escape_braces() {
        let t = Template::parse("retail:order:{order.id}:{{x}}").unwrap();
        assert_eq!(t.render(&json!({"order": {"id": "W1"}})).unwrap(), "retail:order:W1:{x}");
        assert_eq!(Template::parse("n:{n}").unwrap().render(&json!({"n": 42})).unwrap(), "n:42");
        let err = t.render(&json!({"order": {}})).unwrap_err();
        assert!(err.contains("args.order.id is missing"), "{err}");
        let err = Template::parse("x:{a}").unwrap().render(&json!({"a": [1]})).unwrap_err();
        assert!(err.contains("an array"), "{err}");
        for bad in ["", "x:{", "x:}", "x:{}", "x:{a b}", "x:{a..b}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capability_specs_refuse_unknown_fields_and_bad_urls() {
        let ok: CapabilitySpec =
            serde_json::from_value(json!({"kind": "webhook", "url": "http://127.0.0.1:9/x"})).unwrap();
        assert!(ok.validate(&[]).is_ok());
        assert!(
            serde_json::from_value::<CapabilitySpec>(json!({"kind": "webhook", "url": "http://a", "urll": 1})).is_err()
        );
        let bad: CapabilitySpec = serde_json::from_value(json!({"kind": "webhook", "url": "ftp://a/"})).unwrap();
        assert_eq!(bad.validate(&[]).unwrap_err().0, "url");
        let w: CapabilitySpec = serde_json::from_value(json!({"kind": "worker"})).unwrap();
        assert!(w.validate(&[]).is_ok());
    }

    #[test]
    fn a_refused_number_is_named_as_sent() {
        let long: CapabilitySpec =
            serde_json::from_value(json!({"kind": "webhook", "url": "http://127.0.0.1:9/x", "timeout_ms": 900000}))
                .unwrap();
        let (field, value, _) = long.validate(&[]).unwrap_err();
        assert_eq!((field.as_str(), value.as_str()), ("timeout_ms", "900000"));
        let lease: CapabilitySpec = serde_json::from_value(json!({"kind": "worker", "task_lease_ms": 0})).unwrap();
        assert_eq!(lease.validate(&[]).unwrap_err().1, "0");
    }
}
