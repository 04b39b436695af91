//! The arbiter's controller: the per-lease reconcile, and carrying out decisions.
//!
//! The caches and watches are in [`super::watch`], reporting in [`super::report`]. Every change
//! enqueues the affected `(namespace, leaseName)`; each worker reconciles its keys one at a
//! time: build the pure inputs, call
//! [`election::decide::decide`], carry out the one action it returns (every Lease write a
//! compare-and-swap), update candidates' conditions, emit Events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};

use super::Settings;
use super::depose::{self, Deposer, PENDING_ANNOTATION, RESTARTS_ANNOTATION, Target};
use super::held::{self, Held};
use super::index::owner_pod;
use super::metrics::{LeaseLabels, MethodLabels, Metrics};
use super::queue::{LeaseKey, Queue};
use super::report::{publish, report};
use super::single_active::{self, Prepared};
use super::terms::TermLedger;
use super::watch::{Caches, pod_state};
use crate::api::LeaseCandidate;
use crate::election::decide::{self, Action};
use crate::lease::{self, INCARNATION_ANNOTATION, LeaseStore};

/// How many independent writes for one lease (pings) are in flight at once.
pub(super) const CONCURRENT_WRITES: usize = 8;

/// On a Lease: the uid of the pod its holder runs in.
pub const HOLDER_POD_ANNOTATION: &str = "arbiter.dev/holder-pod-uid";

/// The leader's reconcile workers, one per queue (`--concurrency`): each owns the leases its
/// queue routes to it, and the memory of them, so a lease is never reconciled twice at once.
/// Returns only if a queue closes.
pub async fn run(
    client: Client,
    caches: Caches,
    queues: Vec<Queue>,
    settings: Settings,
    metrics: Arc<Metrics>,
) {
    let recorder = Recorder::new(client.clone(), settings.reporter());
    let workers = queues.into_iter().enumerate().map(|(index, queue)| {
        let worker = Worker {
            terms: TermLedger::new(client.clone()),
            client: client.clone(),
            caches: caches.clone(),
            recorder: recorder.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
            seen: HashMap::new(),
            deposer: Deposer::default(),
            timers: HashMap::new(),
            reported: HashSet::new(),
            held: Held::default(),
        };
        Box::pin(work(index, worker, queue))
    });
    futures::future::select_all(workers).await;
}

/// One worker's loop: reconciles its queue's leases one at a time.
async fn work(index: usize, mut worker: Worker, mut queue: Queue) {
    while let Some(key) = queue.next().await {
        let start = Instant::now();
        worker.metrics.progress.begin(index);
        let result = worker.reconcile(&key).await;
        worker.metrics.progress.end(index);
        let requeue = match result {
            Ok(after) => after,
            Err(err) => {
                worker.metrics.reconcile_errors.inc();
                tracing::warn!(lease = %key, error = %format!("{err:#}"), "reconcile failed; retrying");
                Some(Duration::from_secs(2))
            }
        };
        worker
            .metrics
            .reconcile_duration
            .observe(start.elapsed().as_secs_f64());
        if let Some(after) = requeue {
            queue.requeue(key, after);
        }
    }
}

/// What one reconcile needs, and what the worker remembers between reconciles.
pub(super) struct Worker {
    pub(super) client: Client,
    pub(super) caches: Caches,
    pub(super) recorder: Recorder,
    pub(super) settings: Settings,
    pub(super) metrics: Arc<Metrics>,
    /// Per lease: the record last seen, when this process first saw it, and its holder.
    seen: HashMap<LeaseKey, Seen>,
    pub(super) terms: TermLedger,
    pub(super) deposer: Deposer,
    timers: HashMap<LeaseKey, Timers>,
    /// Single-active pods whose unreadable version was reported.
    pub(super) reported: HashSet<(String, String)>,
    /// Each lease's holder as this process last saw or assigned it.
    pub(super) held: Held,
}

/// When a lease became leaderless, and when a handover was requested (for metrics).
#[derive(Default)]
struct Timers {
    leaderless_since: Option<Instant>,
    handover_requested: Option<Instant>,
}

struct Seen {
    fingerprint: String,
    since: Instant,
    holder: Option<String>,
}

impl Worker {
    /// How long the Lease record has been unchanged, on this process's monotonic clock, and
    /// the holder it had before if it just released.
    fn observe(&mut self, key: &LeaseKey, lease: &Lease) -> (Duration, Option<String>) {
        let fingerprint = serde_json::to_string(&lease.spec).unwrap_or_default();
        let holder = lease::holder(lease).map(str::to_string);
        let now = Instant::now();
        let seen = self.seen.entry(key.clone()).or_insert_with(|| Seen {
            fingerprint: String::new(),
            since: now,
            holder: holder.clone(),
        });
        let mut released = None;
        if seen.fingerprint != fingerprint {
            if !seen.fingerprint.is_empty() && holder.is_none() {
                released = seen.holder.clone();
            }
            *seen = Seen {
                fingerprint,
                since: if seen.fingerprint.is_empty() {
                    seen.since
                } else {
                    now
                },
                holder,
            };
        }
        (now - seen.since, released)
    }

    /// Whether the pod the lease's holder ran in (recorded at assignment) is confirmed stopped.
    fn holder_pod_stopped(&self, l: &Lease) -> bool {
        let Some(uid) = l.annotations().get(HOLDER_POD_ANNOTATION) else {
            return false;
        };
        let ns = l.namespace().unwrap_or_default();
        self.caches.stopped_pods.contains(&ns, uid)
    }

    pub(super) fn pod_of(&self, candidate: &LeaseCandidate) -> Option<Arc<Pod>> {
        let (name, uid) = owner_pod(candidate)?;
        let pod = self
            .caches
            .pods
            .get(&ObjectRef::new(&name).within(&candidate.namespace()?))?;
        (pod.uid().as_deref() == Some(uid.as_str())).then_some(pod)
    }

    async fn reconcile(&mut self, key: &LeaseKey) -> anyhow::Result<Option<Duration>> {
        let mut candidates = self
            .caches
            .by_lease
            .candidates(key, &self.caches.candidates);
        let lease = self
            .caches
            .leases
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        self.expire_candidates(key, &mut candidates).await;
        // A single-active lease's reconcile (its role labels) never interleaves with another
        // of the namespace's, whatever worker runs it.
        let _serial = match self.caches.workloads.governing(key) {
            Some(_) => Some(self.caches.single_active_locks.lock(&key.namespace).await),
            None => None,
        };
        let prepared = single_active::prepare(
            &self.client,
            &self.caches,
            &self.recorder,
            key,
            &candidates,
            &mut self.reported,
        )
        .await?;
        let plan = match prepared {
            Prepared::CleanedUp | Prepared::Frozen => return Ok(None),
            Prepared::Ordinary => None,
            Prepared::Workload(p) => Some(*p),
        };
        self.metrics.candidates(key, candidates.len());

        let mut inputs: Vec<decide::Candidate> = candidates
            .iter()
            .map(|c| decide::Candidate {
                name: c.name_any(),
                binary_version: c.spec.binary_version.clone(),
                emulation_version: c.spec.emulation_version.clone(),
                strategy: c.spec.strategy.clone(),
                created: c
                    .creation_timestamp()
                    .map(|t| t.0)
                    .unwrap_or_else(jiff::Timestamp::now),
                ping_time: c.spec.ping_time.as_ref().map(|t| t.0),
                renew_time: c.spec.renew_time.as_ref().map(|t| t.0),
                pod: pod_state(c, &self.caches),
                withdrawn: crate::api::withdrawn_incarnation(c).is_some(),
            })
            .collect();
        let mut released = None;
        let now = Instant::now();
        let observed = lease.as_deref().map(|l| {
            let (unchanged_for, r) = self.observe(key, l);
            released = r;
            (l, unchanged_for)
        });
        // What this process remembers of the holder: no edit of the Lease shortens a term.
        let stopped = |uid: &str| self.caches.stopped_pods.contains(&key.namespace, uid);
        // The holder's own candidate says more than the Lease (which anyone may edit): the pod
        // it runs in, and the lease duration its agent writes.
        let holder_candidate = observed
            .and_then(|(l, _)| lease::holder(l))
            .and_then(|h| candidates.iter().find(|c| c.name_any() == h));
        let candidate_pod = holder_candidate
            .and_then(|c| owner_pod(c))
            .map(|(_, uid)| uid);
        let declared = declared_duration(holder_candidate);
        let seen = observed.map(|(l, unchanged_for)| held::Seen {
            holder: lease::holder(l),
            since: now - unchanged_for,
            duration: lease::duration(l)
                .unwrap_or(self.settings.lease_duration)
                .max(declared),
            pod_uid: candidate_pod.as_deref().or_else(|| {
                l.annotations()
                    .get(HOLDER_POD_ANNOTATION)
                    .map(String::as_str)
            }),
            released_by: lease::released_by(l),
            // Only as an agent wrote it (arbiter's field manager), not a hand edit.
            incarnation: l
                .annotations()
                .get(INCARNATION_ANNOTATION)
                .map(String::as_str)
                .filter(|i| {
                    !i.is_empty() && lease::written_by_arbiter(&l.metadata, INCARNATION_ANNOTATION)
                }),
            term: lease::term(l),
        });
        let leader = candidates.iter().find_map(|c| {
            let leads = c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|x| x.type_ == "Leader" && x.status == "True")
            });
            leads.then(|| held::Leader {
                name: c.name_any(),
                pod_uid: owner_pod(c).map(|(_, uid)| uid),
                declared: declared_duration(Some(c)),
            })
        });
        self.held.observe(
            key,
            seen.as_ref(),
            leader.as_ref(),
            self.settings.lease_duration,
            now,
            stopped,
        );
        // The remembered holder withdrew its candidate, marked with the incarnation that held
        // the term: its agent stopped the work and left (it could not release: the Lease was
        // gone, or no longer named it). That ends the term like a release.
        let withdrew = self.held.incarnation(key).is_some_and(|(h, incarnation)| {
            candidates.iter().any(|c| {
                c.name_any() == h && crate::api::withdrawn_incarnation(c) == Some(incarnation)
            })
        });
        let previous = self.held.previous(key, now, stopped).map(|mut p| {
            p.pod_stopped |= withdrew;
            p
        });
        // The process that took the holder's term (the incarnation its renew recorded) ended
        // with its container: the kubelet reported the termination message it wrote.
        // The process that took the holder's term (its incarnation as remembered: learned once
        // per term, from a record an agent wrote) ended with its container.
        let ended = observed
            .and_then(|(l, _)| lease::holder(l))
            .and_then(|holder| {
                let (h, incarnation) = self.held.incarnation(key)?;
                let pod = holder_candidate.and_then(|c| self.pod_of(c))?;
                (h == holder && super::stopped::incarnation_ended(&pod, incarnation))
                    .then_some(incarnation)
            });
        let process_ended = ended.is_some();
        // Its candidate is not elected again until a new process of it registers (the last
        // acknowledgements came from the dead one).
        if let (Some(dead), Some(c)) = (ended, holder_candidate)
            && c.annotations()
                .get(INCARNATION_ANNOTATION)
                .map(String::as_str)
                == Some(dead)
            && let Some(i) = candidates.iter().position(|x| x.name_any() == c.name_any())
        {
            inputs[i].pod = decide::PodState::Stopped;
        }
        let observed_view = observed.map(|(l, unchanged_for)| {
            let holder = lease::holder(l).map(str::to_string);
            let written = lease::duration(l).unwrap_or(self.settings.lease_duration);
            // While the holder is the one remembered, its term's longest duration and its pod as
            // recorded at assignment count, not what the Lease says now.
            let (duration, pod_stopped) =
                match holder.as_deref().and_then(|h| self.held.term_of(key, h)) {
                    Some((longest, Some(uid))) => (longest.max(written), stopped(uid)),
                    // Assigned without a pod: an annotation added later proves nothing.
                    Some((longest, None)) => (longest.max(written), false),
                    None => (written, self.holder_pod_stopped(l)),
                };
            let withdrew =
                withdrew && self.held.incarnation(key).map(|(h, _)| h) == holder.as_deref();
            let released_by = lease::released_by(l);
            // Why the holder's term ended, for the leader-change metric if a new one is
            // assigned (`None`: the Lease names nobody and nobody released it).
            let ended_by = match () {
                _ if holder.is_none() => released_by.map(|_| "released"),
                _ if withdrew => Some("released"),
                _ if pod_stopped => Some("pod_stopped"),
                _ if process_ended => Some("container_restarted"),
                _ => Some("expired"),
            };
            let pod_stopped = pod_stopped || withdrew || process_ended;
            let view = decide::Lease {
                holder,
                preferred_holder: lease::preferred_holder(l).map(str::to_string),
                strategy: lease::strategy(l).map(str::to_string),
                duration,
                unchanged_for,
                released_by: released_by.map(str::to_string),
                holder_pod_stopped: pod_stopped,
                acquired: l
                    .spec
                    .as_ref()
                    .and_then(|s| s.acquire_time.as_ref())
                    .map(|t| t.0),
                switchover: l
                    .annotations()
                    .get(lease::HANDOVER_REQUEST_ANNOTATION)
                    .map(|v| lease::parse_handover_request(v)),
                term: lease::term(l),
            };
            (view, ended_by)
        });
        // No Lease, or one naming nobody: the term remembered ended (or there was none).
        let term_ended = observed_view
            .as_ref()
            .and_then(|(_, by)| *by)
            .or_else(|| {
                previous.as_ref().map(|p| {
                    if p.pod_stopped {
                        "pod_stopped"
                    } else {
                        "expired"
                    }
                })
            })
            .unwrap_or("new");
        let lease_view = observed_view.map(|(view, _)| view);
        if let Some(h) = released.and_then(|h| candidates.iter().find(|c| c.name_any() == h)) {
            let note = format!("released lease {}", key.name);
            publish(
                &self.recorder,
                &h.object_ref(&()),
                EventType::Normal,
                "Released",
                note,
            )
            .await;
        }
        let duplicates: Vec<(String, Vec<String>)> = candidates
            .iter()
            .filter_map(|c| {
                Some((
                    c.name_any(),
                    self.caches
                        .incarnations
                        .duplicate(&key.namespace, &c.name_any())?,
                ))
            })
            .collect();
        let mut rules = self.settings.rules.clone();
        if let Some(p) = &plan {
            p.adjust(&candidates, &mut inputs);
            rules.max_skew = p.workload.max_skew.or(rules.max_skew);
            let active = p.active_pods();
            let labels = LeaseLabels::of(key);
            self.metrics
                .active_pods
                .get_or_create(&labels)
                .set(active as i64);
            if active > 1 {
                self.metrics.double_holders.inc();
                tracing::error!(lease = %key, active, "more than one pod is labelled active");
            }
        }
        let decision = decide::decide(
            &inputs,
            lease_view.as_ref(),
            previous.as_ref(),
            jiff::Timestamp::now(),
            &rules,
        );
        tracing::debug!(lease = %key, action = ?decision.action, standings = ?decision.standings, "decided");
        let policy = plan
            .as_ref()
            .map(|p| p.workload.on_depose)
            .unwrap_or(self.settings.on_depose);

        // Single-active: the operator is the holder pod's agent. It hands over on the pod's
        // behalf (demote, release, force the pod out), and demotes before anyone is promoted.
        if let (Some(p), Some(current)) = (&plan, lease.as_deref()) {
            let holder = lease::holder(current).map(str::to_string);
            if let (Action::RequestHandover { to }, Some(h)) = (&decision.action, holder)
                && p.holds_for(&candidates, &h)
            {
                p.release_for(&self.client, key, current, &h).await?;
                if let Some(pod) = p.pods.iter().find(|x| x.name_any() == h) {
                    self.deposer.add(
                        key,
                        Target::new(
                            &h,
                            &h,
                            &pod.uid().unwrap_or_default(),
                            depose::restarts(pod),
                        ),
                    );
                }
                let note = format!("pod {h} handed lease {} over to {to}", key.name);
                publish(
                    &self.recorder,
                    &single_active::workload_ref(&p.workload),
                    EventType::Normal,
                    "Deposed",
                    note,
                )
                .await;
                return Ok(Some(Duration::ZERO));
            }
        }
        if let (
            Some(p),
            Action::Assign { holder, .. }
            | Action::CreateLease {
                holder: Some(holder),
                ..
            },
        ) = (&plan, &decision.action)
        {
            p.demote_all_but(&self.client, Some(holder)).await?;
            // The deposed active pod, if it is still there, is forced out per policy.
            let previous = lease
                .as_deref()
                .and_then(lease::holder)
                .filter(|h| *h != holder.as_str());
            if let Some(pod) = previous.and_then(|h| p.pods.iter().find(|x| x.name_any() == h))
                && pod.metadata.deletion_timestamp.is_none()
                && p.holds_for(&candidates, &pod.name_any())
            {
                let name = pod.name_any();
                self.deposer.add(
                    key,
                    Target::new(
                        &name,
                        &name,
                        &pod.uid().unwrap_or_default(),
                        depose::restarts(pod),
                    ),
                );
            }
        }

        let owner = plan.as_ref().map(|p| p.owner());
        let written = self
            .act(key, lease.as_deref(), &candidates, &decision, owner)
            .await?;
        if let Some(w) = &written
            && let Some(h) = lease::holder(w)
            && matches!(
                decision.action,
                Action::Assign { .. } | Action::CreateLease { .. }
            )
        {
            let duration = lease::duration(w)
                .unwrap_or(self.settings.lease_duration)
                .max(declared_duration(
                    candidates.iter().find(|c| c.name_any() == h),
                ));
            let pod_uid = w
                .annotations()
                .get(HOLDER_POD_ANNOTATION)
                .map(String::as_str);
            self.held
                .assigned(key, h, lease::term(w), duration, pod_uid, Instant::now());
        }
        if candidates.is_empty() && lease_view.is_none() && written.is_none() {
            // Nothing left of this lease: its series go (a deleted lease is not leaderless).
            self.timers.remove(key);
            self.metrics.forget(key);
        } else {
            self.time(
                key,
                lease_view.as_ref(),
                &decision.action,
                written.is_some(),
            );
        }
        // While a hand-edited-out holder's term may still run, it is still reported as the
        // leader (its Leader condition is also what a replica taking over remembers it by).
        let waiting_for = match &decision.action {
            Action::WaitForTerm { holder, .. } => Some(holder.as_str()),
            _ => None,
        };
        let holder = written
            .as_ref()
            .and_then(|l| lease::holder(l))
            .or(waiting_for)
            .or(lease.as_deref().and_then(lease::holder));
        let term = written
            .as_ref()
            .or(lease.as_deref())
            .map(lease::term)
            .unwrap_or(0);
        // Agents whose workload outlived an earlier term (the whole candidate was paused).
        let overruns: Vec<(String, i32)> = candidates
            .iter()
            .filter_map(|c| {
                let t = c.annotations().get(crate::api::OVERRAN_ANNOTATION)?;
                let t: i32 = t.parse().ok()?;
                (t < term).then(|| (c.name_any(), t))
            })
            .collect();
        report(
            &self.client,
            &self.recorder,
            &self.metrics,
            key,
            &candidates,
            &decision,
            holder,
            term,
            &duplicates,
            &overruns,
            term_ended,
        )
        .await;

        if let Some(p) = &plan {
            let current = written.as_ref().or(lease.as_deref());
            // The Event below reports the assignment, which is done: a failed labelling (retried)
            // must not lose it.
            let labelled = p.label(&self.client, holder).await;
            if let Some(w) = &written
                && let Some(h) = lease::holder(w)
                && matches!(
                    decision.action,
                    Action::Assign { .. } | Action::CreateLease { .. }
                )
            {
                let version = candidates
                    .iter()
                    .find(|c| c.name_any() == h)
                    .map(|c| c.spec.binary_version.clone());
                let note = format!(
                    "pod {h} ({}) is active, term {term}",
                    version.unwrap_or_default()
                );
                publish(
                    &self.recorder,
                    &single_active::workload_ref(&p.workload),
                    EventType::Normal,
                    "Elected",
                    note,
                )
                .await;
            }
            labelled?;
            if written.is_none()
                && let (Some(l), Some(v)) = (current, lease_view.as_ref())
                && lease::holder(l).is_some_and(|h| p.holds_for(&candidates, h))
            {
                p.renew_for(&self.client, key, l, v.unchanged_for).await?;
            }
        }

        if written.is_some()
            && let Some(old) = lease.as_deref()
        {
            self.report_abandoned_handover(key, old, &decision.action, &candidates)
                .await;
        }
        // A lapsed holder whose pod kept running with the same containers is forced out.
        if let (
            Some(_),
            Action::Assign {
                lapsed: Some(h), ..
            },
            Some(old),
        ) = (&written, &decision.action, lease.as_deref())
            && let Some(c) = candidates.iter().find(|c| c.name_any() == *h)
            && let Some(pod) = self.pod_of(c)
        {
            let recorded = old
                .annotations()
                .get(RESTARTS_ANNOTATION)
                .and_then(|v| v.parse::<i64>().ok());
            tracing::debug!(lease = %key, lapsed = %h, ?recorded, restarts = depose::restarts(&pod), "lapsed holder's pod still exists");
            // Same containers, and not all of them reported ended (one in crash-loop back-off
            // after its process exited runs nothing: nothing to force out).
            if recorded == Some(depose::restarts(&pod)) && !super::stopped::nothing_runs(&pod) {
                self.deposer.add(
                    key,
                    Target::new(
                        h,
                        &pod.name_any(),
                        &pod.uid().unwrap_or_default(),
                        depose::restarts(&pod),
                    ),
                );
            }
        }
        // Forced exits another replica left pending are carried on.
        let latest = written.as_ref().or(lease.as_deref());
        let recorded = latest.and_then(|l| l.annotations().get(PENDING_ANNOTATION).cloned());
        let ours: HashSet<String> = candidates
            .iter()
            .filter_map(|c| owner_pod(c).map(|(_, uid)| uid))
            .chain(
                plan.iter()
                    .flat_map(|p| p.pods.iter().filter_map(|pod| pod.uid())),
            )
            .collect();
        self.deposer
            .restore(key, recorded.as_deref(), |t| ours.contains(&t.uid));
        let pods = self.caches.pods.clone();
        let ns = key.namespace.clone();
        let (outcomes, retry) = self
            .deposer
            .attempt(&self.client, key, policy, |name| {
                pods.get(&ObjectRef::new(name).within(&ns))
                    .map(|p| (*p).clone())
            })
            .await;
        // Record what is still pending on the Lease, for whichever replica leads next.
        let pending = self.deposer.recorded(key);
        if pending.is_some() || !candidates.is_empty() {
            let n = pending.as_deref().map_or(0, |p| p.split(',').count());
            self.metrics.forced_exits_pending(key, n);
        }
        if let Some(l) = latest
            && pending != recorded
        {
            let mut l = l.clone();
            lease::set_annotation(&mut l, PENDING_ANNOTATION, pending.as_deref());
            if let Err(e) = LeaseStore::new(self.client.clone(), &key.namespace)
                .replace(&l)
                .await
            {
                tracing::debug!(lease = %key, error = %e, "recording pending forced exits failed (retried)");
            }
        }
        for (target, outcome) in outcomes {
            tracing::info!(lease = %key, pod = %target.pod, outcome = ?outcome, "forced exit");
            if let depose::Outcome::Forced(policy) = &outcome {
                self.metrics
                    .forced_depositions
                    .get_or_create(&MethodLabels {
                        method: policy.as_str().into(),
                    })
                    .inc();
            }
            let (Some((type_, reason, note)), Some(c)) = (
                outcome.event(&target),
                candidates.iter().find(|c| c.name_any() == target.candidate),
            ) else {
                continue;
            };
            if let Some(p) = &plan {
                let r = single_active::workload_ref(&p.workload);
                publish(&self.recorder, &r, type_, reason, note.clone()).await;
            }
            publish(&self.recorder, &c.object_ref(&()), type_, reason, note).await;
        }

        // When to look again, even if nothing changes: at the holder's expiry, or after a wait.
        let after = match &decision.action {
            Action::Nothing | Action::WaitForRelease { .. } => lease_view
                .as_ref()
                .filter(|l| l.holder.is_some())
                .map(|l| l.duration.saturating_sub(l.unchanged_for) + Duration::from_millis(100)),
            Action::WaitForTerm { remaining, .. } => Some(*remaining + Duration::from_millis(100)),
            Action::Ping { .. } | Action::WaitForAcks => Some(Duration::from_millis(500)),
            Action::StrategyConflict | Action::NoEligibleCandidate => Some(Duration::from_secs(5)),
            _ => Some(Duration::from_secs(1)),
        };
        // Single-active leases are renewed by the operator: come back in a third of the duration.
        let renew = plan
            .as_ref()
            .and(lease_view.as_ref())
            .map(|l| l.duration / 3);
        Ok([after, retry, renew].into_iter().flatten().min())
    }

    /// Deletes candidates that belong to no pod and have not renewed for `--candidate-expiry`
    /// (pod-owned ones are garbage-collected with their pod), and drops them from `candidates`.
    async fn expire_candidates(&self, key: &LeaseKey, candidates: &mut Vec<Arc<LeaseCandidate>>) {
        let expiry = self.settings.candidate_expiry;
        let now = jiff::Timestamp::now();
        let stale = |c: &LeaseCandidate| {
            owner_pod(c).is_none()
                && c.spec.renew_time.as_ref().is_none_or(|r| {
                    Duration::try_from(now.duration_since(r.0)).is_ok_and(|age| age > expiry)
                })
        };
        let api: Api<LeaseCandidate> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut kept = Vec::with_capacity(candidates.len());
        for c in candidates.drain(..) {
            if !stale(&c) {
                kept.push(c);
                continue;
            }
            // Only the version we judged: a candidate that renewed meanwhile is not deleted.
            let dp = kube::api::DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: c.uid(),
                    resource_version: c.resource_version(),
                }),
                ..Default::default()
            };
            match api.delete(&c.name_any(), &dp).await {
                Ok(_) => {
                    self.metrics.candidates_expired.inc();
                    tracing::info!(lease = %key, candidate = %c.name_any(), ?expiry, "deleted a candidate that stopped renewing");
                }
                Err(e) => {
                    tracing::warn!(candidate = %c.name_any(), error = %e, "deleting an expired candidate failed");
                    kept.push(c);
                }
            }
        }
        *candidates = kept;
    }

    /// Leaderless time and handover duration, for metrics.
    fn time(
        &mut self,
        key: &LeaseKey,
        lease: Option<&decide::Lease>,
        action: &Action,
        written: bool,
    ) {
        let t = self.timers.entry(key.clone()).or_default();
        let now = Instant::now();
        let leaderless = lease.is_none_or(|l| l.holder.is_none() || l.expired());
        if leaderless && t.leaderless_since.is_none() {
            t.leaderless_since = Some(now);
        }
        match action {
            Action::NoEligibleCandidate => {
                self.metrics.elections_failed.inc();
            }
            Action::RequestHandover { .. } if written && t.handover_requested.is_none() => {
                t.handover_requested = Some(now)
            }
            Action::Assign { .. }
            | Action::CreateLease {
                holder: Some(_), ..
            } if written => {
                if let Some(since) = t.handover_requested.take() {
                    self.metrics
                        .handover_seconds
                        .observe((now - since).as_secs_f64());
                }
                if let Some(since) = t.leaderless_since.take() {
                    let labels = LeaseLabels::of(key);
                    self.metrics
                        .leaderless_seconds
                        .get_or_create(&labels)
                        .inc_by((now - since).as_secs_f64());
                }
            }
            _ => {}
        }
        // A lease under a third-party strategy has no holder of arbiter's choosing.
        let ours = lease.is_none_or(|l| {
            l.strategy
                .as_deref()
                .is_none_or(|s| s == crate::api::OLDEST_EMULATION_VERSION)
        });
        let since = t.leaderless_since.filter(|_| ours).map(|since| {
            let ago = now.saturating_duration_since(since).as_secs_f64();
            jiff::Timestamp::now().as_millisecond() as f64 / 1000.0 - ago
        });
        self.metrics
            .lease_state(key, since, lease.map(|l| l.duration.as_secs()));
    }
}

/// The lease duration a candidate's agent says it writes (zero if it does not say).
fn declared_duration(candidate: Option<&Arc<LeaseCandidate>>) -> Duration {
    candidate
        .and_then(|c| c.annotations().get(crate::api::LEASE_DURATION_ANNOTATION))
        .and_then(|d| d.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or_default()
}
