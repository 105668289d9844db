//! Scope aliasing suite (DESIGN.md §1 "Scope"; the settlement-engine paper's Appendix D.4).
//!
//! Two spellings of one resource must conflict, and two different resources must not. Every
//! table below is data: a row is `(input(s), expected, reason)`, and the tests walk the tables
//! so a failing row names itself. Overlap is asserted in both directions for every row.

use tidegate_core::scope::{CaseRule, MAX_SCOPE_BYTES, MAX_SCOPE_SEGMENTS, PathStyle, SHOWN_CHARS, ScopeRule};
use tidegate_core::{Scope, ScopeError, ScopeRegistry};

/// Expected result of `overlaps` / `covers` for a row.
const YES: bool = true;
/// Expected result of `overlaps` / `covers` for a row.
const NO: bool = false;

/// `(a, b, expected overlap, reason)`. Every input here parses under the default registry.
const OVERLAP_ROWS: &[(&str, &str, bool, &str)] = &[
    // --- `.`, `..` and duplicate separators (Posix) ---
    ("fs:/repo/src/app.py", "fs:/repo/src/./app.py", YES, "`.` is dropped"),
    ("fs:/repo/src/app.py", "fs:/repo/lib/../src/app.py", YES, "`..` removes the previous segment"),
    ("fs:/repo//src///app.py", "fs:/repo/src/app.py", YES, "duplicate `/` are dropped"),
    ("fs:/./repo/./src/.", "fs:/repo/src", YES, "leading, inner and trailing `.`"),
    ("fs:/repo/a/b/../../src/app.py", "fs:/repo/src/app.py", YES, "`..` twice in a row"),
    ("fs:/repo/src/../lib/x", "fs:/repo/src/x", NO, "`..` leaves src for lib"),
    ("fs:/a/b/..", "fs:/a/c", YES, "`/a/b/..` is `/a`, a segment prefix of `/a/c`"),
    ("fs:/a/./b", "fs:/a/c", NO, "`.` does not make siblings alias"),
    ("fs:/a/.../b", "fs:/a/b", NO, "`...` is a literal segment, not `.` or `..`"),
    ("fs:/a/..b", "fs:/b", NO, "`..b` is a literal segment, not `..`"),
    // --- backslashes (Posix only) ---
    ("fs:\\repo\\src\\app.py", "fs:/repo/src/app.py", YES, "`\\` is a Posix separator"),
    ("fs:/repo\\src/app.py", "fs:/repo/src/app.py", YES, "mixed `\\` and `/`"),
    ("fs:\\\\repo\\\\\\\\src", "fs:/repo/src/x", YES, "duplicate `\\` collapse, then segment prefix"),
    ("fs:/repo\\src\\..\\lib", "fs:/repo/lib", YES, "`..` between backslashes"),
    ("retail:order\\W1", "retail:order:W1", NO, "`\\` is not a separator for Colon types"),
    // --- trailing slashes ---
    ("fs:/repo/src/", "fs:/repo/src", YES, "trailing `/` is dropped"),
    ("fs:/repo/src//", "fs:/repo/src/app.py", YES, "trailing `//` then segment prefix"),
    ("fs:/repo/src/", "fs:/repo/srcx", NO, "a trailing `/` does not make a string prefix match"),
    // --- case rules per type ---
    ("fs:/Repo/App.py", "fs:/repo/app.py", NO, "fs is case-sensitive"),
    ("fs:/repo/README", "fs:/repo/readme", NO, "fs is case-sensitive in the last segment too"),
    ("db:tpcc:Stock:W=1", "db:TPCC:stock:w=1", YES, "db is case-insensitive"),
    ("db:tpcc:stock", "DB:TPCC:STOCK:w=1:i=42", YES, "db: case-insensitive segment prefix"),
    ("db:tpcc:stock:w=1", "db:tpcc:stock:w=2", NO, "db: different warehouse"),
    ("mail:Alice@Example.COM", "mail:alice@example.com", YES, "mail is case-insensitive"),
    ("mail:alice@example.com", "mail:bob@example.com", NO, "mail: different mailbox"),
    ("mail:INBOX:Alice", "mail:inbox:alice:msg1", YES, "mail: case-insensitive segment prefix"),
    ("retail:order:W1", "retail:order:w1", NO, "retail is case-sensitive"),
    ("retail:Order:W1", "retail:order:W1", NO, "retail is case-sensitive in every segment"),
    ("kv:Key", "kv:key", NO, "kv is case-sensitive"),
    // --- type case ---
    ("FS:/repo/app.py", "fs:/repo/app.py", YES, "the type is case-insensitive"),
    ("Retail:order:W1", "retail:order:W1", YES, "mixed-case type"),
    ("RETAIL:order:W1", "retail:order:w1", NO, "type case folds, retail path case does not"),
    ("Db:Tpcc:Stock", "db:tpcc:stock", YES, "type and db path both fold"),
    // --- string prefixes that are not segment prefixes ---
    ("fs:/a/bc", "fs:/a/b", NO, "`b` is a string prefix of `bc`, not a segment"),
    ("fs:/repo/src", "fs:/repo/src2/app.py", NO, "`src` vs `src2`"),
    ("fs:/a/b", "fs:/a/b/c", YES, "segment prefix"),
    ("retail:order:W1", "retail:order:W12", NO, "`W1` vs `W12`"),
    ("retail:order", "retail:orders:W1", NO, "`order` vs `orders`"),
    ("retail:order", "retail:order:W1", YES, "Colon segment prefix"),
    ("db:tpcc:stock:w=1", "db:tpcc:stock:w=10", NO, "`w=1` vs `w=10`"),
    ("mail:alice@example.com", "mail:alice@example.co", NO, "`.co` vs `.com`"),
    // --- the Posix root ---
    ("fs:/", "fs:/anything/at/all", YES, "the root overlaps every fs scope"),
    ("fs:/", "fs:/", YES, "the root overlaps itself"),
    ("fs:/a/..", "fs:/b/c", YES, "`/a/..` is the root"),
    ("fs:\\", "fs:/etc/passwd", YES, "`\\` alone is the root"),
    ("fs:/", "retail:order:W1", NO, "the root overlaps only its own type"),
    // --- different types never overlap ---
    ("fs:/order/W1", "retail:order:W1", NO, "fs vs retail, same segments"),
    ("retail:order:W1", "travel:order:W1", NO, "retail vs travel, same path"),
    ("db:x", "kv:x", NO, "db vs kv, same path"),
    ("mail:a", "web:a", NO, "mail vs web, same path"),
    ("fs:/*", "db:*", NO, "wildcards never cross types"),
    ("retail:*", "travel:order", NO, "a wildcard does not match another type"),
    // --- Colon duplicate and trailing separators ---
    ("retail:order::W1", "retail:order:W1", YES, "`::` is one separator"),
    ("retail:order:W1:", "retail:order:W1", YES, "trailing `:` is dropped"),
    ("retail::order:::W1::", "retail:order:W1", YES, "leading, inner and trailing empty segments"),
    ("retail:order::W2", "retail:order:W1", NO, "`::` does not hide a different id"),
    ("retail:order:W1::", "retail:order:W1:item:3", YES, "trailing `::` then segment prefix"),
    // --- wildcards ---
    ("retail:order:*", "retail:order:W1", YES, "`*` as last segment"),
    ("retail:*:W1", "retail:order:W1", YES, "`*` as middle segment"),
    ("retail:order:*:item", "retail:order:W1:item", YES, "`*` in the middle, rest equal"),
    ("retail:order:*:item", "retail:order:W1:payment", NO, "`*` matches one segment, not the rest"),
    ("fs:/repo/*/app.py", "fs:/repo/src/app.py", YES, "Posix `*` in the middle"),
    ("fs:/repo/*/app.py", "fs:/repo/src/lib.py", NO, "Posix `*`, different file"),
    ("fs:/repo/*", "fs:/repo", YES, "`/repo` is a segment prefix of `/repo/*`"),
    ("fs:/repo/*", "fs:/other/x", NO, "`*` does not rescue a differing earlier segment"),
    ("retail:order:W*", "retail:order:W1", NO, "`W*` is a literal segment, not a glob"),
    ("retail:order:W*", "retail:order:W*", YES, "the literal `W*` equals itself"),
    ("fs:/repo/src*", "fs:/repo/src/app.py", NO, "`src*` is a literal segment"),
    ("retail:order:*", "retail:order:*:item", YES, "`*` on both sides"),
    ("db:tpcc:*:w=1", "DB:TPCC:Stock:W=1:i=42", YES, "`*` with case-insensitive neighbours"),
    ("retail:*", "retail:cart:C9", YES, "`*` as the only segment"),
    ("fs:/*/b", "fs:/a/c", NO, "`*` matches `a`, but `b` differs from `c`"),
    ("db:tpcc:stock:W=*", "db:tpcc:stock:w=1", NO, "`w=*` is a literal segment"),
    // --- whitespace ---
    ("  retail:order:W1  ", "retail:order:W1", YES, "surrounding spaces are trimmed"),
    ("\tfs:/repo/app.py\n", "fs:/repo/app.py", YES, "surrounding tab and newline are trimmed"),
    ("retail: order : W1", "retail:order:W1", YES, "spaces around Colon segments are trimmed"),
    ("retail:order: :W1", "retail:order:W1", YES, "a whitespace-only Colon segment is empty"),
    ("fs:/repo/a b", "fs:/repo/a", NO, "a space inside a Posix name is kept"),
    (" db:Tpcc:Stock ", "db:tpcc:stock:w=1", YES, "trimmed, folded, then segment prefix"),
];

/// `(input, canonical text)`.
const CANONICAL_ROWS: &[(&str, &str)] = &[
    ("fs:/repo/src/app.py", "fs:/repo/src/app.py"),
    ("FS:/repo/./src//app.py", "fs:/repo/src/app.py"),
    ("fs:\\repo\\src\\", "fs:/repo/src"),
    ("fs:/a/b/../c/.", "fs:/a/c"),
    ("fs:/", "fs:/"),
    ("fs://", "fs:/"),
    ("fs:/a/..", "fs:/"),
    ("fs:\\", "fs:/"),
    ("fs:/Repo/App.PY", "fs:/Repo/App.PY"),
    ("fs:/a b/c", "fs:/a b/c"),
    ("fs:/repo/*/x", "fs:/repo/*/x"),
    ("fs:/a:b/c", "fs:/a:b/c"),
    ("db:TPCC:Stock:W=1:I=42:S_Quantity", "db:tpcc:stock:w=1:i=42:s_quantity"),
    ("db:ÄBC", "db:äbc"),
    ("mail:Alice@Example.COM", "mail:alice@example.com"),
    ("MAIL:INBOX", "mail:inbox"),
    ("retail:order::W1:", "retail:order:W1"),
    ("Retail:Order:W1", "retail:Order:W1"),
    ("  retail: order : W1  ", "retail:order:W1"),
    ("retail:order:*", "retail:order:*"),
    ("retail:order\\W1", "retail:order\\W1"),
    ("retail:order:W*", "retail:order:W*"),
    ("kv::a", "kv:a"),
    ("web:https://example.com/a", "web:https://example.com/a"),
];

/// The `ScopeError` variants, by name, so rows can say which one they expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Empty,
    MissingType,
    BadType,
    NotAbsolute,
    AboveRoot,
    EmptyPath,
    ControlChar,
    TooLong,
    TooDeep,
}

fn refusal_of(err: &ScopeError) -> Refusal {
    match err {
        ScopeError::Empty => Refusal::Empty,
        ScopeError::MissingType { .. } => Refusal::MissingType,
        ScopeError::BadType { .. } => Refusal::BadType,
        ScopeError::NotAbsolute { .. } => Refusal::NotAbsolute,
        ScopeError::AboveRoot { .. } => Refusal::AboveRoot,
        ScopeError::EmptyPath { .. } => Refusal::EmptyPath,
        ScopeError::ControlChar { .. } => Refusal::ControlChar,
        ScopeError::TooLong { .. } => Refusal::TooLong,
        ScopeError::TooDeep { .. } => Refusal::TooDeep,
        other => panic!("a ScopeError variant this suite does not know: {other:?}"),
    }
}

/// `(input, expected variant, text the Display message must contain)`.
const REFUSAL_ROWS: &[(&str, Refusal, &str)] = &[
    ("", Refusal::Empty, "empty"),
    ("   ", Refusal::Empty, "empty"),
    ("\t\n", Refusal::Empty, "empty"),
    ("/repo/app.py", Refusal::MissingType, "`/repo/app.py`"),
    ("order-W1", Refusal::MissingType, "`order-W1`"),
    (":/repo", Refusal::BadType, "`:/repo`"),
    ("f s:/a", Refusal::BadType, "`f s:/a`"),
    ("fs.x:/a", Refusal::BadType, "`fs.x:/a`"),
    ("fs/:a", Refusal::BadType, "`fs/:a`"),
    ("fs:repo/app.py", Refusal::NotAbsolute, "`fs:repo/app.py`"),
    ("fs:", Refusal::NotAbsolute, "`fs:`"),
    ("fs:./a", Refusal::NotAbsolute, "`fs:./a`"),
    ("fs:/..", Refusal::AboveRoot, "`fs:/..`"),
    ("fs:/a/../..", Refusal::AboveRoot, "`fs:/a/../..`"),
    ("fs:\\..\\x", Refusal::AboveRoot, "`fs:\\..\\x`"),
    ("retail:", Refusal::EmptyPath, "`retail:`"),
    ("retail:::", Refusal::EmptyPath, "`retail:::`"),
    ("db: : ", Refusal::EmptyPath, "`db: : `"),
    ("fs:/a\u{0}b", Refusal::ControlChar, "'\\0'"),
    ("retail:order:W1\u{7}", Refusal::ControlChar, "'\\u{7}'"),
    ("retail:order\u{1b}[31m:W1", Refusal::ControlChar, "'\\u{1b}'"),
    ("fs:/a\tb", Refusal::ControlChar, "'\\t'"),
    ("fs:/a\nb", Refusal::ControlChar, "'\\n'"),
];

/// `(outer, inner, expected outer.covers(inner), reason)`.
const COVERS_ROWS: &[(&str, &str, bool, &str)] = &[
    ("fs:/repo", "fs:/repo/src/app.py", YES, "a prefix covers its extensions"),
    ("fs:/repo/src/app.py", "fs:/repo", NO, "an extension does not cover its prefix"),
    ("fs:/repo", "fs:/repo", YES, "a scope covers itself"),
    ("fs:/", "fs:/x/y", YES, "the root covers every fs scope"),
    ("fs:/x", "fs:/", NO, "nothing narrower covers the root"),
    ("fs:/repo", "fs:/repository/x", NO, "a string prefix does not cover"),
    ("fs:/repo/*", "fs:/repo/src/app.py", YES, "outer `*` covers any segment"),
    ("fs:/repo/*/app.py", "fs:/repo/src/app.py", YES, "outer `*` in the middle"),
    ("fs:/repo/*/app.py", "fs:/repo/src/lib.py", NO, "outer `*`, different file"),
    ("fs:/repo/src", "fs:/repo/*", NO, "inner `*` is covered only by `*`"),
    ("fs:/repo/*", "fs:/repo/*", YES, "`*` covers `*`"),
    ("fs:/repo/*/x", "fs:/repo/*/x/y", YES, "`*` covers `*`, then prefix"),
    ("fs:/repo/*", "fs:/repo", NO, "`/repo/*` does not cover `/repo` itself"),
    ("retail:order", "retail:order:W1", YES, "Colon prefix covers its extensions"),
    ("retail:order:W1", "retail:order", NO, "Colon extension does not cover its prefix"),
    ("retail:order:*", "retail:order:W1:item:3", YES, "outer `*` then prefix"),
    ("retail:order:W1", "retail:order:*", NO, "inner `*` is not covered by a literal"),
    ("retail:*", "retail:*", YES, "`*` covers `*` (Colon)"),
    ("retail:order:W*", "retail:order:W1", NO, "`W*` is a literal, not a glob"),
    ("retail:order", "travel:order", NO, "types must match"),
    ("fs:/", "retail:x", NO, "the fs root does not cover other types"),
    ("db:TPCC:Stock", "db:tpcc:stock:w=1", YES, "db case folds before covering"),
    ("retail:Order", "retail:order:W1", NO, "retail case does not fold"),
    ("FS:/repo/", "fs:\\repo\\src", YES, "aliases are canonicalised before covering"),
    ("retail:order::W1", "retail:order:W1::", YES, "Colon aliases covering each other"),
];

fn parse(reg: &ScopeRegistry, text: &str) -> Scope {
    reg.parse(text).unwrap_or_else(|e| panic!("{text:?} should parse, got: {e}"))
}

#[test]
fn aliasing_table_has_at_least_sixty_distinct_rows() {
    assert!(OVERLAP_ROWS.len() >= 60, "only {} rows", OVERLAP_ROWS.len());
    for (i, (a, b, _, _)) in OVERLAP_ROWS.iter().enumerate() {
        for (c, d, _, _) in &OVERLAP_ROWS[i + 1..] {
            assert!((a, b) != (c, d) && (a, b) != (d, c), "duplicate row ({a:?}, {b:?})");
        }
    }
}

#[test]
fn overlap_matches_every_aliasing_row_in_both_directions() {
    let reg = ScopeRegistry::default();
    let mut failures = Vec::new();
    for &(a, b, expected, why) in OVERLAP_ROWS {
        let (sa, sb) = (parse(&reg, a), parse(&reg, b));
        let (ab, ba) = (sa.overlaps(&sb), sb.overlaps(&sa));
        if ab != ba {
            failures.push(format!("asymmetric: {a:?} vs {b:?}: a.overlaps(b)={ab}, b.overlaps(a)={ba} ({why})"));
        }
        if ab != expected {
            failures.push(format!("{a:?} [{sa}] vs {b:?} [{sb}]: expected overlap={expected}, got {ab} ({why})"));
        }
    }
    assert!(failures.is_empty(), "{} aliasing rows failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_scope_overlaps_and_covers_itself_and_its_reparse() {
    let reg = ScopeRegistry::default();
    for &(a, b, _, _) in OVERLAP_ROWS {
        for text in [a, b] {
            let s = parse(&reg, text);
            let again = parse(&reg, text);
            assert!(s.overlaps(&s), "{text:?} does not overlap itself");
            assert!(s.overlaps(&again), "{text:?} does not overlap a second parse of itself");
            assert!(s.covers(&again), "{text:?} does not cover a second parse of itself");
        }
    }
}

#[test]
fn aliases_that_overlap_without_a_wildcard_or_prefix_are_equal_scopes() {
    // Rows whose two sides have the same number of segments, no wildcard and do overlap are
    // pure aliases: after canonicalisation they must be the same `Scope` (equal text).
    let reg = ScopeRegistry::default();
    let mut checked = 0;
    for &(a, b, expected, why) in OVERLAP_ROWS {
        let (sa, sb) = (parse(&reg, a), parse(&reg, b));
        let pure = !sa.has_wildcard()
            && !sb.has_wildcard()
            && sa.kind() == sb.kind()
            && sa.segments().count() == sb.segments().count();
        if pure && expected {
            assert_eq!(sa, sb, "{a:?} and {b:?} are aliases but canonicalise differently ({why})");
            assert_eq!(sa.as_str(), sb.as_str());
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} pure-alias rows");
}

#[test]
fn canonical_forms_match_the_table() {
    let reg = ScopeRegistry::default();
    let mut failures = Vec::new();
    for &(input, canonical) in CANONICAL_ROWS {
        let s = parse(&reg, input);
        if s.as_str() != canonical || s.to_string() != canonical {
            failures.push(format!("{input:?}: expected {canonical:?}, got {:?}", s.as_str()));
        }
        let (kind, path) = canonical.split_once(':').unwrap_or_else(|| panic!("bad table row {canonical:?}"));
        assert_eq!(s.kind(), kind, "kind of {input:?}");
        assert_eq!(s.path(), path, "path of {input:?}");
    }
    assert!(failures.is_empty(), "{} canonical rows failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn canonical_form_is_a_fixed_point() {
    let reg = ScopeRegistry::default();
    let inputs = CANONICAL_ROWS.iter().map(|r| r.0).chain(OVERLAP_ROWS.iter().flat_map(|r| [r.0, r.1]));
    for input in inputs {
        let once = parse(&reg, input);
        let twice = parse(&reg, once.as_str());
        assert_eq!(once.as_str(), twice.as_str(), "canonicalising {input:?} twice changed it");
    }
}

#[test]
fn segments_of_canonical_scopes_are_split_on_the_type_separator() {
    let reg = ScopeRegistry::default();
    let segs = |t: &str| parse(&reg, t).segments().map(str::to_owned).collect::<Vec<_>>();
    assert!(segs("fs:/").is_empty(), "the root has no segments");
    assert_eq!(segs("fs:\\a\\\\b\\"), ["a", "b"]);
    assert_eq!(segs("fs:/a:b/c"), ["a:b", "c"], "`:` is not a Posix separator");
    assert_eq!(segs("retail::order:: W1 :"), ["order", "W1"]);
    assert_eq!(segs("DB:Tpcc:Stock"), ["tpcc", "stock"]);
    assert!(parse(&reg, "retail:order:*").has_wildcard());
    assert!(!parse(&reg, "retail:order:W*").has_wildcard(), "`W*` is not the wildcard");
}

#[test]
fn refusals_name_the_variant_and_the_offending_text() {
    let reg = ScopeRegistry::default();
    let mut failures = Vec::new();
    for &(input, expected, needle) in REFUSAL_ROWS {
        let err = match reg.parse(input) {
            Ok(s) => {
                failures.push(format!("{input:?}: expected {expected:?}, but parsed as {s}"));
                continue;
            }
            Err(e) => e,
        };
        let got = refusal_of(&err);
        let msg = err.to_string();
        if got != expected {
            failures.push(format!("{input:?}: expected {expected:?}, got {got:?} ({msg})"));
        }
        if !msg.contains(needle) {
            failures.push(format!("{input:?}: message {msg:?} does not contain {needle:?}"));
        }
        // Every variant except `Empty` carries and prints the text exactly as given.
        if expected != Refusal::Empty && !msg.contains(&format!("`{input}`")) {
            failures.push(format!("{input:?}: message {msg:?} does not quote the input"));
        }
    }
    assert!(failures.is_empty(), "{} refusal rows failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn control_character_refusal_reports_the_character() {
    let reg = ScopeRegistry::default();
    for (input, ch) in [("fs:/a\u{0}b", '\0'), ("retail:o\u{7f}:W1", '\u{7f}'), ("mail:a\rb", '\r')] {
        match reg.parse(input) {
            Err(ScopeError::ControlChar { scope, ch: got }) => {
                assert_eq!(scope, input);
                assert_eq!(got, ch);
            }
            other => panic!("{input:?}: expected ControlChar, got {other:?}"),
        }
    }
}

#[test]
fn type_names_are_limited_to_sixty_four_characters() {
    let reg = ScopeRegistry::default();
    let at_limit = format!("{}:x", "a".repeat(64));
    let over_limit = format!("{}:x", "a".repeat(65));
    assert!(reg.parse(&at_limit).is_ok(), "64 chars is well-formed (and needs no registration)");
    assert!(matches!(reg.parse(&over_limit), Err(ScopeError::BadType { .. })), "65 chars is malformed");
}

#[test]
fn covers_matches_every_may_touch_row() {
    let reg = ScopeRegistry::default();
    let mut failures = Vec::new();
    for &(outer, inner, expected, why) in COVERS_ROWS {
        let (so, si) = (parse(&reg, outer), parse(&reg, inner));
        let got = so.covers(&si);
        if got != expected {
            failures.push(format!("{outer:?} [{so}] covers {inner:?} [{si}]: expected {expected}, got {got} ({why})"));
        }
    }
    assert!(failures.is_empty(), "{} covers rows failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn covering_implies_overlapping_and_mutual_covering_implies_equality() {
    let reg = ScopeRegistry::default();
    let pairs = COVERS_ROWS.iter().map(|r| (r.0, r.1)).chain(OVERLAP_ROWS.iter().map(|r| (r.0, r.1)));
    for (a, b) in pairs {
        let (sa, sb) = (parse(&reg, a), parse(&reg, b));
        for (x, y) in [(&sa, &sb), (&sb, &sa)] {
            if x.covers(y) {
                assert!(x.overlaps(y), "{x} covers {y} but does not overlap it");
            }
        }
        if sa.covers(&sb) && sb.covers(&sa) {
            assert_eq!(sa, sb, "{a:?} and {b:?} cover each other but differ");
        }
    }
}

/// Appendix D.4, Table 20, recomputed on this suite's aliasing table.
#[derive(Debug, Default, PartialEq, Eq)]
struct Strategy {
    missed: usize,
    false_conflicts: usize,
}

fn score(conflicts: impl Fn(&str, &str) -> bool) -> Strategy {
    let mut s = Strategy::default();
    for &(a, b, expected, _) in OVERLAP_ROWS {
        match (expected, conflicts(a, b)) {
            (true, false) => s.missed += 1,
            (false, true) => s.false_conflicts += 1,
            _ => {}
        }
    }
    s
}

#[test]
fn canonical_overlap_misses_no_conflicts_that_naive_string_scopes_miss() {
    let reg = ScopeRegistry::default();
    let should_conflict = OVERLAP_ROWS.iter().filter(|r| r.2).count();
    let should_not = OVERLAP_ROWS.len() - should_conflict;

    let canonical = score(|a, b| parse(&reg, a).overlaps(&parse(&reg, b)));
    let naive = score(|a, b| a == b);
    // Canonical text equality, no segment-prefix or wildcard awareness.
    let fine_no_overlap = score(|a, b| parse(&reg, a) == parse(&reg, b));
    let coarse_global = score(|_, _| true);

    println!("D.4 on {} rows: {should_conflict} should conflict, {should_not} should not", OVERLAP_ROWS.len());
    println!("{:<28} {:>8} {:>16}", "strategy", "missed", "false conflicts");
    for (name, s) in [
        ("canonical overlap", &canonical),
        ("naive raw string equality", &naive),
        ("canonical equality only", &fine_no_overlap),
        ("coarse global", &coarse_global),
    ] {
        println!("{name:<28} {:>8} {:>16}", s.missed, s.false_conflicts);
    }

    // The numbers below are those of the table above; update them together with the table.
    assert_eq!((should_conflict, should_not), (43, 36));
    assert_eq!(canonical, Strategy { missed: 0, false_conflicts: 0 });
    assert_eq!(naive, Strategy { missed: 41, false_conflicts: 0 });
    assert_eq!(fine_no_overlap, Strategy { missed: 20, false_conflicts: 0 });
    assert_eq!(coarse_global, Strategy { missed: 0, false_conflicts: should_not });
    assert!(naive.missed > 0, "naive string scopes must miss some aliases");
}

/// Inputs whose canonical text once failed to parse back to the same scope (see the test below).
const NOT_A_FIXED_POINT_ROWS: &[(&str, &str)] = &[
    ("fs:/a /", "a directory named `a ` spelled with a trailing `/`"),
    ("fs:/repo/tmp /.", "a trailing space in the last segment, then `.`"),
    ("fs:/a/ /b/..", "a last segment of one space, left behind by `..`"),
    ("fs:/ /x/..", "the root's only child is a space"),
    ("fs:/a\u{a0}/", "a trailing no-break space (whitespace, not a control character)"),
];

// Regression: Posix segments were not trimmed, so `fs:/a /` canonicalised to `fs:/a `, which
// re-parsed to `fs:/a`: a stored scope silently named another resource.
#[test]
fn canonical_text_with_trailing_whitespace_segment_reparses_to_the_same_scope() {
    let reg = ScopeRegistry::default();
    let mut failures = Vec::new();
    for &(input, why) in NOT_A_FIXED_POINT_ROWS {
        let once = parse(&reg, input);
        let twice = parse(&reg, once.as_str());
        if once != twice {
            failures.push(format!("{input:?} -> {:?} -> {:?} ({why})", once.as_str(), twice.as_str()));
        }
    }
    let (spaced, child) = (parse(&reg, "fs:/a /"), parse(&reg, "fs:/a/b"));
    let reparsed = parse(&reg, spaced.as_str());
    if spaced.overlaps(&child) != reparsed.overlaps(&child) {
        failures.push(format!(
            "overlap with fs:/a/b changes across a re-parse: {} before, {} after",
            spaced.overlaps(&child),
            reparsed.overlaps(&child)
        ));
    }
    assert!(failures.is_empty(), "{} re-parse failures:\n{}", failures.len(), failures.join("\n"));
}

// --- types nobody registered (issue 13 item 2) and size limits (issue 10 item 6) ---

/// `(a, b, expected overlap, reason)` for types no registry knows: the default rule
/// (`:`-separated, case-sensitive) applies to every one of them.
const UNREGISTERED_OVERLAP_ROWS: &[(&str, &str, bool, &str)] = &[
    ("stripe:charge:ch_1", "stripe:charge:ch_1", YES, "an unregistered type parses and equals itself"),
    ("stripe:charge", "stripe:charge:ch_1", YES, "segment prefix"),
    ("stripe:charge:ch_1", "stripe:charge:ch_2", NO, "different charges"),
    ("stripe:charge:ch_1", "stripe:charge:ch_10", NO, "`ch_1` is a string prefix of `ch_10`, not a segment"),
    ("stripe:charges:ch_1", "stripe:charge:ch_1", NO, "`charges` vs `charge`"),
    ("Stripe:charge:ch_1", "stripe:charge:ch_1", YES, "the type folds case"),
    ("stripe:Charge:ch_1", "stripe:charge:ch_1", NO, "the default rule is case-sensitive"),
    ("stripe:charge::ch_1:", "stripe:charge:ch_1", YES, "empty segments are dropped"),
    ("stripe: charge : ch_1 ", "stripe:charge:ch_1", YES, "whitespace around segments is trimmed"),
    ("stripe:charge:*", "stripe:charge:ch_1", YES, "a declared wildcard"),
    ("stripe:*:ch_1", "stripe:refund:ch_1", YES, "a wildcard in the middle"),
    ("stripe:charge:ch_*", "stripe:charge:ch_1", NO, "`ch_*` is a literal segment"),
    ("github:repo:org/name", "github:repo:org/name", YES, "`/` belongs to its segment"),
    ("github:repo:org", "github:repo:org/name", NO, "`org` is not a segment of `org/name`"),
    ("github:repo:org/name", "github:repo:org/name:issues:7", YES, "segment prefix after a `/`-bearing segment"),
    ("github:repo:org/name", "github:repo:org/name/", NO, "a trailing `/` is part of the segment"),
    ("github:repo:org/name", "gitlab:repo:org/name", NO, "different types never overlap"),
    ("s3:bucket:a/../b", "s3:bucket:b", NO, "`..` inside a segment is literal"),
    ("s3:bucket:..", "s3:bucket", YES, "a `..` segment is an ordinary name (a child of `bucket`)"),
    ("s3:bucket:..", "s3:other", NO, "`..` does not climb"),
    ("x-y_z9:a", "X-Y_Z9:a", YES, "type names with digits, `-`, `_`"),
];

#[test]
fn unregistered_types_parse_with_the_default_rule_and_overlap_by_segments() {
    for reg in [ScopeRegistry::default(), ScopeRegistry::empty()] {
        let mut failures = Vec::new();
        for &(a, b, expected, why) in UNREGISTERED_OVERLAP_ROWS {
            let (sa, sb) = (parse(&reg, a), parse(&reg, b));
            for (x, y) in [(&sa, &sb), (&sb, &sa)] {
                if x.overlaps(y) != expected {
                    failures.push(format!("{x} overlaps {y}: expected {expected} ({why})"));
                }
            }
            assert_eq!(parse(&reg, sa.as_str()), sa, "canonical form of {a:?} is a fixed point");
        }
        assert!(failures.is_empty(), "{} rows failed:\n{}", failures.len(), failures.join("\n"));
    }
    let reg = ScopeRegistry::default();
    assert_eq!(parse(&reg, " Stripe: charge:: ch_1 ").as_str(), "stripe:charge:ch_1");
    assert_eq!(parse(&reg, "github:repo:org/name").segments().collect::<Vec<_>>(), ["repo", "org/name"]);
    assert_eq!(reg.rule("stripe"), None, "parsing registers nothing");
    assert_eq!(reg.rule_of("stripe"), ScopeRule::DEFAULT);
}

#[test]
fn registering_a_type_changes_only_its_canonicalisation() {
    let mut reg = ScopeRegistry::default();
    let before = parse(&reg, "github:Repo:Org:Name");
    reg.register("github", ScopeRule { style: PathStyle::Colon, case: CaseRule::Insensitive }).unwrap();
    let after = parse(&reg, "github:Repo:Org:Name");
    assert_eq!(before.as_str(), "github:Repo:Org:Name");
    assert_eq!(after.as_str(), "github:repo:org:name");
    assert!(parse(&reg, "GitHub:REPO:org").overlaps(&after), "case now folds before comparing");
    // A Posix type: `/` separates, `..` resolves, relative paths are refused.
    reg.register("vfs", ScopeRule { style: PathStyle::Posix, case: CaseRule::Sensitive }).unwrap();
    assert_eq!(parse(&reg, "vfs:/a/b/../c/").as_str(), "vfs:/a/c");
    assert!(matches!(reg.parse("vfs:a/b"), Err(ScopeError::NotAbsolute { .. })));
    // Other types are untouched.
    assert_eq!(parse(&reg, "stripe:Charge:ch_1").as_str(), "stripe:Charge:ch_1");
    assert_eq!(reg.registered(), ["db", "fs", "github", "mail", "vfs"]);
    // Registration refuses malformed names and names that are not lowercase.
    assert!(matches!(reg.register("Bad", ScopeRule::DEFAULT), Err(ScopeError::BadType { .. })));
    assert!(matches!(reg.register("a b", ScopeRule::DEFAULT), Err(ScopeError::BadType { .. })));
    assert!(matches!(reg.register("", ScopeRule::DEFAULT), Err(ScopeError::BadType { .. })));
}

#[test]
fn built_in_types_can_be_given_another_rule() {
    let mut reg = ScopeRegistry::default();
    assert_eq!(parse(&reg, "mail:Ann@X.io").as_str(), "mail:ann@x.io");
    reg.register("mail", ScopeRule::DEFAULT).unwrap();
    assert_eq!(parse(&reg, "mail:Ann@X.io").as_str(), "mail:Ann@X.io");
    let empty = ScopeRegistry::empty();
    assert_eq!(parse(&empty, "fs:a/b").as_str(), "fs:a/b", "without the built-in rule, fs is a Colon type");
}

#[test]
fn scopes_at_the_limits_parse_and_beyond_them_are_refused_with_size_and_limit() {
    let reg = ScopeRegistry::default();
    // 256 segments: accepted; 257: refused (Colon and Posix).
    let at = format!("kv:{}", vec!["s"; MAX_SCOPE_SEGMENTS].join(":"));
    assert_eq!(parse(&reg, &at).segments().count(), MAX_SCOPE_SEGMENTS);
    let over = format!("kv:{}", vec!["s"; MAX_SCOPE_SEGMENTS + 1].join(":"));
    match reg.parse(&over) {
        Err(ScopeError::TooDeep { scope, segments, limit }) => {
            assert_eq!((segments, limit), (MAX_SCOPE_SEGMENTS + 1, MAX_SCOPE_SEGMENTS));
            assert!(scope.starts_with("kv:s:s") && scope.ends_with('…') && scope.chars().count() == SHOWN_CHARS + 1);
        }
        other => panic!("expected TooDeep, got {other:?}"),
    }
    let posix_over = format!("fs:/{}", vec!["d"; MAX_SCOPE_SEGMENTS + 1].join("/"));
    assert!(matches!(reg.parse(&posix_over), Err(ScopeError::TooDeep { .. })));
    // `..` that brings a deep path back under the limit is fine: the canonical path counts.
    let back = format!("fs:/{}/{}", vec!["d"; MAX_SCOPE_SEGMENTS].join("/"), "x/..");
    assert_eq!(parse(&reg, &back).segments().count(), MAX_SCOPE_SEGMENTS);
    // Exactly MAX_SCOPE_BYTES bytes: accepted; one more: refused.
    let exact = format!("kv:{}", "a".repeat(MAX_SCOPE_BYTES - 3));
    assert_eq!(exact.len(), MAX_SCOPE_BYTES);
    assert!(reg.parse(&exact).is_ok());
    let long = format!("kv:{}", "a".repeat(MAX_SCOPE_BYTES - 2));
    match reg.parse(&long) {
        Err(ScopeError::TooLong { bytes, limit, .. }) => {
            assert_eq!((bytes, limit), (MAX_SCOPE_BYTES + 1, MAX_SCOPE_BYTES))
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

/// Regression (issue 10 item 6): a 20,000-segment, 39 KiB scope overflowed the stack of the
/// scope index at `seal`; it is refused when parsed, naming the scope, its size and the limit.
#[test]
fn twenty_thousand_segment_scope_is_refused_cleanly() {
    let reg = ScopeRegistry::default();
    let deep = format!("fs:/{}", vec!["a"; 20_000].join("/"));
    assert!(deep.len() > 39_000);
    let err = reg.parse(&deep).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ScopeError::TooLong { bytes, limit: MAX_SCOPE_BYTES, .. } if bytes == deep.len()), "{err:?}");
    assert!(msg.contains(&deep.len().to_string()) && msg.contains("4096"), "{msg}");
    assert!(msg.len() < 200, "the message quotes a truncated scope: {msg}");
    // Within the byte limit but too deep: refused by the segment limit.
    let short_deep = format!("kv:{}", vec!["a"; 2_000].join(":"));
    assert!(short_deep.len() <= MAX_SCOPE_BYTES);
    assert!(matches!(reg.parse(&short_deep), Err(ScopeError::TooDeep { segments: 2_000, .. })));
    // What was recorded before the limits still replays.
    assert_eq!(reg.parse_logged(&deep).unwrap().segments().count(), 20_000);
}

#[test]
fn one_mebibyte_scope_is_refused_without_copying_it_into_the_error() {
    let reg = ScopeRegistry::default();
    let huge = format!("stripe:charge:{}", "x".repeat(1 << 20));
    match reg.parse(&huge) {
        Err(ScopeError::TooLong { scope, bytes, limit }) => {
            assert_eq!((bytes, limit), (huge.len(), MAX_SCOPE_BYTES));
            assert!(scope.starts_with("stripe:charge:xxx") && scope.chars().count() == SHOWN_CHARS + 1);
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn canonical_form_that_grows_past_the_limit_is_refused_so_replay_never_meets_it() {
    // 'İ' (2 bytes) lowercases to "i̇" (3 bytes): a case-insensitive scope under the byte
    // limit can canonicalise over it. Refused, so every accepted canonical text re-parses.
    let reg = ScopeRegistry::default();
    let text = format!("mail:{}", "İ".repeat((MAX_SCOPE_BYTES - 5) / 2));
    assert!(text.len() <= MAX_SCOPE_BYTES);
    assert!(matches!(reg.parse(&text), Err(ScopeError::TooLong { .. })));
    let fits = format!("mail:{}", "İ".repeat(1000));
    let s = parse(&reg, &fits);
    assert_eq!(parse(&reg, s.as_str()), s);
}
