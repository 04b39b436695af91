//! A local process standing in for a pod, run the way a kubelet would run it.
//!
//! [`StandIn::spawn`] creates the Pod object (bound to the kwok node, labelled
//! `e2e.arbiter.dev/stand-in` so kwok leaves it to us), starts the process with `POD_NAME`,
//! `POD_NAMESPACE` and `POD_UID` set, in a process group of its own (its "container"), and
//! reports it Running and Ready. When the Pod is deleted it sends SIGTERM to the process, then
//! SIGKILL to the whole group after the deletion grace period, and only then removes the Pod
//! object, as a kubelet does. When the process exits on its own the Pod goes to
//! Succeeded/Failed (restartPolicy Never).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Command;
use tokio::sync::watch;

/// The node stand-in pods are bound to (created by `e2e/cluster.sh up`).
pub const NODE: &str = "kwok-node-0";
/// The label that tells kwok to leave a pod to the stand-in runner.
pub const STAND_IN_LABEL: &str = "e2e.arbiter.dev/stand-in";

/// How a stand-in's process ended: its exit code, or `-N` when signal N killed it.
pub type Exit = i32;

pub struct StandIn {
    pub name: String,
    pub uid: String,
    pub pid: i32,
    exit: watch::Receiver<Option<Exit>>,
    /// Every signal the runner sent, in order, with when it was sent.
    pub signals: Arc<Mutex<Vec<(Signal, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Creates the Pod and starts `program args...` as its process.
    pub async fn spawn(
        client: Client,
        namespace: &str,
        name: &str,
        labels: BTreeMap<String, String>,
        grace_period_seconds: i64,
        program: &str,
        args: &[&str],
    ) -> StandIn {
        Self::spawn_with_env(
            client,
            namespace,
            name,
            labels,
            grace_period_seconds,
            program,
            args,
            &[],
        )
        .await
    }

    /// [`StandIn::spawn`] with extra environment variables for the process.
    #[allow(clippy::too_many_arguments)]
    pub async fn spawn_with_env(
        client: Client,
        namespace: &str,
        name: &str,
        labels: BTreeMap<String, String>,
        grace_period_seconds: i64,
        program: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> StandIn {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let mut labels = labels;
        labels.insert(STAND_IN_LABEL.into(), "true".into());
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some(labels);
        pod.spec = Some(PodSpec {
            node_name: Some(NODE.into()),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(grace_period_seconds),
            // The command line the process runs, as a real pod's spec would show it (what the
            // pod declares, `arbiter run --lease ...`, is read from it).
            containers: vec![Container {
                name: "main".into(),
                image: Some(format!("stand-in/{program}")),
                command: Some(vec![program.to_string()]),
                args: Some(args.iter().map(|a| a.to_string()).collect()),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .expect("creating stand-in pod");
        let uid = pod.uid().expect("pod has a uid");

        let mut command = Command::new(program);
        command
            .args(args)
            .envs(envs.iter().copied())
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", namespace)
            .env("POD_UID", &uid)
            .stdin(Stdio::null())
            .kill_on_drop(false);
        // Its own session: the "container" is every process in it, whatever groups they make.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting stand-in process {program}: {e}"));
        let pid = child.id().expect("child has a pid") as i32;
        let now = jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap()
            .to_string();
        set_status(
            &pods,
            name,
            json!({
                "phase": "Running",
                "startTime": now,
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": [{
                    "name": "main", "image": format!("stand-in/{program}"), "imageID": "",
                    "ready": true, "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": now}},
                }],
            }),
        )
        .await;

        let (exit_tx, exit) = watch::channel(None);
        let signals = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(kubelet(
            pods,
            name.to_string(),
            uid.clone(),
            pid,
            child,
            exit_tx,
            signals.clone(),
        ));
        StandIn {
            name: name.into(),
            uid,
            pid,
            exit,
            signals,
            task,
        }
    }

    /// The exit, if the process has exited.
    pub fn exited(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Waits until the process has exited (or panics after `deadline`).
    pub async fn wait_exit(&self, deadline: Duration) -> Exit {
        let mut rx = self.exit.clone();
        match tokio::time::timeout(deadline, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => v.expect("exit is set"),
            Ok(Err(_)) => panic!("stand-in runner for {} stopped without an exit", self.name),
            Err(_) => panic!("stand-in {} still running after {deadline:?}", self.name),
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // A test that ends early must not leave processes behind.
        kill_container(self.pid);
        self.task.abort();
    }
}

async fn set_status(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("setting status of stand-in pod {name}: {e}"));
}

/// The kubelet's part: watch the Pod, stop the process on deletion, report its exit.
async fn kubelet(
    pods: Api<Pod>,
    name: String,
    uid: String,
    pid: i32,
    mut child: tokio::process::Child,
    exit_tx: watch::Sender<Option<Exit>>,
    signals: Arc<Mutex<Vec<(Signal, Instant)>>>,
) {
    let send = |sig: Signal| {
        signals.lock().unwrap().push((sig, Instant::now()));
        sig
    };
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(pods.clone(), cfg).applied_objects().boxed();
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = status.map(exit_code).unwrap_or(-1);
                kill_container(pid); // leftovers of the "container"
                exit_tx.send_replace(Some(code));
                report_exit(&pods, &name, code).await;
                // Keep serving deletion of the (now terminal) pod.
                if wait_for_deletion(&mut events).await {
                    finalize(&pods, &name, &uid).await;
                }
                return;
            }
            ev = events.next() => {
                let Some(Ok(pod)) = ev else { continue };
                if let Some(_ts) = pod.metadata.deletion_timestamp {
                    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0) as u64;
                    let _ = kill(Pid::from_raw(pid), send(Signal::SIGTERM));
                    let code = match tokio::time::timeout(Duration::from_secs(grace), child.wait()).await {
                        Ok(status) => status.map(exit_code).unwrap_or(-1),
                        Err(_) => {
                            send(Signal::SIGKILL);
                            kill_container(pid);
                            child.wait().await.map(exit_code).unwrap_or(-1)
                        }
                    };
                    kill_container(pid); // the rest of the "container"
                    exit_tx.send_replace(Some(code));
                    report_exit(&pods, &name, code).await;
                    finalize(&pods, &name, &uid).await;
                    return;
                }
            }
        }
    }
}

async fn wait_for_deletion(
    events: &mut futures::stream::BoxStream<'static, Result<Pod, watcher::Error>>,
) -> bool {
    while let Some(ev) = events.next().await {
        if let Ok(pod) = ev
            && pod.metadata.deletion_timestamp.is_some()
        {
            return true;
        }
    }
    false
}

/// Reports the container terminated and the pod terminal, as a kubelet does before it removes
/// a deleted pod.
async fn report_exit(pods: &Api<Pod>, name: &str, code: i32) {
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let status = json!({"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "main", "image": "", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": now}}}],
    }});
    let _ = pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await;
}

/// Removes the Pod object once its process is gone, as the kubelet does (grace 0, same uid).
async fn finalize(pods: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let _ = pods.delete(name, &dp).await;
}

/// SIGKILLs every process of the stand-in's session (the session id is the main pid), as a
/// container runtime kills a container's cgroup.
pub fn kill_container(sid: i32) {
    for _ in 0..3 {
        let members = session_members(sid);
        if members.is_empty() {
            return;
        }
        for pid in members {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The processes whose session id is `sid` (read from /proc/PID/stat).
pub fn session_members(sid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // Fields after the parenthesised command: state ppid pgrp session ...
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first() != Some(&"Z")
                && fields.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(sid)
        })
        .collect()
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0))
}
