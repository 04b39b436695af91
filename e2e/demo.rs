//! `make demo`: arbiter on a local control plane, end to end, in about a minute.
//!
//! Starts the control plane, installs the Helm chart, runs the operator (as a local process with
//! the chart's ServiceAccount token: kwok runs no containers), starts three agents as stand-in
//! pods at versions 1.30.0, 1.31.0 and 1.31.0, then walks through a rolling upgrade to 1.32.0
//! and a rollback to 1.31.0, printing `arbiter status` after each step. Everything it started is
//! stopped when it ends.

#[path = "tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use support::operator::{Operator, wait_for_holder};
use support::standin::StandIn;
use support::{Cluster, TestEnv, client_for, eventually, repo_root};

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
    pod: StandIn,
    version: &'static str,
}

async fn start_replica(
    client: &Client,
    kubeconfig: &Path,
    name: &str,
    version: &'static str,
    log: &Path,
) -> Replica {
    let script = format!(
        "exec 2>/dev/null; echo \"$(date +%T) $ARBITER_IDENTITY ({version}) started, term $ARBITER_TERM\" >> {log}; \
         trap 'echo \"$(date +%T) $ARBITER_IDENTITY ({version}) stopped\" >> {log}; exit 0' TERM; \
         while :; do sleep 0.1; done",
        log = log.display()
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
        "sh",
        "-c",
        &script,
    ];
    let labels = BTreeMap::from([("app".to_string(), "payments".to_string())]);
    let envs = [
        ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ("RUST_LOG", "error"),
    ];
    let pod =
        StandIn::spawn_with_env(client.clone(), NS, name, labels, 5, ARBITER, &args, &envs).await;
    Replica { pod, version }
}

async fn replace(
    client: &Client,
    kubeconfig: &Path,
    replicas: &mut BTreeMap<String, Replica>,
    name: &str,
    version: &'static str,
    log: &Path,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    if let Some(old) = replicas.remove(name) {
        println!("replacing {name} ({} -> {version})", old.version);
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        old.pod.wait_exit(Duration::from_secs(30)).await;
        eventually(
            "the old pod to be gone",
            Duration::from_secs(30),
            || async { pods.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
    replicas.insert(
        name.into(),
        start_replica(client, kubeconfig, name, version, log).await,
    );
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
    // Let the workload log catch up with the new holder.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn main() {
    step(
        "Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)",
    );
    println!("(the first run builds Kubernetes from source: about 15 minutes on 2 cores)");
    let cluster = Cluster::start_or_reuse();
    let kubeconfig = cluster.kubeconfig.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = client_for(&kubeconfig).await;

        step("helm install arbiter charts/arbiter -n arbiter-system --create-namespace");
        helm(&kubeconfig, &["install", "arbiter", "charts/arbiter", "-n", "arbiter-system", "--create-namespace", "--wait", "--timeout", "60s"]);

        step("Running the operator with the chart's ServiceAccount (kwok runs no containers)");
        let dir = tempfile::tempdir().unwrap();
        let sa_kubeconfig = support::service_account_kubeconfig(&client, &kubeconfig, "arbiter-system", "arbiter", dir.path()).await;
        let _operator = Operator::start_args(
            &sa_kubeconfig,
            &["--namespace", "arbiter-system", "--leader-election-lease", "arbiter", "--lease-duration", "6s", "--metrics-address", "127.0.0.1:0"],
        );

        let namespaces: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(NS.into());
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
        let log = dir.path().join("workload.log");
        let mut seen = 0;

        step("Three replicas under `arbiter run`: payments-0 at 1.30.0, payments-1 and payments-2 at 1.31.0");
        let mut replicas = BTreeMap::new();
        for (name, version) in [("payments-0", "1.30.0"), ("payments-1", "1.31.0"), ("payments-2", "1.31.0")] {
            replicas.insert(name.to_string(), start_replica(&client, &kubeconfig, name, version, &log).await);
        }
        settle(&client, "payments-0").await;
        status(&kubeconfig);
        show_log(&log, &mut seen);
        println!("-> the oldest version leads; only its workload runs.");

        step("Rolling upgrade to 1.32.0, one replica at a time");
        for (name, holder) in [("payments-2", "payments-0"), ("payments-1", "payments-0")] {
            replace(&client, &kubeconfig, &mut replicas, name, "1.32.0", &log).await;
            settle(&client, holder).await;
            status(&kubeconfig);
            show_log(&log, &mut seen);
        }
        println!("-> while a 1.30.0 replica runs, no 1.32.0 replica leads.");
        replace(&client, &kubeconfig, &mut replicas, "payments-0", "1.32.0", &log).await;
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
        replace(&client, &kubeconfig, &mut replicas, &standby, "1.31.0", &log).await;
        settle(&client, &standby).await;
        status(&kubeconfig);
        show_log(&log, &mut seen);
        println!("-> the older version leads again at once: the 1.32.0 holder handed over (no lease expiry).");

        step("Cleaning up");
        drop(replicas);
        helm(&kubeconfig, &["uninstall", "arbiter", "-n", "arbiter-system"]);
    });
    drop(rt);
    drop(cluster);
    println!("\nDone: everything the demo started has stopped.");
}
