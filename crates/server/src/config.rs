//! The server's configuration: one TOML file, then `TIDEGATE_<SECTION>_<KEY>` environment
//! variables, then flags (applied by the caller). Every default is set here and listed in
//! docs/server.md and `tidegate.example.toml`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
pub use tidegate_service::settings::{DispatchSection, ReviewDatabase, ReviewSection, ReviewTenant};

/// The whole configuration. Every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listening, data, shutdown.
    pub server: ServerSection,
    /// Bounds on what clients may ask.
    pub limits: Limits,
    /// Settings of every tenant's engine.
    pub engine: EngineSection,
    /// API key lookups.
    pub auth: AuthSection,
    /// Capability dispatch defaults.
    pub dispatch: DispatchSection,
    /// Logging.
    pub log: LogSection,
    /// The review middleware (`/v1/review`, docs/review.md).
    pub review: ReviewSection,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// Address to listen on. Default `127.0.0.1:7878`.
    pub listen: SocketAddr,
    /// The catalog and the tenants' ledgers. Default: chosen by the command line
    /// (`$TIDEGATE_DATA_DIR`, `$XDG_DATA_HOME/tidegate`, `~/.local/share/tidegate`).
    pub data_dir: Option<PathBuf>,
    /// Keep the catalog and every ledger in memory (tests). Default `false`.
    pub memory: bool,
    /// Where the catalog and the tenants' ledgers live, as a store URL (`memory:`,
    /// `sqlite:DIR`, a directory, or `postgres://…` for the catalog, the ledgers and the
    /// tenants' state in PostgreSQL; `tidegate_runtime::StoreUrl`): when set, it takes the
    /// place of `data_dir` and `memory`. Default unset.
    pub store: Option<String>,
    /// This node's id: the owner its PostgreSQL leases name (docs/deployment.md). Default:
    /// the host's name.
    pub node_id: Option<String>,
    /// Where clients reach this node (a base URL such as `http://10.0.0.7:7878`), registered
    /// with the cluster on a PostgreSQL store: a node that does not serve a tenant names it in
    /// its `503 tenant_unavailable` (`owner_address`). Default: `http://<the bound address>`,
    /// or `http://<node id>:<port>` when listening on a wildcard address.
    pub advertise_url: Option<String>,
    /// How long this node's ownership of a tenant's PostgreSQL stream lasts without renewal,
    /// in milliseconds (renewed every third; a node that dies keeps its tenants that long).
    /// 300 to 3 600 000. Default 10 000.
    pub ownership_lease_ms: u64,
    /// How long a shutdown waits for requests and settlement tasks. Default 30 000.
    pub shutdown_drain_ms: u64,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            data_dir: None,
            memory: false,
            store: None,
            node_id: None,
            advertise_url: None,
            ownership_lease_ms: 10_000,
            shutdown_drain_ms: 30_000,
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest request body in bytes (413 beyond). Default 1 MiB.
    pub max_body_bytes: usize,
    /// Requests in progress over all tenants (503 beyond). Default 1024.
    pub max_concurrent_requests: usize,
    /// Requests in progress per tenant (429 beyond). Default 256.
    pub max_concurrent_per_tenant: usize,
    /// Long-polls and SSE streams at once (429 beyond). Default 10 000.
    pub max_waiters: usize,
    /// Longest long-poll in milliseconds. Default 60 000.
    pub max_wait_ms: u64,
    /// Longest SSE stream in milliseconds. Default 3 600 000.
    pub max_sse_ms: u64,
    /// Largest page (`limit`). Default 500.
    pub max_page_size: usize,
    /// Most branches of a speculation group. Default 64.
    pub max_branches: usize,
    /// How long a completed idempotency record is kept, in seconds. Default 86 400.
    pub idempotency_ttl_s: u64,
    /// Idempotency records per tenant (oldest dropped first). Default 100 000.
    pub idempotency_max_records: usize,
    /// Settled transactions kept in memory per tenant. Default 10 000.
    pub retain_settled: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            max_concurrent_requests: 1024,
            max_concurrent_per_tenant: 256,
            max_waiters: 10_000,
            max_wait_ms: 60_000,
            max_sse_ms: 3_600_000,
            max_page_size: 500,
            max_branches: 64,
            idempotency_ttl_s: 86_400,
            idempotency_max_records: 100_000,
            retain_settled: 10_000,
        }
    }
}

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// Consistency level `L0`..`L4`. Default `L4`.
    pub level: String,
    /// Default lease of a transaction in milliseconds. Default 30 000.
    pub lease_ms: u64,
    /// `epoch` or `first_committer_wins`. Default `epoch`.
    pub ordering: String,
    /// Projection checkpoint interval in events (0: only at shutdown). Default 200 000.
    pub checkpoint_every_events: u64,
    /// Scope types accepted besides the engine's defaults (`fs`, `db`, `mail`, `kv`,
    /// `retail`, `travel`, `web`, `ui`, `bench`): name → `colon`, `colon_insensitive`,
    /// `posix` or `posix_insensitive`. Default empty.
    pub scope_types: std::collections::BTreeMap<String, String>,
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            level: "L4".into(),
            lease_ms: 30_000,
            ordering: "epoch".into(),
            checkpoint_every_events: 200_000,
            scope_types: std::collections::BTreeMap::new(),
        }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// How long a key lookup is cached, in milliseconds. Default 1000.
    pub cache_ttl_ms: u64,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection { cache_ttl_ms: 1000 }
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// `text` or `json`. Default `text`.
    pub format: String,
    /// A tracing filter (`RUST_LOG` syntax). Default `info`.
    pub filter: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection { format: "text".into(), filter: "info".into() }
    }
}

const SECTIONS: [&str; 7] = ["server", "limits", "engine", "auth", "dispatch", "log", "review"];

impl Config {
    /// Parses a TOML document, then applies environment overrides from `env`
    /// (`TIDEGATE_<SECTION>_<KEY>=value`; the value is read as a TOML value if it parses as
    /// one, else as a string). `TIDEGATE_DATA_DIR` sets `server.data_dir`. Variables of
    /// other prefixes are ignored; a variable naming a known section and an unknown key is
    /// refused.
    pub fn from_toml_and_env<I>(toml_text: Option<&str>, env: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut doc: toml::Table = match toml_text {
            Some(t) => t.parse::<toml::Table>().map_err(|e| ConfigError::Parse { detail: e.to_string() })?,
            None => toml::Table::new(),
        };
        let mut vars: Vec<(String, String)> = env.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("TIDEGATE_") else { continue };
            let (section, key) = if rest == "DATA_DIR" {
                ("server".to_owned(), "data_dir".to_owned())
            } else {
                let lower = rest.to_ascii_lowercase();
                let Some(section) = SECTIONS.iter().find(|s| lower.starts_with(&format!("{s}_"))) else { continue };
                let key = lower[section.len() + 1..].to_owned();
                ((*section).to_owned(), key)
            };
            let parsed = parse_env_value(&value);
            let table = doc
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| ConfigError::Parse { detail: format!("`{section}` must be a table") })?;
            table.insert(key, parsed);
        }
        let cfg: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| ConfigError::Invalid { key: e.path().to_string(), detail: e.inner().to_string() })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks values serde cannot (levels, orderings, zero limits).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, detail: String| Err(ConfigError::Invalid { key: key.into(), detail });
        if let Some(text) = &self.server.store {
            text.parse::<tidegate_runtime::StoreUrl>()
                .map_err(|e| ConfigError::Invalid { key: "server.store".into(), detail: e.to_string() })?;
        }
        if !(300..=3_600_000).contains(&self.server.ownership_lease_ms) {
            return bad(
                "server.ownership_lease_ms",
                format!("{}: expected 300 to 3600000 (milliseconds)", self.server.ownership_lease_ms),
            );
        }
        if let Some(id) = &self.server.node_id
            && (id.is_empty() || id.len() > 200 || id.chars().any(char::is_control))
        {
            return bad("server.node_id", format!("{id:?}: expected 1 to 200 bytes without control characters"));
        }
        if let Some(url) = &self.server.advertise_url
            && (!(url.starts_with("http://") || url.starts_with("https://"))
                || url.len() > 2048
                || url.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return bad(
                "server.advertise_url",
                format!("{url:?}: expected an http:// or https:// base URL of at most 2048 bytes without spaces"),
            );
        }
        if self.level().is_err() {
            return bad("engine.level", format!("`{}`: expected one of L0, L1, L2, L3, L4", self.engine.level));
        }
        if self.ordering().is_err() {
            return bad(
                "engine.ordering",
                format!("`{}`: expected `epoch` or `first_committer_wins`", self.engine.ordering),
            );
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad("log.format", format!("`{}`: expected `text` or `json`", self.log.format));
        }
        for (key, v) in [
            ("limits.max_body_bytes", self.limits.max_body_bytes),
            ("limits.max_concurrent_requests", self.limits.max_concurrent_requests),
            ("limits.max_concurrent_per_tenant", self.limits.max_concurrent_per_tenant),
            ("limits.max_waiters", self.limits.max_waiters),
            ("limits.max_page_size", self.limits.max_page_size),
            ("limits.max_branches", self.limits.max_branches),
        ] {
            if v == 0 {
                return bad(key, "0: expected at least 1".into());
            }
        }
        self.scopes()
            .map_err(|(name, detail)| ConfigError::Invalid { key: format!("engine.scope_types.{name}"), detail })?;
        if self.dispatch.webhook_attempts == 0 {
            return bad("dispatch.webhook_attempts", "0: expected at least 1".into());
        }
        if let Err(detail) = ReviewSection::parse_database(&self.review.database) {
            return bad("review.database", detail);
        }
        for (name, t) in &self.review.tenants {
            if let Err(detail) = ReviewSection::parse_database(&t.database) {
                return bad(&format!("review.tenants.{name}.database"), detail);
            }
            if let Err(detail) = self.review.pg_schema(name) {
                return bad(&format!("review.tenants.{name}.schema"), detail);
            }
        }
        if self.review.statement_timeout_ms == 0 || self.review.statement_timeout_ms > i32::MAX as u64 {
            return bad(
                "review.statement_timeout_ms",
                format!("{}: expected 1 to {} milliseconds", self.review.statement_timeout_ms, i32::MAX),
            );
        }
        if self.engine.lease_ms == 0 {
            return bad("engine.lease_ms", "0: expected a positive number of milliseconds".into());
        }
        Ok(())
    }

    /// The engine level.
    pub fn level(&self) -> Result<tidegate_runtime::Level, String> {
        self.engine.level.parse::<tidegate_runtime::Level>().map_err(|e| e.to_string())
    }

    /// The scope registry: the engine's defaults plus `engine.scope_types`.
    pub fn scopes(&self) -> Result<tidegate_runtime::ScopeRegistry, (String, String)> {
        use tidegate_core::scope::{CaseRule, PathStyle, ScopeRule};
        let mut reg = tidegate_runtime::ScopeRegistry::default();
        for (name, rule) in &self.engine.scope_types {
            let (style, case) = match rule.as_str() {
                "colon" => (PathStyle::Colon, CaseRule::Sensitive),
                "colon_insensitive" => (PathStyle::Colon, CaseRule::Insensitive),
                "posix" => (PathStyle::Posix, CaseRule::Sensitive),
                "posix_insensitive" => (PathStyle::Posix, CaseRule::Insensitive),
                other => {
                    return Err((
                        name.clone(),
                        format!("`{other}`: expected colon, colon_insensitive, posix or posix_insensitive"),
                    ));
                }
            };
            reg.register(name, ScopeRule { style, case }).map_err(|e| (name.clone(), e.to_string()))?;
        }
        Ok(reg)
    }

    /// The commit ordering.
    pub fn ordering(&self) -> Result<tidegate_runtime::Ordering, String> {
        match self.engine.ordering.as_str() {
            "epoch" => Ok(tidegate_runtime::Ordering::EpochOrder),
            "first_committer_wins" => Ok(tidegate_runtime::Ordering::FirstCommitterWins),
            other => Err(format!("unknown ordering `{other}`")),
        }
    }
}

fn parse_env_value(value: &str) -> toml::Value {
    // `key = <value>` parses numbers, booleans, arrays and quoted strings; anything else is
    // taken as a bare string (paths, addresses).
    match format!("v = {value}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(value.to_owned())),
        Err(_) => toml::Value::String(value.to_owned()),
    }
}

impl Config {
    /// Where the catalog and the ledgers live: `server.store` if set, else in memory with
    /// `server.memory`, else the SQLite directory `server.data_dir`.
    pub fn store_url(&self) -> Result<tidegate_runtime::StoreUrl, ConfigError> {
        use tidegate_runtime::StoreUrl;
        let invalid = |detail: String| ConfigError::Invalid { key: "server.store".into(), detail };
        match (&self.server.store, self.server.memory, &self.server.data_dir) {
            (Some(text), _, _) => text.parse::<StoreUrl>().map_err(|e| invalid(e.to_string())),
            (None, true, _) => Ok(StoreUrl::Memory),
            (None, false, Some(dir)) => Ok(StoreUrl::Sqlite(dir.clone())),
            (None, false, None) => Err(ConfigError::Invalid {
                key: "server.data_dir".into(),
                detail: "(none): expected a data directory, `server.memory = true` or `server.store`".into(),
            }),
        }
    }

    /// This node's id: `server.node_id`, else the host's name (`/etc/hostname`,
    /// `$HOSTNAME`), else `tidegate`.
    pub fn node_id(&self) -> String {
        self.server.node_id.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok())
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "tidegate".into())
        })
    }

    /// Where this node tells clients to reach it, for a server bound to `bound`:
    /// `server.advertise_url`, else `http://<bound>`, or `http://<node id>:<port>` when bound
    /// to a wildcard address.
    pub fn advertise_url(&self, bound: SocketAddr) -> String {
        if let Some(u) = &self.server.advertise_url {
            return u.trim_end_matches('/').to_owned();
        }
        if bound.ip().is_unspecified() {
            format!("http://{}:{}", self.node_id(), bound.port())
        } else {
            format!("http://{bound}")
        }
    }

    /// The settings every tenant is opened with.
    pub fn tenant_settings(&self) -> Result<tidegate_service::tenant::TenantSettings, ConfigError> {
        let cfg = self;
        Ok(tidegate_service::tenant::TenantSettings {
            store: cfg.store_url()?,
            node_id: cfg.node_id(),
            ownership_lease: std::time::Duration::from_millis(cfg.server.ownership_lease_ms),
            lease: std::time::Duration::from_millis(cfg.engine.lease_ms),
            level: cfg.level().unwrap_or(tidegate_runtime::Level::L4),
            ordering: cfg.ordering().unwrap_or_default(),
            checkpoint_every: cfg.engine.checkpoint_every_events,
            retain: cfg.limits.retain_settled,
            max_concurrent: cfg.limits.max_concurrent_per_tenant,
            idempotency_ttl: std::time::Duration::from_secs(cfg.limits.idempotency_ttl_s),
            idempotency_max: cfg.limits.idempotency_max_records,
            dispatch: cfg.dispatch.clone(),
            scopes: cfg.scopes().unwrap_or_default(),
            review: cfg.review.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_from_an_empty_file_and_the_example_matches_them() {
        let empty = Config::from_toml_and_env(Some(""), Vec::new()).unwrap();
        assert_eq!(empty, Config::default());
        let example = include_str!("../tidegate.example.toml");
        let parsed = Config::from_toml_and_env(Some(example), Vec::new()).unwrap();
        assert_eq!(parsed, Config::default(), "the example config must list the defaults");
    }

    #[test]
    fn environment_overrides_the_file_and_unknown_keys_are_named() {
        let env = vec![
            ("TIDEGATE_LIMITS_MAX_BODY_BYTES".to_owned(), "2048".to_owned()),
            ("TIDEGATE_SERVER_LISTEN".to_owned(), "127.0.0.1:9000".to_owned()),
            ("TIDEGATE_DATA_DIR".to_owned(), "/tmp/x".to_owned()),
            ("TIDEGATE_SCHEDULES".to_owned(), "12".to_owned()),
        ];
        let cfg = Config::from_toml_and_env(Some("[limits]\nmax_body_bytes = 10\n"), env).unwrap();
        assert_eq!(cfg.limits.max_body_bytes, 2048);
        assert_eq!(cfg.server.listen.port(), 9000);
        assert_eq!(cfg.server.data_dir, Some(PathBuf::from("/tmp/x")));
        let err = Config::from_toml_and_env(None, vec![("TIDEGATE_LIMITS_MAX_BODDY".into(), "1".into())]).unwrap_err();
        assert!(err.to_string().contains("max_boddy"), "{err}");
        let err = Config::from_toml_and_env(Some("[engine]\nlevel = \"L9\"\n"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("engine.level"), "{err}");
        let env = vec![("TIDEGATE_ENGINE_SCOPE_TYPES".to_owned(), "{billing = \"colon\"}".to_owned())];
        let cfg = Config::from_toml_and_env(None, env).unwrap();
        assert!(cfg.scopes().unwrap().parse("billing:inv:7").is_ok());
        let err = Config::from_toml_and_env(Some("[engine.scope_types]\nx = \"weird\"\n"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("engine.scope_types.x"), "{err}");
    }

    #[test]
    fn review_databases_are_chosen_per_tenant_and_bad_values_are_named() {
        let text = "[review]\nstrategy = \"buffer_compensating\"\n[review.tenants.acme]\ndatabase = \"sqlite:/tmp/a.db\"\ngranularity = \"table\"\n";
        let cfg = Config::from_toml_and_env(Some(text), Vec::new()).unwrap();
        let (db, strategy, granularity) = cfg.review.for_tenant("acme").unwrap();
        assert_eq!(db, ReviewDatabase::Sqlite(PathBuf::from("/tmp/a.db")));
        assert_eq!(strategy, tidegate_review::Strategy::BufferCompensating, "inherited from [review]");
        assert_eq!(granularity, tidegate_review::Granularity::Table);
        assert_eq!(cfg.review.for_tenant("other").unwrap().0, ReviewDatabase::Default);
        let err =
            Config::from_toml_and_env(Some("[review.tenants.x]\ndatabase = \"mysql://h\"\n"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("review.tenants.x.database") && err.to_string().contains("mysql"), "{err}");
        let err = Config::from_toml_and_env(Some("[review]\nstrategy = \"yolo\"\n"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("review.strategy"), "{err}");
    }

    #[test]
    fn review_least_privilege_keys_have_safe_defaults_and_bad_values_are_named() {
        let cfg = Config::default();
        assert!(!cfg.review.allow_postgres_superuser, "a superuser admin URL is refused unless allowed");
        assert_eq!(cfg.review.bounds().statement_timeout, std::time::Duration::from_secs(30));
        let env = vec![
            ("TIDEGATE_REVIEW_STATEMENT_TIMEOUT_MS".to_owned(), "1500".to_owned()),
            ("TIDEGATE_REVIEW_ALLOW_POSTGRES_SUPERUSER".to_owned(), "true".to_owned()),
        ];
        let cfg = Config::from_toml_and_env(None, env).unwrap();
        assert_eq!(cfg.review.statement_timeout_ms, 1500);
        assert!(cfg.review.allow_postgres_superuser);
        let err = Config::from_toml_and_env(Some("[review]\nstatement_timeout_ms = 0\n"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("review.statement_timeout_ms"), "{err}");
        let text = "[review]\ndatabase = \"postgres://a@h/d\"\n[review.tenants.x]\ndatabase = \"postgres://b@h/d\"\n\
                    [review.tenants.y]\ndatabase = \"postgres://a@h/d\"\n[review.tenants.z]\ndatabase = \"sqlite:/tmp/z.db\"\n";
        let cfg = Config::from_toml_and_env(Some(text), Vec::new()).unwrap();
        assert_eq!(
            cfg.review.postgres_urls(),
            vec![
                ("review.database".to_owned(), "postgres://a@h/d".to_owned()),
                ("review.tenants.x.database".to_owned(), "postgres://b@h/d".to_owned())
            ]
        );
    }
}
