//! Prometheus metrics and the `/metrics`, `/livez`, `/readyz` endpoints.

pub mod lease_timers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::key::LeaseKey;

/// A lease's labels (`namespace`, `lease`): one shared key per lease, however many of its
/// series there are ([`Metrics::labels`]; at 10,000 leases, a copy of both names per series cost
/// several MiB).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LeaseLabels(Arc<LeaseKey>);

impl EncodeLabelSet for LeaseLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let LeaseKey { namespace, name } = &*self.0;
        [("namespace", &**namespace), ("lease", &**name)].encode(encoder)
    }
}

/// Why the previous holder's term ended, for a leader change: `new` (no holder before),
/// `released`, `pod_stopped`, `container_restarted`, `expired`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: String,
}

/// What the injection webhook answered: `injected`, `unchanged` (injected already, or not a
/// creation), `refused`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// A lease's labels and its holder's (`holder`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct HolderLabels {
    lease: LeaseLabels,
    holder: Arc<str>,
}

impl EncodeLabelSet for HolderLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let LeaseKey { namespace, name } = &*self.lease.0;
        let labels = [("namespace", &**namespace), ("lease", &**name)];
        (labels, [("holder", &*self.holder)]).encode(encoder)
    }
}

pub struct Metrics {
    registry: Registry,
    /// Holders assigned, by why the previous term ended.
    pub leader_changes: Family<ReasonLabels, Counter>,
    pub handovers: Counter,
    pub handovers_abandoned: Counter,
    pub strategy_conflicts: Counter,
    pub skew_violations: Counter,
    pub reconcile_errors: Counter,
    /// Deposed holders' pods forced out, by method (evict, delete).
    pub forced_depositions: Family<MethodLabels, Counter>,
    /// Pods the injection webhook answered for, by result.
    pub webhook_admissions: Family<ResultLabels, Counter>,
    /// Pods labelled for injection found running their command unwrapped and evicted, by
    /// result (`evicted`, `refused`).
    pub unwrapped_evictions: Family<ResultLabels, Counter>,
    pub reconcile_duration: Histogram,
    /// How long leases waited in their worker's queue, from due to picked up.
    pub queue_wait: Histogram,
    /// Leases due for a reconcile in the workers' queues (deduplicated), not yet picked up.
    pub queue_depth: Gauge,
    pub candidates_per_lease: Family<LeaseLabels, Gauge>,
    /// Pods labelled `arbiter.dev/role=active` per single-active lease, as observed.
    pub active_pods: Family<LeaseLabels, Gauge>,
    /// Double holders seen: more than one pod of a lease labelled active, or an agent's workload
    /// that outlived its term (the whole candidate paused). Must stay 0.
    pub double_holders: Counter,
    /// From a handover request to the new holder's assignment (includes the workload's stop).
    pub handover_seconds: Histogram,
    /// Time each lease spent without a live holder, as the arbiter saw it.
    pub leaderless_seconds: Family<LeaseLabels, Counter<f64, AtomicU64>>,
    /// When each lease became leaderless (Unix seconds), 0 while it has a live holder.
    pub leaderless_since: Family<LeaseLabels, Gauge<f64, AtomicU64>>,
    /// Each lease's duration, as the arbiter counts it.
    pub lease_duration: Family<LeaseLabels, Gauge>,
    /// Forced exits still pending per lease (an eviction refused, e.g. by a PDB).
    pub forced_exits_pending: Family<LeaseLabels, Gauge>,
    /// Each lease's term.
    pub lease_term: Family<LeaseLabels, Gauge>,
    /// 1 for each lease's current holder (one series per lease).
    pub lease_holder: Family<HolderLabels, Gauge>,
    /// Per lease: its labels, shared by its series, and the holder its `lease_holder` series
    /// names (to drop that series when the holder changes).
    leases: std::sync::Mutex<std::collections::HashMap<Arc<LeaseKey>, Option<Arc<str>>>>,
    /// Candidates deleted because they stopped renewing (and belong to no pod).
    pub candidates_expired: Counter,
    /// Elections that were needed when no candidate could be elected.
    pub elections_failed: Counter,
    /// 1 on the replica that acts, 0 on standbys.
    pub active: Gauge,
    /// Pods kept in the cache: candidates' and single-active workloads' pods, no others.
    pub pods_followed: Gauge,
    /// Candidates refused by the namespaces' limits.
    pub candidates_refused: Gauge,
    /// Set once the caches have synced.
    pub ready: AtomicBool,
    /// The injection webhook is on but has no certificate to serve yet (not ready).
    pub webhook_pending: Arc<AtomicBool>,
    /// Whether the reconcile worker is making progress (`/livez`).
    pub progress: Progress,
    /// The size of the last `/metrics` answer.
    last_scrape: AtomicU64,
}

/// When each worker's reconcile in progress started; `/livez` fails once one has run longer
/// than the stall bound (every API request has a timeout, so only a stuck worker gets there).
pub struct Progress {
    base: std::time::Instant,
    /// Per worker: nanoseconds after `base` + 1 when its current reconcile started; 0 when idle.
    started: [AtomicU64; MAX_WORKERS],
    stall_after: std::sync::Mutex<std::time::Duration>,
}

/// The most reconcile workers (`--concurrency`).
pub const MAX_WORKERS: usize = 64;

impl Progress {
    fn new() -> Progress {
        Progress {
            base: std::time::Instant::now(),
            started: std::array::from_fn(|_| AtomicU64::new(0)),
            stall_after: std::sync::Mutex::new(std::time::Duration::from_secs(300)),
        }
    }

    pub fn set_stall_after(&self, d: std::time::Duration) {
        *self.stall_after.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    pub fn begin(&self, worker: usize) {
        let now = self.base.elapsed().as_nanos() as u64 + 1;
        self.started[worker % MAX_WORKERS].store(now, Ordering::SeqCst);
    }

    pub fn end(&self, worker: usize) {
        self.started[worker % MAX_WORKERS].store(0, Ordering::SeqCst);
    }

    /// Ok, or why a worker is not live, as of `now`.
    pub fn check(&self, now: std::time::Instant) -> Result<(), String> {
        let bound = *self.stall_after.lock().unwrap_or_else(|e| e.into_inner());
        for (worker, slot) in self.started.iter().enumerate() {
            let started = slot.load(Ordering::SeqCst);
            if started == 0 {
                continue;
            }
            let running = now
                .saturating_duration_since(self.base)
                .saturating_sub(std::time::Duration::from_nanos(started - 1));
            if running > bound {
                return Err(format!(
                    "a reconcile of worker {worker} has been running for {running:?} (bound {bound:?}): the worker is stuck"
                ));
            }
        }
        Ok(())
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("arbiter");
        let m = Metrics::unregistered();
        m.register_counters(&mut registry);
        m.register_events(&mut registry);
        m.register_lease_series(&mut registry);
        Metrics { registry, ..m }
    }

    /// Every series at zero, registered nowhere.
    fn unregistered() -> Metrics {
        Metrics {
            leader_changes: Family::default(),
            handovers: Counter::default(),
            handovers_abandoned: Counter::default(),
            strategy_conflicts: Counter::default(),
            skew_violations: Counter::default(),
            reconcile_errors: Counter::default(),
            forced_depositions: Family::default(),
            unwrapped_evictions: Family::default(),
            webhook_admissions: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            queue_wait: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            queue_depth: Gauge::default(),
            candidates_per_lease: Family::default(),
            active_pods: Family::default(),
            double_holders: Counter::default(),
            handover_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            leaderless_seconds: Family::default(),
            leaderless_since: Family::default(),
            lease_duration: Family::default(),
            forced_exits_pending: Family::default(),
            lease_term: Family::default(),
            lease_holder: Family::default(),
            leases: Default::default(),
            candidates_expired: Counter::default(),
            elections_failed: Counter::default(),
            active: Gauge::default(),
            pods_followed: Gauge::default(),
            candidates_refused: Gauge::default(),
            ready: AtomicBool::new(false),
            webhook_pending: Arc::new(AtomicBool::new(false)),
            progress: Progress::new(),
            last_scrape: AtomicU64::new(0),
            registry: Registry::default(),
        }
    }

    /// The plain counters.
    fn register_counters(&self, registry: &mut Registry) {
        let counters: [(&str, &str, &Counter); 8] = [
            (
                "double_holders",
                "Double holders seen: more than one pod of a lease labelled active, or an agent's workload that outlived its term because the whole candidate was paused (must stay 0)",
                &self.double_holders,
            ),
            (
                "handovers_requested",
                "Handovers requested from a live holder",
                &self.handovers,
            ),
            (
                "handovers_abandoned",
                "Handovers requested whose target did not take the lease (the arbiter fell back to the best live candidate)",
                &self.handovers_abandoned,
            ),
            (
                "strategy_conflicts",
                "Candidates that entered a strategy conflict",
                &self.strategy_conflicts,
            ),
            (
                "skew_violations",
                "Candidates that entered a skew violation",
                &self.skew_violations,
            ),
            (
                "reconcile_errors",
                "Reconciles that failed and were retried",
                &self.reconcile_errors,
            ),
            (
                "candidates_expired",
                "Candidates deleted because they stopped renewing",
                &self.candidates_expired,
            ),
            (
                "elections_failed",
                "Election attempts that found no eligible candidate (retried every 5 s)",
                &self.elections_failed,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
    }

    /// What happened: elections, forced exits, the webhook's answers, reconciles and queues.
    fn register_events(&self, registry: &mut Registry) {
        registry.register(
            "leader_changes",
            "Holders assigned (elections), by why the previous term ended: new, released, pod_stopped, container_restarted, expired",
            self.leader_changes.clone(),
        );
        registry.register(
            "forced_depositions",
            "Deposed holders' pods forced out, by method",
            self.forced_depositions.clone(),
        );
        registry.register(
            "unwrapped_evictions",
            "Pods labelled for injection that ran their command without the agent, evicted (or refused, e.g. by a PDB)",
            self.unwrapped_evictions.clone(),
        );
        registry.register(
            "webhook_admissions",
            "Pods the injection webhook answered for, by result: injected, unchanged, refused",
            self.webhook_admissions.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time per reconcile",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time a lease waited in its worker's queue, from due to picked up (high: raise --concurrency, unless the API server is the bottleneck)",
            self.queue_wait.clone(),
        );
        registry.register(
            "queue_depth",
            "Leases due for a reconcile in the workers' queues (deduplicated), not yet picked up",
            self.queue_depth.clone(),
        );
    }

    /// Each lease's series (handovers, leaderless time, duration, term, holder) and the
    /// operator's own.
    fn register_lease_series(&self, registry: &mut Registry) {
        registry.register(
            "handover_seconds",
            "From a handover request to the new holder's assignment",
            self.handover_seconds.clone(),
        );
        registry.register(
            "leaderless_seconds",
            "Time a lease spent without a live holder",
            self.leaderless_seconds.clone(),
        );
        registry.register(
            "lease_leaderless_since_timestamp_seconds",
            "When the lease became leaderless (Unix seconds); 0 while it has a live holder",
            self.leaderless_since.clone(),
        );
        registry.register(
            "lease_duration_seconds",
            "The lease's duration as the arbiter counts it",
            self.lease_duration.clone(),
        );
        registry.register(
            "lease_term",
            "The lease's term (leaseTransitions, the fencing token)",
            self.lease_term.clone(),
        );
        registry.register(
            "lease_holder",
            "1 for the lease's current holder",
            self.lease_holder.clone(),
        );
        registry.register(
            "forced_exits_pending",
            "Deposed holders' pods still to be forced out (an eviction refused, e.g. by a PDB)",
            self.forced_exits_pending.clone(),
        );
        registry.register(
            "candidates",
            "Candidates per lease",
            self.candidates_per_lease.clone(),
        );
        registry.register(
            "active_pods",
            "Pods labelled arbiter.dev/role=active per single-active lease",
            self.active_pods.clone(),
        );
        registry.register(
            "operator_active",
            "1 on the operator replica that acts",
            self.active.clone(),
        );
        registry.register(
            "pods_followed",
            "Pods the operator keeps in its cache (candidates' pods and single-active workloads' pods; other pods are not kept)",
            self.pods_followed.clone(),
        );
        registry.register(
            "candidates_refused",
            "Candidates refused by the namespaces' limits (--max-candidates-per-namespace, --max-leases-per-namespace): not elected until there is room (acting replica only)",
            self.candidates_refused.clone(),
        );
    }

    /// The labels of `key`'s series, shared by all of them.
    pub fn labels(&self, key: &LeaseKey) -> LeaseLabels {
        let mut leases = self.leases.lock().expect("not poisoned");
        if let Some((shared, _)) = leases.get_key_value(key) {
            return LeaseLabels(shared.clone());
        }
        let shared = Arc::new(key.clone());
        leases.insert(shared.clone(), None);
        LeaseLabels(shared)
    }

    pub fn candidates(&self, key: &LeaseKey, n: usize) {
        let labels = self.labels(key);
        self.candidates_per_lease
            .get_or_create(&labels)
            .set(n as i64);
    }

    /// The lease's state gauges: leaderless since (Unix seconds, `None`: held), its duration.
    pub fn lease_state(
        &self,
        key: &LeaseKey,
        leaderless_since: Option<f64>,
        duration: Option<u64>,
    ) {
        let labels = self.labels(key);
        self.leaderless_since
            .get_or_create(&labels)
            .set(leaderless_since.unwrap_or(0.0));
        if let Some(d) = duration {
            self.lease_duration.get_or_create(&labels).set(d as i64);
        }
    }

    /// The lease's holder (`None`: nobody) and term.
    pub fn lease_holder(&self, key: &LeaseKey, holder: Option<&str>, term: i32) {
        let labels = self.labels(key);
        self.lease_term.get_or_create(&labels).set(i64::from(term));
        let mut leases = self.leases.lock().expect("not poisoned");
        let Some(named) = leases.get_mut(key) else {
            return; // forgotten meanwhile
        };
        if named.as_deref() == holder {
            return;
        }
        if let Some(old) = named.take() {
            let series = HolderLabels {
                lease: labels.clone(),
                holder: old,
            };
            self.lease_holder.remove(&series);
        }
        if let Some(h) = holder {
            let series = HolderLabels {
                lease: labels,
                holder: h.into(),
            };
            self.lease_holder.get_or_create(&series).set(1);
            *named = Some(series.holder);
        }
    }

    /// Drops every per-lease series of `key` (the lease and its candidates are gone).
    pub fn forget(&self, key: &LeaseKey) {
        let Some((shared, holder)) = self.leases.lock().expect("not poisoned").remove_entry(key)
        else {
            return;
        };
        let labels = LeaseLabels(shared);
        self.leaderless_seconds.remove(&labels);
        self.leaderless_since.remove(&labels);
        self.lease_duration.remove(&labels);
        self.lease_term.remove(&labels);
        self.forced_exits_pending.remove(&labels);
        self.candidates_per_lease.remove(&labels);
        self.active_pods.remove(&labels);
        if let Some(holder) = holder {
            let lease = labels;
            self.lease_holder.remove(&HolderLabels { lease, holder });
        }
    }

    pub fn forced_exits_pending(&self, key: &LeaseKey, n: usize) {
        let labels = self.labels(key);
        self.forced_exits_pending
            .get_or_create(&labels)
            .set(n as i64);
    }

    fn encode(&self) -> String {
        // Sized from the last scrape, so that a large one (tens of thousands of per-lease
        // series) is not grown by doubling to twice its size.
        let last = self.last_scrape.load(Ordering::Relaxed) as usize;
        let mut out = String::with_capacity(last + last / 16);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding to a String cannot fail");
        self.last_scrape.store(out.len() as u64, Ordering::Relaxed);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves `/metrics`, `/livez` and `/readyz` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.encode() }),
        )
        .route(
            "/livez",
            get(|State(m): State<Arc<Metrics>>| async move {
                match m.progress.check(std::time::Instant::now()) {
                    Ok(()) => (StatusCode::OK, "ok".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if !m.ready.load(Ordering::Relaxed) {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                } else if m.webhook_pending.load(Ordering::Relaxed) {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "no webhook certificate loaded yet",
                    )
                } else {
                    (StatusCode::OK, "ok")
                }
            }),
        )
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
    tracing::info!(address = %listener.local_addr()?, "serving /metrics, /livez, /readyz");
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn livez_fails_only_when_one_reconcile_outlives_the_stall_bound() {
        let p = Progress::new();
        p.set_stall_after(Duration::from_secs(60));
        let now = Instant::now();
        assert!(
            p.check(now + Duration::from_secs(3600)).is_ok(),
            "idle is live"
        );
        p.begin(0);
        assert!(p.check(Instant::now() + Duration::from_secs(59)).is_ok());
        let err = p
            .check(Instant::now() + Duration::from_secs(61))
            .unwrap_err();
        assert!(err.contains("stuck"), "{err}");
        p.end(0);
        assert!(p.check(Instant::now() + Duration::from_secs(61)).is_ok());
    }

    /// A lease's series carry its namespace and name; its holder's series follows the holder;
    /// a forgotten lease has no series left.
    #[test]
    fn a_lease_s_series_follow_its_holder_and_go_with_it() {
        let m = Metrics::new();
        let key = LeaseKey {
            namespace: "ns".into(),
            name: "l".into(),
        };
        m.candidates(&key, 3);
        m.lease_holder(&key, Some("a"), 1);
        m.lease_holder(&key, Some("b"), 2);
        let text = m.encode();
        assert!(
            text.contains(r#"arbiter_candidates{namespace="ns",lease="l"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"arbiter_lease_holder{namespace="ns",lease="l",holder="b"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"holder="a""#), "{text}");
        assert!(
            text.contains(r#"arbiter_lease_term{namespace="ns",lease="l"} 2"#),
            "{text}"
        );
        m.forget(&key);
        let text = m.encode();
        assert!(!text.contains(r#"lease="l""#), "{text}");
    }
}
