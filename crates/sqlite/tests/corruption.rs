//! The corruption suite (issue 11): seeded ledgers written by the real engine, damaged the ways
//! disks and careless operators damage them, then reopened and recovered by the real engine.
//!
//! Every case must end in either a clean recovery in which every acknowledged commit is
//! present, unchanged, and not compensated, or a clear refusal (an error at open, naming what
//! is wrong). Counted and asserted zero: silently shortened ledgers, silently altered
//! acknowledged events, compensations of an acknowledged commit, and hangs (each case runs on
//! its own thread with a deadline). The counts per kind of damage are printed.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_core::{Event, TxId};
use tidegate_runtime::{Compensation, EffectClass, Tidegate, Tool, TxOptions};
use tidegate_sqlite::{DB_FILE, HEAD_FILE, SqliteStore};
use tidegate_storage::Lsn;
use tidegate_storage::conformance::collect;

/// How long one case may take before it counts as a hang.
const DEADLINE: Duration = Duration::from_secs(30);

/// The outside world of the seeded workload: which bookings were compensated.
#[derive(Debug, Default, Clone)]
struct World {
    compensated: Arc<Mutex<Vec<String>>>,
}

impl World {
    fn tools(&self) -> (Tool, Tool) {
        let w = self.clone();
        let book = Tool::builder("book", EffectClass::Reversible)
            .scope(|a: &Value| format!("travel:booking:{}", a["id"].as_str().unwrap_or("none")))
            .call(|a| async move { Ok(json!({"confirmation": a["id"]})) })
            .compensate(move |a, _out| {
                let w = w.clone();
                async move {
                    w.compensated.lock().push(a["id"].as_str().unwrap_or("?").to_owned());
                    Ok(Compensation::clean())
                }
            })
            .build()
            .unwrap();
        let notify = Tool::builder("notify", EffectClass::Gated)
            .scope(|a: &Value| format!("mail:{}", a["id"].as_str().unwrap_or("none")))
            .call(|_a| async { Ok(json!("sent")) })
            .build()
            .unwrap();
        (book, notify)
    }
}

/// A ledger the engine wrote, and what it acknowledged.
#[derive(Debug)]
struct Seed {
    name: &'static str,
    dir: PathBuf,
    /// Transactions whose commit was acknowledged, with their booking id.
    acked: BTreeMap<TxId, String>,
    /// Every event up to the last acknowledged one, as the engine wrote them.
    events: Vec<Event>,
}

/// Runs `n` transactions: most commit (acknowledged), every fifth aborts, and the last two
/// stay open with an executed booking (returned: in a crash copy they are orphans for
/// recovery to compensate legitimately).
async fn workload(
    tg: &Tidegate,
    book: &Tool,
    notify: &Tool,
    tag: &str,
    n: usize,
    acked: &mut BTreeMap<TxId, String>,
) -> Vec<tidegate_runtime::Transaction> {
    let mut open = Vec::new();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let opts =
            TxOptions::agent(format!("agent-{i}")).may_touch([format!("travel:booking:{id}"), format!("mail:{id}")]);
        let tx = tg.begin_with(opts).unwrap();
        tx.call(book, json!({ "id": id })).await.unwrap();
        if i >= n - 2 {
            open.push(tx);
            continue;
        }
        tx.call(notify, json!({ "id": id })).await.unwrap();
        if i % 5 == 4 {
            tx.abort("changed my mind").await.unwrap();
            continue;
        }
        tx.seal().unwrap();
        let outcome = tx.commit().await.unwrap();
        assert!(outcome.committed, "{outcome:?}");
        acked.insert(tx.id(), id);
    }
    open
}

/// Aborts the transactions left open, drops the engine and closes the store cleanly.
async fn close(tg: Tidegate, open: Vec<tidegate_runtime::Transaction>, store: Arc<SqliteStore>) {
    for tx in open {
        tx.abort("closing").await.unwrap();
    }
    drop(tg);
    let mut store = store;
    for _ in 0..1000 {
        match Arc::try_unwrap(store) {
            Ok(s) => return s.close().unwrap(),
            Err(s) => store = s,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the engine never let go of its store");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "LOCK" {
            continue;
        }
        std::fs::copy(entry.path(), to.join(name)).unwrap();
    }
}

/// Writes the two seeds under `root`: `crash` (part of the history folded into ledger.db by a
/// clean close, the rest only in the write-ahead log, copied while the engine is running, as a
/// crash leaves it) and `clean` (the same ledger after a clean close).
fn seeds(root: &Path) -> Vec<Seed> {
    let live = root.join("live");
    let world = World::default();
    let (book, notify) = world.tools();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut acked = BTreeMap::new();
    rt.block_on(async {
        // Phase 1, closed cleanly: folded into ledger.db.
        {
            let store = Arc::new(SqliteStore::open(&live).unwrap());
            let tg = Tidegate::builder().store(store.clone()).build().unwrap();
            let open = workload(&tg, &book, &notify, "p1", 12, &mut acked).await;
            close(tg, open, store).await;
        }
        // Phase 2: more work, all of it in the write-ahead log when the "crash" copy is taken,
        // with two transactions open (orphans in the copy).
        let store = Arc::new(SqliteStore::open(&live).unwrap());
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        tg.register(&book).unwrap();
        tg.register(&notify).unwrap();
        tg.recover().await.unwrap();
        let open = workload(&tg, &book, &notify, "p2", 14, &mut acked).await;
        store.sync().unwrap();
        assert!(live.join(format!("{DB_FILE}-wal")).exists(), "the crash seed needs a write-ahead log");
        copy_dir(&live, &root.join("crash"));
        close(tg, open, store).await;
    });
    let compensated_while_seeding = world.compensated.lock().clone();
    assert!(
        compensated_while_seeding.iter().all(|id| !acked.values().any(|a| a == id)),
        "seeding compensated an acknowledged commit: {compensated_while_seeding:?}"
    );
    copy_dir(&live, &root.join("clean"));
    assert!(!root.join("clean").join(format!("{DB_FILE}-wal")).exists(), "a clean close folds the WAL");
    let mut out = Vec::new();
    for (name, dir) in [("crash", root.join("crash")), ("clean", root.join("clean"))] {
        let store = SqliteStore::open_read_only(&dir).unwrap();
        let events: Vec<Event> = collect(&store, 1).unwrap().into_iter().map(|(_, e)| e).collect();
        let acknowledged = store.open_report().acknowledged_lsn;
        assert_eq!(acknowledged, events.len() as Lsn, "{name}: every durable event is acknowledged");
        drop(store);
        out.push(Seed { name, dir, acked: acked.clone(), events });
    }
    out
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Refused at open (store or engine), with this message.
    Refused(String),
    /// Recovered; `cut` rows of a damaged tail above the mark were cut.
    Recovered { cut: usize },
    /// A broken promise (counted, and the test fails).
    Broken(&'static str, String),
}

/// Opens the damaged copy as an embedded user would (library defaults), builds the engine,
/// recovers, and checks the promises.
fn recover(dir: &Path, seed: &Seed) -> End {
    let store = match SqliteStore::open(dir) {
        Ok(s) => Arc::new(s),
        Err(e) => return End::Refused(e.to_string()),
    };
    let cut = store.open_report().cut_rows.len();
    let world = World::default();
    let (book, notify) = world.tools();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outcome = rt.block_on(async {
        let tg = match Tidegate::builder().store(store.clone()).build() {
            Ok(tg) => tg,
            Err(e) => return Err(e.to_string()),
        };
        tg.register(&book).unwrap();
        tg.register(&notify).unwrap();
        let r = tg.recover().await.map(|_| ()).map_err(|e| e.to_string());
        drop(tg);
        r
    });
    // Whatever happened, no acknowledged booking may have been compensated.
    let compensated = world.compensated.lock().clone();
    if let Some(id) = compensated.iter().find(|id| seed.acked.values().any(|a| a == *id)) {
        return End::Broken("compensated an acknowledged commit", id.clone());
    }
    if let Err(e) = outcome {
        return End::Refused(format!("engine: {e}"));
    }
    let events: Vec<Event> = match collect(&*store, 1) {
        Ok(v) => v.into_iter().map(|(_, e)| e).collect(),
        Err(e) => return End::Refused(format!("scan after recovery: {e}")),
    };
    if events.len() < seed.events.len() {
        return End::Broken("silently shortened", format!("{} of {} events", events.len(), seed.events.len()));
    }
    if let Some(i) = (0..seed.events.len()).find(|&i| events[i] != seed.events[i]) {
        return End::Broken("silently altered", format!("LSN {}", i + 1));
    }
    let committed: BTreeSet<TxId> = events
        .iter()
        .filter_map(|e| match e {
            Event::Decided { tx, commit: true, .. } => Some(*tx),
            _ => None,
        })
        .collect();
    if let Some(tx) = seed.acked.keys().find(|t| !committed.contains(t)) {
        return End::Broken("acknowledged commit missing", tx.to_string());
    }
    End::Recovered { cut }
}

/// Runs `recover` on its own thread with a deadline.
fn bounded(dir: PathBuf, seed: &Seed) -> End {
    let (send, recv) = std::sync::mpsc::channel();
    let seed_events = seed.events.clone();
    let acked = seed.acked.clone();
    let name = seed.name;
    std::thread::spawn(move || {
        let seed = Seed { name, dir: PathBuf::new(), acked, events: seed_events };
        let _ = send.send(recover(&dir, &seed));
    });
    match recv.recv_timeout(DEADLINE) {
        Ok(end) => end,
        Err(_) => End::Broken("hang", format!("no end after {DEADLINE:?}")),
    }
}

/// A deterministic generator for damage positions (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

fn flip_bit(path: &Path, bit: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = (bit / 8) as usize;
    bytes[i] ^= 1 << (bit % 8);
    std::fs::write(path, bytes).unwrap();
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// A damage applied to a copy of a seed.
type Damage = Box<dyn Fn(&Path)>;

fn sql(statements: &'static str) -> Damage {
    Box::new(move |dir: &Path| {
        let conn = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
        conn.execute_batch(statements).unwrap();
    })
}

/// Every damage, by kind, for one seed.
fn damages(seed: &Seed, rng: &mut Rng) -> Vec<(&'static str, String, Damage)> {
    let mut out: Vec<(&'static str, String, Damage)> = Vec::new();
    let files: Vec<(&'static str, &'static str, String)> = vec![
        ("db", "database", DB_FILE.to_owned()),
        ("wal", "write-ahead log", format!("{DB_FILE}-wal")),
        ("head", "high-water mark", HEAD_FILE.to_owned()),
    ];
    for (short, _, file) in &files {
        let path = seed.dir.join(file);
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        let len = meta.len();
        if len == 0 {
            continue;
        }
        let flips = if *short == "head" { 12 } else { 40 };
        for _ in 0..flips {
            let bit = rng.below(len * 8);
            let f = file.clone();
            out.push((
                match *short {
                    "db" => "flip a bit in ledger.db",
                    "wal" => "flip a bit in the WAL",
                    _ => "flip a bit in ledger.head",
                },
                format!("bit {bit} of {len} bytes"),
                Box::new(move |dir: &Path| flip_bit(&dir.join(&f), bit)),
            ));
        }
        let mut cuts: Vec<u64> = vec![0, len / 4, len / 2, len * 3 / 4, len.saturating_sub(4096), len - 1];
        cuts.extend((0..4).map(|_| rng.below(len)));
        cuts.sort_unstable();
        cuts.dedup();
        for at in cuts {
            let f = file.clone();
            out.push((
                match *short {
                    "db" => "truncate ledger.db",
                    "wal" => "truncate the WAL",
                    _ => "truncate ledger.head",
                },
                format!("to {at} of {len} bytes"),
                Box::new(move |dir: &Path| truncate(&dir.join(&f), at)),
            ));
        }
    }
    if seed.dir.join(format!("{DB_FILE}-wal")).exists() {
        out.push((
            "delete the WAL",
            String::new(),
            Box::new(|dir: &Path| {
                std::fs::remove_file(dir.join(format!("{DB_FILE}-wal"))).unwrap();
                let _ = std::fs::remove_file(dir.join(format!("{DB_FILE}-shm")));
            }),
        ));
    }
    out.push((
        "copy ledger.db alone",
        String::new(),
        Box::new(|dir: &Path| {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name() != DB_FILE {
                    std::fs::remove_file(entry.path()).unwrap();
                }
            }
        }),
    ));
    out.push((
        "copy ledger.db without the WAL",
        String::new(),
        Box::new(|dir: &Path| {
            let _ = std::fs::remove_file(dir.join(format!("{DB_FILE}-wal")));
            let _ = std::fs::remove_file(dir.join(format!("{DB_FILE}-shm")));
        }),
    ));
    out.push((
        "delete ledger.head",
        String::new(),
        Box::new(|dir: &Path| std::fs::remove_file(dir.join(HEAD_FILE)).unwrap()),
    ));
    let n = seed.events.len() as i64;
    let begin_at = seed.events.iter().position(|e| matches!(e, Event::Begin { .. })).unwrap() as i64 + 1;
    let rows: Vec<(&'static str, String, Damage)> = vec![
        (
            "duplicate a row",
            "a begin row copied to a new LSN at the end".into(),
            sql_owned(format!(
                "INSERT INTO events (lsn, tx, kind, body, chain) SELECT {}, tx, kind, body, chain FROM events WHERE lsn = {begin_at}",
                n + 1
            )),
        ),
        (
            "duplicate a row",
            "a begin row copied over a later row".into(),
            sql_owned(format!(
                "UPDATE events SET (tx, kind, body, chain) = (SELECT tx, kind, body, chain FROM events WHERE lsn = {begin_at}) WHERE lsn = {}",
                n / 2
            )),
        ),
        (
            "duplicate a row",
            "the last row copied to a new LSN at the end".into(),
            sql_owned(format!(
                "INSERT INTO events (lsn, tx, kind, body, chain) SELECT {}, tx, kind, body, chain FROM events WHERE lsn = {n}",
                n + 1
            )),
        ),
        (
            "reorder rows",
            "two neighbours swapped".into(),
            sql_owned(format!(
                "UPDATE events SET lsn = -1 WHERE lsn = {a}; UPDATE events SET lsn = {a} WHERE lsn = {b}; UPDATE events SET lsn = {b} WHERE lsn = -1;",
                a = n / 3,
                b = n / 3 + 1
            )),
        ),
        (
            "reorder rows",
            "two distant bodies swapped".into(),
            sql_owned(format!(
                "UPDATE events SET body = CASE lsn WHEN {a} THEN (SELECT body FROM events WHERE lsn = {b}) ELSE (SELECT body FROM events WHERE lsn = {a}) END, \
                 kind = CASE lsn WHEN {a} THEN (SELECT kind FROM events WHERE lsn = {b}) ELSE (SELECT kind FROM events WHERE lsn = {a}) END, \
                 tx = CASE lsn WHEN {a} THEN (SELECT tx FROM events WHERE lsn = {b}) ELSE (SELECT tx FROM events WHERE lsn = {a}) END \
                 WHERE lsn IN ({a}, {b})",
                a = 3,
                b = n - 3
            )),
        ),
        (
            "renumber rows",
            "the last row moved past the end".into(),
            sql_owned(format!("UPDATE events SET lsn = {} WHERE lsn = {n}", n + 5)),
        ),
        (
            "renumber rows",
            "a middle row moved to the end".into(),
            sql_owned(format!("UPDATE events SET lsn = {} WHERE lsn = {}", n + 1, n / 2)),
        ),
        (
            "renumber rows",
            "a row given a negative LSN".into(),
            sql_owned(format!("UPDATE events SET lsn = -7 WHERE lsn = {}", n / 4)),
        ),
        (
            "renumber rows",
            "every row shifted up by one".into(),
            sql("UPDATE events SET lsn = -lsn; UPDATE events SET lsn = 1 - lsn;"),
        ),
        ("delete rows", "the last ten rows".into(), sql_owned(format!("DELETE FROM events WHERE lsn > {}", n - 10))),
        ("delete rows", "a middle row".into(), sql_owned(format!("DELETE FROM events WHERE lsn = {}", n / 2))),
        (
            "edit a row",
            "a commit decision turned into an abort".into(),
            sql(
                "UPDATE events SET body = replace(body, '\"commit\":true', '\"commit\":false') WHERE kind = 'decided' AND lsn = (SELECT max(lsn) FROM events WHERE kind = 'decided' AND body LIKE '%\"commit\":true%')",
            ),
        ),
    ];
    out.extend(rows);
    out
}

fn sql_owned(statements: String) -> Damage {
    Box::new(move |dir: &Path| {
        let conn = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
        conn.execute_batch(&statements).unwrap();
    })
}

#[test]
fn damaged_ledgers_recover_whole_or_are_refused_never_silently_shortened() {
    let root = tempfile::tempdir().unwrap();
    let seeds = seeds(root.path());
    let mut rng = Rng(0x7469_6465_6761_7465);
    // kind -> (cases, refused, recovered, recovered with a cut)
    let mut counts: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    let mut broken = Vec::new();
    let mut case = 0;
    for seed in &seeds {
        for (kind, detail, damage) in damages(seed, &mut rng) {
            case += 1;
            let dir = root.path().join(format!("case-{case}"));
            copy_dir(&seed.dir, &dir);
            damage(&dir);
            let end = bounded(dir.clone(), seed);
            let c = counts.entry(format!("{kind} ({} seed)", seed.name)).or_default();
            c[0] += 1;
            match &end {
                End::Refused(msg) => {
                    assert!(!msg.trim().is_empty(), "a refusal says why");
                    c[1] += 1;
                }
                End::Recovered { cut: 0 } => c[2] += 1,
                End::Recovered { .. } => c[3] += 1,
                End::Broken(what, why) => broken.push(format!("{kind} ({detail}, {} seed): {what}: {why}", seed.name)),
            }
            if std::env::var_os("TIDEGATE_CORRUPTION_VERBOSE").is_some() {
                eprintln!("case {case}: {kind} ({detail}, {} seed): {end:?}", seed.name);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    println!("{:<48} {:>6} {:>8} {:>10} {:>12}", "damage", "cases", "refused", "recovered", "recovered+cut");
    for (kind, [n, refused, ok, cut]) in &counts {
        println!("{kind:<48} {n:>6} {refused:>8} {ok:>10} {cut:>12}");
    }
    println!(
        "{case} cases; silently shortened, silently altered, missing acknowledged commits, compensations of an \
         acknowledged commit and hangs: {}",
        broken.len()
    );
    assert!(broken.is_empty(), "broken promises:\n{}", broken.join("\n"));
}

fn seed<'a>(seeds: &'a [Seed], name: &str) -> &'a Seed {
    seeds.iter().find(|s| s.name == name).unwrap()
}

/// Regression (issue 11, finding 1): one flipped bit in the write-ahead log made SQLite drop
/// the log's tail; `ledger verify` said "ok" and the next run compensated an acknowledged,
/// released booking as an orphan. Now the shortened ledger is refused, read-only and for
/// writing, before any recovery runs.
#[test]
fn wal_bit_flip_is_refused_not_compensated() {
    let root = tempfile::tempdir().unwrap();
    let seeds = seeds(root.path());
    let crash = seed(&seeds, "crash");
    let dir = root.path().join("flipped");
    copy_dir(&crash.dir, &dir);
    let wal = dir.join(format!("{DB_FILE}-wal"));
    let len = std::fs::metadata(&wal).unwrap().len();
    flip_bit(&wal, len / 3 * 8);
    let err = SqliteStore::open_read_only(&dir).unwrap_err();
    assert!(
        matches!(err, tidegate_storage::StoreError::Shortened { .. } | tidegate_storage::StoreError::Corrupt { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("acknowledged"), "the refusal says acknowledged events are missing: {err}");
    match bounded(dir.clone(), crash) {
        End::Refused(msg) => assert!(msg.contains("acknowledged"), "{msg}"),
        other => panic!("a flipped WAL bit must be refused before recovery, got {other:?}"),
    }
}

/// Regression (issue 11, finding 1): a backup that copies ledger.db without its write-ahead
/// log looked whole. It is refused, naming the missing LSNs.
#[test]
fn a_copy_of_the_database_without_its_wal_is_refused_as_shortened() {
    let root = tempfile::tempdir().unwrap();
    let seeds = seeds(root.path());
    let crash = seed(&seeds, "crash");
    let dir = root.path().join("no-wal");
    copy_dir(&crash.dir, &dir);
    std::fs::remove_file(dir.join(format!("{DB_FILE}-wal"))).unwrap();
    let _ = std::fs::remove_file(dir.join(format!("{DB_FILE}-shm")));
    match SqliteStore::open(&dir) {
        Err(tidegate_storage::StoreError::Shortened { acknowledged, last, .. }) => {
            assert_eq!(acknowledged, crash.events.len() as Lsn);
            assert!(last < acknowledged);
        }
        other => panic!("expected Shortened, got {other:?}"),
    }
    // Nothing was written: the refused directory is as it was (no new ledger, no cut).
    let again = SqliteStore::open(&dir).unwrap_err();
    assert!(matches!(again, tidegate_storage::StoreError::Shortened { .. }), "{again:?}");
}

/// Regression (issue 11, finding 2): a well-formed `begin` row copied into the ledger passed
/// `verify` and hung the next run at "seals and commits". Copied over another row it is
/// refused (the hash chain breaks there); copied past the end, above the high-water mark, it
/// is cut as a damaged tail and the engine recovers and finishes.
#[test]
fn a_duplicated_begin_row_is_refused_or_cut_and_never_hangs() {
    let root = tempfile::tempdir().unwrap();
    let seeds = seeds(root.path());
    let clean = seed(&seeds, "clean");
    let n = clean.events.len() as i64;
    let begin = clean.events.iter().position(|e| matches!(e, Event::Begin { .. })).unwrap() as i64 + 1;
    let over = root.path().join("over");
    copy_dir(&clean.dir, &over);
    sql_owned(format!(
        "UPDATE events SET (tx, kind, body, chain) = (SELECT tx, kind, body, chain FROM events WHERE lsn = {begin}) \
         WHERE lsn = {}",
        n - 2
    ))(&over);
    match bounded(over, clean) {
        End::Refused(msg) => assert!(msg.contains("hash chain") && msg.contains(&format!("LSN {}", n - 2)), "{msg}"),
        other => panic!("a begin row copied over another must be refused, got {other:?}"),
    }
    let past = root.path().join("past");
    copy_dir(&clean.dir, &past);
    sql_owned(format!(
        "INSERT INTO events (lsn, tx, kind, body, chain) SELECT {}, tx, kind, body, chain FROM events WHERE lsn = {begin}",
        n + 1
    ))(&past);
    assert_eq!(bounded(past, clean), End::Recovered { cut: 1 });
}
