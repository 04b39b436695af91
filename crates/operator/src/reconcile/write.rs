//! The **write** phase of a reconcile, carrying out a decision: the one Lease write the
//! election asked for (every one a compare-and-swap), with the term recorded first and the
//! holder's pod noted.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::adopt::Adoption;
use super::gather::{Inputs, Pass};
use super::lease_memory::LeaseMemory;
use super::workload::demote_deposed;
use super::{Worker, declared_duration};
use crate::cache::candidate_index::owner_pod;
use crate::cache::{Caches, pod_facts};
use crate::force::targets::{self, Deposer};
use crate::key::LeaseKey;
use crate::metrics::{Metrics, ReasonLabels};
use crate::report::Notices;
use crate::term::ledger::TermLedger;
use crate::{CONCURRENT_WRITES, Settings};
use arbiter_api::LeaseCandidate;
use arbiter_api::lease::RESTARTS_ANNOTATION;
use arbiter_api::lease::{self, CasError, HOLDER_POD_ANNOTATION, LeaseStore};
use arbiter_election::decide::{Action, Decision};

/// The write phase of one pass, as a value: what it reads (the client, the caches, the
/// settings, the metrics) and the worker's memory it keeps (the term ledger, the pods to force
/// out, the Leases it wrote, the Events), borrowed from the worker for the call.
pub(crate) struct Writer<'w> {
    client: &'w kube::Client,
    caches: &'w Caches,
    settings: &'w Settings,
    metrics: &'w Metrics,
    terms: &'w mut TermLedger,
    deposer: &'w mut Deposer,
    leases: &'w mut LeaseMemory,
    notices: &'w mut Notices,
}

impl Worker {
    /// The write phase, over this worker's memory.
    pub(crate) fn writer(&mut self) -> Writer<'_> {
        Writer {
            client: &self.client,
            caches: &self.caches,
            settings: &self.settings,
            metrics: &self.metrics,
            terms: &mut self.terms,
            deposer: &mut self.deposer,
            leases: &mut self.leases,
            notices: &mut self.notices,
        }
    }
}

impl Writer<'_> {
    /// Adoption, over the memory this phase borrowed.
    fn adoption(&mut self) -> Adoption<'_> {
        Adoption::over(
            self.client,
            self.caches,
            self.settings.instance.as_deref(),
            self.leases,
            self.notices,
        )
    }

    /// The **write** phase: carries out the decision, the one Lease write (the pod it deposes,
    /// `deposed`, recorded by the same write), kept as this worker's latest; a new term is
    /// noted in the memory of holders and counted at once; a single-active workload's other
    /// pods are then demoted.
    pub(crate) async fn write(
        &mut self,
        pass: &Pass,
        inputs: &Inputs,
        decision: &Decision,
        deposed: Option<targets::Target>,
    ) -> anyhow::Result<Option<Lease>> {
        let (key, candidates, lease) = (&pass.key, &pass.candidates, pass.lease.as_deref());
        let owner = pass.plan.as_ref().map(|p| p.owner());
        let written = self
            .act(key, lease, candidates, decision, owner, deposed.as_ref())
            .await?;
        if let Some(w) = &written {
            // The compare-and-swap's base: the Lease acted on (none for a create).
            let base = match decision.action {
                Action::CreateLease { .. } => None,
                _ => lease,
            };
            self.leases.wrote(&self.caches.leases, key, base, w.clone());
            if let Some(t) = deposed {
                self.deposer.add(key, t);
            }
        }
        if let Some(w) = &written
            && let Some(h) = lease::holder(w)
            && decision.action.elects().is_some()
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
            // Counted as soon as the Lease is written, not after the Events.
            self.metrics
                .leader_changes
                .get_or_create(&ReasonLabels {
                    reason: inputs.term_ended.to_string(),
                })
                .inc();
            let before = lease
                .and_then(lease::holder)
                .or(inputs.previous.as_ref().map(|p| p.holder.as_str()));
            // (A single-active workload's election is reported on the workload: keep_roles.)
            if pass.plan.is_none() {
                elected(
                    self.notices,
                    key,
                    candidates,
                    w,
                    h,
                    before,
                    inputs.term_ended,
                );
            }
        }
        demote_deposed(self.client, pass, decision, written.as_ref()).await;
        Ok(written)
    }

    /// Carries out `decision.action`. Returns the Lease as written, if it wrote one.
    pub(crate) async fn act(
        &mut self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
        decision: &Decision,
        owner: Option<OwnerReference>,
        deposed: Option<&targets::Target>,
    ) -> anyhow::Result<Option<Lease>> {
        let store = LeaseStore::new(self.client.clone(), &key.namespace);
        let duration = arbiter_api::lease::seconds(self.settings.lease_duration);
        let written = match (&decision.action, lease) {
            (Action::CreateLease { holder, strategy }, _) => {
                self.create_lease(key, candidates, holder, strategy, owner, duration)
                    .await?
            }
            (Action::Assign { holder, .. }, Some(current)) => Some(
                self.assign_holder(key, candidates, current, holder, deposed, duration)
                    .await?,
            ),
            (Action::RequestHandover { to }, Some(current)) => {
                let mut l = current.clone();
                lease::set_preferred_holder(&mut l, Some(to));
                Some(store.replace(&l).await?)
            }
            (Action::RefuseSwitchover { reason }, Some(current)) => {
                let mut l = current.clone();
                lease::set_annotation(&mut l, lease::HANDOVER_REQUEST_ANNOTATION, None);
                lease::set_annotation(&mut l, lease::HANDOVER_REFUSED_ANNOTATION, Some(reason));
                // A handover it already asked for is called off with it (the ordinary rules
                // ask again if they want one).
                lease::set_preferred_holder(&mut l, None);
                tracing::warn!(lease = %key, %reason, "planned switchover refused");
                Some(store.replace(&l).await?)
            }
            (Action::ClearPreferredHolder, Some(current)) => {
                let mut l = current.clone();
                lease::set_preferred_holder(&mut l, None);
                Some(store.replace(&l).await?)
            }
            (Action::SetStrategy { strategy }, Some(current)) => {
                let mut l = current.clone();
                lease::set_strategy(&mut l, strategy);
                Some(store.replace(&l).await?)
            }
            (Action::Ping { candidates: pinged }, _) => {
                self.ping(key, candidates, pinged).await?;
                None
            }
            _ => None,
        };
        if let Some(l) = &written {
            tracing::info!(lease = %key, action = ?decision.action, holder = ?lease::holder(l), term = lease::term(l), "lease written");
        }
        Ok(written)
    }

    /// The new holder's pod, as recorded with its term: its restarts (to recognise a lapsed
    /// holder that never exited) and its uid (to recognise its death even after its candidate
    /// is gone).
    ///
    /// Only a pod that says itself that it runs this candidate of this lease (or a pod of the
    /// lease's single-active workload) is recorded: its stop then ends the term early. The pod
    /// a candidate's `ownerReferences` name is its writer's claim: a term assigned to a
    /// candidate whose pod does not vouch for it is recorded without a pod, and ends by release
    /// or expiry. A holder whose pod left the cache since the decision is not assigned (an
    /// error: decided again): a term recorded without its pod could not be ended by its stop.
    fn holder_pod(
        &self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        holder: &str,
    ) -> anyhow::Result<Option<(i64, String)>> {
        let Some(c) = candidates.iter().find(|c| c.name_any() == holder) else {
            return Ok(None);
        };
        match pod_facts::pod_of(c, self.caches) {
            Some(p)
                if crate::cache::declared::declares_holder(&p, &key.name, holder)
                    || self.caches.workloads.selecting(&p).contains(key) =>
            {
                Ok(Some((
                    crate::cache::pod_facts::restarts(&p),
                    p.uid().unwrap_or_default(),
                )))
            }
            Some(p) => {
                tracing::debug!(lease = %key, %holder, pod = %p.name_any(), "the candidate's pod does not declare it: its term is recorded without a pod");
                Ok(None)
            }
            None if owner_pod(c).is_some() => {
                anyhow::bail!("the pod of {holder} is gone; deciding again")
            }
            None => Ok(None),
        }
    }

    /// Creates the Lease, labelled as arbiter's, owned by `owner` (a single-active workload),
    /// with `holder` at its first term if one is elected. `None` when a Lease of that name
    /// exists that arbiter did not make (it is adopted instead: [`super::adopt`]).
    async fn create_lease(
        &mut self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        holder: &Option<String>,
        strategy: &str,
        owner: Option<OwnerReference>,
        duration: i32,
    ) -> anyhow::Result<Option<Lease>> {
        let store = LeaseStore::new(self.client.clone(), &key.namespace);
        let mut l = Lease::default();
        l.metadata.name = Some(key.name.to_string());
        l.metadata.namespace = Some(key.namespace.to_string());
        lease::label(&mut l, self.settings.instance.as_deref());
        l.metadata.owner_references = owner.map(|o| vec![o]);
        l.spec = Some(LeaseSpec {
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        });
        lease::set_strategy(&mut l, strategy);
        if let Some(holder) = holder {
            let pod = self.holder_pod(key, candidates, holder)?;
            // Other leases of its shard that candidates name and that have no Lease
            // in the cache: their first terms are reserved by the same mark write.
            let (index, leases) = (&self.caches.by_lease, &self.caches.leases);
            let new_leases = || {
                let shard = crate::term::ledger::shard_index(&key.name);
                index.leases_in(&key.namespace, |name| {
                    crate::term::ledger::shard_index(name) == shard
                        && leases.get(&key.namespace, name).is_none()
                })
            };
            let term = self
                .terms
                .next(&key.namespace, &key.name, None, new_leases)
                .await?;
            assign(&mut l, holder, term, duration, pod);
        }
        match store.create(&l).await {
            Ok(created) => Ok(Some(created)),
            // It exists: ours, and the cache has not shown it yet, or someone else's.
            Err(CasError::Conflict(c)) => match self.adoption().found_foreign(key).await? {
                true => Ok(None),
                false => Err(CasError::Conflict(c).into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Names `holder` at the next term by compare-and-swap on `current`, recording the pod it
    /// deposes; a Lease arbiter did not make is taken over by the same write.
    async fn assign_holder(
        &mut self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        current: &Lease,
        holder: &str,
        deposed: Option<&targets::Target>,
        duration: i32,
    ) -> anyhow::Result<Lease> {
        let store = LeaseStore::new(self.client.clone(), &key.namespace);
        let pod = self.holder_pod(key, candidates, holder)?;
        let term = self
            .terms
            .next(
                &key.namespace,
                &key.name,
                Some(lease::term(current)),
                Vec::new,
            )
            .await?;
        // The same write records the pod it deposes, to force out, and drops what was
        // pending for the new holder (a pod given the term again is not forced out).
        let holder_uid = pod.as_ref().map(|(_, uid)| uid.clone());
        let mut l = current.clone();
        targets::record_on(&mut l, deposed, |t| Some(&t.uid) == holder_uid.as_ref());
        assign(&mut l, holder, term, duration, pod);
        // A Lease arbiter did not make is taken over by this same write.
        let adopting = !lease::managed(current);
        lease::label(&mut l, self.settings.instance.as_deref());
        let written = store.replace(&l).await?;
        if adopting {
            self.adoption().adopted(key, current, &written);
        }
        Ok(written)
    }

    /// Sets `pingTime` on the candidates in `pinged` (those still among `candidates`), side by
    /// side; each write's answer is what the candidate's answer will be compared with. A
    /// candidate the API server says is gone is left out from now on.
    async fn ping(
        &mut self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        pinged: &[String],
    ) -> anyhow::Result<()> {
        // (Answers decoded tolerantly: see arbiter_api::tolerant.)
        let api: Api<arbiter_api::tolerant::Tolerant<LeaseCandidate>> =
            Api::namespaced(self.client.clone(), &key.namespace);
        // The value is for readers (`kubectl get`, upstream's tools); the arbiter itself
        // times the ping on its own clock and knows it by the version the write made.
        let at = jiff::Timestamp::from_microsecond(jiff::Timestamp::now().as_microsecond())
            .map(MicroTime)?;
        let ping = json!({ "spec": { "pingTime": at } });
        let (api, ping) = (&api, &ping);
        let sent = futures::stream::iter(
            pinged
                .iter()
                .filter(|name| candidates.iter().any(|c| c.name_any() == **name)),
        )
        .map(|name| async move {
            let sent = Instant::now();
            api.patch(name, &PatchParams::default(), &Patch::Merge(ping))
                .await
                .map(|answer| (answer, sent))
                .map_err(|e| (name.clone(), e))
        })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect::<Vec<_>>()
        .await;
        for (answer, at) in sent.iter().flatten() {
            self.caches.liveness.pinged(&answer.0, *at);
        }
        for e in sent.into_iter().filter_map(Result::err) {
            match e {
                // Gone, whatever the cache says: left out from now on.
                (name, kube::Error::Api(s)) if s.code == 404 => {
                    tracing::debug!(lease = %key, candidate = %name, "pinged a candidate that is gone");
                    if let Some(uid) = candidates
                        .iter()
                        .find(|c| c.name_any() == name)
                        .and_then(|c| c.uid())
                    {
                        self.caches.by_lease.gone(&uid);
                    }
                }
                (name, e) => {
                    return Err(anyhow::Error::new(e).context(format!("pinging {name}")));
                }
            }
        }
        Ok(())
    }
}

/// Names `holder` at `term`: a fresh acquire and renew time, no preferred holder, no
/// incarnation until the new holder's agent renews, the holder pod's restart count, and the
/// arbiter's strategy.
fn assign(l: &mut Lease, holder: &str, term: i32, duration: i32, pod: Option<(i64, String)>) {
    let now = lease::now();
    let spec = l.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(holder.to_string());
    spec.lease_transitions = Some(term);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(duration);
    lease::set_preferred_holder(l, None);
    lease::set_annotation(l, lease::INCARNATION_ANNOTATION, None);
    lease::set_annotation(l, lease::TAKEN_IN_POD_ANNOTATION, None);
    lease::set_annotation(l, lease::RELEASED_BY_ANNOTATION, None);
    // The mark an agent takes a term from (see lease::assigned_by_arbiter).
    let mark = lease::assignment(holder, term);
    lease::set_annotation(l, lease::ASSIGNED_ANNOTATION, Some(&mark));
    // A planned switchover ends with the assignment (to its target or, if it went elsewhere,
    // abandoned: reported as such).
    lease::set_annotation(l, lease::HANDOVER_REQUEST_ANNOTATION, None);
    let (restarts, uid) = pod
        .map(|(r, u)| (Some(r.to_string()), Some(u)))
        .unwrap_or_default();
    lease::set_annotation(l, RESTARTS_ANNOTATION, restarts.as_deref());
    lease::set_annotation(l, HOLDER_POD_ANNOTATION, uid.as_deref());
    // Only the arbiter's own strategy assigns: a Lease that still names another (its
    // candidates went back to the arbiter's) says so in the same write, so that no other
    // controller takes it for its own. One without a strategy is left without.
    let oev = arbiter_api::OLDEST_EMULATION_VERSION;
    if lease::strategy(l).is_some_and(|s| s != oev) {
        lease::set_strategy(l, oev);
    }
}

/// The one Event of an election, on the new holder's candidate: who holds the lease at which
/// term, and whose term ended before it, and how (`Elected`; `kubectl describe` the candidate,
/// or `kubectl get events`). The holder's status is not written: the Lease says who holds it.
fn elected(
    notices: &mut crate::report::Notices,
    key: &LeaseKey,
    candidates: &[Arc<LeaseCandidate>],
    written: &Lease,
    holder: &str,
    before: Option<&str>,
    term_ended: &str,
) {
    let Some(c) = candidates.iter().find(|c| c.name_any() == holder) else {
        return;
    };
    let how = match term_ended {
        "released" => "released the lease",
        "pod_stopped" => "its pod stopped",
        "container_restarted" => "its process's container ended",
        _ => "its term lapsed",
    };
    let after = match before {
        Some(b) if b == holder => format!(" again ({how})"),
        Some(b) if b != crate::term::held::UNKNOWN_HOLDER => {
            format!(", after {b} ({how})")
        }
        _ => String::new(),
    };
    let note = format!(
        "elected holder of lease {} at term {}{after}",
        key.name,
        lease::term(written)
    );
    notices.normal(c.object_ref(&()), "Elected", note);
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_api::OLDEST_EMULATION_VERSION as OEV;

    #[test]
    fn an_assignment_names_the_arbiters_strategy_on_a_lease_that_names_another() {
        let cases = [
            (Some("example.com/other"), Some(OEV)),
            (Some(OEV), Some(OEV)),
            // Made by hand, or by a client that does not set one: left without.
            (None, None),
        ];
        for (before, after) in cases {
            let mut l = Lease::default();
            if let Some(s) = before {
                lease::set_strategy(&mut l, s);
            }
            assign(&mut l, "h", 2, 15, None);
            assert_eq!(lease::strategy(&l), after, "{before:?}");
            assert_eq!(lease::holder(&l), Some("h"));
        }
    }
}
