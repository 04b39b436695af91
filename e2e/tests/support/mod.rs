//! What every end-to-end test needs: the shared cluster, a namespace of its own, polling.

pub mod agent;
pub mod go_manager;
pub mod node;
pub mod operator;
pub mod registry;
pub mod standin;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The repository root (where `e2e/cluster.sh` lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cluster all tests share. Started by `e2e/cluster.sh up` and stopped on drop, unless
/// `ARBITER_E2E_KUBECONFIG` names one that is already running (then it is left alone).
pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// The directory `cluster.sh up` made, when this process started the cluster.
    owned_dir: Option<PathBuf>,
}

impl Cluster {
    /// A cluster without the real node (chaos, bench).
    #[allow(dead_code)] // used by the chaos and bench binaries only
    pub fn start_or_reuse() -> Cluster {
        Self::start(false)
    }

    /// A cluster with the real node (`cluster.sh up --node`): the e2e suite and the demo.
    pub fn start_or_reuse_with_node() -> Cluster {
        Self::start(true)
    }

    fn start(node: bool) -> Cluster {
        if let Some(path) = std::env::var_os("ARBITER_E2E_KUBECONFIG") {
            return Cluster {
                kubeconfig: path.into(),
                owned_dir: None,
            };
        }
        let script = repo_root().join("e2e/cluster.sh");
        let out = Command::new(&script)
            .arg("up")
            .args(node.then_some("--node"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "e2e/cluster.sh up failed ({})",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let var = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("cluster.sh up printed no {name}: {stdout}"))
        };
        Cluster {
            kubeconfig: var("KUBECONFIG"),
            owned_dir: Some(var("ARBITER_E2E_DIR")),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(dir) = &self.owned_dir {
            let status = Command::new(repo_root().join("e2e/cluster.sh"))
                .arg("down")
                .arg(dir)
                .status();
            if !matches!(status, Ok(s) if s.success()) {
                eprintln!(
                    "warning: e2e/cluster.sh down {} failed: {status:?}",
                    dir.display()
                );
            }
        }
    }
}

/// A client for the kubeconfig at `path`.
pub async fn client_for(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("reading kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("building a client")
}

/// Creates namespace `name`.
pub async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut obj = Namespace::default();
    obj.metadata.name = Some(name.to_string());
    namespaces
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// One test's world: an admin client and a fresh namespace, deleted when the test ends.
pub struct TestEnv {
    pub client: Client,
    pub ns: String,
    pub kubeconfig: PathBuf,
}

impl TestEnv {
    pub async fn new(kubeconfig: &Path, test_name: &str) -> TestEnv {
        let client = client_for(kubeconfig).await;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let prefix: String = test_name
            .replace("::", "-")
            .replace('_', "-")
            .chars()
            .take(40)
            .collect();
        let ns = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        create_namespace(&client, &ns).await;
        TestEnv {
            client,
            ns,
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// A Helm release name for this test: `prefix`, the process and this test's number (its
    /// namespace's last two parts). A chart's cluster-scoped objects carry the release name, so
    /// two tests (or two copies of one, `ARBITER_E2E_REPEAT`) never share one.
    pub fn release(&self, prefix: &str) -> String {
        let mut parts = self.ns.rsplit('-');
        let (n, pid) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        format!("{prefix}{pid}x{n}")
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn cleanup(self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces
            .delete(&self.ns, &DeleteParams::background())
            .await;
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics with `what` after `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The (reason, message) of every Event about the object named `name` in the test namespace.
/// GETs `path` from the HTTP server a process logged as serving `marker` (`... serving
/// /metrics address=HOST:PORT`), once its log `logs()` shows it; the whole response.
pub async fn get_from_logged(logs: impl Fn() -> String, marker: &str, path: &str) -> String {
    let addr = eventually(
        &format!("the address of {marker}"),
        Duration::from_secs(30),
        || async {
            let logs = logs();
            let line = logs.lines().find(|l| l.contains(marker))?;
            operator::strip_ansi(line)
                .split("address=")
                .nth(1)
                .map(|a| a.split_whitespace().next().unwrap().to_string())
        },
    )
    .await;
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {marker} at {addr}: {e}"));
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

pub async fn events_for(env: &TestEnv, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::core::v1::Event> = env.api();
    let list = api.list(&Default::default()).await.expect("listing events");
    list.items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// Waits for an Event with `reason` on the object named `name`; its message.
pub async fn wait_for_event(env: &TestEnv, name: &str, reason: &str, deadline: Duration) -> String {
    eventually(&format!("a {reason} event on {name}"), deadline, || async {
        events_for(env, name)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, m)| m)
    })
    .await
}

/// Waits for `child` to exit (panicking with `what` after `deadline`); its exit code.
pub async fn wait_child(
    child: &mut std::process::Child,
    deadline: Duration,
    what: impl Fn() -> String,
) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("polling a child process") {
            return status.code();
        }
        assert!(
            start.elapsed() < deadline,
            "{} still running after {deadline:?}",
            what()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A kubeconfig like `admin`'s, authenticated as ServiceAccount `sa` of `ns` (a real,
/// RBAC-limited token), written into `dir`.
pub async fn service_account_kubeconfig(
    client: &Client,
    admin: &Path,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a status")
        .token;
    let text = std::fs::read_to_string(admin).expect("reading the admin kubeconfig");
    let admin_token = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("a token in the kubeconfig");
    let out = dir.join(format!("kubeconfig-{sa}"));
    std::fs::write(&out, text.replace(admin_token, &token)).expect("writing a kubeconfig");
    out
}

/// A row of the metric table of docs/reference/observability.md (between `<!-- metrics:begin -->` and
/// `<!-- metrics:end -->`): the name users query, its type, whether it has labels.
#[allow(dead_code)] // used by some test binaries only
pub struct DocumentedMetric {
    pub name: String,
    pub kind: String,
    pub labelled: bool,
}

#[allow(dead_code)] // used by some test binaries only
impl DocumentedMetric {
    /// The family the `# TYPE` line names: a counter's samples carry `_total`, it does not.
    pub fn family(&self) -> &str {
        match self.kind.as_str() {
            "counter" => self.name.strip_suffix("_total").unwrap_or(&self.name),
            _ => &self.name,
        }
    }
}

/// The metric table of docs/reference/observability.md.
#[allow(dead_code)] // used by some test binaries only
pub fn documented_metrics() -> Vec<DocumentedMetric> {
    let docs =
        std::fs::read_to_string(repo_root().join("docs/reference/observability.md")).unwrap();
    let table = docs
        .split("<!-- metrics:begin -->")
        .nth(1)
        .and_then(|t| t.split("<!-- metrics:end -->").next())
        .expect("the metric table in docs/reference/observability.md");
    let rows: Vec<DocumentedMetric> = table
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let name = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            Some(DocumentedMetric {
                name: name.to_string(),
                kind: cells.get(1)?.to_string(),
                labelled: !cells.get(2)?.is_empty(),
            })
        })
        .collect();
    assert!(
        rows.len() > 10,
        "the metric table in docs/reference/observability.md was not parsed"
    );
    rows
}
