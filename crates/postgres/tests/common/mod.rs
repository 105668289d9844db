//! Helpers shared by the PostgreSQL store's test binaries (`mod common;` in each).

#![allow(dead_code)] // each test binary uses a part

use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{Client, NoTls};

pub fn admin_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database of this test's own, dropped when it ends.
pub struct Db {
    pub name: String,
    pub url: String,
}

impl Db {
    pub fn new(tag: &str) -> Db {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!("tidegate_pg_{tag}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let admin = admin_url();
        let mut c = Client::connect(&admin, NoTls).unwrap_or_else(|e| {
            panic!("PostgreSQL is required at {admin} (set TIDEGATE_PG_URL; .ci/run checks it is up): {e}")
        });
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).expect("drop an old test database");
        c.batch_execute(&format!("CREATE DATABASE {name}")).expect("create the test database");
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b).to_owned();
        Db { url: format!("{base}/{name}"), name }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).expect("connect to the test database")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&admin_url(), NoTls) {
            let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}
