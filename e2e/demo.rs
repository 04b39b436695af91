//! `make demo`: arbiter on a local control plane, end to end, in about a minute.
//!
//! Starts the control plane with a real node (containerd and a kubelet) and an OCI registry on
//! 127.0.0.1 holding the release `make release` built, installs the Helm chart from that
//! registry (the operator runs in two pods, their image pulled from it), starts three pods whose
//! entrypoint is `arbiter run` at versions 1.30.0, 1.31.0 and 1.31.0, then walks through a
//! rolling upgrade to 1.32.0 and a rollback to 1.31.0 that replace those pods, printing
//! `arbiter status` after each step. Then a busybox Deployment labelled `arbiter.dev/inject`
//! gets the agent injected: one replica writes, and its deletion moves the work. Everything it
//! started is stopped when it ends.

#[path = "tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::operator::wait_for_holder;
use support::{Cluster, TestEnv, client_for, eventually, node, repo_root};

const NS: &str = "demo";
const LEASE: &str = "payments-controller";
const ARBITER: &str = env!("CARGO_BIN_EXE_arbiter");

fn step(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn status(kubeconfig: &Path) {
    let out = Command::new(ARBITER)
        .args(["status", "-n", NS])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

fn helm(kubeconfig: &Path, args: &[&str]) {
    let bin = Command::new(repo_root().join("e2e/cluster.sh"))
        .arg("build")
        .output()
        .unwrap();
    let helm = PathBuf::from(String::from_utf8(bin.stdout).unwrap().trim()).join("helm");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(helm)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", dir.path())
        .env("HELM_CONFIG_HOME", dir.path())
        .env("HELM_DATA_HOME", dir.path())
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Replica {
    version: &'static str,
}

/// A pod on the real node running `arbiter run` at `version`; its workload logs to the shared
/// host directory.
async fn start_replica(client: &Client, name: &str, version: &'static str) -> Replica {
    // `$(date +%T)` is left alone by the kubelet (not a `$(VAR)` reference).
    let script = format!(
        "exec 2>/dev/null; echo \"$(date +%T) $ARBITER_IDENTITY ({version}) started, term $ARBITER_TERM\" >> /shared/workload.log; \
         trap 'echo \"$(date +%T) $ARBITER_IDENTITY ({version}) stopped\" >> /shared/workload.log; exit 0' TERM; \
         while :; do sleep 0.1; done"
    );
    let args = [
        "run",
        "--lease",
        LEASE,
        "--binary-version",
        version,
        "--lease-duration",
        "6s",
        "--renew-deadline",
        "3s",
        "--retry-period",
        "1s",
        "--kill-grace",
        "1s",
        "--",
        "/bin/sh",
        "-c",
        &script,
    ];
    let shared = SHARED.get().unwrap();
    let mut pod = node::agent_pod(
        name,
        json!({"app": "payments"}),
        "payments",
        &args,
        shared.path(),
    );
    // As a Deployment's pods: an agent exits after handing over (or losing) its term, and the
    // kubelet starts it again as a standby.
    pod["spec"]["restartPolicy"] = json!("Always");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    Replica { version }
}

/// The host directory the replicas' workloads log to.
static SHARED: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();

async fn replace(
    client: &Client,
    replicas: &mut BTreeMap<String, Replica>,
    name: &str,
    version: &'static str,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    if let Some(old) = replicas.remove(name) {
        println!("replacing {name} ({} -> {version})", old.version);
        // The kubelet sends the agent SIGTERM: it stops its workload, releases if it led, exits.
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        eventually(
            "the old pod to be gone",
            Duration::from_secs(30),
            || async { pods.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
    replicas.insert(name.into(), start_replica(client, name, version).await);
}

fn show_log(log: &Path, from: &mut usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines().skip(*from) {
        println!("  workload: {line}");
        *from += 1;
    }
}

async fn settle(client: &Client, holder: &str) {
    let env = TestEnv {
        client: client.clone(),
        ns: NS.into(),
        kubeconfig: PathBuf::new(),
    };
    wait_for_holder(&env, LEASE, holder, Duration::from_secs(60)).await;
    // Every replica has registered (a replaced pod's agent takes a moment to start).
    let candidates: Api<arbiter::api::LeaseCandidate> = Api::namespaced(client.clone(), NS);
    eventually("three candidates", Duration::from_secs(60), || async {
        (candidates.list(&Default::default()).await.ok()?.items.len() == 3).then_some(())
    })
    .await;
    // Let the workload log catch up with the new holder.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// A busybox Deployment whose pods carry `arbiter.dev/inject: "true"`: the webhook wraps its
/// command in the agent, the operator binds the agent's rights; one replica's command runs.
async fn inject_demo(client: &Client, kubeconfig: &Path) {
    use k8s_openapi::api::apps::v1::Deployment;
    let log = "/shared/worker.log";
    let mut spec = json!({
        "serviceAccountName": "worker",
        "containers": [{
            "name": "worker", "image": node::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c",
                format!("while :; do echo \"$POD_NAME term $ARBITER_TERM\" >> {log}; sleep 1; done")],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }],
        "volumes": [{"name": "shared", "hostPath": {"path": SHARED.get().unwrap().path().to_str().unwrap(), "type": "Directory"}}],
    });
    node::place(&mut spec);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "worker"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "worker"}},
            "template": {
                "metadata": {"labels": {"app": "worker", "arbiter.dev/inject": "true",
                                        "app.kubernetes.io/version": "1.0.0"}},
                "spec": spec,
            },
        },
    }))
    .unwrap();
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "worker"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NS);
    let holder = eventually(
        "a holder of lease worker",
        Duration::from_secs(90),
        || async { arbiter::lease::holder(&leases.get("worker").await.ok()?).map(str::to_string) },
    )
    .await;
    Command::new("kubectl")
        .args(["get", "pods", "-n", NS, "-l", "app=worker", "-o",
               "custom-columns=POD:.metadata.name,INIT:.spec.initContainers[*].name,COMMAND:.spec.containers[0].command[0]"])
        .env("KUBECONFIG", kubeconfig)
        .status()
        .unwrap();
    status(kubeconfig);
    let shared = SHARED.get().unwrap().path().join("worker.log");
    let lines = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for line in lines(&shared).lines().rev().take(3) {
        println!("  worker.log: {line}");
    }
    println!(
        "-> every pod has the init container and runs /arbiter-bin/arbiter; only {holder} writes."
    );

    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(&holder, &DeleteParams::default())
        .await
        .unwrap();
    let next = eventually("another holder", Duration::from_secs(60), || async {
        arbiter::lease::holder(&leases.get("worker").await.ok()?)
            .filter(|h| *h != holder)
            .map(str::to_string)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    status(kubeconfig);
    for line in lines(&shared).lines().rev().take(3) {
        println!("  worker.log: {line}");
    }
    println!("-> {holder} deleted: its command stopped, and {next} took over at a new term.");

    let bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bare", "labels": {"arbiter.dev/inject": "true", "app.kubernetes.io/version": "1.0.0"},
                     "annotations": {"arbiter.dev/lease-name": "bare"}},
        "spec": {"containers": [{"name": "c", "image": node::BUSYBOX_IMAGE}]},
    }))
    .unwrap();
    let refused = Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &bare)
        .await
        .unwrap_err();
    println!("-> a pod whose command is its image's entrypoint is refused:\n  {refused}");
}

fn main() {
    step(
        "Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler) and a real node (containerd, kubelet)",
    );
    println!("(the first run builds Kubernetes from source: about 15 minutes on 2 cores)");
    let images = repo_root().join("target/images");
    assert!(
        images.join("agent.tar").is_file(),
        "run `make images` first (`make demo` does)"
    );
    let cluster = Cluster::start_or_reuse_with_node();
    let kubeconfig = cluster.kubeconfig.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = client_for(&kubeconfig).await;

        node::ready(&TestEnv { client: client.clone(), ns: NS.into(), kubeconfig: kubeconfig.clone() }).await;

        let registry = support::registry::get(kubeconfig.parent().unwrap());
        let chart = registry.chart();
        let version = env!("CARGO_PKG_VERSION");
        let image_registry = format!("image.registry={}", registry.host);
        step(&format!("helm install arbiter {chart} --version {version} --set {image_registry} -n arbiter-system --create-namespace  (on the real node)"));
        helm(&kubeconfig, &["install", "arbiter", &chart, "--version", version, "--plain-http",
            "-n", "arbiter-system", "--create-namespace",
            "--set", &image_registry, "--set", "nodeSelector.type=real",
            "--set", "tolerations[0].key=arbiter.dev/real-node", "--set", "tolerations[0].operator=Exists",
            "--set", "operator.leaseDuration=6s", "--wait", "--timeout", "120s"]);
        Command::new("kubectl").args(["get", "pods", "-n", "arbiter-system", "-o", "wide"]).env("KUBECONFIG", &kubeconfig).status().unwrap();
        println!("-> two operator pods, their image pulled from the local registry; one leads, one stands by.");

        let namespaces: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(NS.into());
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
        // The replicas' identity: a ServiceAccount bound to the chart's agent ClusterRole.
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "payments"}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), NS).create(&PostParams::default(), &sa).await.unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "payments-arbiter-candidate"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "arbiter-candidate"},
            "subjects": [{"kind": "ServiceAccount", "name": "payments", "namespace": NS}],
        })).unwrap();
        Api::<RoleBinding>::namespaced(client.clone(), NS).create(&PostParams::default(), &binding).await.unwrap();
        SHARED.set(node::shared_dir()).ok();
        let log = SHARED.get().unwrap().path().join("workload.log");
        let mut seen = 0;

        step("Three pods running `arbiter run`: payments-0 at 1.30.0, payments-1 and payments-2 at 1.31.0");
        let mut replicas = BTreeMap::new();
        for (name, version) in [("payments-0", "1.30.0"), ("payments-1", "1.31.0"), ("payments-2", "1.31.0")] {
            replicas.insert(name.to_string(), start_replica(&client, name, version).await);
        }
        settle(&client, "payments-0").await;
        status(&kubeconfig);
        show_log(&log, &mut seen);
        println!("-> the oldest version leads; only its workload runs.");

        step("Rolling upgrade to 1.32.0, one replica at a time");
        for (name, holder) in [("payments-2", "payments-0"), ("payments-1", "payments-0")] {
            replace(&client, &mut replicas, name, "1.32.0").await;
            settle(&client, holder).await;
            status(&kubeconfig);
            show_log(&log, &mut seen);
        }
        println!("-> while a 1.30.0 replica runs, no 1.32.0 replica leads.");
        replace(&client, &mut replicas, "payments-0", "1.32.0").await;
        let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), NS);
        let holder = eventually("a 1.32.0 holder", Duration::from_secs(60), || async {
            let l = api.get(LEASE).await.ok()?;
            arbiter::lease::holder(&l).filter(|h| *h != "payments-0").map(str::to_string)
        })
        .await;
        settle(&client, &holder).await;
        status(&kubeconfig);
        show_log(&log, &mut seen);
        println!("-> the last old replica went away; a 1.32.0 replica leads at a new term.");

        step("Rollback to 1.31.0: the first 1.31.0 replica takes over by handover");
        let standby = replicas.keys().find(|n| **n != holder).unwrap().clone();
        replace(&client, &mut replicas, &standby, "1.31.0").await;
        settle(&client, &standby).await;
        status(&kubeconfig);
        show_log(&log, &mut seen);
        println!("-> the older version leads again at once: the 1.32.0 holder handed over (no lease expiry).");

        step("Injection: a Deployment of three busybox replicas labelled arbiter.dev/inject=true, image unchanged");
        inject_demo(&client, &kubeconfig).await;

        step("Cleaning up");
        Api::<Namespace>::all(client.clone()).delete(NS, &DeleteParams::default()).await.unwrap();
        eventually("the replicas' pods to stop", Duration::from_secs(60), || async {
            let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
            pods.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
        drop(replicas);
        helm(&kubeconfig, &["uninstall", "arbiter", "-n", "arbiter-system"]);
    });
    drop(rt);
    drop(cluster);
    println!("\nDone: everything the demo started has stopped.");
}
