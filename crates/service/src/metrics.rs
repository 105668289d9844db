//! Prometheus metrics (docs/server.md, "Metrics"). No metric carries a tenant label.

use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of HTTP request counts.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Method.
    pub method: String,
    /// Matched route template (`/v1/transactions/{tx}`), or `unmatched`.
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// A route label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Matched route template.
    pub route: String,
}

/// A single string label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The abort reason's kind.
    pub reason: String,
}

/// A settlement tag.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TagLabel {
    /// The tag.
    pub tag: String,
}

/// A commit's result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `committed` or `aborted`, or a webhook result.
    pub result: String,
}

/// A dispatch's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DispatchLabels {
    /// `webhook` or `worker`.
    pub kind: String,
    /// `call`, `release`, `compensate`, `probe`.
    pub operation: String,
    /// `done`, `failed`, `unknown`.
    pub outcome: String,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `global`, `tenant` or `waiters`.
    pub limit: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s, doubling.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Values read from the engines and queues at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Commits that waited, over all engines since they opened.
    pub commit_waits: u64,
    /// Their total wait, seconds.
    pub commit_wait_seconds: f64,
    /// Unfinished transactions.
    pub unfinished: u64,
    /// Of those, waiting to commit.
    pub waiting: u64,
    /// Worker tasks queued.
    pub queued_tasks: u64,
    /// Worker tasks leased.
    pub leased_tasks: u64,
    /// Ledger syncs (embedded store) since the stores opened.
    pub ledger_syncs: u64,
    /// Tenants whose engine is open.
    pub tenants: u64,
}

#[derive(Debug)]
struct SnapshotCollector(Arc<Mutex<Snapshot>>);

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.lock().clone();
        let counters: [(&str, &str, u64); 2] = [
            ("tidegate_engine_commit_waits", "Commits that had to wait for earlier transactions.", s.commit_waits),
            ("tidegate_ledger_syncs", "Group commits (syncs) of the embedded ledgers.", s.ledger_syncs),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let c = ConstCounter::new(s.commit_wait_seconds);
        c.encode(encoder.encode_descriptor(
            "tidegate_engine_commit_wait_seconds",
            "Total time commits waited for earlier transactions.",
            None,
            c.metric_type(),
        )?)?;
        let gauges: [(&str, &str, i64); 5] = [
            ("tidegate_engine_unfinished_transactions", "Transactions not yet settled.", to_i64(s.unfinished)),
            ("tidegate_engine_waiting_transactions", "Transactions waiting to commit.", to_i64(s.waiting)),
            ("tidegate_worker_queue_queued", "Worker tasks waiting for a worker.", to_i64(s.queued_tasks)),
            ("tidegate_worker_queue_leased", "Worker tasks leased to a worker.", to_i64(s.leased_tasks)),
            ("tidegate_tenants_open", "Tenants whose engine is open.", to_i64(s.tenants)),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Every metric the server keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    snapshot: Arc<Mutex<Snapshot>>,
    /// HTTP requests.
    pub http_requests: Family<HttpLabels, Counter>,
    /// HTTP request duration.
    pub http_duration: HistogramFamily<RouteLabel>,
    /// Commit request to settlement.
    pub commit_latency: HistogramFamily<ResultLabel>,
    /// Commits decided.
    pub commits: Counter,
    /// Aborts decided, by reason.
    pub aborts: Family<ReasonLabel, Counter>,
    /// Non-clean settlement tags.
    pub tags: Family<TagLabel, Counter>,
    /// Long-polls and SSE streams in progress.
    pub waits_active: Gauge,
    /// Dispatches by kind, operation and outcome.
    pub dispatch: Family<DispatchLabels, Counter>,
    /// Webhook requests by result.
    pub webhook_requests: Family<ResultLabel, Counter>,
    /// Webhook request duration.
    pub webhook_duration: Histogram,
    /// Append to observed durability.
    pub durable_wait: Histogram,
    /// Requests refused by a limit.
    pub overload: Family<LimitLabel, Counter>,
    /// Idempotent replays.
    pub idempotent_replays: Counter,
    /// Tickets issued for client-executed effects.
    pub client_tickets: Counter,
    /// Results reported for client-executed effects, by kind (`done`, `not_applied`,
    /// `unknown`).
    pub client_results: Family<ResultLabel, Counter>,
    /// Tickets dropped because no result came within the transaction's lease.
    pub client_tickets_expired: Counter,
    /// Tenants dropped because their ledger store fenced this node out.
    pub tenants_fenced: Counter,
    /// Tenants this node took because nobody served them (crate::cluster).
    pub tenants_adopted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "tidegate_http_requests",
            "HTTP requests by method, route and status.",
            http_requests.clone(),
        );
        let http_duration = HistogramFamily::<RouteLabel>::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register("tidegate_http_request_duration_seconds", "HTTP request duration.", http_duration.clone());
        let commit_latency =
            HistogramFamily::<ResultLabel>::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "tidegate_commit_latency_seconds",
            "From a commit request to the transaction's settlement.",
            commit_latency.clone(),
        );
        let commits = Counter::default();
        registry.register("tidegate_commits", "Commit decisions (from the ledgers).", commits.clone());
        let aborts = Family::<ReasonLabel, Counter>::default();
        registry.register("tidegate_aborts", "Abort decisions by reason (from the ledgers).", aborts.clone());
        let tags = Family::<TagLabel, Counter>::default();
        registry.register("tidegate_effect_tags", "Effects settled with a tag other than clean.", tags.clone());
        let waits_active = Gauge::default();
        registry.register("tidegate_waits_active", "Long-polls and SSE streams in progress.", waits_active.clone());
        let dispatch = Family::<DispatchLabels, Counter>::default();
        registry.register(
            "tidegate_dispatch",
            "Capability dispatches by kind, operation and outcome.",
            dispatch.clone(),
        );
        let webhook_requests = Family::<ResultLabel, Counter>::default();
        registry.register("tidegate_webhook_requests", "Webhook requests by result.", webhook_requests.clone());
        let webhook_duration = latency_histogram();
        registry.register("tidegate_webhook_duration_seconds", "Webhook request duration.", webhook_duration.clone());
        let durable_wait = latency_histogram();
        registry.register(
            "tidegate_ledger_durable_wait_seconds",
            "From a ledger append to a waiter observing it durable.",
            durable_wait.clone(),
        );
        let overload = Family::<LimitLabel, Counter>::default();
        registry.register("tidegate_overload_rejections", "Requests refused by a concurrency limit.", overload.clone());
        let idempotent_replays = Counter::default();
        registry.register(
            "tidegate_idempotent_replays",
            "Requests answered from an idempotency record.",
            idempotent_replays.clone(),
        );
        let client_tickets = Counter::default();
        registry.register(
            "tidegate_client_tickets",
            "Tickets issued for client-executed effects.",
            client_tickets.clone(),
        );
        let client_results = Family::<ResultLabel, Counter>::default();
        registry.register(
            "tidegate_client_results",
            "Results reported for client-executed effects, by kind (done, not_applied, unknown).",
            client_results.clone(),
        );
        let client_tickets_expired = Counter::default();
        registry.register(
            "tidegate_client_tickets_expired",
            "Tickets of client-executed effects dropped because no result came within the lease.",
            client_tickets_expired.clone(),
        );
        let tenants_fenced = Counter::default();
        registry.register(
            "tidegate_tenants_fenced",
            "Tenants this node dropped because their ledger store fenced it out (another node took them over).",
            tenants_fenced.clone(),
        );
        let tenants_adopted = Counter::default();
        registry.register(
            "tidegate_tenants_adopted",
            "Tenants this node took over because no live node held them (a PostgreSQL cluster).",
            tenants_adopted.clone(),
        );
        registry.register_collector(Box::new(SnapshotCollector(snapshot.clone())));
        Metrics {
            registry,
            snapshot,
            http_requests,
            http_duration,
            commit_latency,
            commits,
            aborts,
            tags,
            waits_active,
            dispatch,
            webhook_requests,
            webhook_duration,
            durable_wait,
            overload,
            idempotent_replays,
            client_tickets,
            client_results,
            client_tickets_expired,
            tenants_fenced,
            tenants_adopted,
        }
    }

    /// Encodes every metric in the Prometheus text format, with `snapshot` as the scrape-time
    /// values.
    pub fn render(&self, snapshot: Snapshot) -> String {
        *self.snapshot.lock() = snapshot;
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            let _ = writeln!(out, "# encoding failed");
        }
        out
    }

    /// Counts a refusal by `limit`.
    pub fn refused(&self, limit: &str) {
        self.overload.get_or_create(&LimitLabel { limit: limit.to_owned() }).inc();
    }
}
