//! Forged ledgers (issue 11): rows that were duplicated, reordered or renumbered and then
//! re-chained, so that the hash chain and the high-water mark hold. The store cannot tell such a
//! ledger from a real one; the engine's replay must refuse it at open, naming the LSN and the
//! rule broken, and never hang (a duplicated `begin` hung the next run).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tidegate_core::engine::{BeginRequest, Decision, Recorded, Settlement};
use tidegate_core::{CallOutcome, Core, CoreConfig, EffectClass, EffectDecl, Event, ScopeRegistry, Timestamp};
use tidegate_runtime::Tidegate;
use tidegate_sqlite::SqliteStore;
use tidegate_storage::LedgerStore;

/// A ledger the engine wrote: three transactions that each book and notify, all committed.
fn genuine() -> Vec<Event> {
    let mut c = Core::new(CoreConfig::default());
    let reg = ScopeRegistry::default();
    let now = Timestamp(1);
    for i in 0..3 {
        let s = reg.parse(&format!("travel:booking:{i}")).unwrap();
        let tx =
            c.begin(BeginRequest { agent: "a".into(), may_touch: Some(vec![s.clone()]), lease: None }, now).unwrap().tx;
        c.read(tx, &s, now).unwrap();
        let decl = |tool: &str, class| EffectDecl {
            tool: tool.into(),
            class,
            scopes: vec![s.clone()],
            key: None,
            args: Arc::new(json!({"id": i})),
            compensable: true,
            call_id: None,
        };
        let Recorded::Execute(e) = c.record_effect(tx, decl("book", EffectClass::Reversible), now).unwrap() else {
            panic!()
        };
        c.executed(tx, e, CallOutcome::done(json!("ok"))).unwrap();
        c.record_effect(tx, decl("notify", EffectClass::Gated), now).unwrap();
        c.seal(tx, now).unwrap();
        c.request_commit(tx).unwrap();
        let Decision::Commit(plan) = c.try_commit(tx, now).unwrap() else { panic!() };
        for r in plan.releases {
            c.release_started(tx, r.effect).unwrap();
            c.release_done(tx, r.effect, CallOutcome::done(json!("sent"))).unwrap();
        }
        assert!(matches!(c.finish_commit(tx).unwrap(), Settlement::Committed(_)));
    }
    c.take_events().collect()
}

/// Writes `events` as a new ledger (chained and marked by the store itself) and reopens it
/// with the engine, on its own thread with a deadline. `Ok(())`: opened; `Err(msg)`: refused.
fn open_forged(dir: &Path, events: Vec<Event>) -> Result<(), String> {
    {
        let store = SqliteStore::open(dir).unwrap();
        let lsn = store.append(&tidegate_core::Batch::from(events)).unwrap();
        store.wait_durable(lsn).unwrap();
        store.close().unwrap();
    }
    let dir = dir.to_owned();
    let (send, recv) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let r = rt.block_on(async {
            let store = Arc::new(SqliteStore::open(&dir).map_err(|e| e.to_string())?);
            let tg = Tidegate::builder().store(store).build().map_err(|e| e.to_string())?;
            tg.recover().await.map(|_| ()).map_err(|e| e.to_string())
        });
        let _ = send.send(r);
    });
    recv.recv_timeout(Duration::from_secs(30)).expect("opening a forged ledger hung")
}

#[test]
fn re_chained_forged_ledgers_are_refused_at_open_naming_the_lsn_and_rule() {
    let root = tempfile::tempdir().unwrap();
    let base = genuine();
    open_forged(&root.path().join("genuine"), base.clone()).expect("the genuine ledger opens");

    let begin = base.iter().position(|e| matches!(e, Event::Begin { .. })).unwrap();
    let settled = base.iter().position(|e| matches!(e, Event::Settled { .. })).unwrap();
    let decided: Vec<usize> =
        base.iter().enumerate().filter(|(_, e)| matches!(e, Event::Decided { .. })).map(|(i, _)| i).collect();
    let mut cases: Vec<(&str, Vec<Event>, usize, &str)> = Vec::new();
    // 1. A begin row copied right after itself (issue 11, finding 2).
    let mut l = base.clone();
    l.insert(begin + 1, base[begin].clone());
    cases.push(("duplicate begin", l, begin + 2, "duplicate begin"));
    // 2. The settlement of the first transaction moved before its decision.
    let mut l = base.clone();
    let s = l.remove(settled);
    l.insert(decided[0], s);
    cases.push(("settled before decided", l, decided[0] + 1, "transition not allowed"));
    // 3. The second commit renumbered to the first one's stamp.
    let mut l = base.clone();
    let first = match &base[decided[0]] {
        Event::Decided { stamp, .. } => *stamp,
        _ => unreachable!(),
    };
    if let Event::Decided { stamp, .. } = &mut l[decided[1]] {
        *stamp = first;
    }
    cases.push(("stamp goes backwards", l, decided[1] + 1, "stamps and versions must increase"));
    // 4. A stamp at u64::MAX.
    let mut l = base.clone();
    if let Event::Decided { stamp, .. } = &mut l[decided[2]] {
        *stamp = Some(u64::MAX);
    }
    cases.push(("u64::MAX stamp", l, decided[2] + 1, "value would overflow"));
    // 5. The first transaction's events appended again after it settled.
    let mut l = base.clone();
    l.extend(base[begin + 1..=settled].iter().cloned());
    cases.push(("events for a finished tx", l, base.len() + 1, "event for a finished transaction"));

    for (i, (name, events, lsn, rule)) in cases.into_iter().enumerate() {
        let err = open_forged(&root.path().join(format!("case{i}")), events)
            .err()
            .unwrap_or_else(|| panic!("{name}: a forged ledger opened"));
        assert!(err.contains(&format!("LSN {lsn}")) && err.contains(rule), "{name}: {err}");
    }
}
