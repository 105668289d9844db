//! The policy file: which upstreams the gateway starts, and what each of their tools is.
//!
//! ```toml
//! version = "2026-11-28"          # recorded with every governed tool (optional)
//! default = "refuse"              # undeclared tools: "refuse" (default) or "gated"
//!
//! [gateway]
//! store = "sqlite:.tidegate-mcp"  # the ledger: "memory:", "sqlite:DIR" or a directory
//! level = "L4"                    # the engine's level, L0..L4
//! call_timeout_ms = 30000         # one upstream call, at most
//! approval_timeout_ms = 120000    # an approval request expires after this
//! # server = "http://127.0.0.1:8080"  # attached: the ledger is this Tidegate server's (no store)
//! # api_key_env = "TIDEGATE_API_KEY"  # attached: the variable holding the API key
//! # name = "mcp"                      # attached: capabilities <name>.<upstream>, tools <name>.<upstream>.<tool>
//! # server_patience_ms = 120000       # attached: how long a request the server does not answer is sent again
//!
//! [turn]
//! mode = "turn"                   # "turn": one transaction per turn; "per_call"
//! idle_ms = 300000                # a turn with no call for this long ends...
//! on_idle = "abort"               # ...by "abort" (default) or "commit"
//!
//! [upstreams.memory]
//! command = "npx"                 # stdio: a child process (command, args, env, cwd)
//! args = ["-y", "@modelcontextprotocol/server-memory"]
//!
//! [[tools]]
//! upstream = "memory"
//! match = "create_entities"      # a glob over the upstream's tool names
//! class = "reversible"
//! scopes = ["kg:entity:{args.entities[*].name}"]
//! compensate = { tool = "delete_entities", args = { entityNames = "{result.entities[*].name}" } }
//! probe = { tool = "open_nodes", args = { names = "{args.entities[*].name}" }, found = "result.entities[*]" }
//! approval = false                # true: each call waits for a person's approval first
//! ```
//!
//! Every table refuses keys it does not know. Every error names the file, the line and the
//! key ([`PolicyError`]); checks that need the upstreams' tool lists (a template naming an
//! argument the tool does not take, a compensation tool the upstream does not have) are made
//! by [`Policy::bind`] at start, with the same precision. Templates: [`crate::template`].

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};

use globset::{Glob, GlobMatcher};
use serde::Deserialize;
use serde_json::{Map, Value};
use tidegate_runtime::{EffectClass, Level, StoreUrl};
use toml::Spanned;

use crate::template::{Path, Root, Step, Template, ValueTemplate};

/// The largest policy file read, in bytes.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// A policy the gateway cannot use: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The key (`tools[2].scopes[0]`), when known.
    pub key: Option<String>,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(k) = &self.key {
            write!(f, ": `{k}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for PolicyError {}

/// What an undeclared tool gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DefaultRule {
    /// A tool error naming the policy file.
    #[default]
    Refuse,
    /// Held until commit, like a gated tool.
    Gated,
}

/// How calls are grouped into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TurnMode {
    /// One transaction per agent turn.
    #[default]
    Turn,
    /// Every governed call is its own transaction.
    PerCall,
}

/// How an idle turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnIdle {
    /// Abort (compensate, drop held calls).
    #[default]
    Abort,
    /// Commit.
    Commit,
}

/// A tool's class in the policy: an effect class, a read, or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Reads: scopes registered, called at once, nothing to undo.
    Read,
    /// Runs at once; compensated on abort.
    Reversible,
    /// As reversible, with residue.
    ReversibleWithCost,
    /// Held until commit (staged).
    Bufferable,
    /// Held until commit (irreversible).
    Gated,
    /// Runs at once under an idempotency key.
    Idempotent,
    /// Never called: a tool error.
    Refuse,
}

impl Class {
    /// Whether its calls run at once (and so can end with an unknown outcome).
    pub fn executes_eagerly_class(self) -> bool {
        self.effect().is_some_and(EffectClass::executes_eagerly)
    }

    /// The engine's effect class, for effects.
    pub fn effect(self) -> Option<EffectClass> {
        Some(match self {
            Class::Reversible => EffectClass::Reversible,
            Class::ReversibleWithCost => EffectClass::ReversibleWithCost,
            Class::Bufferable => EffectClass::Bufferable,
            Class::Gated => EffectClass::Gated,
            Class::Idempotent => EffectClass::Idempotent,
            Class::Read | Class::Refuse => return None,
        })
    }

    /// Its name in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Refuse => "refuse",
            other => other.effect().map(EffectClass::as_str).unwrap_or("?"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    version: Option<Spanned<String>>,
    #[serde(default)]
    default: DefaultRule,
    #[serde(default)]
    gateway: RawGateway,
    #[serde(default)]
    turn: RawTurn,
    #[serde(default)]
    upstreams: BTreeMap<Spanned<String>, RawUpstream>,
    #[serde(default)]
    tools: Vec<RawTool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    store: Option<Spanned<String>>,
    level: Option<Spanned<String>>,
    call_timeout_ms: Option<Spanned<u64>>,
    approval_timeout_ms: Option<Spanned<u64>>,
    server: Option<Spanned<String>>,
    api_key_env: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    server_patience_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    #[serde(default)]
    mode: TurnMode,
    idle_ms: Option<Spanned<u64>>,
    #[serde(default)]
    on_idle: OnIdle,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    command: Option<Spanned<String>>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    upstream: Spanned<String>,
    #[serde(rename = "match")]
    pattern: Spanned<String>,
    class: Spanned<Class>,
    #[serde(default)]
    scopes: Vec<Spanned<String>>,
    key: Option<Spanned<String>>,
    compensate: Option<Spanned<RawCall>>,
    snapshot: Option<Spanned<RawCall>>,
    probe: Option<Spanned<RawCall>>,
    #[serde(default)]
    approval: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    tool: Spanned<String>,
    #[serde(default)]
    args: BTreeMap<Spanned<String>, toml::Value>,
    #[serde(default)]
    if_snapshot_failed: Option<SnapshotFailed>,
    found: Option<Spanned<String>>,
}

/// What a compensation does when the snapshot it reads had failed (a file that did not
/// exist before the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotFailed {
    /// Call the compensation anyway (its templates may then fail: `unresolved`).
    #[default]
    Call,
    /// Do not call it: the compensation ends with residue saying nothing was restored.
    Skip,
}

/// Where an upstream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking stdio.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment.
        env: BTreeMap<String, String>,
        /// Its working directory.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
    },
}

/// An upstream in the policy.
#[derive(Debug, Clone)]
pub struct UpstreamSpec {
    /// Its name.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
}

/// A call the policy makes on the gateway's behalf (a compensation or a snapshot).
#[derive(Debug, Clone)]
pub struct CallSpec {
    /// The upstream tool.
    pub tool: String,
    /// Its arguments.
    pub args: Vec<(String, ValueTemplate)>,
    /// For a compensation: what to do when the snapshot had failed.
    pub if_snapshot_failed: SnapshotFailed,
    /// For a probe: the path over its answer (`result.…`) that holds a value when the call
    /// took effect.
    pub found: Option<crate::template::Path>,
    span: Range<usize>,
    arg_spans: Vec<Range<usize>>,
}

impl CallSpec {
    /// Its arguments rendered.
    pub fn render(&self, inputs: &crate::template::Inputs<'_>) -> Result<Value, String> {
        let mut m = Map::new();
        for (k, v) in &self.args {
            m.insert(k.clone(), v.render(inputs)?);
        }
        Ok(Value::Object(m))
    }
}

/// One `[[tools]]` entry.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Its position in the file (0-based), for `tools[i]` in messages.
    pub index: usize,
    /// The upstream it applies to.
    pub upstream: String,
    /// The glob, as written.
    pub pattern: String,
    matcher: GlobMatcher,
    /// Its class.
    pub class: Class,
    /// Scope templates.
    pub scopes: Vec<Template>,
    /// Idempotency key template.
    pub key: Option<Template>,
    /// Compensation.
    pub compensate: Option<CallSpec>,
    /// Snapshot taken before the call.
    pub snapshot: Option<CallSpec>,
    /// How to learn whether a call whose outcome is unknown took effect.
    pub probe: Option<CallSpec>,
    /// Whether each call waits for a person's approval first.
    pub approval: bool,
    spans: RuleSpans,
}

#[derive(Debug, Clone, Default)]
struct RuleSpans {
    pattern: Range<usize>,
    scopes: Vec<Range<usize>>,
    key: Range<usize>,
}

/// The gateway's engine settings.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// The ledger.
    pub store: StoreUrl,
    /// The engine's level.
    pub level: Level,
    /// One upstream call, at most.
    pub call_timeout_ms: u64,
    /// How long an approval request stays open before it expires.
    pub approval_timeout_ms: u64,
    /// Attached mode: the Tidegate server whose ledger (and console) the gateway uses
    /// instead of its own store (`None`: embedded).
    pub server: Option<AttachedSettings>,
}

/// Where an attached gateway's transactions live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedSettings {
    /// The server's base URL (`http://host:port`).
    pub url: String,
    /// The environment variable holding the API key (default `TIDEGATE_API_KEY`).
    pub api_key_env: String,
    /// The gateway's name on the server: its capabilities are `<name>.<upstream>` and its
    /// tools `<name>.<upstream>.<tool>` (default `mcp`).
    pub name: String,
    /// How long a request whose outcome the gateway must learn (a ticket's result, a
    /// settlement, a task's report) is sent again while the server does not answer, before
    /// the agent gets a tool error (`gateway.server_patience_ms`, 1 000 to 3 600 000, default
    /// 120 000).
    pub patience_ms: u64,
}

/// Turn settings.
#[derive(Debug, Clone, Copy)]
pub struct TurnSettings {
    /// Grouping.
    pub mode: TurnMode,
    /// Idle limit.
    pub idle_ms: u64,
    /// How an idle turn ends.
    pub on_idle: OnIdle,
}

/// A checked policy file.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The file it was read from.
    pub file: PathBuf,
    source: String,
    /// Its version (the `version` key, else `sha256:<first 12 hex>` of the file).
    pub version: String,
    /// What undeclared tools get.
    pub default: DefaultRule,
    /// Engine settings.
    pub gateway: GatewaySettings,
    /// Turn settings.
    pub turn: TurnSettings,
    /// Upstreams, by name.
    pub upstreams: Vec<UpstreamSpec>,
    /// Tool rules, in file order (the first that matches decides).
    pub rules: Vec<Rule>,
}

/// The default ledger of the gateway.
pub const DEFAULT_STORE: &str = "sqlite:.tidegate-mcp";
/// The default idle limit of a turn.
pub const DEFAULT_IDLE_MS: u64 = 300_000;
/// The default time an approval request stays open.
pub const DEFAULT_APPROVAL_TIMEOUT_MS: u64 = 120_000;
/// The default limit of one upstream call.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// How long an attached gateway keeps sending a request the server does not answer.
pub const DEFAULT_SERVER_PATIENCE_MS: u64 = 120_000;

fn line_of(source: &str, offset: usize) -> usize {
    source[..offset.min(source.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

impl Policy {
    /// Reads and checks `file`.
    pub fn load(file: &FsPath) -> Result<Policy, PolicyError> {
        let err = |message: String| PolicyError { file: file.to_path_buf(), line: None, key: None, message };
        let meta = std::fs::metadata(file).map_err(|e| err(format!("cannot read the policy file: {e}")))?;
        if meta.len() > MAX_POLICY_BYTES {
            return Err(err(format!("{} bytes; a policy file is at most {MAX_POLICY_BYTES} bytes", meta.len())));
        }
        let source = std::fs::read_to_string(file).map_err(|e| err(format!("cannot read the policy file: {e}")))?;
        Policy::parse(file, &source)
    }

    /// Checks `source` as if read from `file`.
    pub fn parse(file: &FsPath, source: &str) -> Result<Policy, PolicyError> {
        let raw: RawPolicy = toml::from_str(source).map_err(|e| {
            let line = e.span().map(|s| line_of(source, s.start));
            PolicyError { file: file.to_path_buf(), line, key: None, message: e.message().to_string() }
        })?;
        let at = |span: &Range<usize>, key: String, message: String| PolicyError {
            file: file.to_path_buf(),
            line: Some(line_of(source, span.start)),
            key: Some(key),
            message,
        };

        let version = match &raw.version {
            Some(v) if v.get_ref().trim().is_empty() || v.get_ref().len() > 128 => {
                return Err(at(&v.span(), "version".into(), "expected a non-empty text of at most 128 bytes".into()));
            }
            Some(v) => v.get_ref().clone(),
            None => {
                use sha2::Digest;
                let d = sha2::Sha256::digest(source.as_bytes());
                let hex: String = d.iter().take(6).map(|b| format!("{b:02x}")).collect();
                format!("sha256:{hex}")
            }
        };

        let server = match &raw.gateway.server {
            Some(u) => {
                let url = u.get_ref().trim_end_matches('/').to_string();
                if !url.starts_with("http://") || url.len() <= "http://".len() {
                    return Err(at(
                        &u.span(),
                        "gateway.server".into(),
                        format!(
                            "{:?}; expected the Tidegate server's URL, http://HOST:PORT (this build has no TLS client)",
                            u.get_ref()
                        ),
                    ));
                }
                if let Some(s) = &raw.gateway.store {
                    return Err(at(
                        &s.span(),
                        "gateway.store".into(),
                        "set together with gateway.server; an attached gateway keeps its ledger on the server, so \
                         remove one of them"
                            .into(),
                    ));
                }
                let api_key_env = match &raw.gateway.api_key_env {
                    Some(e) if !e.get_ref().is_empty() => e.get_ref().clone(),
                    Some(e) => {
                        return Err(at(
                            &e.span(),
                            "gateway.api_key_env".into(),
                            "\"\"; expected the name of an environment variable".into(),
                        ));
                    }
                    None => "TIDEGATE_API_KEY".to_string(),
                };
                let name = match &raw.gateway.name {
                    Some(n) if valid_name(n.get_ref()) => n.get_ref().clone(),
                    Some(n) => {
                        return Err(at(
                            &n.span(),
                            "gateway.name".into(),
                            format!("{:?}; expected 1-32 of A-Z a-z 0-9 _ -", n.get_ref()),
                        ));
                    }
                    None => "mcp".to_string(),
                };
                let patience_ms = match &raw.gateway.server_patience_ms {
                    None => DEFAULT_SERVER_PATIENCE_MS,
                    Some(v) if (1_000..=3_600_000).contains(v.get_ref()) => *v.get_ref(),
                    Some(v) => {
                        return Err(at(
                            &v.span(),
                            "gateway.server_patience_ms".into(),
                            format!("{}; expected 1000 to 3600000 (ms)", v.get_ref()),
                        ));
                    }
                };
                Some(AttachedSettings { url, api_key_env, name, patience_ms })
            }
            None => {
                for (v, key) in [(&raw.gateway.api_key_env, "gateway.api_key_env"), (&raw.gateway.name, "gateway.name")]
                {
                    if let Some(v) = v {
                        return Err(at(
                            &v.span(),
                            key.into(),
                            "only meaningful with gateway.server (attached mode)".into(),
                        ));
                    }
                }
                if let Some(v) = &raw.gateway.server_patience_ms {
                    return Err(at(
                        &v.span(),
                        "gateway.server_patience_ms".into(),
                        "only meaningful with gateway.server (attached mode)".into(),
                    ));
                }
                None
            }
        };
        let store = match &raw.gateway.store {
            Some(s) => {
                s.get_ref().parse::<StoreUrl>().map_err(|e| at(&s.span(), "gateway.store".into(), e.to_string()))?
            }
            None => StoreUrl::sqlite(".tidegate-mcp"),
        };
        let level = match &raw.gateway.level {
            Some(l) => parse_level(l.get_ref()).ok_or_else(|| {
                at(&l.span(), "gateway.level".into(), format!("{:?}; expected L0, L1, L2, L3 or L4", l.get_ref()))
            })?,
            None => Level::L4,
        };
        let ms = |v: &Option<Spanned<u64>>, key: &str, default: u64, range: std::ops::RangeInclusive<u64>| match v {
            None => Ok(default),
            Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
            Some(v) => Err(at(
                &v.span(),
                key.to_string(),
                format!("{}; expected {} to {} (ms)", v.get_ref(), range.start(), range.end()),
            )),
        };
        let call_timeout_ms =
            ms(&raw.gateway.call_timeout_ms, "gateway.call_timeout_ms", DEFAULT_CALL_TIMEOUT_MS, 1..=3_600_000)?;
        let approval_timeout_ms = ms(
            &raw.gateway.approval_timeout_ms,
            "gateway.approval_timeout_ms",
            DEFAULT_APPROVAL_TIMEOUT_MS,
            1..=86_400_000,
        )?;
        let idle_ms = ms(&raw.turn.idle_ms, "turn.idle_ms", DEFAULT_IDLE_MS, 10..=86_400_000)?;

        let mut upstreams = Vec::new();
        for (name, u) in &raw.upstreams {
            let key = format!("upstreams.{}", name.get_ref());
            if !valid_name(name.get_ref()) {
                return Err(at(
                    &name.span(),
                    key,
                    "an upstream's name is 1-32 ASCII letters, digits, `_` or `-`".into(),
                ));
            }
            let transport = match (&u.command, &u.url) {
                (Some(c), None) if !c.get_ref().trim().is_empty() => Transport::Stdio {
                    command: c.get_ref().clone(),
                    args: u.args.clone(),
                    env: u.env.clone(),
                    cwd: u.cwd.as_ref().map(PathBuf::from),
                },
                (None, Some(url)) if url.get_ref().starts_with("http://") => {
                    if !u.args.is_empty() || !u.env.is_empty() || u.cwd.is_some() {
                        return Err(at(
                            &url.span(),
                            key,
                            "`args`, `env` and `cwd` belong to a `command` upstream".into(),
                        ));
                    }
                    Transport::Http { url: url.get_ref().clone() }
                }
                (None, Some(url)) => {
                    return Err(at(
                        &url.span(),
                        format!("{key}.url"),
                        format!(
                            "{:?}; expected an http:// URL (this build has no TLS client: reach an https upstream \
                             through a local proxy, or over stdio)",
                            url.get_ref()
                        ),
                    ));
                }
                (Some(c), _) if c.get_ref().trim().is_empty() => {
                    return Err(at(&c.span(), format!("{key}.command"), "empty; expected a program to start".into()));
                }
                _ => {
                    return Err(at(
                        &name.span(),
                        key,
                        "expected exactly one of `command` (stdio) or `url` (Streamable HTTP)".into(),
                    ));
                }
            };
            upstreams.push(UpstreamSpec { name: name.get_ref().clone(), transport });
        }

        let mut rules = Vec::new();
        for (i, t) in raw.tools.iter().enumerate() {
            let key = |k: &str| format!("tools[{i}].{k}");
            if !upstreams.iter().any(|u| u.name == *t.upstream.get_ref()) {
                let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                return Err(at(
                    &t.upstream.span(),
                    key("upstream"),
                    format!("{:?} is not an upstream of this file; expected one of {known:?}", t.upstream.get_ref()),
                ));
            }
            let matcher = Glob::new(t.pattern.get_ref())
                .map_err(|e| at(&t.pattern.span(), key("match"), format!("not a glob: {e}")))?
                .compile_matcher();
            let class = *t.class.get_ref();
            let mut scopes = Vec::new();
            let mut scope_spans = Vec::new();
            for (j, s) in t.scopes.iter().enumerate() {
                let tpl =
                    Template::parse(s.get_ref()).map_err(|e| at(&s.span(), format!("tools[{i}].scopes[{j}]"), e))?;
                check_roots(&tpl.paths().collect::<Vec<_>>(), false, false)
                    .map_err(|e| at(&s.span(), format!("tools[{i}].scopes[{j}]"), e))?;
                check_scope_type(s.get_ref()).map_err(|e| at(&s.span(), format!("tools[{i}].scopes[{j}]"), e))?;
                scopes.push(tpl);
                scope_spans.push(s.span());
            }
            if matches!(class, Class::Refuse) && (!scopes.is_empty() || t.compensate.is_some() || t.snapshot.is_some())
            {
                return Err(at(
                    &t.class.span(),
                    key("class"),
                    "a refused tool takes no scopes, compensation or snapshot".into(),
                ));
            }
            if !matches!(class, Class::Refuse) && scopes.is_empty() {
                return Err(at(
                    &t.class.span(),
                    key("scopes"),
                    "missing; every governed tool names what it touches (`scopes = [\"kind:{args.id}\"]`)".into(),
                ));
            }
            let key_tpl = match &t.key {
                Some(k) => {
                    let tpl = Template::parse(k.get_ref()).map_err(|e| at(&k.span(), key("key"), e))?;
                    check_roots(&tpl.paths().collect::<Vec<_>>(), false, false)
                        .map_err(|e| at(&k.span(), key("key"), e))?;
                    Some((tpl, k.span()))
                }
                None => None,
            };
            let snapshot = match &t.snapshot {
                Some(s) => {
                    if !matches!(class, Class::Reversible | Class::ReversibleWithCost) {
                        return Err(at(&s.span(), key("snapshot"), "only a reversible tool takes a snapshot".into()));
                    }
                    Some(call_spec(s, &key("snapshot"), false, false, &at)?)
                }
                None => None,
            };
            let compensate = match &t.compensate {
                Some(c) => {
                    if !matches!(class, Class::Reversible | Class::ReversibleWithCost | Class::Idempotent) {
                        return Err(at(
                            &c.span(),
                            key("compensate"),
                            format!(
                                "a {} tool is not compensated (only reversible, reversible_with_cost, idempotent)",
                                class.as_str()
                            ),
                        ));
                    }
                    Some(call_spec(c, &key("compensate"), true, snapshot.is_some(), &at)?)
                }
                None => {
                    if matches!(class, Class::Reversible | Class::ReversibleWithCost) {
                        return Err(at(
                            &t.class.span(),
                            key("compensate"),
                            format!(
                                "missing; a {} tool names its compensation (`compensate = {{ tool = .., args = {{..}} }}`)",
                                class.as_str()
                            ),
                        ));
                    }
                    None
                }
            };
            let probe = match &t.probe {
                Some(p) => {
                    if !class.executes_eagerly_class() {
                        return Err(at(
                            &p.span(),
                            key("probe"),
                            format!(
                                "a {} tool is not probed: only a call that runs at once can have an unknown outcome",
                                class.as_str()
                            ),
                        ));
                    }
                    let spec = call_spec(p, &key("probe"), false, false, &at)?;
                    if spec.found.is_none() {
                        return Err(at(&p.span(), key("probe.found"), "missing; a probe names the path of its answer that holds a value when the call took effect (`found = \"result.entities[*]\"`)".into()));
                    }
                    Some(spec)
                }
                None => None,
            };
            let approval = match &t.approval {
                Some(a) if *a.get_ref() && matches!(class, Class::Read | Class::Refuse) => {
                    return Err(at(
                        &a.span(),
                        key("approval"),
                        format!("a {} tool is never approved: it changes nothing", class.as_str()),
                    ));
                }
                Some(a) => *a.get_ref(),
                None => false,
            };
            rules.push(Rule {
                index: i,
                upstream: t.upstream.get_ref().clone(),
                pattern: t.pattern.get_ref().clone(),
                matcher,
                class,
                scopes,
                key: key_tpl.as_ref().map(|(k, _)| k.clone()),
                compensate,
                snapshot,
                probe,
                approval,
                spans: RuleSpans {
                    pattern: t.pattern.span(),
                    scopes: scope_spans,
                    key: key_tpl.map(|(_, s)| s).unwrap_or_default(),
                },
            });
        }

        Ok(Policy {
            file: file.to_path_buf(),
            source: source.to_string(),
            version,
            default: raw.default,
            gateway: GatewaySettings { store, level, call_timeout_ms, approval_timeout_ms, server },
            turn: TurnSettings { mode: raw.turn.mode, idle_ms, on_idle: raw.turn.on_idle },
            upstreams,
            rules,
        })
    }

    fn at(&self, span: &Range<usize>, key: String, message: String) -> PolicyError {
        PolicyError { file: self.file.clone(), line: Some(line_of(&self.source, span.start)), key: Some(key), message }
    }

    /// The rule for `tool` of `upstream`: the first that matches.
    pub fn rule_for(&self, upstream: &str, tool: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.upstream == upstream && r.matcher.is_match(tool))
    }

    /// Checks the rules against the upstreams' tools (name → the tool's JSON: `inputSchema`,
    /// `outputSchema`): every template's `args.` paths must exist in the tool's input schema
    /// (where the schema says what exists), every compensation and snapshot tool must be the
    /// upstream's, with the arguments its schema requires. Returns the warnings (a rule that
    /// matches no tool).
    pub fn bind(&self, tools: &BTreeMap<String, Vec<(String, Value)>>) -> Result<Vec<String>, PolicyError> {
        let mut warnings = Vec::new();
        for r in &self.rules {
            let Some(list) = tools.get(&r.upstream) else { continue };
            let matched: Vec<&(String, Value)> = list
                .iter()
                .filter(|(name, _)| self.rule_for(&r.upstream, name).is_some_and(|first| first.index == r.index))
                .collect();
            if matched.is_empty() {
                let any = list.iter().any(|(n, _)| r.matcher.is_match(n));
                warnings.push(format!(
                    "{}:{}: `tools[{}]` ({} {:?}) {}",
                    self.file.display(),
                    line_of(&self.source, r.spans.pattern.start),
                    r.index,
                    r.upstream,
                    r.pattern,
                    if any { "is shadowed by an earlier rule" } else { "matches no tool of the upstream" }
                ));
            }
            for (name, tool) in matched {
                let input = tool.get("inputSchema");
                let output = tool.get("outputSchema");
                for (j, s) in r.scopes.iter().enumerate() {
                    check_paths(s.paths(), input, None).map_err(|e| {
                        self.at(
                            &r.spans.scopes[j],
                            format!("tools[{}].scopes[{j}]", r.index),
                            format!("for tool `{name}`: {e}"),
                        )
                    })?;
                }
                if let Some(k) = &r.key {
                    check_paths(k.paths(), input, None).map_err(|e| {
                        self.at(&r.spans.key, format!("tools[{}].key", r.index), format!("for tool `{name}`: {e}"))
                    })?;
                }
                for (what, spec) in [("compensate", &r.compensate), ("snapshot", &r.snapshot), ("probe", &r.probe)] {
                    let Some(spec) = spec else { continue };
                    let key = format!("tools[{}].{what}", r.index);
                    let Some((_, target)) = list.iter().find(|(n, _)| *n == spec.tool) else {
                        return Err(self.at(
                            &spec.span,
                            format!("{key}.tool"),
                            format!("{:?} is not a tool of upstream `{}`", spec.tool, r.upstream),
                        ));
                    };
                    let tin = target.get("inputSchema");
                    for (j, (arg, v)) in spec.args.iter().enumerate() {
                        let span = &spec.arg_spans[j];
                        if let Some(props) = tin.and_then(|s| s.get("properties")).and_then(Value::as_object)
                            && !props.contains_key(arg)
                        {
                            return Err(self.at(
                                span,
                                format!("{key}.args.{arg}"),
                                format!(
                                    "`{}` takes no argument `{arg}`; it takes {:?}",
                                    spec.tool,
                                    props.keys().collect::<Vec<_>>()
                                ),
                            ));
                        }
                        check_paths(v.paths().into_iter(), input, output).map_err(|e| {
                            self.at(span, format!("{key}.args.{arg}"), format!("for tool `{name}`: {e}"))
                        })?;
                    }
                    if let Some(req) = tin.and_then(|s| s.get("required")).and_then(Value::as_array) {
                        for q in req.iter().filter_map(Value::as_str) {
                            if !spec.args.iter().any(|(a, _)| a == q) {
                                return Err(self.at(
                                    &spec.span,
                                    format!("{key}.args"),
                                    format!("`{}` requires the argument `{q}`, which is not mapped", spec.tool),
                                ));
                            }
                        }
                    }
                }
            }
        }
        Ok(warnings)
    }
}

/// A scope template starts with its type, written out: `kind:` before any placeholder.
fn check_scope_type(text: &str) -> Result<(), String> {
    let head = text.split('{').next().unwrap_or("");
    match head.split_once(':') {
        Some((ty, _))
            if (1..=64).contains(&ty.trim().len())
                && ty.trim().bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{text:?} does not start with a scope type: a scope is `type:path` with the type written out \
             (1-64 letters, digits, `_` or `-`), as in \"kg:entity:{{args.name}}\""
        )),
    }
}

fn parse_level(s: &str) -> Option<Level> {
    Level::ALL.iter().copied().find(|l| format!("{l:?}").eq_ignore_ascii_case(s.trim()))
}

fn valid_name(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_roots(paths: &[&Path], result: bool, snapshot: bool) -> Result<(), String> {
    for p in paths {
        match p.root {
            Root::Args => {}
            Root::Result if result => {}
            Root::Snapshot if snapshot => {}
            Root::Result => {
                return Err(format!("`{p}`: a scope or key is known before the call; only `args.` paths here"));
            }
            Root::Snapshot => return Err(format!("`{p}`: no snapshot is declared for this tool")),
        }
    }
    Ok(())
}

fn call_spec(
    c: &Spanned<RawCall>,
    key: &str,
    result: bool,
    snapshot: bool,
    at: &dyn Fn(&Range<usize>, String, String) -> PolicyError,
) -> Result<CallSpec, PolicyError> {
    let raw = c.get_ref();
    let mut args = Vec::new();
    let mut arg_spans = Vec::new();
    for (k, v) in &raw.args {
        let t = ValueTemplate::from_toml(v).map_err(|e| at(&k.span(), format!("{key}.args.{}", k.get_ref()), e))?;
        check_roots(&t.paths(), result, snapshot)
            .map_err(|e| at(&k.span(), format!("{key}.args.{}", k.get_ref()), e))?;
        args.push((k.get_ref().clone(), t));
        arg_spans.push(k.span());
    }
    let found = match &raw.found {
        Some(f) if !key.ends_with("probe") => {
            return Err(at(&f.span(), format!("{key}.found"), "only a probe has `found`".into()));
        }
        Some(f) => {
            let p = crate::template::Path::parse(f.get_ref()).map_err(|e| at(&f.span(), format!("{key}.found"), e))?;
            if p.root != Root::Result {
                return Err(at(
                    &f.span(),
                    format!("{key}.found"),
                    format!("`{p}`: a probe's `found` reads its answer: `result.…`"),
                ));
            }
            Some(p)
        }
        None => None,
    };
    if raw.if_snapshot_failed.is_some() && !snapshot {
        return Err(at(&c.span(), format!("{key}.if_snapshot_failed"), "no snapshot is declared for this tool".into()));
    }
    Ok(CallSpec {
        tool: raw.tool.get_ref().clone(),
        args,
        if_snapshot_failed: raw.if_snapshot_failed.unwrap_or_default(),
        found,
        span: raw.tool.span(),
        arg_spans,
    })
}

/// Checks `args.` paths against a JSON Schema (`properties`, `items`) and `result.` paths
/// against an output schema, as far as the schemas say; other roots are not checked.
fn check_paths<'a>(
    paths: impl Iterator<Item = &'a Path>,
    input: Option<&Value>,
    output: Option<&Value>,
) -> Result<(), String> {
    for p in paths {
        let (schema, what) = match p.root {
            Root::Args => (input, "input schema"),
            Root::Result => (output, "output schema"),
            Root::Snapshot => continue,
        };
        let mut cur = schema;
        for step in &p.steps {
            let Some(s) = cur else { break };
            cur = match step {
                Step::Field(name) => match s.get("properties").and_then(Value::as_object) {
                    Some(props) => match props.get(name) {
                        Some(x) => Some(x),
                        None if s.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false)) => None,
                        None => {
                            return Err(format!(
                                "`{p}` names `{name}`, which its {what} does not have (it has {:?})",
                                props.keys().collect::<Vec<_>>()
                            ));
                        }
                    },
                    None => None,
                },
                Step::Each | Step::Index(_) => s.get("items"),
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
version = "t1"
[upstreams.memory]
command = "node"
args = ["server.js"]

[[tools]]
upstream = "memory"
match = "create_entities"
class = "reversible"
scopes = ["kg:entity:{args.entities[*].name}"]
compensate = { tool = "delete_entities", args = { entityNames = "{result.entities[*].name}" } }

[[tools]]
upstream = "memory"
match = "read_*"
class = "read"
scopes = ["kg:entity"]
"#;

    fn parse(src: &str) -> Result<Policy, PolicyError> {
        Policy::parse(FsPath::new("p.toml"), src)
    }

    #[test]
    fn a_good_policy_parses_and_matches_by_glob() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.version, "t1");
        assert_eq!(p.rule_for("memory", "read_graph").unwrap().class, Class::Read);
        assert!(p.rule_for("memory", "delete_entities").is_none());
        assert_eq!(p.default, DefaultRule::Refuse);
    }

    #[test]
    fn unknown_keys_name_the_line() {
        let e = parse(&GOOD.replace("class = \"read\"", "class = \"read\"\nclas = 1")).unwrap_err();
        assert_eq!(e.line, Some(18), "{e}");
        assert!(e.to_string().contains("clas"), "{e}");
        let e = parse(&format!("{GOOD}\n[turn]\nidle = 5\n")).unwrap_err();
        assert!(e.line.is_some_and(|l| l > 20) && e.to_string().contains("idle"), "{e}");
    }

    #[test]
    fn bad_values_name_file_line_and_key() {
        let e =
            parse(&GOOD.replace("upstream = \"memory\"\nmatch = \"read_*\"", "upstream = \"mem\"\nmatch = \"read_*\""))
                .unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(15), Some("tools[1].upstream")), "{e}");
        let e = parse(&GOOD.replace("{args.entities[*].name}", "{arg.entities}")).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(11), Some("tools[0].scopes[0]")), "{e}");
        let e = parse(&GOOD.replace("kg:entity:{args.entities[*].name}", "kg:{result.x}")).unwrap_err();
        assert!(e.message.contains("known before the call"), "{e}");
        let e = parse(&GOOD.replace("compensate = {", "#")).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("tools[0].compensate"), "{e}");
        let e = parse(&GOOD.replace("scopes = [\"kg:entity\"]", "scopes = [\"entity\"]")).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(18), Some("tools[1].scopes[0]")), "{e}");
        let e = parse(&GOOD.replace("kg:entity:{args", "{args")).unwrap_err();
        assert!(e.message.contains("scope type"), "{e}");
        let src = format!("{GOOD}\n[turn]\nidle_ms = 5\n");
        let e = parse(&src).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(src.lines().count()), Some("turn.idle_ms")), "{e}");
        assert!(e.message.starts_with("5; expected 10 to"), "{e}");
        let e = parse(&GOOD.replace("class = \"read\"", "class = \"readonly\"")).unwrap_err();
        assert_eq!(e.line, Some(17), "{e}");
    }

    #[test]
    fn the_server_patience_is_attached_only_and_bounded() {
        let attached = |extra: &str| format!("{GOOD}\n[gateway]\nserver = \"http://127.0.0.1:9\"\n{extra}\n");
        let line_of = |src: &str, key: &str| src.lines().position(|l| l.starts_with(key)).map(|i| i + 1);
        let p = parse(&attached("")).unwrap();
        assert_eq!(p.gateway.server.as_ref().map(|s| s.patience_ms), Some(DEFAULT_SERVER_PATIENCE_MS));
        let p = parse(&attached("server_patience_ms = 2500")).unwrap();
        assert_eq!(p.gateway.server.as_ref().map(|s| s.patience_ms), Some(2500));
        let src = attached("server_patience_ms = 10");
        let e = parse(&src).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (line_of(&src, "server_patience_ms"), Some("gateway.server_patience_ms")),
            "{e}"
        );
        assert!(e.message.starts_with("10; expected 1000 to 3600000"), "{e}");
        let e = parse(&format!("{GOOD}\n[gateway]\nserver_patience_ms = 5000\n")).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("gateway.server_patience_ms"), "{e}");
        assert!(e.message.contains("only meaningful with gateway.server"), "{e}");
    }

    #[test]
    fn bind_checks_templates_against_the_upstream_schemas() {
        let p = parse(GOOD).unwrap();
        let create = serde_json::json!({"inputSchema": {"type": "object", "properties": {"entities": {"type": "array",
            "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}});
        let delete = serde_json::json!({"inputSchema": {"type": "object", "properties": {"entityNames": {}}, "required": ["entityNames"]}});
        let read = serde_json::json!({"inputSchema": {"type": "object"}});
        let mut tools = BTreeMap::new();
        tools.insert(
            "memory".to_string(),
            vec![
                ("create_entities".into(), create.clone()),
                ("delete_entities".into(), delete.clone()),
                ("read_graph".into(), read),
            ],
        );
        assert!(p.bind(&tools).unwrap().is_empty());
        // A template naming an argument the tool does not take.
        let q = parse(&GOOD.replace("entities[*].name}\"]", "entities[*].title}\"]")).unwrap();
        let e = q.bind(&tools).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(11), Some("tools[0].scopes[0]")), "{e}");
        assert!(e.message.contains("title"), "{e}");
        // A compensation tool the upstream lacks, and one missing a required argument.
        let q = parse(&GOOD.replace("tool = \"delete_entities\"", "tool = \"remove\"")).unwrap();
        assert!(q.bind(&tools).unwrap_err().message.contains("not a tool of upstream"));
        let q = parse(&GOOD.replace("entityNames =", "names =")).unwrap();
        assert!(q.bind(&tools).unwrap_err().message.contains("takes no argument `names`"));
        // A rule that matches nothing is a warning.
        tools.get_mut("memory").unwrap().retain(|(n, _)| n != "read_graph");
        assert_eq!(p.bind(&tools).unwrap().len(), 1);
    }
}
