//! The layers inside each crate point one way, checked on their source (a reader can trust the
//! picture in `docs/architecture.md`). Between crates Cargo already refuses the wrong way: the
//! crates form one chain (`arbiter-election` <- `arbiter-api` <- `arbiter-candidate` <-
//! `arbiter-operator` <- `arbiter`), so a crate naming one above it would close a dependency
//! circle. Inside a crate, no two top-level modules depend on each other in a circle; the
//! operator's modules stand in [`OPERATOR`]'s order, and the binary's in [`BINARY`]'s (the
//! agent and the other subcommands never use the operator). Tests (`mod tests`) may reach
//! anywhere.
//!
//! Hand-written rather than a tool (cargo-modules, cargo-deny): those check crates, or draw
//! graphs without failing a build; this is a page of string scanning over each `src/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file below `dir` (also read by `crate::shape`).
pub(crate) fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The module path of a file below `src/`: `operator/cache/pods.rs` → `[operator, cache, pods]`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The paths (`a::b::c` as segments) a file's code, less its tests and comments, names from
/// the crate root: `crate::…`, `super::…` resolved against the file's own module, and another
/// of the workspace's crates by the binary's name for it (`arbiter_operator::…` → `operator::…`).
fn paths_used(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    let mut out = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find(['a', 'c', 's']) {
            let tail = &rest[i..];
            let preceded = rest[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            let (mut base, after) = if let Some(t) = tail.strip_prefix("crate::") {
                (Vec::new(), t)
            } else if let Some((name, t)) = tail
                .strip_prefix("arbiter_")
                .and_then(|t| t.split_once("::"))
                .filter(|(name, _)| name.chars().all(|c| c.is_ascii_lowercase()))
            {
                (vec![name.to_string()], t)
            } else if let Some(t) = tail.strip_prefix("super::") {
                // `super` is the parent of the file's module (a `mod.rs` is its folder's).
                let mut b = module.to_vec();
                b.pop();
                let mut t = t;
                while let Some(more) = t.strip_prefix("super::") {
                    b.pop();
                    t = more;
                }
                (b, t)
            } else {
                rest = &rest[i + 1..];
                continue;
            };
            if preceded {
                rest = &rest[i + 1..];
                continue;
            }
            for segment in after.split("::") {
                let ident: String = segment
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() || ident.starts_with(char::is_uppercase) {
                    break;
                }
                base.push(ident.clone());
                if ident.len() != segment.len() {
                    break;
                }
            }
            out.push(base);
            rest = &rest[i + 1..];
        }
    }
    out
}

/// The workspace's crates, by their source folders: the binary's own, then each of `crates/`
/// (also read by `crate::shape`).
pub(crate) fn crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![root.join("src")];
    let mut members: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|e| e.expect("a directory entry").path().join("src"))
        .collect();
    members.sort();
    out.extend(members);
    out
}

/// A crate's top-level modules: its files and folders beside `lib.rs`.
fn top_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

/// The dependencies between a crate's units: its top-level modules, and `extra` (the binary's
/// names for the crates it re-exports, which its paths reach as `crate::operator` or
/// `arbiter_operator`).
fn graph(src: &Path, extra: &[&str]) -> Graph {
    let mut units = top_modules(src);
    units.extend(extra.iter().map(|u| u.to_string()));
    let mut graph = Graph::new();
    let test_only = test_only(&files(src));
    for path in files(src).into_iter().filter(|p| !test_only.contains(p)) {
        let relative = path.strip_prefix(src).expect("below src/");
        let module = module_of(relative);
        let Some(from) = module.first().cloned() else {
            continue;
        };
        if from == "main" || from == "layers" || from == "shape" {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a readable source file");
        for used in paths_used(&source, &module) {
            if let Some(to) = used
                .first()
                .filter(|to| **to != from && units.contains(*to))
            {
                graph.entry(from.clone()).or_default().insert(to.clone());
            }
        }
    }
    graph
}

/// The files of modules declared `#[cfg(test)]` (test helpers, a folder's `tests.rs`).
fn test_only(all: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for path in all {
        let source = std::fs::read_to_string(path).expect("a readable source file");
        // The folder a file's child modules live in: its own for `mod.rs` and `lib.rs`.
        let stem = path.file_stem().unwrap_or_default();
        let dir = match stem.to_str() {
            Some("mod" | "lib") => path.parent().expect("a folder").to_path_buf(),
            _ => path.with_extension(""),
        };
        let mut lines = source.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let Some(next) = lines.next() else { break };
            let name = next
                .trim_start_matches("pub(crate) ")
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'));
            if let Some(name) = name {
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// A circle through `graph`, if there is one.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut c = path[i..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

/// The binary's modules and the crates it re-exports, top to bottom: each uses only names on
/// lines below its own, so the agent and the other subcommands never use the operator.
const BINARY: &[&[&str]] = &[
    &["cli"],
    &[
        "operator",
        "workloads",
        "memory",
        "agent",
        "handover",
        "status",
        "self_install",
        "stop_operator",
    ],
    &[
        "candidate",
        "client",
        "clock",
        "flags",
        "usage",
        "random_id",
        "lease",
        "tolerant",
        "api",
        "election",
    ],
];

/// The operator's modules, bottom first: each uses only those before it (its `lib.rs`, the
/// wiring, stands above them all).
const OPERATOR: &[&str] = &[
    "memory",
    "workloads",
    "key",
    "term",
    "queue",
    "cache",
    "metrics",
    "report",
    "force",
    "single_active",
    "reconcile",
    "ha",
    "webhook",
];

/// Where `unit` stands in `order` (bottom first); panics on one not placed, so that a new
/// module is placed on purpose.
fn rank(order: &[&[&str]], unit: &str) -> usize {
    order
        .iter()
        .position(|line| line.contains(&unit))
        .unwrap_or_else(|| panic!("{unit} is not placed in src/layers.rs"))
}

/// Every edge of `graph` points to a unit placed lower in `order` (bottom first).
fn assert_points_down(graph: &Graph, order: &[&[&str]]) {
    for (from, to) in graph
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| (f, t)))
    {
        assert!(
            rank(order, to) < rank(order, from),
            "{from} uses {to}, which stands at or above it"
        );
    }
}

#[test]
fn the_layers_point_one_way() {
    let binary: Vec<&[&str]> = BINARY.iter().rev().copied().collect();
    let operator: Vec<&[&str]> = OPERATOR.iter().map(std::slice::from_ref).collect();
    let facade: Vec<&str> = BINARY.iter().flat_map(|l| l.iter().copied()).collect();
    for src in crates() {
        let is_binary = src == Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let graph = graph(&src, if is_binary { &facade } else { &[] });
        if is_binary {
            assert_points_down(&graph, &binary);
        } else if src.ends_with("operator/src") {
            assert_points_down(&graph, &operator);
        }
        if let Some(c) = circle(&graph) {
            panic!("an import circle in {}: {}", src.display(), c.join(" -> "));
        }
    }
}

#[test]
fn paths_are_read_from_the_crate_root_and_relative_to_the_file() {
    let module = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let src = "use crate::api::LeaseCandidate;\n// crate::agent in a comment\nuse super::pods::Pods;\nlet x = other_crate::lease;\nuse arbiter_candidate::flags;\n#[cfg(test)]\nmod tests {\n use crate::operator;\n}\n";
    let used = paths_used(src, &module("operator::cache::index"));
    assert_eq!(
        used,
        vec![
            module("api"),
            module("operator::cache::pods"),
            module("candidate::flags")
        ],
        "a comment, a path of another crate and the tests are not dependencies"
    );
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    assert_eq!(circle(&g), None);
    g.entry("b".into()).or_default().insert("a".into());
    assert_eq!(circle(&g), Some(module("a::b::a").to_vec()));
}

/// The election rules read no clock: the compiler refuses jiff's `Timestamp::now` (built
/// without `std`, `make crate-deps`), and this refuses the standard library's.
#[test]
fn the_election_rules_read_no_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/election/src");
    let test_only = test_only(&files(&src));
    for path in files(&src).into_iter().filter(|p| !test_only.contains(p)) {
        let source = std::fs::read_to_string(&path).expect("a readable source file");
        let code = source
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for (i, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            assert!(
                !line.contains("::now(") && !line.contains("elapsed("),
                "{}:{}: the election rules read no clock; take the time as an argument",
                path.display(),
                i + 1
            );
        }
    }
}
