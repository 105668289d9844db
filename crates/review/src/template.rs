//! Templates: named transactions with their SQL, parameters, writes and the invariants that
//! hold, loaded from TOML or JSON (serde) or built in Rust, and validated with errors that
//! name the field.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::value::placeholders;

/// How a template's suspicious transactions are buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Hold a suspicious transaction unexecuted until a reviewer accepts it.
    BufferSuspicious,
    /// Execute a suspicious transaction at once; hold its compensation until review.
    BufferCompensating,
}

/// The kind of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteKind {
    /// Inserts the row.
    Insert,
    /// Deletes the row.
    Delete,
    /// Changes the column in a way that may depend on its old value.
    Update,
    /// Overwrites the column with a value that does not depend on the old one.
    Set,
    /// Adds a non-negative amount to the column.
    Increment,
    /// Subtracts a non-negative amount from the column.
    Decrement,
}

impl WriteKind {
    /// The kind of the write that undoes this one.
    pub fn inverse(self) -> WriteKind {
        match self {
            WriteKind::Insert => WriteKind::Delete,
            WriteKind::Delete => WriteKind::Insert,
            WriteKind::Increment => WriteKind::Decrement,
            WriteKind::Decrement => WriteKind::Increment,
            WriteKind::Update | WriteKind::Set => WriteKind::Set,
        }
    }
}

/// The declared type of a parameter (or of a list element's field). A request whose value
/// has another JSON type is refused naming the parameter, the value and the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    /// A JSON number with no fraction that fits in 64 bits.
    Integer,
    /// Any JSON number.
    Real,
    /// A JSON string.
    Text,
    /// `true` or `false`.
    Boolean,
}

impl ParamType {
    /// Whether `v` is of this type.
    pub fn admits(self, v: &serde_json::Value) -> bool {
        match self {
            ParamType::Integer => v.as_i64().is_some(),
            ParamType::Real => v.is_number(),
            ParamType::Text => v.is_string(),
            ParamType::Boolean => v.is_boolean(),
        }
    }

    /// What a value of this type is, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            ParamType::Integer => "an integer (a JSON number with no fraction, not a string)",
            ParamType::Real => "a number (a JSON number, not a string)",
            ParamType::Text => "a string",
            ParamType::Boolean => "true or false",
        }
    }
}

/// A comparison of a `check` invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    /// `column > value`
    #[serde(rename = ">")]
    Gt,
    /// `column >= value`
    #[serde(rename = ">=")]
    Ge,
    /// `column < value`
    #[serde(rename = "<")]
    Lt,
    /// `column <= value`
    #[serde(rename = "<=")]
    Le,
    /// `column = value`
    #[serde(rename = "=")]
    Eq,
    /// `column != value`
    #[serde(rename = "!=")]
    Ne,
}

/// One declared invariant (the catalogue of the source document's §3.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Invariant {
    /// The values of `columns` are unique in `table` (also: primary keys, auto-increment ids).
    Unique {
        /// The table.
        table: String,
        /// The columns that together are unique.
        columns: Vec<String>,
    },
    /// `table.column` references `parent_table.parent_column`.
    ForeignKey {
        /// The referencing (child) table.
        table: String,
        /// The referencing column.
        column: String,
        /// The referenced table.
        parent_table: String,
        /// The referenced column.
        parent_column: String,
    },
    /// `table.column <op> value` holds in every row.
    Check {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// The comparison.
        op: CmpOp,
        /// The constant compared with.
        value: f64,
    },
    /// A counter column stays within bounds.
    Counter {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// Lower bound (inclusive), if any.
        #[serde(default)]
        min: Option<f64>,
        /// Upper bound (inclusive), if any.
        #[serde(default)]
        max: Option<f64>,
    },
    /// The number of rows of `table` per value of `owner` stays within bounds (a set or list).
    Size {
        /// The table holding the elements.
        table: String,
        /// The columns naming the collection an element belongs to.
        owner: Vec<String>,
        /// Lower bound, if any.
        #[serde(default)]
        min: Option<u64>,
        /// Upper bound, if any.
        #[serde(default)]
        max: Option<u64>,
    },
    /// Rows of `table` form a tree through `parent` → `id`.
    Tree {
        /// The table.
        table: String,
        /// The node id column.
        id: String,
        /// The parent id column.
        parent: String,
    },
    /// Rows of `table` are edges `from` → `to` of a graph that stays acyclic.
    Acyclic {
        /// The edge table.
        table: String,
        /// The source column.
        from: String,
        /// The target column.
        to: String,
    },
    /// In every row, `first <= second` (a start before an end).
    Ordering {
        /// The table.
        table: String,
        /// The column that comes first.
        first: String,
        /// The column that comes second.
        second: String,
    },
    /// A row's `when_column` constrains `then_column` of the row of `then_table` with the same
    /// values of `on` (a VIP flag and a balance).
    Conditional {
        /// The table of the condition.
        table: String,
        /// The condition column.
        when_column: String,
        /// The constrained table (default: `table`).
        #[serde(default)]
        then_table: Option<String>,
        /// The constrained column.
        then_column: String,
        /// Columns (same name in both tables) that link the two rows.
        on: Vec<String>,
    },
    /// Rows with the same `on` values exist in all of `tables` or in none.
    Grouped {
        /// The tables of the group.
        tables: Vec<String>,
        /// The columns (same name in every table) that identify the group.
        on: Vec<String>,
    },
    /// A request of template `then` comes after a request of template `first` with the same
    /// values of the paired parameters.
    ProcessOrder {
        /// The template that comes first.
        first: String,
        /// The template that comes after.
        then: String,
        /// Pairs `[first's parameter, then's parameter]` that must be equal to relate two
        /// requests (empty: every pair of requests is related).
        #[serde(default)]
        on: Vec<[String; 2]>,
        /// Whether removing the first request removes the later one too (default true).
        #[serde(default = "yes")]
        cascade: bool,
    },
}

fn yes() -> bool {
    true
}

/// What is known about one table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableDecl {
    /// The primary key (an implicit `unique` invariant; derived compensations address rows by it).
    pub primary_key: Vec<String>,
    /// Whether the table's invariants are known; `false` forces table-level checks on it.
    #[serde(default = "yes")]
    pub invariants_known: bool,
}

/// What a `bind` statement does when its query returns no row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEmpty {
    /// The transaction is rolled back and reported failed.
    #[default]
    Abort,
    /// The rest of the current step iteration is skipped.
    Skip,
}

/// One SQL statement of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// SQL with `:name` placeholders (parameters, element fields, bound values).
    pub sql: String,
    /// A `SELECT` whose first row's columns become named values for later statements.
    #[serde(default)]
    pub bind: bool,
    /// For `bind`: what an empty result does.
    #[serde(default)]
    pub on_empty: OnEmpty,
}

/// A group of statements, run once, or once per element of a list parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The list parameter to iterate (its elements' fields become placeholders).
    #[serde(default)]
    pub each: Option<String>,
    /// The statements, in order.
    pub statements: Vec<Statement>,
}

/// One write a template performs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Write {
    /// The table written.
    pub table: String,
    /// The column written; none for whole-row inserts and deletes.
    #[serde(default)]
    pub column: Option<String>,
    /// The kind of write.
    pub kind: WriteKind,
    /// Known column values of the row(s) written: column → name of a parameter, element field
    /// or bound value. Parameters and element fields are known at request time; bound values
    /// only once the transaction has read the database.
    #[serde(default)]
    pub row: BTreeMap<String, String>,
    /// The list parameter this write repeats over (one row per element).
    #[serde(default)]
    pub each: Option<String>,
}

/// A named transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// The name requests use.
    pub name: String,
    /// Scalar parameters.
    #[serde(default)]
    pub params: Vec<String>,
    /// List parameters: name → the fields of each element.
    #[serde(default)]
    pub lists: BTreeMap<String, Vec<String>>,
    /// Declared types: a scalar parameter's name, or `list.field` for an element's field →
    /// its type. A parameter without one takes any scalar (its dependency checks compare
    /// canonical values, [`crate::value::SqlValue::key`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub types: BTreeMap<String, ParamType>,
    /// The statements.
    pub steps: Vec<Step>,
    /// Every write the statements perform.
    #[serde(default)]
    pub writes: Vec<Write>,
    /// A given compensation (parameters and top-level bound values are available); without
    /// one, the compensation is derived from the rows the transaction touched.
    #[serde(default)]
    pub compensation: Option<Vec<Step>>,
    /// The strategy for this template, overriding the manager's.
    #[serde(default)]
    pub strategy: Option<Strategy>,
}

impl Template {
    /// Names bound by top-level (non-`each`) bind statements.
    pub(crate) fn top_binds(&self) -> BTreeSet<String> {
        self.steps
            .iter()
            .filter(|s| s.each.is_none())
            .flat_map(|s| s.statements.iter())
            .filter(|s| s.bind)
            .flat_map(|s| select_aliases(&s.sql))
            .collect()
    }

    /// Whether the template writes nothing.
    pub fn read_only(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Templates with their tables and invariants.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSet {
    /// Table declarations.
    #[serde(default)]
    pub tables: BTreeMap<String, TableDecl>,
    /// Declared invariants.
    #[serde(default)]
    pub invariants: Vec<Invariant>,
    /// The templates.
    #[serde(default)]
    pub templates: Vec<Template>,
}

/// Column names a `SELECT` produces, read from its `AS alias` clauses and bare column names
/// of the select list (enough for the bind statements templates use).
pub(crate) fn select_aliases(sql: &str) -> Vec<String> {
    let lower = sql.to_ascii_lowercase();
    let Some(start) = lower.find("select") else { return Vec::new() };
    let end = lower.find(" from ").unwrap_or(lower.len());
    if end <= start + 6 {
        return Vec::new();
    }
    let list = &sql[start + 6..end];
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in list.chars().chain(std::iter::once(',')) {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => {
                let item = cur.trim().to_owned();
                cur.clear();
                let name = match item.to_ascii_lowercase().rfind(" as ") {
                    Some(p) => item[p + 4..].trim().to_owned(),
                    None => item.rsplit('.').next().unwrap_or(&item).trim().to_owned(),
                };
                if !name.is_empty() {
                    out.push(name);
                }
            }
            _ => cur.push(c),
        }
    }
    out
}

impl TemplateSet {
    /// Reads a set from a `.toml` or `.json` file.
    pub fn load(path: &Path) -> Result<TemplateSet> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::template(&file, "path", &file, format!("a readable file ({e})")))?;
        let set: TemplateSet = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text)
                .map_err(|e| Error::template(&file, "toml", e.message(), "a valid template set"))?,
            Some("json") => {
                serde_json::from_str(&text).map_err(|e| Error::template(&file, "json", e, "a valid template set"))?
            }
            other => return Err(Error::template(&file, "extension", format!("{other:?}"), "toml or json")),
        };
        set.validate()?;
        Ok(set)
    }

    /// Parses a TOML document.
    pub fn from_toml(text: &str) -> Result<TemplateSet> {
        let set: TemplateSet =
            toml::from_str(text).map_err(|e| Error::template("<toml>", "toml", e.message(), "a valid template set"))?;
        set.validate()?;
        Ok(set)
    }

    /// Adds `more`'s tables, invariants and templates to this set. A table or template already
    /// here must be declared exactly as before (a buffered transaction was checked against the
    /// old definition; changing it under it is refused); an identical one is skipped, as is an
    /// invariant already declared. Returns whether anything was added. The merged set is not
    /// validated here: call [`TemplateSet::validate`].
    pub fn merge(&mut self, more: TemplateSet) -> Result<bool> {
        for (name, decl) in &more.tables {
            if let Some(cur) = self.tables.get(name)
                && cur != decl
            {
                return Err(Error::template(
                    name,
                    format!("tables.{name}"),
                    format!("{decl:?}"),
                    format!("the declaration already registered ({cur:?})"),
                ));
            }
        }
        for (i, t) in more.templates.iter().enumerate() {
            if let Some(cur) = self.get(&t.name)
                && cur != t
            {
                return Err(Error::template(
                    &t.name,
                    format!("templates[{i}]"),
                    "a different definition",
                    "a name no registered template has, or the registered definition unchanged",
                ));
            }
        }
        let mut changed = false;
        for (name, decl) in more.tables {
            changed |= self.tables.insert(name, decl).is_none();
        }
        for inv in more.invariants {
            if !self.invariants.contains(&inv) {
                self.invariants.push(inv);
                changed = true;
            }
        }
        for t in more.templates {
            if self.get(&t.name).is_none() {
                self.templates.push(t);
                changed = true;
            }
        }
        Ok(changed)
    }

    /// The template called `name`.
    pub fn get(&self, name: &str) -> Option<&Template> {
        self.templates.iter().find(|t| t.name == name)
    }

    /// Every invariant, with the primary keys of declared tables as `unique` invariants.
    pub fn all_invariants(&self) -> Vec<Invariant> {
        let mut out: Vec<Invariant> = self
            .tables
            .iter()
            .map(|(t, d)| Invariant::Unique { table: t.clone(), columns: d.primary_key.clone() })
            .collect();
        out.extend(self.invariants.iter().cloned());
        out
    }

    /// Checks names, placeholders and references; the first problem is returned naming its field.
    pub fn validate(&self) -> Result<()> {
        let mut names = BTreeSet::new();
        for (ti, t) in self.templates.iter().enumerate() {
            let name = &t.name;
            if name.is_empty() {
                return Err(Error::template("", format!("templates[{ti}].name"), "", "a non-empty name"));
            }
            if !names.insert(name.clone()) {
                return Err(Error::template(
                    name,
                    format!("templates[{ti}].name"),
                    name,
                    "a name no other template has",
                ));
            }
            let mut known: BTreeSet<String> = t.params.iter().cloned().collect();
            for (l, fields) in &t.lists {
                if known.contains(l) {
                    return Err(Error::template(
                        name,
                        format!("lists.{l}"),
                        l,
                        "a name that is not also a scalar parameter",
                    ));
                }
                if fields.is_empty() {
                    return Err(Error::template(name, format!("lists.{l}"), "[]", "at least one element field"));
                }
            }
            for k in t.types.keys() {
                let ok = t.params.contains(k)
                    || k.split_once('.')
                        .is_some_and(|(l, f)| t.lists.get(l).is_some_and(|fs| fs.iter().any(|x| x == f)));
                if !ok {
                    return Err(Error::template(
                        name,
                        format!("types.{k}"),
                        k,
                        "a scalar parameter of the template, or `list.field` of a list parameter",
                    ));
                }
            }
            if t.steps.is_empty() {
                return Err(Error::template(name, "steps", "[]", "at least one step"));
            }
            let mut bound_any: BTreeSet<String> = BTreeSet::new();
            check_steps(t, &t.steps, "steps", &mut known, &mut bound_any)?;
            for (wi, w) in t.writes.iter().enumerate() {
                let f = format!("writes[{wi}]");
                if let Some(decl) = self.tables.get(&w.table) {
                    let _ = decl;
                } else if !self.tables.is_empty() {
                    return Err(Error::template(name, format!("{f}.table"), &w.table, "a table declared in `tables`"));
                }
                let needs_column =
                    matches!(w.kind, WriteKind::Update | WriteKind::Set | WriteKind::Increment | WriteKind::Decrement);
                if needs_column && w.column.is_none() {
                    return Err(Error::template(
                        name,
                        format!("{f}.column"),
                        "none",
                        format!("the column a {:?} write changes", w.kind),
                    ));
                }
                if let Some(each) = &w.each
                    && !t.lists.contains_key(each)
                {
                    return Err(Error::template(name, format!("{f}.each"), each, "a list parameter of the template"));
                }
                let elem: BTreeSet<String> =
                    w.each.as_ref().and_then(|e| t.lists.get(e)).into_iter().flatten().cloned().collect();
                for (col, src) in &w.row {
                    if !(known.contains(src) || elem.contains(src) || bound_any.contains(src)) {
                        return Err(Error::template(
                            name,
                            format!("{f}.row.{col}"),
                            src,
                            "a parameter, an element field of `each`, or a value bound by a statement",
                        ));
                    }
                }
            }
            if let Some(comp) = &t.compensation {
                let mut k: BTreeSet<String> = t.params.iter().cloned().collect();
                k.extend(t.top_binds());
                let mut b = BTreeSet::new();
                check_steps(t, comp, "compensation", &mut k, &mut b)?;
            } else if !t.writes.is_empty() && !self.tables.is_empty() {
                for (wi, w) in t.writes.iter().enumerate() {
                    if self.tables.get(&w.table).is_none_or(|d| d.primary_key.is_empty()) {
                        return Err(Error::template(
                            name,
                            format!("writes[{wi}].table"),
                            &w.table,
                            "a table with a primary key (a derived compensation addresses rows by it), or a given `compensation`",
                        ));
                    }
                }
            }
        }
        let templates: BTreeMap<&str, &Template> = self.templates.iter().map(|t| (t.name.as_str(), t)).collect();
        for (ii, inv) in self.invariants.iter().enumerate() {
            let f = format!("invariants[{ii}]");
            let tables: Vec<&String> = match inv {
                Invariant::Unique { table, .. }
                | Invariant::Check { table, .. }
                | Invariant::Counter { table, .. }
                | Invariant::Size { table, .. }
                | Invariant::Tree { table, .. }
                | Invariant::Acyclic { table, .. }
                | Invariant::Ordering { table, .. } => vec![table],
                Invariant::ForeignKey { table, parent_table, .. } => vec![table, parent_table],
                Invariant::Conditional { table, then_table, .. } => {
                    std::iter::once(table).chain(then_table.iter()).collect()
                }
                Invariant::Grouped { tables, .. } => tables.iter().collect(),
                Invariant::ProcessOrder { first, then, on, .. } => {
                    for (side, tn) in [("first", first), ("then", then)] {
                        if !templates.contains_key(tn.as_str()) {
                            return Err(Error::template(
                                tn,
                                format!("{f}.{side}"),
                                tn,
                                "the name of a template in this set",
                            ));
                        }
                    }
                    for (pi, [a, b]) in on.iter().enumerate() {
                        if !templates[first.as_str()].params.contains(a) {
                            return Err(Error::template(
                                first,
                                format!("{f}.on[{pi}][0]"),
                                a,
                                format!("a parameter of {first:?}"),
                            ));
                        }
                        if !templates[then.as_str()].params.contains(b) {
                            return Err(Error::template(
                                then,
                                format!("{f}.on[{pi}][1]"),
                                b,
                                format!("a parameter of {then:?}"),
                            ));
                        }
                    }
                    vec![]
                }
            };
            if let Invariant::Counter { min: None, max: None, .. } = inv {
                return Err(Error::template("<invariants>", format!("{f}.min"), "none", "a `min` or a `max` bound"));
            }
            for t in tables {
                if !self.tables.is_empty() && !self.tables.contains_key(t) {
                    return Err(Error::template(
                        "<invariants>",
                        format!("{f}.table"),
                        t,
                        "a table declared in `tables`",
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_steps(
    t: &Template,
    steps: &[Step],
    field: &str,
    known: &mut BTreeSet<String>,
    bound_any: &mut BTreeSet<String>,
) -> Result<()> {
    for (si, step) in steps.iter().enumerate() {
        let mut scope = known.clone();
        if let Some(each) = &step.each {
            let Some(fields) = t.lists.get(each) else {
                return Err(Error::template(
                    &t.name,
                    format!("{field}[{si}].each"),
                    each,
                    "a list parameter of the template",
                ));
            };
            scope.extend(fields.iter().cloned());
        }
        if step.statements.is_empty() {
            return Err(Error::template(&t.name, format!("{field}[{si}].statements"), "[]", "at least one statement"));
        }
        for (qi, st) in step.statements.iter().enumerate() {
            for p in placeholders(&st.sql) {
                if !scope.contains(&p) {
                    return Err(Error::template(
                        &t.name,
                        format!("{field}[{si}].statements[{qi}].sql"),
                        format!(":{p}"),
                        format!("a declared parameter or bound value (known here: {scope:?})"),
                    ));
                }
            }
            if st.bind {
                let aliases = select_aliases(&st.sql);
                if aliases.is_empty() {
                    return Err(Error::template(
                        &t.name,
                        format!("{field}[{si}].statements[{qi}].sql"),
                        &st.sql,
                        "a SELECT naming its columns (bind statements bind them)",
                    ));
                }
                scope.extend(aliases.iter().cloned());
                bound_any.extend(aliases.iter().cloned());
                if step.each.is_none() {
                    known.extend(aliases);
                }
            }
        }
    }
    Ok(())
}
