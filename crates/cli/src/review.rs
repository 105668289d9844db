//! `tidegate review`: the review middleware of a running `tidegate serve`, over its HTTP API
//! (`/v1/review`, docs/server.md "Review"; the same calls as Python's `ReviewClient`). Request
//! a transaction, read one or the queue, accept or remove, register templates.
//!
//! Output is for people by default and the server's JSON with `--json`. A refusal (a problem
//! document) is one line on standard error naming the code, the field and the value, and the
//! command exits non-zero.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Map, Value, json};
use tidegate_review::TemplateSet;

/// The server's default listen address (`server.listen`).
const DEFAULT_URL: &str = "http://127.0.0.1:7878";
/// Attempts of one call when the server answers 429 or 503 (it says when to come back).
const ATTEMPTS: u32 = 5;

/// Where the server is and which key to use (after the subcommand or before it).
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// The server's base URL (http:// only). Default: `$TIDEGATE_URL`, else
    /// http://127.0.0.1:7878.
    #[arg(long, value_name = "URL", global = true)]
    pub url: Option<String>,
    /// The API key (its role decides what is allowed: agent requests, reviewer accepts and
    /// removes, operator registers, admin all). Default: `$TIDEGATE_API_KEY`, which keeps it
    /// out of the process list.
    #[arg(long, value_name = "KEY", global = true)]
    pub api_key: Option<String>,
}

/// Review subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Request a transaction of a template; prints its id and status.
    Request {
        /// The template's name.
        #[arg(long)]
        template: String,
        /// A parameter, `NAME=VALUE` (repeatable). A value that parses as JSON (`7`, `true`,
        /// `null`, `"07"`, `[1,2]`) is taken as JSON, anything else as a string.
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, Value)>,
        /// Every parameter at once as a JSON object (combined with `--param`).
        #[arg(long = "params", value_name = "JSON")]
        params_json: Option<String>,
        /// The transaction needs review (LLM-generated, flagged by a policy).
        #[arg(long)]
        suspicious: bool,
        /// Who sent it (default: the key's id).
        #[arg(long)]
        sender: Option<String>,
        /// Makes a repeated run of this command return the first one's answer instead of
        /// requesting again (default: a fresh key per run, which covers the command's own
        /// retries).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Print only the id.
        #[arg(long, short, conflicts_with = "json")]
        quiet: bool,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One transaction: status, SQL, parameters, what it waits for and what waits on it.
    Status {
        /// The transaction's id (`rv_<tag>_<n>`).
        id: String,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The buffer: every transaction not yet final, oldest first.
    Queue {
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Accept a suspicious transaction (it stays, or runs once what it waits for is resolved).
    Accept {
        /// The transaction's id.
        id: String,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a suspicious transaction and everything that builds on it; prints what the
    /// removal took along. Refused without `--yes`, naming what it would take along.
    Remove {
        /// The transaction's id.
        id: String,
        /// Confirm the removal.
        #[arg(long)]
        yes: bool,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Templates of the tenant.
    Templates {
        #[command(subcommand)]
        cmd: TemplatesCmd,
    },
}

/// `tidegate review templates` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TemplatesCmd {
    /// Register a template set from a `.toml` or `.json` file (docs/review.md's format),
    /// checked here first; needs an operator or admin key.
    Register {
        /// The template set.
        file: PathBuf,
        /// SQL run on the tenant's review database first (e.g. `CREATE TABLE IF NOT EXISTS`).
        #[arg(long, value_name = "SQL_FILE")]
        schema: Option<PathBuf>,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The registered templates, the strategy and the granularity.
    List {
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn parse_param(s: &str) -> Result<(String, Value), String> {
    let (name, raw) =
        s.split_once('=').ok_or_else(|| format!("`{s}` has no `=`: expected NAME=VALUE, e.g. `amount=70`"))?;
    if name.is_empty() {
        return Err(format!("`{s}` has an empty name: expected NAME=VALUE"));
    }
    let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
    Ok((name.to_owned(), value))
}

/// Builds the `params` object from `--params` and the `--param`s; a name given twice is an
/// error naming it.
fn params_object(params: Vec<(String, Value)>, json: Option<&str>) -> anyhow::Result<Value> {
    let mut out = match json {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(other) => bail!("invalid --params `{other}`: expected a JSON object"),
            Err(e) => bail!("invalid --params `{text}`: expected a JSON object ({e})"),
        },
    };
    for (name, value) in params {
        if out.contains_key(&name) {
            bail!("invalid --param `{name}`: given more than once");
        }
        out.insert(name, value);
    }
    Ok(Value::Object(out))
}

/// A review transaction id as the path segment: the server's ids are `rv_<tag>_<n>`; anything
/// outside letters, digits, `_` and `-` is refused here rather than sent in a URL.
fn checked_id(id: &str) -> anyhow::Result<&str> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        bail!("invalid id `{id}`: expected a review transaction id such as rv_ab12_7");
    }
    Ok(id)
}

/// A server's refusal: its problem document, or what the body was.
#[derive(Debug)]
struct Refused {
    status: u16,
    doc: Value,
}

impl std::fmt::Display for Refused {
    /// One line: `HTTP 400 invalid_field: <detail> (field `x`, value `v`)`, the field and value
    /// added when the detail does not already name them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |k: &str| self.doc.get(k).and_then(Value::as_str);
        let code = s("code").unwrap_or("error");
        let detail = s("detail").or_else(|| s("title")).unwrap_or("no detail");
        write!(f, "HTTP {} {code}: {detail}", self.status)?;
        let mut extra = Vec::new();
        if let Some(field) = s("field")
            && !detail.contains(&format!("`{field}`"))
        {
            extra.push(format!("field `{field}`"));
            if let Some(v) = s("value") {
                extra.push(format!("value `{v}`"));
            }
            if let Some(e) = s("expected") {
                extra.push(format!("expected {e}"));
            }
        }
        if !extra.is_empty() {
            write!(f, " ({})", extra.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// A blocking client of one server with one key (also `tidegate plans`).
pub(crate) struct Client {
    base: String,
    key: String,
    agent: ureq::Agent,
}

impl Client {
    pub(crate) fn new(conn: Conn) -> anyhow::Result<Client> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let base = conn.url.or_else(|| env("TIDEGATE_URL")).unwrap_or_else(|| DEFAULT_URL.to_owned());
        if base.starts_with("https://") {
            bail!(
                "invalid --url `{base}`: this build's client speaks http:// only; reach the server over \
                 http:// (e.g. through an SSH tunnel or on its host)"
            );
        }
        if !base.starts_with("http://") {
            bail!("invalid --url `{base}`: expected an http:// URL such as {DEFAULT_URL}");
        }
        let key = conn
            .api_key
            .or_else(|| env("TIDEGATE_API_KEY"))
            .context("no API key: pass --api-key or set TIDEGATE_API_KEY (`tidegate key create` makes one)")?;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).redirects(0).build();
        Ok(Client { base: base.trim_end_matches('/').to_owned(), key, agent })
    }

    /// One call; 429 and 503 are retried after the server's `Retry-After` (at most 5 s).
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        idem: Option<&str>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut attempt = 1;
        loop {
            let mut req = self
                .agent
                .request(method, &url)
                .set("Authorization", &format!("Bearer {}", self.key))
                .set("Accept", "application/json");
            if let Some(k) = idem {
                req = req.set("Idempotency-Key", k);
            }
            let res = match body {
                Some(b) => req.send_json(b),
                None => req.call(),
            };
            match res {
                Ok(resp) => {
                    let text = resp.into_string().with_context(|| format!("reading the answer to {method} {url}"))?;
                    if text.is_empty() {
                        return Ok(Value::Null);
                    }
                    return serde_json::from_str(&text)
                        .with_context(|| format!("the answer to {method} {url} is not JSON: {}", clip(&text)));
                }
                Err(ureq::Error::Status(status, resp)) => {
                    let wait = resp.header("retry-after").and_then(|v| v.trim().parse::<f64>().ok());
                    let text = resp.into_string().unwrap_or_default();
                    if matches!(status, 429 | 503) && attempt < ATTEMPTS {
                        let secs = wait.unwrap_or(1.0).clamp(0.05, 5.0);
                        std::thread::sleep(Duration::from_secs_f64(secs));
                        attempt += 1;
                        continue;
                    }
                    let doc = match serde_json::from_str::<Value>(&text) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => json!({ "detail": if text.is_empty() { format!("{method} {url}") } else { clip(&text) } }),
                    };
                    return Err(Refused { status, doc }.into());
                }
                Err(ureq::Error::Transport(t)) => {
                    return Err(anyhow!(
                        "cannot reach the server at {}: {t} (set --url or TIDEGATE_URL; is `tidegate serve` running?)",
                        self.base
                    ));
                }
            }
        }
    }

    pub(crate) fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call("GET", path, None, None)
    }
}

fn clip(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("?")
}

fn ids(v: &Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn compact(v: Option<&Value>) -> String {
    v.map(|v| serde_json::to_string(v).unwrap_or_default()).unwrap_or_default()
}

/// One line of the queue: id, status, template, parameters, sender and the edges.
fn tx_line(t: &Value) -> String {
    let mut line = format!(
        "{}  {:<24} {}  {}  from {}",
        text(t, "id"),
        text(t, "status"),
        text(t, "template"),
        compact(t.get("params")),
        text(t, "sender")
    );
    for (label, key) in [("waits for", "waits_for"), ("waited by", "waited_by")] {
        let list = ids(t, key);
        if !list.is_empty() {
            line.push_str(&format!("  [{label} {}]", list.join(", ")));
        }
    }
    line
}

/// A transaction in full, one field per line.
fn tx_block(t: &Value) -> String {
    let mut flags = Vec::new();
    if t.get("suspicious").and_then(Value::as_bool) == Some(true) {
        flags.push("suspicious");
    }
    if t.get("reviewable").and_then(Value::as_bool) == Some(true) {
        flags.push("reviewable");
    }
    let mut out = format!("{}  {}", text(t, "id"), text(t, "status"));
    if !flags.is_empty() {
        out.push_str(&format!("  ({})", flags.join(", ")));
    }
    let mut field = |label: &str, value: String| {
        if !value.is_empty() {
            out.push_str(&format!("\n  {label:<14} {value}"));
        }
    };
    field("template", text(t, "template").to_owned());
    field("params", compact(t.get("params")));
    field("sender", text(t, "sender").to_owned());
    for sql in ids(t, "sql") {
        field("sql", sql);
    }
    field("review", t.get("review").and_then(Value::as_str).unwrap_or_default().to_owned());
    field("waits for", ids(t, "waits_for").join(", "));
    field("waited by", ids(t, "waited_by").join(", "));
    field("removal takes", ids(t, "removal_cascade").join(", "));
    field("cascaded from", t.get("cascaded_from").and_then(Value::as_str).unwrap_or_default().to_owned());
    field("error", t.get("error").and_then(Value::as_str).unwrap_or_default().to_owned());
    out
}

fn cascade_text(list: &[String]) -> String {
    if list.is_empty() { "nothing else".to_owned() } else { format!("{} ({})", list.len(), list.join(", ")) }
}

/// A fresh idempotency key for one run of `request` (its own retries reuse it).
fn run_key() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("tidegate-cli-{}-{nanos}", std::process::id())
}

pub fn run(conn: Conn, cmd: Cmd) -> anyhow::Result<()> {
    // A local mistake is reported before the connection settings are looked at.
    let client = || Client::new(conn.clone());
    match cmd {
        Cmd::Request { template, params, params_json, suspicious, sender, idempotency_key, quiet, json } => {
            let params = params_object(params, params_json.as_deref())?;
            let mut body = json!({ "template": template, "params": params, "suspicious": suspicious });
            if let Some(s) = sender {
                body["sender"] = Value::String(s);
            }
            let key = idempotency_key.unwrap_or_else(run_key);
            let t = client()?.call("POST", "/v1/review/transactions", Some(&body), Some(&key))?;
            if json {
                print_json(&t)?;
            } else if quiet {
                println!("{}", text(&t, "id"));
            } else {
                println!("{}", tx_block(&t));
            }
        }
        Cmd::Status { id, json } => {
            let t = client()?.get(&format!("/v1/review/transactions/{}", checked_id(&id)?))?;
            if json {
                print_json(&t)?;
            } else {
                println!("{}", tx_block(&t));
            }
        }
        Cmd::Queue { json } => {
            let q = client()?.get("/v1/review/queue")?;
            if json {
                return print_json(&q);
            }
            let data = q.get("data").and_then(Value::as_array).cloned().unwrap_or_default();
            let total = q.get("total").and_then(Value::as_u64).unwrap_or(data.len() as u64);
            let reviewable = q.get("reviewable").and_then(Value::as_u64).unwrap_or(0);
            println!("{total} in the buffer, {reviewable} awaiting review");
            for t in &data {
                println!("{}", tx_line(t));
            }
            if (data.len() as u64) < total {
                println!("(the first {} shown)", data.len());
            }
        }
        Cmd::Accept { id, json } => {
            let r =
                client()?.call("POST", &format!("/v1/review/transactions/{}/accept", checked_id(&id)?), None, None)?;
            if json {
                return print_json(&r);
            }
            let t = &r["transaction"];
            println!("accepted {}: now {}", text(t, "id"), text(t, "status"));
        }
        Cmd::Remove { id, yes, json } => {
            let id = checked_id(&id)?;
            let c = client()?;
            if !yes {
                // Say what the removal would take along, from the server's preview.
                let t = c.get(&format!("/v1/review/transactions/{id}"))?;
                bail!(
                    "not removing {id} without --yes: it would also remove {}; run `tidegate review remove {id} --yes`",
                    cascade_text(&ids(&t, "removal_cascade"))
                );
            }
            let r = c.call("POST", &format!("/v1/review/transactions/{id}/remove"), None, None)?;
            if json {
                return print_json(&r);
            }
            let t = &r["transaction"];
            println!(
                "removed {}: now {}; cascaded to {}",
                text(t, "id"),
                text(t, "status"),
                cascade_text(&ids(&r, "cascaded"))
            );
        }
        Cmd::Templates { cmd: TemplatesCmd::Register { file, schema, json } } => {
            let set =
                TemplateSet::load(&file).with_context(|| format!("reading the template set {}", file.display()))?;
            let mut body = json!({ "set": serde_json::to_value(&set)? });
            if let Some(p) = schema {
                body["schema"] =
                    Value::String(std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?);
            }
            let r = client()?.call("POST", "/v1/review/templates", Some(&body), Some(&run_key()))?;
            if json {
                return print_json(&r);
            }
            let what = if r.get("added").and_then(Value::as_bool) == Some(true) { "registered" } else { "unchanged" };
            println!("{what}: {}", ids(&r, "templates").join(", "));
        }
        Cmd::Templates { cmd: TemplatesCmd::List { json } } => {
            let r = client()?.get("/v1/review/templates")?;
            if json {
                return print_json(&r);
            }
            println!("strategy {}, granularity {}", text(&r, "strategy"), text(&r, "granularity"));
            for name in ids(&r, "templates") {
                println!("{name}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_take_json_values_and_fall_back_to_strings() {
        let p = |s: &str| parse_param(s).map(|(_, v)| v);
        assert_eq!(p("n=7"), Ok(json!(7)));
        assert_eq!(p("ids=[1,2]"), Ok(json!([1, 2])));
        assert_eq!(p("name=Smith"), Ok(json!("Smith")));
        assert_eq!(p("zip=\"07\""), Ok(json!("07")));
        assert_eq!(p("expr=a=b"), Ok(json!("a=b")), "only the first `=` splits");
        assert!(p("amount").unwrap_err().contains("`amount` has no `=`"));
        assert!(p("=3").unwrap_err().contains("empty name"));
    }

    #[test]
    fn a_parameter_given_twice_is_refused_by_name() {
        let e = params_object(vec![("id".into(), json!(1))], Some(r#"{"id": 2}"#)).unwrap_err();
        assert!(e.to_string().contains("--param `id`"), "{e}");
        let ok = params_object(vec![("amount".into(), json!(5))], Some(r#"{"id": 2}"#)).unwrap();
        assert_eq!(ok, json!({"id": 2, "amount": 5}));
        assert!(params_object(vec![], Some("[1]")).unwrap_err().to_string().contains("JSON object"));
    }

    #[test]
    fn a_problem_is_one_line_with_the_field_when_the_detail_lacks_it() {
        let r = Refused {
            status: 400,
            doc: json!({"code": "invalid_field", "detail": "bad request", "field": "params.amount", "value": "x", "expected": "a number"}),
        };
        assert_eq!(
            r.to_string(),
            "HTTP 400 invalid_field: bad request (field `params.amount`, value `x`, expected a number)"
        );
        let r = Refused {
            status: 400,
            doc: json!({"code": "invalid_field", "detail": "invalid `sender` = x: expected 1 to 200 bytes", "field": "sender"}),
        };
        assert_eq!(r.to_string(), "HTTP 400 invalid_field: invalid `sender` = x: expected 1 to 200 bytes");
        assert!(!r.to_string().contains('\n'));
    }

    #[test]
    fn ids_outside_the_server_alphabet_are_refused_locally() {
        assert!(checked_id("rv_ab12_7").is_ok());
        assert!(checked_id("../keys").is_err());
        assert!(checked_id("").is_err());
    }
}
