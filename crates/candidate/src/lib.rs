//! Lead under arbiter from a Rust program: the library side of arbiter's Lease protocol, for
//! programs that lead in-process (and the engine under `arbiter run`).
//!
//! What it owns: registering a candidate, answering the arbiter, renewing the terms it assigns
//! ([`Candidate`]); connecting to the API server ([`client`]); the boot clock its deadlines run
//! on ([`clock`]); the checked values its durations take ([`flags`]). Beyond `arbiter-api` and
//! `arbiter-election` it depends on kube, tokio and tracing (and their small helpers), never on
//! the operator, a web server or a command-line parser.
//!
//! kube connects to the API server over TLS with the stack your program picks: enable
//! `rustls-tls` (or `openssl-tls`) on your own `kube` dependency (kube's default does), or the
//! same feature of this crate.
//!
//! A candidate registers a `LeaseCandidate`, answers the arbiter's pings, and **never takes a
//! lease**: it leads only when the arbiter names it holder. It then renews by compare-and-swap
//! every retry period. Leadership ends, and the term's cancellation token fires, as soon as any
//! of these happens:
//!
//! - no renew has succeeded for the renew deadline (on this process's monotonic clock);
//! - the lease names another holder, is deleted, or asks for a handover (`preferredHolder`);
//! - a background task (a watch) dies.
//!
//! The token therefore fires no later than the renew deadline after the last successful renew,
//! which is before the arbiter can assign the lease to anyone else (it waits for the lease
//! duration on its own clock, and `renew_deadline + kill_grace < lease_duration`). Work guarded
//! by a term must stop when its token fires; the term (`leaseTransitions`) is a fencing token
//! to hand to any resource that can check it.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use arbiter_candidate::{Candidate, State};
//!
//! let client = arbiter_candidate::client::connect().await?;
//! let handle = Candidate::builder("my-controller", "replica-0")
//!     .namespace("my-app")
//!     .binary_version("1.31.0")
//!     .start(client)
//!     .await?;
//! let mut state = handle.state();
//! loop {
//!     if let State::Leading { term, lost } = state.borrow_and_update().clone() {
//!         // Act as the leader, passing `term` to whatever checks fencing tokens...
//!         tokio::select! {
//!             _ = lost.cancelled() => { /* stop acting: leadership ended */ }
//!             _ = do_work(term) => {}
//!         }
//!     }
//!     state.changed().await?;
//! }
//! # }
//! # async fn do_work(_term: i32) {}
//! ```

pub mod client;
pub mod clock;
pub mod flags;
mod leadership;
mod registration;

pub use registration::{REFRESH, REFRESH_CONTESTED, REFRESH_ON_NEW_OTHER};

use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use arbiter_api::OLDEST_EMULATION_VERSION;
use arbiter_api::lease::LeaseStore;

/// Renewal timings (defaults: client-go's 15 s / 10 s / 2 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Who the candidate is and what it runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub lease: String,
    pub identity: String,
    pub namespace: String,
    pub binary_version: String,
    pub emulation_version: Option<String>,
    pub strategy: String,
    /// The Pod this candidate runs in: its LeaseCandidate is owned by (and garbage-collected
    /// with) the Pod.
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// The container's termination log (`/dev/termination-log` in a pod), where the process
    /// records its incarnation when it starts; written only if it exists.
    pub termination_log: Option<std::path::PathBuf>,
    /// The arbiter install that arbitrates this candidate (label `arbiter.dev/instance`).
    pub instance: Option<String>,
    pub timings: Timings,
}

/// The candidate's leadership, as a watch channel value.
#[derive(Clone, Debug)]
pub enum State {
    /// Registered; waiting for the arbiter to assign the lease.
    Following,
    /// Holding the lease at `term`. `lost` fires when leadership ends.
    Leading { term: i32, lost: CancellationToken },
    /// Leadership at `term` ended: stop acting now.
    Ended { term: i32, why: EndReason },
    /// A background task died: the candidate no longer follows the lease (final).
    Failed(String),
}

/// Why leadership ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The arbiter asked for a handover to a better candidate.
    Handover {
        to: String,
    },
    /// No renew succeeded for the renew deadline.
    RenewDeadline,
    /// The lease names someone else now.
    HolderChanged(Option<String>),
    LeaseDeleted,
    /// The lease watch ended.
    Failed(String),
}

/// Builds a [`Candidate`]. Only the lease and identity are required.
#[derive(Clone)]
pub struct Candidate {
    config: Config,
}

impl Candidate {
    pub fn builder(lease: &str, identity: &str) -> Candidate {
        Candidate {
            config: Config {
                lease: lease.into(),
                identity: identity.into(),
                namespace: "default".into(),
                binary_version: "0.0.0".into(),
                emulation_version: None,
                strategy: OLDEST_EMULATION_VERSION.into(),
                pod_name: None,
                pod_uid: None,
                termination_log: None,
                instance: None,
                timings: Timings::default(),
            },
        }
    }

    /// The arbiter install that arbitrates this candidate (`arbiter operator --instance`):
    /// the candidate is labelled `arbiter.dev/instance=NAME`.
    pub fn instance(mut self, name: &str) -> Self {
        self.config.instance = Some(name.into());
        self
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.config.namespace = ns.into();
        self
    }

    /// Also sets the emulation version, unless one is given.
    pub fn binary_version(mut self, v: &str) -> Self {
        self.config.binary_version = v.into();
        self
    }

    pub fn emulation_version(mut self, v: &str) -> Self {
        self.config.emulation_version = Some(v.into());
        self
    }

    pub fn strategy(mut self, s: &str) -> Self {
        self.config.strategy = s.into();
        self
    }

    /// The Pod this candidate runs in (name and uid).
    pub fn pod(mut self, name: &str, uid: &str) -> Self {
        self.config.pod_name = Some(name.into());
        self.config.pod_uid = Some(uid.into());
        self
    }

    /// The container's termination log (usually `/dev/termination-log`). The process writes
    /// its incarnation there when it starts, before it can take a term: once the container
    /// ends, the kubelet reports that message in the pod's status, and the arbiter hands the
    /// lease on at once instead of waiting for it to expire. Written only if the file exists
    /// (the kubelet creates it); a workload that writes its own termination message only
    /// loses that speed-up.
    pub fn termination_log(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.termination_log = Some(path.into());
        self
    }

    /// The renewal timings; [`Candidate::start`] refuses any but
    /// `0 < retry period < renew deadline < lease duration`, the lease duration in whole
    /// seconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use arbiter_candidate::{Candidate, Timings};
    ///
    /// let candidate = Candidate::builder("my-controller", "replica-0").timings(Timings {
    ///     lease_duration: Duration::from_secs(30),
    ///     renew_deadline: Duration::from_secs(20),
    ///     retry_period: Duration::from_secs(4),
    /// });
    /// assert_eq!(candidate.config().timings.lease_duration, Duration::from_secs(30));
    /// ```
    pub fn timings(mut self, t: Timings) -> Self {
        self.config.timings = t;
        self
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Checks the timings, registers the candidate and starts following the lease.
    pub async fn start(mut self, client: Client) -> anyhow::Result<Handle> {
        let t = &self.config.timings;
        if t.retry_period.is_zero()
            || t.retry_period >= t.renew_deadline
            || t.renew_deadline >= t.lease_duration
        {
            anyhow::bail!(
                "timings must satisfy 0 < retry period ({:?}) < renew deadline ({:?}) < lease duration ({:?})",
                t.retry_period,
                t.renew_deadline,
                t.lease_duration
            );
        }
        if t.lease_duration.subsec_nanos() != 0 || t.lease_duration.as_secs() > i32::MAX as u64 {
            anyhow::bail!(
                "the lease duration ({:?}) must be whole seconds: a Lease holds leaseDurationSeconds",
                t.lease_duration
            );
        }
        if let Some(instance) = &self.config.instance {
            arbiter_api::check_instance(instance).map_err(anyhow::Error::msg)?;
        }
        if self.config.emulation_version.is_none()
            && self.config.strategy == OLDEST_EMULATION_VERSION
        {
            self.config.emulation_version = Some(self.config.binary_version.clone());
        }
        let incarnation = format!("{:016x}", crate::random_id());
        if let Some(path) = &self.config.termination_log {
            record_incarnation(path, &incarnation);
        }
        let answered = registration::register(&client, &self.config, &incarnation).await?;
        let (tx, rx) = watch::channel(State::Following);
        let (ended_tx, ended) = watch::channel(None);
        let (renewed_tx, renewed) = watch::channel(None);
        let config = self.config.clone();
        let (c1, c2, inc, inc2) = (
            client.clone(),
            client.clone(),
            incarnation.clone(),
            incarnation.clone(),
        );
        let (cfg1, cfg2) = (config.clone(), config.clone());
        let task = tokio::spawn(async move {
            let e = tokio::select! {
                e = registration::keep_fresh(c1, cfg1, inc2, answered) => e,
                e = leadership::run(c2, cfg2, inc, tx.clone(), ended_tx, renewed_tx) => e,
            };
            // Whatever died, leadership ends with it: never a zombie leader.
            if let State::Leading { lost, .. } = &*tx.borrow() {
                lost.cancel();
            }
            tx.send_replace(State::Failed(format!("{e:#}")));
            e
        });
        Ok(Handle {
            client,
            config,
            incarnation,
            state: rx,
            ended,
            renewed,
            task,
        })
    }
}

/// A successful renew of a term: when it was sent, on this process's monotonic clock and on
/// the boot clock ([`crate::clock`], read at the same moment). Leadership of that term is
/// certain to end no later than this + the renew deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub term: i32,
    pub sent: Instant,
    /// `CLOCK_BOOTTIME` nanoseconds when it was sent (counts a suspended machine's sleep).
    pub sent_boot_ns: u64,
}

/// A running candidate.
pub struct Handle {
    client: Client,
    config: Config,
    incarnation: String,
    state: watch::Receiver<State>,
    ended: watch::Receiver<Option<(i32, EndReason)>>,
    renewed: watch::Receiver<Option<Renewed>>,
    task: tokio::task::JoinHandle<anyhow::Error>,
}

impl Handle {
    /// The leadership state; `changed()` wakes on every transition.
    pub fn state(&self) -> watch::Receiver<State> {
        self.state.clone()
    }

    /// How the last term ended, and which term (kept after the state moves on).
    pub fn last_end(&self) -> Option<(i32, EndReason)> {
        self.ended.borrow().clone()
    }

    /// The last successful renew: leadership of its term is certain to end no later than its
    /// send time + the renew deadline. `arbiter run` moves its watchdog's deadline with it (on
    /// the boot clock).
    pub fn renewed(&self) -> watch::Receiver<Option<Renewed>> {
        self.renewed.clone()
    }

    /// This process's incarnation (recorded on the lease while it holds it).
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Resolves when a background task dies (with its error). Leadership has then ended: the
    /// state is `Failed`, and any term's token has fired.
    pub async fn failed(&mut self) -> anyhow::Error {
        match (&mut self.task).await {
            Ok(e) => e,
            Err(e) => anyhow::anyhow!("candidate task panicked: {e}"),
        }
    }

    /// Gives the lease up if this process still holds it (after its work stopped), so the next
    /// holder need not wait for expiry. Bounded by a short timeout.
    pub async fn release(&self) -> anyhow::Result<bool> {
        let store = LeaseStore::new(self.client.clone(), &self.config.namespace);
        tokio::time::timeout(
            leadership::RELEASE_TIMEOUT,
            leadership::release(&store, &self.config, &self.incarnation),
        )
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("releasing the lease timed out")))
    }

    /// Leaves for good: ends the current term's `lost` token (work guarded by it must stop),
    /// stops following, deletes the candidate so the arbiter never elects a process that is
    /// gone, and gives the lease back if it still names this process.
    ///
    /// Call it **after your work has stopped**: the release lets the next holder start at once.
    ///
    /// ```no_run
    /// # async fn example(handle: arbiter_candidate::Handle) {
    /// // On shutdown (here Ctrl-C): stop the work first, then give the lease back.
    /// tokio::signal::ctrl_c().await.ok();
    /// stop_work().await;
    /// handle.shutdown().await;
    /// # }
    /// # async fn stop_work() {}
    /// ```
    /// If the release is impossible (the Lease was deleted or edited by hand) the arbiter waits
    /// the term out, so a library user's shutdown never shortens a term on its word alone.
    pub async fn shutdown(self) {
        let _ = self.leave(None, false).await;
    }

    /// The agent's exit, once its workload is certainly dead (its whole process group waited
    /// for): like [`Handle::shutdown`], but when it led and could not release (the Lease was
    /// deleted, or names nobody or someone else by a hand edit), or `overran` names a term
    /// whose workload ran past its end (the whole candidate was paused), the candidate is kept,
    /// marked withdrawn by this incarnation ([`arbiter_api::WITHDRAWN_ANNOTATION`], written as
    /// arbiter's field manager), with the overrun ([`arbiter_api::OVERRAN_ANNOTATION`]) for the
    /// arbiter's `DoubleHolder` report. The mark keeps the candidate from being elected again;
    /// it does not end the term early (anyone who may write candidates could forge it), so the
    /// next holder waits the term out. Returns the release's result.
    pub async fn exit_after_work_stopped(self, overran: Option<i32>) -> anyhow::Result<bool> {
        self.leave(overran, true).await
    }

    async fn leave(self, overran: Option<i32>, may_mark: bool) -> anyhow::Result<bool> {
        if let State::Leading { lost, .. } = &*self.state.borrow() {
            lost.cancel();
        }
        self.task.abort();
        let led =
            self.last_end().is_some() || matches!(*self.state.borrow(), State::Leading { .. });
        // A follower withdraws first, so the arbiter does not hand it the lease meanwhile; a
        // leader releases first, so that it knows whether the release was possible.
        let released = if led { self.release().await } else { Ok(false) };
        let keep = may_mark && (overran.is_some() || (led && !matches!(released, Ok(true))));
        let withdrawn = tokio::time::timeout(
            leadership::RELEASE_TIMEOUT,
            registration::withdraw(&self.client, &self.config, &self.incarnation, keep, overran),
        )
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
        if let Err(e) = withdrawn {
            tracing::warn!(error = %format!("{e:#}"), "withdrawing the candidate failed; the arbiter will find it unresponsive (if it renewed in the last seconds, only once it is elected and lets the lease expire)");
        }
        if let Err(e) = &released {
            tracing::warn!(error = %e, "releasing the lease failed; it will expire");
        }
        released
    }
}

/// Writes `incarnation` to the container's termination log, if there is one (a regular file:
/// never created here), and only if this process is in its container's own PID namespace.
/// Then the container's end proves this process and all it started are gone: the kernel ends
/// every process of a PID namespace with its first one, and reports that first one's exit only
/// after. In a PID namespace shared with the pod (`shareProcessNamespace`) or the host
/// (`hostPID`), processes may outlive the container's report: nothing is written, and the
/// arbiter waits for the lease to expire.
fn record_incarnation(path: &std::path::Path, incarnation: &str) {
    use std::io::Write;
    if !own_pid_namespace() {
        tracing::info!(
            "the container shares its PID namespace: a crash of this container will be handed on only once the lease expires"
        );
        return;
    }
    if !path.metadata().is_ok_and(|m| m.is_file()) {
        tracing::debug!(path = %path.display(), "no termination log: not in a pod");
        return;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path);
    let result = file.and_then(|mut f| {
        f.write_all(arbiter_api::lease::termination_message(incarnation).as_bytes())
    });
    match result {
        Ok(()) => {
            tracing::debug!(path = %path.display(), "recorded the incarnation in the termination log")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "no termination log: not in a pod")
        }
        Err(e) => tracing::warn!(
            path = %path.display(),
            error = %e,
            "cannot write the termination log: a crash of this container will be handed on only once the lease expires"
        ),
    }
}

/// Whether this process's PID namespace is its container's own: its first process (pid 1)
/// is in this process's cgroup. In a namespace shared with the pod, pid 1 is the sandbox's
/// pause process (another cgroup); with the host's, the host's init.
fn own_pid_namespace() -> bool {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    matches!((read("/proc/1/cgroup"), read("/proc/self/cgroup")), (Some(a), Some(b)) if a == b)
}

/// A random id for process incarnations and replica identities (not for cryptography).
#[doc(hidden)]
pub fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
