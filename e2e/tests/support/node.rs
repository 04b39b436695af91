//! The harness's real node (`e2e/cluster.sh up --node`): containerd and a kubelet running real
//! containers. It is tainted so only pods that ask land there; the images are the ones `make
//! images` builds, imported into its containerd here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::{Value, json};

use super::{TestEnv, eventually, repo_root};

/// The real node's name (e2e/node.sh).
pub const NAME: &str = "arbiter-node";
/// The image `make image` builds from the Dockerfile's final stage: the chart's default.
pub const ARBITER_IMAGE: &str = concat!("ghcr.io/arbiter-dev/arbiter:", env!("CARGO_PKG_VERSION"));
/// arbiter with busybox beside it, for `arbiter run -- sh -c ...` workloads (`make images`).
pub const AGENT_IMAGE: &str = concat!("docker.io/arbiter-e2e/agent:", env!("CARGO_PKG_VERSION"));
/// Debian's static busybox (imported by `cluster.sh up --node`).
pub const BUSYBOX_IMAGE: &str = "docker.io/arbiter-e2e/busybox:1";
/// The Go module's example manager (go/examples/manager), static (`make images`).
pub const GO_MANAGER_IMAGE: &str = concat!(
    "docker.io/arbiter-e2e/go-manager:",
    env!("CARGO_PKG_VERSION")
);

/// `helm install` arguments that run the chart's operator on the real node, from the image
/// `make image` built under the chart's default name, pulled from nowhere.
pub const CHART_ON_NODE: &[&str] = &[
    "--set",
    "image.pullPolicy=Never",
    "--set",
    "nodeSelector.type=real",
    "--set",
    "tolerations[0].key=arbiter.dev/real-node",
    "--set",
    "tolerations[0].operator=Exists",
];

/// The scheduling a pod needs to land on the real node, to merge into a pod spec.
pub fn placement() -> Value {
    json!({
        "nodeSelector": {"type": "real"},
        "tolerations": [{"key": "arbiter.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
    })
}

/// Merges `placement()` into a pod spec.
pub fn place(spec: &mut Value) {
    for (k, v) in placement().as_object().unwrap() {
        spec[k] = v.clone();
    }
}

/// The cluster directory behind a harness kubeconfig (`DIR/kubeconfig`).
pub fn cluster_dir(kubeconfig: &Path) -> PathBuf {
    kubeconfig
        .parent()
        .expect("the kubeconfig lives in the cluster directory")
        .to_path_buf()
}

/// Makes sure the node is there and holds the images built by `make images`; once per run.
pub async fn ready(env: &TestEnv) {
    static IMPORTED: OnceLock<Result<(), String>> = OnceLock::new();
    let dir = cluster_dir(&env.kubeconfig);
    let result = IMPORTED.get_or_init(|| {
        if !dir.join("node").is_dir() {
            return Err(format!(
                "the cluster at {} has no real node: start it with `e2e/cluster.sh up --node`",
                dir.display()
            ));
        }
        let images = repo_root().join("target/images");
        let tars = ["arbiter.tar", "agent.tar", "go-manager.tar"].map(|t| images.join(t));
        if let Some(missing) = tars.iter().find(|t| !t.is_file()) {
            return Err(format!(
                "{} is missing: run `make images`",
                missing.display()
            ));
        }
        let status = Command::new(repo_root().join("e2e/cluster.sh"))
            .arg("import")
            .arg(&dir)
            .args(&tars)
            .status()
            .map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("importing the images failed: {status}"))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node = nodes.get(NAME).await.expect("the real node is registered");
    let runtime = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.container_runtime_version)
        .unwrap_or_default();
    assert!(runtime.starts_with("containerd://"), "{runtime}");
}

/// A pod on the real node whose entrypoint is `arbiter ARGS...` (the agent image), with its
/// identity from the downward API (POD_NAME, POD_NAMESPACE, POD_UID), running as
/// ServiceAccount `sa`, with the host directory `shared` mounted at `/shared`.
pub fn agent_pod(name: &str, labels: Value, sa: &str, args: &[&str], shared: &Path) -> Value {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let mut spec = json!({
        "serviceAccountName": sa,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "agent", "image": AGENT_IMAGE, "imagePullPolicy": "Never",
            "args": args,
            "env": [
                {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
                {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            ],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }],
        "volumes": [{"name": "shared", "hostPath": {"path": shared.to_str().unwrap(), "type": "Directory"}}],
    });
    place(&mut spec);
    json!({"metadata": {"name": name, "labels": labels}, "spec": spec})
}

/// A host directory pods on the node can write to (they run as a non-root user).
pub fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    dir
}

/// The host pid of a container's first process (`containerd://ID` from the pod's status).
pub fn container_init_pid(kubeconfig: &Path, container_id: &str) -> Option<i32> {
    let id = container_id.trim_start_matches("containerd://");
    let sock = cluster_dir(kubeconfig).join("node/containerd.sock");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&sock)
        .args(["-n", "k8s.io", "tasks", "ls"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&id)).then(|| f.get(1)?.parse().ok())?
    })
}

/// The host pid of the first process of pod `name`'s first container (an agent pod's agent), if
/// it runs.
pub async fn first_container_pid(
    client: &kube::Client,
    ns: &str,
    kubeconfig: &Path,
    name: &str,
) -> Option<i32> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let status = pods.get(name).await.ok()?.status?;
    let id = status.container_statuses?.first()?.container_id.clone()?;
    container_init_pid(kubeconfig, &id)
}

/// The host pids of every process in a container (`containerd://ID` from the pod's status).
pub fn container_pids(env: &TestEnv, container_id: &str) -> Vec<i32> {
    let id = container_id.trim_start_matches("containerd://");
    let sock = cluster_dir(&env.kubeconfig).join("node/containerd.sock");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&sock)
        .args(["-n", "k8s.io", "tasks", "ps", id])
        .output()
        .expect("running ctr");
    assert!(
        out.status.success(),
        "ctr tasks ps {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// A ServiceAccount `agent` in `ns` with what an agent needs (the chart's candidate
/// ClusterRole's rules, as a Role).
pub async fn agent_service_account(client: &kube::Client, ns: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    let pp = PostParams::default();
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "agent"}})).unwrap();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "rules": [
            {"apiGroups": ["arbiter.dev"], "resources": ["leasecandidates"],
             "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update"]},
        ],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}],
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&pp, &sa)
        .await
        .expect("creating the agent ServiceAccount");
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &role)
        .await
        .expect("creating the agent Role");
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &binding)
        .await
        .expect("creating the agent RoleBinding");
}

/// The id of `pod`'s first container, once it runs.
pub async fn container_id(env: &TestEnv, pod: &str) -> String {
    let pods: Api<Pod> = env.api();
    eventually(
        &format!("{pod}'s container to run"),
        Duration::from_secs(90),
        || async {
            let p = pods.get(pod).await.ok()?;
            let c = p.status?.container_statuses?.into_iter().next()?;
            c.state?.running?;
            c.container_id
        },
    )
    .await
}
