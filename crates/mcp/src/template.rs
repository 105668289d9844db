//! Templates over a call's arguments, its result and its snapshot.
//!
//! A template is text with placeholders: `"kg:entity:{args.entities[*].name}"`. A
//! placeholder is a path: a root (`args`, the call's arguments; `result`, what the upstream
//! answered; `snapshot`, what the policy's snapshot tool answered before the call) followed
//! by fields (`.name`), indices (`[0]`) and fan-outs (`[*]`, every element of an array).
//!
//! * A **text template** ([`Template::render`]) renders to one string per combination of its
//!   fan-outs (the cartesian product): `"kg:entity:{args.names[*]}"` over
//!   `{"names": ["Ann", "Bob"]}` is `["kg:entity:Ann", "kg:entity:Bob"]`. Strings are
//!   inserted as they are, numbers and booleans as JSON text; a missing value, `null`, an
//!   object or an array is an error naming the path.
//! * A **value template** ([`ValueTemplate`], a compensation's or probe's arguments) maps a
//!   TOML value to a JSON value: a string that is exactly one placeholder is the JSON value
//!   at that path (an array when the path fans out), a string with other text renders to one
//!   string, tables and arrays map element by element, and other values are literals.
//!
//! A `result` is read from the upstream's `structuredContent` when it has one, else from its
//! first text content parsed as JSON, else that text as a string ([`result_value`]).

use std::fmt;

use serde_json::{Map, Value};

/// The most placeholders in one template, and the most strings one template may render
/// (fan-outs multiply).
pub const MAX_RENDERED: usize = 1024;

/// Where a path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// The call's arguments.
    Args,
    /// The upstream's answer ([`result_value`]).
    Result,
    /// The snapshot tool's answer, taken before the call.
    Snapshot,
}

impl Root {
    fn name(self) -> &'static str {
        match self {
            Root::Args => "args",
            Root::Result => "result",
            Root::Snapshot => "snapshot",
        }
    }
}

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An object's field.
    Field(String),
    /// An array's element.
    Index(usize),
    /// Every element of an array.
    Each,
}

/// A path: a root and its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// Where it starts.
    pub root: Root,
    /// The steps.
    pub steps: Vec<Step>,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.root.name())?;
        for s in &self.steps {
            match s {
                Step::Field(n) => write!(f, ".{n}")?,
                Step::Index(i) => write!(f, "[{i}]")?,
                Step::Each => f.write_str("[*]")?,
            }
        }
        Ok(())
    }
}

/// The values a call's templates read.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The call's arguments.
    pub args: &'a Value,
    /// The upstream's answer ([`result_value`]), when there is one.
    pub result: Option<&'a Value>,
    /// The snapshot, when one was taken.
    pub snapshot: Option<&'a Value>,
}

impl Path {
    /// Parses `text` (`args.a[*].b`).
    pub fn parse(text: &str) -> Result<Path, String> {
        let text = text.trim();
        let (root, rest) = match text.find(['.', '[']) {
            Some(i) => (&text[..i], &text[i..]),
            None => (text, ""),
        };
        let root = match root {
            "args" => Root::Args,
            "result" => Root::Result,
            "snapshot" => Root::Snapshot,
            other => {
                return Err(format!(
                    "path `{text}` starts with `{other}`; expected `args`, `result` or `snapshot` (as in `args.name`)"
                ));
            }
        };
        let mut steps = Vec::new();
        let mut rest = rest;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                let end = r.find(['.', '[']).unwrap_or(r.len());
                let name = &r[..end];
                if name.is_empty() {
                    return Err(format!("path `{text}` has an empty field name"));
                }
                steps.push(Step::Field(name.to_string()));
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix('[') {
                let end = r.find(']').ok_or_else(|| format!("path `{text}` has a `[` without `]`"))?;
                let inner = r[..end].trim();
                if inner == "*" {
                    steps.push(Step::Each);
                } else {
                    let i: usize = inner
                        .parse()
                        .map_err(|_| format!("path `{text}` has `[{inner}]`; expected `[*]` or an index like `[0]`"))?;
                    steps.push(Step::Index(i));
                }
                rest = &r[end + 1..];
            } else {
                return Err(format!("path `{text}` continues with `{rest}`; expected `.field` or `[..]`"));
            }
        }
        Ok(Path { root, steps })
    }

    /// Whether it fans out.
    pub fn fans_out(&self) -> bool {
        self.steps.contains(&Step::Each)
    }

    /// The values at this path; `Err` names the path and what was missing.
    pub fn eval<'v>(&self, inputs: &Inputs<'v>) -> Result<Vec<&'v Value>, String> {
        let start = match self.root {
            Root::Args => Some(inputs.args),
            Root::Result => inputs.result,
            Root::Snapshot => inputs.snapshot,
        };
        let Some(start) = start else {
            return Err(format!("`{self}`: there is no {} here", self.root.name()));
        };
        let mut cur = vec![start];
        for step in &self.steps {
            let mut next = Vec::with_capacity(cur.len());
            for v in cur {
                match step {
                    Step::Field(n) => match v.get(n) {
                        Some(x) => next.push(x),
                        None => return Err(format!("`{self}`: no field `{n}` in {}", shape(v))),
                    },
                    Step::Index(i) => match v.get(i) {
                        Some(x) => next.push(x),
                        None => return Err(format!("`{self}`: no element [{i}] in {}", shape(v))),
                    },
                    Step::Each => match v.as_array() {
                        Some(a) => next.extend(a.iter()),
                        None => return Err(format!("`{self}`: `[*]` over {}, expected an array", shape(v))),
                    },
                }
                if next.len() > MAX_RENDERED {
                    return Err(format!("`{self}`: more than {MAX_RENDERED} values"));
                }
            }
            cur = next;
        }
        Ok(cur)
    }
}

fn shape(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Hole(Path),
}

/// A text template (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; `{{` and `}}` stand for literal braces.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|p| p.1) == Some('{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek().map(|p| p.1) == Some('}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let rest = &text[i + 1..];
                    let end = rest.find('}').ok_or_else(|| format!("template `{text}` has a `{{` without `}}`"))?;
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Hole(Path::parse(&rest[..end])?));
                    for _ in 0..rest[..=end].chars().count() {
                        chars.next();
                    }
                }
                '}' => return Err(format!("template `{text}` has a `}}` without `{{` (write `}}}}` for a brace)")),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        if parts.iter().filter(|p| matches!(p, Part::Hole(_))).count() > 16 {
            return Err(format!("template `{text}` has more than 16 placeholders"));
        }
        Ok(Template { text: text.to_string(), parts })
    }

    /// The text it was parsed from.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Its paths.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.parts.iter().filter_map(|p| match p {
            Part::Hole(p) => Some(p),
            Part::Text(_) => None,
        })
    }

    /// When the whole template is one placeholder, its path.
    fn single(&self) -> Option<&Path> {
        match self.parts.as_slice() {
            [Part::Hole(p)] => Some(p),
            _ => None,
        }
    }

    /// Renders every combination of its fan-outs.
    pub fn render(&self, inputs: &Inputs<'_>) -> Result<Vec<String>, String> {
        let mut out = vec![String::new()];
        for part in &self.parts {
            match part {
                Part::Text(t) => out.iter_mut().for_each(|o| o.push_str(t)),
                Part::Hole(p) => {
                    let values = p.eval(inputs)?;
                    let texts = values.iter().map(|v| scalar_text(p, v)).collect::<Result<Vec<_>, _>>()?;
                    if out.len() * texts.len() > MAX_RENDERED {
                        return Err(format!("template `{}` renders more than {MAX_RENDERED} strings", self.text));
                    }
                    out = out.iter().flat_map(|o| texts.iter().map(move |t| format!("{o}{t}"))).collect();
                }
            }
        }
        Ok(out)
    }

    /// Renders to exactly one string.
    pub fn render_one(&self, inputs: &Inputs<'_>) -> Result<String, String> {
        let mut all = self.render(inputs)?;
        match all.len() {
            1 => Ok(all.remove(0)),
            n => Err(format!("template `{}` rendered {n} strings where one was expected", self.text)),
        }
    }
}

fn scalar_text(p: &Path, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("`{p}` is {}, expected a string, number or boolean", shape(other))),
    }
}

/// A value template (module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum ValueTemplate {
    /// A literal.
    Literal(Value),
    /// Exactly one placeholder: the value at its path.
    Path(Path),
    /// Text with placeholders: one string.
    Text(Template),
    /// An array.
    Array(Vec<ValueTemplate>),
    /// An object.
    Object(Vec<(String, ValueTemplate)>),
}

impl ValueTemplate {
    /// Maps a TOML value.
    pub fn from_toml(v: &toml::Value) -> Result<ValueTemplate, String> {
        Ok(match v {
            toml::Value::String(s) if s.contains('{') || s.contains('}') => {
                let t = Template::parse(s)?;
                match t.single() {
                    Some(p) => ValueTemplate::Path(p.clone()),
                    None => ValueTemplate::Text(t),
                }
            }
            toml::Value::String(s) => ValueTemplate::Literal(Value::String(s.clone())),
            toml::Value::Integer(i) => ValueTemplate::Literal(Value::from(*i)),
            toml::Value::Float(f) => ValueTemplate::Literal(Value::from(*f)),
            toml::Value::Boolean(b) => ValueTemplate::Literal(Value::Bool(*b)),
            toml::Value::Datetime(d) => ValueTemplate::Literal(Value::String(d.to_string())),
            toml::Value::Array(a) => {
                ValueTemplate::Array(a.iter().map(ValueTemplate::from_toml).collect::<Result<_, _>>()?)
            }
            toml::Value::Table(t) => ValueTemplate::Object(
                t.iter().map(|(k, v)| Ok((k.clone(), ValueTemplate::from_toml(v)?))).collect::<Result<_, String>>()?,
            ),
        })
    }

    /// Every path it reads.
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            ValueTemplate::Literal(_) => Vec::new(),
            ValueTemplate::Path(p) => vec![p],
            ValueTemplate::Text(t) => t.paths().collect(),
            ValueTemplate::Array(a) => a.iter().flat_map(|v| v.paths()).collect(),
            ValueTemplate::Object(o) => o.iter().flat_map(|(_, v)| v.paths()).collect(),
        }
    }

    /// The JSON value.
    pub fn render(&self, inputs: &Inputs<'_>) -> Result<Value, String> {
        Ok(match self {
            ValueTemplate::Literal(v) => v.clone(),
            ValueTemplate::Path(p) => {
                let values = p.eval(inputs)?;
                if p.fans_out() {
                    Value::Array(values.into_iter().cloned().collect())
                } else {
                    values.first().map(|v| (*v).clone()).unwrap_or(Value::Null)
                }
            }
            ValueTemplate::Text(t) => Value::String(t.render_one(inputs)?),
            ValueTemplate::Array(a) => Value::Array(a.iter().map(|v| v.render(inputs)).collect::<Result<_, _>>()?),
            ValueTemplate::Object(o) => {
                let mut m = Map::new();
                for (k, v) in o {
                    m.insert(k.clone(), v.render(inputs)?);
                }
                Value::Object(m)
            }
        })
    }
}

/// What a template's `result` (or `snapshot`) is, read from an upstream's answer (the
/// `tools/call` result as JSON): its `structuredContent`, else its first text content parsed
/// as JSON, else that text as a string, else `null`.
pub fn result_value(answer: &Value) -> Value {
    if let Some(s) = answer.get("structuredContent").filter(|s| !s.is_null()) {
        return s.clone();
    }
    let text = answer
        .get("content")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("text")))
        .and_then(|b| b.get("text"))
        .and_then(Value::as_str);
    match text {
        Some(t) => serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string())),
        None => Value::Null,
    }
}

/// The text of an upstream's answer (its text contents joined), for reading a snapshot as
/// text: `{snapshot.text}`.
pub fn answer_text(answer: &Value) -> String {
    answer
        .get("content")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inputs(args: &Value) -> Inputs<'_> {
        Inputs { args, result: None, snapshot: None }
    }

    #[test]
    fn fan_out_renders_every_combination() {
        let t = Template::parse("kg:{args.a[*]}:{args.b[*].n}").unwrap();
        let args = json!({"a": ["x", 1], "b": [{"n": true}, {"n": "z"}]});
        assert_eq!(t.render(&inputs(&args)).unwrap(), vec!["kg:x:true", "kg:x:z", "kg:1:true", "kg:1:z"]);
    }

    #[test]
    fn missing_values_name_the_path() {
        let t = Template::parse("fs:{args.path}").unwrap();
        let e = t.render(&inputs(&json!({"p": "/x"}))).unwrap_err();
        assert!(e.contains("args.path") && e.contains("no field `path`"), "{e}");
        let e = t.render(&inputs(&json!({"path": {"a": 1}}))).unwrap_err();
        assert!(e.contains("an object"), "{e}");
        let e = Template::parse("{result.x}").unwrap().render(&inputs(&json!({}))).unwrap_err();
        assert!(e.contains("no result"), "{e}");
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in ["{args.a", "a}", "{nope.a}", "{args..a}", "{args.a[x]}", "{args.a[1}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Template::parse("{{lit}}").unwrap().render(&inputs(&json!({}))).unwrap(), vec!["{lit}"]);
    }

    #[test]
    fn value_templates_keep_types() {
        let v: toml::Value = toml::from_str(
            r#"names = "{result.entities[*].name}"
               first = "{args.n[0]}"
               text = "n={args.n[0]}"
               lit = 3
               nested = { deep = ["{args.n[1]}", false] }"#,
        )
        .unwrap();
        let t = ValueTemplate::from_toml(&v).unwrap();
        let args = json!({"n": [7, "b"]});
        let result = json!({"entities": [{"name": "Ann"}, {"name": "Bob"}]});
        let out = t.render(&Inputs { args: &args, result: Some(&result), snapshot: None }).unwrap();
        assert_eq!(
            out,
            json!({"names": ["Ann", "Bob"], "first": 7, "text": "n=7", "lit": 3, "nested": {"deep": ["b", false]}})
        );
    }

    #[test]
    fn result_prefers_structured_content() {
        let a = json!({"content": [{"type": "text", "text": "[1,2]"}], "structuredContent": {"x": 1}});
        assert_eq!(result_value(&a), json!({"x": 1}));
        let b = json!({"content": [{"type": "text", "text": "[1,2]"}]});
        assert_eq!(result_value(&b), json!([1, 2]));
        let c = json!({"content": [{"type": "text", "text": "plain"}, {"type": "text", "text": "!"}]});
        assert_eq!(result_value(&c), json!("plain"));
        assert_eq!(answer_text(&c), "plain!");
    }
}
