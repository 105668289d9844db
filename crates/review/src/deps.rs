//! Invariant-aware dependency checks between a buffered transaction and a new one.
//!
//! Each transaction is described by its **touches**: one per row it writes (per element for
//! `each` writes), with the table, the column (none for whole-row inserts and deletes), the
//! write kind and the row's known column values. A value read from the database at execution
//! time is unknown (`None`) at check time. A rule of the invariant catalogue relates two touches
//! when their kinds can together break the invariant and their locations may coincide; the
//! location is compared at the finest granularity both the information and the configured
//! [`Granularity`] allow (a column unknown on either side is assumed equal).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::template::{CmpOp, Invariant, Template, TemplateSet, WriteKind};
use crate::value::SqlValue;

/// The finest location a dependency check may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// Same table, column and row (complete query and invariant information).
    Field,
    /// Same row of the table, any column.
    Row,
    /// Same column of the table, any row.
    Column,
    /// Same table (invariants unknown: the document's baseline).
    Table,
}

/// One row a transaction writes (or its compensation would write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Touch {
    /// The table.
    pub table: String,
    /// The column; `None` for a whole row.
    pub column: Option<String>,
    /// The kind of write.
    pub kind: WriteKind,
    /// Known column values of the row (`None`: read from the database at execution time).
    pub row: BTreeMap<String, Option<String>>,
    /// The write restores an earlier image (a derived compensation of an insert, delete,
    /// update or set), so any other write to the same location would be lost or break it.
    #[serde(default)]
    pub restore: bool,
}

/// How a new transaction depends on a buffered one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// Held until the buffered one is resolved, then runs whatever happened to it.
    Waits,
    /// Presupposes the buffered one's effect: removed if it is removed or fails.
    BuildsOn,
}

/// The touches of a request of `t` with `params`, as known before execution. Row values are
/// canonical ([`SqlValue::key`]): `1`, `1.0` and `"1"` name the same row, as the database
/// coerces them (issue 27 item 6).
pub fn request_touches(t: &Template, params: &serde_json::Value) -> Vec<Touch> {
    let mut out = Vec::new();
    for w in &t.writes {
        let known = |src: &str, elem: Option<&serde_json::Value>| -> Option<String> {
            elem.and_then(|e| e.get(src)).or_else(|| params.get(src)).and_then(SqlValue::from_json).map(|v| v.key())
        };
        let mk = |elem: Option<&serde_json::Value>| Touch {
            table: w.table.clone(),
            column: w.column.clone(),
            kind: w.kind,
            row: w.row.iter().map(|(c, src)| (c.clone(), known(src, elem))).collect(),
            restore: false,
        };
        match &w.each {
            Some(list) => {
                for e in params.get(list).and_then(|l| l.as_array()).into_iter().flatten() {
                    out.push(mk(Some(e)));
                }
            }
            None => out.push(mk(None)),
        }
    }
    out
}

/// The touches of the derived compensation of a request, predicted before execution.
pub fn predicted_compensation(touches: &[Touch]) -> Vec<Touch> {
    touches
        .iter()
        .map(|t| Touch {
            kind: t.kind.inverse(),
            restore: !matches!(t.kind, WriteKind::Increment | WriteKind::Decrement),
            ..t.clone()
        })
        .collect()
}

/// One side of a check: a transaction's template, parameters and touches.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// The template name.
    pub template: &'a str,
    /// The request's parameters.
    pub params: &'a serde_json::Value,
    /// The touches to compare.
    pub touches: &'a [Touch],
}

/// How a buffered side's touches relate to its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// Its own writes, not yet applied: a new transaction may presuppose their effect
    /// (`builds_on`).
    Writes,
    /// Its compensation, held until review: it undoes an effect, so nothing can presuppose it
    /// and a new transaction at most waits for it (issue 27 item 3).
    Compensation,
}

/// The dependency checker: the invariants of a template set at a granularity.
#[derive(Debug, Clone)]
pub struct Checker {
    invariants: Vec<Invariant>,
    unknown_tables: Vec<String>,
    granularity: Granularity,
}

impl Checker {
    /// A checker over `set`'s invariants (primary keys included) at `granularity`.
    pub fn new(set: &TemplateSet, granularity: Granularity) -> Checker {
        Checker {
            invariants: set.all_invariants(),
            unknown_tables: set.tables.iter().filter(|(_, d)| !d.invariants_known).map(|(t, _)| t.clone()).collect(),
            granularity,
        }
    }

    /// The configured granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// Whether `n` (new) depends on `b` (buffered, its own writes), and how.
    pub fn depends(&self, b: Side<'_>, n: Side<'_>) -> Option<EdgeKind> {
        self.depends_on(b, Item::Writes, n)
    }

    /// Whether `n` (new) depends on `b`, whose touches are `item`, and how. Besides the rules
    /// of the invariant catalogue, two rules keep a removal traceless whatever the invariants:
    /// a whole-row delete waits for any buffered write of that row (the write, or its
    /// compensation, needs the row: issue 27 item 1), and an assignment (`set`, `update`)
    /// waits for a buffered increment or decrement of the same field and vice versa (an
    /// inverse delta does not commute with an assignment: item 2).
    pub fn depends_on(&self, b: Side<'_>, item: Item, n: Side<'_>) -> Option<EdgeKind> {
        let mut found: Option<EdgeKind> = None;
        let cap = |k: EdgeKind| if item == Item::Compensation { EdgeKind::Waits } else { k };
        let mut note = |k: EdgeKind| found = Some(found.map_or(k, |f| f.max(k)));
        for tb in b.touches {
            for tn in n.touches {
                if tb.table == tn.table
                    && (self.granularity == Granularity::Table || self.unknown_tables.contains(&tb.table))
                {
                    note(EdgeKind::Waits);
                    continue;
                }
                // At table granularity two different tables still meet through the invariants
                // that span tables (a foreign key, a conditional on another table, a grouped
                // set): `open_account(5)` and `open_loan(account = 5)` are in different tables,
                // and the loan's row keeps the account's compensation from running.
                if tb.restore && tb.table == tn.table && self.cols_meet(tb, tn) && self.rows_match(tb, tn) {
                    note(EdgeKind::Waits);
                }
                if self.row_gone(tb, tn) || self.delta_meets_assign(tb, tn) || self.chosen_by_read(tb, tn) {
                    note(EdgeKind::Waits);
                }
                for inv in &self.invariants {
                    if let Some(k) = self.rule(inv, tb, tn) {
                        note(cap(k));
                    }
                }
            }
        }
        for inv in &self.invariants {
            if let Invariant::ProcessOrder { first, then, on, cascade } = inv
                && b.template == first
                && n.template == then
            {
                let related = self.granularity >= Granularity::Column
                    || on.iter().all(|[pa, pn]| match (b.params.get(pa), n.params.get(pn)) {
                        (Some(x), Some(y)) => match (SqlValue::from_json(x), SqlValue::from_json(y)) {
                            (Some(x), Some(y)) => x.key() == y.key(),
                            _ => x == y,
                        },
                        _ => true,
                    });
                if related {
                    note(if *cascade { EdgeKind::BuildsOn } else { EdgeKind::Waits });
                }
            }
        }
        found
    }

    /// Whether two pending writes may touch the same location (the same field, or a whole row
    /// and any field of it) at this granularity in a way whose order can change an outcome: a
    /// new one is then held behind a held one that will run (docs/review.md invariant 4 and
    /// rule 5). Two deltas of one field that no invariant bounds in a direction either moves
    /// toward commute (`w_ytd + 10` and `w_ytd + 20` give the same row and the same outcomes in
    /// either order), so they need no order.
    pub fn overlaps(&self, b: &[Touch], n: &[Touch]) -> bool {
        b.iter().any(|tb| {
            n.iter().any(|tn| {
                tb.table == tn.table
                    && (self.granularity == Granularity::Table
                        || self.unknown_tables.contains(&tb.table)
                        || (self.cols_meet(tb, tn) && self.rows_match(tb, tn) && !self.commute(tb, tn)))
            })
        })
    }

    /// Two deltas of the same column, rows known on both sides, that no invariant on that
    /// column can tell apart in either order.
    fn commute(&self, tb: &Touch, tn: &Touch) -> bool {
        use WriteKind::{Decrement, Increment};
        let delta = |k: WriteKind| matches!(k, Increment | Decrement);
        let Some(col) = tb.column.as_deref() else { return false };
        if !delta(tb.kind)
            || !delta(tn.kind)
            || tn.column.as_deref() != Some(col)
            || tb.row.values().chain(tn.row.values()).any(Option::is_none)
        {
            return false;
        }
        let either = |k: WriteKind| tb.kind == k || tn.kind == k;
        let on = |t: &str, c: &str| t == tb.table && c == col;
        !self.invariants.iter().any(|inv| match inv {
            Invariant::Check { table, column, op, .. } if on(table, column) => match op {
                CmpOp::Gt | CmpOp::Ge => either(Decrement),
                CmpOp::Lt | CmpOp::Le => either(Increment),
                CmpOp::Eq | CmpOp::Ne => true,
            },
            Invariant::Counter { table, column, min, max } if on(table, column) => {
                (min.is_some() && either(Decrement)) || (max.is_some() && either(Increment))
            }
            Invariant::Ordering { table, first, second } => on(table, first) || on(table, second),
            Invariant::Conditional { table, when_column, then_table, then_column, .. } => {
                on(table, when_column) || on(then_table.as_ref().unwrap_or(table), then_column)
            }
            _ => false,
        })
    }

    /// `n` deletes a whole row that `b` writes (any kind, any column).
    fn row_gone(&self, tb: &Touch, tn: &Touch) -> bool {
        tn.kind == WriteKind::Delete && tn.column.is_none() && tb.table == tn.table && self.rows_match(tb, tn)
    }

    /// `n` changes a row it chooses by reading the database (a key column bound from a
    /// `SELECT`, e.g. the richest account), and `b` writes the same column of that table,
    /// any row: `b`'s effect, or its compensation, can change which row `n` chooses, so a
    /// removal of `b` would leave a trace (docs/review.md rule 8). Inserts with a bound key
    /// (a generated id) are outside: generated values are not part of the promise.
    fn chosen_by_read(&self, tb: &Touch, tn: &Touch) -> bool {
        tn.kind != WriteKind::Insert
            && tb.table == tn.table
            && tn.row.values().any(Option::is_none)
            && match (&tb.column, &tn.column) {
                (Some(x), Some(y)) => x == y,
                _ => true,
            }
    }

    /// One of `b`, `n` adds to or subtracts from a field the other assigns.
    fn delta_meets_assign(&self, tb: &Touch, tn: &Touch) -> bool {
        let delta = |k: WriteKind| matches!(k, WriteKind::Increment | WriteKind::Decrement);
        let assigns = |k: WriteKind| matches!(k, WriteKind::Update | WriteKind::Set);
        ((delta(tb.kind) && assigns(tn.kind)) || (assigns(tb.kind) && delta(tn.kind)))
            && tb.table == tn.table
            && tb.column.is_some()
            && tn.column.is_some()
            && self.cols_meet(tb, tn)
            && self.rows_match(tb, tn)
    }

    /// Whether the values of `cb` in `b` and `cn` in `n` may be equal, column by column.
    fn keys_match(&self, b: &Touch, cb: &[String], n: &Touch, cn: &[String]) -> bool {
        if self.granularity >= Granularity::Column {
            return true;
        }
        cb.iter().zip(cn).all(|(x, y)| match (b.row.get(x), n.row.get(y)) {
            (Some(Some(vx)), Some(Some(vy))) => vx == vy,
            _ => true,
        })
    }

    /// Whether two touches of one table may be the same row (columns known on both compared).
    fn rows_match(&self, b: &Touch, n: &Touch) -> bool {
        if self.granularity >= Granularity::Column {
            return true;
        }
        b.row.iter().all(|(c, vb)| match (vb, n.row.get(c)) {
            (Some(x), Some(Some(y))) => x == y,
            _ => true,
        })
    }

    /// Whether two touches may write the same column.
    fn cols_meet(&self, b: &Touch, n: &Touch) -> bool {
        if self.granularity == Granularity::Row {
            return true;
        }
        match (&b.column, &n.column) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
    }

    fn on_col(&self, t: &Touch, col: &str) -> bool {
        self.granularity == Granularity::Row || t.column.as_deref() == Some(col)
    }

    fn same_field(&self, tb: &Touch, tn: &Touch, table: &str, col: &str) -> bool {
        tb.table == table
            && tn.table == table
            && self.on_col(tb, col)
            && self.on_col(tn, col)
            && self.rows_match(tb, tn)
    }

    fn rule(&self, inv: &Invariant, tb: &Touch, tn: &Touch) -> Option<EdgeKind> {
        use EdgeKind::*;
        use WriteKind::*;
        let yes = |c: bool, k: EdgeKind| if c { Some(k) } else { None };
        let assigns = |k: WriteKind| matches!(k, Update | Set);
        let changes = |k: WriteKind| matches!(k, Update | Set | Increment | Decrement);
        match inv {
            Invariant::Unique { table, columns } => {
                let writes_key = |t: &Touch| {
                    t.kind == Insert || (assigns(t.kind) && t.column.as_ref().is_some_and(|c| columns.contains(c)))
                };
                yes(
                    tb.table == *table
                        && tn.table == *table
                        && writes_key(tb)
                        && writes_key(tn)
                        && self.keys_match(tb, columns, tn, columns),
                    Waits,
                )
            }
            Invariant::ForeignKey { table, column, parent_table, parent_column } => {
                let pc = std::slice::from_ref(parent_column);
                let cc = std::slice::from_ref(column);
                let parent_w = |t: &Touch| {
                    t.table == *parent_table
                        && (matches!(t.kind, Insert | Delete)
                            || (assigns(t.kind) && t.column.as_ref() == Some(parent_column)))
                };
                let child_w = |t: &Touch| {
                    t.table == *table && (t.kind == Insert || (assigns(t.kind) && t.column.as_ref() == Some(column)))
                };
                if parent_w(tb) && child_w(tn) && self.keys_match(tb, pc, tn, cc) {
                    return Some(if tb.kind == Insert && tn.kind == Insert { BuildsOn } else { Waits });
                }
                let parent_gone = |t: &Touch| {
                    t.table == *parent_table
                        && (t.kind == Delete || (assigns(t.kind) && t.column.as_ref() == Some(parent_column)))
                };
                yes(child_w(tb) && parent_gone(tn) && self.keys_match(tb, cc, tn, pc), Waits)
            }
            Invariant::Check { table, column, op, .. } => {
                let (lower, upper) = match op {
                    CmpOp::Gt | CmpOp::Ge => (true, false),
                    CmpOp::Lt | CmpOp::Le => (false, true),
                    CmpOp::Eq | CmpOp::Ne => (false, false),
                };
                self.bounds(tb, tn, table, column, lower, upper, !lower && !upper)
            }
            Invariant::Counter { table, column, min, max } => {
                self.bounds(tb, tn, table, column, min.is_some(), max.is_some(), false)
            }
            Invariant::Size { table, owner, min, max } => yes(
                tb.table == *table
                    && tn.table == *table
                    && ((max.is_some() && tb.kind == Insert && tn.kind == Insert)
                        || (min.is_some() && tb.kind == Delete && tn.kind == Delete))
                    && self.keys_match(tb, owner, tn, owner),
                Waits,
            ),
            Invariant::Tree { table, id, parent } => {
                if tb.table != *table || tn.table != *table {
                    return None;
                }
                let i = std::slice::from_ref(id);
                let p = std::slice::from_ref(parent);
                match (tb.kind, tn.kind) {
                    (Insert, Insert) if self.keys_match(tb, i, tn, p) => Some(BuildsOn),
                    (Delete, Insert) if self.keys_match(tb, i, tn, p) => Some(Waits),
                    (Insert, Delete) if self.keys_match(tb, p, tn, i) => Some(Waits),
                    (kb, kn) if assigns(kb) && assigns(kn) && self.on_col(tb, parent) && self.on_col(tn, parent) => {
                        Some(Waits)
                    }
                    _ => None,
                }
            }
            Invariant::Acyclic { table, from, to } => {
                let adds =
                    |t: &Touch| t.kind == Insert || (assigns(t.kind) && (self.on_col(t, from) || self.on_col(t, to)));
                yes(tb.table == *table && tn.table == *table && adds(tb) && adds(tn), Waits)
            }
            Invariant::Ordering { table, first, second } => {
                let on = |t: &Touch| changes(t.kind) && (self.on_col(t, first) || self.on_col(t, second));
                yes(tb.table == *table && tn.table == *table && on(tb) && on(tn) && self.rows_match(tb, tn), Waits)
            }
            Invariant::Conditional { table, when_column, then_table, then_column, on } => {
                let tt = then_table.as_ref().unwrap_or(table);
                let hits = |t: &Touch, tab: &str, col: &str| {
                    t.table == tab && (t.kind == Insert || (changes(t.kind) && self.on_col(t, col)))
                };
                let cross = (hits(tb, table, when_column) && hits(tn, tt, then_column))
                    || (hits(tb, tt, then_column) && hits(tn, table, when_column));
                yes(cross && self.keys_match(tb, on, tn, on), Waits)
            }
            Invariant::Grouped { tables, on } => {
                let member = |t: &Touch| tables.contains(&t.table) && matches!(t.kind, Insert | Delete);
                if member(tb) && member(tn) && self.keys_match(tb, on, tn, on) {
                    Some(if tb.kind == Insert && tn.kind == Insert && tb.table != tn.table { BuildsOn } else { Waits })
                } else {
                    None
                }
            }
            Invariant::ProcessOrder { .. } => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bounds(
        &self,
        tb: &Touch,
        tn: &Touch,
        table: &str,
        col: &str,
        lower: bool,
        upper: bool,
        exact: bool,
    ) -> Option<EdgeKind> {
        use WriteKind::*;
        if !self.same_field(tb, tn, table, col) {
            return None;
        }
        let assigns = |k: WriteKind| matches!(k, Update | Set);
        let delta = |k: WriteKind| matches!(k, Increment | Decrement);
        let hit = (lower && tb.kind == Decrement && tn.kind == Decrement)
            || (upper && tb.kind == Increment && tn.kind == Increment)
            || (exact && assigns(tb.kind) && assigns(tn.kind))
            || (!exact
                && (assigns(tb.kind) && (assigns(tn.kind) || delta(tn.kind)) || (assigns(tn.kind) && delta(tb.kind))));
        if hit { Some(EdgeKind::Waits) } else { None }
    }
}
