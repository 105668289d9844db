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

/// The index's maps: hashbrown for its raw entries (see [`child`]), with the Fx hash.
type HashMap<K, V> = hashbrown::HashMap<K, V, rustc_hash::FxBuildHasher>;

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

/// Dropping a deep subtree the default way recurses once per level; this drops it level by
/// level with a heap stack, so a scope of any depth (replay accepts logged scopes beyond the
/// live limits) costs no stack.
impl Drop for Node {
    fn drop(&mut self) {
        if self.children.is_empty() {
            return;
        }
        let mut stack: Vec<Node> = self.children.drain().map(|(_, n)| n).collect();
        while let Some(mut n) = stack.pop() {
            stack.extend(n.children.drain().map(|(_, c)| c));
        }
    }
}

/// A sorted multiset of epochs (inline up to two distinct epochs: most scopes are claimed by
/// one or two transactions at a time, and a claim then allocates nothing).
#[derive(Debug, Default)]
struct Claims(smallvec::SmallVec<[(u64, u32); 2]>);

impl Claims {
    fn add(&mut self, e: u64) {
        self.add_n(e, 1);
    }
    fn add_n(&mut self, e: u64, n: u32) {
        match self.0.binary_search_by_key(&e, |&(k, _)| k) {
            Ok(i) => self.0[i].1 = self.0[i].1.saturating_add(n),
            Err(i) => self.0.insert(i, (e, n)),
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
    fn max(&self) -> Option<u64> {
        self.0.last().map(|&(k, _)| k)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ScopeIndex {
    roots: HashMap<Box<str>, Node>,
    /// Keep nodes whose claims are all gone (the dirty-mark index: scopes marked once are
    /// usually marked again, and re-creating their path on every mark costs allocations).
    /// Not serialised; such nodes hold nothing.
    keep_vacant: bool,
}

/// One node of the index in its serialised (checkpoint) form: the node's path and what ends
/// there. The `sub`/`write_sub` aggregates and the claim-free inner nodes are rebuilt on load,
/// so the form is flat (no nesting depth limit) and holds each fact once.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

/// [`FlatNode`] as decoded: the path's segments borrow the checkpoint's bytes where they can
/// (no escapes), so a load allocates a segment only when it creates a node.
#[derive(serde::Deserialize)]
struct FlatNodeIn<'a> {
    #[serde(borrow)]
    path: smallvec::SmallVec<[crate::engine::Text<'a>; 4]>,
    #[serde(default)]
    here: Vec<(u64, u32)>,
    #[serde(default)]
    write: u64,
}

/// The child `seg` of `children`, created if absent (one hash; its key allocated only then).
fn child<'n>(children: &'n mut HashMap<Box<str>, Node>, seg: &str) -> &'n mut Node {
    match children.raw_entry_mut().from_key(seg) {
        hashbrown::hash_map::RawEntryMut::Occupied(o) => o.into_mut(),
        hashbrown::hash_map::RawEntryMut::Vacant(v) => v.insert(seg.into(), Node::default()).1,
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl ScopeIndex {
    /// Every node with a claim or a write ending at it, in path order (deterministic).
    /// Iterative (a heap stack), so depth costs no stack.
    fn flatten(&self) -> Vec<FlatNode> {
        fn sorted(children: &HashMap<Box<str>, Node>) -> Vec<(&str, &Node)> {
            let mut kids: Vec<(&str, &Node)> = children.iter().map(|(k, n)| (&**k, n)).collect();
            kids.sort_unstable_by(|a, b| a.0.cmp(b.0));
            kids
        }
        let mut out = Vec::new();
        // (depth of the node's path, its last path element, the node), popped in path order.
        let mut stack: Vec<(usize, &str, &Node)> =
            sorted(&self.roots).into_iter().rev().map(|(k, n)| (0, k, n)).collect();
        let mut path: Vec<Box<str>> = Vec::new();
        while let Some((depth, seg, node)) = stack.pop() {
            path.truncate(depth);
            path.push(seg.into());
            if !node.here.is_empty() || node.write_here != 0 {
                out.push(FlatNode { path: path.clone(), here: node.here.0.to_vec(), write: node.write_here });
            }
            stack.extend(sorted(&node.children).into_iter().rev().map(|(k, n)| (depth + 1, k, n)));
        }
        out
    }

    /// Rebuilds an index from [`Self::flatten`]'s output.
    #[cfg(test)]
    fn unflatten(nodes: Vec<FlatNodeIn<'_>>) -> Result<ScopeIndex, String> {
        let mut ix = ScopeIndex::default();
        for n in nodes {
            ix.insert_flat(n)?;
        }
        Ok(ix)
    }

    /// Adds one node of [`Self::flatten`]'s output (a load streams them in, never holding the
    /// list).
    fn insert_flat(&mut self, n: FlatNodeIn<'_>) -> Result<(), String> {
        let Some((kind, segs)) = n.path.split_first() else {
            return Err("an index node with an empty path".into());
        };
        let mut node = child(&mut self.roots, &kind.0);
        for &(e, c) in &n.here {
            node.sub.add_n(e, c);
        }
        node.write_sub = node.write_sub.max(n.write);
        for seg in segs {
            node = child(&mut node.children, &seg.0);
            for &(e, c) in &n.here {
                node.sub.add_n(e, c);
            }
            node.write_sub = node.write_sub.max(n.write);
        }
        if !node.here.is_empty() || node.write_here != 0 {
            return Err(format!("index node {:?} listed twice", n.path));
        }
        if n.here.iter().any(|&(_, c)| c == 0) || n.here.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(format!("index node {:?} has a malformed claim list {:?}", n.path, n.here));
        }
        node.here = Claims(n.here.into());
        node.write_here = n.write;
        Ok(())
    }
}

impl serde::Serialize for ScopeIndex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&self.flatten(), s)
    }
}

impl<'de> serde::Deserialize<'de> for ScopeIndex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ScopeIndex, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ScopeIndex;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of index nodes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ScopeIndex, A::Error> {
                let mut ix = ScopeIndex::default();
                while let Some(n) = seq.next_element::<FlatNodeIn<'de>>()? {
                    ix.insert_flat(n).map_err(serde::de::Error::custom)?;
                }
                Ok(ix)
            }
        }
        d.deserialize_seq(V)
    }
}

impl ScopeIndex {
    /// An index that keeps the nodes its claims leave vacant (see the field).
    pub(crate) fn keeping_vacant_nodes() -> ScopeIndex {
        ScopeIndex { roots: HashMap::default(), keep_vacant: true }
    }

    /// Makes this index keep vacant nodes from now on.
    pub(crate) fn keep_vacant_nodes(&mut self) {
        self.keep_vacant = true;
    }

    /// Registers that the transaction at `epoch` may touch `scope` until [`Self::unclaim`].
    pub(crate) fn claim(&mut self, scope: &Scope, epoch: Epoch) {
        // `child` allocates a segment's key only when it creates the node (`entry` would
        // allocate one per segment per claim).
        let mut node = child(&mut self.roots, scope.kind());
        node.sub.add(epoch.0);
        for seg in scope.segments() {
            node = child(&mut node.children, seg);
            node.sub.add(epoch.0);
        }
        node.here.add(epoch.0);
    }

    /// Removes one claim made by [`Self::claim`] with the same arguments.
    ///
    /// One walk down the path in the usual case: each aggregate loses the epoch on the way,
    /// and the claim is removed where it ends. A second walk happens only to prune (the
    /// shallowest node whose subtree then holds no claim and no write), or to put the
    /// aggregates back if the claim was not there (a caller's bug: nothing changes).
    pub(crate) fn unclaim(&mut self, scope: &Scope, epoch: Epoch) {
        let e = epoch.0;
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        let Some(root) = self.roots.get_mut(scope.kind()) else {
            debug_assert!(false, "unclaim of unknown kind {scope}");
            return;
        };
        // Down the path: remove the epoch from every aggregate, noting the shallowest node
        // left vacant (depth 0 is the root, depth d the node of segment d - 1).
        let mut vacant_at: Option<usize> = None;
        let mut touched = 0usize;
        let mut node: &mut Node = root;
        let mut found = node.sub.remove(e);
        if found {
            touched = 1;
            if node.sub.is_empty() && node.write_sub == 0 {
                vacant_at = Some(0);
            }
            for (d, seg) in segs.iter().enumerate() {
                let Some(c) = node.children.get_mut(*seg) else {
                    found = false;
                    break;
                };
                node = c;
                if !node.sub.remove(e) {
                    found = false;
                    break;
                }
                touched = d + 2;
                if vacant_at.is_none() && node.sub.is_empty() && node.write_sub == 0 {
                    vacant_at = Some(d + 1);
                }
            }
            found = found && node.here.remove(e);
        }
        if !found {
            debug_assert!(false, "unclaim of a scope never claimed: {scope} at {epoch}");
            // Put back what the walk took out, so a wrong unclaim changes nothing.
            if touched > 0 {
                let mut node = self.roots.get_mut(scope.kind()).expect("walked above");
                node.sub.add(e);
                for seg in &segs[..touched - 1] {
                    node = node.children.get_mut(*seg).expect("walked above");
                    node.sub.add(e);
                }
            }
            return;
        }
        if self.keep_vacant {
            return;
        }
        // Every node below a vacant one on the path is vacant too, and it has no other
        // branch (vacant nodes are never kept): removing the shallowest removes them all.
        match vacant_at {
            None => {}
            Some(0) => {
                self.roots.remove(scope.kind());
            }
            Some(d) => {
                let mut node = self.roots.get_mut(scope.kind()).expect("walked above");
                for seg in &segs[..d - 1] {
                    node = node.children.get_mut(*seg).expect("walked above");
                }
                node.children.remove(segs[d - 1]);
            }
        }
    }

    /// Whether any claim with an epoch strictly below `epoch` overlaps `scope`.
    pub(crate) fn blocked_before(&self, scope: &Scope, epoch: Epoch) -> bool {
        let e = epoch.0;
        self.any_overlapping(scope, |c| c.min().is_some_and(|m| m < e))
    }

    /// Whether any claim with an epoch other than `epoch` overlaps `scope`.
    pub(crate) fn claimed_by_other(&self, scope: &Scope, epoch: Epoch) -> bool {
        let e = epoch.0;
        self.any_overlapping(scope, |c| c.min().is_some_and(|m| m < e) || c.max().is_some_and(|m| m > e))
    }

    /// Whether any claim with an epoch strictly above `epoch` overlaps `scope`.
    pub(crate) fn claimed_after(&self, scope: &Scope, epoch: Epoch) -> bool {
        let e = epoch.0;
        self.any_overlapping(scope, |c| c.max().is_some_and(|m| m > e))
    }

    /// Whether the index holds no claim and no write.
    pub(crate) fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Whether a claim set that `wanted` accepts overlaps `scope`. `wanted` must hold for a
    /// multiset if it holds for a subset of it (the subtree aggregates prune the search).
    fn any_overlapping(&self, scope: &Scope, wanted: impl Fn(&Claims) -> bool) -> bool {
        let Some(root) = self.roots.get(scope.kind()) else { return false };
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        overlapping(root, &segs, wanted)
    }

    /// The version of `scope`: the largest write stamp overlapping it.
    pub(crate) fn version(&self, scope: &Scope) -> Version {
        let Some(root) = self.roots.get(scope.kind()) else { return Version(0) };
        let segs: smallvec::SmallVec<[&str; 8]> = scope.segments().collect();
        Version(version_of(root, &segs))
    }

    /// Records a committed write to `scope` with commit stamp `stamp` (monotonic).
    pub(crate) fn record_write(&mut self, scope: &Scope, stamp: u64) {
        let mut node = child(&mut self.roots, scope.kind());
        node.write_sub = node.write_sub.max(stamp);
        for seg in scope.segments() {
            node = child(&mut node.children, seg);
            node.write_sub = node.write_sub.max(stamp);
        }
        node.write_here = node.write_here.max(stamp);
    }

    /// Number of nodes (for tests and stats).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        let mut stack: Vec<&Node> = self.roots.values().collect();
        let mut n = 0;
        while let Some(node) = stack.pop() {
            n += 1;
            stack.extend(node.children.values());
        }
        n
    }
}

/// Whether a claim set `wanted` accepts overlaps the scope whose segments below `root` are
/// `segs`. A depth-first search with a heap stack: one path per segment, more only where a
/// `*` (in the scope or in a claim) matches several children.
fn overlapping(root: &Node, segs: &[&str], wanted: impl Fn(&Claims) -> bool) -> bool {
    let mut stack: smallvec::SmallVec<[(&Node, usize); 8]> = smallvec::smallvec![(root, 0)];
    while let Some((node, depth)) = stack.pop() {
        // Quick exit: nothing at or below this node is wanted.
        if !wanted(&node.sub) {
            continue;
        }
        let Some(first) = segs.get(depth) else {
            // Claims ending here or anywhere below extend (or equal) the scope.
            return true;
        };
        // A claim ending here is a prefix of the scope.
        if wanted(&node.here) {
            return true;
        }
        if *first == "*" {
            stack.extend(node.children.values().map(|c| (c, depth + 1)));
            continue;
        }
        if let Some(c) = node.children.get(*first) {
            stack.push((c, depth + 1));
        }
        if let Some(c) = node.children.get("*") {
            stack.push((c, depth + 1));
        }
    }
    false
}

/// The largest write stamp overlapping the scope whose segments below `root` are `segs`
/// (iterative, as [`overlapping`]).
fn version_of(root: &Node, segs: &[&str]) -> u64 {
    let mut v = 0;
    let mut stack: smallvec::SmallVec<[(&Node, usize); 8]> = smallvec::smallvec![(root, 0)];
    while let Some((node, depth)) = stack.pop() {
        if node.write_sub <= v {
            continue; // nothing at or below this node can raise it
        }
        let Some(first) = segs.get(depth) else {
            v = v.max(node.write_sub);
            continue;
        };
        v = v.max(node.write_here);
        if v >= node.write_sub {
            continue;
        }
        if *first == "*" {
            stack.extend(node.children.values().map(|c| (c, depth + 1)));
            continue;
        }
        if let Some(c) = node.children.get(*first) {
            stack.push((c, depth + 1));
        }
        if let Some(c) = node.children.get("*") {
            stack.push((c, depth + 1));
        }
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

    /// Random claims, unclaims (including ones never made, which must change nothing) and
    /// writes on scopes of one to four segments with wildcards, against a list of claims and
    /// writes checked pairwise with `Scope::overlaps`; the trie keeps exactly the nodes on a
    /// path to a live claim or a write.
    #[test]
    fn the_index_answers_as_a_list_of_claims_would() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("TIDEGATE_INDEX_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(11);
        for round in 0..40u64 {
            let mut rng = SmallRng::seed_from_u64(seed * 1000 + round);
            let keep_vacant = round % 5 == 4;
            let mut ix = if keep_vacant { ScopeIndex::keeping_vacant_nodes() } else { ScopeIndex::default() };
            let mut claims: Vec<(Scope, u64)> = Vec::new();
            let mut writes: Vec<(Scope, u64)> = Vec::new();
            let mut stamp = 0;
            let kinds = ["db", "kv"];
            let segs = ["a", "b", "c", "*"];
            let scope = |rng: &mut SmallRng| {
                let n = rng.gen_range(1..=4);
                let path: Vec<&str> = (0..n).map(|_| segs[rng.gen_range(0..segs.len())]).collect();
                s(&format!("{}:{}", kinds[rng.gen_range(0..2)], path.join(":")))
            };
            for _ in 0..300 {
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let (sc, e) = (scope(&mut rng), rng.gen_range(1..6));
                        ix.claim(&sc, Epoch(e));
                        claims.push((sc, e));
                    }
                    4..=6 if !claims.is_empty() => {
                        let (sc, e) = claims.swap_remove(rng.gen_range(0..claims.len()));
                        ix.unclaim(&sc, Epoch(e));
                    }
                    7 if !cfg!(debug_assertions) => {
                        // A wrong unclaim (release builds only: debug builds assert on it).
                        let (sc, e) = (scope(&mut rng), rng.gen_range(1..6));
                        if !claims.iter().any(|(c, ce)| c == &sc && *ce == e) {
                            ix.unclaim(&sc, Epoch(e));
                        }
                    }
                    8 => {
                        stamp += 1;
                        let sc = scope(&mut rng);
                        ix.record_write(&sc, stamp);
                        writes.push((sc, stamp));
                    }
                    _ => {}
                }
                let q = scope(&mut rng);
                let e = rng.gen_range(1..6);
                let over: Vec<u64> = claims.iter().filter(|(c, _)| c.overlaps(&q)).map(|(_, ce)| *ce).collect();
                assert_eq!(ix.blocked_before(&q, Epoch(e)), over.iter().any(|c| *c < e), "blocked_before {q} at {e}");
                assert_eq!(ix.claimed_after(&q, Epoch(e)), over.iter().any(|c| *c > e), "claimed_after {q} at {e}");
                assert_eq!(ix.claimed_by_other(&q, Epoch(e)), over.iter().any(|c| *c != e), "claimed_by_other {q}");
                let v = writes.iter().filter(|(w, _)| w.overlaps(&q)).map(|(_, st)| *st).max().unwrap_or(0);
                assert_eq!(ix.version(&q), Version(v), "version of {q}");
            }
            if !keep_vacant {
                let mut paths = std::collections::HashSet::new();
                for (sc, _) in claims.iter().chain(&writes) {
                    let mut p = vec![sc.kind().to_owned()];
                    paths.insert(p.clone());
                    for seg in sc.segments() {
                        p.push(seg.to_owned());
                        paths.insert(p.clone());
                    }
                }
                assert_eq!(ix.node_count(), paths.len(), "round {round}: nodes kept beyond live claims and writes");
            }
        }
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

    /// Regression (issue 10 item 6): a 20,000-segment scope overflowed the stack (one
    /// recursion per segment) at `seal`. Replay accepts logged scopes beyond the live limits,
    /// so every index operation, the checkpoint form and dropping the trie are iterative.
    #[test]
    fn a_twenty_thousand_segment_scope_costs_no_stack() {
        let reg = ScopeRegistry::default();
        let deep = reg.parse_logged(&format!("fs:/{}", vec!["a"; 20_000].join("/"))).unwrap();
        let deeper = reg.parse_logged(&format!("fs:/{}/b", vec!["a"; 20_000].join("/"))).unwrap();
        let wild = reg.parse_logged(&format!("fs:/{}", vec!["*"; 20_000].join("/"))).unwrap();
        let run = move || {
            let mut ix = ScopeIndex::default();
            ix.claim(&deep, Epoch(3));
            assert!(ix.blocked_before(&deeper, Epoch(4)));
            assert!(ix.blocked_before(&wild, Epoch(4)));
            assert!(!ix.blocked_before(&deep, Epoch(3)));
            ix.record_write(&deeper, 7);
            assert_eq!(ix.version(&deep), Version(7));
            assert_eq!(ix.version(&wild), Version(7));
            let json = serde_json::to_string(&ix).unwrap();
            let back: ScopeIndex = serde_json::from_str(&json).unwrap();
            assert_eq!(back.flatten(), ix.flatten());
            drop(back);
            ix.unclaim(&deep, Epoch(3));
            assert!(!ix.blocked_before(&deeper, Epoch(4)));
            assert_eq!(ix.node_count(), 20_002, "the written path stays, the claim is gone");
            let mut other = ScopeIndex::default();
            other.claim(&deep, Epoch(1));
            other.unclaim(&deep, Epoch(1));
            assert_eq!(other.node_count(), 0, "a claim-only deep path is pruned");
        };
        // A small stack, so that a recursion per segment would certainly overflow it.
        std::thread::Builder::new().stack_size(256 * 1024).spawn(run).unwrap().join().unwrap();
    }

    #[test]
    fn an_index_keeping_vacant_nodes_answers_as_one_that_prunes() {
        let mut ix = ScopeIndex::keeping_vacant_nodes();
        ix.claim(&s("kv:a:b"), Epoch(3));
        ix.unclaim(&s("kv:a:b"), Epoch(3));
        assert!(!ix.blocked_before(&s("kv:a"), Epoch(9)) && !ix.claimed_by_other(&s("kv:a:b:c"), Epoch(1)));
        assert_eq!(ix.node_count(), 3, "the path stays for the next mark");
        assert!(ix.flatten().is_empty(), "vacant nodes are not checkpointed");
        ix.claim(&s("kv:a:b"), Epoch(4));
        assert!(ix.claimed_after(&s("kv:a"), Epoch(3)) && !ix.claimed_after(&s("kv:a"), Epoch(4)));
    }

    #[test]
    fn a_checkpointed_claim_multiplicity_is_rebuilt_without_a_loop_per_claim() {
        use crate::engine::Text;
        let path = smallvec::smallvec![Text("kv".into()), Text("a".into())];
        let nodes = vec![FlatNodeIn { path, here: vec![(1, u32::MAX)], write: 0 }];
        let ix = ScopeIndex::unflatten(nodes).unwrap();
        assert!(ix.blocked_before(&s("kv:a:b"), Epoch(2)));
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
