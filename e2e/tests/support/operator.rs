//! The real `arbiter operator` as a child process, scoped to one test's namespace, and helpers
//! that play candidates by answering its pings.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbiter::api::{LeaseCandidate, LeaseCandidateSpec};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{TestEnv, eventually};

/// A running `arbiter operator`, killed on drop. Its log is kept in a file for failures.
/// Fast HA timings for tests with two operator replicas: HA lease 6 s, renew deadline 4 s,
/// retry 1 s.
pub const FAST_HA: [&str; 6] = [
    "--ha-lease-duration",
    "6s",
    "--ha-renew-deadline",
    "4s",
    "--ha-retry-period",
    "1s",
];

pub struct Operator {
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Operator {
    /// Starts the operator for `env`'s namespace, with `extra` flags.
    pub fn start(env: &TestEnv, extra: &[&str]) -> Operator {
        Self::start_with(&env.kubeconfig, &env.ns, extra)
    }

    pub fn start_with(kubeconfig: &Path, ns: &str, extra: &[&str]) -> Operator {
        let mut args = vec![
            "--namespace",
            ns,
            "--watch-namespace",
            ns,
            "--metrics-address",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        Self::start_args(kubeconfig, &args)
    }

    /// Starts `arbiter operator ARGS...` with `kubeconfig`.
    pub fn start_args(kubeconfig: &Path, args: &[&str]) -> Operator {
        Self::start_bin(None, kubeconfig, args)
    }

    /// The same, with the operator binary `bin` (default: `ARBITER_OPERATOR_BIN`, another
    /// build of the operator the bench compares with, else this build's).
    pub fn start_bin(bin: Option<&Path>, kubeconfig: &Path, args: &[&str]) -> Operator {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("operator.log");
        let file = std::fs::File::create(&log).unwrap();
        let bin: std::ffi::OsString = match bin {
            Some(b) => b.into(),
            None => std::env::var_os("ARBITER_OPERATOR_BIN")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_arbiter").into()),
        };
        let child = Command::new(bin)
            .arg("operator")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,arbiter=debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("starting arbiter operator");
        Operator {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until `/readyz` answers ok: the operator leads and its caches are synced, so a
    /// write made from now on reaches it as a watch event, not in its first list.
    pub async fn wait_ready(&self) {
        eventually("the operator ready", Duration::from_secs(60), || async {
            self.http_get("/readyz").await.ends_with("ok").then_some(())
        })
        .await;
    }

    /// GETs `path` from the operator's metrics server (its address is in its log).
    pub async fn http_get(&self, path: &str) -> String {
        super::get_from_logged(|| self.logs(), "serving /metrics", path).await
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What its debug log says it decided for `lease` (`NAMESPACE/NAME`), in order: each
    /// decision's action and the candidates' standings (`Action { .. } standings={..}`).
    #[allow(dead_code)] // not used by every test binary
    pub fn decided(&self, lease: &str) -> Vec<String> {
        let logs = strip_ansi(&self.logs());
        logs.lines()
            .filter(|l| l.contains("decided") && l.contains(&format!("lease={lease} ")))
            .filter_map(|l| l.split("action=").nth(1))
            .map(str::to_string)
            .collect()
    }

    /// The actions it decided for `lease` (`NAMESPACE/NAME`), in order, consecutive repeats
    /// dropped.
    #[allow(dead_code)] // not used by every test binary
    pub fn decisions(&self, lease: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for d in self.decided(lease) {
            let action = d.split(" standings=").next().unwrap_or(&d).to_string();
            if out.last() != Some(&action) {
                out.push(action);
            }
        }
        out
    }

    /// Waits until the operator has counted candidate `name` of namespace `ns` as eligible in a
    /// decision (it writes no status for an eligible candidate: its decisions' standings say).
    #[allow(dead_code)] // not used by every test binary
    pub async fn wait_eligible(&self, ns: &str, name: &str) {
        let (lease_of, standing) = (format!("lease={ns}/"), format!("\"{name}\": Eligible("));
        super::eventually(
            &format!("{name} counted Eligible"),
            std::time::Duration::from_secs(40),
            || async {
                let logs = strip_ansi(&self.logs());
                logs.lines()
                    .any(|l| {
                        l.contains("decided") && l.contains(&lease_of) && l.contains(&standing)
                    })
                    .then_some(())
            },
        )
        .await;
    }

    /// Whether the process has exited.
    #[allow(dead_code)] // used by the chaos suite
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Waits for the process to exit and returns its status code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let what = format!("operator (log:\n{})", self.logs());
        super::wait_child(&mut self.child, deadline, || what.clone()).await
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Keep the log where the caller asked (the chaos suite keeps every replica's).
        if let Some(keep) = std::env::var_os("ARBITER_E2E_KEEP_LOGS") {
            let name = format!("operator-{}.log", self.child.id());
            let _ = std::fs::copy(&self.log, std::path::Path::new(&keep).join(name));
        }
        if std::thread::panicking() {
            eprintln!(
                "--- operator log ({}) ---\n{}",
                self.log.display(),
                self.logs()
            );
        }
    }
}

/// `candidate`'s condition `type_`, as (status, reason).
pub async fn condition(env: &TestEnv, candidate: &str, type_: &str) -> Option<(String, String)> {
    let api: Api<LeaseCandidate> = env.api();
    let c = api.get(candidate).await.ok()?;
    let cond = c
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((cond.status, cond.reason))
}

impl Operator {
    /// Waits until this (standby) replica has looked at the operators' HA Lease.
    pub async fn wait_watching(&self) {
        eventually(
            "the standby to watch the operator lease",
            std::time::Duration::from_secs(30),
            || async {
                self.logs()
                    .contains("watching the operator lease")
                    .then_some(())
            },
        )
        .await;
    }
}

/// Creates a candidate (its renewTime set, as a registering candidate does).
pub async fn create_candidate(
    env: &TestEnv,
    name: &str,
    lease: &str,
    binary: &str,
    emulation: Option<&str>,
    strategy: &str,
    owner: Option<OwnerReference>,
) -> LeaseCandidate {
    let api: Api<LeaseCandidate> = env.api();
    let mut c = LeaseCandidate::new(
        name,
        LeaseCandidateSpec {
            lease_name: lease.into(),
            binary_version: binary.into(),
            emulation_version: emulation.map(str::to_string),
            strategy: strategy.into(),
            ping_time: None,
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
        },
    );
    c.metadata.owner_references = owner.map(|o| vec![o]);
    api.create(&PostParams::default(), &c)
        .await
        .unwrap_or_else(|e| panic!("creating candidate {name}: {e}"))
}

/// Answers the arbiter's pings for the candidates named in `alive`, as candidate agents do:
/// each new `pingTime` once, with a `renewTime` other than the one on the candidate (and not
/// below the ping). Remove a name to make that candidate go silent.
pub struct Responder {
    pub alive: Arc<Mutex<HashSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    pub fn start(client: Client, ns: &str, alive: &[&str]) -> Responder {
        let alive = Arc::new(Mutex::new(
            alive.iter().map(|s| s.to_string()).collect::<HashSet<_>>(),
        ));
        let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), ns);
        let set = alive.clone();
        let ns = ns.to_string();
        let task = tokio::spawn(async move {
            // Tolerant, as the operator's: a test may make a candidate no plain watch decodes.
            let mut events = arbiter::tolerant::watch::<LeaseCandidate>(
                client,
                Some(&ns),
                watcher::Config::default(),
            )
            .applied_objects()
            .boxed();
            let mut answered: std::collections::HashMap<String, MicroTime> = Default::default();
            while let Some(ev) = events.next().await {
                let Ok(c) = ev else { continue };
                let (Some(ping), renew) = (&c.spec.ping_time, &c.spec.renew_time) else {
                    continue;
                };
                if answered.get(&c.name_any()) == Some(ping)
                    || !set.lock().unwrap().contains(&c.name_any())
                {
                    continue;
                }
                answered.insert(c.name_any(), ping.clone());
                let now = jiff::Timestamp::now();
                let mut ack =
                    jiff::Timestamp::from_microsecond(ping.0.max(now).as_microsecond()).unwrap();
                if renew.as_ref().is_some_and(|r| r.0 == ack) {
                    ack += jiff::SignedDuration::from_micros(1);
                }
                let patch = json!({"spec": {"renewTime": MicroTime(ack)}});
                let _ = api
                    .patch(&c.name_any(), &PatchParams::default(), &Patch::Merge(patch))
                    .await;
            }
        });
        Responder { alive, task }
    }

    pub fn silence(&self, name: &str) {
        self.alive.lock().unwrap().remove(name);
    }

    /// A handle that silences a candidate from another task.
    pub fn silencer(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let alive = self.alive.clone();
        move |name| {
            alive.lock().unwrap().remove(name);
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Plays a well-behaved holder for every name in `names`: renews the Lease while it names one of
/// them, and releases it (holder `""`, by compare-and-swap) when a different preferred holder is
/// set. Returns the task; abort it to make the holders stop renewing.
pub fn hold_and_release(
    client: Client,
    ns: &str,
    lease: &str,
    names: &[&str],
) -> tokio::task::JoinHandle<()> {
    hold_and_release_with(client, ns, lease, names, |_| {})
}

/// [`hold_and_release`], calling `before_release` with the preferred holder just before each
/// release (to make something happen in between).
pub fn hold_and_release_with(
    client: Client,
    ns: &str,
    lease: &str,
    names: &[&str],
    before_release: impl Fn(&str) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let store = arbiter::lease::LeaseStore::new(client, ns);
    let (lease, names): (String, Vec<String>) =
        (lease.into(), names.iter().map(|s| s.to_string()).collect());
    tokio::spawn(async move {
        loop {
            if let Ok(Some(mut l)) = store.get(&lease).await
                && let Some(holder) = arbiter::lease::holder(&l).map(str::to_string)
                && names.contains(&holder)
            {
                let preferred = arbiter::lease::preferred_holder(&l).map(str::to_string);
                match preferred.filter(|p| *p != holder) {
                    Some(to) => {
                        before_release(&to);
                        // As an agent releases: holder "", and who stepped down.
                        arbiter::lease::mark_released(&mut l, Some(&holder));
                    }
                    None => l.spec.as_mut().unwrap().renew_time = Some(arbiter::lease::now()),
                }
                let _ = store.replace(&l).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// (holder, preferred holder, term) of one version of a Lease.
pub type LeaseVersion = (Option<String>, Option<String>, i32);

/// Every version of a Lease a watch saw, in order (consecutive repeats dropped).
#[derive(Clone)]
pub struct LeaseHistory(Arc<Mutex<Vec<LeaseVersion>>>);

impl LeaseHistory {
    /// The versions seen so far, once the watch has seen `holder` hold `term`: a watch lags
    /// the GET a test polls with, so reading the history as soon as the GET shows the outcome
    /// may miss the last versions.
    pub async fn until_held(&self, holder: &str, term: i32) -> Vec<LeaseVersion> {
        eventually(
            &format!("the lease watch to see {holder} hold term {term}"),
            Duration::from_secs(30),
            || async {
                let seen = self.0.lock().unwrap();
                seen.iter()
                    .any(|(h, _, t)| h.as_deref() == Some(holder) && *t == term)
                    .then(|| seen.clone())
            },
        )
        .await
    }
}

/// Every (holder, preferred holder, term) the Lease goes through, recorded by a watch. Returns
/// once the watch has seen the Lease as it is now (which must exist), so that nothing written
/// after the call is missed; a watch error does not end the recording.
pub async fn record_lease(env: &TestEnv, name: &str) -> LeaseHistory {
    let seen = record(env.api::<Lease>(), name, |l| {
        (
            arbiter::lease::holder(l).map(str::to_string),
            arbiter::lease::preferred_holder(l).map(str::to_string),
            arbiter::lease::term(l),
        )
    })
    .await;
    LeaseHistory(seen)
}

/// What `entry` makes of every version of object `name` a watch sees from now on (consecutive
/// repeats dropped). Returns once the watch has seen the object as it is now (which must
/// exist); a watch error does not end the recording.
pub async fn record<K, T>(
    api: Api<K>,
    name: &str,
    entry: impl Fn(&K) -> T + Send + 'static,
) -> Arc<Mutex<Vec<T>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
    T: PartialEq + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher(api, cfg).applied_objects().boxed();
        while let Some(ev) = events.next().await {
            let Ok(obj) = ev else { continue };
            let e = entry(&obj);
            let mut v = out.lock().unwrap();
            if v.last() != Some(&e) {
                v.push(e);
            }
        }
    });
    eventually(
        &format!("the watch to see {name}"),
        Duration::from_secs(30),
        || async { (!seen.lock().unwrap().is_empty()).then_some(()) },
    )
    .await;
    seen
}

/// Waits until the Lease names `holder`, and returns it.
pub async fn wait_for_holder(
    env: &TestEnv,
    lease: &str,
    holder: &str,
    deadline: Duration,
) -> Lease {
    let api: Api<Lease> = env.api();
    eventually(
        &format!("lease {lease} held by {holder}"),
        deadline,
        || async {
            let l = api.get_opt(lease).await.ok()??;
            (arbiter::lease::holder(&l) == Some(holder)).then_some(l)
        },
    )
    .await
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
