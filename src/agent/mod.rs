//! `arbiter run [flags] -- CMD [ARGS...]`: run CMD only while this candidate holds the lease.
//!
//! The agent registers a candidate and waits. When the arbiter names it holder, it renews once,
//! then starts CMD with `ARBITER_LEASE`, `ARBITER_IDENTITY` and `ARBITER_TERM` (the fencing
//! token) in its environment. When leadership ends for any reason it stops CMD's whole process
//! group (SIGTERM, SIGKILL after `--kill-grace`) and exits:
//!
//! | what happened | the agent | exit code |
//! |---|---|---|
//! | handover requested (a better candidate) | stops CMD, releases the lease, withdraws its candidate; once the lease has moved on, registers again as a new incarnation and stands by (with `--exit-on-handover`: exits) | (0) |
//! | renew deadline passed, holder changed, lease deleted, a background task died | stops CMD, withdraws its candidate, releases the lease if it still names it | 1 |
//! | the agent itself stalls or hangs | its guard ([`watchdog`]) stops CMD at last renew + renew deadline; resumed, the agent withdraws and exits | 1 |
//! | the whole candidate was frozen past its lease | the guard stops CMD on resuming; the candidate is kept, marked withdrawn, with the overrun recorded | 1 |
//! | the guard died (OOM killer, `kill -9`) while CMD runs | stops CMD at once (it would run on unwatched), withdraws its candidate, releases the lease | 1 |
//! | SIGTERM / SIGINT | stops CMD, withdraws its candidate, releases the lease | 0 |
//! | CMD exited on its own | withdraws its candidate, releases the lease | CMD's code |
//! | a flag error | prints it once, creates nothing | 2 |
//!
//! Withdrawing deletes the candidate, so the arbiter never elects (or hands over to) a process
//! that is gone; in a pod, the restarted agent registers afresh. After a handover the agent
//! stays: a standby outside a pod is not lost, and one in a pod does not restart its
//! container (a restart count and the kubelet's back-off on every handover).
//!
//! At start-up an unreachable API server is waited out (registration retried with backoff). As
//! a container's PID 1 the agent reaps orphaned processes ([`reaper`]).

mod child;
pub mod health;
pub mod reaper;
pub mod watchdog;

use std::time::Duration;

use crate::api::OLDEST_EMULATION_VERSION;
use crate::candidate::{Candidate, EndReason, State, Timings};
use arbiter_election::timings::kill_grace_fits;
use child::Workload;
use tokio_util::sync::CancellationToken;

pub use arbiter_election::timings::MIN_MARGIN;

const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// `arbiter run` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// The Lease to compete for.
    #[arg(long)]
    pub lease: String,
    /// This candidate's name, and its holderIdentity (default: POD_NAME).
    #[arg(long, env = "POD_NAME")]
    pub identity: String,
    /// Namespace of the lease and candidate (default: POD_NAMESPACE, else the in-cluster namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The version CMD is, e.g. 1.31.0.
    #[arg(long)]
    pub binary_version: String,
    /// The version CMD emulates (default: the binary version).
    #[arg(long)]
    pub emulation_version: Option<String>,
    /// OldestEmulationVersion, or a qualified third-party strategy name.
    #[arg(long, default_value = OLDEST_EMULATION_VERSION)]
    pub strategy: String,
    /// The arbiter install that arbitrates this candidate (its `--instance`): the candidate is
    /// labelled `arbiter.dev/instance=NAME` (default: none, for an install without one).
    #[arg(long, value_parser = crate::flags::instance)]
    pub instance: Option<String>,
    /// Written as the lease's duration on every renew (whole seconds).
    #[arg(long, default_value = "15s", value_parser = crate::flags::lease_duration)]
    pub lease_duration: Duration,
    /// Stop CMD when no renew has succeeded for this long (counted from when the last successful
    /// renew was sent). Renew deadline + kill grace + 0.5 s must fit in the lease duration.
    #[arg(long, default_value = "10s", value_parser = crate::flags::positive_duration)]
    pub renew_deadline: Duration,
    /// How often to renew.
    #[arg(long, default_value = "2s", value_parser = crate::flags::positive_duration)]
    pub retry_period: Duration,
    /// Time between SIGTERM and SIGKILL when stopping CMD (0s: SIGKILL at once).
    #[arg(long, default_value = "3s", value_parser = crate::flags::duration)]
    pub kill_grace: Duration,
    /// The Pod's uid, to make the candidate owned by (and deleted with) the Pod.
    #[arg(long, env = "POD_UID", hide_env_values = true)]
    pub pod_uid: Option<String>,
    /// The Pod's name, with --pod-uid (default: POD_NAME, else the identity): the candidate's
    /// owner, when --identity names the candidate otherwise.
    #[arg(long, env = "POD_NAME", hide_env_values = true)]
    pub pod_name: Option<String>,
    /// The container's termination log: the agent records its incarnation there when it
    /// starts, so that the arbiter hands the lease on as soon as the kubelet reports the
    /// container ended (instead of at expiry). Written only if the file exists; "" to disable.
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: std::path::PathBuf,
    /// Exit (code 0) after handing the lease over, instead of standing by again as a new
    /// incarnation (a standby outside a pod would otherwise stay; one in a pod would restart
    /// its container).
    #[arg(long)]
    pub exit_on_handover: bool,
    /// Serve GET /healthz on this address (e.g. 0.0.0.0:8081): 200 while this agent is a live
    /// candidate (standing by or leading), 503 before it has registered. For a liveness probe
    /// of a container whose own probe would fail on a standby.
    #[arg(long, value_name = "ADDR")]
    pub health_address: Option<std::net::SocketAddr>,
    /// The command to run while leading.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

impl Settings {
    fn check(&self) -> anyhow::Result<()> {
        if !kill_grace_fits(self.lease_duration, self.renew_deadline, self.kill_grace) {
            crate::usage!(
                "--renew-deadline ({:?}) + --kill-grace ({:?}) must be less than --lease-duration ({:?}), by at least {MIN_MARGIN:?}: otherwise CMD could still run when the lease is given to someone else",
                self.renew_deadline,
                self.kill_grace,
                self.lease_duration
            );
        }
        if self.retry_period >= self.renew_deadline {
            crate::usage!(
                "--retry-period ({:?}) must be less than --renew-deadline ({:?})",
                self.retry_period,
                self.renew_deadline
            );
        }
        Ok(())
    }

    fn namespace(&self) -> anyhow::Result<String> {
        if let Some(ns) = &self.namespace {
            return Ok(ns.clone());
        }
        std::fs::read_to_string(NAMESPACE_FILE)
            .map(|s| s.trim().to_string())
            .map_err(|_| {
                anyhow::Error::new(crate::flags::Usage(
                    "no namespace: pass --namespace or set POD_NAMESPACE".into(),
                ))
            })
    }
}

/// Runs the agent; returns the process exit code.
pub async fn run(settings: Settings) -> anyhow::Result<i32> {
    settings.check()?;
    let namespace = settings.namespace()?;
    // No request may outlive the renew deadline (the renew itself is cut off there too).
    let client =
        crate::client::connect_with(crate::client::Timeouts::both(settings.renew_deadline), None)
            .await?;
    let mut builder = Candidate::builder(&settings.lease, &settings.identity)
        .namespace(&namespace)
        .binary_version(&settings.binary_version)
        .strategy(&settings.strategy)
        .timings(Timings {
            lease_duration: settings.lease_duration,
            renew_deadline: settings.renew_deadline,
            retry_period: settings.retry_period,
        });
    if let Some(v) = &settings.emulation_version {
        builder = builder.emulation_version(v);
    }
    if let Some(uid) = &settings.pod_uid {
        let pod = settings.pod_name.as_deref().unwrap_or(&settings.identity);
        builder = builder.pod(pod, uid);
    }
    if !settings.termination_log.as_os_str().is_empty() {
        builder = builder.termination_log(&settings.termination_log);
    }
    if let Some(instance) = &settings.instance {
        builder = builder.instance(instance);
    }
    reaper::start_if_init();
    // Live once registered: standing by or leading (see `serve`).
    let (healthy, health) = tokio::sync::watch::channel(false);
    if let Some(address) = settings.health_address {
        health::start(address, health).await?;
    }
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        // Registration waits out an unreachable API server (with backoff, logged); SIGTERM
        // ends it.
        let handle = tokio::select! {
            handle = builder.clone().start(client.clone()) => handle?,
            _ = &mut shutdown => return Ok(0),
        };
        match serve(&settings, handle, &healthy, shutdown.as_mut()).await? {
            Served::Exit(code) => return Ok(code),
            Served::HandedOver => {
                // Back to standby as a new incarnation, once the lease has moved on (a
                // registration before would hold up the election of the one it went to).
                let store = crate::lease::LeaseStore::new(client.clone(), &namespace);
                tokio::select! {
                    _ = moved_on(&store, &settings) => {}
                    _ = &mut shutdown => return Ok(0),
                }
                tracing::info!("standing by again after the handover, as a new incarnation");
            }
        }
    }
}

/// How a term of service ended.
enum Served {
    Exit(i32),
    /// Handed the lease over (its workload stopped, candidate withdrawn): stand by again.
    HandedOver,
}

/// Waits (at most a lease duration) until the lease names another holder (not only nobody:
/// right after this agent's own release it names nobody, and its new incarnation stays out of
/// the election it stepped down from), or is gone.
async fn moved_on(store: &crate::lease::LeaseStore, settings: &Settings) {
    let give_up = tokio::time::Instant::now() + settings.lease_duration;
    while tokio::time::Instant::now() < give_up {
        match store.get(&settings.lease).await {
            Ok(Some(l)) => {
                let holder = crate::lease::holder(&l);
                if holder.is_some_and(|h| h != settings.identity) {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => tracing::debug!(error = %e, "reading the lease failed"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Runs one candidate incarnation: CMD while it leads; returns when this process should exit,
/// or stand by again after a handover.
async fn serve(
    settings: &Settings,
    handle: crate::candidate::Handle,
    healthy: &tokio::sync::watch::Sender<bool>,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> anyhow::Result<Served> {
    let mut state = handle.state();
    let live = |s: &State| matches!(s, State::Following | State::Leading { .. });
    healthy.send_replace(live(&state.borrow()));
    let mut renewals = handle.renewed();
    // The running workload, the term it runs under, and that term's cancellation token.
    let mut running: Option<Running> = None;

    loop {
        let lost = running.as_ref().map(|r| r.2.clone());
        let guard_gone = running.as_ref().map(|r| r.0.guard_gone());
        tokio::select! {
            // The guard died: CMD would run on without a watchdog. Stop it now.
            _ = async { guard_gone.expect("guarded").await }, if guard_gone.is_some() => {
                tracing::error!("the workload's guard died: stopping the workload");
                let why = EndReason::Failed("the workload's guard died".into());
                return Ok(stop_and_exit(handle, running.take(), why, settings).await);
            }
            // The running term ended (loss, handover, a dead background task): stop at once.
            _ = async { lost.as_ref().expect("guarded").cancelled().await }, if lost.is_some() => {
                let term = running.as_ref().map(|r| r.1);
                let why = match (handle.last_end(), state.borrow().clone()) {
                    (Some((t, why)), _) if Some(t) == term => why,
                    (_, State::Failed(e)) => EndReason::Failed(e),
                    _ => EndReason::Failed("leadership ended".into()),
                };
                return Ok(stop_and_exit(handle, running.take(), why, settings).await);
            }
            changed = state.changed() => {
                if changed.is_err() {
                    continue; // the sender is gone: the state says why
                }
                let current = state.borrow_and_update().clone();
                healthy.send_replace(live(&current));
                match step(current, running.as_ref().map(|r| r.1), &handle) {
                    Step::Keep => {}
                    Step::Start { term, lost } => match start(settings, term, &mut renewals) {
                        Ok(w) => running = Some((w, term, lost)),
                        Err(e) => {
                            handle.shutdown().await;
                            return Err(e);
                        }
                    },
                    Step::Stop(why) => {
                        return Ok(stop_and_exit(handle, running.take(), why, settings).await);
                    }
                }
            }
            // A successful renew: move the guard's deadline.
            changed = renewals.changed(), if running.is_some() => {
                if changed.is_err() {
                    continue;
                }
                let renewed = *renewals.borrow_and_update();
                if let (Some(r), Some((w, term, _))) = (renewed, running.as_ref())
                    && r.term == *term
                {
                    w.extend(crate::clock::after(r.sent_boot_ns, settings.renew_deadline));
                }
            }
            code = async { running.as_mut().expect("guarded").0.wait().await }, if running.is_some() => {
                let renewed = *renewals.borrow();
                return Ok(exited(handle, running.take(), code, renewed, settings).await);
            }
            _ = &mut shutdown => {
                let overran = match running.take() {
                    Some((w, term, _)) => overran(term, w.stop(settings.kill_grace).await),
                    None => None,
                };
                let _ = handle.exit_after_work_stopped(overran).await;
                return Ok(Served::Exit(0));
            }
        }
    }
}

/// The workload exited with `code`. One that "exits" once its term is over (the guard stopped
/// it while this process was stalled, or leadership just ended) did not exit on its own: this
/// process ends as at the term's end. Otherwise the lease is released.
async fn exited(
    handle: crate::candidate::Handle,
    running: Option<Running>,
    code: i32,
    renewed: Option<crate::candidate::Renewed>,
    settings: &Settings,
) -> Served {
    let term = running.as_ref().map(|r| r.1);
    if term_over(running.as_ref(), renewed, settings.renew_deadline) {
        tracing::warn!(
            code,
            ?term,
            "the workload stopped after its term ended (the guard stops it at the renew deadline)"
        );
        let why = ended_reason(&handle, term).unwrap_or(EndReason::RenewDeadline);
        return stop_and_exit(handle, running, why, settings).await;
    }
    tracing::info!(code, "the workload exited on its own: releasing the lease");
    let overran = match running {
        Some((w, term, _)) => overran(term, w.finish(code).await),
        None => None,
    };
    let _ = handle.exit_after_work_stopped(overran).await;
    Served::Exit(code)
}

/// The running workload, the term it runs under, and that term's cancellation token.
type Running = (Workload, i32, CancellationToken);

/// What a new leadership state means for the workload.
enum Step {
    /// Start it under `term` (none runs).
    Start { term: i32, lost: CancellationToken },
    /// Nothing changes.
    Keep,
    /// Stop it and end this process.
    Stop(EndReason),
}

/// The step for leadership state `current`, with the workload running under `running_term`.
/// Any state but leading at the running term (even leading at a newer one: the running
/// workload's term is over) or following with nothing running ends this process.
fn step(current: State, running_term: Option<i32>, handle: &crate::candidate::Handle) -> Step {
    match current {
        State::Leading { term, lost } if running_term.is_none() => Step::Start { term, lost },
        State::Leading { term, .. } if running_term == Some(term) => Step::Keep,
        State::Leading { term, .. } => {
            Step::Stop(ended_reason(handle, running_term).unwrap_or_else(|| {
                EndReason::Failed(format!(
                    "the workload's term ended; the lease is at term {term}"
                ))
            }))
        }
        State::Ended { why, .. } => Step::Stop(why),
        State::Failed(e) => Step::Stop(EndReason::Failed(e)),
        State::Following if running_term.is_some() => Step::Stop(
            ended_reason(handle, running_term)
                .unwrap_or_else(|| EndReason::Failed("no longer leading".into())),
        ),
        State::Following => Step::Keep,
    }
}

/// Starts the workload under `term`. The guard stops it at the last renew + renew deadline
/// unless the agent keeps moving that deadline (and it is the only way it moves).
fn start(
    settings: &Settings,
    term: i32,
    renewals: &mut tokio::sync::watch::Receiver<Option<crate::candidate::Renewed>>,
) -> anyhow::Result<Workload> {
    let env = [
        ("ARBITER_LEASE", settings.lease.clone()),
        ("ARBITER_IDENTITY", settings.identity.clone()),
        ("ARBITER_TERM", term.to_string()),
    ];
    let renewed = *renewals.borrow_and_update();
    let deadline = match renewed {
        Some(r) if r.term == term => crate::clock::after(r.sent_boot_ns, settings.renew_deadline),
        _ => crate::clock::boottime_now(), // never: CMD is refused a start
    };
    // A kill later than this after its deadline may have overlapped a successor (the arbiter
    // waits out the lease duration).
    let margin = settings.lease_duration - settings.renew_deadline - settings.kill_grace;
    Workload::start(
        &settings.command,
        &env,
        deadline,
        settings.kill_grace,
        margin,
    )
}

/// Whether the running workload's term is over: its leadership ended, or no renewal of that
/// term keeps the guard's deadline ahead.
fn term_over(
    running: Option<&Running>,
    renewed: Option<crate::candidate::Renewed>,
    renew_deadline: Duration,
) -> bool {
    let term = running.map(|r| r.1);
    running.is_some_and(|r| r.2.is_cancelled())
        || !matches!(renewed, Some(r) if Some(r.term) == term
            && crate::clock::boottime_now() < crate::clock::after(r.sent_boot_ns, renew_deadline))
}

/// Why the workload's term ended, if the library recorded it.
fn ended_reason(handle: &crate::candidate::Handle, term: Option<i32>) -> Option<EndReason> {
    handle
        .last_end()
        .filter(|(t, _)| Some(*t) == term)
        .map(|(_, why)| why)
}

/// Stops the workload (if any), withdraws the candidate and gives the lease back: then stand
/// by again after a handover (or exit 0 with `--exit-on-handover`), exit 1 after any other end
/// of leadership.
async fn stop_and_exit(
    handle: crate::candidate::Handle,
    running: Option<(Workload, i32, CancellationToken)>,
    why: EndReason,
    settings: &Settings,
) -> Served {
    let term = running.as_ref().map(|r| r.1);
    tracing::warn!(?term, reason = ?why, "leadership ended: stopping the workload");
    let overran = match running {
        Some((w, term, _)) => overran(term, w.stop(settings.kill_grace).await),
        None => None,
    };
    // Whatever ended it, this process is leaving: withdrawn, it is never elected again (a new
    // process of this identity registers afresh), and the lease is given back if it still
    // names this process (after a handover, or a slow API).
    let released = handle.exit_after_work_stopped(overran).await;
    match why {
        // An overrun is an end like any other: the process leaves.
        EndReason::Handover { to } if overran.is_none() => {
            if released.is_ok() {
                tracing::info!(%to, "handed the lease over");
            }
            if settings.exit_on_handover {
                Served::Exit(0)
            } else {
                Served::HandedOver
            }
        }
        _ => Served::Exit(1),
    }
}

/// The term to report when the guard had to stop the workload late (the whole candidate was
/// paused): a successor may have run beside it (the operator's `DoubleHolder` report).
fn overran(term: i32, ended: child::Ended) -> Option<i32> {
    if !ended.overran {
        return None;
    }
    tracing::error!(
        term,
        "the workload ran past its term (this candidate was paused): a successor may have run beside it; only the fencing token protected the resource"
    );
    Some(term)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
}
