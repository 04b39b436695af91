//! The release as a user gets it: the files `make release` writes to `dist/`, pushed by `make
//! publish` to an OCI registry on 127.0.0.1 and pulled from there by the real node's containerd
//! (nothing imported beforehand), installed with `helm install oci://...` and with `kubectl
//! apply -f arbiter.yaml`, and an upgrade from the previous chart with live leases.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use arbiter::api::OLDEST_EMULATION_VERSION as OEV;

use crate::chart::run_helm;
use crate::support::agent::Agent;
use crate::support::operator::{Responder, create_candidate, wait_for_holder};
use crate::support::registry::{self, Registry};
use crate::support::{TestEnv, eventually, node, repo_root};

crate::tests![release:
    the_release_holds_every_file_for_both_platforms,
    every_archive_unpacks_in_a_shared_directory_leaving_it_as_it_was,
    a_second_release_of_the_same_commit_is_byte_for_byte_the_same,
    helm_installs_the_chart_from_the_registry_and_its_pods_pull_and_elect,
    the_all_in_one_manifest_installs_from_the_registry,
    an_upgrade_from_the_previous_chart_keeps_every_holder_and_term,
];

const VERSION: &str = env!("CARGO_PKG_VERSION");
const DEADLINE: Duration = Duration::from_secs(180);

fn dist() -> PathBuf {
    let dist = repo_root().join("dist");
    assert!(
        dist.join("SHA256SUMS").is_file(),
        "{} holds no release: run `make release`",
        dist.display()
    );
    dist
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_blob(layout: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").unwrap();
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

/// `archive` (a tar, gzipped or not) unpacked into a new temporary directory.
fn untar(archive: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(dir.path()));
    dir
}

/// The commit time `make release` stamps on every archive entry (its SOURCE_DATE_EPOCH).
fn commit_time() -> i64 {
    run(Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(repo_root()))
    .trim()
    .parse()
    .unwrap()
}

/// `tar xzf ARCHIVE` run in a directory like /tmp (sticky, world-writable), as install.md says:
/// the directory keeps its mode and is not given the archive's time; exactly `top` appeared in
/// it; every entry is owned by root, 0755 (directories, executables) or 0644, dated `mtime`.
fn unpacks_cleanly(archive: &Path, top: &[&str], executables: &[&str], mtime: i64) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let name = archive.file_name().unwrap().to_string_lossy();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let before = std::fs::metadata(shared.path()).unwrap();
    run(Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .current_dir(shared.path()));
    let after = std::fs::metadata(shared.path()).unwrap();
    assert_eq!(
        after.mode() & 0o7777,
        0o1777,
        "`tar xzf {name}` changed the mode of the directory it ran in"
    );
    assert!(
        after.mtime() >= before.mtime(),
        "`tar xzf {name}` dated the directory it ran in back to {}",
        after.mtime()
    );
    let appeared: BTreeSet<String> = std::fs::read_dir(shared.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let top: BTreeSet<String> = top.iter().map(|s| s.to_string()).collect();
    assert_eq!(appeared, top, "what `tar xzf {name}` put in the directory");
    let listing = run(Command::new("tar")
        .args(["--numeric-owner", "--full-time", "-tvzf"])
        .arg(archive));
    for line in listing.lines() {
        // drwxr-xr-x 0/0 0 2026-12-07 02:56:07 completions/
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, owner, path) = (fields[0], fields[1], fields[5]);
        assert!(
            !path.starts_with("./") && !path.starts_with('/'),
            "{name}: {line}"
        );
        assert_eq!(owner, "0/0", "{name}: {line}");
        let expected = if mode.starts_with('d') || executables.contains(&path) {
            "rwxr-xr-x"
        } else {
            "rw-r--r--"
        };
        assert_eq!(&mode[1..], expected, "{name}: {line}");
        let on_disk = std::fs::symlink_metadata(shared.path().join(path)).unwrap();
        if !on_disk.is_dir() {
            assert_eq!(
                on_disk.mtime(),
                mtime,
                "{name}: {path} is dated the commit's time"
            );
        }
    }
}

/// What `file` says of an executable.
fn file_kind(path: &Path) -> String {
    run(Command::new("file").arg("-b").arg(path))
}

/// Whether `kind` (from `file`) is a static executable for `arch`.
fn is_static_for(kind: &str, arch: &str) -> bool {
    let machine = if arch == "amd64" { "x86-64" } else { "aarch64" };
    kind.contains("ELF 64-bit")
        && kind.contains(machine)
        && (kind.contains("statically linked") || kind.contains("static-pie linked"))
}

async fn the_release_holds_every_file_for_both_platforms(_env: Arc<TestEnv>) {
    let dist = dist();
    // Every file, and their sums.
    let mut expected: BTreeSet<String> = [
        "arbiter.yaml",
        "arbiter.crds.yaml",
        "arbiter.krew.yaml",
        "arbiter.spdx.json",
        "RELEASE-NOTES.md",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    expected.insert(format!("arbiter-{VERSION}.tgz"));
    for arch in ["amd64", "arm64"] {
        expected.insert(format!("kubectl-arbiter-{VERSION}-linux-{arch}.tar.gz"));
    }
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let summed: BTreeSet<String> = sums
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert_eq!(summed, expected, "SHA256SUMS lists every published file");
    run(Command::new("sha256sum")
        .arg("--check")
        .arg("--quiet")
        .arg("SHA256SUMS")
        .current_dir(&dist));

    // The image index: both platforms, each one layer holding a static binary of its own
    // architecture, with the Dockerfile's config.
    let layout = dist.join("image");
    let top: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let tagged: Vec<&Value> = top["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["annotations"]["org.opencontainers.image.ref.name"] == VERSION)
        .collect();
    assert_eq!(tagged.len(), 1, "one index tagged {VERSION}: {top}");
    let index = json_blob(&layout, tagged[0]["digest"].as_str().unwrap());
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    for m in index["manifests"].as_array().unwrap() {
        let arch = m["platform"]["architecture"].as_str().unwrap();
        let manifest = json_blob(&layout, m["digest"].as_str().unwrap());
        let config = json_blob(&layout, manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            VERSION
        );
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        let layer = layout.join("blobs/sha256").join(
            layers[0]["digest"]
                .as_str()
                .unwrap()
                .strip_prefix("sha256:")
                .unwrap(),
        );
        let dir = untar(&layer);
        let kind = file_kind(&dir.path().join("arbiter"));
        assert!(
            is_static_for(&kind, arch),
            "{arch} image's /arbiter: {kind}"
        );
    }

    // The chart: version and appVersion are the crate's.
    let chart_yaml = run(Command::new("tar")
        .arg("-xzOf")
        .arg(dist.join(format!("arbiter-{VERSION}.tgz")))
        .arg("arbiter/Chart.yaml"));
    assert!(
        chart_yaml.contains(&format!("\nversion: {VERSION}\n")),
        "{chart_yaml}"
    );
    assert!(
        chart_yaml.contains(&format!("appVersion: {VERSION}")),
        "{chart_yaml}"
    );

    // The manifests: no test pod, no hook; the CRD alone is the committed one.
    let all_in_one = std::fs::read_to_string(dist.join("arbiter.yaml")).unwrap();
    assert!(
        !all_in_one.contains("helm.sh/hook"),
        "arbiter.yaml holds a hook"
    );
    assert!(
        !all_in_one.contains("busybox"),
        "arbiter.yaml holds the test pod"
    );
    assert!(all_in_one.contains(&format!("image: \"ghcr.io/arbiter-dev/arbiter:{VERSION}\"")));
    assert_eq!(
        std::fs::read_to_string(dist.join("arbiter.crds.yaml")).unwrap(),
        std::fs::read_to_string(repo_root().join("crds/arbiter.dev_leasecandidates.yaml")).unwrap()
    );

    // The plugin archives: the binary of their architecture, completions, the man page.
    let krew = std::fs::read_to_string(dist.join("arbiter.krew.yaml")).unwrap();
    for arch in ["amd64", "arm64"] {
        let name = format!("kubectl-arbiter-{VERSION}-linux-{arch}.tar.gz");
        let archive = dist.join(&name);
        let listing = run(Command::new("tar").arg("-tzf").arg(&archive));
        for member in [
            "kubectl-arbiter",
            "LICENSE",
            "completions/arbiter.bash",
            "completions/_arbiter",
            "completions/arbiter.fish",
            "man/arbiter.1",
        ] {
            assert!(
                listing.lines().any(|l| l == member),
                "{name} lacks {member}: {listing}"
            );
        }
        let dir = untar(&archive);
        let kind = file_kind(&dir.path().join("kubectl-arbiter"));
        assert!(is_static_for(&kind, arch), "{name}: {kind}");
        if arch == "amd64" && cfg!(target_arch = "x86_64") {
            let version = run(Command::new(dir.path().join("kubectl-arbiter")).arg("--version"));
            assert!(
                version.starts_with(&format!("arbiter {VERSION} (commit ")),
                "{version}"
            );
        }
        let man = std::fs::read_to_string(dir.path().join("man/arbiter.1")).unwrap();
        assert!(man.contains(".TH arbiter"), "a man page: {man}");
        // The krew manifest names the archive on the GitHub release, with its sum.
        let sum = run(Command::new("sha256sum").arg(&archive));
        let sum = sum.split_whitespace().next().unwrap();
        assert!(krew.contains(&format!("/v{VERSION}/{name}")), "{krew}");
        assert!(
            krew.contains(&format!("sha256: {sum}")),
            "{name}'s sum in {krew}"
        );
    }

    // The SBOM names the crates the binary is built from; the notes are this version's.
    let sbom: Value =
        serde_json::from_slice(&std::fs::read(dist.join("arbiter.spdx.json")).unwrap()).unwrap();
    assert!(sbom["spdxVersion"].as_str().unwrap().starts_with("SPDX-"));
    let packages: Vec<&str> = sbom["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for krate in ["kube", "k8s-openapi", "tokio", "semver"] {
        assert!(packages.contains(&krate), "{krate} in the SBOM");
    }
    let notes = std::fs::read_to_string(dist.join("RELEASE-NOTES.md")).unwrap();
    assert!(notes.contains("### Added"), "{notes}");
    assert!(
        !notes.contains("## ["),
        "only this version's section: {notes}"
    );
}

async fn every_archive_unpacks_in_a_shared_directory_leaving_it_as_it_was(_env: Arc<TestEnv>) {
    let dist = dist();
    let mtime = commit_time();
    for arch in ["amd64", "arm64"] {
        unpacks_cleanly(
            &dist.join(format!("kubectl-arbiter-{VERSION}-linux-{arch}.tar.gz")),
            &["kubectl-arbiter", "LICENSE", "completions", "man"],
            &["kubectl-arbiter"],
            mtime,
        );
    }
    unpacks_cleanly(
        &dist.join(format!("arbiter-{VERSION}.tgz")),
        &["arbiter"],
        &[],
        mtime,
    );
}

/// `make release` run again on the same commit (into another directory) writes the same bytes:
/// every file SHA256SUMS lists, and the image index (its digest names every blob).
async fn a_second_release_of_the_same_commit_is_byte_for_byte_the_same(_env: Arc<TestEnv>) {
    let dist = dist();
    let again = tempfile::tempdir().unwrap();
    run(Command::new(repo_root().join("release/dist.sh"))
        .env("VERSION", VERSION)
        .env("DIST", again.path())
        .env_remove("SOURCE_DATE_EPOCH")
        .current_dir(repo_root()));
    let sums = |dir: &Path| std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    assert_eq!(sums(&dist), sums(again.path()), "SHA256SUMS of two runs");
    let index = |dir: &Path| std::fs::read(dir.join("image/index.json")).unwrap();
    assert_eq!(
        index(&dist),
        index(again.path()),
        "the image index of two runs"
    );
}

/// `--set` arguments that place the operator on the real node, confined to `env`'s namespace:
/// one replica (the real node is shared with the other tests; two replicas' pulls and starts
/// prove nothing more here, and the upgrade still hands the operator over from pod to pod).
fn on_the_node(env: &TestEnv) -> Vec<String> {
    [
        "replicaCount=1".to_string(),
        "crds.install=false".into(),
        format!("operator.watchNamespace={}", env.ns),
        "nodeSelector.type=real".into(),
        "tolerations[0].key=arbiter.dev/real-node".into(),
        "tolerations[0].operator=Exists".into(),
        "image.pullPolicy=IfNotPresent".into(),
    ]
    .into_iter()
    .flat_map(|s| ["--set".to_string(), s])
    .collect()
}

fn helm(env: &TestEnv, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_helm(Some(&env.kubeconfig), &args)
}

/// The operator's pod (one replica): Ready on the real node, running `image`, pulled (the
/// runtime reports the image by the registry's digest).
async fn pods_pulled_and_ready(env: &TestEnv, selector: &str, image: &str, reg: &Registry) {
    let pods: Api<Pod> = env.api();
    let lp = ListParams::default().labels(selector);
    eventually(
        "the operator's pods to pull and be Ready",
        DEADLINE,
        || async {
            let list = pods.list(&lp).await.ok()?;
            let ready = list.items.iter().filter(|p| {
                let spec = p.spec.as_ref().unwrap();
                let status = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref());
                spec.node_name.as_deref() == Some(node::NAME)
                    && spec.containers[0].image.as_deref() == Some(image)
                    && status.is_some_and(|s| s[0].ready && s[0].image_id.contains(&reg.host))
            });
            (ready.count() == 1).then_some(())
        },
    )
    .await;
}

/// A candidate, answered by a stand-in, elected on `lease`: the operator works.
async fn elects(env: &TestEnv, lease: &str) {
    let _r = Responder::start(env.client.clone(), &env.ns, &["c1"]);
    create_candidate(env, "c1", lease, "1.31.0", Some("1.31.0"), OEV, None).await;
    wait_for_holder(env, lease, "c1", DEADLINE).await;
}

async fn helm_installs_the_chart_from_the_registry_and_its_pods_pull_and_elect(env: Arc<TestEnv>) {
    node::ready(&env).await;
    let reg = registry::get(&node::cluster_dir(&env.kubeconfig));
    let release = env.release("reg");
    let mut args: Vec<String> = ["install", &release, &reg.chart(), "--version", VERSION]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["-n".into(), env.ns.clone(), "--plain-http".into()]);
    args.extend(["--set".into(), format!("image.registry={}", reg.host)]);
    args.extend(on_the_node(&env));
    args.extend(["--wait", "--timeout", "180s"].map(String::from));
    helm(&env, &args);
    let image = format!("{}/arbiter:{VERSION}", reg.path());
    pods_pulled_and_ready(
        &env,
        &format!("app.kubernetes.io/instance={release}"),
        &image,
        reg,
    )
    .await;
    elects(&env, "from-registry").await;
    helm(
        &env,
        &[
            "uninstall".into(),
            release,
            "-n".into(),
            env.ns.clone(),
            "--wait".into(),
        ],
    );
}

/// `dist/arbiter.yaml` for `env`'s namespace: its own namespace and the CRD left out (the suite
/// shares both), the image from the registry, the operator confined to the namespace and on the
/// real node. Everything else as released.
fn all_in_one_for(env: &TestEnv, reg: &Registry) -> String {
    let text = std::fs::read_to_string(dist().join("arbiter.yaml")).unwrap();
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut doc: Value = serde::Deserialize::deserialize(doc).unwrap();
        match doc["kind"].as_str() {
            None | Some("Namespace" | "CustomResourceDefinition") => continue,
            _ => {}
        }
        if doc["metadata"]["namespace"] == "arbiter-system" {
            doc["metadata"]["namespace"] = env.ns.clone().into();
        }
        let subjects = doc.get_mut("subjects").and_then(Value::as_array_mut);
        for s in subjects.into_iter().flatten() {
            s["namespace"] = env.ns.clone().into();
        }
        // The injection webhook (cluster-wide as released) for this namespace's pods only: other
        // tests' labelled pods must not be sent to it.
        if doc["kind"] == "MutatingWebhookConfiguration" {
            for w in doc["webhooks"].as_array_mut().unwrap() {
                w["clientConfig"]["service"]["namespace"] = env.ns.clone().into();
                w["namespaceSelector"] =
                    json!({"matchLabels": {"kubernetes.io/metadata.name": env.ns.clone()}});
            }
        }
        if doc["kind"] == "Deployment" {
            let spec = &mut doc["spec"]["template"]["spec"];
            for (k, v) in node::placement().as_object().unwrap() {
                spec[k] = v.clone();
            }
            doc["spec"]["replicas"] = 1.into();
            let spec = &mut doc["spec"]["template"]["spec"];
            let c = &mut spec["containers"][0];
            let released = format!("ghcr.io/arbiter-dev/arbiter:{VERSION}");
            assert_eq!(c["image"], released.as_str());
            c["image"] = format!("{}/arbiter:{VERSION}", reg.path()).into();
            let args = c["args"].as_array_mut().unwrap();
            for a in args.iter_mut() {
                if a.as_str().is_some_and(|a| a.starts_with("--inject-image=")) {
                    *a = format!("--inject-image={}/arbiter:{VERSION}", reg.path()).into();
                }
            }
            args.push(format!("--watch-namespace={}", env.ns).into());
        }
        docs.push(serde_yaml_ng::to_string(&doc).unwrap());
    }
    docs.join("---\n")
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    run(Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig))
}

async fn the_all_in_one_manifest_installs_from_the_registry(env: Arc<TestEnv>) {
    node::ready(&env).await;
    let reg = registry::get(&node::cluster_dir(&env.kubeconfig));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), all_in_one_for(&env, reg)).unwrap();
    let path = file.path().to_str().unwrap();
    kubectl(&env, &["apply", "--server-side", "-f", path]);
    let image = format!("{}/arbiter:{VERSION}", reg.path());
    pods_pulled_and_ready(&env, "app.kubernetes.io/instance=arbiter", &image, reg).await;
    elects(&env, "from-manifest").await;
    kubectl(&env, &["delete", "--wait", "-f", path]);
}

/// The chart users had before this release, packaged (`e2e/fixtures/previous-chart.tgz`; see
/// its README).
fn previous_chart() -> PathBuf {
    repo_root().join("e2e/fixtures/previous-chart.tgz")
}

/// Every (holder, term) a lease's records showed, as the watch delivered them.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<i32>)>>>;

fn record_leases(env: &TestEnv) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Default::default();
    let api: Api<Lease> = env.api();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(
            api,
            watcher::Config::default().labels("arbiter.dev/managed"),
        )
        .applied_objects()
        .boxed();
        while let Some(Ok(l)) = events.next().await {
            let spec = l.spec.clone().unwrap_or_default();
            out.lock()
                .unwrap()
                .push((l.name_any(), spec.holder_identity, spec.lease_transitions));
        }
    });
    (seen, task)
}

async fn an_upgrade_from_the_previous_chart_keeps_every_holder_and_term(env: Arc<TestEnv>) {
    node::ready(&env).await;
    let reg = registry::get(&node::cluster_dir(&env.kubeconfig));
    let release = env.release("up");
    let instance = format!("app.kubernetes.io/instance={release}");
    let ns = env.ns.clone();
    // The previous chart names its image by repository and tag only.
    let mut args: Vec<String> = vec![
        "install".into(),
        release.clone(),
        previous_chart().display().to_string(),
    ];
    args.extend(["-n".into(), ns.clone()]);
    args.extend([
        "--set".into(),
        format!("image.repository={}/arbiter", reg.path()),
    ]);
    args.extend(["--set".into(), format!("image.tag={VERSION}")]);
    args.extend(on_the_node(&env));
    args.extend(["--wait", "--timeout", "180s"].map(String::from));
    helm(&env, &args);

    // Two leases held by real agents, renewing.
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|lease| {
            let who = format!("{lease}-1");
            Agent::spawn(
                &env.kubeconfig,
                &ns,
                &who,
                lease,
                "1.31.0",
                &dir.path().join(&who),
            )
        })
        .collect();
    let mut before = Vec::new();
    for a in &agents {
        let lease = &a.identity[..1];
        let l = wait_for_holder(&env, lease, &a.identity, DEADLINE).await;
        before.push((
            lease.to_string(),
            a.identity.clone(),
            l.spec.unwrap().lease_transitions,
        ));
    }
    let (seen, watch) = record_leases(&env);

    // The upgrade replaces the operator's pod (a pod annotation changes): the new one starts,
    // the old one releases the operators' HA lease as it stops.
    let pods: Api<Pod> = env.api();
    let old: BTreeSet<String> = pods
        .list(&ListParams::default().labels(&instance))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    let mut args: Vec<String> = vec![
        "upgrade".into(),
        release.clone(),
        reg.chart(),
        "--version".into(),
        VERSION.into(),
    ];
    args.extend(["-n".into(), ns.clone(), "--plain-http".into()]);
    args.extend(["--set".into(), format!("image.registry={}", reg.host)]);
    args.extend(["--set".into(), "podAnnotations.upgraded=yes".into()]);
    args.extend(on_the_node(&env));
    args.extend(["--wait", "--timeout", "180s"].map(String::from));
    helm(&env, &args);
    let deployments: Api<Deployment> = env.api();
    let d = deployments
        .get(&format!("{release}-arbiter"))
        .await
        .unwrap();
    assert_eq!(
        d.metadata.labels.unwrap()["helm.sh/chart"],
        format!("arbiter-{VERSION}"),
        "upgraded to this chart"
    );
    let image = format!("{}/arbiter:{VERSION}", reg.path());
    pods_pulled_and_ready(&env, &instance, &image, reg).await;
    // A new pod acts: it holds the operators' HA lease.
    let leases: Api<Lease> = env.api();
    let ha = format!("{release}-arbiter");
    eventually("a new operator pod to act", DEADLINE, || async {
        let holder = leases.get(&ha).await.ok()?.spec?.holder_identity?;
        (!holder.is_empty() && !old.iter().any(|o| holder.starts_with(o.as_str()))).then_some(())
    })
    .await;
    // The upgraded operator elects; and once the holders have renewed more than a lease
    // duration after it took over (when it could first judge a silent holder's term over), the
    // old leases are still held by the same holders at the same terms.
    let took_over = jiff::Timestamp::now();
    elects(&env, "after-upgrade").await;
    let later = took_over + jiff::SignedDuration::from_secs(16);
    eventually(
        "the holders to renew a lease duration after the takeover",
        DEADLINE,
        || async {
            for (lease, _, _) in &before {
                let renewed = leases.get(lease).await.ok()?.spec?.renew_time?.0;
                if renewed < later {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    for (lease, holder, term) in &before {
        let l = leases.get(lease).await.unwrap();
        let spec = l.spec.unwrap();
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(holder.as_str()),
            "{lease}"
        );
        assert_eq!(&spec.lease_transitions, term, "{lease}'s term");
    }
    watch.abort();
    let seen = seen.lock().unwrap();
    for (lease, holder, term) in &before {
        let moved: Vec<_> = seen
            .iter()
            .filter(|(l, h, t)| l == lease && (h.as_deref() != Some(holder.as_str()) || t != term))
            .collect();
        assert!(
            moved.is_empty(),
            "{lease} changed during the upgrade: {moved:?}"
        );
    }
    drop(agents);
    helm(
        &env,
        &[
            "uninstall".into(),
            release,
            "-n".into(),
            ns,
            "--wait".into(),
        ],
    );
}
