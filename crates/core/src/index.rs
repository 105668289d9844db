//! The scope index: a trie over scope segments that answers, for any scope, the two questions
//! the commit path asks, without scanning transactions:
//!
//! * does an unfinished transaction with a smaller epoch claim an overlapping scope?
//!   (the commit predicate: [`ScopeIndex::blocked_before`])
//! * what is the latest commit stamp of a write overlapping this scope? (the scope's
//!   [`Version`]: [`ScopeIndex::version`])
//!
//! ```text
//!   kind "fs" ──► root ─"repo"─► n1 ─"src"─► n2 ─"app.py"─► n3
//!                   │                  └"*"─► n4           (wildcard claims live under "*")
//!   every node:  here = claims ending at this node      write_here = max stamp ending here
//!                sub  = claims in this node's subtree   write_sub  = max stamp in subtree
//! ```
//!
//! A scope overlaps the claims that end on its path (its prefixes) and every claim below its
//! last node (its extensions); `*` on either side matches one segment. Claims are multisets of
//! epochs kept sorted, so "the smallest claiming epoch" is the first entry. Nodes that hold no
//! claim, no write and no child are removed, so the trie's size follows the live claims and
//! the set of scopes ever written, not the number of transactions.

use rustc_hash::FxHashMap as HashMap;

use crate::ids::{Epoch, Version};
use crate::scope::Scope;

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    here: Claims,
    sub: Claims,
    write_here: u64,
    write_sub: u64,
}

impl Node {
    fn is_vacant(&self) -> bool {
        self.children.is_empty() && self.sub.is_empty() && self.write_sub == 0
    }
}

/// A sorted multiset of epochs.
#[derive(Debug, Default)]
struct Claims(Vec<(u64, u32)>);

impl Claims {
    fn add(&mut self, e: u64) {
        match self.0.binary_search_by_key(&e, |&(k, _)| k) {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, (e, 1)),
        }
    }
    fn remove(&mut self, e: u64) -> bool {
        match self.0.binary_search_by_key(&e, |&(k, _)| k) {
            Ok(i) => {
                if self.0[i].1 > 1 {
                    self.0[i].1 -= 1;
                } else {
                    self.0.remove(i);
                }
                true
            }
            Err(_) => false,
        }
    }
    fn min(&self) -> Option<u64> {
        self.0.first().map(|&(k, _)| k)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ScopeIndex {
    roots: HashMap<Box<str>, Node>,
}

/// One node of the index in its serialised (checkpoint) form: the node's path and what ends
/// there. The `sub`/`write_sub` aggregates and the claim-free inner nodes are rebuilt on load,
/// so the form is flat (no nesting depth limit) and holds each fact once.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct FlatNode {
    /// The scope type, then the path segments.
    path: Vec<Box<str>>,
    /// Claims ending here: `(epoch, multiplicity)`, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    here: Vec<(u64, u32)>,
    /// The largest stamp of a write ending here (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    write: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl ScopeIndex {
    /// Every node with a claim or a write ending at it, in path order (deterministic).
    fn flatten(&self) -> Vec<FlatNode> {
        fn walk(node: &Node, path: &mut Vec<Box<str>>, out: &mut Vec<FlatNode>) {
            if !node.here.is_empty() || node.write_here != 0 {
                out.push(FlatNode { path: path.clone(), here: node.here.0.clone(), write: node.write_here });
            }
            let mut kids: Vec<_> = node.children.iter().collect();
            kids.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (seg, child) in kids {
                path.push(seg.clone());
                walk(child, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        let mut roots: Vec<_> = self.roots.iter().collect();
        roots.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (kind, root) in roots {
            let mut path = vec![kind.clone()];
            walk(root, &mut path, &mut out);
        }
        out
    }

    /// Rebuilds an index from [`Self::flatten`]'s output.
    fn unflatten(nodes: Vec<FlatNode>) -> Result<ScopeIndex, String> {
        let mut ix = ScopeIndex::default();
        for n in nodes {
            let Some((kind, segs)) = n.path.split_first() else {
                return Err("an index node with an empty path".into());
            };
            let mut node = ix.roots.entry(kind.clone()).or_default();
            for (e, c) in &n.here {
                for _ in 0..*c {
                    node.sub.add(*e);
                }
            }
            node.write_sub = node.write_sub.max(n.write);
            for seg in segs {
                node = node.children.entry(seg.clone()).or_default();
                for (e, c) in &n.here {
                    for _ in 0..*c {
                        node.sub.add(*e);
                    }
                }
                node.write_sub = node.write_sub.max(n.write);
            }
            if !node.here.is_empty() || node.write_here != 0 {
                return Err(format!("index node {:?} listed twice", n.path));
            }
            if n.here.iter().any(|&(_, c)| c == 0) || n.here.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(format!("index node {:?} has a malformed claim list {:?}", n.path, n.here));
            }
            node.here = Claims(n.here);
            node.write_here = n.write;
        }
        Ok(ix)
    }
}

impl serde::Serialize for ScopeIndex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&self.flatten(), s)
    }
}

impl<'de> serde::Deserialize<'de> for ScopeIndex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ScopeIndex, D::Error> {
        let nodes = <Vec<FlatNode> as serde::Deserialize>::deserialize(d)?;
        ScopeIndex::unflatten(nodes).map_err(serde::de::Error::custom)
    }
}

impl ScopeIndex {
    /// Registers that the transaction at `epoch` may touch `scope` until [`Self::unclaim`].
    pub(crate) fn claim(&mut self, scope: &Scope, epoch: Epoch) {
        let mut node = self.roots.entry(scope.kind().into()).or_default();
        node.sub.add(epoch.0);
        for seg in scope.segments() {
            node = node.children.entry(seg.into()).or_default();
            node.sub.add(epoch.0);
        }
        node.here.add(epoch.0);
    }

    /// Removes one claim made by [`Self::claim`] with the same arguments.
    pub(crate) fn unclaim(&mut self, scope: &Scope, epoch: Epoch) {
        let Some(root) = self.roots.get_mut(scope.kind()) else {
            debug_assert!(false, "unclaim of unknown kind {scope}");
            return;
        };
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        let removed = unclaim_rec(root, &segs, epoch.0);
        debug_assert!(removed, "unclaim of a scope never claimed: {scope} at {epoch}");
        if root.is_vacant() && root.here.is_empty() {
            self.roots.remove(scope.kind());
        }
    }

    /// Whether any claim with an epoch strictly below `epoch` overlaps `scope`.
    pub(crate) fn blocked_before(&self, scope: &Scope, epoch: Epoch) -> bool {
        let Some(root) = self.roots.get(scope.kind()) else { return false };
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        blocked_rec(root, &segs, epoch.0)
    }

    /// The version of `scope`: the largest write stamp overlapping it.
    pub(crate) fn version(&self, scope: &Scope) -> Version {
        let Some(root) = self.roots.get(scope.kind()) else { return Version(0) };
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        Version(version_rec(root, &segs))
    }

    /// Records a committed write to `scope` with commit stamp `stamp` (monotonic).
    pub(crate) fn record_write(&mut self, scope: &Scope, stamp: u64) {
        let mut node = self.roots.entry(scope.kind().into()).or_default();
        node.write_sub = node.write_sub.max(stamp);
        for seg in scope.segments() {
            node = node.children.entry(seg.into()).or_default();
            node.write_sub = node.write_sub.max(stamp);
        }
        node.write_here = node.write_here.max(stamp);
    }

    /// Number of nodes (for tests and stats).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        fn count(n: &Node) -> usize {
            1 + n.children.values().map(count).sum::<usize>()
        }
        self.roots.values().map(count).sum()
    }
}

fn unclaim_rec(node: &mut Node, segs: &[&str], e: u64) -> bool {
    let removed = match segs.split_first() {
        None => node.here.remove(e),
        Some((first, rest)) => {
            let Some(child) = node.children.get_mut(*first) else { return false };
            let removed = unclaim_rec(child, rest, e);
            if child.is_vacant() && child.here.is_empty() {
                node.children.remove(*first);
            }
            removed
        }
    };
    if removed {
        node.sub.remove(e);
    }
    removed
}

fn below(c: &Claims, e: u64) -> bool {
    c.min().is_some_and(|m| m < e)
}

fn blocked_rec(node: &Node, segs: &[&str], e: u64) -> bool {
    // Quick exit: nothing at or below this node is old enough.
    if !below(&node.sub, e) {
        return false;
    }
    let Some((first, rest)) = segs.split_first() else {
        // Claims ending here or anywhere below extend (or equal) the scope.
        return true;
    };
    // A claim ending here is a prefix of the scope.
    if below(&node.here, e) {
        return true;
    }
    if *first == "*" {
        return node.children.values().any(|c| blocked_rec(c, rest, e));
    }
    if let Some(c) = node.children.get(*first)
        && blocked_rec(c, rest, e)
    {
        return true;
    }
    node.children.get("*").is_some_and(|c| blocked_rec(c, rest, e))
}

fn version_rec(node: &Node, segs: &[&str]) -> u64 {
    let Some((first, rest)) = segs.split_first() else { return node.write_sub };
    let mut v = node.write_here;
    if v >= node.write_sub {
        return v;
    }
    if *first == "*" {
        for c in node.children.values() {
            v = v.max(version_rec(c, rest));
        }
        return v;
    }
    if let Some(c) = node.children.get(*first) {
        v = v.max(version_rec(c, rest));
    }
    if let Some(c) = node.children.get("*") {
        v = v.max(version_rec(c, rest));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::ScopeRegistry;

    fn s(text: &str) -> Scope {
        ScopeRegistry::default().parse(text).expect("valid scope")
    }

    #[test]
    fn claims_block_only_later_epochs_on_overlapping_scopes() {
        let mut ix = ScopeIndex::default();
        ix.claim(&s("fs:/a/b"), Epoch(5));
        assert!(ix.blocked_before(&s("fs:/a/b"), Epoch(6)));
        assert!(ix.blocked_before(&s("fs:/a/b/c"), Epoch(6)), "extension overlaps");
        assert!(ix.blocked_before(&s("fs:/a"), Epoch(6)), "prefix overlaps");
        assert!(ix.blocked_before(&s("fs:/"), Epoch(6)), "root overlaps");
        assert!(!ix.blocked_before(&s("fs:/a/bc"), Epoch(6)), "string prefix is not a segment prefix");
        assert!(!ix.blocked_before(&s("fs:/a/b"), Epoch(5)), "strictly smaller epochs only");
        assert!(!ix.blocked_before(&s("kv:a:b"), Epoch(6)), "other type");
        ix.unclaim(&s("fs:/a/b"), Epoch(5));
        assert!(!ix.blocked_before(&s("fs:/a/b"), Epoch(6)));
        assert_eq!(ix.node_count(), 0, "vacant nodes are pruned");
    }

    #[test]
    fn wildcards_match_one_segment_on_either_side() {
        let mut ix = ScopeIndex::default();
        ix.claim(&s("retail:order:*:status"), Epoch(1));
        assert!(ix.blocked_before(&s("retail:order:W1:status"), Epoch(2)));
        assert!(ix.blocked_before(&s("retail:order:W1"), Epoch(2)));
        assert!(!ix.blocked_before(&s("retail:order:W1:lines"), Epoch(2)));
        ix.unclaim(&s("retail:order:*:status"), Epoch(1));
        ix.claim(&s("retail:order:W1:lines:3"), Epoch(1));
        assert!(ix.blocked_before(&s("retail:order:*"), Epoch(2)));
        assert!(!ix.blocked_before(&s("retail:order:*:status"), Epoch(2)));
    }

    #[test]
    fn versions_take_the_latest_overlapping_write() {
        let mut ix = ScopeIndex::default();
        assert_eq!(ix.version(&s("fs:/a/b")), Version(0));
        ix.record_write(&s("fs:/a/b"), 3);
        ix.record_write(&s("fs:/a/c"), 4);
        assert_eq!(ix.version(&s("fs:/a/b")), Version(3));
        assert_eq!(ix.version(&s("fs:/a/b/x")), Version(3), "write to a prefix covers the extension");
        assert_eq!(ix.version(&s("fs:/a")), Version(4), "a prefix sees writes below it");
        assert_eq!(ix.version(&s("fs:/a/d")), Version(0));
        assert_eq!(ix.version(&s("fs:/a/*")), Version(4));
        ix.record_write(&s("fs:/"), 9);
        assert_eq!(ix.version(&s("fs:/a/d")), Version(9));
    }
}
