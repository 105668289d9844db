//! The dependency rules of each invariant kind of the catalogue, at field and coarser
//! granularity, on hand-made touches.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::BTreeMap;

use serde_json::json;
use tidegate_review::deps::{Checker, EdgeKind, Granularity, Side, Touch};
use tidegate_review::{TemplateSet, WriteKind};

const SET: &str = r#"
[tables.dept]
primary_key = ["id"]
[tables.emp]
primary_key = ["id"]
[tables.node]
primary_key = ["id"]
[tables.follows]
primary_key = ["a", "b"]
[tables.task]
primary_key = ["id"]
[tables.cust]
primary_key = ["id"]
[tables.cart]
primary_key = ["cart", "item"]
[tables.dorm]
primary_key = ["student"]
[tables.enrol]
primary_key = ["student"]
[tables.logbook]
primary_key = ["id"]
invariants_known = false

[[invariants]]
kind = "foreign_key"
table = "emp"
column = "dept"
parent_table = "dept"
parent_column = "id"
[[invariants]]
kind = "unique"
table = "emp"
columns = ["email"]
[[invariants]]
kind = "tree"
table = "node"
id = "id"
parent = "parent"
[[invariants]]
kind = "acyclic"
table = "follows"
from = "a"
to = "b"
[[invariants]]
kind = "ordering"
table = "task"
first = "start"
second = "end"
[[invariants]]
kind = "conditional"
table = "cust"
when_column = "vip"
then_column = "balance"
on = ["id"]
[[invariants]]
kind = "counter"
table = "cust"
column = "balance"
min = 0
[[invariants]]
kind = "size"
table = "cart"
owner = ["cart"]
max = 10
[[invariants]]
kind = "grouped"
tables = ["dorm", "enrol"]
on = ["student"]
"#;

fn t(table: &str, column: Option<&str>, kind: WriteKind, row: &[(&str, Option<i64>)]) -> Touch {
    Touch {
        table: table.into(),
        column: column.map(Into::into),
        kind,
        row: row.iter().map(|(c, v)| ((*c).to_owned(), v.map(|v| format!("n{v}")))).collect::<BTreeMap<_, _>>(),
        restore: false,
    }
}

fn dep(g: Granularity, b: Touch, n: Touch) -> Option<EdgeKind> {
    let set = TemplateSet::from_toml(SET).unwrap();
    let c = Checker::new(&set, g);
    let p = json!({});
    c.depends(Side { template: "a", params: &p, touches: &[b] }, Side { template: "b", params: &p, touches: &[n] })
}

use EdgeKind::*;
use Granularity::*;
use WriteKind::*;

#[test]
fn foreign_key_insert_of_a_child_builds_on_the_parent_insert_and_waits_for_its_delete() {
    let parent = |k, id| t("dept", None, k, &[("id", Some(id))]);
    let child = |dept| t("emp", None, Insert, &[("id", Some(9)), ("dept", dept)]);
    assert_eq!(dep(Field, parent(Insert, 1), child(Some(1))), Some(BuildsOn));
    assert_eq!(dep(Field, parent(Delete, 1), child(Some(1))), Some(Waits));
    assert_eq!(dep(Field, parent(Delete, 1), child(Some(2))), None);
    assert_eq!(dep(Field, parent(Delete, 1), child(None)), Some(Waits), "the row read at run time may be any key");
    assert_eq!(dep(Field, child(Some(1)), parent(Delete, 1)), Some(Waits));
}

#[test]
fn unique_inserts_conflict_on_equal_values_only() {
    let e = |email| t("emp", None, Insert, &[("id", Some(email + 100)), ("email", Some(email))]);
    assert_eq!(dep(Field, e(1), e(1)), Some(Waits));
    assert_eq!(dep(Field, e(1), e(2)), None);
    assert_eq!(dep(Column, e(1), e(2)), Some(Waits), "column level cannot tell the values apart");
}

#[test]
fn tree_child_insert_builds_on_the_parent_and_waits_for_its_deletion() {
    let node = |k, id, parent| t("node", None, k, &[("id", Some(id)), ("parent", parent)]);
    assert_eq!(dep(Field, node(Insert, 1, None), node(Insert, 2, Some(1))), Some(BuildsOn));
    assert_eq!(dep(Field, node(Delete, 1, None), node(Insert, 2, Some(1))), Some(Waits));
    assert_eq!(dep(Field, node(Delete, 1, None), node(Insert, 2, Some(3))), None);
}

#[test]
fn acyclic_edge_inserts_always_coordinate() {
    let e = |a, b| t("follows", None, Insert, &[("a", Some(a)), ("b", Some(b))]);
    assert_eq!(dep(Field, e(1, 2), e(2, 1)), Some(Waits));
}

#[test]
fn ordering_writes_to_either_column_of_a_row_coordinate() {
    let w = |col, id| t("task", Some(col), Set, &[("id", Some(id))]);
    assert_eq!(dep(Field, w("start", 1), w("end", 1)), Some(Waits));
    assert_eq!(dep(Field, w("start", 1), w("end", 2)), None);
}

#[test]
fn conditional_value_and_counter_rules() {
    let vip = t("cust", Some("vip"), Set, &[("id", Some(1))]);
    let dec = |id| t("cust", Some("balance"), Decrement, &[("id", Some(id))]);
    let inc = |id| t("cust", Some("balance"), Increment, &[("id", Some(id))]);
    assert_eq!(dep(Field, vip.clone(), dec(1)), Some(Waits));
    assert_eq!(dep(Field, vip, dec(2)), None);
    assert_eq!(dep(Field, dec(1), dec(1)), Some(Waits));
    assert_eq!(dep(Field, dec(1), dec(2)), None);
    assert_eq!(dep(Column, dec(1), dec(2)), Some(Waits));
    assert_eq!(dep(Field, inc(1), dec(1)), None, "an increment never breaks a lower bound");
    assert_eq!(dep(Field, dec(1), inc(1)), None);
}

#[test]
fn set_size_and_grouped_actions() {
    let add = |cart| t("cart", None, Insert, &[("cart", Some(cart)), ("item", None)]);
    assert_eq!(dep(Field, add(1), add(1)), Some(Waits));
    assert_eq!(dep(Field, add(1), add(2)), None);
    let dorm = t("dorm", None, Insert, &[("student", Some(5))]);
    let enrol = |s| t("enrol", None, Insert, &[("student", Some(s))]);
    assert_eq!(dep(Field, dorm.clone(), enrol(5)), Some(BuildsOn));
    assert_eq!(dep(Field, dorm, enrol(6)), None);
}

#[test]
fn unknown_invariants_and_table_level_coordinate_every_write_to_the_table() {
    let l = |id| t("logbook", None, Insert, &[("id", Some(id))]);
    assert_eq!(dep(Field, l(1), l(2)), Some(Waits), "the table's invariants are unknown");
    let dec = |id| t("cust", Some("balance"), Decrement, &[("id", Some(id))]);
    let inc = |id| t("cust", Some("balance"), Increment, &[("id", Some(id))]);
    assert_eq!(dep(Table, inc(1), inc(2)), Some(Waits));
    assert_eq!(dep(Table, dec(1), t("dept", None, Insert, &[("id", Some(1))])), None);
}

#[test]
fn a_restoring_compensation_waits_for_any_write_of_its_row() {
    let mut comp = t("cust", Some("vip"), Set, &[("id", Some(1))]);
    comp.restore = true;
    assert_eq!(dep(Field, comp.clone(), t("cust", Some("vip"), Set, &[("id", Some(1))])), Some(Waits));
    assert_eq!(dep(Field, comp.clone(), t("cust", Some("vip"), Set, &[("id", Some(2))])), None);
    assert_eq!(dep(Field, comp, t("cust", Some("name"), Set, &[("id", Some(1))])), None, "another column of the row");
}
