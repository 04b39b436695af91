//! The Go module's example controller-runtime manager (go/examples/manager) as real processes:
//! leader election by `arbiterlock`, a reconcile loop that logs every reconcile with its term.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The manager's timings in the tests: the agents' (lease 10 s, renew deadline 5 s, retry 1 s).
pub const TIMINGS: [&str; 6] = [
    "--lease-duration",
    "10s",
    "--renew-deadline",
    "5s",
    "--retry-period",
    "1s",
];

/// The example manager's binary, built once per test run with `go build` (the Go build cache
/// makes it seconds when nothing changed).
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("manager"))
}

/// The plain client-go example's binary (go/examples/clientgo), built likewise.
pub fn clientgo_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("clientgo"))
}

fn build(example: &str) -> PathBuf {
    let root = super::repo_root();
    let out = root.join(format!("target/go/example-{example}"));
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(format!("./examples/{example}"))
        .current_dir(root.join("go"))
        .status()
        .expect("running go build (is Go installed? `make setup`)");
    assert!(status.success(), "go build of go/examples/{example} failed");
    out
}

/// A free port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One replica of the example manager.
pub struct GoManager {
    pub child: Child,
    pub identity: String,
    /// Its own log (stdout and stderr), printed when a test fails.
    pub log: PathBuf,
    pub probe_port: u16,
    pub webhook_port: u16,
}

impl GoManager {
    /// A replica `identity` at `version` of lease `lease` in `ns`, appending start, work and
    /// stop lines to `events`, with `extra` flags.
    pub fn spawn(
        kubeconfig: &Path,
        ns: &str,
        identity: &str,
        lease: &str,
        version: &str,
        events: &Path,
        extra: &[&str],
    ) -> GoManager {
        let log = events.with_extension(format!("{identity}.manager.log"));
        let out = std::fs::File::create(&log).unwrap();
        let (probe_port, webhook_port) = (free_port(), free_port());
        let child = Command::new(binary())
            .args(["--namespace", ns, "--identity", identity, "--lease", lease])
            .args(["--binary-version", version, "--config-map", lease])
            .arg("--log")
            .arg(events)
            .args(["--probe-addr", &format!("127.0.0.1:{probe_port}")])
            .args(["--webhook-port", &webhook_port.to_string()])
            .args(TIMINGS)
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting the example manager");
        GoManager {
            child,
            identity: identity.into(),
            log,
            probe_port,
            webhook_port,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the manager to exit; its exit code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let what = format!("manager {}", self.identity);
        super::wait_child(&mut self.child, deadline, || what.clone()).await
    }

    /// Its own log so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The HTTP status of its `/readyz`.
    pub async fn ready(&self) -> Option<u16> {
        let url = format!("http://127.0.0.1:{}/readyz", self.probe_port);
        curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &url])
            .await
            .and_then(|s| s.parse().ok())
    }

    /// Its validating webhook's answer to an AdmissionReview of a ConfigMap (the message,
    /// which names the replica that answered).
    pub async fn admit(&self) -> Option<String> {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "1", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            },
        });
        let url = format!("https://127.0.0.1:{}/validate-configmap", self.webhook_port);
        let body = review.to_string();
        let out = curl(&[
            "-sk",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &url,
        ])
        .await?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        (v["response"]["allowed"] == true)
            .then(|| {
                v["response"]["status"]["message"]
                    .as_str()
                    .map(str::to_string)
            })
            .flatten()
    }
}

async fn curl(args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("curl")
        .args(["--max-time", "5"])
        .args(args)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Drop for GoManager {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- manager {} log ---\n{}", self.identity, self.output());
        }
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A reconcile: who, at which term, from when to when (seconds since the epoch).
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    pub id: String,
    pub term: i32,
    pub from: f64,
    pub to: f64,
}

/// Every reconcile logged in `events`, in start order.
pub fn works(events: &Path) -> Vec<Work> {
    let text = std::fs::read_to_string(events).unwrap_or_default();
    let mut works: Vec<Work> = text
        .lines()
        .filter_map(
            |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["work", id, term, from, to] => Some(Work {
                    id: id.to_string(),
                    term: term.parse().ok()?,
                    from: from.parse().ok()?,
                    to: to.parse().ok()?,
                }),
                _ => None,
            },
        )
        .collect();
    works.sort_by(|a, b| a.from.total_cmp(&b.from));
    works
}

/// Fails if two replicas' reconciles overlap in time, or a reconcile carries a term lower than
/// one that ran before it.
pub fn assert_one_at_a_time(works: &[Work]) {
    // The latest end of each replica's reconciles so far (in start order).
    let mut ends: std::collections::BTreeMap<&str, &Work> = Default::default();
    let mut highest: Option<&Work> = None;
    for w in works {
        for (id, prev) in &ends {
            assert!(
                *id == w.id || w.from >= prev.to,
                "two replicas reconciled at once: {prev:?} and {w:?}"
            );
        }
        if let Some(h) = highest {
            assert!(w.term >= h.term, "a term went down: {h:?} then {w:?}");
        }
        if ends.get(w.id.as_str()).is_none_or(|p| w.to > p.to) {
            ends.insert(&w.id, w);
        }
        highest = Some(w);
    }
}

/// The last reconcile of `id`, and the first of `id`.
pub fn last_work_of(works: &[Work], id: &str) -> Option<Work> {
    works.iter().rfind(|w| w.id == id).cloned()
}

pub fn first_work_of(works: &[Work], id: &str) -> Option<Work> {
    works.iter().find(|w| w.id == id).cloned()
}
