//! A2, phantom tool (the paper's Definition 2, with the signature check of its §4.16).
//!
//! A witness is a record `i` and a tool `t` such that `t` is in `planned_tools(i)`, a tool
//! named `t` is in `registry_at_read(i)`, and at commit either
//!
//! * no tool named `t` is in `registry_at_commit(i)` (**removed**: Definition 2), or
//! * the first entries named `t` in both registries carry signatures and these differ
//!   (**signature changed**: the pinned signature no longer matches, §4.16).
//!
//! A tool written as a plain string is its own signature, so `"search@1"` → `"search@2"` is a
//! removal of `"search@1"`. A planned tool that was not visible at read time is not an A2
//! witness (the definition requires it in the read registry). Each distinct planned tool of a
//! record is checked once. Cost: linear in the registry sizes (sorted lookups for large ones).

use super::{CheckOptions, Detection, in_history, keep};
use crate::trace::{NONE, RecordIdx, ToolEntry, ToolId, Trace, ValueId};

/// How the planned tool changed between read and commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ToolChange {
    /// No tool of that name was in the registry at commit.
    Removed,
    /// The tool was present with a different signature.
    SignatureChanged {
        /// Signature visible at read time.
        at_read: ValueId,
        /// Signature at commit time.
        at_commit: ValueId,
    },
}

/// A phantom-tool witness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct A2Witness {
    /// The record.
    pub record: RecordIdx,
    /// The planned tool.
    pub tool: ToolId,
    /// What happened to it.
    pub change: ToolChange,
}

/// First entry named `name`, by linear scan or by binary search in `sorted` (sorted by
/// (name, position), so the first match in a name group is the first entry in the list).
fn first_named(list: &[ToolEntry], sorted: &[(u32, u32)], name: ToolId) -> Option<ToolEntry> {
    if sorted.is_empty() {
        return list.iter().find(|t| t.name == name).copied();
    }
    let i = sorted.partition_point(|&(n, _)| n < name.0);
    sorted.get(i).filter(|(n, _)| *n == name.0).map(|&(_, pos)| list[pos as usize])
}

fn index(list: &[ToolEntry], probes: usize, out: &mut Vec<(u32, u32)>) {
    out.clear();
    if list.len() * probes > 256 {
        out.extend(list.iter().enumerate().map(|(i, t)| (t.name.0, i as u32)));
        out.sort_unstable();
    }
}

/// Every A2 witness of `trace` (see the module docs for the predicate).
pub fn phantom_tool(trace: &Trace, opts: &CheckOptions) -> Detection<A2Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let mut witnesses = Vec::new();
    let (mut count, mut skipped) = (0u64, 0u64);
    let (mut at_read_idx, mut at_commit_idx) = (Vec::new(), Vec::new());
    let (mut planned, mut visited): (Vec<ToolId>, Vec<bool>) = (Vec::new(), Vec::new());
    for (idx, r) in trace.records.iter().enumerate() {
        if !in_history(r, opts) {
            continue;
        }
        let (Some(plan), Some(at_read), Some(at_commit)) =
            (trace.planned_tools(r), trace.registry_at_read(r), trace.registry_at_commit(r))
        else {
            skipped += 1;
            continue;
        };
        planned.clear();
        planned.extend(plan.iter().map(|t| t.name));
        planned.sort_unstable();
        planned.dedup();
        visited.clear();
        visited.resize(planned.len(), false);
        index(at_read, planned.len(), &mut at_read_idx);
        index(at_commit, planned.len(), &mut at_commit_idx);
        // Report in plan order, each distinct planned tool once.
        for t in plan {
            match planned.binary_search(&t.name) {
                Ok(i) if !visited[i] => visited[i] = true,
                _ => continue,
            }
            let Some(seen) = first_named(at_read, &at_read_idx, t.name) else { continue };
            let change = match first_named(at_commit, &at_commit_idx, t.name) {
                None => ToolChange::Removed,
                Some(now) if seen.signature != NONE && now.signature != NONE && seen.signature != now.signature => {
                    ToolChange::SignatureChanged { at_read: ValueId(seen.signature), at_commit: ValueId(now.signature) }
                }
                Some(_) => continue,
            };
            count += 1;
            keep(&mut witnesses, limit, A2Witness { record: idx as u32, tool: t.name, change });
        }
    }
    Detection { witnesses, count, skipped }
}
