//! An OCI registry on 127.0.0.1 (`crane registry serve`, built from go-containerregistry's
//! module by `e2e/cluster.sh tool crane`), holding the release `make release` wrote to `dist/`,
//! pushed there by `make publish`, the real node's containerd told to pull from it over plain
//! HTTP. Started once per suite, by the first test that asks for it, and ended with the suite.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::repo_root;

/// The registry, as `HOST:PORT`, with the release pushed under `HOST:PORT/arbiter-dev`.
pub struct Registry {
    pub host: String,
}

impl Registry {
    /// Where `make publish` put the release: `HOST:PORT/arbiter-dev`.
    pub fn path(&self) -> String {
        format!("{}/arbiter-dev", self.host)
    }

    /// The chart, for `helm install`.
    pub fn chart(&self) -> String {
        format!("oci://{}/charts/arbiter", self.path())
    }
}

/// The suite's registry, started and filled on first use; `cluster_dir` is the harness cluster
/// whose real node pulls from it. Panics with the reason if it cannot be.
pub fn get(cluster_dir: &Path) -> &'static Registry {
    static REGISTRY: OnceLock<Result<Registry, String>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| start(cluster_dir))
        .as_ref()
        .unwrap_or_else(|e| panic!("the local registry: {e}"))
}

fn start(cluster_dir: &Path) -> Result<Registry, String> {
    let dist = repo_root().join("dist");
    if !dist.join("image/index.json").is_file() {
        return Err(format!(
            "{} holds no release: run `make release`",
            dist.display()
        ));
    }
    let crane = tool("crane")?;
    let disk = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    // A thread of its own starts the registry and outlives every test: the registry gets a
    // SIGKILL when that thread's process exits (PR_SET_PDEATHSIG follows the spawning thread).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut cmd = Command::new(&crane);
        cmd.args(["registry", "serve", "--address", "127.0.0.1:0", "--disk"])
            .arg(&disk)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(format!("starting {}: {e}", crane.display())));
                return;
            }
        };
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut sent = false;
        for line in stderr.lines().map_while(Result::ok) {
            if !sent && let Some(port) = line.split("serving on port ").nth(1) {
                let _ = tx.send(Ok(port.trim().to_string()));
                sent = true;
            }
        }
        if !sent {
            let _ = tx.send(Err(format!(
                "crane registry serve exited: {:?}",
                child.wait()
            )));
        }
        std::thread::park();
    });
    let port = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| format!("no port from crane registry serve: {e}"))??;
    let host = format!("127.0.0.1:{port}");
    trust_on_the_node(cluster_dir, &host)?;
    let registry = Registry { host };
    let out = Command::new("make")
        .current_dir(repo_root())
        .args(["--no-print-directory", "-s", "publish", "PLAIN_HTTP=1"])
        .arg(format!("REGISTRY={}", registry.path()))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "make publish failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(registry)
}

/// The path of a tool `e2e/cluster.sh tool` builds.
pub fn tool(name: &str) -> Result<std::path::PathBuf, String> {
    let out = Command::new(repo_root().join("e2e/cluster.sh"))
        .args(["tool", name])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().into())
}

/// Tells the real node's containerd (its `config_path`, e2e/node.sh) to pull from `host` over
/// plain HTTP. containerd reads the hosts directory at each pull: no restart.
fn trust_on_the_node(cluster_dir: &Path, host: &str) -> Result<(), String> {
    let node = cluster_dir.join("node");
    if !node.is_dir() {
        return Err(format!(
            "the cluster at {} has no real node: start it with `e2e/cluster.sh up --node`",
            cluster_dir.display()
        ));
    }
    let dir = node.join("certs.d").join(host);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let hosts = format!(
        "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    );
    std::fs::write(dir.join("hosts.toml"), hosts).map_err(|e| e.to_string())
}
