//! TPC-C, written from the specification: the nine tables, a loader for a scaled-down
//! population, the five transaction types in the standard mix as templates with their
//! invariants (`tpcc.toml`), a seeded request generator, and the consistency conditions of
//! clause 3.3.2 checked with SQL.
//!
//! Deviations from the specification, all for size or portability: money is in integer cents;
//! dates are integers; text columns hold short strings (no `c_data`/`s_dist_xx` payloads); the
//! counts of districts, customers and items are configurable (1 warehouse, 10 districts,
//! 30 customers and 100 items per district in tests); the customer's bad-credit `c_data` update
//! of Payment is left out; `history` has a key `h_id` (the generator's), so that a derived
//! compensation can address the row. Condition 11 (orders minus new orders equals the loaded
//! difference) is not checked: it only holds before the first Delivery.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::db::Database;
use crate::error::{Error, Result};
use crate::template::TemplateSet;
use crate::value::{Dialect, SqlValue};

/// The TPC-C templates and invariants (TOML).
pub const TEMPLATES: &str = include_str!("tpcc.toml");

/// The TPC-C template set.
pub fn templates() -> Result<TemplateSet> {
    TemplateSet::from_toml(TEMPLATES)
}

/// Scale of a TPC-C database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scale {
    /// Warehouses (specification: any; here 1 by default).
    pub warehouses: i64,
    /// Districts per warehouse (specification: 10).
    pub districts: i64,
    /// Customers per district (specification: 3,000); also the orders loaded per district.
    pub customers: i64,
    /// Items (specification: 100,000).
    pub items: i64,
}

impl Scale {
    /// A small database for tests: 1 warehouse, 10 districts, 30 customers, 100 items.
    pub fn tiny() -> Scale {
        Scale { warehouses: 1, districts: 10, customers: 30, items: 100 }
    }
}

/// The schema (portable SQLite/PostgreSQL).
pub const SCHEMA: &str = "
CREATE TABLE warehouse (w_id BIGINT PRIMARY KEY, w_name TEXT NOT NULL, w_tax BIGINT NOT NULL, w_ytd BIGINT NOT NULL);
CREATE TABLE district (d_w_id BIGINT NOT NULL REFERENCES warehouse (w_id), d_id BIGINT NOT NULL, d_name TEXT NOT NULL,
  d_tax BIGINT NOT NULL, d_ytd BIGINT NOT NULL, d_next_o_id BIGINT NOT NULL CHECK (d_next_o_id >= 1), PRIMARY KEY (d_w_id, d_id));
CREATE TABLE customer (c_w_id BIGINT NOT NULL, c_d_id BIGINT NOT NULL, c_id BIGINT NOT NULL, c_first TEXT NOT NULL,
  c_last TEXT NOT NULL, c_credit TEXT NOT NULL, c_discount BIGINT NOT NULL, c_balance BIGINT NOT NULL,
  c_ytd_payment BIGINT NOT NULL, c_payment_cnt BIGINT NOT NULL, c_delivery_cnt BIGINT NOT NULL,
  PRIMARY KEY (c_w_id, c_d_id, c_id), FOREIGN KEY (c_w_id, c_d_id) REFERENCES district (d_w_id, d_id));
CREATE TABLE history (h_id TEXT PRIMARY KEY, h_c_id BIGINT NOT NULL, h_c_d_id BIGINT NOT NULL, h_c_w_id BIGINT NOT NULL,
  h_d_id BIGINT NOT NULL, h_w_id BIGINT NOT NULL, h_date BIGINT NOT NULL, h_amount BIGINT NOT NULL,
  FOREIGN KEY (h_c_w_id, h_c_d_id, h_c_id) REFERENCES customer (c_w_id, c_d_id, c_id));
CREATE TABLE orders (o_w_id BIGINT NOT NULL, o_d_id BIGINT NOT NULL, o_id BIGINT NOT NULL, o_c_id BIGINT NOT NULL,
  o_entry_d BIGINT NOT NULL, o_carrier_id BIGINT, o_ol_cnt BIGINT NOT NULL, o_all_local BIGINT NOT NULL,
  PRIMARY KEY (o_w_id, o_d_id, o_id), FOREIGN KEY (o_w_id, o_d_id, o_c_id) REFERENCES customer (c_w_id, c_d_id, c_id));
CREATE TABLE new_order (no_w_id BIGINT NOT NULL, no_d_id BIGINT NOT NULL, no_o_id BIGINT NOT NULL,
  PRIMARY KEY (no_w_id, no_d_id, no_o_id), FOREIGN KEY (no_w_id, no_d_id, no_o_id) REFERENCES orders (o_w_id, o_d_id, o_id));
CREATE TABLE item (i_id BIGINT PRIMARY KEY, i_name TEXT NOT NULL, i_price BIGINT NOT NULL CHECK (i_price > 0));
CREATE TABLE order_line (ol_w_id BIGINT NOT NULL, ol_d_id BIGINT NOT NULL, ol_o_id BIGINT NOT NULL, ol_number BIGINT NOT NULL,
  ol_i_id BIGINT NOT NULL REFERENCES item (i_id), ol_supply_w_id BIGINT NOT NULL, ol_delivery_d BIGINT,
  ol_quantity BIGINT NOT NULL, ol_amount BIGINT NOT NULL, PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number),
  FOREIGN KEY (ol_w_id, ol_d_id, ol_o_id) REFERENCES orders (o_w_id, o_d_id, o_id));
CREATE TABLE stock (s_w_id BIGINT NOT NULL REFERENCES warehouse (w_id), s_i_id BIGINT NOT NULL REFERENCES item (i_id),
  s_quantity BIGINT NOT NULL CHECK (s_quantity >= 0), s_ytd BIGINT NOT NULL, s_order_cnt BIGINT NOT NULL,
  s_remote_cnt BIGINT NOT NULL, PRIMARY KEY (s_w_id, s_i_id));
CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id);
CREATE INDEX customer_name ON customer (c_w_id, c_d_id, c_last, c_first);
CREATE INDEX history_customer ON history (h_c_w_id, h_c_d_id, h_c_id);
CREATE INDEX history_district ON history (h_w_id, h_d_id);
";

const SYLLABLES: [&str; 10] = ["BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"];

/// The customer last name of number `n` (clause 4.3.2.3: three syllables from its digits).
pub fn last_name(n: i64) -> String {
    let n = n.rem_euclid(1000) as usize;
    format!("{}{}{}", SYLLABLES[n / 100], SYLLABLES[(n / 10) % 10], SYLLABLES[n % 10])
}

/// The name number of customer `c_id` in a district of `customers`: about three customers share
/// each name, so Payment by name has several to choose from.
fn name_number(c_id: i64, customers: i64) -> i64 {
    (c_id - 1) % (customers / 3).max(1)
}

struct Loader<'a> {
    db: &'a mut dyn Database,
}

impl Loader<'_> {
    fn insert(&mut self, table: &str, cols: &[&str], rows: &[Vec<SqlValue>]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let per = 200.min(900 / cols.len()).max(1);
        for chunk in rows.chunks(per) {
            let mut sql = format!("INSERT INTO {table} ({}) VALUES ", cols.join(", "));
            let mut vals = Vec::with_capacity(chunk.len() * cols.len());
            let mut n = 0;
            for (ri, r) in chunk.iter().enumerate() {
                if ri > 0 {
                    sql.push_str(", ");
                }
                sql.push('(');
                for (ci, v) in r.iter().enumerate() {
                    if ci > 0 {
                        sql.push_str(", ");
                    }
                    n += 1;
                    match self.db.dialect() {
                        Dialect::Sqlite => sql.push_str(&format!("?{n}")),
                        Dialect::Postgres => sql.push_str(&format!("${n}")),
                    }
                    vals.push(v.clone());
                }
                sql.push(')');
            }
            self.db.execute(&sql, &vals)?;
        }
        Ok(())
    }
}

/// Creates the schema and loads the initial population (clause 4.3.3, scaled) with `seed`.
pub fn load(db: &mut dyn Database, scale: Scale, seed: u64) -> Result<()> {
    if scale.warehouses < 1 || scale.districts < 1 || scale.customers < 3 || scale.items < 15 {
        return Err(Error::Param {
            template: "tpcc".into(),
            field: "scale".into(),
            value: format!("{scale:?}"),
            expected: "at least 1 warehouse, 1 district, 3 customers and 15 items".into(),
        });
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    db.batch(SCHEMA)?;
    db.begin()?;
    let r = (|| {
        let mut l = Loader { db: &mut *db };
        use SqlValue::{Int as I, Null, Text as T};
        let items: Vec<Vec<SqlValue>> =
            (1..=scale.items).map(|i| vec![I(i), T(format!("item{i}")), I(rng.gen_range(100..=10_000))]).collect();
        l.insert("item", &["i_id", "i_name", "i_price"], &items)?;
        let c = scale.customers;
        let delivered_below = c - c * 3 / 10 + 1; // the last 30% are undelivered new orders
        for w in 1..=scale.warehouses {
            let d_ytd = c * 1000;
            l.insert(
                "warehouse",
                &["w_id", "w_name", "w_tax", "w_ytd"],
                &[vec![I(w), T(format!("w{w}")), I(rng.gen_range(0..=2000)), I(d_ytd * scale.districts)]],
            )?;
            let stock: Vec<Vec<SqlValue>> =
                (1..=scale.items).map(|i| vec![I(w), I(i), I(rng.gen_range(10..=100)), I(0), I(0), I(0)]).collect();
            l.insert("stock", &["s_w_id", "s_i_id", "s_quantity", "s_ytd", "s_order_cnt", "s_remote_cnt"], &stock)?;
            for d in 1..=scale.districts {
                l.insert(
                    "district",
                    &["d_w_id", "d_id", "d_name", "d_tax", "d_ytd", "d_next_o_id"],
                    &[vec![I(w), I(d), T(format!("d{d}")), I(rng.gen_range(0..=2000)), I(d_ytd), I(c + 1)]],
                )?;
                let mut customers = Vec::new();
                let mut history = Vec::new();
                for cid in 1..=c {
                    let credit = if rng.gen_bool(0.1) { "BC" } else { "GC" };
                    customers.push(vec![
                        I(w),
                        I(d),
                        I(cid),
                        T(format!("first{}", rng.gen_range(0..1000))),
                        T(last_name(name_number(cid, c))),
                        T(credit.into()),
                        I(rng.gen_range(0..=5000)),
                        I(-1000),
                        I(1000),
                        I(1),
                        I(0),
                    ]);
                    history.push(vec![T(format!("load-{w}-{d}-{cid}")), I(cid), I(d), I(w), I(d), I(w), I(0), I(1000)]);
                }
                l.insert(
                    "customer",
                    &[
                        "c_w_id",
                        "c_d_id",
                        "c_id",
                        "c_first",
                        "c_last",
                        "c_credit",
                        "c_discount",
                        "c_balance",
                        "c_ytd_payment",
                        "c_payment_cnt",
                        "c_delivery_cnt",
                    ],
                    &customers,
                )?;
                l.insert(
                    "history",
                    &["h_id", "h_c_id", "h_c_d_id", "h_c_w_id", "h_d_id", "h_w_id", "h_date", "h_amount"],
                    &history,
                )?;
                let mut perm: Vec<i64> = (1..=c).collect();
                perm.shuffle(&mut rng);
                let (mut orders, mut lines, mut news) = (Vec::new(), Vec::new(), Vec::new());
                for o in 1..=c {
                    let delivered = o < delivered_below;
                    let cnt = rng.gen_range(5..=15);
                    orders.push(vec![
                        I(w),
                        I(d),
                        I(o),
                        I(perm[(o - 1) as usize]),
                        I(0),
                        if delivered { I(rng.gen_range(1..=10)) } else { Null },
                        I(cnt),
                        I(1),
                    ]);
                    for n in 1..=cnt {
                        lines.push(vec![
                            I(w),
                            I(d),
                            I(o),
                            I(n),
                            I(rng.gen_range(1..=scale.items)),
                            I(w),
                            if delivered { I(0) } else { Null },
                            I(5),
                            if delivered { I(0) } else { I(rng.gen_range(1..=999_999)) },
                        ]);
                    }
                    if !delivered {
                        news.push(vec![I(w), I(d), I(o)]);
                    }
                }
                l.insert(
                    "orders",
                    &["o_w_id", "o_d_id", "o_id", "o_c_id", "o_entry_d", "o_carrier_id", "o_ol_cnt", "o_all_local"],
                    &orders,
                )?;
                l.insert("new_order", &["no_w_id", "no_d_id", "no_o_id"], &news)?;
                l.insert(
                    "order_line",
                    &[
                        "ol_w_id",
                        "ol_d_id",
                        "ol_o_id",
                        "ol_number",
                        "ol_i_id",
                        "ol_supply_w_id",
                        "ol_delivery_d",
                        "ol_quantity",
                        "ol_amount",
                    ],
                    &lines,
                )?;
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => db.commit(),
        Err(e) => {
            db.rollback()?;
            Err(e)
        }
    }
}

/// The five transaction types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxType {
    /// New-Order (45% of the mix).
    NewOrder,
    /// Payment (43%).
    Payment,
    /// Order-Status (4%).
    OrderStatus,
    /// Delivery (4%).
    Delivery,
    /// Stock-Level (4%).
    StockLevel,
}

/// A seeded generator of TPC-C requests in the standard mix (clause 5.2.3 minimums: 43%
/// Payment, 4% each of Order-Status, Delivery and Stock-Level; the rest New-Order).
#[derive(Debug)]
pub struct Generator {
    scale: Scale,
    rng: SmallRng,
    counter: u64,
    mix: [u32; 5],
    /// The home warehouse of the emulated terminal.
    pub w_id: i64,
}

/// The standard mix in percent: New-Order, Payment, Order-Status, Delivery, Stock-Level.
pub const STANDARD_MIX: [u32; 5] = [45, 43, 4, 4, 4];

impl Generator {
    /// A generator for `scale`, seeded.
    pub fn new(scale: Scale, seed: u64) -> Generator {
        Generator { scale, rng: SmallRng::seed_from_u64(seed), counter: 0, mix: STANDARD_MIX, w_id: 1 }
    }

    /// Uses another mix (weights of New-Order, Payment, Order-Status, Delivery, Stock-Level),
    /// e.g. more Deliveries so that they reach orders created during a short run.
    pub fn with_mix(mut self, mix: [u32; 5]) -> Generator {
        if mix.iter().sum::<u32>() > 0 {
            self.mix = mix;
        }
        self
    }

    /// The next transaction type of the mix.
    pub fn next_type(&mut self) -> TxType {
        let types = [TxType::NewOrder, TxType::Payment, TxType::OrderStatus, TxType::Delivery, TxType::StockLevel];
        let mut x = self.rng.gen_range(0..self.mix.iter().sum::<u32>());
        for (t, w) in types.into_iter().zip(self.mix) {
            if x < w {
                return t;
            }
            x -= w;
        }
        TxType::StockLevel
    }

    fn other_w(&mut self, w: i64) -> i64 {
        if self.scale.warehouses == 1 {
            return w;
        }
        loop {
            let o = self.rng.gen_range(1..=self.scale.warehouses);
            if o != w {
                return o;
            }
        }
    }

    /// The next request: template name and parameters.
    pub fn next_request(&mut self) -> (String, Value) {
        let t = self.next_type();
        self.of_type(t)
    }

    /// A request of type `t`.
    pub fn of_type(&mut self, t: TxType) -> (String, Value) {
        self.counter += 1;
        let s = self.scale;
        let w = if s.warehouses == 1 { 1 } else { self.rng.gen_range(1..=s.warehouses) };
        self.w_id = w;
        let d = self.rng.gen_range(1..=s.districts);
        let now = self.counter as i64;
        match t {
            TxType::NewOrder => {
                let cnt = self.rng.gen_range(5..=15i64);
                let mut items: Vec<i64> = (1..=s.items).collect();
                items.shuffle(&mut self.rng);
                items.truncate(cnt as usize);
                if self.rng.gen_bool(0.01) {
                    // Clause 2.4.1.4: 1% of New-Orders name an unused item and roll back.
                    if let Some(last) = items.last_mut() {
                        *last = s.items + 1;
                    }
                }
                let mut all_local = 1;
                let lines: Vec<Value> = items
                    .iter()
                    .enumerate()
                    .map(|(n, &i)| {
                        let supply = if self.rng.gen_bool(0.01) { self.other_w(w) } else { w };
                        if supply != w {
                            all_local = 0;
                        }
                        json!({"ol_number": n as i64 + 1, "ol_i_id": i, "ol_supply_w_id": supply,
                               "ol_quantity": self.rng.gen_range(1..=10), "remote": i64::from(supply != w)})
                    })
                    .collect();
                let c = self.rng.gen_range(1..=s.customers);
                (
                    "new_order".into(),
                    json!({"w_id": w, "d_id": d, "c_id": c, "o_entry_d": now, "ol_cnt": cnt, "all_local": all_local, "lines": lines}),
                )
            }
            TxType::Payment => {
                let (cw, cd) = if self.rng.gen_bool(0.85) {
                    (w, d)
                } else {
                    (self.other_w(w), self.rng.gen_range(1..=s.districts))
                };
                let amount = self.rng.gen_range(100..=500_000i64);
                let h_id = format!("h{}-{}", self.rng.r#gen::<u32>(), self.counter);
                if self.rng.gen_bool(0.6) {
                    let name = last_name(self.rng.gen_range(0..(s.customers / 3).max(1)));
                    (
                        "payment_by_name".into(),
                        json!({"w_id": w, "d_id": d, "c_w_id": cw, "c_d_id": cd, "c_last": name, "h_id": h_id, "h_amount": amount, "h_date": now}),
                    )
                } else {
                    let c = self.rng.gen_range(1..=s.customers);
                    (
                        "payment".into(),
                        json!({"w_id": w, "d_id": d, "c_w_id": cw, "c_d_id": cd, "c_id": c, "h_id": h_id, "h_amount": amount, "h_date": now}),
                    )
                }
            }
            TxType::OrderStatus => {
                let c = self.rng.gen_range(1..=s.customers);
                ("order_status".into(), json!({"w_id": w, "d_id": d, "c_id": c}))
            }
            TxType::Delivery => {
                let districts: Vec<Value> = (1..=s.districts).map(|d| json!({"d_id": d})).collect();
                (
                    "delivery".into(),
                    json!({"w_id": w, "o_carrier_id": self.rng.gen_range(1..=10), "ol_delivery_d": now, "districts": districts}),
                )
            }
            TxType::StockLevel => {
                ("stock_level".into(), json!({"w_id": w, "d_id": d, "threshold": self.rng.gen_range(10..=20)}))
            }
        }
    }
}

/// The consistency conditions of clause 3.3.2 (1-10 and 12): one SQL query per condition
/// returning the violating warehouses, districts, orders, lines or customers.
pub const CONDITIONS: [(&str, &str); 11] = [
    ("1: W_YTD = sum(D_YTD)", "SELECT w_id FROM warehouse WHERE w_ytd <> (SELECT COALESCE(SUM(d_ytd), 0) FROM district WHERE d_w_id = w_id)"),
    (
        "2: D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)",
        "SELECT d_w_id, d_id FROM district WHERE d_next_o_id - 1 <> (SELECT COALESCE(MAX(o_id), 0) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id)
         OR (EXISTS (SELECT 1 FROM new_order WHERE no_w_id = d_w_id AND no_d_id = d_id)
             AND d_next_o_id - 1 <> (SELECT MAX(no_o_id) FROM new_order WHERE no_w_id = d_w_id AND no_d_id = d_id))",
    ),
    (
        "3: max(NO_O_ID) - min(NO_O_ID) + 1 = count(NEW-ORDER)",
        "SELECT no_w_id, no_d_id FROM new_order GROUP BY no_w_id, no_d_id HAVING MAX(no_o_id) - MIN(no_o_id) + 1 <> COUNT(*)",
    ),
    (
        "4: sum(O_OL_CNT) = count(ORDER-LINE)",
        "SELECT d_w_id, d_id FROM district WHERE (SELECT COALESCE(SUM(o_ol_cnt), 0) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id)
         <> (SELECT COUNT(*) FROM order_line WHERE ol_w_id = d_w_id AND ol_d_id = d_id)",
    ),
    (
        "5: O_CARRIER_ID is null iff a NEW-ORDER row exists",
        "SELECT o_w_id, o_d_id, o_id FROM orders WHERE (o_carrier_id IS NULL) <> EXISTS (SELECT 1 FROM new_order WHERE no_w_id = o_w_id AND no_d_id = o_d_id AND no_o_id = o_id)",
    ),
    (
        "6: O_OL_CNT = count(ORDER-LINE) per order",
        "SELECT o_w_id, o_d_id, o_id FROM orders WHERE o_ol_cnt <> (SELECT COUNT(*) FROM order_line WHERE ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id)",
    ),
    (
        "7: OL_DELIVERY_D is null iff O_CARRIER_ID is null",
        "SELECT ol_w_id, ol_d_id, ol_o_id, ol_number FROM order_line JOIN orders ON o_w_id = ol_w_id AND o_d_id = ol_d_id AND o_id = ol_o_id
         WHERE (ol_delivery_d IS NULL) <> (o_carrier_id IS NULL)",
    ),
    ("8: W_YTD = sum(H_AMOUNT)", "SELECT w_id FROM warehouse WHERE w_ytd <> (SELECT COALESCE(SUM(h_amount), 0) FROM history WHERE h_w_id = w_id)"),
    (
        "9: D_YTD = sum(H_AMOUNT)",
        "SELECT d_w_id, d_id FROM district WHERE d_ytd <> (SELECT COALESCE(SUM(h_amount), 0) FROM history WHERE h_w_id = d_w_id AND h_d_id = d_id)",
    ),
    (
        "10: C_BALANCE = sum(delivered OL_AMOUNT) - sum(H_AMOUNT)",
        "SELECT c_w_id, c_d_id, c_id FROM customer
           LEFT JOIN (SELECT o_w_id, o_d_id, o_c_id, SUM(ol_amount) AS delivered FROM orders JOIN order_line
                        ON ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
                      WHERE ol_delivery_d IS NOT NULL GROUP BY o_w_id, o_d_id, o_c_id) dl
             ON dl.o_w_id = c_w_id AND dl.o_d_id = c_d_id AND dl.o_c_id = c_id
           LEFT JOIN (SELECT h_c_w_id, h_c_d_id, h_c_id, SUM(h_amount) AS paid FROM history GROUP BY h_c_w_id, h_c_d_id, h_c_id) hp
             ON hp.h_c_w_id = c_w_id AND hp.h_c_d_id = c_d_id AND hp.h_c_id = c_id
         WHERE c_balance <> COALESCE(dl.delivered, 0) - COALESCE(hp.paid, 0)",
    ),
    (
        "12: C_BALANCE + C_YTD_PAYMENT = sum(delivered OL_AMOUNT)",
        "SELECT c_w_id, c_d_id, c_id FROM customer
           LEFT JOIN (SELECT o_w_id, o_d_id, o_c_id, SUM(ol_amount) AS delivered FROM orders JOIN order_line
                        ON ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
                      WHERE ol_delivery_d IS NOT NULL GROUP BY o_w_id, o_d_id, o_c_id) dl
             ON dl.o_w_id = c_w_id AND dl.o_d_id = c_d_id AND dl.o_c_id = c_id
         WHERE c_balance + c_ytd_payment <> COALESCE(dl.delivered, 0)",
    ),
];

/// Checks every consistency condition and the declared `check` invariant on stock; returns
/// one line per violated condition (empty: consistent).
pub fn check_consistency(db: &mut dyn Database) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, sql) in CONDITIONS {
        let rows = db.query(sql, &[])?;
        if !rows.is_empty() {
            out.push(format!("condition {name}: {} violation(s), first {:?}", rows.len(), rows[0]));
        }
    }
    let neg = db.query("SELECT s_w_id, s_i_id FROM stock WHERE s_quantity < 0", &[])?;
    if !neg.is_empty() {
        out.push(format!("invariant s_quantity >= 0: {} violation(s)", neg.len()));
    }
    Ok(out)
}
