//! The workspace's weight, checked on its crates' source: no function over [`MAX_FN_LINES`]
//! lines and no file over [`MAX_FILE_LINES`] lines of non-test code, but for generated tables
//! that [`ALLOWED`] lists with their length (none today). An entry may only shrink: the test
//! fails when a listed one grows, and when it is back under the limit (so that its entry is
//! removed). Tests (`#[cfg(test)]` modules, inline or in files of their own) are not counted.
//!
//! Functions' spans come from `syn` (a parser, where brace counting would trip on strings and
//! macros); a function is counted from its `fn` line to its closing brace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::layers::{crates, files};

/// The longest a function may be.
const MAX_FN_LINES: usize = 80;
/// The longest a file's non-test code may be.
const MAX_FILE_LINES: usize = 600;

/// What may be over the limits, with its length: only generated tables, each with a comment
/// saying what generates it (none today). An entry may only shrink, and goes once under the
/// limit.
const ALLOWED: &[(&str, usize)] = &[];

/// Whether `attrs` carry `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// The functions of one file (outside tests), by name, with their lengths; the lines its test
/// modules take; and the test modules it declares in files of their own (`#[cfg(test)] mod x;`).
#[derive(Default)]
struct Lengths {
    functions: Vec<(String, usize)>,
    test_lines: usize,
    test_files: Vec<String>,
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            match &m.content {
                Some(_) => {
                    let span = syn::spanned::Spanned::span(m);
                    self.test_lines += span.end().line - span.start().line + 1;
                }
                None => self.test_files.push(m.ident.to_string()),
            }
            return;
        }
        syn::visit::visit_item_mod(self, m);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }
}

/// The directory a file's child modules live in: `a/mod.rs` and `lib.rs` → their own
/// directory, `a/b.rs` → `a/b/`.
fn children_dir(path: &Path) -> PathBuf {
    match path.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => path.parent().unwrap().to_path_buf(),
        _ => path.with_extension(""),
    }
}

impl Lengths {
    /// A function's length, from its `fn` line to its closing brace.
    fn record(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = syn::spanned::Spanned::span(block).end().line;
        self.functions
            .push((sig.ident.to_string(), end - start + 1));
    }
}

/// Everything over the limits in the crate whose source is `src`: `file::function` or `file`
/// (the file named from the workspace's root), with its length.
fn over_the_limits(src: &Path) -> BTreeMap<String, usize> {
    let mut parsed = Vec::new();
    let mut test_files = std::collections::BTreeSet::new();
    for path in files(src) {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut lengths = Lengths::default();
        lengths.visit_file(&file);
        let dir = children_dir(&path);
        for m in &lengths.test_files {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(m).join("mod.rs"));
        }
        parsed.push((path, text, lengths));
    }
    let mut over = BTreeMap::new();
    for (path, text, lengths) in parsed {
        if test_files.contains(&path) {
            continue;
        }
        let relative = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for (name, n) in lengths.functions {
            if n > MAX_FN_LINES {
                let key = format!("{relative}::{name}");
                let longest = over.entry(key).or_insert(0);
                *longest = (*longest).max(n);
            }
        }
        let code = text.lines().count() - lengths.test_lines;
        if code > MAX_FILE_LINES {
            over.insert(relative, code);
        }
    }
    over
}

#[test]
fn no_function_or_file_grows_past_its_limit() {
    let over: BTreeMap<String, usize> = crates()
        .iter()
        .flat_map(|src| over_the_limits(src))
        .collect();
    let allowed: BTreeMap<&str, usize> = ALLOWED.iter().copied().collect();
    let mut errors = Vec::new();
    for (what, n) in &over {
        match allowed.get(what.as_str()) {
            None => errors.push(format!(
                "{what}: {n} lines, over the limit ({MAX_FN_LINES} a function, {MAX_FILE_LINES} a file): split it into named steps"
            )),
            Some(&was) if *n > was => errors.push(format!(
                "{what}: {n} lines, more than the {was} it is allowed: it may only shrink"
            )),
            Some(&was) if *n < was => errors.push(format!(
                "{what}: {n} lines, down from {was}: lower its entry in ALLOWED (src/shape.rs)"
            )),
            Some(_) => {}
        }
    }
    for what in allowed.keys() {
        if !over.contains_key(*what) {
            errors.push(format!(
                "{what} is within the limits now: remove its entry from ALLOWED (src/shape.rs)"
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
