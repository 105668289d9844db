//! Executing a template on a [`Database`]: one database transaction per request, with the
//! before- and after-images of the rows it writes, from which the compensation is derived; and
//! executing a compensation. Both record a marker row in `tidegate_review_applied` inside the
//! same database transaction, so an execution is never repeated after a crash.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::db::Database;
use crate::deps::Touch;
use crate::error::{Error, Result};
use crate::template::{OnEmpty, Step, Template, TemplateSet, WriteKind};
use crate::value::{Env, Row, SqlValue, bind};

/// The marker table's schema (created by [`install_marker_table`]).
pub const MARKER_TABLE: &str = "tidegate_review_applied";

/// Creates the marker table if it does not exist.
pub fn install_marker_table(db: &mut dyn Database) -> Result<()> {
    db.batch(&format!(
        "CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (tx_id BIGINT PRIMARY KEY, phase TEXT NOT NULL, payload TEXT NOT NULL)"
    ))
}

/// One statement of a derived compensation, with its values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompStatement {
    /// SQL with `:name` placeholders.
    pub sql: String,
    /// The placeholders' values.
    pub values: Env,
    /// Rows the statement must change (a compensation that finds its row gone is refused).
    pub expect_rows: u64,
}

/// How to undo one executed transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Compensation {
    /// Derived from the images of the rows touched.
    Derived {
        /// The statements, in the order to run them.
        statements: Vec<CompStatement>,
        /// The rows the statements write (for dependency checks).
        touches: Vec<Touch>,
    },
    /// The template's given compensation, with the values bound by the execution.
    Given {
        /// Top-level bound values of the execution.
        binds: Env,
    },
}

/// Why an execution did not commit.
#[derive(Debug)]
pub enum ExecFailure {
    /// The database (or an empty `bind` with `on_empty = abort`) refused the transaction; it
    /// was rolled back and must not be retried.
    Refused(String),
    /// Anything else (connection trouble): the outcome is the error's.
    Error(Error),
}

impl From<Error> for ExecFailure {
    fn from(e: Error) -> Self {
        match e {
            Error::Database { retryable: false, op, message } => ExecFailure::Refused(format!("{op}: {message}")),
            other => ExecFailure::Error(other),
        }
    }
}

fn scalars(params: &serde_json::Value) -> Env {
    let mut env = Env::new();
    if let Some(obj) = params.as_object() {
        for (k, v) in obj {
            if let Some(s) = SqlValue::from_json(v) {
                env.insert(k.clone(), s);
            }
        }
    }
    env
}

struct Tracked {
    table: String,
    cond: Vec<(String, SqlValue)>,
    before: Vec<Row>,
}

struct Tracker<'a> {
    template: &'a Template,
    entries: Vec<Tracked>,
    seen: BTreeSet<String>,
}

impl Tracker<'_> {
    fn track(&mut self, db: &mut dyn Database, each: Option<&str>, env: &Env) -> Result<()> {
        for w in &self.template.writes {
            if w.each.as_deref() != each || w.row.is_empty() {
                continue;
            }
            let mut cond = Vec::with_capacity(w.row.len());
            for (col, src) in &w.row {
                match env.get(src) {
                    Some(v) => cond.push((col.clone(), v.clone())),
                    None => break,
                }
            }
            if cond.len() != w.row.len() {
                continue;
            }
            let id = format!("{}|{:?}", w.table, cond);
            if !self.seen.insert(id) {
                continue;
            }
            let before = select_rows(db, &w.table, &cond)?;
            self.entries.push(Tracked { table: w.table.clone(), cond, before });
        }
        Ok(())
    }
}

fn select_rows(db: &mut dyn Database, table: &str, cond: &[(String, SqlValue)]) -> Result<Vec<Row>> {
    let mut env = Env::new();
    let mut where_ = Vec::new();
    for (i, (c, v)) in cond.iter().enumerate() {
        where_.push(format!("{c} = :k{i}"));
        env.insert(format!("k{i}"), v.clone());
    }
    let sql = format!("SELECT * FROM {table} WHERE {}", where_.join(" AND "));
    let (sql, vals) = bind(&sql, &env, db.dialect())?;
    db.query(&sql, &vals)
}

/// Runs `steps` with the request's parameters plus `extra` values. Returns the top-level bound
/// values, or `Refused` when a `bind` with `on_empty = abort` finds no row.
fn run_steps(
    db: &mut dyn Database,
    steps: &[Step],
    params: &serde_json::Value,
    extra: &Env,
    mut tracker: Option<&mut Tracker<'_>>,
) -> std::result::Result<Env, ExecFailure> {
    let mut top = scalars(params);
    top.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    for step in steps {
        let elements: Vec<Option<&serde_json::Value>> = match &step.each {
            Some(list) => {
                params.get(list).and_then(|l| l.as_array()).map(|a| a.iter().map(Some).collect()).unwrap_or_default()
            }
            None => vec![None],
        };
        for elem in elements {
            let mut env = top.clone();
            if let Some(e) = elem {
                env.extend(scalars(e));
            }
            for st in &step.statements {
                if !st.bind
                    && let Some(t) = tracker.as_deref_mut()
                {
                    t.track(db, None, &top)?;
                    t.track(db, step.each.as_deref(), &env)?;
                }
                let (sql, vals) = bind(&st.sql, &env, db.dialect())?;
                if st.bind {
                    let rows = db.query(&sql, &vals)?;
                    match rows.into_iter().next() {
                        Some(row) => {
                            for (k, v) in row {
                                if step.each.is_none() {
                                    top.insert(k.clone(), v.clone());
                                }
                                env.insert(k, v);
                            }
                        }
                        None => match st.on_empty {
                            OnEmpty::Skip => break,
                            OnEmpty::Abort => return Err(ExecFailure::Refused(format!("no row for {:?}", st.sql))),
                        },
                    }
                } else {
                    db.execute(&sql, &vals)?;
                }
            }
        }
    }
    Ok(top)
}

/// Executes a request of `t` in one database transaction, records the marker for `tx_id`, and
/// returns the compensation when `compensate` is set.
pub fn execute(
    db: &mut dyn Database,
    set: &TemplateSet,
    t: &Template,
    params: &serde_json::Value,
    tx_id: u64,
    compensate: bool,
) -> std::result::Result<Option<Compensation>, ExecFailure> {
    db.begin()?;
    let r = execute_in(db, set, t, params, tx_id, compensate);
    match r {
        Ok(c) => {
            db.commit()?;
            Ok(c)
        }
        Err(e) => {
            db.rollback().map_err(ExecFailure::Error)?;
            Err(e)
        }
    }
}

fn execute_in(
    db: &mut dyn Database,
    set: &TemplateSet,
    t: &Template,
    params: &serde_json::Value,
    tx_id: u64,
    compensate: bool,
) -> std::result::Result<Option<Compensation>, ExecFailure> {
    let derive = compensate && t.compensation.is_none() && !t.writes.is_empty();
    let mut tracker = Tracker { template: t, entries: Vec::new(), seen: BTreeSet::new() };
    let binds = run_steps(db, &t.steps, params, &Env::new(), if derive { Some(&mut tracker) } else { None })?;
    let comp = if !compensate {
        None
    } else if t.compensation.is_some() {
        let top = t.top_binds();
        Some(Compensation::Given { binds: binds.into_iter().filter(|(k, _)| top.contains(k)).collect() })
    } else {
        Some(derive_compensation(db, set, t, tracker.entries)?)
    };
    let payload = serde_json::to_string(&comp).map_err(|e| ExecFailure::Error(Error::db("marker", e, false)))?;
    let env: Env = [("id".to_owned(), SqlValue::Int(tx_id as i64)), ("p".to_owned(), SqlValue::Text(payload))].into();
    let (sql, vals) = bind(
        &format!("INSERT INTO {MARKER_TABLE} (tx_id, phase, payload) VALUES (:id, 'executed', :p)"),
        &env,
        db.dialect(),
    )?;
    db.execute(&sql, &vals)?;
    Ok(comp)
}

fn derive_compensation(
    db: &mut dyn Database,
    set: &TemplateSet,
    t: &Template,
    entries: Vec<Tracked>,
) -> Result<Compensation> {
    // Kinds declared per (table, column): a column only incremented/decremented gets the
    // inverse delta (it commutes with other deltas), any other change its old value back.
    let mut kinds: BTreeMap<(&str, &str), BTreeSet<WriteKind>> = BTreeMap::new();
    for w in &t.writes {
        if let Some(c) = &w.column {
            kinds.entry((w.table.as_str(), c.as_str())).or_default().insert(w.kind);
        }
    }
    let mut seen = BTreeSet::new();
    let mut stmts = Vec::new();
    let mut touches = Vec::new();
    for e in entries {
        let pk = &set
            .tables
            .get(&e.table)
            .ok_or_else(|| {
                Error::template(&t.name, "writes.table", &e.table, "a declared table (to derive a compensation)")
            })?
            .primary_key;
        let after = select_rows(db, &e.table, &e.cond)?;
        let key_of = |r: &Row| -> Vec<SqlValue> {
            pk.iter()
                .map(|c| r.iter().find(|(n, _)| n == c).map(|(_, v)| v.clone()).unwrap_or(SqlValue::Null))
                .collect()
        };
        let mut rows: BTreeMap<String, (Option<Row>, Option<Row>)> = BTreeMap::new();
        for r in e.before {
            let k = format!("{:?}", key_of(&r));
            rows.entry(k).or_default().0 = Some(r);
        }
        for r in after {
            let k = format!("{:?}", key_of(&r));
            rows.entry(k).or_default().1 = Some(r);
        }
        for (k, (b, a)) in rows {
            if !seen.insert(format!("{}|{k}", e.table)) {
                continue;
            }
            let any = b.as_ref().or(a.as_ref()).cloned().unwrap_or_default();
            let mut values = Env::new();
            let mut wh = Vec::new();
            for (i, c) in pk.iter().enumerate() {
                let v = any.iter().find(|(n, _)| n == c).map(|(_, v)| v.clone()).unwrap_or(SqlValue::Null);
                wh.push(format!("{c} = :k{i}"));
                values.insert(format!("k{i}"), v);
            }
            let row_keys = |r: &Row| r.iter().map(|(n, v)| (n.clone(), Some(v.key()))).collect::<BTreeMap<_, _>>();
            match (b, a) {
                (None, Some(a)) => {
                    stmts.push(CompStatement {
                        sql: format!("DELETE FROM {} WHERE {}", e.table, wh.join(" AND ")),
                        values,
                        expect_rows: 1,
                    });
                    touches.push(Touch {
                        table: e.table.clone(),
                        column: None,
                        kind: WriteKind::Delete,
                        row: row_keys(&a),
                        restore: true,
                    });
                }
                (Some(b), None) => {
                    let cols: Vec<&str> = b.iter().map(|(n, _)| n.as_str()).collect();
                    let mut vals = Env::new();
                    let mut ph = Vec::new();
                    for (i, (_, v)) in b.iter().enumerate() {
                        vals.insert(format!("c{i}"), v.clone());
                        ph.push(format!(":c{i}"));
                    }
                    stmts.push(CompStatement {
                        sql: format!("INSERT INTO {} ({}) VALUES ({})", e.table, cols.join(", "), ph.join(", ")),
                        values: vals,
                        expect_rows: 1,
                    });
                    touches.push(Touch {
                        table: e.table.clone(),
                        column: None,
                        kind: WriteKind::Insert,
                        row: row_keys(&b),
                        restore: true,
                    });
                }
                (Some(b), Some(a)) => {
                    let mut sets = Vec::new();
                    for (i, ((n, vb), (_, va))) in b.iter().zip(a.iter()).enumerate() {
                        if vb == va {
                            continue;
                        }
                        let delta_only = kinds.get(&(e.table.as_str(), n.as_str())).is_some_and(|k| {
                            k.iter().all(|k| matches!(k, WriteKind::Increment | WriteKind::Decrement))
                        });
                        let (kind, restore) = match (delta_only, vb, va) {
                            (true, SqlValue::Int(x), SqlValue::Int(y)) => {
                                sets.push(format!("{n} = {n} - :d{i}"));
                                values.insert(format!("d{i}"), SqlValue::Int(y - x));
                                (if y > x { WriteKind::Decrement } else { WriteKind::Increment }, false)
                            }
                            (true, _, _) if vb.as_f64().is_some() && va.as_f64().is_some() => {
                                let (x, y) = (vb.as_f64().unwrap_or(0.0), va.as_f64().unwrap_or(0.0));
                                sets.push(format!("{n} = {n} - :d{i}"));
                                values.insert(format!("d{i}"), SqlValue::Real(y - x));
                                (if y > x { WriteKind::Decrement } else { WriteKind::Increment }, false)
                            }
                            _ => {
                                sets.push(format!("{n} = :d{i}"));
                                values.insert(format!("d{i}"), vb.clone());
                                (WriteKind::Set, true)
                            }
                        };
                        touches.push(Touch {
                            table: e.table.clone(),
                            column: Some(n.clone()),
                            kind,
                            row: row_keys(&b),
                            restore,
                        });
                    }
                    if !sets.is_empty() {
                        stmts.push(CompStatement {
                            sql: format!("UPDATE {} SET {} WHERE {}", e.table, sets.join(", "), wh.join(" AND ")),
                            values,
                            expect_rows: 1,
                        });
                    }
                }
                (None, None) => {}
            }
        }
    }
    stmts.reverse();
    Ok(Compensation::Derived { statements: stmts, touches })
}

/// Runs the compensation of transaction `tx_id` in one database transaction and marks it.
pub fn compensate(
    db: &mut dyn Database,
    t: &Template,
    params: &serde_json::Value,
    comp: &Compensation,
    tx_id: u64,
) -> std::result::Result<(), ExecFailure> {
    db.begin()?;
    let r = (|| -> std::result::Result<(), ExecFailure> {
        match comp {
            Compensation::Derived { statements, .. } => {
                for s in statements {
                    let (sql, vals) = bind(&s.sql, &s.values, db.dialect())?;
                    let n = db.execute(&sql, &vals)?;
                    if n != s.expect_rows {
                        return Err(ExecFailure::Refused(format!(
                            "{sql}: changed {n} rows, expected {}",
                            s.expect_rows
                        )));
                    }
                }
            }
            Compensation::Given { binds } => {
                let steps = t.compensation.as_deref().unwrap_or(&[]);
                run_steps(db, steps, params, binds, None)?;
            }
        }
        let env: Env = [("id".to_owned(), SqlValue::Int(tx_id as i64))].into();
        let (sql, vals) =
            bind(&format!("UPDATE {MARKER_TABLE} SET phase = 'compensated' WHERE tx_id = :id"), &env, db.dialect())?;
        db.execute(&sql, &vals)?;
        Ok(())
    })();
    match r {
        Ok(()) => {
            db.commit()?;
            Ok(())
        }
        Err(e) => {
            db.rollback().map_err(ExecFailure::Error)?;
            Err(e)
        }
    }
}

/// The marker of `tx_id`: its phase and the compensation recorded with the execution.
pub fn read_marker(db: &mut dyn Database, tx_id: u64) -> Result<Option<(String, Option<Compensation>)>> {
    let env: Env = [("id".to_owned(), SqlValue::Int(tx_id as i64))].into();
    let (sql, vals) =
        bind(&format!("SELECT phase, payload FROM {MARKER_TABLE} WHERE tx_id = :id"), &env, db.dialect())?;
    let rows = db.query(&sql, &vals)?;
    let Some(row) = rows.into_iter().next() else { return Ok(None) };
    let phase = match &row[0].1 {
        SqlValue::Text(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let comp = match &row[1].1 {
        SqlValue::Text(s) => serde_json::from_str(s).map_err(|e| Error::db("marker payload", e, false))?,
        _ => None,
    };
    Ok(Some((phase, comp)))
}
