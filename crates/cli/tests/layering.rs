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
const ALLOWED: [(&str, &[&str]); 13] = [
    ("tidegate-core", &[]),
    ("tidegate-plans", &["tidegate-core"]),
    ("tidegate-review", &[]),
    ("tidegate-detect", &[]),
    ("tidegate-storage", &["tidegate-core"]),
    ("tidegate-sqlite", &["tidegate-core", "tidegate-storage"]),
    ("tidegate-postgres", &["tidegate-core", "tidegate-storage"]),
    ("tidegate-runtime", &["tidegate-core", "tidegate-storage", "tidegate-detect", "tidegate-plans"]),
    ("tidegate-eval", &["tidegate-core", "tidegate-storage", "tidegate-detect", "tidegate-runtime"]),
    // The MCP gateway: on the embedded runtime only (its attached mode will reach a server over
    // HTTP, not link one); the `tidegate` binary runs it as a separate program.
    ("tidegate-mcp", &["tidegate-runtime", "tidegate-core", "tidegate-storage", "tidegate-detect", "tidegate-plans"]),
    (
        "tidegate-service",
        &[
            "tidegate-core",
            "tidegate-storage",
            "tidegate-sqlite",
            "tidegate-postgres",
            "tidegate-runtime",
            "tidegate-review",
        ],
    ),
    (
        "tidegate-server",
        &[
            "tidegate-core",
            "tidegate-storage",
            "tidegate-sqlite",
            "tidegate-runtime",
            "tidegate-review",
            "tidegate-service",
        ],
    ),
    (
        "tidegate",
        &[
            "tidegate-core",
            "tidegate-storage",
            "tidegate-sqlite",
            "tidegate-postgres",
            "tidegate-detect",
            "tidegate-runtime",
            "tidegate-eval",
            "tidegate-server",
            "tidegate-service",
            "tidegate-review",
            "tidegate-plans",
        ],
    ),
];

/// Dependencies allowed only as optional ones, behind a cargo feature: the runtime's `sqlite`
/// feature (default on) re-exports the embedded backend for users who want one crate; a
/// user of the contract alone turns it off and never compiles SQLite. Its `postgres` feature
/// (default off) lets `StoreUrl` open PostgreSQL ledgers.
const OPTIONAL: [(&str, &str); 2] =
    [("tidegate-runtime", "tidegate-sqlite"), ("tidegate-runtime", "tidegate-postgres")];

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

/// Crates of an HTTP server or router: only a front door (crates/server) may depend on them.
const HTTP_SERVER_CRATES: [&str; 14] = [
    "axum",
    "axum-core",
    "axum-extra",
    "tower",
    "tower-http",
    "tower-service",
    "tower-layer",
    "hyper",
    "hyper-util",
    "http",
    "http-body",
    "http-body-util",
    "utoipa-axum",
    "tidegate-server",
];

/// The service layer knows no HTTP (docs/service.md, invariant 1): it depends on no HTTP server
/// crate, and on utoipa (OpenAPI schemas of its plain types) only as an optional dependency
/// behind its `openapi` feature. A webhook is a dispatch backend, so the HTTP *client* is allowed.
#[test]
fn the_service_layer_depends_on_no_http_server_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let service = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tidegate-service")
        .expect("the service crate is in the workspace");
    let mut wrong = Vec::new();
    for dep in service["dependencies"].as_array().unwrap() {
        let name = dep["name"].as_str().unwrap();
        let kind = dep["kind"].as_str().unwrap_or("normal");
        if kind == "dev" {
            continue;
        }
        if HTTP_SERVER_CRATES.contains(&name) {
            wrong.push(format!("tidegate-service depends on {name}"));
        }
        if name == "utoipa" && !dep["optional"].as_bool().unwrap_or(false) {
            wrong.push("tidegate-service depends on utoipa outside its `openapi` feature".to_owned());
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // And no source file of the service (library, tests, benches, examples) names one of them.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../service");
    for dir in ["src", "tests", "benches", "examples"] {
        let dir = root.join(dir);
        if !dir.is_dir() {
            continue;
        }
        for (path, text) in rust_files(&dir) {
            for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")) {
                if let Some(krate) = HTTP_SERVER_CRATES.iter().find(|k| names_crate(line, k)) {
                    wrong.push(format!(
                        "{}:{}: names the HTTP crate `{krate}`: {}",
                        path.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the service layer must know no HTTP server:\n{}", wrong.join("\n"));
}

/// Whether a line of Rust names the crate `krate` as a path root (`axum::..`, `use axum;`,
/// `use ::axum`, `extern crate axum`, `axum as ..`), not as a segment inside another path
/// (`reqwest::http::..` is the webhook client's own re-export).
fn names_crate(line: &str, krate: &str) -> bool {
    let ident = krate.replace('-', "_");
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = line.as_bytes();
    let trimmed = line.trim_start();
    let import = ["use ", "pub use ", "pub(crate) use ", "extern crate "].iter().any(|p| trimmed.starts_with(p));
    let mut from = 0;
    while let Some(at) = line[from..].find(&ident) {
        let (start, end) = (from + at, from + at + ident.len());
        from = end;
        if (start > 0 && is_word(bytes[start - 1])) || bytes.get(end).is_some_and(|b| is_word(*b)) {
            continue;
        }
        // A segment inside another path (`reqwest::http::..`) is not the crate.
        if line[..start].ends_with("::") && line[..start - 2].bytes().last().is_some_and(is_word) {
            continue;
        }
        let after = line[end..].trim_start();
        if after.starts_with("::") || (import && [";", ",", "}", "as "].iter().any(|p| after.starts_with(p))) {
            return true;
        }
    }
    false
}

#[test]
fn the_http_name_check_sees_every_form_of_import() {
    for line in [
        "use axum::Router;",
        "use axum;",
        "use ::axum::Json;",
        "extern crate hyper;",
        "    let r: http::StatusCode = x;",
        "use tower_http::cors::CorsLayer;",
        "use utoipa_axum::router::OpenApiRouter;",
        "use { axum::Json, serde::Serialize };",
        "use axum as web;",
        "pub use tidegate_server::api;",
    ] {
        assert!(HTTP_SERVER_CRATES.iter().any(|k| names_crate(line, k)), "missed: {line}");
    }
    for line in [
        "let s = reqwest::http::StatusCode::OK;",
        "let url = \"http://127.0.0.1/\";",
        "/// over http: a webhook",
        "let towers = 3;",
        "fn httpd() {}",
        "use tidegate_service::settle;",
    ] {
        assert!(!HTTP_SERVER_CRATES.iter().any(|k| names_crate(line, k)), "false alarm: {line}");
    }
}

/// The modules of the server form no import cycle (issue 28: nine files used to be one
/// cycle): a file's `crate::` and `super::` paths name the modules it uses, and the graph of
/// those uses has no strongly connected component of more than one module.
#[test]
fn the_servers_modules_form_no_cycle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src");
    let files = rust_files(&src);
    // Module path of each file: api/transactions.rs -> api::transactions, api/mod.rs -> api.
    let module_of = |p: &std::path::Path| -> String {
        let rel = p.strip_prefix(&src).unwrap().with_extension("");
        let parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).filter(|c| *c != "mod" && *c != "lib").collect();
        parts.join("::")
    };
    let modules: Vec<String> = files.iter().map(|(p, _)| module_of(p)).collect();
    let index: BTreeMap<&str, usize> = modules.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); modules.len()];
    for (i, (path, text)) in files.iter().enumerate() {
        let me = &modules[i];
        let parent: Vec<&str> = {
            let mut p: Vec<&str> = if me.is_empty() { Vec::new() } else { me.split("::").collect() };
            if !path.ends_with("mod.rs") {
                p.pop();
            }
            p
        };
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (prefix, base) in [("crate::", Vec::new()), ("super::", parent.clone())] {
                let mut rest = line;
                while let Some(at) = rest.find(prefix) {
                    let after = &rest[at + prefix.len()..];
                    let name: String =
                        after.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                    // The longest module prefix the path names.
                    let mut path: Vec<&str> = base.clone();
                    let mut best = None;
                    for seg in name.split("::").filter(|s| !s.is_empty()) {
                        path.push(seg);
                        if let Some(&j) = index.get(path.join("::").as_str()) {
                            best = Some(j);
                        }
                    }
                    if let Some(j) = best
                        && j != i
                        && !edges[i].contains(&j)
                    {
                        edges[i].push(j);
                    }
                    rest = &after[name.len().min(after.len())..];
                }
            }
        }
    }
    // Tarjan's strongly connected components, iteratively.
    let n = modules.len();
    let (mut idx, mut low, mut on, mut stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n], Vec::new());
    let (mut counter, mut cycles) = (0, Vec::new());
    for start in 0..n {
        if idx[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (v, ref mut next)) = work.last_mut() {
            if *next == 0 && idx[v] == usize::MAX {
                idx[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = edges[v].get(*next) {
                *next += 1;
                if idx[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(idx[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == idx[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(modules[w].clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    cycles.push(comp.join(", "));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "the server's modules form import cycles:\n{}", cycles.join("\n"));
}

/// Every `.rs` file under `dir` with its text.
fn rust_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((p, text));
            }
        }
    }
    out.sort();
    out
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
