//! Build script: the commit `arbiter --version` names. `make static` (and so the image and the
//! release) sets ARBITER_GIT_COMMIT from git; a build without it says "unknown". Read from the
//! environment rather than from git here, so that a new commit does not rebuild every test
//! binary.

fn main() {
    println!("cargo:rerun-if-env-changed=ARBITER_GIT_COMMIT");
    let commit = std::env::var("ARBITER_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ARBITER_GIT_COMMIT={}", commit.trim());
}
