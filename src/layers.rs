//! The crate's layers point one way, checked on its source (a reader can trust the picture in
//! `docs/architecture.md`): the pure `election/` depends on nothing else in the crate, `api/` on
//! `election/` at most, the agent's and the library's modules never on the operator, and no
//! two top-level modules, nor two of the operator's folders, depend on each other in a circle.
//! Tests (`mod tests`) may reach anywhere.
//!
//! Hand-written rather than a tool (cargo-modules, cargo-deny): those check crates, or draw
//! graphs without failing a build; this is a page of string scanning over `src/`.

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
/// the crate root: `crate::…`, and `super::…` resolved against the file's own module.
fn paths_used(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    let mut out = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find(['c', 's']) {
            let tail = &rest[i..];
            let preceded = rest[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            let (mut base, after) = if let Some(t) = tail.strip_prefix("crate::") {
                (Vec::new(), t)
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

/// The dependencies between units: a top-level module, or one of the operator's folders or
/// files (`operator::cache`).
fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    let test_only = test_only(&files(&src));
    for path in files(&src).into_iter().filter(|p| !test_only.contains(p)) {
        let relative = path.strip_prefix(&src).expect("below src/");
        let module = module_of(relative);
        if module.is_empty() || module[0] == "main" || module[0] == "layers" {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a readable source file");
        let from = unit(&module);
        for used in paths_used(&source, &module) {
            if used.is_empty() {
                continue;
            }
            let to = unit(&used);
            if to != from && !(from.starts_with("operator") && to == "operator") {
                graph.entry(from.clone()).or_default().insert(to);
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

/// The unit a module belongs to: the operator's folders and files each count alone.
fn unit(path: &[String]) -> String {
    match path {
        [top, sub, ..] if top == "operator" => format!("operator::{sub}"),
        [top, ..] => top.clone(),
        [] => String::new(),
    }
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

/// The crate's modules, top to bottom: each uses only modules on lines below its own
/// (`docs/architecture.md` draws the same).
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &[
        "operator",
        "agent",
        "handover",
        "status",
        "self_install",
        "stop_operator",
    ],
    &["flags", "usage"],
    &["workloads", "candidate"],
    &["lease"],
    &["tolerant", "client", "memory"],
    &["clock"],
    &["api"],
    &["election"],
];

/// The operator's folders and files, bottom first: each uses only those before it.
const OPERATOR: &[&str] = &[
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

/// Where a module outside the operator stands (the operator counts as one): higher uses lower.
/// Items of the crate root (`random_id`) stand lowest.
fn outside(unit: &str) -> usize {
    LAYERS
        .iter()
        .rev()
        .position(|line| line.contains(&unit))
        .map_or(0, |i| 1 + i)
}

/// Where a part of the operator stands: its `mod.rs` (the wiring) above its folders.
fn rank(unit: &str) -> usize {
    if unit == "operator" {
        return 1000;
    }
    if let Some(sub) = unit.strip_prefix("operator::") {
        let i = OPERATOR
            .iter()
            .position(|o| *o == sub)
            .unwrap_or_else(|| panic!("{unit} is not in layers::OPERATOR"));
        return i;
    }
    panic!("{unit} is not part of the operator")
}

#[test]
fn the_layers_point_one_way() {
    let graph = graph();
    let uses = |m: &str| graph.get(m).cloned().unwrap_or_default();
    assert!(
        uses("election").is_empty(),
        "election/ is pure and depends on nothing else in the crate: {:?}",
        uses("election")
    );
    let api: Vec<_> = uses("api")
        .into_iter()
        .filter(|m| m != "election")
        .collect();
    assert!(api.is_empty(), "api/ depends on election/ at most: {api:?}");
    let top = |u: &str| {
        if u.starts_with("operator") {
            "operator"
        } else {
            u
        }
        .to_string()
    };
    for (from, to) in graph
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| (f, t)))
    {
        let (rf, rt) = if from.starts_with("operator") && to.starts_with("operator") {
            (rank(from), rank(to))
        } else {
            (outside(&top(from)), outside(&top(to)))
        };
        assert!(rt < rf, "{from} uses {to}, which stands at or above it");
    }
    if let Some(c) = circle(&graph) {
        panic!("an import circle: {}", c.join(" -> "));
    }
}

#[test]
fn paths_are_read_from_the_crate_root_and_relative_to_the_file() {
    let module = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let src = "use crate::api::LeaseCandidate;\n// crate::agent in a comment\nuse super::pods::Pods;\nlet x = other_crate::lease;\n#[cfg(test)]\nmod tests {\n use crate::operator;\n}\n";
    let used = paths_used(src, &module("operator::cache::index"));
    assert_eq!(
        used,
        vec![module("api"), module("operator::cache::pods")],
        "a comment, a path of another crate and the tests are not dependencies"
    );
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    assert_eq!(circle(&g), None);
    g.entry("b".into()).or_default().insert("a".into());
    assert_eq!(circle(&g), Some(module("a::b::a").to_vec()));
}
