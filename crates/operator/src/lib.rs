//! `arbiter operator`: the arbiter. Elects a holder per lease and hands leases over.
//!
//! What it owns: the caches, the reconcile and its phases, forced exits, the webhooks (agent
//! injection, single-active workloads), metrics and the operator's own high availability. It
//! calls the election rules in `arbiter-election` and writes through `arbiter-api`'s Lease
//! protocol; it must never depend on the `arbiter` binary (the CLI, the agent).
//!
//! Every replica keeps its caches warm; one replica acts, chosen through its own Lease
//! ([`ha`]). The acting replica reconciles leases ([`reconcile`]); if it cannot renew its own
//! Lease, or any watch dies, the process exits: a replica never acts without holding the Lease.

pub mod cache;
#[cfg(test)]
mod fake_api;
pub(crate) mod force;
pub(crate) mod ha;
pub(crate) mod key;
pub mod memory;
pub(crate) mod metrics;
pub(crate) mod queue;
pub(crate) mod reconcile;
pub mod report;
pub(crate) mod single_active;
pub mod term;
pub mod webhook;
pub mod workloads;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::runtime::events::Reporter;

use arbiter_api::lease::LeaseStore;
use arbiter_election::decide::Rules;

/// How many independent writes for one lease (pings, candidates' statuses) are in flight at
/// once.
const CONCURRENT_WRITES: usize = 8;

/// `arbiter operator` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Namespace of the operator's own HA Lease (default: POD_NAMESPACE, else the in-cluster
    /// namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Only arbitrate leases in these namespaces, comma-separated (default: all namespaces).
    /// Each is watched on its own, so the operator needs rights in those namespaces only.
    /// (`--watch-namespace` is the same flag.)
    #[arg(
        long = "watch-namespaces",
        visible_alias = "watch-namespace",
        env = "WATCH_NAMESPACE",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,
    /// Only arbitrate leases in the namespaces whose labels match this label selector (the
    /// API server's syntax, as `kubectl get namespaces -l`: `team=payments`,
    /// `tier in (prod,staging)`, `!legacy`), followed as labels change. The operator watches
    /// every namespace (its caches still hold theirs) and needs to list and watch Namespaces;
    /// it writes nothing in a namespace that does not match. Cannot be combined with
    /// --watch-namespaces.
    #[arg(long, env = "NAMESPACE_SELECTOR", conflicts_with = "watch_namespaces")]
    pub namespace_selector: Option<String>,
    /// This install's instance class: it arbitrates only candidates, single-active workloads
    /// and injected pods labelled `arbiter.dev/instance=NAME`, labels the Leases it makes with
    /// it, and never writes a Lease labelled with another instance (default: none, for what
    /// carries no such label). Give each install that may see the same namespace its own.
    #[arg(long, value_parser = arbiter_candidate::flags::instance)]
    pub instance: Option<String>,
    /// Name of the operator's own HA Lease.
    #[arg(long, default_value = "arbiter-operator")]
    pub leader_election_lease: String,
    /// This replica's identity in the HA Lease (default: POD_NAME, else the hostname, plus a
    /// random suffix).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// leaseDurationSeconds written on the Leases the arbiter assigns (whole seconds).
    #[arg(long, default_value = "15s", value_parser = arbiter_candidate::flags::lease_duration)]
    pub lease_duration: Duration,
    /// How long a pinged candidate has to acknowledge.
    #[arg(long, default_value = "5s", value_parser = arbiter_candidate::flags::positive_duration)]
    pub ack_window: Duration,
    /// How long a candidate's write of its `renewTime` (an answer to a ping, its registration,
    /// a refresh) proves it alive without another ping (default and least: twice
    /// --ack-window; at most 5m). Longer saves pings when elections queue behind each other
    /// (thousands of candidates registering at once), at the price of electing a candidate that
    /// died within it: its lease then expires, as a dead holder's does.
    #[arg(long, value_parser = arbiter_candidate::flags::positive_duration)]
    pub ack_valid_for: Option<Duration>,
    /// A lease's first election, and a live holder's handover to a better candidate, wait until
    /// no eligible candidate has registered for this long (0s: never; at most --ack-window, and
    /// never more than --ack-window after the first registration, or the better candidate's),
    /// so candidates started together elect the oldest version from the first term instead of
    /// the first to register, and a holder hands over once, to the oldest (it works meanwhile).
    /// After a term ends the election waits only when no candidate it could elect was there
    /// before (each registered after the term ended, or within this time before it), at most
    /// --ack-window from the term's end.
    #[arg(long, default_value = "2s", value_parser = arbiter_candidate::flags::duration)]
    pub settle: Duration,
    /// Report candidates whose binaryVersion is more than this many minor versions from the
    /// oldest live candidate's.
    #[arg(long)]
    pub max_skew: Option<u64>,
    /// Also refuse to elect such candidates (needs --max-skew).
    #[arg(long, requires = "max_skew")]
    pub refuse_skew: bool,
    /// Operator HA: duration of the operator's own Lease (a standby takes over this long after
    /// the active replica stopped renewing; at once if it released). Whole seconds.
    #[arg(long, default_value = "15s", value_parser = arbiter_candidate::flags::lease_duration)]
    pub ha_lease_duration: Duration,
    /// Operator HA: the active replica stops writing when it could not renew for this long
    /// (counted from when its last successful renew was sent); it exits once another replica
    /// has taken over.
    #[arg(long, default_value = "10s", value_parser = arbiter_candidate::flags::positive_duration)]
    pub ha_renew_deadline: Duration,
    /// Operator HA: how often the active replica renews, and standbys retry.
    #[arg(long, default_value = "2s", value_parser = arbiter_candidate::flags::positive_duration)]
    pub ha_retry_period: Duration,
    /// Address for /metrics, /livez and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,
    /// Delete candidates that belong to no pod and have not renewed for this long (at least
    /// 15m: agents refresh every 5m).
    #[arg(long, default_value = "30m", value_parser = arbiter_candidate::flags::candidate_expiry)]
    pub candidate_expiry: Duration,
    /// What to do with a deposed holder's pod that keeps running after its term lapsed.
    #[arg(long, value_enum, default_value = "evict")]
    pub on_depose: arbiter_api::OnDepose,
    /// `/livez` fails when one reconcile has run this long (the worker is stuck; every API
    /// request has a timeout, so a healthy reconcile never gets near it).
    #[arg(long, default_value = "5m", value_parser = arbiter_candidate::flags::positive_duration)]
    pub reconcile_stall: Duration,
    /// Leases reconciled at once (1 to 64): each lease always by the same worker, never two
    /// at a time. A worker spends most of a reconcile waiting on the API server, so a burst of
    /// elections keeps pace with the candidates registering only with enough of them.
    #[arg(long, default_value = "32", value_parser = clap::value_parser!(u16).range(1..=metrics::MAX_WORKERS as i64))]
    pub concurrency: u16,
    /// Candidates the operator arbitrates per namespace (0: no limit). Beyond it, the newest
    /// candidates are refused (`Eligible=False`, `LimitExceeded`, and a Warning Event), not
    /// elected, and cached only as a stub; the older ones' elections go on. At about 3.5 KiB
    /// per cached candidate, a namespace at the default holds about 35 MiB of the operator's
    /// memory.
    #[arg(long, default_value = "10000")]
    pub max_candidates_per_namespace: usize,
    /// Distinct leases the candidates of one namespace may name (0: no limit). Candidates for a
    /// lease beyond it are refused like those beyond --max-candidates-per-namespace, and no
    /// Lease is made for it.
    #[arg(long, default_value = "3000")]
    pub max_leases_per_namespace: usize,
    /// How due leases share each worker: `namespaces` takes the namespaces with due leases in
    /// turn, one lease each, then the longest-waiting lease within a namespace (a burst of
    /// elections in one namespace delays another namespace's failover by at most one reconcile
    /// per namespace with due work); `none` takes the longest-waiting lease whatever its
    /// namespace (one namespace's burst delays every other's; kept for comparison).
    #[arg(long, value_enum, default_value = "namespaces")]
    pub queue_fairness: queue::Fairness,
    /// Apply the LeaseCandidate CRD at start-up (server-side apply).
    #[arg(long)]
    pub install_crds: bool,
    #[command(flatten)]
    pub webhook: webhook::Settings,
    #[arg(skip)]
    pub rules: Rules,
}

impl Settings {
    /// The timings of the operator's own HA lease.
    fn ha_timings(&self) -> ha::Timings {
        ha::Timings {
            lease_duration: self.ha_lease_duration,
            renew_deadline: self.ha_renew_deadline,
            retry_period: self.ha_retry_period,
        }
    }

    pub fn reporter(&self) -> Reporter {
        Reporter {
            controller: "arbiter".into(),
            instance: self.identity.clone(),
        }
    }

    /// What each watch covers: one namespace each of `--watch-namespaces`, or all (`None`).
    pub fn scopes(&self) -> Vec<Option<String>> {
        let mut namespaces: Vec<String> = (self.watch_namespaces.iter())
            .filter(|ns| !ns.is_empty())
            .cloned()
            .collect();
        if namespaces.is_empty() {
            return vec![None];
        }
        namespaces.sort();
        namespaces.dedup();
        namespaces.into_iter().map(Some).collect()
    }

    /// The timeout of every API write: half the HA renew deadline, and no more than three
    /// quarters of the time between the renew deadline and the HA lease's expiry (so a write
    /// sent just before the gate closed is abandoned before a standby can take over). Reads get
    /// half the renew deadline.
    pub fn request_timeout(&self) -> Duration {
        (self.ha_renew_deadline / 2).min((self.ha_lease_duration - self.ha_renew_deadline) * 3 / 4)
    }

    fn validate(&mut self) -> anyhow::Result<()> {
        self.webhook.validate()?;
        if self.namespace_selector.as_deref().map(str::trim) == Some("")
            || (self.namespace_selector.is_some() && !self.scopes().contains(&None))
        {
            arbiter_candidate::usage!(
                "--namespace-selector needs a selector, and cannot be combined with --watch-namespaces"
            );
        }
        if self.ha_retry_period >= self.ha_renew_deadline
            || self.ha_renew_deadline >= self.ha_lease_duration
        {
            arbiter_candidate::usage!(
                "need --ha-retry-period ({:?}) < --ha-renew-deadline ({:?}) < --ha-lease-duration ({:?})",
                self.ha_retry_period,
                self.ha_renew_deadline,
                self.ha_lease_duration
            );
        }
        let ack_valid_for = self.ack_valid_for.unwrap_or(self.ack_window * 2);
        if ack_valid_for < self.ack_window * 2 {
            arbiter_candidate::usage!(
                "--ack-valid-for ({ack_valid_for:?}) must be at least twice --ack-window ({:?}): an answer that comes late in the window would be too old to count by the time its election is decided, and the candidate would be pinged again and again",
                self.ack_window
            );
        }
        if self.ack_valid_for.is_some() && ack_valid_for > arbiter_candidate::REFRESH {
            arbiter_candidate::usage!(
                "--ack-valid-for ({ack_valid_for:?}) must be at most {:?} (an agent's refresh): beyond it every live candidate counts as alive anyway, and a dead one for longer",
                arbiter_candidate::REFRESH
            );
        }
        if self.settle > self.ack_window {
            arbiter_candidate::usage!(
                "--settle ({:?}) must be at most --ack-window ({:?}): the settle waits at most an ack window",
                self.settle,
                self.ack_window
            );
        }
        self.rules = Rules {
            ack_window: self.ack_window,
            ack_valid_for,
            settle: self.settle,
            max_skew: self.max_skew,
            refuse_skew: self.refuse_skew,
        };
        Ok(())
    }
}

/// Runs the operator until it loses leadership, a watch dies, or SIGTERM/SIGINT.
pub async fn run(mut settings: Settings) -> anyhow::Result<()> {
    settings.validate()?;
    let (client, ha_client, gate) = connect(&settings).await?;
    let (namespace, identity, watched) = prepare(&mut settings, &client, &ha_client).await?;
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.progress.set_stall_after(settings.reconcile_stall);
    let server = serve(&settings, &client, &namespace, watched, &metrics).await?;
    let (caches, queues, sync, watches) = start_caches(&client, &settings, &metrics);

    let elector = ha::Elector::new(
        LeaseStore::new(ha_client, &namespace),
        &settings.leader_election_lease,
        &identity,
        settings.ha_timings(),
        gate,
    );
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);

    tracing::info!(%identity, %namespace, "standing by for the operator lease");
    let (mut server, mut watches) = (server, watches);
    let acquired = tokio::select! {
        acquired = async { sync.await; elector.acquire().await } => acquired,
        _ = &mut shutdown => return Ok(()),
        r = &mut server => return Err(anyhow::anyhow!("a server stopped: {r:?}")),
        r = &mut watches => anyhow::bail!("watches ended: {r:?}"),
    };
    metrics.active.set(1);
    tracing::info!(%identity, "acting as the arbiter");
    let arbitrated = caches.arbitrated.clone();
    let work = reconcile::run(
        client.clone(),
        caches,
        queues,
        settings.clone(),
        metrics.clone(),
    );
    let upkeep = webhook::upkeep(
        &settings.webhook,
        client.clone(),
        namespace.clone(),
        settings.scopes(),
        settings.instance.clone(),
        arbitrated,
        settings.reporter(),
    );
    // The webhook's upkeep ends only if a watch it needs did: like the work queue closing, that
    // ends the replica's acting.
    let run = async {
        tokio::select! {
            () = work => {}
            () = upkeep => tracing::error!("the webhook's upkeep stopped (a watch it needs ended)"),
        }
    };
    tokio::pin!(run);
    // The metrics server and the watches are watched while acting too: a replica whose caches
    // stopped must not go on acting on them.
    let result = tokio::select! {
        r = lead(&elector, acquired, run.as_mut(), shutdown.as_mut(), &metrics) => r,
        r = &mut server => Err(anyhow::anyhow!("a server stopped: {r:?}")),
        r = &mut watches => Err(anyhow::anyhow!("watches ended: {r:?}")),
    };
    if result.is_ok() {
        // A clean stop: hand the operator lease to a standby at once.
        if let Err(e) = elector.release().await {
            tracing::warn!(error = %e, "releasing the operator lease failed; a standby takes over at expiry");
        }
    }
    result
}

/// The operator's namespace and identity (its host name and a random suffix, set in
/// `settings`), and the namespaces it watches; the CRDs installed (`--install-crds`) and
/// checked, and the namespace selector checked, before anything starts.
async fn prepare(
    settings: &mut Settings,
    client: &Client,
    ha_client: &Client,
) -> anyhow::Result<(String, String, Vec<String>)> {
    let namespace = settings
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = format!(
        "{}-{:08x}",
        settings
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "arbiter".into()),
        arbiter_candidate::random_id() as u32
    );
    settings.identity = Some(identity.clone());
    if settings.install_crds {
        arbiter_api::apply_crds(ha_client.clone(), Duration::from_secs(60)).await?;
    }
    let watched: Vec<String> = settings.scopes().into_iter().flatten().collect();
    check_crd(client, watched.first().map(String::as_str)).await?;
    if let Some(selector) = &settings.namespace_selector {
        cache::namespaces::check(client, selector).await?;
    }
    Ok((namespace, identity, watched))
}

/// Starts the webhook (when configured) and the metrics server; the task ends only if one of
/// them stopped.
async fn serve(
    settings: &Settings,
    client: &Client,
    namespace: &str,
    watched: Vec<String>,
    metrics: &Arc<metrics::Metrics>,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let webhook = webhook::start(
        &settings.webhook,
        client,
        namespace,
        watched,
        settings.instance.clone(),
        metrics,
    )
    .await?;
    Ok(tokio::spawn({
        let metrics = metrics.clone();
        let address = settings.metrics_address;
        async move {
            let webhook = async {
                match webhook {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = metrics::serve(address, metrics) => r.map_err(|e| e.context("metrics server")),
                r = webhook => r,
            }
        }
    }))
}

/// The operator's clients: one whose writes go out only while this replica certainly holds
/// the operator lease (through `gate`), and one for the HA lease itself.
async fn connect(
    settings: &Settings,
) -> anyhow::Result<(Client, Client, arbiter_candidate::client::Gate)> {
    // Writes go out only while this replica certainly holds the operator lease: the gate opens
    // at each successful renew until that renew's deadline, and closes by itself. Every request
    // times out well within the renew deadline, so none can hang past it.
    let gate = arbiter_candidate::client::Gate::default();
    let timeouts = arbiter_candidate::client::Timeouts {
        read: settings.ha_renew_deadline / 2,
        write: settings.request_timeout(),
    };
    let client = arbiter_candidate::client::connect_with(timeouts, Some(gate.clone())).await?;
    // The HA lease, and the CRD install before any leadership, are not arbiter actions. A
    // renew is cut off at the renew deadline anyway, and a late one only makes a standby wait
    // longer: it gets the whole deadline.
    let ha_client = arbiter_candidate::client::connect_with(
        arbiter_candidate::client::Timeouts::both(settings.ha_renew_deadline),
        None,
    )
    .await?;
    Ok((client, ha_client, gate))
}

/// The work queues, and the caches with their watches: `sync` ends once the caches are synced
/// (readiness), `watches` only if the watches do (which must take the process down).
fn start_caches(
    client: &Client,
    settings: &Settings,
    metrics: &Arc<metrics::Metrics>,
) -> (
    cache::Caches,
    Vec<queue::Queue>,
    impl std::future::Future<Output = ()> + use<>,
    tokio::task::JoinHandle<()>,
) {
    let (enqueue, queues) = queue::queues(
        usize::from(settings.concurrency),
        settings.queue_fairness,
        queue::QueueMetrics {
            wait: metrics.queue_wait.clone(),
            depth: metrics.queue_depth.clone(),
        },
    );
    let (caches, mut watch_errors) = cache::watch_all(
        client.clone(),
        &settings.scopes(),
        settings.instance.as_deref(),
        settings.namespace_selector.as_deref(),
        cache::limits::Limits {
            candidates: settings.max_candidates_per_namespace,
            leases: settings.max_leases_per_namespace,
        },
        enqueue,
        metrics.pods_followed.clone(),
    );
    // Watch errors are retried with backoff inside the stream; log them. The stream ends only if
    // the watches do, which must take the process down.
    let watches = tokio::spawn(async move {
        while let Some(e) = watch_errors.next().await {
            tracing::warn!(error = %e, "watch error (retrying)");
        }
    });
    let sync = {
        let c = caches.clone();
        let m = metrics.clone();
        async move {
            let _ = tokio::join!(
                // The pod cache is ready only after the candidates, Deployments and
                // StatefulSets were listed (and a kube-runtime store wakes only its last waiter:
                // those three are waited for there, once).
                c.leases.wait_until_ready(),
                c.pods.wait_until_ready(),
                c.arbitrated.wait_until_listed(),
            );
            m.ready.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!("caches synced");
        }
    };

    (caches, queues, sync, watches)
}

/// Acts while this replica holds the operator lease (acquired at `acquired`), `run` being the
/// workers: when a renewal fails the writes stop, and resume only if nobody took the lease
/// meanwhile. Ends with an error when the lease is lost or the workers stop, or `Ok` on
/// `shutdown`.
async fn lead(
    elector: &ha::Elector,
    mut acquired: std::time::Instant,
    mut run: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    metrics: &metrics::Metrics,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            lost = elector.keep(acquired) => {
                if lost.taken {
                    break Err(anyhow::Error::new(lost));
                }
                // The write gate is closed. Resume if nobody wrote the lease meanwhile (the API
                // server was only unreachable); else give up, as another replica may act.
                metrics.active.set(0);
                tracing::warn!(error = %lost, "stopped writing; resuming if nobody took the operator lease meanwhile");
                // The workers go on meanwhile (their writes are refused at the closed gate), so
                // requests already in flight still end at their timeout.
                let resumed = tokio::select! {
                    r = elector.resume() => r,
                    _ = &mut run => break Err(anyhow::anyhow!("work queue closed")),
                    _ = &mut shutdown => break Ok(()),
                };
                match resumed {
                    Some(at) => {
                        acquired = at;
                        metrics.active.set(1);
                    }
                    None => break Err(anyhow::Error::new(lost)),
                }
            }
            _ = &mut run => break Err(anyhow::anyhow!("work queue closed")),
            _ = &mut shutdown => break Ok(()),
        }
    }
}

/// A clear error when the CRD is not installed, instead of a watch that retries forever.
async fn check_crd(client: &Client, namespace: Option<&str>) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    let name = arbiter_api::LeaseCandidate::crd_name();
    match kube::Api::<CustomResourceDefinition>::all(client.clone()).get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => anyhow::bail!("CRD {name} is not installed: apply crds/ (or run with --install-crds)"),
        // Without RBAC to read CRDs, find out by listing candidates instead.
        Err(_) => match namespace {
            Some(ns) => kube::Api::<arbiter_api::LeaseCandidate>::namespaced(client.clone(), ns),
            None => kube::Api::<arbiter_api::LeaseCandidate>::all(client.clone()),
        }
        .list(&kube::api::ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("cannot list LeaseCandidates (is CRD {name} installed, and may this account list it?): {e}")),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

/// The settings `arbiter operator ARGS` gives, validated (for unit tests).
#[cfg(test)]
pub(crate) fn validated(args: &[&str]) -> anyhow::Result<Settings> {
    use clap::Parser;
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        settings: Settings,
    }
    let mut s =
        Flags::try_parse_from(std::iter::once("operator").chain(args.iter().copied()))?.settings;
    s.validate()?;
    Ok(s)
}

/// A candidate for lease `lease` at version 1.30.0 (OldestEmulationVersion), for unit tests.
#[cfg(test)]
pub(crate) fn test_candidate(name: &str, lease: &str) -> arbiter_api::LeaseCandidate {
    arbiter_api::LeaseCandidate::new(
        name,
        arbiter_api::LeaseCandidateSpec {
            lease_name: lease.into(),
            binary_version: "1.30.0".into(),
            emulation_version: Some("1.30.0".into()),
            strategy: arbiter_api::OLDEST_EMULATION_VERSION.into(),
            ping_time: None,
            renew_time: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elections_settle_for_two_seconds_at_most_the_ack_window() {
        let s = |args: &[&str]| validated(args).map(|s| s.rules.settle);
        assert_eq!(s(&[]).unwrap(), Duration::from_secs(2));
        assert_eq!(s(&["--settle", "0s"]).unwrap(), Duration::ZERO);
        assert_eq!(s(&["--settle", "5s"]).unwrap(), Duration::from_secs(5));
        let err = s(&["--settle", "6s"]).unwrap_err().to_string();
        assert!(
            err.contains("--settle (6s) must be at most --ack-window (5s)"),
            "{err}"
        );
    }

    #[test]
    fn an_answer_counts_for_twice_the_ack_window_unless_told_otherwise() {
        let s = |args: &[&str]| validated(args).unwrap().rules.ack_valid_for;
        assert_eq!(s(&[]), Duration::from_secs(10));
        assert_eq!(s(&["--ack-window", "2s"]), Duration::from_secs(4));
        assert_eq!(s(&["--ack-valid-for", "60s"]), Duration::from_secs(60));
        assert_eq!(s(&["--ack-valid-for", "10s"]), Duration::from_secs(10));
        let err = validated(&["--ack-valid-for", "9s"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--ack-valid-for (9s) must be at least twice --ack-window (5s)"),
            "{err}"
        );
        assert!(validated(&["--ack-valid-for", "0s"]).is_err());
        assert_eq!(s(&["--ack-valid-for", "5m"]), Duration::from_secs(300));
        let err = validated(&["--ack-valid-for", "301s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be at most 300s"), "{err}");
    }

    #[test]
    fn a_namespace_selector_is_a_selector_and_stands_alone() {
        let s = validated(&["--namespace-selector", "team=a"]).unwrap();
        assert_eq!(s.namespace_selector.as_deref(), Some("team=a"));
        assert_eq!(s.scopes(), vec![None], "watched cluster-wide");
        for bad in [
            &["--namespace-selector", " "][..],
            &[
                "--namespace-selector",
                "team=a",
                "--watch-namespaces",
                "a,b",
            ],
        ] {
            assert!(validated(bad).is_err(), "{bad:?}");
        }
    }
}
