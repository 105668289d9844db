//! Tidegate's networked ledger backend: ledger streams in PostgreSQL.
//!
//! One database holds any number of *streams* (one per tenant), each an append-only ledger with
//! its hash chain, its head (the high-water mark, moved in the same transaction as the rows it
//! covers) and its checkpoint. Any number of processes may use the database; the owner token
//! of each stream, checked by the database under the head's row lock in every write, makes sure
//! only the newest owner of a stream ever appends to it. The design, its invariants and its
//! tables are in `docs/postgres.md`.
//!
//! ```no_run
//! use tidegate_postgres::PgStore;
//! use tidegate_storage::LedgerStore;
//! let store = PgStore::open("postgres://tidegate@127.0.0.1:5432/tidegate", "acme")?;
//! println!("{} events, owner {}", store.last_lsn(), store.ownership());
//! # Ok::<(), tidegate_storage::StoreError>(())
//! ```

#![deny(missing_docs)]

mod error;
mod nodes;
mod schema;
mod verify;
mod writer;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use postgres::{Client, Config, NoTls};
use tidegate_core::{Batch, Event};
use tidegate_storage::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

pub use error::is_transient;
pub use nodes::{ClusterSnapshot, MAX_ADDRESS_BYTES, NodeInfo, NodeRegistry};
pub use schema::{SCHEMA_VERSION, StreamOwner};

use error::{FENCED, PAST_END, database, off_runtime, state_of};
use schema::Claimant;
use writer::{Queued, Shared, Writer};

/// Longest stream name (a tenant's name, or `default`) and node id accepted.
pub const MAX_STREAM_BYTES: usize = 200;

/// What an open found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// Where the ledger is (the database, without its password, and the stream).
    pub location: String,
    /// Whether this open created the stream.
    pub created: bool,
    /// Whether the store is open read-only.
    pub read_only: bool,
    /// The schema version the database had before this open (0: none).
    pub schema_version: u64,
    /// Whether this open created or upgraded the tables.
    pub migrated: bool,
    /// The event format version the stream had (raised to this build's when opened for writing).
    pub format_version: u32,
    /// The owner token this open holds (0 for a read-only view).
    pub token: u64,
    /// Rows decoded and chained from the ledger's start.
    pub rows_verified: u64,
    /// The last acknowledged LSN (the head).
    pub last_lsn: Lsn,
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.created, self.read_only) {
            (true, _) => "created",
            (_, true) => "opened read-only",
            _ => "opened",
        };
        write!(
            f,
            "{what} {} (schema {}{}, format {}, owner token {}): {} events verified, the head at LSN {}",
            self.location,
            self.schema_version,
            if self.migrated { format!(" → {SCHEMA_VERSION}") } else { String::new() },
            self.format_version,
            self.token,
            self.rows_verified,
            self.last_lsn
        )
    }
}

/// A ledger stream in PostgreSQL (see the crate docs and `docs/postgres.md`).
///
/// `append` assigns LSNs and queues the shared batch (no I/O: the caller holds the engine's
/// lock); a writer thread sends everything queued as one `tidegate_append` call (one round trip,
/// one transaction) and wakes the waiters it satisfied. If a write fails the handle stops
/// (the [`LedgerStore`] contract); a newer owner's token refuses this handle's writes with
/// [`StoreError::Fenced`]. Dropping the store commits what is queued first.
pub struct PgStore {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    config: Config,
    stream: String,
    ownership: Ownership,
    read_only: bool,
    /// Idle connections for `scan` and checkpoints.
    readers: Mutex<Vec<Client>>,
    report: OpenReport,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.shared.location)
            .field("ownership", &self.ownership)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// Where a connection goes, without its password: `postgres://user@host:port/db` (for
/// messages and error paths of every PostgreSQL-backed part).
pub fn describe(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or("?"),
        config.get_dbname().unwrap_or(config.get_user().unwrap_or("?"))
    )
}

/// The shortest and longest lease [`PgStore::open_leased`] takes.
pub const MIN_LEASE: Duration = Duration::from_millis(300);
/// See [`MIN_LEASE`].
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

fn check_name(field: &'static str, name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name.len() > MAX_STREAM_BYTES || name.chars().any(char::is_control) {
        return Err(StoreError::InvalidArgument {
            field,
            value: format!("{:?}", name.chars().take(80).collect::<String>()),
            expected: "1 to 200 bytes without control characters",
        });
    }
    Ok(())
}

fn parse_url(url: &str) -> Result<Config, StoreError> {
    Config::from_str(url).map_err(|e| StoreError::InvalidArgument {
        field: "store",
        value: format!("a postgres URL ({e})"),
        expected: "postgres://user[:password]@host[:port]/database",
    })
}

fn connect(config: &Config, location: &std::path::Path) -> Result<Client, StoreError> {
    let mut client = config.connect(NoTls).map_err(|e| database("connect", location, e))?;
    let sync: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(|e| database("read synchronous_commit", location, e))?
        .get(0);
    if sync == "off" {
        return Err(StoreError::Unprovable {
            path: location.to_owned(),
            detail: "the database runs with synchronous_commit = off: a commit it acknowledges can be lost by its \
                     crash, so the ledger could not keep its promise; set it to on (or remote_apply/remote_write \
                     with replicas)"
                .into(),
        });
    }
    Ok(client)
}

impl PgStore {
    /// Opens stream `stream` of the database at `url` for writing, creating the tables (or
    /// upgrading them) and the stream if needed, taking it for a new owner (every earlier
    /// owner's handle is fenced out from now on) and verifying every row against the head.
    ///
    /// The open names no node and holds no lease: it takes the stream from any owner whose
    /// lease ran out (or who held none), and holds it until another owner takes it. A live
    /// lease of a node refuses it with [`StoreError::Leased`].
    pub fn open(url: &str, stream: &str) -> Result<PgStore, StoreError> {
        PgStore::open_as(url, stream, Some(Claimant { node: None, lease_ms: None }))
    }

    /// Opens stream `stream` for node `node` under a lease of `lease` (by the database's
    /// clock): refused with [`StoreError::Leased`] (retryable) while another node's lease
    /// runs; the writer renews it every third of `lease`; a clean close ends it at once, so
    /// another node may take the stream without waiting (a drain). A node that stops renewing
    /// (killed, paused, cut off) loses the stream to the next node that opens it after the
    /// lease ran out, and its writes are fenced from that moment, whatever its clock says.
    pub fn open_leased(url: &str, stream: &str, node: &str, lease: Duration) -> Result<PgStore, StoreError> {
        check_name("node", node)?;
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(StoreError::InvalidArgument {
                field: "lease",
                value: format!("{} ms", lease.as_millis()),
                expected: "a lease from 300 ms to 1 hour",
            });
        }
        PgStore::open_as(
            url,
            stream,
            Some(Claimant { node: Some(node.to_owned()), lease_ms: Some(lease.as_millis() as u64) }),
        )
    }

    /// Every stream of the database at `url` with its owner, token, lease and last LSN (for an
    /// operator's cluster view). Reads only.
    pub fn owners(url: &str) -> Result<Vec<StreamOwner>, StoreError> {
        let config = parse_url(url)?;
        let location = PathBuf::from(describe(&config));
        off_runtime(|| {
            let mut client = connect(&config, &location)?;
            if schema::schema_version(&mut client, &location)? == 0 {
                return Ok(Vec::new());
            }
            schema::owners(&mut client, &location)
        })
    }

    /// Opens an existing stream without taking it: nothing is written (appends and checkpoints
    /// are refused with [`StoreError::ReadOnly`]), the current owner keeps writing. For operators'
    /// tools (`tidegate ledger verify`); the rows are verified like [`PgStore::open`] does.
    pub fn open_read_only(url: &str, stream: &str) -> Result<PgStore, StoreError> {
        PgStore::open_as(url, stream, None)
    }

    /// Opens for `claimant`, or read-only when there is none.
    fn open_as(url: &str, stream: &str, claimant: Option<Claimant>) -> Result<PgStore, StoreError> {
        check_name("stream", stream)?;
        let read_only = claimant.is_none();
        let claimant = claimant.unwrap_or(Claimant { node: None, lease_ms: None });
        let config = parse_url(url)?;
        let location = PathBuf::from(format!("{} stream {stream}", describe(&config)));
        let (client, head, created, schema_version, migrated, checked) = off_runtime(|| {
            let mut client = connect(&config, &location)?;
            let (schema_version, migrated, head, created) = if read_only {
                let v = schema::schema_version(&mut client, &location)?;
                let head = match v {
                    0 => None,
                    _ => schema::read_head(&mut client, stream, &location)?,
                };
                let Some(head) = head else {
                    return Err(StoreError::NotALedger {
                        path: location.clone(),
                        detail: "the database holds no such ledger stream".into(),
                    });
                };
                (v, false, head, false)
            } else {
                let (v, migrated) = schema::migrate(&mut client, &location)?;
                let (head, created) = schema::claim(&mut client, stream, &claimant, &location)?;
                (v, migrated, head, created)
            };
            let checked = verify::check(&mut client, stream, &head, &location)?;
            Ok((client, head, created, schema_version, migrated, checked))
        })?;
        let token = if read_only { 0 } else { head.token };
        let shared = Arc::new(Shared::new(location.clone(), head.last_lsn));
        let report = OpenReport {
            location: location.display().to_string(),
            created,
            read_only,
            schema_version,
            migrated,
            format_version: head.format_version,
            token,
            rows_verified: checked.rows,
            last_lsn: head.last_lsn,
        };
        let mut store = PgStore {
            shared: shared.clone(),
            writer: None,
            config,
            stream: stream.to_owned(),
            ownership: Ownership { stream: stream.into(), token },
            read_only,
            readers: Mutex::new(Vec::new()),
            report,
        };
        if read_only {
            store.readers.lock().push(client);
        } else {
            let writer = Writer {
                client,
                shared,
                stream: stream.to_owned(),
                token,
                chain: checked.chain,
                lease: claimant.lease_ms.map(Duration::from_millis),
                connect: {
                    let (config, location) = (store.config.clone(), location.clone());
                    Box::new(move || connect(&config, &location))
                },
            };
            let handle = std::thread::Builder::new()
                .name(format!("tidegate-pg-{stream}"))
                .spawn(move || writer.run())
                .map_err(|source| StoreError::Io { op: "start the ledger writer", source })?;
            store.writer = Some(handle);
        }
        Ok(store)
    }

    /// What the open found.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Every event up to this LSN is durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Group commits sent so far (each one round trip).
    pub fn commits(&self) -> u64 {
        self.shared.state.lock().commits
    }

    /// Lease renewals so far.
    pub fn renewals(&self) -> u64 {
        self.shared.state.lock().renewals
    }

    /// Reads every row again, recomputes the chain and compares it with the head, as the open
    /// did: the rows verified and the last acknowledged LSN.
    pub fn verify(&self) -> Result<(u64, Lsn), StoreError> {
        let location = self.shared.location.clone();
        self.with_reader(|client| {
            let head = schema::read_head(client, &self.stream, &location)?.ok_or_else(|| StoreError::NotALedger {
                path: location.clone(),
                detail: "the stream's head row is gone".into(),
            })?;
            let checked = verify::check(client, &self.stream, &head, &location)?;
            Ok((checked.rows, head.last_lsn))
        })
    }

    /// Commits what is queued, stops the writer and closes the connections, reporting a failure
    /// the store had stopped on. (Dropping does the same, silently.)
    pub fn close(mut self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), StoreError> {
        let readers = std::mem::take(&mut *self.readers.lock());
        off_runtime(move || drop(readers));
        self.shared.state.lock().closing = true;
        self.shared.work.notify_all();
        if let Some(handle) = self.writer.take()
            && handle.join().is_err()
        {
            return Err(StoreError::Io {
                op: "stop the ledger writer",
                source: std::io::Error::other("the writer thread panicked"),
            });
        }
        self.shared.state.lock().failure()
    }

    /// Runs `f` on an idle read connection (a new one if none is idle, so a `scan` inside a
    /// `scan`'s visitor works), off any async runtime.
    fn with_reader<R: Send>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<R, StoreError> + Send,
    ) -> Result<R, StoreError> {
        let idle = self.readers.lock().pop();
        off_runtime(|| {
            let mut client = match idle {
                Some(c) if !c.is_closed() => c,
                _ => connect(&self.config, &self.shared.location)?,
            };
            let r = f(&mut client);
            let mut idle = self.readers.lock();
            if idle.len() < 4 && !client.is_closed() {
                idle.push(client);
            }
            r
        })
    }

    fn fenced_or(&self, op: &'static str, e: postgres::Error) -> StoreError {
        match state_of(&e) {
            Some((code, detail)) if code == FENCED => StoreError::Fenced {
                stream: self.stream.clone(),
                token: self.ownership.token,
                current: detail.and_then(|d| d.parse().ok()).unwrap_or(0),
            },
            Some((code, detail)) if code == PAST_END => {
                StoreError::BeyondEnd { lsn: self.last_lsn(), last: detail.and_then(|d| d.parse().ok()).unwrap_or(0) }
            }
            _ => database(op, &self.shared.location, e),
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Unparks a blocked waiter.
struct Unpark {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl LedgerStore for PgStore {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.location.clone(), op: "append" });
        }
        let mut st = self.shared.state.lock();
        st.failure()?;
        if st.closing {
            return Err(StoreError::Closed);
        }
        let last = self.shared.last.load(Ordering::Relaxed);
        if batch.is_empty() {
            return Ok(last);
        }
        let new_last = last + batch.len() as Lsn;
        if i64::try_from(new_last).is_err() {
            return Err(StoreError::InvalidArgument {
                field: "batch length",
                value: batch.len().to_string(),
                expected: "LSNs that fit in a signed 64-bit integer",
            });
        }
        st.appends += 1;
        let was_empty = st.queue.is_empty();
        if was_empty {
            st.oldest = Some(std::time::Instant::now());
        }
        st.queued_rows += batch.len();
        let full = st.queued_rows >= writer::MAX_ROWS;
        st.queue.push(Queued { first: last + 1, events: batch.clone() });
        self.shared.last.store(new_last, Ordering::Release);
        drop(st);
        if was_empty || full {
            // The writer learns the idle deadline, or that the queue is full.
            self.shared.work.notify_one();
        }
        Ok(new_last)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.shared.durable.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        if self.is_durable(lsn) {
            return Ok(());
        }
        let unpark = Arc::new(Unpark { thread: std::thread::current(), woken: AtomicBool::new(false) });
        let waker = Waker::from(unpark.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = self.poll_durable(lsn, &mut cx) {
                return r;
            }
            while !unpark.woken.swap(false, Ordering::AcqRel) {
                std::thread::park();
            }
        }
    }

    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        if self.is_durable(lsn) {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.shared.state.lock();
        if let Err(e) = st.failure() {
            return Poll::Ready(Err(e));
        }
        if lsn <= st.durable {
            return Poll::Ready(Ok(()));
        }
        let last = self.shared.last.load(Ordering::Acquire);
        if lsn > last {
            return Poll::Ready(Err(StoreError::BeyondEnd { lsn, last }));
        }
        let wakers = st.wakers.entry(lsn).or_default();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        if lsn > st.wanted {
            // Somebody waits: the writer commits now rather than at the idle deadline.
            st.wanted = lsn;
            drop(st);
            self.shared.work.notify_one();
        }
        Poll::Pending
    }

    fn last_lsn(&self) -> Lsn {
        self.shared.last.load(Ordering::Acquire)
    }

    /// The stream and the token this open took (0 for a read-only view).
    fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let from = from.max(1);
        // Everything up to `durable` is in the database; what is after it is queued or on its
        // way, in memory (taken under one lock, so nothing falls between the two).
        let (durable, pending) = {
            let st = self.shared.state.lock();
            st.failure()?;
            (st.durable, st.inflight.iter().chain(&st.queue).cloned().collect::<Vec<_>>())
        };
        let location = &self.shared.location;
        let mut next = from;
        while next <= durable {
            let rows = self.with_reader(|c| verify::page(c, &self.stream, next, durable, location))?;
            if rows.is_empty() {
                return Err(StoreError::Corrupt { lsn: next, detail: format!("the row of LSN {next} is missing") });
            }
            for row in rows {
                if row.lsn != next {
                    return Err(StoreError::Corrupt {
                        lsn: next,
                        detail: format!("the row of LSN {next} is missing (the next row is LSN {})", row.lsn),
                    });
                }
                let event = verify::decode(row.lsn, &row.body)?;
                if !visit(row.lsn, &event) {
                    return Ok(());
                }
                next += 1;
            }
        }
        for q in &pending {
            for (i, e) in q.events.iter().enumerate() {
                let lsn = q.first + i as Lsn;
                if lsn < next {
                    continue;
                }
                if !visit(lsn, e) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.location.clone(), op: "put_checkpoint" });
        }
        let last = self.last_lsn();
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        self.wait_durable(lsn)?;
        let (Ok(token), Ok(at)) = (i64::try_from(self.ownership.token), i64::try_from(lsn)) else {
            return Err(StoreError::InvalidArgument {
                field: "lsn",
                value: lsn.to_string(),
                expected: "an LSN that fits in a signed 64-bit integer",
            });
        };
        let r = self.with_reader(|c| {
            c.execute("SELECT tidegate_put_checkpoint($1, $2, $3, $4)", &[&self.stream, &token, &at, &bytes])
                .map_err(|e| self.fenced_or("store a checkpoint", e))
        });
        // A failed write stops the handle, as a failed commit does (the contract).
        r.map(drop).map_err(|e| {
            let st = self.shared.state.lock();
            self.shared.fail(st, e)
        })
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        let location = &self.shared.location;
        self.with_reader(|c| {
            let row = c
                .query_opt("SELECT lsn, bytes FROM tidegate_checkpoints WHERE stream = $1", &[&self.stream])
                .map_err(|e| database("read the checkpoint", location, e))?;
            Ok(row.map(|r| StoredCheckpoint { lsn: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0), bytes: r.get(1) }))
        })
    }
}
