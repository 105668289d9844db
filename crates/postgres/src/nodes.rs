//! The nodes of a cluster sharing one database (docs/postgres.md, "Nodes"): where each one
//! answers and whether it is alive, by the database's clock.
//!
//! A [`NodeRegistry`] is one node's presence: a thread of its own (the blocking client never
//! runs on an async runtime) that says "alive" every `every` (an upsert of its row in
//! `tidegate_nodes`) and reads, in the same round, every node and every stream's owner. The
//! latest reading is a [`ClusterSnapshot`], watched through [`NodeRegistry::watch`]. The
//! thread also listens for the notification every take-over and release of a stream sends
//! (`LISTEN tidegate_cluster`) and reads at once when one comes: a node learns of a drain or
//! of a new owner within a round trip, and a lost notification costs one round, never
//! correctness. Dropping
//! the registry removes the node's row (a clean leave). A registry that cannot reach the
//! database keeps trying (with backoff) and publishes nothing new meanwhile: a stale
//! snapshot says when it was taken, so its readers can tell.
//!
//! Liveness here is advice, never ownership: who may append to a stream is decided only by
//! the stream's token and lease (`tidegate_streams`), checked by the database in the write.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Config};
use tidegate_storage::StoreError;

use crate::error::database;
use crate::schema::{self, StreamOwner};
use crate::{check_name, connect, describe, parse_url};

/// Longest node address accepted (`server.advertise_url`).
pub const MAX_ADDRESS_BYTES: usize = 2048;

/// One node as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its id.
    pub node: String,
    /// Where it answers, as it said (`None`: it did not say).
    pub address: Option<String>,
    /// How long ago it last said it was alive, by the database's clock.
    pub seen_ms_ago: u64,
}

/// What the database said in one round.
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    /// Every registered node, by id (dead ones too, until they are pruned).
    pub nodes: Vec<NodeInfo>,
    /// Every stream with its owner, token and lease, by name.
    pub streams: Vec<StreamOwner>,
    /// When this reading was taken (this process's clock).
    pub taken_at: Instant,
}

impl ClusterSnapshot {
    /// The nodes seen within `window`, by id.
    pub fn alive(&self, window: Duration) -> impl Iterator<Item = &NodeInfo> {
        let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        self.nodes.iter().filter(move |n| n.seen_ms_ago <= ms)
    }

    /// Where `node` answers, if it said.
    pub fn address(&self, node: &str) -> Option<&str> {
        self.nodes.iter().find(|n| n.node == node).and_then(|n| n.address.as_deref())
    }
}

/// How long the registry thread waits for a notification at a time (the latest a stop is
/// seen).
const SLICE: Duration = Duration::from_millis(100);

/// Subscribes `client` to the streams' changes of hands (`pg_notify('tidegate_cluster', stream)`
/// at every take-over and release).
fn listen(client: &mut Client, location: &std::path::Path) -> Result<(), StoreError> {
    client.batch_execute("LISTEN tidegate_cluster").map_err(|e| database("listen for take-overs", location, e))
}

/// Rows of nodes not seen for this long are removed by whichever node reads next.
const PRUNE_AFTER: &str = "1 day";

struct Control {
    stop: Mutex<bool>,
}

/// One node's presence in the cluster (see the module documentation).
pub struct NodeRegistry {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
    rx: tokio::sync::watch::Receiver<Option<Arc<ClusterSnapshot>>>,
}

impl std::fmt::Debug for NodeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRegistry").finish_non_exhaustive()
    }
}

impl NodeRegistry {
    /// Registers `node` (answering at `address`) in the database at `url` and keeps it alive
    /// every `every` (at least 50 ms). The first round runs before this returns, so a bad URL,
    /// a database that refuses or one a newer build migrated is an error here; later failures
    /// are retried by the thread.
    pub fn start(url: &str, node: &str, address: Option<&str>, every: Duration) -> Result<NodeRegistry, StoreError> {
        check_name("node", node)?;
        if let Some(a) = address
            && (a.is_empty() || a.len() > MAX_ADDRESS_BYTES || a.chars().any(char::is_control))
        {
            return Err(StoreError::InvalidArgument {
                field: "address",
                value: a.chars().take(64).collect(),
                expected: "1 to 2048 bytes without control characters",
            });
        }
        let config = parse_url(url)?;
        let location = PathBuf::from(describe(&config));
        let round = Round { config, location, node: node.to_owned(), address: address.map(str::to_owned) };
        let every = every.max(Duration::from_millis(50));
        let (mut client, first) = crate::error::off_runtime(|| {
            let mut client = connect(&round.config, &round.location)?;
            schema::migrate(&mut client, &round.location)?;
            listen(&mut client, &round.location)?;
            let snap = round.run(&mut client)?;
            Ok::<_, StoreError>((client, snap))
        })?;
        let (tx, rx) = tokio::sync::watch::channel(Some(Arc::new(first)));
        let control = Arc::new(Control { stop: Mutex::new(false) });
        let c = control.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tidegate-node-{}", node.chars().take(16).collect::<String>()))
            .spawn(move || {
                let mut backoff = every;
                loop {
                    // Until the next round, or a notification that a stream changed hands
                    // (then at once), in slices so that a stop is seen within one.
                    let until = Instant::now() + backoff;
                    loop {
                        if *c.stop.lock() {
                            break;
                        }
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        let got = client.notifications().timeout_iter(left.min(SLICE)).next();
                        match got {
                            Ok(Some(_)) => {
                                // Take every notification already there, then read.
                                let _ = client.notifications().iter().count();
                                break;
                            }
                            Ok(None) => {}
                            // The connection is gone: wait out the slice (the round below
                            // reconnects), never spin on the error.
                            Err(_) => std::thread::sleep(left.min(SLICE)),
                        }
                    }
                    if *c.stop.lock() {
                        break;
                    }
                    match round.run(&mut client) {
                        Ok(snap) => {
                            backoff = every;
                            tx.send_replace(Some(Arc::new(snap)));
                        }
                        Err(_) => {
                            backoff = (backoff * 2).min(every * 8);
                            if let Ok(mut fresh) = connect(&round.config, &round.location)
                                && listen(&mut fresh, &round.location).is_ok()
                            {
                                client = fresh;
                            }
                        }
                    }
                }
                // A clean leave: the node's row goes, so nobody is sent here any more.
                let _ = client.execute("DELETE FROM tidegate_nodes WHERE node = $1", &[&round.node]);
            })
            .map_err(|e| StoreError::Io { op: "start the node registry thread", source: e })?;
        Ok(NodeRegistry { control, thread: Some(thread), rx })
    }

    /// One reading of the database at `url` without registering anything (an operator's view,
    /// `GET /v1/cluster`). A database without Tidegate's tables reads as an empty cluster.
    pub fn read(url: &str) -> Result<ClusterSnapshot, StoreError> {
        let config = parse_url(url)?;
        let location = PathBuf::from(describe(&config));
        crate::error::off_runtime(|| {
            let mut client = connect(&config, &location)?;
            match schema::schema_version(&mut client, &location)? {
                0 => Ok(ClusterSnapshot { nodes: Vec::new(), streams: Vec::new(), taken_at: Instant::now() }),
                1 | 2 => {
                    let streams = schema::owners(&mut client, &location)?;
                    Ok(ClusterSnapshot { nodes: Vec::new(), streams, taken_at: Instant::now() })
                }
                _ => read(&mut client, &location),
            }
        })
    }

    /// The latest snapshot (the first one is there from the start).
    pub fn latest(&self) -> Option<Arc<ClusterSnapshot>> {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every new snapshot.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Option<Arc<ClusterSnapshot>>> {
        self.rx.clone()
    }
}

impl Drop for NodeRegistry {
    fn drop(&mut self) {
        *self.control.stop.lock() = true;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Round {
    config: Config,
    location: PathBuf,
    node: String,
    address: Option<String>,
}

impl Round {
    /// Says "alive", then reads the nodes and the streams.
    fn run(&self, client: &mut Client) -> Result<ClusterSnapshot, StoreError> {
        let db = |op| move |e| database(op, &self.location, e);
        client
            .execute(
                "INSERT INTO tidegate_nodes (node, address, started_at, seen_at) VALUES ($1, $2, now(), now()) \
                 ON CONFLICT (node) DO UPDATE SET address = excluded.address, seen_at = now()",
                &[&self.node, &self.address],
            )
            .map_err(db("say the node is alive"))?;
        client
            .execute(&format!("DELETE FROM tidegate_nodes WHERE seen_at < now() - interval '{PRUNE_AFTER}'"), &[])
            .map_err(db("prune long-gone nodes"))?;
        read(client, &self.location)
    }
}

/// Reads every node and every stream's owner.
fn read(client: &mut Client, location: &std::path::Path) -> Result<ClusterSnapshot, StoreError> {
    let nodes = client
        .query(
            "SELECT node, address, greatest(0, (extract(epoch FROM now() - seen_at) * 1000)::bigint) \
         FROM tidegate_nodes ORDER BY node",
            &[],
        )
        .map_err(|e| database("read the nodes", location, e))?
        .iter()
        .map(|row| NodeInfo {
            node: row.get(0),
            address: row.get(1),
            seen_ms_ago: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        })
        .collect();
    let streams = schema::owners(client, location)?;
    Ok(ClusterSnapshot { nodes, streams, taken_at: Instant::now() })
}
