//! Handover and failover, side by side: arbiter against plain client-go leader election and
//! upstream coordinated leader election (KEP-4355), on one control plane in one run.
//!
//! Every sample is one fresh Lease with fresh candidates: wait until one leads and the
//! leadership has been stable for a moment, inject the scenario's fault at the holder, and
//! measure the **leaderless gap** from the end of the old holder's workload (its `stop` line,
//! or the moment it was killed) to the `start` line of the next one. All the cases of a round
//! run at the same time, so every system sees the same machine load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::standin::{StandIn, kill_container};
use crate::support::{self, agent::now};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum System {
    /// `arbiter run` agents and one arbiter operator, default timings.
    Arbiter,
    /// client-go leader election (`LeaseLock`, 15 s / 10 s / 2 s, ReleaseOnCancel).
    ClientGo,
    /// client-go `NewCandidate` + a coordinated `LeaderElector`, elected by kube-apiserver's
    /// CoordinatedLeaderElection controller.
    Upstream,
    /// A controller-runtime manager (the Go module's example) whose leader election is
    /// arbiter's (`arbiterlock`), default timings. Its workload is its reconciles.
    GoArbiter,
    /// The same manager under controller-runtime's own leader election (LeaseLock, 15 s /
    /// 10 s / 2 s, ReleaseOnCancel).
    GoPlain,
}

impl System {
    pub fn namespace(self) -> &'static str {
        match self {
            System::Arbiter => "bench-arbiter",
            System::ClientGo => "bench-clientgo",
            System::Upstream => "bench-upstream",
            // Watched by the same operator as the agents.
            System::GoArbiter => "bench-arbiter",
            System::GoPlain => "bench-crplain",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            System::Arbiter => "arbiter",
            System::ClientGo => "client-go leader election",
            System::Upstream => "upstream coordinated election",
            System::GoArbiter => "controller-runtime via arbiter",
            System::GoPlain => "controller-runtime leader election",
        }
    }

    /// A controller-runtime manager: its workload is its reconciles (`work` lines).
    pub fn is_go(self) -> bool {
        matches!(self, System::GoArbiter | System::GoPlain)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// SIGTERM to the holder: it stops its workload and releases the Lease.
    Graceful,
    /// A better candidate (older version, as in a rollback) joins; the holder must give way.
    Preempt,
    /// SIGKILL of the holder's process tree; nothing tells anyone, the Lease must expire.
    Crash,
    /// SIGKILL of the holder's pod, which then goes Failed and is deleted (as a kubelet reports
    /// a dead container); arbiter reassigns on the pod's end instead of waiting for expiry.
    CrashPodGone,
    /// Real pods on the harness's real node: SIGKILL of the holder's agent (its container's
    /// first process); the kubelet restarts the container and reports how it ended.
    CrashContainerRestarts,
}

impl Scenario {
    pub fn label(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful stop (release)",
            Scenario::Preempt => "better candidate joins (rollback)",
            Scenario::Crash => "crash, lease must expire",
            Scenario::CrashPodGone => "crash, pod reported gone",
            Scenario::CrashContainerRestarts => "crash, container restarts",
        }
    }
}

/// What each system can do. client-go has no notion of a better candidate, and only arbiter
/// looks at pods.
pub const CASES: [(System, Scenario); 15] = [
    (System::Arbiter, Scenario::Graceful),
    (System::ClientGo, Scenario::Graceful),
    (System::Upstream, Scenario::Graceful),
    (System::Arbiter, Scenario::Preempt),
    (System::Upstream, Scenario::Preempt),
    (System::Arbiter, Scenario::Crash),
    (System::ClientGo, Scenario::Crash),
    (System::Upstream, Scenario::Crash),
    (System::Arbiter, Scenario::CrashPodGone),
    (System::Arbiter, Scenario::CrashContainerRestarts),
    (System::GoArbiter, Scenario::Graceful),
    (System::GoPlain, Scenario::Graceful),
    (System::GoArbiter, Scenario::Preempt),
    (System::GoArbiter, Scenario::Crash),
    (System::GoPlain, Scenario::Crash),
];

/// Builds `e2e/lecandidate` (the client-go baseline) into `target/bench/`.
pub fn build_lecandidate() -> PathBuf {
    let root = support::repo_root();
    let out = root.join("target/bench/lecandidate");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg("./lecandidate")
        .current_dir(root.join("e2e"))
        .env("CGO_ENABLED", "0")
        .status()
        .expect("running go build (Go is needed for the client-go baselines)");
    assert!(status.success(), "building e2e/lecandidate failed");
    out
}

pub struct Env {
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub lecandidate: PathBuf,
    pub dir: PathBuf,
}

/// One candidate process: a plain process in its own session, a stand-in pod, or a pod on
/// the real node (by name; it is deleted with the sample's other objects).
enum Proc {
    Plain(Child),
    Pod(StandIn),
    Real,
}

impl Proc {
    fn pid(&self) -> i32 {
        match self {
            Proc::Plain(c) => c.id() as i32,
            Proc::Pod(s) => s.pid,
            Proc::Real => unreachable!("a real pod is killed through its container"),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stand-in kills its own session when dropped.
        if let Proc::Plain(c) = self {
            kill_container(c.id() as i32);
            let _ = c.wait();
        }
    }
}

/// The workload of agents in real pods: busybox's `date` has no `%N`, so the time is the
/// kernel's uptime (one clock for the pods and the host; see [`uptime`]).
const POD_WORKLOAD: &str = r#"read up _ < /proc/uptime; echo "start $ARBITER_IDENTITY $up" >> "$1"
trap 'read up _ < /proc/uptime; echo "stop $ARBITER_IDENTITY $up" >> "$1"; exit 0' TERM
while :; do sleep 0.05; done"#;

/// Seconds since boot, the clock [`POD_WORKLOAD`] writes.
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_default()
}

/// An `arbiter run` pod on the real node (default timings, restarted when it ends), logging to
/// the sample's directory.
async fn spawn_real(env: &Env, lease: &str, id: &str, version: &str, log: &Path) -> Proc {
    let dir = log.parent().unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let args = [
        "run",
        "--lease",
        lease,
        "--binary-version",
        version,
        "--",
        "/bin/sh",
        "-c",
        POD_WORKLOAD,
        "workload",
        "/shared/workload.log",
    ];
    let mut pod = support::node::agent_pod(id, serde_json::json!({}), "agent", &args, dir);
    pod["spec"]["restartPolicy"] = serde_json::json!("Always");
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), System::Arbiter.namespace());
    pods.create(&Default::default(), &serde_json::from_value(pod).unwrap())
        .await
        .expect("creating an agent pod");
    Proc::Real
}

/// The workload of arbiter agents: the same `start`/`stop` lines `lecandidate` writes.
const WORKLOAD: &str = r#"echo "start $ARBITER_IDENTITY $(date +%s.%N)" >> "$1"
trap 'echo "stop $ARBITER_IDENTITY $(date +%s.%N)" >> "$1"; exit 0' TERM
while :; do sleep 0.05; done"#;

fn command_for(
    env: &Env,
    system: System,
    lease: &str,
    id: &str,
    version: &str,
    log: &Path,
) -> Command {
    let ns = system.namespace();
    match system {
        System::Arbiter => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_arbiter"));
            c.args(["run", "--lease", lease, "--identity", id, "--namespace", ns])
                .args([
                    "--binary-version",
                    version,
                    "--",
                    "sh",
                    "-c",
                    WORKLOAD,
                    "workload",
                ])
                .arg(log);
            c
        }
        System::GoArbiter | System::GoPlain => {
            let mut c = Command::new(support::go_manager::binary());
            let election = if system == System::GoArbiter {
                "arbiter"
            } else {
                "plain"
            };
            c.args(["--election", election, "--namespace", ns, "--lease", lease])
                .args(["--identity", id, "--binary-version", version])
                .args(["--config-map", lease, "--probe-addr", "0", "--log"])
                .arg(log);
            c
        }
        System::ClientGo | System::Upstream => {
            let mut c = Command::new(&env.lecandidate);
            let mode = if system == System::Upstream {
                "coordinated"
            } else {
                "plain"
            };
            c.args([
                "--mode",
                mode,
                "--namespace",
                ns,
                "--lease",
                lease,
                "--identity",
                id,
            ])
            .args(["--binary-version", version, "--log"])
            .arg(log);
            c
        }
    }
}

async fn spawn(
    env: &Env,
    system: System,
    scenario: Scenario,
    lease: &str,
    id: &str,
    version: &str,
    log: &Path,
) -> Proc {
    if scenario == Scenario::CrashContainerRestarts {
        return spawn_real(env, lease, id, version, log).await;
    }
    let cmd = command_for(env, system, lease, id, version, log);
    let stderr_path = log.with_file_name(format!("{id}.stderr"));
    if scenario == Scenario::CrashPodGone {
        // Through sh, to send the agent's stderr to its own file.
        let program = "sh".to_string();
        let mut args: Vec<String> = vec![
            "-c".into(),
            format!("exec \"$0\" \"$@\" 2>>'{}'", stderr_path.display()),
            cmd.get_program().to_str().unwrap().to_string(),
        ];
        args.extend(cmd.get_args().map(|a| a.to_str().unwrap().to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let kubeconfig = env.kubeconfig.to_str().unwrap();
        return Proc::Pod(
            StandIn::spawn_with_env(
                env.client.clone(),
                system.namespace(),
                id,
                BTreeMap::new(),
                5,
                &program,
                &args,
                &[("KUBECONFIG", kubeconfig)],
            )
            .await,
        );
    }
    let mut cmd = cmd;
    cmd.env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr_path).unwrap());
    // A session of its own, so the whole tree can be killed as a container would be.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    Proc::Plain(cmd.spawn().expect("starting a candidate"))
}

/// `start`/`stop` lines: (what, identity, seconds since the epoch: the line's last field).
/// A manager's `work ID TERM FROM TO` lines come as two: (`work`, ID, FROM) and (`worked`, ID,
/// TO).
fn read_log(log: &Path) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for l in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(what), Some(id), Some(Ok(last))) =
            (f.first(), f.get(1), f.last().map(|t| t.parse()))
        else {
            continue;
        };
        if *what == "work" {
            let Some(Ok(from)) = f.get(3).map(|t| t.parse()) else {
                continue;
            };
            out.push(("work".to_string(), id.to_string(), from));
            out.push(("worked".to_string(), id.to_string(), last));
        } else {
            out.push((what.to_string(), id.to_string(), last));
        }
    }
    out
}

async fn poll<T>(deadline: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if tokio::time::Instant::now() > until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One sample, in seconds.
#[derive(Clone, Copy)]
pub struct Sample {
    /// From the end of the old holder's workload to the start of the new one's; negative when
    /// the two overlapped.
    pub gap: f64,
    /// From the fault (kill, SIGTERM, the better candidate's start) to the new workload's start.
    pub to_new: f64,
    /// A better candidate joining: from when its candidate object was first seen (polled every
    /// 20 ms, so at most that after it registered) to the new workload's start.
    pub from_registration: Option<f64>,
}

/// One sample, or why there is none.
pub async fn sample(
    env: &Env,
    system: System,
    scenario: Scenario,
    round: usize,
) -> Result<Sample, String> {
    let lease = format!(
        "{}-{}-{round}",
        format!("{system:?}").to_lowercase(),
        format!("{scenario:?}").to_lowercase()
    );
    let dir = env.dir.join(&lease);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("workload.log");
    let version = if scenario == Scenario::Preempt {
        "1.31.0"
    } else {
        "1.30.0"
    };
    if system.is_go() {
        // The ConfigMap the managers reconcile.
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(env.client.clone(), system.namespace());
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some(lease.clone());
        cms.create(&Default::default(), &cm)
            .await
            .map_err(|e| format!("creating the ConfigMap: {e}"))?;
    }
    let mut procs = BTreeMap::new();
    for i in 0..3 {
        let id = format!("{lease}-c{i}");
        procs.insert(
            id.clone(),
            spawn(env, system, scenario, &lease, &id, version, &log).await,
        );
        // Registered in order, one second apart (creation timestamps have second precision), so
        // the first is the oldest from the start: upstream would otherwise elect whoever
        // registered first and then hand over to the oldest, which takes it 20-35 s.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let result = measure(env, system, scenario, &lease, &log, &mut procs).await;
    drop(procs);
    cleanup(env, system, &lease).await;
    result
}

async fn measure(
    env: &Env,
    system: System,
    scenario: Scenario,
    lease: &str,
    log: &Path,
    procs: &mut BTreeMap<String, Proc>,
) -> Result<Sample, String> {
    // Pods on the real node log on the uptime clock.
    let real = scenario == Scenario::CrashContainerRestarts;
    let clock = if real { uptime } else { now };
    // Steady state: a holder whose workload has been running for 5 s.
    let holder = poll(Duration::from_secs(120), || {
        let l = read_log(log);
        let last = l.iter().rev().find(|e| e.0 == "start")?;
        let stopped = l
            .iter()
            .any(|e| e.0 == "stop" && e.1 == last.1 && e.2 >= last.2);
        (clock() - last.2 > 5.0 && !stopped).then(|| last.1.clone())
    })
    .await
    .ok_or("no stable holder within 120 s")?;
    let agent = if real {
        let ns = System::Arbiter.namespace();
        let pid = support::node::first_container_pid(&env.client, ns, &env.kubeconfig, &holder);
        Some(pid.await.ok_or("the holder's container has no task")?)
    } else {
        None
    };
    let fault = clock();
    let mut registered = None;
    match scenario {
        Scenario::Graceful => {
            let _ = kill(Pid::from_raw(procs[&holder].pid()), Signal::SIGTERM);
        }
        Scenario::Preempt => {
            let id = format!("{lease}-c3");
            let p = spawn(env, system, scenario, lease, &id, "1.30.0", log).await;
            procs.insert(id.clone(), p);
            registered = Some(registration(env, system, &id, clock).await?);
        }
        Scenario::Crash => kill_container(procs[&holder].pid()),
        Scenario::CrashPodGone => {
            kill_container(procs[&holder].pid());
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(env.client.clone(), system.namespace());
            let _ = pods.delete(&holder, &DeleteParams::default()).await;
        }
        Scenario::CrashContainerRestarts => {
            let _ = kill(Pid::from_raw(agent.unwrap()), Signal::SIGKILL);
        }
    }
    // A manager's workload starts with its first reconcile and ends with its last.
    let (begins, ends) = if system.is_go() {
        ("work", "worked")
    } else {
        ("start", "stop")
    };
    // After a container restart the same candidate, restarted, may lead again.
    let next = poll(Duration::from_secs(120), || {
        read_log(log)
            .into_iter()
            .find(|e| e.0 == begins && (e.1 != holder || real) && e.2 > fault)
    })
    .await
    .ok_or("no new holder within 120 s of the fault")?;
    let l = read_log(log);
    let stopped = if system.is_go() {
        l.iter()
            .filter(|e| e.0 == ends && e.1 == holder)
            .map(|e| e.2)
            .reduce(f64::max)
    } else {
        l.iter()
            .find(|e| e.0 == ends && e.1 == holder && e.2 >= fault)
            .map(|e| e.2)
    };
    let old_end = match scenario {
        // A killed holder is gone at the fault.
        Scenario::Crash | Scenario::CrashPodGone | Scenario::CrashContainerRestarts => fault,
        _ => stopped.ok_or("the old holder never reported its stop")?,
    };
    Ok(Sample {
        gap: next.2 - old_end,
        to_new: next.2 - fault,
        from_registration: registered.map(|r| next.2 - r),
    })
}

/// When candidate `id`'s candidate object (arbiter's, or upstream's v1beta1 one) was first
/// seen, on `clock`, polled every 20 ms.
async fn registration(
    env: &Env,
    system: System,
    id: &str,
    clock: fn() -> f64,
) -> Result<f64, String> {
    let ns = system.namespace();
    let ours: Api<arbiter::api::LeaseCandidate> = Api::namespaced(env.client.clone(), ns);
    let upstream: Api<k8s_openapi::api::coordination::v1beta1::LeaseCandidate> =
        Api::namespaced(env.client.clone(), ns);
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < until {
        let exists = match system {
            System::Arbiter | System::GoArbiter => ours.get_opt(id).await.ok().flatten().is_some(),
            _ => upstream.get_opt(id).await.ok().flatten().is_some(),
        };
        if exists {
            return Ok(clock());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("{id} did not register within 60 s"))
}

/// Deletes the lease and its candidates so that finished samples leave no work behind.
async fn cleanup(env: &Env, system: System, lease: &str) {
    let ns = system.namespace();
    let dp = DeleteParams::default();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), ns);
    let _ = leases.delete(lease, &dp).await;
    let ours: Api<arbiter::api::LeaseCandidate> = Api::namespaced(env.client.clone(), ns);
    let upstream: Api<k8s_openapi::api::coordination::v1beta1::LeaseCandidate> =
        Api::namespaced(env.client.clone(), ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), ns);
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), ns);
    let _ = cms.delete(lease, &dp).await;
    for i in 0..4 {
        let _ = pods.delete(&format!("{lease}-c{i}"), &dp).await;
        let _ = ours.delete(&format!("{lease}-c{i}"), &dp).await;
        let _ = upstream.delete(&format!("{lease}-c{i}"), &dp).await;
    }
}
