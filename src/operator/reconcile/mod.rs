//! The arbiter's controller: the per-lease reconcile, and carrying out decisions.
//!
//! The caches and watches are in [`crate::operator::cache`], reporting in [`crate::operator::report`]. Every change
//! enqueues the affected `(namespace, leaseName)`; each worker reconciles its keys one at a
//! time: build the pure inputs, call
//! [`election::decide::decide`], carry out the one action it returns (every Lease write a
//! compare-and-swap), update candidates' conditions, emit Events.

mod adopt;
mod expire;
mod forced_exit;
mod view;
mod write;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use crate::api::LeaseCandidate;
use crate::election::decide::{self, Action};
use crate::lease::{self, HOLDER_POD_ANNOTATION};
use crate::operator::Settings;
use crate::operator::cache::candidate_index::owner_pod;
use crate::operator::cache::written::{LeaseVersion, Written};
use crate::operator::cache::{Caches, pod_state};
use crate::operator::force::targets::Deposer;
use crate::operator::key::LeaseKey;
use crate::operator::metrics::lease_timers::Timers;
use crate::operator::metrics::{LeaseLabels, Metrics};
use crate::operator::queue::Queue;
use crate::operator::reconcile::view::{Seen, View};
use crate::operator::report::conditions;
use crate::operator::report::{MayWait, publish, report};
use crate::operator::single_active::{self, Prepared};
use crate::operator::term::ledger::TermLedger;

/// When a lease whose report (a candidate's status, the pending forced exits) could not be
/// written is looked at again.
pub(in crate::operator) const RETRY_FAILED_WRITE: Duration = Duration::from_secs(2);

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
            statuses: Written::default(),
            leases: Written::default(),
            foreign: HashSet::new(),
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
        let result = worker.reconcile(&key, &mut queue).await;
        worker.metrics.progress.end(index);
        let requeue = match result {
            Ok(Reconciled { after, electing }) => {
                queue.electing(&key, electing);
                after
            }
            // An election under way stays so (its retry ranks from its start).
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

/// What a reconcile left to do.
struct Reconciled {
    /// When to look at the lease again.
    after: Option<Duration>,
    /// Whether the lease's election is under way ([`Queue::electing`]).
    electing: bool,
}

impl Reconciled {
    fn after(after: Option<Duration>) -> Reconciled {
        Reconciled {
            after,
            electing: false,
        }
    }
}

/// What one reconcile needs, and what the worker remembers between reconciles.
pub(in crate::operator) struct Worker {
    pub(in crate::operator) client: Client,
    pub(in crate::operator) caches: Caches,
    pub(in crate::operator) recorder: Recorder,
    pub(in crate::operator) settings: Settings,
    pub(in crate::operator) metrics: Arc<Metrics>,
    /// Per lease: the record last seen, when this process first saw it, and its holder.
    pub(in crate::operator) seen: HashMap<LeaseKey, Seen>,
    pub(in crate::operator) terms: TermLedger,
    pub(in crate::operator) deposer: Deposer,
    timers: HashMap<LeaseKey, Timers>,
    /// Single-active pods whose unreadable version was reported.
    pub(in crate::operator) reported: HashSet<(String, String)>,
    /// Candidates' statuses this worker wrote that its cache may not show yet.
    statuses: Written<Vec<Condition>>,
    /// Leases this worker wrote that its cache may not show yet (the next write's base).
    pub(in crate::operator) leases: Written<LeaseVersion>,
    /// Leases candidates name that exist without arbiter's label ([`crate::operator::reconcile::adopt`]): read on
    /// each reconcile (the Lease watch sees only labelled ones).
    pub(in crate::operator) foreign: HashSet<LeaseKey>,
}

impl Worker {
    pub(in crate::operator) fn pod_of(&self, candidate: &LeaseCandidate) -> Option<Arc<Pod>> {
        let (name, uid) = owner_pod(candidate)?;
        let pod = self.caches.pods.get(&candidate.namespace()?, &name)?;
        (pod.uid().as_deref() == Some(uid.as_str())).then_some(pod)
    }

    /// Whether `candidate`'s pod, as the caches stand now, can still take a term: running (and,
    /// for a single-active workload's pod, ready), or no pod at all.
    fn still_electable(&self, candidate: &LeaseCandidate) -> bool {
        match pod_state(candidate, &self.caches) {
            decide::PodState::NoPod => true,
            decide::PodState::Running if crate::workloads::sync::managed(candidate) => self
                .pod_of(candidate)
                .is_some_and(|p| crate::workloads::pod_ready(&p)),
            decide::PodState::Running => true,
            _ => false,
        }
    }

    /// `queue` (this worker's) says whether other leases are due, and takes `key` back for
    /// when none is if statuses were left to wait.
    async fn reconcile(&mut self, key: &LeaseKey, queue: &mut Queue) -> anyhow::Result<Reconciled> {
        let mut candidates = self
            .caches
            .by_lease
            .candidates(key, &self.caches.candidates);
        let lease = match self.newest_lease(key) {
            Some(l) => Some(l),
            None => self.foreign_lease(key).await?,
        };
        let next_expiry = self.expire_candidates(key, &mut candidates).await;
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
            Prepared::CleanedUp | Prepared::Frozen => return Ok(Reconciled::after(None)),
            Prepared::Loading => return Ok(Reconciled::after(Some(Duration::from_millis(500)))),
            Prepared::Ordinary => None,
            Prepared::Workload(p) => Some(*p),
        };
        self.metrics.candidates(key, candidates.len());

        let valid = self.settings.rules.ack_valid_for;
        let heard: Vec<_> = candidates
            .iter()
            .map(|c| self.caches.liveness.judge(c, valid))
            .collect();
        let mut inputs: Vec<decide::Candidate> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| decide::Candidate {
                name: c.name_any(),
                binary_version: c.spec.binary_version.clone(),
                emulation_version: c.spec.emulation_version.clone(),
                strategy: c.spec.strategy.clone(),
                created: c
                    .creation_timestamp()
                    .map(|t| t.0)
                    .unwrap_or_else(jiff::Timestamp::now),
                ping: heard[i].ping,
                renewed_lately: heard[i].renewed_lately,
                pod: pod_state(c, &self.caches),
                withdrawn: crate::api::withdrawn_incarnation(c).is_some(),
                registered: heard[i].registered,
            })
            .collect();
        let View {
            lease: mut lease_view,
            previous,
            term_ended,
            released,
        } = self.view(key, lease.as_deref(), &candidates, &mut inputs);
        if let Some(h) = released.and_then(|h| candidates.iter().find(|c| c.name_any() == h)) {
            let note = format!("released lease {}", key.name);
            publish(
                &self.recorder,
                &h.object_ref(&()),
                EventType::Normal,
                "Released",
                note,
            );
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
        // An agent took the Lease's current term (it writes its incarnation with its first
        // renew, before its workload starts): the operator never acts as that holder's agent,
        // whatever a candidate's labels say (anyone who may write candidates can set them).
        let agent_took = lease.as_deref().is_some_and(|l| {
            l.annotations()
                .get(lease::INCARNATION_ANNOTATION)
                .is_some_and(|i| !i.is_empty())
        });
        if let Some(p) = &plan {
            p.adjust(&candidates, &mut inputs);
            // The operator is its workload's pods' agent: a holder pod it judged not running
            // (it is demoted before anyone is promoted) ends its term, as an agent's release
            // would. (Only for a term no agent took, and the candidates it made: an agent's term
            // ends on proof about the pod recorded at its assignment. The assignment that
            // follows is a compare-and-swap on this very record.)
            if let Some(l) = lease_view.as_mut()
                && !agent_took
                && let Some(h) = l.holder.as_deref()
                && candidates.iter().zip(&inputs).any(|(c, input)| {
                    input.name == h
                        && crate::workloads::sync::managed(c)
                        && input.pod == decide::PodState::Stopped
                })
            {
                l.holder_pod_stopped = true;
            }
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
        // The decision read the pods at several moments (the workload's pods, each candidate's
        // pod, the stopped pods): a new holder whose pod stopped meanwhile is not given a term
        // it cannot take (its pod, gone, would then prove nothing, and the term would run its
        // full duration); the lease is decided again on the caches as they stand now.
        if let Action::Assign { holder, .. }
        | Action::CreateLease {
            holder: Some(holder),
            ..
        } = &decision.action
            && let Some(c) = candidates.iter().find(|c| c.name_any() == *holder)
            && !self.still_electable(c)
        {
            tracing::debug!(lease = %key, %holder, "the elected candidate's pod stopped while deciding; deciding again");
            return Ok(Reconciled {
                after: Some(Duration::ZERO),
                electing: true,
            });
        }
        let policy = plan
            .as_ref()
            .map(|p| p.workload.on_depose)
            .unwrap_or(self.settings.on_depose);

        // Single-active: the operator is the holder pod's agent. It hands over on the pod's
        // behalf (demote, release, force the pod out), and demotes before anyone is promoted.
        if let (Some(p), Some(current)) = (&plan, lease.as_deref()) {
            let holder = lease::holder(current).map(str::to_string);
            if let (Action::RequestHandover { to }, Some(h)) = (&decision.action, holder)
                && !agent_took
                && p.holds_for(&candidates, &h)
            {
                let deposed = p.deposed(&candidates, Some(current), None);
                let released = p
                    .release_for(&self.client, key, current, &h, deposed.as_ref())
                    .await?;
                self.wrote_lease(key, released);
                if let Some(t) = deposed {
                    self.deposer.add(key, t);
                }
                let note = format!("pod {h} handed lease {} over to {to}", key.name);
                publish(
                    &self.recorder,
                    &single_active::workload_ref(&p.workload),
                    EventType::Normal,
                    "Deposed",
                    note,
                );
                return Ok(Reconciled::after(Some(Duration::ZERO)));
            }
        }
        // The pod a new holder deposes (single-active: the active pod; otherwise a lapsed
        // holder's that still runs) is forced out per policy, recorded on the Lease by the
        // write that deposes it.
        let deposed = match (&plan, &decision.action) {
            (
                Some(p),
                Action::Assign { holder, .. }
                | Action::CreateLease {
                    holder: Some(holder),
                    ..
                },
            ) => p.deposed(&candidates, lease.as_deref(), Some(holder)),
            (Some(_), _) => None,
            (None, _) => self.lapsed_target(key, lease.as_deref(), &decision, &candidates),
        };
        let owner = plan.as_ref().map(|p| p.owner());
        let written = self
            .act(
                key,
                lease.as_deref(),
                &candidates,
                &decision,
                owner,
                deposed.as_ref(),
            )
            .await?;
        if let Some(w) = &written {
            self.wrote_lease(key, w.clone());
            if let Some(t) = deposed {
                self.deposer.add(key, t);
            }
        }
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
            self.caches
                .held
                .assigned(key, h, lease::term(w), duration, pod_uid, Instant::now());
            // Counted as soon as the Lease is written, not after the statuses and Events.
            self.metrics
                .leader_changes
                .get_or_create(&crate::operator::metrics::ReasonLabels {
                    reason: term_ended.to_string(),
                })
                .inc();
        }
        // Single-active: once the new holder's term is written (not before: a decision on a
        // view the compare-and-swap refuses must not touch the pods), every pod but the new
        // holder's is demoted at once. (The labelling below demotes again before it promotes
        // anyone, and fails the reconcile if it cannot.)
        if let (
            true,
            Some(p),
            Action::Assign { holder, .. }
            | Action::CreateLease {
                holder: Some(holder),
                ..
            },
        ) = (written.is_some(), &plan, &decision.action)
            && let Err(e) = p.demote_all_but(&self.client, Some(holder)).await
        {
            tracing::warn!(lease = %key, error = %format!("{e:#}"), "demoting the deposed pod failed; trying again before anyone is promoted");
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
        // (A Lease arbiter did not make names nobody arbiter elected.)
        let holder = written
            .as_ref()
            .and_then(|l| lease::holder(l))
            .or(waiting_for)
            .or(lease
                .as_deref()
                .filter(|l| lease::managed(l))
                .and_then(lease::holder));
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
        // Statuses that can wait are left for when this worker has no other lease due.
        let now_lease = written.as_ref().or(lease.as_deref());
        let (first, deposed) = (
            conditions::may_wait(now_lease),
            conditions::deposed_may_wait(now_lease),
        );
        let busy = (first || deposed) && queue.busy_besides(key);
        let may_wait = MayWait {
            first: first && busy,
            deposed: deposed && busy,
        };
        // A status that could not be written is tried again soon (a holder's renewals no
        // longer bring the lease back every few seconds).
        let reported = report(
            &self.client,
            &self.recorder,
            &self.metrics,
            key,
            &candidates,
            &decision,
            lease.is_some() || written.is_some(),
            holder,
            term,
            &duplicates,
            &overruns,
            &mut self.statuses,
            may_wait,
        )
        .await;
        if reported.waiting {
            queue.when_idle(key.clone());
        }
        let report_retry = (!reported.complete).then_some(RETRY_FAILED_WRITE);

        // A labelling or renewal that failed fails the reconcile (retried), after the forced
        // exits below: a pod the write deposed is forced out even while labels cannot be written.
        let mut labelled = Ok(());
        if let Some(p) = &plan {
            let current = written.as_ref().or(lease.as_deref());
            // The Event below reports the assignment, which is done: a failed labelling (retried)
            // must not lose it.
            labelled = p.label(&self.client, holder).await;
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
                );
            }
            if labelled.is_ok()
                && written.is_none()
                && let (Some(l), Some(v)) = (current, lease_view.as_ref())
                && !agent_took
                && lease::holder(l).is_some_and(|h| p.holds_for(&candidates, h))
            {
                match p.renew_for(&self.client, key, l, v.unchanged_for).await {
                    Ok(Some(renewed)) => self.wrote_lease(key, renewed),
                    Ok(None) => {}
                    Err(e) => labelled = Err(e),
                }
            }
        }

        if written.is_some()
            && let Some(old) = lease.as_deref()
        {
            self.report_abandoned_handover(key, old, &decision.action, &candidates)
                .await;
        }
        let retry = self
            .force_out(key, &candidates, plan.as_ref(), policy)
            .await;
        labelled?;

        let after =
            crate::operator::reconcile::view::look_again(&decision.action, lease_view.as_ref());
        // Single-active leases are renewed by the operator: come back in a third of the duration.
        let renew = plan
            .as_ref()
            .and(lease_view.as_ref())
            .map(|l| l.duration / 3);
        // An election under way, until someone is elected: pinging, waiting for answers or for
        // a term to run out (each ends within an ack window or a lease duration). Not a lease
        // with nobody to elect: only a change can bring it a candidate, and it would rank ahead
        // of every expiry for as long as it stays so.
        let electing = written.is_none()
            && matches!(
                decision.action,
                Action::Ping { .. }
                    | Action::WaitForAcks
                    | Action::Settle { .. }
                    | Action::WaitForTerm { .. }
                    | Action::WaitForForeign { .. }
                    | Action::Assign { .. }
                    | Action::CreateLease {
                        holder: Some(_),
                        ..
                    }
            );
        Ok(Reconciled {
            after: [after, retry, renew, report_retry, next_expiry]
                .into_iter()
                .flatten()
                .min(),
            electing,
        })
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
        if matches!(action, Action::NoEligibleCandidate) {
            self.metrics.elections_failed.inc();
        }
        let ended = t.step(leaderless, action, written, now);
        if let Some(d) = ended.handover {
            self.metrics.handover_seconds.observe(d.as_secs_f64());
        }
        // A lease under a third-party strategy has no holder of arbiter's choosing.
        let ours = lease.is_none_or(|l| {
            l.strategy
                .as_deref()
                .is_none_or(|s| s == crate::api::OLDEST_EMULATION_VERSION)
        });
        if let Some(d) = ended.leaderless.filter(|_| ours) {
            let labels = LeaseLabels::of(key);
            self.metrics
                .leaderless_seconds
                .get_or_create(&labels)
                .inc_by(d.as_secs_f64());
        }
        let since = t.leaderless_since().filter(|_| ours).map(|since| {
            let ago = now.saturating_duration_since(since).as_secs_f64();
            jiff::Timestamp::now().as_millisecond() as f64 / 1000.0 - ago
        });
        self.metrics
            .lease_state(key, since, lease.map(|l| l.duration.as_secs()));
    }
}

/// The lease duration a candidate's agent says it writes (zero if it does not say).
pub(in crate::operator) fn declared_duration(candidate: Option<&Arc<LeaseCandidate>>) -> Duration {
    candidate
        .and_then(|c| c.annotations().get(crate::api::LEASE_DURATION_ANNOTATION))
        .and_then(|d| d.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or_default()
}
