//! `make chaos`: randomized fault trials against a real control plane, counting violations.
//!
//! Three agents compete for one lease; each runs a workload that writes to a fenced resource
//! (which accepts a write only with the highest term it has seen) every 50 ms. Two operator
//! replicas arbitrate. Each trial injects one fault at the current holder or the operator:
//! SIGKILL of the holder's agent, SIGSTOP of its whole process tree for longer than the lease
//! then SIGCONT, SIGSTOP of its agent alone (its guard and workload run on), a hand edit of
//! the Lease (deleted, holder cleared, or duration lowered to 1 s), a network cut or a 2 s
//! delay between it and the API server (a TCP proxy),
//! SIGKILL of the active operator (restarted), an operator failover (SIGTERM), a restart of
//! kube-apiserver or etcd, or SIGKILL of the agent of a fourth candidate that runs as a real pod
//! on the harness's real node (made the holder first by a planned switchover): its container
//! ends and the kubelet restarts it. Agents that exit are restarted, as a kubelet would.
//!
//! And objects and clocks arbiter did not make (the trust boundary): the holder restarted with
//! its wall clock 10 minutes ahead (it stays so for the rest of the run, so later faults kill a
//! holder whose last `renewTime` is in the future), a candidate made by hand at the oldest
//! version with `renewTime` an hour ahead and no process (then the holder is killed), the
//! holder's candidate re-pointed (`ownerReferences`) at a pod that has ended for a lease
//! duration, and the Lease's `arbiter.dev/managed` label removed (it must come back).
//!
//! Violations (the run exits non-zero on any): writes received from an older term after a newer
//! term's writes, except from a process that was paused (overlapping workloads); stale-term
//! writes accepted; trials where no workload ran for longer than the lease duration + 2 s after
//! the fault was healed (for kube-apiserver and etcd restarts, which also make the active
//! operator fail over, the operator's HA lease duration and one more lease duration, which the
//! replica taking over waits before judging expiry, are added); an unlabelled Lease not
//! labelled again within three lease durations.
//!
//! `cargo test --release --test chaos -- --trials 200 --seed 7` (defaults: 200 trials, seed from
//! the clock; `CHAOS_TRIALS`/`CHAOS_SEED` also work; `CHAOS_FAULTS=KillHolderContainer,...`
//! limits the faults drawn).

#[path = "tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::agent::{Proxy, TIMINGS, apiserver};
use support::operator::{FAST_HA, Operator};
use support::{Cluster, client_for};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

const NS: &str = "chaos";
const LEASE: &str = "chaos";
/// The lease duration in `TIMINGS`, in seconds.
const LEASE_DURATION: f64 = 10.0;
/// The operators' own HA lease duration (`FAST_HA`).
const HA_LEASE_DURATION: f64 = 6.0;

/// The operators' HA lease (their default `--ha-lease-name`).
const HA_LEASE: &str = "arbiter-operator";

/// Every write the fenced resource received: (seconds since start, identity, term, accepted).
type Writes = Arc<Mutex<Vec<(f64, String, i32, bool)>>>;

/// The fenced resource: accepts `WRITE <identity> <term>` lines only with the highest term seen.
async fn fenced_resource(start: Instant) -> (u16, Writes) {
    // On every address: the pod candidate reaches it through the real node's bridge.
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let writes: Writes = Arc::default();
    let highest = Arc::new(Mutex::new(0));
    let out = writes.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (out, highest) = (out.clone(), highest.clone());
            tokio::spawn(async move {
                let mut lines = BufReader::new(conn).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let (Some(id), Some(term)) =
                        (f.get(1), f.get(2).and_then(|t| t.parse::<i32>().ok()))
                    else {
                        continue;
                    };
                    let mut h = highest.lock().unwrap();
                    let accepted = term >= *h;
                    *h = (*h).max(term);
                    out.lock().unwrap().push((
                        start.elapsed().as_secs_f64(),
                        id.to_string(),
                        term,
                        accepted,
                    ));
                }
            });
        }
    });
    (port, writes)
}

/// The workload: writes its term to the resource every 50 ms.
fn workload(port: u16) -> String {
    format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; trap 'exit 0' TERM; \
         while :; do echo \"WRITE $ARBITER_IDENTITY $ARBITER_TERM\" >&3; sleep 0.05; done"
    )
}

struct AgentSlot {
    identity: String,
    version: String,
    proxy: Proxy,
    kubeconfig: PathBuf,
    child: Option<Child>,
    /// Its wall clock's offset from the true one (faketime's syntax), if any.
    clock: Option<&'static str>,
}

impl AgentSlot {
    fn start(&mut self, port: u16, logs: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", self.identity)))
            .unwrap();
        let mut args: Vec<String> = [
            "run",
            "--lease",
            LEASE,
            "--identity",
            &self.identity,
            "--namespace",
            NS,
            "--binary-version",
            &self.version,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(TIMINGS.iter().map(|s| s.to_string()));
        args.extend(["--".into(), "bash".into(), "-c".into(), workload(port)]);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_arbiter"));
        if let Some(offset) = self.clock {
            cmd.envs(support::agent::faketime(offset));
        }
        cmd.args(&args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // A session of its own: SIGSTOP of the "pod" pauses the agent and its workload together.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        self.child = Some(cmd.spawn().unwrap());
    }

    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Restarts the agent if it exited (as a kubelet restarts a container).
    fn keep_alive(&mut self, port: u16, logs: &Path) {
        if self
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
        {
            self.start(port, logs);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillHolder,
    PauseHolder,
    /// SIGSTOP of the holder's agent alone (not its guard, not its workload).
    StallAgent,
    /// The Lease deleted by hand: the holder stops and withdraws; the live candidates must get
    /// it (issue 17: no handover to the departed holder, no flip back).
    DeleteLease,
    /// The Lease's holder cleared, or its duration lowered, by hand.
    EditLease,
    CutHolder,
    DelayHolder,
    KillOperator,
    FailoverOperator,
    RestartApiserver,
    RestartEtcd,
    /// SIGKILL of the agent of the candidate running as a real pod (its container's first
    /// process); the kubelet restarts the container and reports how it ended.
    KillHolderContainer,
    /// The holder killed and restarted with its wall clock 10 minutes ahead (for the rest of
    /// the run).
    ClockAhead,
    /// A candidate made by hand, at the oldest version, `renewTime` an hour ahead, no process;
    /// then the holder killed.
    GhostCandidate,
    /// The holder's candidate's `ownerReferences` pointed at a pod that has ended, for a lease
    /// duration and more.
    RepointOwner,
    /// The Lease's `arbiter.dev/managed` label removed by hand.
    UnlabelLease,
}

const FAULTS: [Fault; 16] = [
    Fault::KillHolder,
    Fault::PauseHolder,
    Fault::StallAgent,
    Fault::DeleteLease,
    Fault::EditLease,
    Fault::CutHolder,
    Fault::DelayHolder,
    Fault::KillOperator,
    Fault::FailoverOperator,
    Fault::RestartApiserver,
    Fault::RestartEtcd,
    Fault::KillHolderContainer,
    Fault::ClockAhead,
    Fault::GhostCandidate,
    Fault::RepointOwner,
    Fault::UnlabelLease,
];

/// A pod that has ended (phase Succeeded), for [`Fault::RepointOwner`]: bound to the kwok node
/// and left alone by it (the stand-in label), its status written here as a kubelet would.
async fn ended_pod(client: &kube::Client) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ended", "labels": {support::standin::STAND_IN_LABEL: "true"}},
        "spec": {"nodeName": support::standin::NODE, "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "example.com/done:1"}]},
    }))
    .unwrap();
    let _ = pods.create(&PostParams::default(), &pod).await;
    let status = serde_json::json!({"status": {"phase": "Succeeded"}});
    pods.patch_status("ended", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("marking the ended pod Succeeded");
    pods.get("ended").await.unwrap()
}

/// The candidate that runs as a pod on the real node (recreated by the harness if the operator
/// forces it out, as a controller would).
const POD_AGENT: &str = "agent-pod";

/// Restarts a control-plane component in place (`e2e/cluster.sh restart`).
async fn restart(kubeconfig: &Path, component: &str) {
    let dir = kubeconfig.parent().unwrap().to_path_buf();
    let component = component.to_string();
    let status = tokio::task::spawn_blocking(move || {
        Command::new(support::repo_root().join("e2e/cluster.sh"))
            .arg("restart")
            .arg(&dir)
            .arg(&component)
            .status()
    })
    .await
    .unwrap();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "restarting a control-plane component failed"
    );
}

/// A small deterministic generator (splitmix64) so a seed reproduces a run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
}

fn arg(name: &str, env: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .or_else(|| std::env::var(env).ok()?.parse().ok())
}

/// The time of the first write received after `t` whose term is above `term`.
fn next_write_after(writes: &[(f64, String, i32, bool)], t: f64, term: i32) -> Option<f64> {
    writes
        .iter()
        .find(|w| w.0 > t && w.2 > term && w.3)
        .map(|w| w.0)
}

fn main() {
    let trials = arg("--trials", "CHAOS_TRIALS").unwrap_or(200);
    let seed = arg("--seed", "CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    });
    println!("chaos: {trials} trials, seed {seed}");
    let cluster = Cluster::start_or_reuse_with_node();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let failures = rt.block_on(run(&cluster.kubeconfig, trials, seed));
    drop(rt);
    drop(cluster);
    if failures > 0 {
        eprintln!("chaos: {failures} violation(s)");
        std::process::exit(1);
    }
}

async fn run(kubeconfig: &Path, trials: u64, seed: u64) -> usize {
    let client = client_for(kubeconfig).await;
    arbiter::api::apply_crds(client.clone(), Duration::from_secs(30))
        .await
        .expect("installing the CRD");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(NS.into());
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    // Kept after the run (agents' and operators' logs), for the post-mortem of a violation.
    let dir = tempfile::Builder::new()
        .prefix("arbiter-chaos-")
        .tempdir()
        .unwrap()
        .keep();
    println!("chaos: logs in {}", dir.display());
    // SAFETY: set before any thread that reads the environment is started by this run.
    unsafe { std::env::set_var("ARBITER_E2E_KEEP_LOGS", &dir) };
    let start = Instant::now();
    let (port, writes) = fenced_resource(start).await;
    let op_args = [
        "--namespace",
        NS,
        "--watch-namespace",
        NS,
        "--metrics-address",
        "127.0.0.1:0",
        "--lease-duration",
        "10s",
    ]
    .into_iter()
    .chain(FAST_HA)
    .collect::<Vec<_>>();
    // Each operator process gets an identity of its own, so that the steady state can require
    // the HA lease to be held by one that is running.
    let mut started = 0;
    let mut start_operator = || {
        started += 1;
        let id = format!("operator-{started}");
        let mut args = op_args.to_vec();
        args.extend(["--identity", &id]);
        (id.clone(), Operator::start_args(kubeconfig, &args))
    };
    let mut operators = vec![start_operator(), start_operator()];
    let mut agents = Vec::new();
    for (i, version) in ["1.30.0", "1.30.0", "1.31.0"].iter().enumerate() {
        let proxy = Proxy::start(apiserver(kubeconfig)).await;
        let kc = proxy.kubeconfig(kubeconfig, dir.as_path());
        let kc_i = dir.as_path().join(format!("kubeconfig-{i}"));
        std::fs::rename(&kc, &kc_i).unwrap();
        let mut slot = AgentSlot {
            identity: format!("agent-{i}"),
            version: version.to_string(),
            proxy,
            kubeconfig: kc_i,
            child: None,
            clock: None,
        };
        slot.start(port, dir.as_path());
        agents.push(slot);
    }
    let pod_agent = start_pod_agent(kubeconfig, &client, port).await;
    let ended = ended_pod(&client).await;
    let candidates: Api<arbiter::api::LeaseCandidate> = Api::namespaced(client.clone(), NS);
    let mut not_relabelled = 0;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NS);
    let mut rng = Rng(seed);
    let mut leaderless: BTreeMap<Fault, Vec<f64>> = BTreeMap::new();
    // For kube-apiserver and etcd restarts: the leaderless time minus the outage itself.
    let mut beyond_outage: BTreeMap<Fault, Vec<f64>> = BTreeMap::new();
    let mut paused: Vec<(String, f64, f64)> = Vec::new();
    let mut slow_recoveries = 0;

    for trial in 0..trials {
        let mut fault = FAULTS[(rng.next() % FAULTS.len() as u64) as usize];
        // CHAOS_FAULTS=KillHolderContainer,KillHolder: only these (the draw is the same).
        if let Ok(only) = std::env::var("CHAOS_FAULTS") {
            let allowed: Vec<Fault> = FAULTS
                .into_iter()
                .filter(|f| only.split(',').any(|o| o.trim() == format!("{f:?}")))
                .collect();
            if !allowed.is_empty() && !allowed.contains(&fault) {
                fault = allowed[(trial as usize) % allowed.len()];
            }
        }
        // The pod's fault needs the pod to hold the lease: a planned switchover to it first
        // (asked again if it did not happen within 20 s).
        let mut switchover_asked: Option<Instant> = None;
        // Steady state: a holder whose workload is writing, and an active operator (a fault
        // injected while the operators are still failing over from the previous one would be
        // two faults, with a bound of their own).
        let (holder, term) = loop {
            for a in agents.iter_mut() {
                a.keep_alive(port, dir.as_path());
            }
            ensure_pod_agent(&client, &pod_agent).await;
            // An operator replica that exited (it could not renew its lease) is restarted, as
            // its Deployment would.
            for o in operators.iter_mut() {
                if o.1.exited() {
                    *o = start_operator();
                }
            }
            let l = leases.get_opt(LEASE).await.ok().flatten();
            let h = l
                .as_ref()
                .and_then(arbiter::lease::holder)
                .map(str::to_string);
            let t = l.as_ref().map(arbiter::lease::term).unwrap_or(0);
            let now = start.elapsed().as_secs_f64();
            let writing = writes
                .lock()
                .unwrap()
                .iter()
                .rev()
                .take(5)
                .any(|w| w.2 == t && w.3 && now - w.0 < 0.5);
            let ha = leases.get_opt(HA_LEASE).await.ok().flatten();
            let operator_active = ha.as_ref().is_some_and(|l| {
                let spec = l.spec.as_ref();
                let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
                arbiter::lease::holder(l).is_some_and(|h| {
                    // The operator appends a random suffix to the identity it is given.
                    operators
                        .iter()
                        .any(|o| h.starts_with(&format!("{}-", o.0)))
                }) && renewed.is_some_and(|r| {
                    jiff::Timestamp::now().duration_since(r).as_secs_f64() < HA_LEASE_DURATION
                })
            });
            // ... and has been active for a lease duration: a replica that just took over
            // waits a full duration before it judges any lease expired (it did not see the
            // records before), which a fault injected at once would add to its recovery.
            let operator_settled = ha.as_ref().is_some_and(|l| {
                let acquired = l.spec.as_ref().and_then(|s| s.acquire_time.as_ref());
                acquired.is_some_and(|a| {
                    jiff::Timestamp::now().duration_since(a.0).as_secs_f64() > LEASE_DURATION
                })
            });
            let operator_active = operator_active && operator_settled;
            if let (Some(h), true, true) = (h, writing, operator_active) {
                // The pod's fault needs the pod holding; a fault at a host process (a pause, a
                // stall, a cut, a delay, a kill) needs a host agent holding.
                let pod_holds = h == POD_AGENT;
                let wanted = match fault {
                    Fault::KillHolderContainer => Some(true),
                    Fault::KillHolder
                    | Fault::PauseHolder
                    | Fault::StallAgent
                    | Fault::CutHolder
                    | Fault::DelayHolder
                    | Fault::ClockAhead
                    | Fault::GhostCandidate
                    | Fault::RepointOwner
                    | Fault::DeleteLease
                    | Fault::EditLease => Some(false),
                    _ => None,
                };
                if wanted.is_none_or(|w| w == pod_holds) {
                    break (h, t);
                }
                if switchover_asked.is_none_or(|t| t.elapsed() > Duration::from_secs(20)) {
                    switchover_asked = Some(Instant::now());
                    hand_over(kubeconfig, wanted == Some(true)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let slot = agents.iter().position(|a| a.identity == holder);
        let t0 = start.elapsed().as_secs_f64();
        match (fault, slot) {
            (Fault::KillHolder, Some(i)) => {
                let _ = kill(Pid::from_raw(agents[i].pid().unwrap()), Signal::SIGKILL);
            }
            (Fault::PauseHolder, Some(i)) => {
                let pid = agents[i].pid().unwrap();
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGSTOP);
                for m in support::standin::session_members(pid) {
                    let _ = kill(Pid::from_raw(m), Signal::SIGSTOP);
                }
                tokio::time::sleep(Duration::from_secs_f64(LEASE_DURATION + 3.0)).await;
                for m in support::standin::session_members(pid) {
                    let _ = kill(Pid::from_raw(m), Signal::SIGCONT);
                }
                paused.push((holder.clone(), t0, start.elapsed().as_secs_f64() + 3.0));
            }
            (Fault::StallAgent, Some(i)) => {
                // The agent is its group's leader; its guard and workload have groups of their
                // own: they keep running, and the guard must stop the workload in time.
                let group = Pid::from_raw(agents[i].pid().unwrap());
                let _ = nix::sys::signal::killpg(group, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_secs_f64(LEASE_DURATION + 3.0)).await;
                let _ = nix::sys::signal::killpg(group, Signal::SIGCONT);
            }
            (Fault::DeleteLease, Some(_)) => {
                let _ = leases
                    .delete(LEASE, &kube::api::DeleteParams::default())
                    .await;
            }
            (Fault::EditLease, Some(_)) => {
                use kube::api::{Patch, PatchParams};
                let edit = if rng.next().is_multiple_of(2) {
                    serde_json::json!({ "spec": { "holderIdentity": "" } })
                } else {
                    serde_json::json!({ "spec": { "leaseDurationSeconds": 1 } })
                };
                let _ = leases
                    .patch(LEASE, &PatchParams::default(), &Patch::Merge(edit))
                    .await;
            }
            (Fault::CutHolder, Some(i)) => {
                agents[i].proxy.cut();
                tokio::time::sleep(Duration::from_secs(8)).await;
                agents[i].proxy.restore();
            }
            (Fault::DelayHolder, Some(i)) => {
                agents[i].proxy.delay(Duration::from_secs(2));
                tokio::time::sleep(Duration::from_secs(8)).await;
                agents[i].proxy.delay(Duration::ZERO);
            }
            (Fault::KillOperator, _) => {
                let victim = operators.remove(0).1;
                let _ = kill(Pid::from_raw(victim.pid()), Signal::SIGKILL);
                drop(victim);
                operators.push(start_operator());
            }
            (Fault::RestartApiserver, _) => restart(kubeconfig, "kube-apiserver").await,
            (Fault::RestartEtcd, _) => restart(kubeconfig, "etcd").await,
            (Fault::KillHolderContainer, None) => {
                let pid = support::node::first_container_pid(&client, NS, kubeconfig, POD_AGENT);
                let Some(pid) = pid.await else {
                    continue;
                };
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            (Fault::FailoverOperator, _) => {
                let mut victim = operators.remove(0).1;
                let _ = kill(Pid::from_raw(victim.pid()), Signal::SIGTERM);
                victim.wait_exit(Duration::from_secs(30)).await;
                operators.push(start_operator());
            }
            (Fault::ClockAhead, Some(i)) => {
                if let Some(mut c) = agents[i].child.take() {
                    let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
                    let _ = c.wait();
                }
                agents[i].clock = Some("+10m");
                agents[i].start(port, dir.as_path());
            }
            (Fault::GhostCandidate, Some(i)) => {
                let ghost = arbiter::api::LeaseCandidate::new(
                    &format!("ghost-{trial}"),
                    arbiter::api::LeaseCandidateSpec {
                        lease_name: LEASE.into(),
                        binary_version: "1.29.0".into(),
                        emulation_version: Some("1.29.0".into()),
                        strategy: arbiter::api::OLDEST_EMULATION_VERSION.into(),
                        ping_time: None,
                        renew_time: Some(
                            k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                                jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1),
                            ),
                        ),
                    },
                );
                let _ = candidates.create(&PostParams::default(), &ghost).await;
                let _ = kill(Pid::from_raw(agents[i].pid().unwrap()), Signal::SIGKILL);
            }
            (Fault::RepointOwner, Some(_)) => {
                use kube::api::{Patch, PatchParams};
                let owner = serde_json::json!({ "metadata": { "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": "ended",
                    "uid": kube::ResourceExt::uid(&ended).unwrap_or_default(),
                }] } });
                let pp = PatchParams::default();
                let _ = candidates.patch(&holder, &pp, &Patch::Merge(&owner)).await;
                tokio::time::sleep(Duration::from_secs_f64(LEASE_DURATION + 3.0)).await;
                let none = serde_json::json!({ "metadata": { "ownerReferences": null } });
                let _ = candidates.patch(&holder, &pp, &Patch::Merge(&none)).await;
            }
            (Fault::UnlabelLease, _) => {
                use kube::api::{Patch, PatchParams};
                let p = serde_json::json!({ "metadata": { "labels": {
                    arbiter::lease::MANAGED_LABEL: null,
                } } });
                let _ = leases
                    .patch(LEASE, &PatchParams::default(), &Patch::Merge(&p))
                    .await;
                let until = Instant::now() + Duration::from_secs_f64(3.0 * LEASE_DURATION);
                let relabelled = loop {
                    let l = leases.get_opt(LEASE).await.ok().flatten();
                    if l.as_ref().is_some_and(arbiter::lease::managed) {
                        break true;
                    }
                    if Instant::now() > until {
                        break false;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                if !relabelled {
                    not_relabelled += 1;
                    eprintln!("trial {trial}: the unlabelled Lease was not labelled again");
                }
            }
            _ => continue,
        }
        let healed = start.elapsed().as_secs_f64();
        // Recovery: writes again (from the same term if the fault did not depose the holder, or
        // from a newer term).
        let deadline = Instant::now() + Duration::from_secs(60);
        let resumed = loop {
            for a in agents.iter_mut() {
                a.keep_alive(port, dir.as_path());
            }
            // An operator replica that exited (it could not renew its lease) is restarted, as
            // its Deployment would.
            for o in operators.iter_mut() {
                if o.1.exited() {
                    *o = start_operator();
                }
            }
            let w = writes.lock().unwrap().clone();
            let after: Vec<_> = w.iter().filter(|w| w.0 > healed && w.3).collect();
            if let Some(first) = after.iter().find(|w| w.2 > term).or(after.first()) {
                break Some(first.0);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Leaderless: from the last write of the old term to the first write of a newer one.
        let w = writes.lock().unwrap().clone();
        let last_old = w
            .iter()
            .filter(|x| x.2 == term && x.3)
            .map(|x| x.0)
            .fold(t0, f64::max);
        let gap = next_write_after(&w, last_old, term)
            .map(|n| (n - last_old).max(0.0))
            .unwrap_or(0.0);
        leaderless.entry(fault).or_default().push(gap);
        if matches!(fault, Fault::RestartApiserver | Fault::RestartEtcd) {
            beyond_outage
                .entry(fault)
                .or_default()
                .push(gap - (healed - t0));
        }
        let recovered_in = resumed.map(|r| r - healed);
        // Every fault, kube-apiserver and etcd restarts included, must be recovered from within
        // a lease duration of healing: after a restart the active operator resumes (nobody
        // wrote its lease meanwhile) with its memory of every lease, instead of a standby
        // taking over and waiting a full lease duration before judging any lease expired.
        let bound = LEASE_DURATION + 2.0;
        if recovered_in.is_none_or(|r| r > bound) {
            slow_recoveries += 1;
            eprintln!("trial {trial}: {fault:?}: no workload for {recovered_in:?} s after healing");
        }
        let name = format!("{fault:?}");
        println!("trial {trial:>3}: {name:<16} holder {holder} term {term}: leaderless {gap:.2} s");
        if fault == Fault::GhostCandidate {
            let _ = candidates
                .delete(
                    &format!("ghost-{trial}"),
                    &kube::api::DeleteParams::default(),
                )
                .await;
        }
    }

    // Analysis.
    let w = writes.lock().unwrap().clone();
    let mut highest_seen = 0;
    let mut overlaps = 0;
    let mut stale_accepted = 0;
    for (t, id, term, accepted) in &w {
        if *term < highest_seen {
            let excused = paused
                .iter()
                .any(|(p, from, to)| p == id && *t >= *from && *t <= *to + 5.0);
            if !excused {
                overlaps += 1;
                eprintln!(
                    "overlap: {id} wrote with term {term} at {t:.3} after term {highest_seen}"
                );
            }
            if *accepted {
                stale_accepted += 1;
            }
        }
        highest_seen = highest_seen.max(*term);
    }
    let rejected = w.iter().filter(|x| !x.3).count();
    println!(
        "\nchaos report: {trials} trials, seed {seed}, {} writes ({rejected} rejected by fencing)",
        w.len()
    );
    println!("  overlapping workloads not explained by a pause: {overlaps}");
    println!("  stale-term writes accepted: {stale_accepted}");
    println!(
        "  trials without a workload for more than lease + 2 s after healing: {slow_recoveries}"
    );
    println!("  unlabelled Leases not labelled again: {not_relabelled}");
    let print = |per_fault: &BTreeMap<Fault, Vec<f64>>| {
        for (fault, gaps) in per_fault {
            let mut g = gaps.clone();
            g.sort_by(|a, b| a.total_cmp(b));
            let p = |q: f64| g[((g.len() - 1) as f64 * q).round() as usize];
            let name = format!("{fault:?}");
            println!(
                "    {name:<18} n={:<4} p50={:<6.2} p95={:<6.2} max={:.2}",
                g.len(),
                p(0.5),
                p(0.95),
                g[g.len() - 1]
            );
        }
    };
    println!("  leaderless time per fault (s):");
    print(&leaderless);
    if !beyond_outage.is_empty() {
        println!(
            "  leaderless time beyond the outage, for restarts (s; the outage is the restart's"
        );
        println!("  duration, from the kill to the server answering again):");
        print(&beyond_outage);
    }
    for a in agents.iter_mut() {
        if let Some(c) = a.child.as_mut() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let _ = c.wait();
        }
    }
    drop(operators);
    let violations = overlaps + stale_accepted + slow_recoveries + not_relabelled;
    println!(
        "{} passed, {} failed",
        if violations == 0 { 1 } else { 0 },
        if violations == 0 { 0 } else { 1 }
    );
    violations
}

/// The fourth candidate, `agent-pod`: `arbiter run` as the entrypoint of a pod on the real node
/// (the agent image, in-cluster config, restarted by the kubelet), writing to the fenced
/// resource through the node's bridge.
async fn start_pod_agent(
    kubeconfig: &Path,
    client: &kube::Client,
    port: u16,
) -> k8s_openapi::api::core::v1::Pod {
    support::node::ready(&support::TestEnv {
        client: client.clone(),
        ns: NS.into(),
        kubeconfig: kubeconfig.to_path_buf(),
    })
    .await;
    support::node::agent_service_account(client, NS).await;
    let workload = format!(
        "trap 'exit 0' TERM; while :; do echo \"WRITE $ARBITER_IDENTITY $ARBITER_TERM\"; sleep 0.05; done \
         | nc 10.217.0.1 {port}"
    );
    let mut args = vec!["run", "--lease", LEASE, "--binary-version", "1.30.0"];
    args.extend(TIMINGS);
    args.extend(["--", "/bin/sh", "-c", &workload]);
    let shared = tempfile::tempdir().unwrap();
    let mut pod = support::node::agent_pod(
        POD_AGENT,
        serde_json::json!({}),
        "agent",
        &args,
        shared.path(),
    );
    pod["spec"]["restartPolicy"] = serde_json::json!("Always");
    pod["spec"]["volumes"][0] = serde_json::json!({"name": "shared", "emptyDir": {}});
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
    ensure_pod_agent(client, &pod).await;
    pod
}

/// Creates the pod candidate if it is not there (the operator evicts a holder's pod that
/// outlived its term), and replaces it when the kubelet holds its restart back (an agent exits
/// when a fault outlasts its renew deadline; the back-off doubles up to 5 minutes).
async fn ensure_pod_agent(client: &kube::Client, pod: &k8s_openapi::api::core::v1::Pod) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    match pods.get_opt(POD_AGENT).await {
        Ok(None) => {
            let _ = pods.create(&PostParams::default(), pod).await;
        }
        Ok(Some(p)) => {
            let backing_off = p
                .status
                .and_then(|s| s.container_statuses)
                .into_iter()
                .flatten()
                .filter_map(|c| c.state?.waiting?.reason)
                .any(|r| r == "CrashLoopBackOff");
            if backing_off {
                let _ = pods
                    .delete(POD_AGENT, &kube::api::DeleteParams::default())
                    .await;
            }
        }
        Err(_) => {}
    }
}

/// Asks for a planned switchover (`arbiter handover`) to the pod candidate, or away from it to
/// the best other candidate (a host agent); a refusal (the target is not eligible just now)
/// leaves the lease where it is, and the trial waits.
async fn hand_over(kubeconfig: &Path, to_pod: bool) {
    let mut args = vec!["handover", LEASE, "-n", NS, "--timeout", "30s"];
    if to_pod {
        args.extend(["--to", POD_AGENT]);
    }
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
        .args(&args)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if !matches!(status, Ok(s) if s.success()) {
        let to = if to_pod { POD_AGENT } else { "a host agent" };
        eprintln!("chaos: the switchover to {to} did not happen ({status:?}); waiting");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
