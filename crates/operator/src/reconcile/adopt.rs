//! Leases the arbiter did not make: adopted, never trusted.
//!
//! Candidates may name a Lease that exists without arbiter's label (`arbiter.dev/managed`): a
//! team moved a client-go controller under `arbiter run` and kept its Lease name, or someone
//! made the Lease by hand, or removed the label from one of arbiter's. The Lease watch sees
//! only labelled Leases, so such a Lease shows up as a create that conflicts; from then on the
//! worker reads it on every reconcile of its lease ([`Adoption::foreign_lease`]).
//!
//! - **One of arbiter's that lost its label** (it carries the assignment mark arbiter wrote for
//!   its holder and term, by arbiter's field manager): relabelled at once, by compare-and-swap;
//!   its term goes on.
//! - **Anyone else's**: its holder's term is someone else's (the old client-go leader may still
//!   run). The election waits until the record has been unchanged for its holder's
//!   `leaseDurationSeconds` (and never less than the arbiter's own) on the arbiter's clock
//!   ([`arbiter_election::decide::Action::WaitForForeign`]), then assigns it by compare-and-swap
//!   with a fresh term above its `leaseTransitions` and labels it in the same write. Events
//!   `ForeignLease` (Warning, when found) and `LeaseAdopted`. No agent runs its workload on
//!   such a Lease: it
//!   takes a term only from the arbiter's assignment mark
//!   ([`arbiter_api::lease::assigned_by_arbiter`]).

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Resource;

use super::lease_memory::LeaseMemory;
use crate::cache::Caches;
use crate::key::LeaseKey;
use crate::reconcile::Worker;
use crate::report::Notices;
use arbiter_api::lease::{self, ASSIGNED_ANNOTATION, LeaseStore, MANAGED_LABEL};

/// The reading and adoption of Leases arbiter did not make, as a value: what it reads, and the
/// worker's memory it keeps (which Leases are someone else's, the Leases it writes, the Events
/// it reports), borrowed from the worker for the call.
pub(crate) struct Adoption<'w> {
    client: &'w kube::Client,
    caches: &'w Caches,
    /// This install's `--instance`.
    instance: Option<&'w str>,
    leases: &'w mut LeaseMemory,
    notices: &'w mut Notices,
}

impl Worker {
    /// Adoption, over this worker's memory.
    pub(crate) fn adoption(&mut self) -> Adoption<'_> {
        let instance = self.settings.instance.as_deref();
        Adoption::over(
            &self.client,
            &self.caches,
            instance,
            &mut self.leases,
            &mut self.notices,
        )
    }
}

impl<'w> Adoption<'w> {
    /// Adoption over what a phase borrowed (the write phase adopts by its own writes).
    pub(crate) fn over(
        client: &'w kube::Client,
        caches: &'w Caches,
        instance: Option<&'w str>,
        leases: &'w mut LeaseMemory,
        notices: &'w mut Notices,
    ) -> Adoption<'w> {
        Adoption {
            client,
            caches,
            instance,
            leases,
            notices,
        }
    }
}

impl Adoption<'_> {
    /// A create of `key`'s Lease conflicted: whether the Lease there is someone else's (then
    /// remembered, and reported once).
    pub(crate) async fn found_foreign(&mut self, key: &LeaseKey) -> anyhow::Result<bool> {
        let store = LeaseStore::new(self.client.clone(), &key.namespace);
        let Some(existing) = store.get(&key.name).await? else {
            return Ok(false);
        };
        if lease::managed(&existing) && !self.theirs(&existing) {
            return Ok(false);
        }
        let first = self.leases.found_foreign(key);
        if first && self.theirs(&existing) {
            self.another_instance(key, &existing);
        } else if first {
            let holder = lease::holder(&existing).unwrap_or("nobody");
            let note = format!(
                "Lease {} exists but arbiter did not make it (no label {MANAGED_LABEL}=true); its holder {holder}'s term is waited out unchanged on arbiter's clock, then arbiter takes it over with a new term",
                key.name
            );
            tracing::warn!(lease = %key, %holder, "{note}");
            self.notices
                .warning(existing.object_ref(&()), "ForeignLease", note);
        }
        Ok(true)
    }

    /// `key`'s Lease as the API server has it, if it was found to be someone else's: `None`
    /// once it is gone (a create follows). One of arbiter's that lost its label is relabelled.
    pub(crate) async fn foreign_lease(
        &mut self,
        key: &LeaseKey,
    ) -> anyhow::Result<Option<Arc<Lease>>> {
        if !self.leases.is_foreign(key) {
            return Ok(None);
        }
        let store = LeaseStore::new(self.client.clone(), &key.namespace);
        let Some(current) = store.get(&key.name).await? else {
            self.leases.not_foreign(key);
            return Ok(None);
        };
        if self.theirs(&current) {
            // Another install's: never written, nor relabelled (gather stops there).
            return Ok(Some(Arc::new(current)));
        }
        if lease::managed(&current) {
            // Labelled since (by this worker, or by hand): the watch takes it from here.
            self.leases.not_foreign(key);
            return Ok(Some(Arc::new(current)));
        }
        let ours = lease::assigned_by_arbiter_unlabelled(&current)
            && arbiter_api::written_by_arbiter(&current.metadata, ASSIGNED_ANNOTATION);
        if !ours {
            return Ok(Some(Arc::new(current)));
        }
        let mut relabelled = current.clone();
        lease::label(&mut relabelled, self.instance);
        let written = store.replace(&relabelled).await?;
        self.leases.not_foreign(key);
        let note = format!(
            "Lease {} had lost its label {MANAGED_LABEL}; it carries arbiter's assignment of its holder and term, so it was labelled again",
            key.name
        );
        self.warn_on(key, &written, "LeaseRelabelled", note);
        self.leases
            .wrote(&self.caches.leases, key, Some(&current), written.clone());
        Ok(Some(Arc::new(written)))
    }

    /// Whether `lease` belongs to another arbiter install: labelled with another instance, or
    /// arbiter's and without this install's (`--instance`). A Lease arbiter did not make and
    /// that names no instance (a client-go one) is no install's.
    pub(crate) fn theirs(&self, lease: &Lease) -> bool {
        let instance = lease::instance(lease);
        instance != self.instance && (lease::managed(lease) || instance.is_some())
    }

    /// Reports, once, that `key`'s Lease belongs to another install: it is never written.
    fn another_instance(&mut self, key: &LeaseKey, existing: &Lease) {
        let theirs = lease::instance(existing).unwrap_or("(none)");
        let ours = self.instance.unwrap_or("(none)");
        let note = format!(
            "Lease {} belongs to arbiter instance {theirs} (label {}), not to this one ({ours}): this install never writes it; its candidates labelled for this instance are not elected",
            key.name,
            arbiter_api::INSTANCE_LABEL
        );
        self.warn_on(key, existing, "LeaseOfAnotherInstance", note);
    }

    /// Logs `note` about `key`'s Lease and records it on the Lease as a Warning Event.
    fn warn_on(&mut self, key: &LeaseKey, lease: &Lease, reason: &'static str, note: String) {
        tracing::warn!(lease = %key, "{note}");
        self.notices.warning(lease.object_ref(&()), reason, note);
    }

    /// Reports the takeover of `before` (someone else's) by the write `after`.
    pub(crate) fn adopted(&mut self, key: &LeaseKey, before: &Lease, after: &Lease) {
        self.leases.not_foreign(key);
        let note = format!(
            "took over Lease {} (not made by arbiter; holder {} at term {}): {} holds term {}",
            key.name,
            lease::holder(before).unwrap_or("nobody"),
            lease::term(before),
            lease::holder(after).unwrap_or("nobody"),
            lease::term(after),
        );
        tracing::info!(lease = %key, "{note}");
        self.notices
            .normal(after.object_ref(&()), "LeaseAdopted", note);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    use super::*;

    fn lease_held_by(holder: &str, term: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_transitions: Some(term),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn only_the_arbiters_own_assignment_mark_for_the_holder_and_term_counts() {
        let mut l = lease_held_by("m1", 7);
        assert!(!lease::assigned_by_arbiter(&l), "a client-go Lease");
        assert!(!lease::assigned_by_arbiter_unlabelled(&l));
        lease::set_annotation(&mut l, ASSIGNED_ANNOTATION, Some("m1/7"));
        assert!(lease::assigned_by_arbiter_unlabelled(&l));
        assert!(!lease::assigned_by_arbiter(&l), "no label");
        lease::label(&mut l, None);
        assert!(lease::assigned_by_arbiter(&l));
        // Another holder or term than the mark's: an edit since the assignment.
        let mut other = l.clone();
        other.spec.as_mut().unwrap().holder_identity = Some("m2".into());
        assert!(!lease::assigned_by_arbiter(&other));
        let mut later = l.clone();
        later.spec.as_mut().unwrap().lease_transitions = Some(8);
        assert!(!lease::assigned_by_arbiter(&later));
    }
}
