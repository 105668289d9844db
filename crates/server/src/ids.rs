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

/// A transaction's public id.
pub fn tx(tag: &str, tx: TxId) -> String {
    format(Kind::Tx, tag, tx.0)
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
}
