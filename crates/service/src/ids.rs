//! Public ids: `tx_<tag>_<n>`, `grp_<tag>_<n>`, `task_<tag>_<n>`, `rv_<tag>_<n>` (review), `plan_<tag>_<n>`. The tag is the tenant's;
//! an id with another tenant's tag is treated exactly as one never issued.

use tidegate_runtime::TxId;

/// What kind of id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A transaction.
    Tx,
    /// A speculation group.
    Group,
    /// A worker task.
    Task,
    /// A transaction of the review middleware (`/v1/review`).
    Review,
    /// A plan (`/v1/plans`).
    Plan,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Tx => "tx_",
            Kind::Group => "grp_",
            Kind::Task => "task_",
            Kind::Review => "rv_",
            Kind::Plan => "plan_",
        }
    }
}

/// Formats an id.
pub fn format(kind: Kind, tag: &str, n: u64) -> String {
    format!("{}{tag}_{n}", kind.prefix())
}

/// Parses an id of `kind` for the tenant tagged `tag`; `None` if it is malformed or another
/// tenant's (the caller answers 404 either way).
pub fn parse(kind: Kind, tag: &str, id: &str) -> Option<u64> {
    let rest = id.strip_prefix(kind.prefix())?;
    let rest = rest.strip_prefix(tag)?;
    let n = rest.strip_prefix('_')?;
    if n.is_empty() || n.len() > 20 || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    n.parse().ok()
}

/// What an id names for one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// Number `n` of this tenant (issued or not).
    Own(u64),
    /// A well-formed id with another tag: another tenant's, or no tenant's. It names nothing
    /// here, and is answered exactly as an id of this tenant that was never issued.
    Elsewhere,
    /// Not an id of this kind at all.
    Malformed,
}

/// Tells an id of this tenant from one of another tenant and from something that is not an
/// id of `kind`. Routes where a never-issued id is not simply a 404 (filters, ids inside a
/// body) use it to answer a foreign id exactly as a never-issued one.
pub fn resolve(kind: Kind, tag: &str, id: &str) -> Named {
    if let Some(n) = parse(kind, tag, id) {
        return Named::Own(n);
    }
    // Tags are 8 lowercase hex digits (`catalog::create_tenant`); the number is checked the
    // same way as for this tenant's ids.
    let other = id
        .strip_prefix(kind.prefix())
        .and_then(|rest| rest.split_once('_'))
        .filter(|(t, _)| t.len() == 8 && t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|(t, _)| parse(kind, t, id));
    if other.is_some() { Named::Elsewhere } else { Named::Malformed }
}

/// A transaction's public id.
pub fn tx(tag: &str, tx: TxId) -> String {
    format(Kind::Tx, tag, tx.0)
}

/// `tx_<tag>_`: the prefix of the tenant's transaction ids, which its engine puts in the keys
/// it derives (`Builder::derived_key_prefix`).
pub fn tx_prefix(tag: &str) -> String {
    format!("{}{tag}_", Kind::Tx.prefix())
}

/// `<tx id>:<tool>:<n>`: the key of effect `n` of `tx` when the call had no key of its own, as
/// the tenant's engine derives and records it (with [`tx_prefix`]).
pub fn derived_key(tag: &str, tx: TxId, tool: &str, n: u32) -> String {
    format!("{}:{tool}:{n}", self::tx(tag, tx))
}

/// The client's arguments of an effect recorded by a server of an earlier version, which
/// wrapped them as `{"args": <client args>, "key": <effect key>}` and recorded the same key as
/// the effect's adapter key: `Some(args)` when `recorded` is exactly such an envelope whose
/// key is `key`. A record of this version holds the client's arguments as they are (a client
/// value that happens to have that shape would also have to repeat the effect's own key).
pub fn legacy_envelope<'a>(recorded: &'a serde_json::Value, key: Option<&str>) -> Option<&'a serde_json::Value> {
    let o = recorded.as_object()?;
    let (args, k) = (o.get("args")?, o.get("key")?.as_str()?);
    (o.len() == 2 && key == Some(k)).then_some(args)
}

/// The client's arguments of a recorded call (see [`legacy_envelope`]).
pub fn client_args(recorded: &serde_json::Value, key: Option<&str>) -> serde_json::Value {
    legacy_envelope(recorded, key).unwrap_or(recorded).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_other_tags_do_not_parse() {
        let id = format(Kind::Tx, "0a1b2c3d", 42);
        assert_eq!(id, "tx_0a1b2c3d_42");
        assert_eq!(parse(Kind::Tx, "0a1b2c3d", &id), Some(42));
        assert_eq!(parse(Kind::Tx, "ffffffff", &id), None);
        assert_eq!(parse(Kind::Group, "0a1b2c3d", &id), None);
        for bad in [
            "tx_0a1b2c3d_",
            "tx_0a1b2c3d_01",
            "tx_0a1b2c3d_-1",
            "tx_0a1b2c3d_1x",
            "tx_0a1b2c3d_99999999999999999999999",
        ] {
            assert_eq!(parse(Kind::Tx, "0a1b2c3d", bad), None, "{bad}");
        }
    }

    #[test]
    fn another_tenants_id_is_told_from_a_malformed_one() {
        let mine = "0a1b2c3d";
        assert_eq!(resolve(Kind::Tx, mine, "tx_0a1b2c3d_7"), Named::Own(7));
        assert_eq!(resolve(Kind::Tx, mine, "tx_ffffffff_7"), Named::Elsewhere);
        assert_eq!(resolve(Kind::Plan, mine, "plan_00000000_0"), Named::Elsewhere);
        for bad in [
            "tx_ffffffff_",
            "tx_ffffffff_01",
            "tx_FFFFFFFF_1",
            "tx_fffffff_1",
            "tx_ffffffff_99999999999999999999999",
            "plan_ffffffff_1",
            "tx_0a1b2c3d_x",
            "garbage",
        ] {
            assert_eq!(resolve(Kind::Tx, mine, bad), Named::Malformed, "{bad}");
        }
    }
}
