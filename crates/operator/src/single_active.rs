//! The operator's part in single-active workloads (see [`crate::workloads`]): it is the
//! candidate agent for the workload's pods, so it answers for their liveness (a pod is alive
//! while Running and Ready), holds the lease for the active pod, hands it over on the pod's
//! behalf, and keeps the `arbiter.dev/role` labels: demote first, then promote.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ListParams};

use crate::report::Notices;
use kube::{Client, ResourceExt};

use crate::cache::Caches;
use crate::cache::candidate_index::owner_pod;
use crate::force::targets::{Target, record_on};
use crate::key::LeaseKey;
use crate::workloads::sync::{self, managed};
use crate::workloads::{ACTIVE, ROLE_LABEL, STANDBY, Workload, pod_ready};
use arbiter_api::LeaseCandidate;
use arbiter_api::lease::{self, LeaseStore};
use arbiter_election::decide::{self, PodState};

/// A lease that belongs to a single-active workload, with the workload's pods.
pub struct Plan {
    pub workload: Workload,
    pub pods: Vec<Arc<Pod>>,
}

/// What governs a lease.
pub enum Prepared {
    /// An ordinary lease.
    Ordinary,
    /// The lease of a workload whose annotation was removed: cleaned up, nothing else to do.
    CleanedUp,
    /// The lease of a workload whose annotations cannot be used (reported): nothing to do.
    Frozen,
    /// The lease of a workload whose pods are still being listed: looked at again shortly.
    Loading,
    Workload(Box<Plan>),
}

/// Finds the workload governing `key`, makes its pods candidates, and reports pods whose
/// version cannot be read and workloads whose annotations cannot be used (once each, tracked
/// in `reported`).
pub async fn prepare(
    client: &Client,
    caches: &Caches,
    notices: &mut Notices,
    key: &LeaseKey,
    candidates: &[Arc<LeaseCandidate>],
    reported: &mut HashSet<(String, String)>,
) -> anyhow::Result<Prepared> {
    let workload = match caches.workloads.governing(key) {
        Some(Ok(w)) => Some(w),
        Some(Err(invalid)) => {
            // Neither cleaned up nor elected: the pods keep their roles until it is mended.
            let note = format!(
                "{}; lease {} is left as it is (roles frozen) until the annotations are fixed",
                invalid.error, key.name
            );
            let seen = (
                key.namespace.to_string(),
                format!("{:?}: {note}", invalid.object.uid),
            );
            if reported.insert(seen) {
                tracing::warn!(lease = %key, %note);
                notices.warning(invalid.object.clone(), "InvalidAnnotation", note);
            }
            return Ok(Prepared::Frozen);
        }
        None => None,
    };
    let Some(workload) = workload else {
        if candidates.iter().any(|c| managed(c)) {
            let pods = caches.pods.in_namespace(&key.namespace);
            sync::clean_up(client, &key.namespace, candidates, &pods).await?;
            return Ok(Prepared::CleanedUp);
        }
        return Ok(Prepared::Ordinary);
    };
    // Not before the workload's pods were listed: an incomplete set could miss the active pod.
    if !caches.pods.loaded(&key.namespace, &workload.selector) {
        caches
            .pods
            .need_selected(&key.namespace, &workload.selector);
        return Ok(Prepared::Loading);
    }
    let mut pods: Vec<Arc<Pod>> = caches
        .pods
        .in_namespace(&key.namespace)
        .into_iter()
        .filter(|p| workload.selects(p))
        .collect();
    pods.sort_by_key(|p| p.name_any());
    let instance = caches.instance.as_deref();
    let unreadable =
        sync::ensure_candidates(client, instance, &workload, &pods, candidates).await?;
    for (pod, why) in unreadable {
        if reported.insert((key.namespace.to_string(), pod.clone())) {
            let note = format!("pod {pod} is not eligible: {why}");
            tracing::warn!(workload = %workload.name, %note);
            notices.warning(workload_ref(&workload), "VersionUnreadable", note);
        }
    }
    Ok(Prepared::Workload(Box::new(Plan { workload, pods })))
}

pub fn workload_ref(w: &Workload) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some(w.kind.into()),
        name: Some(w.name.clone()),
        namespace: Some(w.namespace.clone()),
        uid: Some(w.owner.uid.clone()),
        ..ObjectReference::default()
    }
}

impl Plan {
    fn pod(&self, name: &str) -> Option<&Arc<Pod>> {
        self.pods.iter().find(|p| p.name_any() == name)
    }

    /// The operator answers for the liveness of the candidates it made: alive (as if it had
    /// just acknowledged a ping) while the pod is Running and Ready; otherwise the pod is not
    /// acting (it is demoted before anyone else is promoted), so it counts as stopped.
    pub fn adjust(&self, candidates: &[Arc<LeaseCandidate>], inputs: &mut [decide::Candidate]) {
        let now = jiff::Timestamp::now();
        for (c, input) in candidates.iter().zip(inputs.iter_mut()) {
            if !managed(c) {
                continue;
            }
            // Its own pod only (a pod recreated under the same name is another pod).
            let own = |p: &&Arc<Pod>| owner_pod(c).is_some_and(|(_, uid)| p.uid() == Some(uid));
            match self.pod(&c.name_any()).filter(own) {
                Some(p) if pod_ready(p) => {
                    input.pod = PodState::Running;
                    input.ping = Some(decide::Ping {
                        sent: now,
                        shown: Some(now),
                        answered: true,
                    });
                }
                _ => input.pod = PodState::Stopped,
            }
        }
    }

    /// Labels every pod but `keep` standby (the demotion that must precede any promotion),
    /// judged by the API server's current pods, not the cache: a cache that lags must never
    /// hide an active pod. Each demotion is conditional on the version just read.
    pub async fn demote_all_but(&self, client: &Client, keep: Option<&str>) -> anyhow::Result<()> {
        self.demote(client, |name| Some(name) != keep).await
    }

    /// Labels standby the active pods whose names `which` picks, as the API server has them.
    async fn demote(&self, client: &Client, which: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &self.workload.namespace);
        let live = api
            .list(&ListParams::default().labels_from(&self.workload.selector))
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "listing the pods of {} {}: {e}",
                    self.workload.kind,
                    self.workload.name
                )
            })?;
        for p in &live.items {
            if which(&p.name_any()) && p.labels().get(ROLE_LABEL).is_some_and(|r| r == ACTIVE) {
                sync::set_role(client, p, Some(STANDBY), true).await?;
                tracing::info!(workload = %self.workload.name, pod = %p.name_any(), "demoted to standby");
            }
        }
        Ok(())
    }

    /// How many of the workload's pods carry `active`, as last observed (the double-holder
    /// detector: more than one must never happen).
    pub fn active_pods(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| p.labels().get(ROLE_LABEL).is_some_and(|r| r == ACTIVE))
            .count()
    }

    /// Keeps the labels: standby everywhere but the holder, then (only then) active on the holder
    /// if it is Ready.
    pub async fn label(&self, client: &Client, holder: Option<&str>) -> anyhow::Result<()> {
        self.demote_all_but(client, holder).await?;
        for p in &self.pods {
            let name = p.name_any();
            let role = match holder {
                Some(h) if h == name && pod_ready(p) => ACTIVE,
                _ => STANDBY,
            };
            if p.metadata.deletion_timestamp.is_none()
                && p.labels().get(ROLE_LABEL).map(String::as_str) != Some(role)
            {
                sync::set_role(client, p, Some(role), false).await?;
                if role == ACTIVE {
                    tracing::info!(workload = %self.workload.name, pod = %name, "promoted to active");
                }
            }
        }
        Ok(())
    }

    /// The active pod `lease` deposes for `new_holder` (`None`: a release), to force out per
    /// policy: the pod the Lease's holder ran in when it was assigned (by uid, as the Lease
    /// recorded it or else as its candidate names it: a pod recreated under its name, a
    /// StatefulSet's, never held the term), if it is still there.
    pub fn deposed(
        &self,
        candidates: &[Arc<LeaseCandidate>],
        lease: Option<&Lease>,
        new_holder: Option<&str>,
    ) -> Option<Target> {
        let lease = lease?;
        let previous = lease::holder(lease).filter(|h| Some(*h) != new_holder)?;
        let candidate = candidates
            .iter()
            .find(|c| c.name_any() == previous && managed(c))?;
        let assigned_to = lease
            .annotations()
            .get(lease::HOLDER_POD_ANNOTATION)
            .cloned()
            .or_else(|| owner_pod(candidate).map(|(_, uid)| uid))?;
        let pod = self.pod(previous).filter(|p| {
            p.metadata.deletion_timestamp.is_none() && p.uid().as_ref() == Some(&assigned_to)
        })?;
        let name = pod.name_any();
        Some(Target::new(
            &name,
            &name,
            &assigned_to,
            crate::cache::pod_facts::restarts(pod),
        ))
    }

    /// Whether the lease's holder is a pod the operator answers for.
    pub fn holds_for(&self, candidates: &[Arc<LeaseCandidate>], holder: &str) -> bool {
        candidates
            .iter()
            .any(|c| c.name_any() == holder && managed(c))
    }

    /// The handover the arbiter asked for, done on the holder pod's behalf: demote it, then
    /// release the lease (compare-and-swap). The caller forces the pod out per policy. Only
    /// the holder is demoted: on a stale view of the Lease, the pod that really holds it is
    /// left active (the release is refused), and no other pod is promoted before all are
    /// demoted ([`Plan::label`]).
    pub async fn release_for(
        &self,
        client: &Client,
        key: &LeaseKey,
        current: &Lease,
        holder: &str,
        deposed: Option<&Target>,
    ) -> anyhow::Result<Lease> {
        self.demote(client, |name| name == holder).await?;
        let mut l = current.clone();
        lease::mark_released(&mut l, Some(holder));
        // The pod to force out, recorded by the release itself.
        record_on(&mut l, deposed, |_| false);
        let written = LeaseStore::new(client.clone(), &key.namespace)
            .replace(&l)
            .await?;
        tracing::info!(lease = %key, %holder, "released the lease on the holder pod's behalf");
        Ok(written)
    }

    /// Renews the lease for the active pod (it has no agent of its own), every third of the
    /// lease duration, while the pod is Ready. Returns the Lease as written, if it renewed.
    pub async fn renew_for(
        &self,
        client: &Client,
        key: &LeaseKey,
        current: &Lease,
        unchanged_for: Duration,
    ) -> anyhow::Result<Option<Lease>> {
        let Some(holder) = lease::holder(current) else {
            return Ok(None);
        };
        let due = lease::duration(current).unwrap_or(Duration::from_secs(15)) / 3;
        // The reconcile's timer comes back a third of the duration after the renewal was
        // written, and its record is as old as its delivery, a moment later: a second of
        // slack (at most a quarter of the third), or every other timer would pass and the lease
        // be renewed at two thirds. No more: a reconcile for any other reason renews too.
        let slack = (due / 4).min(Duration::from_secs(1));
        if unchanged_for < due - slack || !self.pod(holder).is_some_and(|p| pod_ready(p)) {
            return Ok(None);
        }
        let mut l = current.clone();
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(lease::renewed_after(spec.renew_time.as_ref()));
        let written = LeaseStore::new(client.clone(), &key.namespace)
            .replace(&l)
            .await?;
        Ok(Some(written))
    }

    /// The owner reference that makes the lease go with the workload.
    pub fn owner(&self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        let mut o = self.workload.owner.clone();
        o.controller = Some(false);
        o.block_owner_deletion = None;
        o
    }
}
