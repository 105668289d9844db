//! The crate layering of ARCHITECTURE.md, checked on the workspace's manifests: a crate that
//! depends on one it must not fails this test (e.g. the detectors importing any other Tidegate
//! crate, the runtime importing the evaluation harness or the SQLite backend, the core
//! importing anything of Tidegate).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::BTreeMap;
use std::process::Command;

/// For each crate, the Tidegate crates its library may depend on (normal and build
/// dependencies). Dev-dependencies (tests) are free, except for the detectors. Optional
/// dependencies (behind a cargo feature) are listed in `OPTIONAL`.
const ALLOWED: [(&str, &[&str]); 10] = [
    ("tidegate-core", &[]),
    ("tidegate-plans", &[]),
    ("tidegate-review", &[]),
    ("tidegate-detect", &[]),
    ("tidegate-storage", &["tidegate-core"]),
    ("tidegate-sqlite", &["tidegate-core", "tidegate-storage"]),
    ("tidegate-runtime", &["tidegate-core", "tidegate-storage", "tidegate-detect", "tidegate-plans"]),
    ("tidegate-eval", &["tidegate-core", "tidegate-storage", "tidegate-detect", "tidegate-runtime"]),
    (
        "tidegate-server",
        &["tidegate-core", "tidegate-storage", "tidegate-sqlite", "tidegate-runtime", "tidegate-review"],
    ),
    (
        "tidegate",
        &[
            "tidegate-core",
            "tidegate-storage",
            "tidegate-sqlite",
            "tidegate-detect",
            "tidegate-runtime",
            "tidegate-eval",
            "tidegate-server",
            "tidegate-review",
            "tidegate-plans",
        ],
    ),
];

/// Dependencies allowed only as optional ones, behind a cargo feature: the runtime's `sqlite`
/// feature (default on) re-exports the embedded backend for users who want one crate; a
/// user of the contract alone turns it off and never compiles SQLite.
const OPTIONAL: [(&str, &str); 1] = [("tidegate-runtime", "tidegate-sqlite")];

#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.into_iter().collect();
    let mut seen = Vec::new();
    let mut wrong = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let Some(ok) = allowed.get(name) else {
            wrong.push(format!("{name}: a workspace crate this test does not know; add it to ALLOWED"));
            continue;
        };
        seen.push(name);
        for dep in package["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            if !dep_name.starts_with("tidegate") || dep_name == name {
                continue;
            }
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let optional = dep["optional"].as_bool().unwrap_or(false) && OPTIONAL.contains(&(name, dep_name));
            let forbidden =
                if kind == "dev" { name == "tidegate-detect" } else { !ok.contains(&dep_name) && !optional };
            if forbidden {
                wrong.push(format!("{name} has a {kind} dependency on {dep_name}"));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    assert_eq!(seen.len(), ALLOWED.len(), "every crate was checked: {seen:?}");
}

/// The Python binding (its own workspace, built by maturin) imports the runtime and the
/// storage crates, never the harness or the CLI.
#[test]
fn the_python_binding_imports_only_the_engine_and_storage_crates() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut in_deps = false;
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && line.starts_with("tidegate") {
            found.push(line.split(['=', ' ', '.']).next().unwrap().to_owned());
        }
    }
    let allowed = ["tidegate-core", "tidegate-storage", "tidegate-sqlite", "tidegate-runtime"];
    for dep in &found {
        assert!(allowed.contains(&dep.as_str()), "python/Cargo.toml depends on {dep}");
    }
    assert!(found.iter().any(|d| d == "tidegate-runtime"), "{found:?}");
}
