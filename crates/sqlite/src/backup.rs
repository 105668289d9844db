//! [`SqliteStore::backup`]: a consistent copy of a live ledger into a new data directory, with
//! its own high-water mark.

use std::fs::File;
use std::path::Path;

use tidegate_storage::StoreError;
use tidegate_storage::wire::Chain;

use crate::check::{self, Check};
use crate::head::{self, Mark};
use crate::schema::{self, Access, DB_FILE, Kind};
use crate::{BackupReport, SqliteStore, Verify};

impl SqliteStore {
    /// Copies the ledger into a new data directory `dest` with SQLite's online backup API: a
    /// consistent snapshot taken in one step, while this store (or a writer in another
    /// process, for a read-only store) keeps appending. The copy gets its own high-water mark
    /// at its last LSN; it must reach the source's mark as it was when the copy started, and
    /// its whole chain is verified before the mark is written. `dest` must not hold a ledger.
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport, StoreError> {
        let dest = dest.as_ref();
        let dest_db = dest.join(DB_FILE);
        for existing in [dest_db.clone(), head::path(dest), dest.join(format!("{DB_FILE}-wal"))] {
            if existing.exists() {
                return Err(StoreError::InvalidArgument {
                    field: "backup destination",
                    value: dest.display().to_string(),
                    expected: "a directory that holds no ledger (it has a ledger.db, ledger.head or WAL)",
                });
            }
        }
        std::fs::create_dir_all(dest).map_err(|e| crate::error::file("create the backup directory", dest, e))?;
        let before = match self.id {
            Some(id) => Some(SqliteStore::expect_mark(&self.shared.path, &self.dir, id, head::read(&self.dir)?)?.0),
            None => None,
        };
        self.with_reader(|src| {
            let mut dst = schema::connect(&dest_db, Access::Write)?;
            let backup = rusqlite::backup::Backup::new(src, &mut dst)
                .map_err(|e| crate::error::database("start the backup", &dest_db, e))?;
            // All pages in one step, so the copy is one snapshot of the source; a busy or
            // locked database is retried for a while, then reported.
            for _ in 0..500 {
                match backup.step(-1).map_err(|e| crate::error::database("copy the ledger", &dest_db, e))? {
                    rusqlite::backup::StepResult::Done => return Ok(()),
                    _ => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
            Err(StoreError::Database {
                op: "copy the ledger",
                path: dest_db.clone(),
                retryable: true,
                source: "the source stayed busy or locked for 5 s".into(),
            })
        })?;
        let dst = schema::connect(&dest_db, Access::Write)?;
        let kind = schema::inspect(&dst, &dest_db)?;
        schema::set_wal(&dst, &dest_db)?;
        let (last, mark) = match kind {
            Kind::Current { id, .. } => {
                let v = check::verify_rows(
                    &dst,
                    &dest_db,
                    &Check { id: Some(id), mark: before, verify: Verify::Full, max_tail_cut: 0 },
                )?;
                let chain = v.last_chain.unwrap_or_else(|| Chain::genesis(&id));
                (v.last, Some(Mark { id, seq: 1, lsn: v.last, chain }))
            }
            Kind::Legacy { .. } => {
                let v = check::verify_rows(
                    &dst,
                    &dest_db,
                    &Check { id: None, mark: None, verify: Verify::Full, max_tail_cut: 0 },
                )?;
                (v.last, None)
            }
            Kind::Empty => {
                return Err(StoreError::NotALedger { path: dest_db, detail: "the copy holds no tables".into() });
            }
        };
        let _ = dst.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        drop(dst);
        File::open(&dest_db)
            .and_then(|f| f.sync_all())
            .map_err(|e| crate::error::file("sync the backup", &dest_db, e))?;
        if let Some(m) = mark {
            head::create(dest, &m)?;
        } else {
            head::sync_dir(dest)?;
        }
        let bytes = std::fs::metadata(&dest_db).map(|m| m.len()).unwrap_or(0);
        Ok(BackupReport { dir: dest.to_owned(), last_lsn: last, acknowledged_lsn: before.map_or(0, |m| m.lsn), bytes })
    }
}
