//! The node registry against a real PostgreSQL (`TIDEGATE_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; a database of the test's own, dropped at the end):
//! nodes see each other with their addresses, a take-over reaches a listening registry long
//! before its next round (LISTEN/NOTIFY), a refusal names the owner's address, a clean leave
//! removes the node's row, and bad input is refused by name.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::time::{Duration, Instant};

use tidegate_postgres::{NodeRegistry, PgStore};
use tidegate_storage::StoreError;

mod common;
use common::{Db, admin_url};

#[test]
fn nodes_see_each_other_hear_take_overs_at_once_and_leave_cleanly() {
    let db = Db::new("nodes");
    // Long rounds: anything seen within a fraction of one came by notification.
    let round = Duration::from_secs(5);
    let a = NodeRegistry::start(&db.url, "node-a", Some("http://10.0.0.1:7878"), round).unwrap();
    let b = NodeRegistry::start(&db.url, "node-b", Some("http://10.0.0.2:7878"), round).unwrap();
    let first = b.latest().unwrap();
    assert_eq!(first.address("node-a"), Some("http://10.0.0.1:7878"), "{first:?}");
    assert_eq!(first.alive(Duration::from_secs(10)).count(), 2, "{first:?}");

    // node-b takes a stream: node-a's registry hears of it at once.
    let started = Instant::now();
    let store = PgStore::open_leased(&db.url, "acme", "node-b", Duration::from_secs(30)).unwrap();
    let seen = loop {
        let s = a.latest().unwrap();
        if let Some(o) = s.streams.iter().find(|o| o.stream == "acme") {
            break o.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(2), "no notification reached node-a within 2 s");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(seen.owner.as_deref(), Some("node-b"));
    assert!(seen.lease_left_ms.is_some(), "{seen:?}");
    eprintln!("node-a saw the take-over {} ms after it began", started.elapsed().as_millis());

    // Another node is refused while the lease runs, and told where the owner answers.
    match PgStore::open_leased(&db.url, "acme", "node-a", Duration::from_secs(30)) {
        Err(StoreError::Leased { owner, address, remaining_ms, .. }) => {
            assert_eq!((owner.as_str(), address.as_deref()), ("node-b", Some("http://10.0.0.2:7878")));
            assert!(remaining_ms > 20_000, "{remaining_ms}");
        }
        other => panic!("expected Leased, got {other:?}"),
    }

    // A clean close ends the lease and notifies: node-a sees no live lease at once.
    drop(store);
    let started = Instant::now();
    loop {
        let s = a.latest().unwrap();
        if s.streams.iter().any(|o| o.stream == "acme" && o.lease_left_ms.is_none()) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "the release did not reach node-a within 2 s");
        std::thread::sleep(Duration::from_millis(10));
    }

    // A clean leave removes the node's row.
    drop(b);
    let view = NodeRegistry::read(&db.url).unwrap();
    let ids: Vec<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(ids, ["node-a"], "{view:?}");
    drop(a);
    assert!(NodeRegistry::read(&db.url).unwrap().nodes.is_empty());
}

#[test]
fn bad_input_is_refused_by_name() {
    let url = format!("{}_never_created", admin_url());
    for (node, address, field) in [
        ("", None, "node"),
        ("n\u{7}", None, "node"),
        ("n", Some(""), "address"),
        ("n", Some("http://a\nb"), "address"),
    ] {
        match NodeRegistry::start(&url, node, address, Duration::from_secs(1)) {
            Err(StoreError::InvalidArgument { field: f, .. }) => assert_eq!(f, field, "{node:?} {address:?}"),
            other => panic!("{node:?} {address:?}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert!(matches!(
        NodeRegistry::start("not a url", "n", None, Duration::from_secs(1)),
        Err(StoreError::InvalidArgument { .. })
    ));
}
