//! The docs' examples, as written: every Kubernetes object in a ```yaml block of the README and
//! the user docs (not docs/development/) is sent to the API server as `kubectl apply
//! --server-side --dry-run=server` would send it, in the test's namespace, so the real schema,
//! the CRD's rules and admission judge it. A doc whose example no longer applies fails here.

use std::sync::Arc;

use serde::Deserialize;

use crate::support::{TestEnv, repo_root};

crate::tests![docs: every_example_in_the_docs_applies_as_written];

/// Every object in a ```yaml block of `text` (a block with no `apiVersion` and `kind`, such as
/// Helm values or a fragment of a pod spec, is not an object).
fn objects(text: &str) -> Vec<serde_yaml_ng::Value> {
    let mut out = Vec::new();
    for block in text.split("```yaml\n").skip(1) {
        let body = block.split("```").next().unwrap_or_default();
        for doc in serde_yaml_ng::Deserializer::from_str(body) {
            let Ok(value) = serde_yaml_ng::Value::deserialize(doc) else {
                continue;
            };
            if value.get("apiVersion").is_some() && value.get("kind").is_some() {
                out.push(value);
            }
        }
    }
    out
}

async fn every_example_in_the_docs_applies_as_written(env: Arc<TestEnv>) {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.ends_with("development") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    let mut applied = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for mut object in objects(&text) {
            // Each example names its own namespace: here, the test's.
            if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_mapping_mut()) {
                meta.insert("namespace".into(), env.ns.clone().into());
            }
            let yaml = serde_yaml_ng::to_string(&object).unwrap();
            let out = std::process::Command::new("kubectl")
                .args(["apply", "--server-side", "--dry-run=server", "-f", "-"])
                .env("KUBECONFIG", &env.kubeconfig)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut child| {
                    use std::io::Write;
                    child.stdin.take().unwrap().write_all(yaml.as_bytes())?;
                    child.wait_with_output()
                })
                .unwrap();
            applied += 1;
            if !out.status.success() {
                failures.push(format!(
                    "{}: {}",
                    file.strip_prefix(&root).unwrap().display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    assert!(applied >= 9, "only {applied} examples found in the docs");
    assert!(
        failures.is_empty(),
        "examples that do not apply:\n{}",
        failures.join("\n")
    );
}
