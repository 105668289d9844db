//! Several nodes on one PostgreSQL (docs/deployment.md): which tenants this node takes.
//!
//! Ownership itself is the ledger store's (a stream's token and lease, checked by the database
//! in every write); this module only decides when this node *tries* to take a tenant. Each
//! round of the node's registry ([`tidegate_postgres::NodeRegistry`]: "alive", the nodes and
//! every stream's owner) the node looks for **orphans**: tenants of the catalog whose stream
//! has no live lease (its owner died, drained, or the tenant is new) or is leased to this
//! node's id while this process does not serve it (a restart under the same id). It takes an
//! orphan while it serves fewer than its fair share, `ceil(tenants / live nodes)`, preferring
//! the orphans that rank highest for it (rendezvous hashing, so nodes prefer different ones);
//! an orphan nobody took for [`PATIENCE`] rounds is taken by any node, so a tenant never stays
//! unserved while a node is alive. Taking a tenant opens it: recovery, its plans executor and
//! its deadlines run on the new owner from then on.
//!
//! Two nodes that try the same orphan at once are ordered by the stream's row lock: one takes
//! it, the other is refused with `Leased` and leaves it. A node whose liveness is misjudged
//! costs a wasted attempt, never a second owner.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tidegate_postgres::ClusterSnapshot;

use crate::node::Service;

/// Rounds an orphan waits for a node below its fair share before any node takes it.
pub const PATIENCE: u32 = 3;

/// How often a node says it is alive and looks for orphans: a third of its ownership lease,
/// between 100 ms and 2 s.
pub fn round_interval(ownership_lease: Duration) -> Duration {
    (ownership_lease / 3).clamp(Duration::from_millis(100), Duration::from_secs(2))
}

/// How recently a node must have said it is alive to count as live (three of its rounds).
pub fn live_window(ownership_lease: Duration) -> Duration {
    round_interval(ownership_lease) * 3 + Duration::from_millis(200)
}

/// What one round decided: the orphans to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Tenants to open now, best first.
    pub take: Vec<String>,
    /// This node's fair share.
    pub fair: usize,
}

/// The adoption rule (see the module documentation), free of I/O so it can be tested alone.
///
/// `tenants`: the catalog's tenants; `serving`: those this process serves; `waited`: per
/// orphan, the rounds it has been an orphan so far (updated here).
pub fn plan(
    me: &str,
    snapshot: &ClusterSnapshot,
    window: Duration,
    tenants: &[String],
    serving: &[String],
    waited: &mut HashMap<String, u32>,
) -> Plan {
    let live = snapshot.alive(window).filter(|n| n.node != me).count() + 1;
    let fair = tenants.len().div_ceil(live);
    let owners: HashMap<&str, (Option<&str>, bool)> =
        snapshot.streams.iter().map(|s| (s.stream.as_str(), (s.owner.as_deref(), s.lease_left_ms.is_some()))).collect();
    let mut orphans: Vec<&String> = tenants
        .iter()
        .filter(|t| !serving.contains(t))
        .filter(|t| match owners.get(t.as_str()) {
            None => true,
            Some((owner, live_lease)) => !live_lease || *owner == Some(me),
        })
        .collect();
    waited.retain(|t, _| orphans.contains(&t));
    for o in &orphans {
        *waited.entry((*o).clone()).or_default() += 1;
    }
    let ours = |t: &str| owners.get(t).is_some_and(|(owner, _)| *owner == Some(me));
    // Our own id's streams first (a restart under the same id takes its tenants back), then
    // by how much this node wants each.
    orphans.sort_by_key(|t| (std::cmp::Reverse(ours(t)), std::cmp::Reverse(rank(me, t))));
    let mut take = Vec::new();
    let mut held = serving.len();
    for o in orphans {
        if ours(o) || held < fair || waited.get(o).copied().unwrap_or(0) > PATIENCE {
            take.push(o.clone());
            held += 1;
        }
    }
    Plan { take, fair }
}

/// How much `node` wants `tenant` (highest random weight).
fn rank(node: &str, tenant: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (node, tenant).hash(&mut h);
    h.finish()
}

/// Runs one round on `snapshot`: takes the orphans [`plan`] chose. A tenant another node took
/// first is left to it; another failure is logged and counted by readiness.
pub(crate) async fn adopt(service: &Service, snapshot: &Arc<ClusterSnapshot>, waited: &mut HashMap<String, u32>) {
    let me = service.settings().tenant.node_id.clone();
    let window = live_window(service.settings().tenant.ownership_lease);
    let tenants = match service.catalog().tenants() {
        Ok(t) => t.into_iter().map(|t| t.name).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!("cluster round: the catalog cannot be read: {e}");
            return;
        }
    };
    let serving: Vec<String> = service.tenants().iter().map(|t| t.name.clone()).collect();
    let plan = plan(&me, snapshot, window, &tenants, &serving, waited);
    for name in plan.take {
        if service.is_shutting_down() {
            return;
        }
        match service.open_tenant(&name).await {
            Ok(_) => {
                waited.remove(&name);
                service.metrics().tenants_adopted.inc();
                tracing::info!(tenant = %name, fair = plan.fair, "took the tenant");
            }
            Err(e) if e.is_served_elsewhere() => tracing::debug!(tenant = %name, "another node took it first: {e}"),
            Err(e) => {
                tracing::warn!(tenant = %name, "could not take the tenant: {e}");
                // Readiness reports it until an open succeeds.
                service.note_failed(&name, &e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tidegate_postgres::{NodeInfo, StreamOwner};

    use super::*;

    fn snap(nodes: &[(&str, u64)], streams: &[(&str, Option<&str>, bool)]) -> ClusterSnapshot {
        ClusterSnapshot {
            nodes: nodes
                .iter()
                .map(|(n, ago)| NodeInfo { node: (*n).into(), address: None, seen_ms_ago: *ago })
                .collect(),
            streams: streams
                .iter()
                .map(|(s, owner, live)| StreamOwner {
                    stream: (*s).into(),
                    owner: owner.map(Into::into),
                    token: 1,
                    lease_left_ms: live.then_some(1000),
                    last_lsn: 0,
                })
                .collect(),
            taken_at: Instant::now(),
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    const W: Duration = Duration::from_secs(1);

    #[test]
    fn a_lone_node_takes_every_orphan() {
        let mut waited = HashMap::new();
        let p = plan("a", &snap(&[("a", 0)], &[]), W, &names(5), &[], &mut waited);
        assert_eq!((p.take.len(), p.fair), (5, 5));
    }

    #[test]
    fn three_live_nodes_each_take_their_share_and_different_ones() {
        let s = snap(&[("a", 0), ("b", 10), ("c", 20)], &[]);
        let tenants = names(9);
        let mut taken = Vec::new();
        for me in ["a", "b", "c"] {
            let p = plan(me, &s, W, &tenants, &[], &mut HashMap::new());
            assert_eq!((p.take.len(), p.fair), (3, 3), "{me}: {p:?}");
            taken.extend(p.take);
        }
        taken.sort();
        taken.dedup();
        assert!(taken.len() >= 6, "rendezvous ranks spread the first choices: {taken:?}");
    }

    #[test]
    fn live_leases_of_others_are_never_orphans_but_expired_ones_and_our_own_are() {
        let s = snap(
            &[("a", 0), ("b", 0)],
            &[("t0", Some("b"), true), ("t1", Some("b"), false), ("t2", Some("a"), true), ("t3", None, false)],
        );
        let tenants = names(4);
        let p = plan("a", &s, W, &tenants, &[], &mut HashMap::new());
        assert!(!p.take.contains(&"t0".to_owned()), "{p:?}");
        assert!(p.take.contains(&"t2".to_owned()), "our own id's lease, not served here: {p:?}");
        assert_eq!(p.fair, 2);
        assert_eq!(p.take.len(), 2, "t2 (ours) and one more up to the share: {p:?}");
    }

    #[test]
    fn a_dead_node_does_not_count_and_an_orphan_left_too_long_is_taken_above_the_share() {
        let s = snap(&[("a", 0), ("dead", 60_000)], &[]);
        let p = plan("a", &s, W, &names(4), &[], &mut HashMap::new());
        assert_eq!(p.fair, 4, "the dead node is not live");
        // Two live nodes, the share is full: the orphan waits PATIENCE rounds, then is taken.
        let s = snap(&[("a", 0), ("b", 0)], &[("t0", Some("a"), true), ("t1", Some("b"), true)]);
        let tenants = vec!["t0".to_owned(), "t1".to_owned(), "t2".to_owned()];
        let serving = vec!["t0".to_owned()];
        let mut waited = HashMap::new();
        for round in 1..=PATIENCE {
            let p = plan("a", &s, W, &tenants, &serving, &mut waited);
            assert_eq!(p.fair, 2);
            assert!(p.take.contains(&"t2".to_owned()), "round {round}: below the share of 2 it takes t2: {p:?}");
        }
        let serving = vec!["t0".to_owned(), "t9".to_owned()];
        let mut waited = HashMap::new();
        for _ in 0..PATIENCE {
            assert!(plan("a", &s, W, &tenants, &serving, &mut waited).take.is_empty());
        }
        assert_eq!(plan("a", &s, W, &tenants, &serving, &mut waited).take, vec!["t2".to_owned()]);
    }
}
