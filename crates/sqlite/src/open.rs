//! Opening a store: for writing (lock, versions, upgrade, the high-water mark, verification,
//! the corrupt-tail cut, ownership, then the writer thread) and read-only (an operator's view
//! beside a running writer).

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use tidegate_storage::wire::Chain;
use tidegate_storage::{Ownership, StoreError};

#[cfg(feature = "test-hooks")]
use crate::TestHooks;
use crate::check::{self, Check};
use crate::head::{self, LedgerId, Mark};
use crate::options::Hooks;
use crate::schema::{self, Access, DB_FILE, Kind};
use crate::writer::{self, Shared};
use crate::{OpenReport, Options, SqliteStore, Verify};

fn missing_dir(dir: &Path) -> StoreError {
    crate::error::file(
        "open the data directory",
        dir,
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory (nothing was created)"),
    )
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger in `dir` with default [`Options`].
    pub fn open(dir: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(dir, Options::default())
    }

    /// Opens (creating it if `opts.create` and there is none) the ledger in `dir` for
    /// writing: takes the directory lock, checks the versions (refusing newer ones), upgrades
    /// an older ledger, holds the ledger to its high-water mark and verifies the rows (refusing
    /// a shortened, reordered or damaged ledger with an error naming what is wrong), cuts a
    /// corrupt tail above the mark (reported in [`SqliteStore::open_report`]), becomes the
    /// stream's owner (a new fencing token), then starts the writer.
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_hooked(dir.as_ref(), opts, Hooks::default())
    }

    /// [`SqliteStore::open_with`] with crash injection (cargo feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    pub fn open_with_hooks(dir: impl AsRef<Path>, opts: Options, hooks: TestHooks) -> Result<SqliteStore, StoreError> {
        let hooks = Hooks {
            crash_after_appends: hooks.crash_after_appends,
            crash_after_syncs: hooks.crash_after_syncs,
            ignore_dir_lock: hooks.ignore_dir_lock,
        };
        SqliteStore::open_hooked(dir.as_ref(), opts, hooks)
    }

    /// Opens the ledger in `dir` read-only, verifying every row ([`Verify::Full`]).
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_read_only_with(dir, Verify::Full)
    }

    /// Opens the ledger in `dir` read-only: it never writes (no lock, no version raised, no
    /// tail cut, no upgrade), works on a read-only directory and beside a running writer, and
    /// refuses what a writing open refuses. A missing directory or database is an error
    /// naming it. A corrupt tail above the high-water mark is reported and hidden.
    pub fn open_read_only_with(dir: impl AsRef<Path>, verify: Verify) -> Result<SqliteStore, StoreError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(missing_dir(dir));
        }
        let path = dir.join(DB_FILE);
        if !path.is_file() {
            return Err(StoreError::NotALedger {
                path: path.clone(),
                detail: format!("there is no {DB_FILE} in {}", dir.display()),
            });
        }
        // The mark first: the database snapshot read after it holds at least what it says.
        let found = head::read(dir)?;
        let wal = dir.join(format!("{DB_FILE}-wal"));
        let (conn, kind, access) = match schema::connect(&path, Access::Read).and_then(|c| {
            let k = schema::inspect(&c, &path)?;
            Ok((c, k))
        }) {
            Ok((c, k)) => (c, k, Access::Read),
            // SQLite could not read through its shared-memory index (a read-only directory
            // without one); with no write-ahead log the database file alone is the ledger.
            Err(first) if !wal.exists() => match schema::connect(&path, Access::ReadImmutable)
                .and_then(|c| schema::inspect(&c, &path).map(|k| (c, k)))
            {
                Ok((c, k)) => (c, k, Access::ReadImmutable),
                Err(_) => return Err(first),
            },
            Err(e @ StoreError::Database { .. }) if !dir.join(format!("{DB_FILE}-shm")).exists() => {
                return Err(StoreError::Database {
                    op: "open read-only: the directory holds a write-ahead log (ledger.db-wal) without its \
                         index (ledger.db-shm), which SQLite cannot create here; copy the data directory somewhere \
                         writable and open the copy",
                    path,
                    retryable: false,
                    source: Box::new(e),
                });
            }
            Err(e) => return Err(e),
        };
        let (conn, access) = match kind {
            // A ledger whose creation was cut off before its schema was written (a kill
            // between creating the file and committing the schema). Nothing can have been
            // acknowledged from it unless its high-water mark says so; otherwise it reads as
            // the empty ledger it is (the next writing open creates the schema).
            Kind::Empty => match &found {
                head::Found::Missing => (schema::connect(&path, Access::EmptySchema)?, Access::EmptySchema),
                head::Found::Mark { mark, .. } if mark.lsn == 0 => {
                    (schema::connect(&path, Access::EmptySchema)?, Access::EmptySchema)
                }
                head::Found::Mark { mark, .. } => {
                    return Err(StoreError::Shortened { path, acknowledged: mark.lsn, last: 0 });
                }
                head::Found::Damaged(detail) => {
                    return Err(StoreError::Unprovable { path, detail: detail.clone() });
                }
            },
            _ => (conn, access),
        };
        let (id, mark, mut notes) = match kind {
            Kind::Empty => (
                None,
                None,
                vec![
                    "the database holds no tables: the ledger's creation was interrupted before its schema was \
                     written, so it holds no events and nothing was acknowledged (the next writing open creates it)"
                        .to_owned(),
                ],
            ),
            Kind::Legacy { .. } => (None, None, Vec::new()),
            Kind::Current { id, .. } => {
                let (mark, notes) = SqliteStore::expect_mark(&path, dir, id, found)?;
                (Some(id), Some(mark), notes)
            }
        };
        let v = check::verify_rows(&conn, &path, &Check { id, mark, verify, max_tail_cut: u64::MAX })?;
        notes.extend(v.notes);
        let report = OpenReport {
            path: path.clone(),
            created: false,
            read_only: true,
            format_version: kind.format(),
            schema_version: kind.schema(),
            upgraded: false,
            chained: id.is_some(),
            acknowledged_lsn: mark.map_or(0, |m| m.lsn),
            rows_verified: v.rows_verified,
            last_lsn: v.last,
            cut_rows: v.bad,
            notes,
        };
        let stream: Arc<str> = dir.display().to_string().into();
        Ok(SqliteStore {
            shared: Arc::new(Shared::new(path, v.last)),
            writer: None,
            read_only: true,
            id,
            checked_from: v.checked_from,
            access,
            ownership: Ownership { stream, token: 0 },
            crash_after_appends: None,
            max_batch_rows: 1,
            readers: Mutex::new(vec![conn]),
            report,
            dir: dir.to_owned(),
            _lock: None,
        })
    }

    /// The mark a schema-2 ledger must have: present, readable, and its own.
    pub(crate) fn expect_mark(
        path: &Path,
        dir: &Path,
        id: LedgerId,
        found: head::Found,
    ) -> Result<(Mark, Vec<String>), StoreError> {
        let head_path = head::path(dir);
        match found {
            head::Found::Missing => Err(StoreError::Unprovable {
                path: path.to_owned(),
                detail: format!(
                    "its high-water mark {} is missing, so a lost tail could not be told from a whole \
                     ledger. Copy a ledger with `tidegate ledger backup`, or the whole data directory \
                     after a clean stop, never {DB_FILE} alone",
                    head_path.display()
                ),
            }),
            head::Found::Damaged(detail) => Err(StoreError::Unprovable { path: path.to_owned(), detail }),
            head::Found::Mark { mark, note } => {
                if mark.id != id {
                    return Err(StoreError::Unprovable {
                        path: path.to_owned(),
                        detail: format!(
                            "its high-water mark {} belongs to another ledger (id {}, this ledger is {})",
                            head_path.display(),
                            head::id_hex(&mark.id),
                            head::id_hex(&id)
                        ),
                    });
                }
                Ok((mark, note.into_iter().collect()))
            }
        }
    }

    fn open_hooked(dir: &Path, opts: Options, hooks: Hooks) -> Result<SqliteStore, StoreError> {
        opts.check()?;
        if !dir.is_dir() {
            if !opts.create {
                return Err(missing_dir(dir));
            }
            std::fs::create_dir_all(dir).map_err(|e| crate::error::file("create the data directory", dir, e))?;
        }
        let path = dir.join(DB_FILE);
        if !opts.create && !path.is_file() {
            return Err(StoreError::NotALedger {
                path: path.clone(),
                detail: format!("there is no {DB_FILE} in {}", dir.display()),
            });
        }
        let lock = if hooks.ignore_dir_lock { None } else { Some(schema::lock_dir(dir)?) };
        let found = head::read(dir)?;
        let mut conn = schema::connect(&path, Access::Write)?;
        let kind = schema::inspect(&conn, &path)?;
        let mut notes = Vec::new();
        let mut cut_rows = Vec::new();
        let (mut created, mut upgraded) = (false, false);
        let (id, mark) = match kind {
            Kind::Empty => {
                // Nothing can have been acknowledged from a ledger without tables, unless its
                // high-water mark says otherwise.
                let mark = match found {
                    head::Found::Missing => {
                        let id = head::new_ledger_id(dir);
                        let mark = Mark { id, seq: 1, lsn: 0, chain: Chain::genesis(&id) };
                        head::create(dir, &mark)?;
                        mark
                    }
                    head::Found::Mark { mark, .. } if mark.lsn == 0 => mark,
                    head::Found::Mark { mark, .. } => {
                        return Err(StoreError::Shortened { path, acknowledged: mark.lsn, last: 0 });
                    }
                    head::Found::Damaged(detail) => return Err(StoreError::Unprovable { path, detail }),
                };
                schema::create(&mut conn, &path, &mark.id)?;
                created = true;
                (mark.id, mark)
            }
            Kind::Legacy { .. } => {
                // Verified in full and its tail cut under the old rules, then chained.
                let v = check::verify_rows(
                    &conn,
                    &path,
                    &Check { id: None, mark: None, verify: Verify::Full, max_tail_cut: opts.max_tail_cut },
                )?;
                if !v.bad.is_empty() {
                    check::cut_tail(&mut conn, &path, &v.bad, v.last)?;
                }
                cut_rows = v.bad;
                let mark = schema::upgrade(&mut conn, dir, &path, kind)?;
                upgraded = true;
                notes.push(format!(
                    "upgraded from format {} schema 1: the {} events before the upgrade are chained as found",
                    kind.format(),
                    mark.lsn
                ));
                (mark.id, mark)
            }
            Kind::Current { id, .. } => {
                let (mark, n) = SqliteStore::expect_mark(&path, dir, id, found)?;
                notes.extend(n);
                schema::set_wal(&conn, &path)?;
                (id, mark)
            }
        };
        if let Some(bytes) = opts.max_ledger_bytes {
            let page: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(|e| crate::error::database("read page_size", &path, e))?;
            let pages = i64::try_from(bytes / page.max(512) as u64).unwrap_or(i64::MAX).max(1);
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(|e| crate::error::database("set max_page_count", &path, e))?;
        }
        let check = Check { id: Some(id), mark: Some(mark), verify: opts.verify, max_tail_cut: opts.max_tail_cut };
        let v = check::verify_rows(&conn, &path, &check)?;
        notes.extend(v.notes);
        if !v.bad.is_empty() {
            check::cut_tail(&mut conn, &path, &v.bad, v.last)?;
        }
        cut_rows.extend(v.bad);
        let token = schema::take_ownership(&mut conn, &path)?;
        let genesis = Chain::genesis(&id);
        let last_chain = v.last_chain.unwrap_or(genesis);
        let mut head_file = head::HeadFile::open(dir, mark)?;
        if v.last > mark.lsn {
            // Rows a crash left committed but unmarked: durable, so from now on acknowledged.
            head_file.advance(v.last, last_chain)?;
        }
        let report = OpenReport {
            path: path.clone(),
            created,
            read_only: false,
            format_version: kind.format(),
            schema_version: kind.schema(),
            upgraded,
            chained: true,
            acknowledged_lsn: mark.lsn,
            rows_verified: v.rows_verified,
            last_lsn: v.last,
            cut_rows,
            notes,
        };
        let stream: Arc<str> = dir.display().to_string().into();
        let shared = Arc::new(Shared::new(path, v.last));
        let cfg = writer::WriterConfig::new(
            &opts,
            hooks.crash_after_syncs,
            (genesis, last_chain),
            head_file,
            stream.to_string(),
            token,
        );
        let for_writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("tidegate-ledger-writer".into())
            .spawn(move || writer::run(&for_writer, conn, cfg))
            .map_err(|e| StoreError::Io { op: "start the ledger writer thread", source: e })?;
        Ok(SqliteStore {
            shared,
            writer: Some(writer),
            read_only: false,
            id: Some(id),
            checked_from: v.checked_from,
            access: Access::Read,
            ownership: Ownership { stream, token },
            crash_after_appends: hooks.crash_after_appends,
            max_batch_rows: opts.max_batch_rows.max(1),
            readers: Mutex::new(Vec::new()),
            report,
            dir: dir.to_owned(),
            _lock: lock,
        })
    }
}
