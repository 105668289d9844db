//! The human-readable form of a [`Report`].

use crate::report::{RecordRef, Report, Witness};
use std::fmt::Write as _;

fn rec(r: &RecordRef) -> String {
    let mut s = format!("line {}", r.line);
    match (&r.tx, &r.agent) {
        (Some(tx), Some(agent)) => {
            let _ = write!(s, " (tx {tx}, agent {agent})");
        }
        (Some(tx), None) => {
            let _ = write!(s, " (tx {tx})");
        }
        (None, Some(agent)) => {
            let _ = write!(s, " (agent {agent})");
        }
        (None, None) => {}
    }
    s
}

fn time(t: Option<u64>) -> String {
    t.map_or_else(|| "?".to_owned(), |t| t.to_string())
}

fn kind(w: &Witness) -> &'static str {
    match w {
        Witness::StaleGeneration { .. } => "A1",
        Witness::PhantomTool { .. } => "A2",
        Witness::CausalCascade { .. } | Witness::CascadeResidue { .. } => "A3",
        Witness::SplitView { .. } => "A4",
        Witness::Reordering { .. } => "A6",
        Witness::Cycle { .. } => "cycle",
    }
}

fn describe(w: &Witness) -> String {
    match w {
        Witness::StaleGeneration {
            reader,
            writer,
            cell,
            read_value,
            written_value,
            read_time,
            write_time,
            reader_write_time,
        } => format!(
            "{} read {cell} = {read_value} at t={}, {} wrote {written_value} at t={}, the reader committed at t={}",
            rec(reader),
            time(*read_time),
            rec(writer),
            time(*write_time),
            time(*reader_write_time)
        ),
        Witness::PhantomTool { record, tool, change, signature_at_read, signature_at_commit } => {
            match (signature_at_read, signature_at_commit) {
                (Some(a), Some(b)) => {
                    format!("{} planned {tool}: signature changed from {a} to {b} before commit", rec(record))
                }
                _ => format!("{} planned {tool}: {change} from the registry before commit", rec(record)),
            }
        }
        Witness::CausalCascade { record, predecessor, .. } => {
            format!("{} survived with aborted predecessor {}", rec(record), rec(predecessor))
        }
        Witness::CascadeResidue { record, cell, value, read_time, .. } => {
            format!("{} read {cell} = {value} at t={read_time}, which no committed write produced by then", rec(record))
        }
        Witness::SplitView { cell, time, first, second } => format!(
            "{cell} at t={time}: {} saw {} from {}, {} saw {} from {}",
            rec(&first.record),
            first.value,
            first.replica,
            rec(&second.record),
            second.value,
            second.replica
        ),
        Witness::Reordering { record, first_difference, io, co } => {
            let seq = |l: &[(String, serde_json::Value)]| {
                l.iter().map(|(c, v)| format!("{c}={v}")).collect::<Vec<_>>().join(", ")
            };
            format!(
                "{} issued [{}] but committed [{}] (first difference at position {first_difference})",
                rec(record),
                seq(io),
                seq(co)
            )
        }
        Witness::Cycle { component_size, edges, .. } => {
            let path: Vec<String> = edges
                .iter()
                .map(|e| format!("line {} -{}:{}-> line {}", e.from, kind_name(e.kind), e.cell, e.to))
                .collect();
            format!("{} records in one component; cycle: {}", component_size, path.join(", "))
        }
    }
}

fn kind_name(k: crate::EdgeKind) -> &'static str {
    match k {
        crate::EdgeKind::WriteWrite => "ww",
        crate::EdgeKind::WriteRead => "wr",
        crate::EdgeKind::ReadWrite => "rw",
    }
}

pub(crate) fn render(r: &Report, per_kind: usize) -> String {
    let mut s = String::new();
    let a = &r.anomalies;
    let _ = writeln!(s, "records: {} ({} malformed lines skipped)", r.records, r.malformed);
    let prevents = r.level.prevents();
    let _ = writeln!(
        s,
        "level:   {} (prevents {})",
        r.level,
        if prevents.is_empty() { "nothing".to_owned() } else { prevents.join(", ") }
    );
    let _ = writeln!(
        s,
        "anomalies: A1 stale generation {}, A2 phantom tool {}, A3 causal cascade ({} form) {}, A6 tool-effect reordering {}",
        a.a1,
        a.a2,
        if r.a3_form == crate::A3Form::Residue { "residue" } else { "precise" },
        a.a3,
        a.a6
    );
    let _ = writeln!(s, "outside the chain: A4 split view {}", a.a4);
    let _ = writeln!(s, "serialisability cycles: {}", r.cycles);
    let k = &r.skipped;
    if k.a1 + k.a2 + k.a3 + k.a4 + k.a6 + k.cycles > 0 {
        let _ = writeln!(
            s,
            "not fully evaluable (unknown fields): A1 {}, A2 {}, A3 {}, A4 {}, A6 {}, cycles {}",
            k.a1, k.a2, k.a3, k.a4, k.a6, k.cycles
        );
    }
    let mut shown = std::collections::BTreeMap::<&str, usize>::new();
    for w in &r.witnesses {
        let n = shown.entry(kind(w)).or_default();
        *n += 1;
        if *n <= per_kind {
            let _ = writeln!(s, "  {:<5} {}", kind(w), describe(w));
        }
    }
    for (name, n) in &shown {
        if *n > per_kind {
            let _ = writeln!(s, "  ({} more {name} witnesses in the JSON report)", n - per_kind);
        }
    }
    if r.truncated {
        let _ = writeln!(s, "  (witness list truncated by the witness limit; counts are exact)");
    }
    for e in &r.errors {
        let _ = writeln!(s, "  malformed: {}", e.message);
    }
    s
}
