//! API keys, roles and permissions (docs/server.md, "Roles and permissions").
//!
//! A key is `tgk_<id>_<secret>`: `<id>` is 16 hex digits (the lookup key), `<secret>` 43
//! base64url characters (32 bytes from the OS RNG). The catalog keeps `SHA-256(secret)`; a
//! presented key is checked by hashing its secret and comparing in constant time.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A key's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs transactions and serves worker tasks.
    Agent,
    /// Reads transactions and the ledger; reviews (issue 16).
    Reviewer,
    /// Manages the registry, aborts transactions, reads the ledger and the worker queue.
    Operator,
    /// Everything, including the tenant's keys.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Agent, Role::Reviewer, Role::Operator, Role::Admin];

    /// The role's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Reviewer => "reviewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether the role grants `p` (the table in docs/server.md).
    pub fn grants(self, p: Permission) -> bool {
        use Permission as P;
        use Role as R;
        match p {
            P::TxWrite => matches!(self, R::Agent | R::Admin),
            P::TxAbort => matches!(self, R::Agent | R::Operator | R::Admin),
            P::TxRead | P::RegistryRead | P::Any => true,
            P::RegistryWrite | P::TasksRead => matches!(self, R::Operator | R::Admin),
            P::TasksWork => matches!(self, R::Agent | R::Operator | R::Admin),
            P::LedgerRead => matches!(self, R::Reviewer | R::Operator | R::Admin),
            P::Review => matches!(self, R::Reviewer | R::Admin),
            P::AttentionResolve => matches!(self, R::Operator | R::Admin),
            P::PlanResolve => matches!(self, R::Agent | R::Operator | R::Admin),
            P::KeysManage => matches!(self, R::Admin),
            P::ClusterRead => matches!(self, R::Operator | R::Admin),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role `{s}`; expected one of agent, reviewer, operator, admin"))
    }
}

/// What an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Permission {
    /// Begin, read, effect, seal, commit, groups, one-call transactions.
    TxWrite,
    /// Abort a transaction or group.
    TxAbort,
    /// Read transactions, outcomes, event streams, timelines.
    TxRead,
    /// Read tools and capabilities.
    RegistryRead,
    /// Define and remove tools and capabilities.
    RegistryWrite,
    /// Poll, heartbeat and report worker tasks.
    TasksWork,
    /// List the worker queue.
    TasksRead,
    /// Ledger-wide queries.
    LedgerRead,
    /// The review middleware (issue 16).
    Review,
    /// Resolve or accept an effect of the attention list (recorded in the ledger).
    AttentionResolve,
    /// Resolve a stuck plan (retry, accept, unwind): its owner's act, or an operator's from the
    /// owner-intervention queue (recorded in the ledger with who did it).
    PlanResolve,
    /// Create, list and revoke keys.
    KeysManage,
    /// See this node and who serves the tenant (`/v1/cluster`).
    ClusterRead,
    /// Any authenticated key.
    Any,
}

impl Permission {
    /// The permission's name in docs and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::TxWrite => "tx.write",
            Permission::TxAbort => "tx.abort",
            Permission::TxRead => "tx.read",
            Permission::RegistryRead => "registry.read",
            Permission::RegistryWrite => "registry.write",
            Permission::TasksWork => "tasks.work",
            Permission::TasksRead => "tasks.read",
            Permission::LedgerRead => "ledger.read",
            Permission::Review => "review",
            Permission::AttentionResolve => "attention.resolve",
            Permission::PlanResolve => "plans.resolve",
            Permission::KeysManage => "keys.manage",
            Permission::ClusterRead => "cluster.read",
            Permission::Any => "any",
        }
    }
}

/// A permission as a type, so that a handler's signature names what it needs
/// (`Caller<TxWrite>`).
pub trait Needs: Send + Sync + 'static {
    /// The permission.
    const PERMISSION: Permission;
}

macro_rules! needs {
    ($($name:ident),*) => {$(
        #[doc = concat!("Marker for [`Permission::", stringify!($name), "`].")]
        #[derive(Debug, Clone, Copy)]
        pub struct $name;
        impl Needs for $name {
            const PERMISSION: Permission = Permission::$name;
        }
    )*};
}

needs!(
    TxWrite,
    TxAbort,
    TxRead,
    RegistryRead,
    RegistryWrite,
    TasksWork,
    TasksRead,
    LedgerRead,
    Review,
    AttentionResolve,
    PlanResolve,
    KeysManage,
    ClusterRead,
    Any
);

/// A freshly made key: its id and the full secret string, shown once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewKey {
    /// The lookup id (16 hex digits).
    pub id: String,
    /// The full key, `tgk_<id>_<secret>`.
    pub key: String,
    /// `SHA-256(secret)`, what the catalog stores.
    pub hash: [u8; 32],
}

const KEY_PREFIX: &str = "tgk_";
const ID_HEX: usize = 16;
const SECRET_CHARS: usize = 43;

/// Makes a key from the OS RNG.
pub fn generate_key() -> NewKey {
    let mut rng = rand::rngs::OsRng;
    let mut id = [0u8; 8];
    rng.fill_bytes(&mut id);
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut secret);
    let id = hex::encode(id);
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let hash = hash_secret(&secret);
    NewKey { key: format!("{KEY_PREFIX}{id}_{secret}"), id, hash }
}

/// `SHA-256` of a key's secret part.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Splits a presented key into `(id, secret)`, or `None` if it is not shaped like one.
pub fn parse_key(presented: &str) -> Option<(&str, &str)> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    if rest.len() != ID_HEX + 1 + SECRET_CHARS || !rest.is_char_boundary(ID_HEX) {
        return None;
    }
    let (id, tail) = rest.split_at(ID_HEX);
    let secret = tail.strip_prefix('_')?;
    let id_ok = id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let secret_ok = secret.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (id_ok && secret_ok).then_some((id, secret))
}

/// Whether `secret` hashes to `stored`, compared in constant time.
pub fn secret_matches(secret: &str, stored: &[u8]) -> bool {
    let h = hash_secret(secret);
    stored.len() == h.len() && bool::from(h.ct_eq(stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_only_their_own_secret_matches() {
        let k = generate_key();
        let (id, secret) = parse_key(&k.key).unwrap();
        assert_eq!(id, k.id);
        assert!(secret_matches(secret, &k.hash));
        let other = generate_key();
        assert!(!secret_matches(parse_key(&other.key).unwrap().1, &k.hash));
        assert_ne!(k.key, other.key);
    }

    #[test]
    fn malformed_keys_are_refused_without_panicking() {
        for bad in [
            "",
            "tgk_",
            "tgk_zz",
            "Bearer x",
            "tgk_0123456789abcdef_short",
            "tgk_0123456789abcdeé_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(parse_key(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_permission_table_matches_the_design_note() {
        assert!(Role::Agent.grants(Permission::TxWrite));
        assert!(!Role::Reviewer.grants(Permission::TxWrite));
        assert!(!Role::Operator.grants(Permission::TxWrite));
        assert!(!Role::Agent.grants(Permission::LedgerRead));
        assert!(!Role::Agent.grants(Permission::RegistryWrite));
        assert!(Role::Operator.grants(Permission::RegistryWrite));
        assert!(!Role::Operator.grants(Permission::KeysManage));
        assert!(Role::Admin.grants(Permission::KeysManage));
        assert!(Role::Reviewer.grants(Permission::Review) && !Role::Operator.grants(Permission::Review));
        assert!(Role::Operator.grants(Permission::AttentionResolve));
        assert!(Role::Operator.grants(Permission::PlanResolve) && Role::Agent.grants(Permission::PlanResolve));
        assert!(!Role::Reviewer.grants(Permission::PlanResolve));
        assert!(
            !Role::Reviewer.grants(Permission::AttentionResolve) && !Role::Agent.grants(Permission::AttentionResolve)
        );
    }
}
